"""Named calls into the KV procedures of ``sql/functions/kv.sql`` (docs/api.md 2.5 "KV ops", 2.11).

``apply`` runs one KV call: the ops (normalised by ``queen_mp.models.kv.parse_kv_ops``) in order, in
one transaction; a call with a write first passes ``queen.require_writable_v1`` in the same
statement. Outcomes:

- ``KvOutcome(ok=True, results=[...])``: committed; one result object per op (sql/functions/kv.sql).
- ``KvOutcome(ok=False, ...)``: an op with ``required: true`` failed its precondition
  (SQLSTATE QK001); the transaction rolled back, nothing was written.
- raises ``queen_mp.db.errors.MaintenanceOn`` (QM001, push maintenance is on: nothing
  attempted), ``Conflict`` (deadlock or serialization failure: nothing applied, retry),
  ``Unavailable``, ``StatementTimeout``, ``OutcomeUnknown`` (the connection died after COMMIT
  was sent) or ``StatementError``, all from ``queen_mp.db.errors``.

psycopg errors do not leave this module.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg

from queen_mp.db.errors import translate

__all__ = [
    "SQLSTATE_KV_PRECONDITION",
    "SQLSTATE_MAINTENANCE",
    "KvOutcome",
    "apply",
    "precondition_failed",
    "purge_expired",
]

Conn = psycopg.AsyncConnection[Any]

SQLSTATE_KV_PRECONDITION = "QK001"  # kv_apply_v1: a required op failed its precondition
SQLSTATE_MAINTENANCE = "QM001"  # require_writable_v1: push maintenance is on

_WRITES = frozenset({"put", "putIfAbsent", "delete", "check", "incr"})

_APPLY_READS = "SELECT queen.kv_apply_v1(%s, %s::jsonb)::text"
# NOTE(kv): the guard sits in FROM so it runs before the select list: one statement, one
# round trip for both.
_APPLY_WRITES = ("SELECT queen.kv_apply_v1(%s, %s::jsonb)::text "
                 "FROM queen.require_writable_v1() AS guard")


@dataclass(frozen=True, slots=True)
class KvOutcome:
    """A KV call's outcome: its results, or the required op that rolled it back."""

    ok: bool
    results: list[dict[str, Any]] = field(default_factory=list)  # ok: one per op, in order
    failed_index: int | None = None  # not ok: 0-based position of the failed op in the call
    kv_reason: str | None = None  # not ok: version | exists | absent | bounds | type
    version: int | None = None  # not ok: the current live row's version, None when absent
    value: Any = None  # not ok: the current live row's value, None when absent
    error_text: str | None = None  # not ok: 'kv precondition failed at index <i>'


def precondition_failed(message: str | None, detail: str | None) -> KvOutcome:
    """The ``ok=False`` outcome of a QK001 error, from its MESSAGE and DETAIL (functions/kv.sql).

    Also for callers that catch QK001 in their own SQL and pass its fields up (060).
    """
    try:
        info = orjson.loads(detail) if detail else {}
    except orjson.JSONDecodeError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    index = info.get("failedIndex")
    return KvOutcome(ok=False, failed_index=index, kv_reason=info.get("kvReason"),
                     version=info.get("version"), value=info.get("value"),
                     error_text=message or f"kv precondition failed at index {index}")


async def apply(conn: Conn, tenant: bytes, ops: list[dict[str, Any]]) -> KvOutcome:
    """Run ``ops`` (normalised) as one transaction; see the module docstring."""
    if not ops:
        return KvOutcome(ok=True)
    writes = any(op["op"] in _WRITES for op in ops)
    params = (uuid.UUID(bytes=tenant), orjson.dumps(ops).decode())
    if not writes:
        # PERF(kv): a read-only call has nothing to commit: one autocommit statement.
        try:
            cur = await conn.execute(_APPLY_READS, params)
            row = await cur.fetchone()
        except psycopg.Error as ex:
            raise translate(ex) from ex
        assert row is not None
        return KvOutcome(ok=True, results=orjson.loads(row[0]))

    committing = False
    try:
        # NOTE(kv): the pool's connections are autocommit; the explicit transaction tells a
        # connection lost during the statement (nothing committed) from one lost during
        # COMMIT (outcome unknown).
        async with conn.transaction():
            cur = await conn.execute(_APPLY_WRITES, params)
            row = await cur.fetchone()
            committing = True
    except psycopg.Error as ex:
        if ex.sqlstate == SQLSTATE_KV_PRECONDITION:
            return precondition_failed(ex.diag.message_primary, ex.diag.message_detail)
        raise translate(ex, commit_sent=committing) from ex
    assert row is not None
    return KvOutcome(ok=True, results=orjson.loads(row[0]))


async def purge_expired(conn: Conn, limit: int) -> int:
    """``kv_purge_v1``: delete up to ``limit`` expired rows (never waits on a row lock)."""
    try:
        cur = await conn.execute("SELECT queen.kv_purge_v1(%s)", (limit,))
        row = await cur.fetchone()
    except psycopg.Error as ex:
        raise translate(ex, commit_sent=True) from ex
    assert row is not None
    return int(row[0])
