"""Calls into ``sql/030_pop.sql``: the claim-and-read of a pop, and lease renewal."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

__all__ = ["ClaimQuery", "ClaimResult", "ClaimRow", "claim", "renew_lease"]

_POP = ("SELECT * FROM queen.log_pop_v1(%s, %s, %s, %s, %s, %s, %s::int4, %s::int4, %s, %s,"
        " %s, %s, %s::int4)")


@dataclass(frozen=True)
class ClaimQuery:
    tenant: bytes
    queue: str | None
    partition: str | None
    namespace: str | None
    task: str | None
    group: str
    batch: int
    partitions: int
    auto_ack: bool
    sub_mode: str
    sub_from: datetime | None
    lease_id: uuid.UUID | None
    claim_ms: int


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """One covering segment of one claim (segment fields None if retained away)."""

    queue: str
    partition_id: int
    partition: str
    start: int
    end: int
    attempt: int
    lease_expires_at: datetime | None
    encrypted: bool
    base_offset: int | None
    created_at: datetime | None
    payload: bytes | None


@dataclass(frozen=True)
class ClaimResult:
    rows: list[ClaimRow]
    wake_in_ms: int | None  # when nothing was claimed: a blocked partition frees up then


async def claim(conn: psycopg.AsyncConnection[Any], q: ClaimQuery) -> ClaimResult:
    cur = await conn.execute(_POP, (
        uuid.UUID(bytes=q.tenant), q.queue, q.partition, q.namespace, q.task, q.group, q.batch,
        q.partitions, q.auto_ack, q.sub_mode, q.sub_from, q.lease_id, q.claim_ms),
        prepare=True, binary=True)  # PERF(queen): payloads as stored, not hex text
    records = await cur.fetchall()
    if len(records) == 1 and records[0][1] is None:
        return ClaimResult([], records[0][11])
    return ClaimResult([ClaimRow(*r[:11]) for r in records], None)


async def renew_lease(conn: psycopg.AsyncConnection[Any], tenant: bytes, lease_id: uuid.UUID,
                      seconds: int | None) -> tuple[int, datetime | None]:
    """(leases renewed, earliest new expiry)."""
    cur = await conn.execute("SELECT * FROM queen.log_renew_lease_v1(%s, %s, %s::int4)",
                             (uuid.UUID(bytes=tenant), lease_id, seconds))
    row = await cur.fetchone()
    assert row is not None
    return row[0], row[1]
