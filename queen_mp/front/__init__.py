"""The front worker's half: per-worker state, push ingest, pops and parking, acks, delivery,
transactions and the spool drain. Imported by ``queen_mp.http`` and ``queen_mp.processes`` only;
never by the shards (shared code lives below both: ``models``, ``ipc``, ``db``, ``wire``)."""
