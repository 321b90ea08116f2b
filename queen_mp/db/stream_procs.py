"""Calls into ``sql/functions/streams.sql``: registration, state reads and the cycle of the
Streams SDK (docs/api.md "Streams").

Each is one autocommit statement; its verdicts are JSON results (sql/functions/streams.sql says
their shapes), its failures ``queen_mp.db.errors`` (``MaintenanceOn`` for a cycle during push
maintenance, ``Conflict``, ``Unavailable``, ``StatementTimeout``, ``OutcomeUnknown`` for a
cycle or registration whose commit was sent when the connection died).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from queen_mp.db.errors import translate
from queen_mp.db.txn_procs import Segments

__all__ = ["CycleAck", "cycle", "register", "state_get"]

Conn = psycopg.AsyncConnection[Any]

_REGISTER = "SELECT queen.stream_register_v1(%s, %s, %s, %s, %s, %s)"
_STATE_GET = ("SELECT queen.stream_state_get_v1(%s, %s, %s, %b::text[], %s, %s::numeric,"
              " %s)")
_CYCLE = ("SELECT queen.stream_cycle_v1(%s, %s, %s, %s, %s::jsonb, %b::text[], %b::text[],"
          " %b::int4[], %b::bytea[], %b::bytea[], %s, %s, %s, %s)")


@dataclass(frozen=True, slots=True)
class CycleAck:
    """The source ack of a cycle: under ``lease``, through the message hashed ``txn_hash``
    (the whole leased batch when ``release``)."""

    lease: uuid.UUID
    txn_hash: bytes
    release: bool
    count: int


async def _one(conn: Conn, sql: str, params: tuple[Any, ...], *, commit_sent: bool
               ) -> dict[str, Any]:
    try:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        raise translate(ex, commit_sent=commit_sent) from ex
    assert row is not None
    return row[0]


async def register(conn: Conn, tenant: bytes, name: str, source: str, sink: str | None,
                   config_hash: str, reset: bool) -> dict[str, Any]:
    """``stream_register_v1``: ``{"ok", "queryId", "fresh", "reset"}`` or the conflict."""
    return await _one(conn, _REGISTER, (uuid.UUID(bytes=tenant), name, source, sink,
                                        config_hash, reset), commit_sent=True)


async def state_get(conn: Conn, tenant: bytes, query_id: uuid.UUID, partition_id: int,
                    keys: list[str], prefix: str | None, ripe: float | None, limit: int
                    ) -> dict[str, Any]:
    """``stream_state_get_v1``: ``{"found": false}`` or the rows (key order)."""
    return await _one(conn, _STATE_GET, (uuid.UUID(bytes=tenant), query_id, partition_id,
                                         keys, prefix, ripe, limit), commit_sent=False)


async def cycle(conn: Conn, tenant: bytes, query_id: uuid.UUID, partition_id: int, group: str,
                state_ops_json: str, seg: Segments, ack: CycleAck | None
                ) -> dict[str, Any]:
    """``stream_cycle_v1``: the cycle's verdict (success, or a refusal reason).
    ``state_ops_json``: the JSON array of the normalised state ops."""
    params = (uuid.UUID(bytes=tenant), query_id, partition_id, group, state_ops_json,
              seg.queues, seg.partitions, seg.counts,
              seg.hashes, seg.blobs, ack.lease if ack else None,
              ack.txn_hash if ack else None, ack.release if ack else None,
              ack.count if ack else None)
    return await _one(conn, _CYCLE, params, commit_sent=True)
