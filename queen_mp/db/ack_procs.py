"""Calls into ``sql/040_ack.sql``: the authoritative ack, DLQ filing, the segment of an offset."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg

__all__ = ["ack_at", "ack_by_hash", "ack_by_hash_many", "ack_multi", "file_dlq", "segment_at"]

Conn = psycopg.AsyncConnection[Any]


_ACK_BY_HASH = "SELECT queen.log_ack_by_hash_v1(%s, %s, %s, %s, %b::bytea[], %b::text[])"

# (partition id, group, lease id, hashes, statuses): one log_ack_by_hash_v1 call
AckCall = tuple[int, str, uuid.UUID | None, list[bytes], list[str]]


async def ack_by_hash(conn: Conn, tenant: bytes, partition_id: int, group: str,
                      lease_id: uuid.UUID | None, hashes: list[bytes],
                      statuses: list[str]) -> dict[str, Any]:
    cur = await conn.execute(
        _ACK_BY_HASH, (uuid.UUID(bytes=tenant), partition_id, group, lease_id, hashes,
                       statuses), prepare=True)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def ack_by_hash_many(conn: Conn, tenant: bytes, calls: list[AckCall]
                           ) -> list[dict[str, Any]]:
    """``log_ack_by_hash_v1`` once per call, in order, in one round trip (pipeline mode); the
    caller holds a transaction, so a failed call leaves nothing of the others."""
    t = uuid.UUID(bytes=tenant)
    async with conn.pipeline():
        cursors = [await conn.execute(_ACK_BY_HASH, (t, *call), prepare=True) for call in calls]
    out: list[dict[str, Any]] = []
    for cur in cursors:
        row = await cur.fetchone()
        assert row is not None
        out.append(row[0])
    return out


async def segment_at(conn: Conn, partition_id: int, offset: int
                     ) -> tuple[int, datetime, bytes] | None:
    """(base_offset, created_at, payload) of the segment holding ``offset``, if retained."""
    cur = await conn.execute(
        "SELECT base_offset, created_at, payload FROM queen.log_segment_at_v1(%s, %s)",
        (partition_id, offset))
    row = await cur.fetchone()
    return None if row is None else (row[0], row[1], row[2])


async def file_dlq(conn: Conn, tenant: bytes, partition_id: int, group: str,
                   lease_id: uuid.UUID | None, offset: int, message_id: bytes,
                   transaction_id: str, trace_id: bytes | None, producer_sub: str | None,
                   encrypted: bool, payload: bytes | None, error: str | None,
                   created_at: datetime | None) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT queen.log_dlq_head_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (uuid.UUID(bytes=tenant), partition_id, group, lease_id, offset,
         uuid.UUID(bytes=message_id), transaction_id,
         uuid.UUID(bytes=trace_id) if trace_id else None, producer_sub, encrypted, payload,
         error, created_at))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def ack_at(conn: Conn, tenant: bytes, partition_id: int, group: str, lease_id: bytes,
                 batch_end: int, count: int) -> dict[str, Any]:
    """One positional whole-batch advance (the registry fast path without fusion)."""
    cur = await conn.execute(
        "SELECT queen.log_ack_at_v1(%s, %s, %s, %s, %s, %s)",
        (uuid.UUID(bytes=tenant), partition_id, group, uuid.UUID(bytes=lease_id), batch_end,
         count), prepare=True)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def ack_multi(conn: Conn, tenant: bytes, partition_ids: list[int], groups: list[str],
                    lease_ids: list[bytes], batch_ends: list[int], counts: list[int]
                    ) -> list[dict[str, Any]]:
    """Many positional advances in one transaction (ack fusion); results in input order."""
    cur = await conn.execute(
        "SELECT queen.log_ack_multi_v1(%s, %b::int8[], %b::text[], %b::uuid[], %b::int8[],"
        " %b::int4[])",
        (uuid.UUID(bytes=tenant), partition_ids, groups,
         [uuid.UUID(bytes=b) for b in lease_ids], batch_ends, counts), prepare=True)
    row = await cur.fetchone()
    assert row is not None
    return sorted(row[0], key=lambda r: r["i"])
