"""Request models and their parsing, free of HTTP: push and ack items, transaction plans, KV
and timer ops. They raise domain errors (``queen_mp.models.errors``, ``queen_mp.wire.errors``);
``queen_mp.http.errors`` maps them to HTTP answers."""
