"""Calls into ``sql/functions/ack.sql``: the authoritative ack, DLQ filing, an offset's segment."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from queen_mp.db.binarrays import int4_array, int8_array, text_array, uuid_array
from queen_mp.db.calls import Segment
from queen_mp.db.cursors import fetch_one
from queen_mp.db.errors import DatabaseError

__all__ = ["STATUSES", "AckBatch", "AckItem", "Advance", "DlqFiling", "GroupAck", "ack_at",
           "ack_by_hash", "ack_by_hash_many", "ack_multi", "advances", "file_dlq", "segment_at"]

Conn = psycopg.AsyncConnection[Any]


_ACK_BY_HASH = "SELECT queen.log_ack_by_hash_v1(%s, %s, %s, %s, %b::bytea[], %b::text[])"

# (partition id, group, lease id, hashes, statuses): one log_ack_by_hash_v1 call
AckCall = tuple[int, str, uuid.UUID | None, list[bytes], list[str]]

STATUSES = ("completed", "failed", "retry", "dlq")


# PERF(wire): one per message; a frozen dataclass __init__ costs 6x a plain one.
@dataclass(slots=True)
class AckItem:
    """One acknowledgment as the procedures take it (``log_ack_by_hash_v1``, and
    ``log_transaction_wire_v1``'s ack columns)."""

    index: int
    transaction_id: str
    partition_id: int
    status: str  # one of STATUSES ('success' already mapped to 'completed')
    group: str
    lease_id: uuid.UUID | None
    error: str | None


@dataclass(frozen=True, slots=True)
class AckBatch:
    """The acknowledgments of one request as columns, item ``i`` at index ``i`` of each.

    PERF(ack): an ack batch is read, grouped, forwarded and answered by whole-list operations
    in C; an object per acknowledgment (and a Python loop over them) was most of a 100-item
    batch's front worker instructions. ``item`` builds one only where the SQL path needs it."""

    transaction_ids: list[str]
    partition_ids: list[int]
    statuses: list[str]  # each one of STATUSES
    groups: list[str]
    lease_ids: list[uuid.UUID | None]
    errors: list[str | None]

    @classmethod
    def of(cls, items: list[AckItem]) -> AckBatch:
        """The columns of ``items`` (whose indexes are 0, 1, ...)."""
        return cls([i.transaction_id for i in items], [i.partition_id for i in items],
                   [i.status for i in items], [i.group for i in items],
                   [i.lease_id for i in items], [i.error for i in items])

    def __len__(self) -> int:
        return len(self.transaction_ids)

    def item(self, index: int) -> AckItem:
        return AckItem(index, self.transaction_ids[index], self.partition_ids[index],
                       self.statuses[index], self.groups[index], self.lease_ids[index],
                       self.errors[index])

    def items(self) -> list[AckItem]:
        return [self.item(i) for i in range(len(self.transaction_ids))]


@dataclass(frozen=True, slots=True)
class GroupAck:
    """The ack of one (partition, group, lease): ``log_ack_by_hash_v1``'s answer (or what a
    fast path answered for the same acks). The index lists hold 0-based input indexes."""

    ok: bool  # False: nothing changed (``error`` says why)
    error: str | None  # lease_invalid | partition_not_found
    acked: int  # the cursor's advance (new - old)
    lease_released: bool
    dlq: bool = False  # a dlq signal wants the poison offset filed (``Acker`` files it)
    poison: int | None = None
    signal_index: int | None = None
    noop: tuple[int, ...] = ()
    stale: tuple[int, ...] = ()
    unresolved: tuple[int, ...] = ()
    clamped: tuple[int, ...] = ()
    invalid: tuple[int, ...] = ()
    queue: str | None = None  # the partition's queue (None when partition_not_found)


def _group_ack(doc: dict[str, Any]) -> GroupAck:
    return GroupAck(
        bool(doc["ok"]), doc.get("error"), int(doc.get("acked") or 0),
        bool(doc.get("leaseReleased")), bool(doc.get("dlq")), doc.get("poison"),
        doc.get("signalIndex"), tuple(doc.get("noop") or ()), tuple(doc.get("stale") or ()),
        tuple(doc.get("unresolved") or ()), tuple(doc.get("clamped") or ()),
        tuple(doc.get("invalid") or ()), doc.get("queue"))


@dataclass(frozen=True, slots=True)
class Advance:
    """One positional whole-batch cursor advance (``log_ack_at_v1``, ``log_ack_multi_v3``)."""

    ok: bool
    error: str | None  # lease_invalid | partition_not_found | beyond_batch | partly_committed
    old: int  # the cursor before (0 when unknown)
    new: int  # and after
    lease_released: bool


def _advance(doc: dict[str, Any]) -> Advance:
    return Advance(bool(doc.get("ok")), doc.get("error"), int(doc.get("old") or 0),
                   int(doc.get("new") or 0), bool(doc.get("leaseReleased")))


@dataclass(frozen=True, slots=True)
class DlqFiling:
    """``log_dlq_head_v1``'s answer: the poison offset filed (``ok``) or why not."""

    ok: bool
    error: str | None  # lease_invalid | partition_not_found | already_committed | ...
    lease_released: bool


async def ack_by_hash(conn: Conn, tenant: bytes, partition_id: int, group: str,
                      lease_id: uuid.UUID | None, hashes: list[bytes],
                      statuses: list[str]) -> GroupAck:
    row = await fetch_one(
        conn, _ACK_BY_HASH, (uuid.UUID(bytes=tenant), partition_id, group, lease_id, hashes,
                             statuses), prepare=True)
    assert row is not None
    return _group_ack(row[0])


async def ack_by_hash_many(conn: Conn, tenant: bytes, calls: list[AckCall]
                           ) -> list[GroupAck]:
    """``log_ack_by_hash_v1`` once per call, in order, in one round trip (pipeline mode); the
    caller holds a transaction, so a failed call leaves nothing of the others."""
    t = uuid.UUID(bytes=tenant)
    async with conn.pipeline():
        cursors = [await conn.execute(_ACK_BY_HASH, (t, *call), prepare=True) for call in calls]
    out: list[GroupAck] = []
    for cur in cursors:
        row = await cur.fetchone()
        assert row is not None
        out.append(_group_ack(row[0]))
    return out


async def segment_at(conn: Conn, partition_id: int, offset: int) -> Segment | None:
    """The segment holding ``offset``, if retained."""
    cur = await conn.execute(
        "SELECT base_offset, msg_count, created_at, payload"
        " FROM queen.log_segment_at_v1(%s, %s)", (partition_id, offset))
    row = await cur.fetchone()
    return None if row is None else Segment(row[0], row[1], row[2], bytes(row[3]))


async def file_dlq(conn: Conn, tenant: bytes, partition_id: int, group: str,
                   lease_id: uuid.UUID | None, offset: int, message_id: bytes,
                   transaction_id: str, trace_id: bytes | None, producer_sub: str | None,
                   encrypted: bool, payload: bytes | None, error: str | None,
                   created_at: datetime | None) -> DlqFiling:
    cur = await conn.execute(
        "SELECT queen.log_dlq_head_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (uuid.UUID(bytes=tenant), partition_id, group, lease_id, offset,
         uuid.UUID(bytes=message_id), transaction_id,
         uuid.UUID(bytes=trace_id) if trace_id else None, producer_sub, encrypted, payload,
         error, created_at))
    row = await cur.fetchone()
    assert row is not None
    doc = row[0]
    return DlqFiling(bool(doc.get("ok")), doc.get("error"), bool(doc.get("leaseReleased")))


async def ack_at(conn: Conn, tenant: bytes, partition_id: int, group: str, lease_id: bytes,
                 batch_end: int, count: int) -> Advance:
    """One positional whole-batch advance (the registry fast path without fusion)."""
    row = await fetch_one(
        conn, "SELECT queen.log_ack_at_v1(%s, %s, %s, %s, %s, %s)",
        (uuid.UUID(bytes=tenant), partition_id, group, uuid.UUID(bytes=lease_id), batch_end,
         count), prepare=True)
    assert row is not None
    return _advance(row[0])


async def ack_multi(conn: Conn, tenant: bytes, partition_ids: list[int], groups: list[str],
                    lease_ids: list[bytes], batch_ends: list[int], counts: list[int]
                    ) -> list[Advance]:
    """Many positional advances in one transaction (ack fusion); results in input order.
    ``conn`` sends binary arrays (``binarrays.register_arrays``)."""
    row = await fetch_one(
        conn, "SELECT queen.log_ack_multi_v3(%s, %b::int8[], %b::text[], %b::uuid[], %b::int8[],"
        " %b::int4[])",
        (uuid.UUID(bytes=tenant), int8_array(partition_ids), text_array(groups),
         uuid_array(lease_ids), int8_array(batch_ends), int4_array(counts)), prepare=True,
        binary=True)
    assert row is not None
    return advances(row[0], len(partition_ids))


# log_ack_multi_v3's row codes, as log_ack_at_v1's "error"
_ADVANCE_ERRORS = (None, "lease_invalid", "partition_not_found", "beyond_batch",
                   "partly_committed")


def advances(answer: list[int | None] | None, n: int) -> list[Advance]:
    """``log_ack_multi_v3``'s int8[] (code, old, new per row, input order) as one Advance per
    row; any other shape is a DatabaseError (the flush's rows are then answered failed).

    PERF(ack): a binary int8[], not a jsonb array of objects parsed with the stdlib."""
    if answer is None or len(answer) != 3 * n:
        raise DatabaseError(f"log_ack_multi_v3 answered {answer!r} for {n} rows")
    out: list[Advance] = []
    for k in range(0, 3 * n, 3):
        code, old, new = answer[k], answer[k + 1], answer[k + 2]
        if code is None or not 0 <= code < len(_ADVANCE_ERRORS):
            raise DatabaseError(f"log_ack_multi_v3: bad row code {code!r}")
        out.append(Advance(code == 0, _ADVANCE_ERRORS[code], old or 0, new or 0, code == 0))
    return out
