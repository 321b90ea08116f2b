"""Calls into ``sql/functions/retention.sql`` (housekeeping: retention, sidecar purge, leases) and
``sql/functions/retention.sql`` (the DLQ depth gauge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["OTHER_TENANTS_LABEL", "RetentionStep", "dlq_depth", "reclaim_leases",
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
    cur = await conn.execute("SELECT * FROM queen.retention_partitions_v1(%s, %s, %s, %s)",
                             (after, limit, shards, shard))
    return [r[0] for r in await cur.fetchall()]


@dataclass(frozen=True, slots=True)
class RetentionStep:
    """One bounded step of ``retention_partition_v1`` on one partition."""

    segments: int  # segments removed
    txns: int  # sidecar (log_txns) rows removed
    more: bool  # the step hit its limit: call again
    evicted: int = 0  # unconsumed messages removed by the queue's maxWaitTimeSeconds


async def retention_step(conn: Conn, partition_id: int, limit: int) -> RetentionStep:
    cur = await conn.execute("SELECT queen.retention_partition_v1(%s, %s)",
                             (partition_id, limit))
    row = await cur.fetchone()
    assert row is not None
    doc = row[0]
    return RetentionStep(int(doc.get("segments") or 0), int(doc.get("txns") or 0),
                         bool(doc.get("more")), int(doc.get("evicted") or 0))


async def repair_ready(conn: Conn) -> int:
    """``log_ready_repair_v1`` (functions/groups.sql): rows of the ready index it had to add;
    0 unless an older build ran against the database or a writer broke the protocol."""
    cur = await conn.execute("SELECT queen.log_ready_repair_v1()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def reclaim_leases(conn: Conn, limit: int) -> int:
    cur = await conn.execute("SELECT queen.lease_reclaim_v1(%s)", (limit,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


#: The queen_dlq_depth label of every queue outside the default tenant (docs/api.md 1.5: /metrics
#: is public, so it never names another tenant's queue).
OTHER_TENANTS_LABEL = "(other tenants)"


async def dlq_depth(conn: Conn) -> dict[str, int]:
    """Dead letters per gauge label: the default tenant's queues by name, every other
    tenant's rows summed under ``OTHER_TENANTS_LABEL``."""
    cur = await conn.execute("SELECT * FROM queen.dlq_depth_v2()")
    out: dict[str, int] = {}
    for tenant, name, n in await cur.fetchall():
        label = name if tenant.int == 0 else OTHER_TENANTS_LABEL
        out[label] = out.get(label, 0) + int(n)
    return out
