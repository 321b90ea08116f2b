"""Named calls into ``sql/functions/locks.sql`` (docs/api.md 2.14, ``POST /api/v1/locks``).

``apply`` runs one locks call: the ops (normalised by ``queen_mp.models.locks.parse_lock_ops``)
in one transaction, answered index-aligned by ``queen.locks_apply_v1``. A call with a write
(anything but ``get``) first passes ``queen.require_writable_v1`` in the same statement, as a
KV write does. Raises ``queen_mp.db.errors.MaintenanceOn`` (QM001), ``Conflict`` (deadlock:
nothing applied, retry), ``Unavailable``, ``StatementTimeout``, ``OutcomeUnknown`` or
``StatementError``; psycopg errors do not leave this module.
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from queen_mp.db.calls import tenant_uuid
from queen_mp.db.errors import translate

__all__ = ["apply"]

Conn = psycopg.AsyncConnection[Any]

_READ = "SELECT queen.locks_apply_v1(%s, %s::jsonb)::text"
# NOTE(locks): the guard sits in FROM so it runs first: one statement, one round trip.
_WRITE = ("SELECT queen.locks_apply_v1(%s, %s::jsonb)::text "
          "FROM queen.require_writable_v1() AS guard")


async def apply(conn: Conn, tenant: bytes, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result object per op, in the order of ``ops``."""
    if not ops:
        return []
    params = (tenant_uuid(tenant), orjson.dumps(ops).decode())
    if all(op["op"] == "get" for op in ops):
        try:
            cur = await conn.execute(_READ, params)
            row = await cur.fetchone()
        except psycopg.Error as ex:
            raise translate(ex) from ex
    else:
        committing = False
        try:
            # NOTE(locks): an explicit transaction on the autocommit connection tells a
            # connection lost during the statement (nothing applied) from one lost during
            # COMMIT (outcome unknown).
            async with conn.transaction():
                cur = await conn.execute(_WRITE, params)
                row = await cur.fetchone()
                committing = True
        except psycopg.Error as ex:
            raise translate(ex, commit_sent=committing) from ex
    assert row is not None
    results: list[dict[str, Any]] = orjson.loads(row[0])
    return results
