"""Calls into ``queen_mp/sql/functions/pop.sql``: the claim-and-read of a pop, and lease renewal."""

from __future__ import annotations

import struct
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg

from queen_mp.db.prepared import PreparedCall, pooled_rows

__all__ = ["Claim", "ClaimResult", "PopRequest", "StoredChunks", "claim", "claim_params",
           "claim_result", "renew_lease"]

#: PERF(pop): every parameter sent in binary, made here (``claim_params``), and the rows read
#: back in binary (payloads as stored, not hex text), through ``pooled_rows``
_POP = PreparedCall(
    "queen_log_pop_v3",
    "SELECT * FROM queen.log_pop_v3($1::uuid, $2::text, $3::text, $4::text, $5::text, $6::text,"
    " $7::int4, $8::int4, $9::bool, $10::text, $11::timestamptz, $12::uuid, $13::int4)",
    13, binary_result=True)
_INT4 = struct.Struct(">i").pack
_INT8 = struct.Struct(">q").pack
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

#: one covering segment of a claim as stored: (base offset, created at, payload chunks)
StoredChunks = tuple[int, datetime, bytes]


class PopRequest(msgspec.Struct, frozen=True, gc=False):
    """One pop as the API asked for it (docs/api.md 2.3): what ``log_pop_v3`` claims, and how
    long the front worker may wait for something claimable (``wait``, ``timeout_ms``).

    PERF(pop): the records of a pop (this, ``Claim``, ``ClaimResult``, the popper's
    ``Popped``) are frozen Structs, built in C: as frozen dataclasses, an
    ``object.__setattr__`` per field: 50k instructions a pop against 6k (callgrind)."""

    tenant: bytes
    queue: str | None
    partition: str | None
    namespace: str | None
    task: str | None
    group: str
    batch: int
    partitions: int
    wait: bool
    timeout_ms: int
    auto_ack: bool
    sub_mode: str
    sub_from: datetime | None


class Claim(msgspec.Struct, frozen=True):
    """Offsets ``start .. end`` of one partition, leased (or auto-acked) by one pop, with the
    stored segments that cover them (those retention left), ascending."""

    queue: str
    partition_id: int
    partition: str
    start: int
    end: int
    attempt: int
    lease_expires_at: datetime | None
    encrypted: bool
    segments: list[StoredChunks] = msgspec.field(default_factory=list)

    @property
    def count(self) -> int:
        return self.end - self.start + 1


class ClaimResult(msgspec.Struct, frozen=True):
    claims: list[Claim]
    wake_in_ms: int | None  # when nothing was claimed: a blocked partition frees up then


async def claim(conn: psycopg.AsyncConnection[Any], r: PopRequest, lease_id: uuid.UUID | None,
                claim_ms: int) -> ClaimResult:
    """``log_pop_v3`` on a pooled connection the caller holds alone."""
    return claim_result(await pooled_rows(conn, _POP, claim_params(r, lease_id, claim_ms)))


def claim_params(r: PopRequest, lease_id: uuid.UUID | None, claim_ms: int
                 ) -> list[bytes | None]:
    """``log_pop_v3``'s parameters in PostgreSQL's binary form, in its order."""
    sub_from = r.sub_from
    if sub_from is not None:
        if sub_from.tzinfo is None:  # as psycopg sends it: a timestamp read in UTC
            sub_from = sub_from.replace(tzinfo=UTC)
        sub_from_bin: bytes | None = _INT8((sub_from - _PG_EPOCH) // _MICROSECOND)
    else:
        sub_from_bin = None
    return [r.tenant, _text(r.queue), _text(r.partition), _text(r.namespace), _text(r.task),
            r.group.encode(), _INT4(r.batch), _INT4(r.partitions),
            b"\x01" if r.auto_ack else b"\x00", r.sub_mode.encode(), sub_from_bin,
            lease_id.bytes if lease_id is not None else None, _INT4(claim_ms)]


def _text(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


def claim_result(records: list[tuple[Any, ...]]) -> ClaimResult:
    """``log_pop_v3``'s rows: a claim's rows together, its first one with the claim's columns
    (a row with no partition continues the claim above it), each row with a covering segment
    or not; one row with no partition when nothing was claimed.

    PERF(pop): a claim's columns come once (NULLs after), not on each of its segments'
    rows: fewer send functions in PostgreSQL, fewer values to decode here."""
    if len(records) == 1 and records[0][1] is None:
        return ClaimResult([], records[0][11])
    claims: list[Claim] = []
    pid = None
    segments: list[StoredChunks] = []
    for row in records:
        if row[1] is not None and row[1] != pid:
            pid = row[1]
            segments = []
            claims.append(Claim(row[0], pid, row[2], row[3], row[4], row[5], row[6], row[7],
                                segments))
        # columns 8..10: the covering segment, NULL where retention removed it
        if row[8] is not None and row[9] is not None and row[10] is not None:
            segments.append((row[8], row[9], row[10]))
    return ClaimResult(claims, None)


async def renew_lease(conn: psycopg.AsyncConnection[Any], tenant: bytes, lease_id: uuid.UUID,
                      seconds: int | None) -> tuple[int, datetime | None]:
    """(leases renewed, earliest new expiry)."""
    cur = await conn.execute("SELECT * FROM queen.log_renew_lease_v1(%s, %s, %s::int4)",
                             (uuid.UUID(bytes=tenant), lease_id, seconds))
    row = await cur.fetchone()
    assert row is not None
    return row[0], row[1]
