"""Named calls into sql/functions/ephemeral.sql (docs/api.md "Ephemeral queues").

Each call is one autocommit statement, so one transaction on the UNLOGGED tables of
schema/008 (no WAL flush at commit). Inputs are the validated records of
``queen_mp.models.ephemeral``. Failures: ``QueueFull`` (SQLSTATE QE001: the queue is at its
bounds and its policy is ``reject``; nothing was written), otherwise the
``queen_mp.db.errors`` tree (a lost connection during a write is ``OutcomeUnknown``).
psycopg errors do not leave this module.
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from queen_mp.db.binarrays import int4_array, int8_array, text_array, uuid_array
from queen_mp.db.errors import translate

__all__ = ["ACK_SQL", "POP_SQL", "PUSHED_ALONE", "PUSHED_FULL", "PUSH_MANY_SQL", "PUSH_SQL",
           "SQLSTATE_PUSH_ALONE", "SQLSTATE_QUEUE_FULL", "AckOutcome", "FusedOutcome",
           "PopOutcome", "QueueFull", "ack", "ack_outcome", "ack_params", "configure", "delete",
           "depth", "list_queues", "pop", "pop_outcome", "push", "push_many", "push_many_params",
           "push_params", "reset"]

Conn = psycopg.AsyncConnection[Any]

SQLSTATE_QUEUE_FULL = "QE001"
SQLSTATE_PUSH_ALONE = "QE002"  # eph_push_v5: a partition has no row yet
#: ``push_many``'s verdicts besides a count: refused whole (queue_full), or to push alone
PUSHED_FULL = -1
PUSHED_ALONE = -2


class QueueFull(Exception):
    """The push was refused whole: the queue is full (policy reject) or the push is larger
    than the queue's bounds."""


@dataclass(frozen=True, slots=True)
class PopOutcome:
    """A claim as ``queen.eph_pop_v5`` answers it: runs of messages of consecutive seqs, that
    ``queen_mp.front.ephemeral.render_messages`` renders (run i: ``counts[i]`` messages from
    seq ``firsts[i]``)."""

    epoch: str  # the queue's incarnation, the first part of every id
    parts: list[str]  # per run: its partition,
    dlvs: list[int]  # its delivery (0: autoAck), the last part of its ids,
    atts: list[int]  # how many times its messages were delivered, this one included,
    firsts: list[int]  # its first seq,
    counts: list[int]  # its length
    payloads: bytes  # every run's payloads (JSON text) in order, joined by b"\x1e"
    claimed: int
    wake_in_ms: int | None  # nothing claimed: when a lease of the group expires (None: none)
    window_ms: int  # the queue's windowBuffer (0, 0: none)
    window_count: int


@dataclass(frozen=True, slots=True)
class AckOutcome:
    outcomes: list[str]  # per id, in input order: acked | redelivered | stale | unknown
    redelivered: int  # how many became claimable again (wake parked pops)


@dataclass(frozen=True, slots=True)
class FusedOutcome:
    pushed: list[int]  # per request: its count, PUSHED_FULL or PUSHED_ALONE
    details: list[str | None]  # per request: why it was PUSHED_FULL


class _PushAlone(Exception):
    pass


async def _one(conn: Conn, sql: str, params: tuple[Any, ...], *, writes: bool,
               binary: bool = False) -> Any:
    try:
        cur = await conn.execute(sql, params, binary=binary)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        if ex.sqlstate == SQLSTATE_QUEUE_FULL:
            raise QueueFull(ex.diag.message_detail or "queue_full") from None
        if ex.sqlstate == SQLSTATE_PUSH_ALONE:
            raise _PushAlone() from None
        raise translate(ex, commit_sent=writes) from ex
    assert row is not None
    return row


@functools.lru_cache(maxsize=1024)
def _tenant(tenant: bytes) -> uuid.UUID:
    """PERF(eph): a worker serves few tenants, and uuid.UUID() is Python code that checks its
    argument: some 4 us a call (timeit), of a push, pop or ack whose front share is 10-20."""
    return uuid.UUID(bytes=tenant)


# PERF(eph): the array parameters (a push's payloads) go in PostgreSQL's binary
# form (queen_mp/db/binarrays.py; the pool's connections send them, db/connect.py). psycopg's
# own list dumper escaped every element of a text array through a regular expression: 1.76 ms
# of a front worker's CPU for a push of 100 200-byte payloads (17.6 us per message, two thirds
# of the broker's CPU of the push route), against about 0.05 ms per array built in binary
# (timeit, loaded machine). An ack's ids go as text instead (``ack_params``).


async def configure(conn: Conn, tenant: bytes, queue: str, opts: dict[str, Any]
                    ) -> dict[str, Any]:
    row = await _one(conn, "SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)::text",
                     (_tenant(tenant), queue, orjson.dumps(opts).decode()), writes=True)
    return orjson.loads(row[0])


def _body(payloads: Sequence[str]) -> tuple[bytes, list[int]]:
    """Messages as a chunk stores them (schema 015): their UTF-8 bytes joined by 0x1e (never
    in JSON text), and where each begins in those bytes, one offset more (one past the last's
    end and a separator). PERF(eph): built here, where an ASCII str knows its own size;
    PostgreSQL's array_to_string and convert_to took some 440k instructions a push of 100, a
    statement of sizes 210k."""
    text = "\x1e".join(payloads)
    sizes = map(len, payloads) if text.isascii() else (len(x.encode()) for x in payloads)
    return text.encode(), [0, *itertools.accumulate(s + 1 for s in sizes)]


async def push(conn: Conn, tenant: bytes, queue: str, partition: str,
               payloads: Sequence[str]) -> int:
    row = await _one(conn, PUSH_SQL, push_params(tenant, queue, partition, payloads),
                     writes=True)
    return int(row[0])


#: ``push``'s statement, its parameters ``push_params``'s (the benches and tests call it too)
PUSH_SQL = "SELECT queen.eph_push_v3(%s, %s, %s, %b, %b::int4[])"


def push_params(tenant: bytes, queue: str, partition: str, payloads: Sequence[str]
                ) -> tuple[Any, ...]:
    body, offs = _body(payloads)
    return (_tenant(tenant), queue, partition, body, int4_array(offs))


async def push_many(conn: Conn, tenants: Sequence[bytes], queues: Sequence[str],
                    partitions: Sequence[str], payloads: Sequence[Sequence[str]]
                    ) -> FusedOutcome:
    """Several pushes in one call and transaction (``queen.eph_push_v5``): request i pushes
    ``payloads[i]`` to ``partitions[i]`` of ``queues[i]`` of ``tenants[i]``; the requests
    sorted by (tenant, queue, partition). A request that is to be pushed alone is
    ``PUSHED_ALONE`` (all of them when a queue or partition of the call is new)."""
    try:
        row = await _one(conn, PUSH_MANY_SQL,
                         push_many_params(tenants, queues, partitions, payloads), writes=True)
    except _PushAlone:  # nothing was written
        return FusedOutcome([PUSHED_ALONE] * len(tenants), [None] * len(tenants))
    return FusedOutcome(row[0], row[1])


#: ``push_many``'s statement, its parameters ``push_many_params``'s
PUSH_MANY_SQL = ("SELECT pushed, details FROM queen.eph_push_v5(%b::uuid[], %b::text[], "
                 "%b::text[], %b::int4[], %b::int8[], %b::int4[], %b, %b::uuid[], %b::text[], "
                 "%b::int8[], %b::int8[], %b::int4[], %b::text[], %b::int4[], %b::int4[])")


def push_many_params(tenants: Sequence[bytes], queues: Sequence[str],
                     partitions: Sequence[str], payloads: Sequence[Sequence[str]]
                     ) -> tuple[Any, ...]:
    """The requests (sorted), and what they store when every one is stored: per queue its
    tenant, name, messages, bytes and first partition run (one more: past the last run), per
    run its partition, first message (an index of the offsets) and count. PERF(eph): made
    here, they spare ``eph_push_v5``'s usual call a plpgsql expression per request (each
    prepared again in every transaction)."""
    body, offs = _body([x for p in payloads for x in p])
    bytes_: list[int] = []
    q_tenants: list[bytes] = []
    q_queues: list[str] = []
    q_n: list[int] = []
    q_b: list[int] = []
    q_r: list[int] = []
    r_parts: list[str] = []
    r_first: list[int] = []
    r_n: list[int] = []
    at = 0
    for tenant, queue, part, p in zip(tenants, queues, partitions, payloads, strict=True):
        n = len(p)
        size = offs[at + n] - offs[at] - n  # its offsets' span less its separators
        bytes_.append(size)
        if not q_queues or q_queues[-1] != queue or q_tenants[-1] != tenant:
            q_tenants.append(tenant)
            q_queues.append(queue)
            q_n.append(0)
            q_b.append(0)
            q_r.append(len(r_n) + 1)
        q_n[-1] += n
        q_b[-1] += size
        if n:
            if len(r_n) >= q_r[-1] and r_parts[-1] == part:
                r_n[-1] += n
            else:
                r_parts.append(part)
                r_first.append(at + 1)
                r_n.append(n)
        at += n
    q_r.append(len(r_n) + 1)
    return (uuid_array(tenants), text_array(queues), text_array(partitions),
            int4_array([len(p) for p in payloads]), int8_array(bytes_), int4_array(offs), body,
            uuid_array(q_tenants), text_array(q_queues), int8_array(q_n), int8_array(q_b),
            int4_array(q_r), text_array(r_parts), int4_array(r_first), int4_array(r_n))


async def pop(conn: Conn, tenant: bytes, queue: str, partition: str | None, group: str,
              batch: int, auto_ack: bool) -> PopOutcome:
    row = await _one(conn, POP_SQL, (_tenant(tenant), queue, partition, group, batch, auto_ack),
                     writes=True, binary=True)  # PERF(eph): the payloads' bytes as they are
    return pop_outcome(row)


#: ``pop``'s statement, parameters (tenant uuid, queue, partition, group, batch, autoAck); its
#: row, fetched in binary, is ``pop_outcome``'s (the benches and tests call it too)
POP_SQL = "SELECT * FROM queen.eph_pop_v5(%s, %s, %s, %s, %s, %s)"


def pop_outcome(row: tuple[Any, ...]) -> PopOutcome:
    return PopOutcome(*row[:7], int(row[7]), row[8], int(row[9]), int(row[10]))


async def ack(conn: Conn, tenant: bytes, queue: str, group: str, statuses: Sequence[str],
              epochs: Sequence[str], seqs: Sequence[str], deliveries: Sequence[str]
              ) -> AckOutcome:
    """The ids parsed as ``models.ephemeral.Ack`` holds them ('' where an id is not ours).

    A lone id that is not ours is 'unknown' without a call: its lists would go as '', which
    ``string_to_array`` reads as no element at all, not as one NULL (PostgreSQL answered no
    outcome, and the route a 500)."""
    if len(seqs) == 1 and not epochs[0]:
        return AckOutcome(["unknown"], 0)
    row = await _one(conn, ACK_SQL, ack_params(tenant, queue, group, statuses, epochs, seqs,
                                               deliveries), writes=True, binary=True)
    return ack_outcome(row, len(seqs))


#: ``ack``'s statement; its parameters are ``ack_params``', its row (binary) ``ack_outcome``'s
#: (the benches and tests call them too)
ACK_SQL = ("SELECT outcomes, redelivered FROM queen.eph_ack_v5(%s, %s, %s, "
           "string_to_array(%s, ',', ''), %s, string_to_array(%s, ',', '')::int8[], "
           "string_to_array(%s, ','))")


def ack_params(tenant: bytes, queue: str, group: str, statuses: Sequence[str],
               epochs: Sequence[str], seqs: Sequence[str], deliveries: Sequence[str]
               ) -> tuple[Any, ...]:
    """PERF(eph): the lists go as comma-separated text ('' an element that is NULL; none of
    their elements has a comma): Python built no int and no array element for them (an ack
    of 100 cost the front worker 0.6 us a message in ``int()`` and the binary arrays, and
    binary int8 arrays of the seqs some 180k instructions, callgrind). The seqs go as that
    text, which ``queen.eph_ack_v5``'s usual ack compares with its delivery's (PostgreSQL's
    split and cast of 100 were some 120k instructions); the other lists are split and cast by
    the statement. A list whose elements are all one goes as that one (``queen.eph_ack_v5``
    spreads it), as the usual ack's epochs, deliveries and statuses do: PostgreSQL splits,
    casts and compares one, not one per id."""
    n = len(seqs)
    return (_tenant(tenant), queue, group, _one_or_all(epochs, n), ",".join(seqs),
            _one_or_all(deliveries, n), _one_or_all(statuses, n))


def _one_or_all(items: Sequence[str], n: int) -> str:
    """``items`` joined by commas, or its one element when all ``n`` are that one (not '')."""
    # PERF(eph): count compares in C, mostly by identity (parse_ack slices one split)
    return items[0] if items[0] and items.count(items[0]) == n else ",".join(items)


def ack_outcome(row: tuple[Any, ...], n: int) -> AckOutcome:
    """``n`` ids' outcomes; PostgreSQL answers none (NULL) when every one is 'acked'."""
    return AckOutcome(["acked"] * n if row[0] is None else row[0], int(row[1]))


async def reset(conn: Conn, tenant: bytes, queue: str) -> int:
    row = await _one(conn, "SELECT queen.eph_reset_v1(%s, %s)", (_tenant(tenant), queue),
                     writes=True)
    return int(row[0])


async def delete(conn: Conn, tenant: bytes, queue: str) -> dict[str, Any]:
    row = await _one(conn, "SELECT queen.eph_delete_v1(%s, %s)::text",
                     (_tenant(tenant), queue), writes=True)
    return orjson.loads(row[0])


async def list_queues(conn: Conn, tenant: bytes, limit: int) -> dict[str, Any]:
    row = await _one(conn, "SELECT queen.eph_list_v1(%s, %s)::text", (_tenant(tenant), limit),
                     writes=False)
    return orjson.loads(row[0])


async def depth(conn: Conn, tenant: bytes, queue: str, limit: int) -> dict[str, Any] | None:
    row = await _one(conn, "SELECT queen.eph_depth_v1(%s, %s, %s)::text",
                     (_tenant(tenant), queue, limit), writes=False)
    return None if row[0] is None else orjson.loads(row[0])
