"""Housekeeping of one shard: time retention of segments on the queues with retentionEnabled (and
the eviction of messages that waited longer than their queue's maxWaitTimeSeconds, whatever
retentionEnabled says, counted in queen_messages_evicted_total), the transactionId sidecar's own
clock, expired leases and expired KV keys (docs/api.md 4; issue
"Operations") and the ready index's backstop (schema/002_ready_index.sql). (The DLQ depth gauge,
set here once, is one of the per-queue gauges now: queen_mp/shards/queuegauges.py.)

Every shard runs one, each taking the partitions ``id % shards == index``, so the work is split
without coordination. Every step is its own short transaction on one partition (one partition
row lock, never a consumer row lock), bounded to ``_BATCH`` rows, so a large backlog is worked
off in many small steps and never holds up pushes.

Several broker instances over one database (docs/operations.md) each run these rounds; a round
first takes a session advisory lock on its housekeeping connection, ``pg_try_advisory_lock(
ROUND_LOCK_KEY, shards << 16 | index)``, and releases it when the round ends, so one instance at
a time works a share of the table: a round that finds the lock held by another instance skips
its share (the other one is doing it). Instances configured
with another shard count split the table differently and take other keys; their rounds may
overlap, which costs work, never correctness (every step locks its partition row). A lock whose
connection dies is released by PostgreSQL with the session.
"""

from __future__ import annotations

import asyncio
import logging

from queen_mp.db import kv_procs, retention_procs
from queen_mp.db.connect import Conn, Dedicated
from queen_mp.db.errors import DatabaseError
from queen_mp.metrics import Metrics

__all__ = ["Housekeeping"]

log = logging.getLogger("queen_mp.housekeeping")

_BATCH = 1000
_PARTITIONS_PER_QUERY = 200
#: partitions per round of the ready index's backstop (log_ready_repair_v3): a round's repair
#: costs the same whatever the table holds (the whole repair was 200-350 ms a round at 55,000
#: partitions under a drain, issue 26); the sweep of the table takes partitions / this rounds
_READY_PARTITIONS = 5000
#: first key of ``pg_try_advisory_lock(int4, int4)`` for housekeeping rounds: "QHKP"; the
#: second is ``shards << 16 | index``. (The two-key form never meets the migrations' bigint
#: key, queen_mp/db/migrations.py: PostgreSQL keeps the two key spaces apart.)
ROUND_LOCK_KEY = 0x51484B50


class Housekeeping:
    def __init__(self, dsn: str, *, shards: int, index: int, every_s: float,
                 name: str, metrics: Metrics | None = None,
                 statement_timeout_ms: int | None = None) -> None:
        self.dsn = dsn
        self.metrics = metrics
        self.shards = shards
        self.index = index
        self.every_s = every_s
        self.name = name
        # each statement of a round within statement_timeout_ms (None: no deadline); the
        # connection keeps the round's advisory lock, so a round is one session() block
        self.db = Dedicated(dsn, application_name=name,
                            statement_timeout_ms=statement_timeout_ms)
        self._ready_after = 0  # where the ready index's sweep goes on (partition id)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.round()
            except (DatabaseError, OSError) as ex:
                log.warning("housekeeping round failed (%s); next round in %.0f s", ex,
                            self.every_s)
                await self.db.drop()

    @property
    def lock_key(self) -> tuple[int, int]:
        """The advisory lock key of this shard's rounds (the module docstring)."""
        return ROUND_LOCK_KEY, (self.shards << 16) | self.index

    async def round(self) -> dict[str, int]:
        """One pass over this shard's partitions; returns what it removed, ``skipped`` 1 when
        another instance held this share's lock (nothing was attempted then)."""
        async with self.db.session(commit_sent=True) as conn:
            return await self._round(conn)

    async def _round(self, conn: Conn) -> dict[str, int]:
        step = self.db.step
        done = {"segments": 0, "txns": 0, "evicted": 0, "leases": 0, "kv": 0, "ready": 0,
                "skipped": 0}
        if not await step(retention_procs.try_lock(conn, *self.lock_key)):
            done["skipped"] = 1
            return done
        try:
            await self._work(conn, done)
        finally:
            try:
                await step(retention_procs.unlock(conn, *self.lock_key))
            except Exception as ex:
                # NOTE(queen): the session's end releases the lock; a session that kept it
                # would lock the other instances out of this share for good.
                log.warning("housekeeping lock release failed (%s); reconnecting", ex)
                await self.db.drop()
        if any(done.values()):
            log.info("housekeeping removed segments=%d txns=%d leases=%d kv=%d "
                     "(evicted after maxWaitTimeSeconds: %d messages)",
                     done["segments"], done["txns"], done["leases"], done["kv"],
                     done["evicted"])
        return done

    async def _work(self, conn: Conn, done: dict[str, int]) -> None:
        step = self.db.step
        after = 0
        while True:
            pids = await step(retention_procs.retention_candidates(
                conn, after, _PARTITIONS_PER_QUERY, self.shards, self.index))
            for pid in pids:
                while True:
                    res = await step(retention_procs.retention_step(conn, pid, _BATCH))
                    done["segments"] += res.segments
                    done["txns"] += res.txns
                    if res.evicted:
                        done["evicted"] += res.evicted
                        if self.metrics is not None:
                            self.metrics.messages_evicted.inc(res.evicted)
                    if not res.more:
                        break
            if len(pids) < _PARTITIONS_PER_QUERY:
                break
            after = pids[-1]
        if self.index == 0:  # table-wide sweeps: one shard is enough
            while (n := await step(retention_procs.reclaim_leases(conn, _BATCH))) > 0:
                done["leases"] += n
                if n < _BATCH:
                    break
            while (n := await step(kv_procs.purge_expired(conn, _BATCH))) > 0:
                done["kv"] += n
                if n < _BATCH:
                    break
            # NOTE(queen): the triggers keep the ready index true; a row this finds is a
            # cursor that pops could not see (an older build's, or a bug's), so say so.
            done["ready"], self._ready_after = await step(retention_procs.repair_ready(
                conn, self._ready_after, _READY_PARTITIONS))
            if done["ready"]:
                log.warning("ready index: %d cursor rows or flags were missing and are "
                            "repaired", done["ready"])

    async def close(self) -> None:
        await self.db.drop()
