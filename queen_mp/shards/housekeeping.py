"""Housekeeping of one shard: time retention of segments, the transactionId sidecar's own
clock, expired leases and expired KV keys (api.md 4; issue "Operations"), and the DLQ depth
gauge.

Every shard runs one, each taking the partitions ``id % shards == index``, so the work is split
without coordination. Every step is its own short transaction on one partition (one partition
row lock, never a consumer row lock), bounded to ``_BATCH`` rows, so a large backlog is worked
off in many small steps and never holds up pushes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg

from queen_mp.db import kv_procs, retention_procs
from queen_mp.db.errors import DatabaseError
from queen_mp.metrics import Metrics

__all__ = ["Housekeeping"]

log = logging.getLogger("queen_mp.housekeeping")

_BATCH = 1000
_PARTITIONS_PER_QUERY = 200


class Housekeeping:
    def __init__(self, dsn: str, *, shards: int, index: int, every_s: float,
                 name: str, metrics: Metrics | None = None) -> None:
        self.dsn = dsn
        self.metrics = metrics
        self._dlq_queues: set[str] = set()
        self.shards = shards
        self.index = index
        self.every_s = every_s
        self.name = name
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.round()
            except (psycopg.Error, DatabaseError, OSError) as ex:
                log.warning("housekeeping round failed (%s); next round in %.0f s", ex,
                            self.every_s)
                await self._drop()

    async def round(self) -> dict[str, int]:
        """One pass over this shard's partitions; returns what it removed."""
        conn = await self._connection()
        done = {"segments": 0, "txns": 0, "leases": 0, "kv": 0}
        after = 0
        while True:
            pids = await retention_procs.retention_candidates(
                conn, after, _PARTITIONS_PER_QUERY, self.shards, self.index)
            for pid in pids:
                while True:
                    res = await retention_procs.retention_step(conn, pid, _BATCH)
                    done["segments"] += int(res.get("segments") or 0)
                    done["txns"] += int(res.get("txns") or 0)
                    if not res.get("more"):
                        break
            if len(pids) < _PARTITIONS_PER_QUERY:
                break
            after = pids[-1]
        if self.index == 0:  # table-wide sweeps: one shard is enough
            while (n := await retention_procs.reclaim_leases(conn, _BATCH)) > 0:
                done["leases"] += n
                if n < _BATCH:
                    break
            while (n := await kv_procs.purge_expired(conn, _BATCH)) > 0:
                done["kv"] += n
                if n < _BATCH:
                    break
            if self.metrics is not None:
                depth = await retention_procs.dlq_depth(conn)
                for queue in self._dlq_queues - depth.keys():
                    self.metrics.dlq_depth.labels(queue).set(0)
                for queue, n in depth.items():
                    self.metrics.dlq_depth.labels(queue).set(n)
                self._dlq_queues = set(depth)
        if any(done.values()):
            log.info("housekeeping removed segments=%d txns=%d leases=%d kv=%d",
                     done["segments"], done["txns"], done["leases"], done["kv"])
        return done

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, application_name=self.name)
        return self._conn

    async def _drop(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def close(self) -> None:
        await self._drop()
