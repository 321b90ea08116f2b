"""Named calls into the timer procedures of ``sql/functions/timers.sql`` (docs/api.md 2.5, 2.11).

Two kinds of callers:

* request handlers (``queen_mp/http/timers.py``; the transaction endpoint calls ``provision``
  and ``apply`` inside its own transaction) on a pooled autocommit connection: ``run_ops``
  wraps ``require_writable_v1``, ``timer_provision_v1`` and ``timer_apply_v1`` in ONE
  transaction; ``get`` and ``list_pending`` are single autocommit reads;
* the shard firers (``queen_mp/shards/timerfire.py``): ``claim_due``, ``push_multi`` and
  ``mark_fired`` inside the firer's transaction, ``purge`` on its own.

psycopg errors do not leave this module: they are translated with
``queen_mp.db.errors.translate``; push maintenance (SQLSTATE ``QM001`` from
``queen.require_writable_v1``) is ``Maintenance``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb

from queen_mp.db.calls import PUSH_MULTI, SegmentVerdict, segment_verdicts, tenant_uuid
from queen_mp.db.errors import StatementError, translate

__all__ = [
    "DueTimer",
    "Maintenance",
    "any_due",
    "apply",
    "claim_due",
    "get",
    "list_pending",
    "mark_fired",
    "provision",
    "purge",
    "push_multi",
    "require_writable",
    "run_ops",
]

Conn = psycopg.AsyncConnection[Any]

MAINTENANCE_SQLSTATE = "QM001"


class Maintenance(StatementError):
    """Push maintenance is on (``QM001``): nothing was attempted."""


@dataclass(frozen=True, slots=True)
class DueTimer:
    """One timer claimed by ``timer_claim_due_v1`` (locked until the transaction ends)."""

    tenant: bytes  # 16 bytes
    queue_id: int
    queue: str
    timer_key: str
    partition: str
    payload: bytes  # as stored: JSON bytes, or their zstd frame when payload_zstd
    payload_zstd: bool
    transaction_id: str
    message_id: bytes  # 16 bytes
    producer_sub: str | None
    encrypted: bool  # the queue's encryptionEnabled now
    fire_at: dt.datetime


def _translate(ex: psycopg.Error, *, commit_sent: bool = False) -> Exception:
    if ex.sqlstate == MAINTENANCE_SQLSTATE:
        return Maintenance(str(ex), sqlstate=ex.sqlstate)
    return translate(ex, commit_sent=commit_sent)


async def _value(conn: Conn, query: str, params: Sequence[Any]) -> Any:
    """The first column of the one row of ``query`` (statement errors are NOT translated)."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    return None if row is None else row[0]


# --------------------------------------------------------------------------- request side
async def require_writable(conn: Conn) -> None:
    """``queen.require_writable_v1()``: raises ``Maintenance`` in push maintenance."""
    try:
        await conn.execute("SELECT queen.require_writable_v1()")
    except psycopg.Error as ex:
        raise _translate(ex) from ex


async def provision(conn: Conn, tenant: bytes, queues: Sequence[str]) -> None:
    """``timer_provision_v1``: create the missing queues (run it first in the transaction)."""
    if not queues:
        return
    try:
        await conn.execute("SELECT queen.timer_provision_v1(%s, %b::text[])",
                           (tenant_uuid(tenant), list(queues)))
    except psycopg.Error as ex:
        raise _translate(ex) from ex


async def apply(conn: Conn, tenant: bytes, ops: Sequence[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """``timer_apply_v1``: minted normalised ops in order; one result per op."""
    try:
        res = await _value(conn, "SELECT queen.timer_apply_v1(%s, %s)",
                           (tenant_uuid(tenant), Jsonb(list(ops), dumps=_dumps)))
    except psycopg.Error as ex:
        raise _translate(ex) from ex
    if not isinstance(res, list) or len(res) != len(ops):
        raise StatementError(f"timer_apply_v1 returned {res!r} for {len(ops)} ops")
    return res


async def run_ops(conn: Conn, tenant: bytes, ops: Sequence[dict[str, Any]],
                  provision_queues: Sequence[str]) -> list[dict[str, Any]]:
    """One transaction: ``require_writable_v1``, ``timer_provision_v1``, ``timer_apply_v1``.

    A connection lost while the COMMIT was under way is ``OutcomeUnknown``.
    """
    committing = False
    try:
        async with conn.transaction():
            await require_writable(conn)
            await provision(conn, tenant, provision_queues)
            results = await apply(conn, tenant, ops)
            committing = True
    except psycopg.Error as ex:
        raise _translate(ex, commit_sent=committing) from ex
    return results


async def get(conn: Conn, tenant: bytes, queue: str, key: str) -> dict[str, Any] | None:
    """``timer_get_v1``: one timer of any state (see the SQL), or None."""
    try:
        return await _value(conn, "SELECT queen.timer_get_v1(%s, %s, %s)",
                            (tenant_uuid(tenant), queue, key))
    except psycopg.Error as ex:
        raise _translate(ex) from ex


async def list_pending(conn: Conn, tenant: bytes, queue: str, limit: int, offset: int
                       ) -> dict[str, Any]:
    """``timer_list_v1``: ``{"total", "timers"}``, pending timers in (deliverAt, key) order."""
    try:
        res = await _value(conn, "SELECT queen.timer_list_v1(%s, %s, %s, %s)",
                           (tenant_uuid(tenant), queue, limit, offset))
    except psycopg.Error as ex:
        raise _translate(ex) from ex
    assert isinstance(res, dict)
    return res


# --------------------------------------------------------------------------- firer side
# These run inside the firer's own transaction and let psycopg errors through: the firer
# rolls back and retries the round (it logs them; nothing reaches a client).

async def any_due(conn: Conn) -> bool:
    """``timer_due_v2`` (autocommit, no locks): would a round find work?"""
    return bool(await _value(conn, "SELECT queen.timer_due_v2()", ()))


async def claim_due(conn: Conn, limit: int, max_bytes: int, with_encrypted: bool
                    ) -> list[DueTimer]:
    cur = await conn.execute(
        "SELECT tenant, queue_id, queue, timer_key, partition, payload, payload_zstd, "
        "transaction_id, message_id, producer_sub, encrypted, fire_at "
        "FROM queen.timer_claim_due_v1(%s, %s, %s)", (limit, max_bytes, with_encrypted))
    rows = await cur.fetchall()
    return [DueTimer(r[0].bytes, r[1], r[2], r[3], r[4], bytes(r[5] or b""), bool(r[6]), r[7],
                     r[8].bytes, r[9], bool(r[10]), r[11]) for r in rows]


async def push_multi(conn: Conn, queues: Sequence[str], partitions: Sequence[str],
                     counts: Sequence[int], hashes: Sequence[bytes], blobs: Sequence[bytes],
                     tenants: Sequence[bytes]) -> list[SegmentVerdict]:
    """``log_push_multi_v3`` (by name) in the caller's transaction; one verdict per segment,
    in input order."""
    res = await _value(conn, PUSH_MULTI, (
        list(queues), list(partitions), list(counts), list(hashes), [0] * len(queues),
        list(blobs), [uuid.UUID(bytes=t) for t in tenants]))
    return segment_verdicts(res, len(queues))


async def mark_fired(conn: Conn, queue_ids: Sequence[int], keys: Sequence[str]) -> int:
    return int(await _value(conn, "SELECT queen.timer_mark_fired_v1(%b::int8[], %b::text[])",
                            (list(queue_ids), list(keys))))


async def purge(conn: Conn, retention_s: int, batch: int = 10_000) -> int:
    """``timer_purge_v1`` (autocommit): rows deleted, at most ``batch``."""
    return int(await _value(conn, "SELECT queen.timer_purge_v1(%s, %s)",
                            (retention_s, batch)))


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
