"""Calls into ``sql/080_retention.sql`` (housekeeping: retention, sidecar purge, leases)."""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["dlq_depth", "reclaim_leases", "retention_candidates", "retention_step"]

Conn = psycopg.AsyncConnection[Any]


async def retention_candidates(conn: Conn, after: int, limit: int, shards: int,
                               shard: int) -> list[int]:
    cur = await conn.execute("SELECT * FROM queen.retention_partitions_v1(%s, %s, %s, %s)",
                             (after, limit, shards, shard))
    return [r[0] for r in await cur.fetchall()]


async def retention_step(conn: Conn, partition_id: int, limit: int) -> dict[str, Any]:
    cur = await conn.execute("SELECT queen.retention_partition_v1(%s, %s)",
                             (partition_id, limit))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def reclaim_leases(conn: Conn, limit: int) -> int:
    cur = await conn.execute("SELECT queen.lease_reclaim_v1(%s)", (limit,))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def dlq_depth(conn: Conn) -> dict[str, int]:
    cur = await conn.execute("SELECT * FROM queen.dlq_depth_v1()")
    return {name: int(n) for name, n in await cur.fetchall()}
