"""Calls into ``sql/functions/retention.sql``: housekeeping (retention, sidecar purge, leases)
and the per-queue gauges of ``/metrics/prometheus``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from queen_mp.metrics import OTHER_TENANTS_LABEL, QueueRow

__all__ = ["OTHER_TENANTS_LABEL", "RetentionStep", "queue_gauges", "reclaim_leases",
           "repair_ready", "retention_candidates", "retention_step", "try_lock", "unlock"]

Conn = psycopg.AsyncConnection[Any]


async def try_lock(conn: Conn, key1: int, key2: int) -> bool:
    """Session advisory lock of a housekeeping round (shards/housekeeping.py); never waits."""
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s::int4, %s::int4)", (key1, key2))
    row = await cur.fetchone()
    assert row is not None
    return bool(row[0])


async def unlock(conn: Conn, key1: int, key2: int) -> None:
    await conn.execute("SELECT pg_advisory_unlock(%s::int4, %s::int4)", (key1, key2))


async def retention_candidates(conn: Conn, after: int, limit: int, shards: int,
                               shard: int) -> list[int]:
    cur = await conn.execute("SELECT * FROM queen.retention_partitions_v2(%s, %s, %s, %s)",
                             (after, limit, shards, shard))
    return [r[0] for r in await cur.fetchall()]


@dataclass(frozen=True, slots=True)
class RetentionStep:
    """One bounded step of ``retention_partition_v2`` on one partition."""

    segments: int  # segments removed
    txns: int  # sidecar (log_txns) rows removed
    more: bool  # the step hit its limit: call again
    evicted: int = 0  # unconsumed messages removed by the queue's maxWaitTimeSeconds


async def retention_step(conn: Conn, partition_id: int, limit: int) -> RetentionStep:
    cur = await conn.execute("SELECT queen.retention_partition_v2(%s, %s)",
                             (partition_id, limit))
    row = await cur.fetchone()
    assert row is not None
    doc = row[0]
    return RetentionStep(int(doc.get("segments") or 0), int(doc.get("txns") or 0),
                         bool(doc.get("more")), int(doc.get("evicted") or 0))


async def repair_ready(conn: Conn, after: int, limit: int) -> tuple[int, int]:
    """``log_ready_repair_v3`` (functions/groups.sql) on the ``limit`` partitions after id
    ``after``: (rows of the ready index it had to add, the id the next slice starts after; 0
    once the sweep reached the end). The rows are 0 unless an older build ran against the
    database or a writer broke the protocol."""
    cur = await conn.execute("SELECT * FROM queen.log_ready_repair_v3(%s, %s)", (after, limit))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def reclaim_leases(conn: Conn, limit: int) -> int:
    cur = await conn.execute("SELECT queen.lease_reclaim_v1(%s)", (limit,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def queue_gauges(conn: Conn, cap: int) -> list[QueueRow]:
    """The per-queue gauges as (gauge, queue label, group label or None, value), at most
    ``cap`` named series per gauge plus the folded ones (``queen.queue_gauges_v1``: other
    tenants' names never leave the database)."""
    cur = await conn.execute("SELECT * FROM queen.queue_gauges_v1(%s)", (cap,))
    return [(g, q, grp, float(v)) for g, q, grp, v in await cur.fetchall()]
