"""Named calls into ``sql/functions/traces.sql`` (docs/api.md 2.13): record a trace event, and
the three reads of traces. Each is one autocommit statement; psycopg errors leave this module
translated (``queen_mp.db.errors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from queen_mp.db.calls import tenant_uuid
from queen_mp.db.errors import translate

__all__ = ["TraceEvent", "by_name", "for_message", "names", "record"]

Conn = psycopg.AsyncConnection[Any]

_RECORD = ("SELECT queen.trace_record_v1(%s, %s, %s, %s, %s, %s, %s::jsonb, %s::text[])::text")
_MESSAGE = "SELECT queen.trace_message_v1(%s, %s, %s, %s)::text"
_BY_NAME = "SELECT queen.trace_by_name_v1(%s, %s, %s, %s)::text"
_NAMES = "SELECT queen.trace_names_v1(%s, %s, %s)::text"


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One validated trace event (``queen_mp.models.traces.parse_trace``)."""

    transaction_id: str
    partition_id: int
    consumer_group: str
    event_type: str
    data_json: str  # the data object as JSON text
    names: tuple[str, ...]  # distinct, in the order given


async def _one(conn: Conn, query: str, params: tuple[Any, ...], *,
               writes: bool = False) -> dict[str, Any]:
    try:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        raise translate(ex, commit_sent=writes) from ex
    assert row is not None
    answer: dict[str, Any] = orjson.loads(row[0])
    return answer


async def record(conn: Conn, tenant: bytes, event: TraceEvent, txn_hash: bytes
                 ) -> dict[str, Any]:
    """``{"recorded": true, "traceId", "offset"}``, or ``{"recorded": false}`` when the tenant
    has no such message (nothing written)."""
    return await _one(conn, _RECORD, (
        tenant_uuid(tenant), event.partition_id, txn_hash, event.transaction_id,
        event.consumer_group, event.event_type, event.data_json, list(event.names)),
        writes=True)


async def for_message(conn: Conn, tenant: bytes, partition_id: int, transaction_id: str,
                      limit: int) -> dict[str, Any]:
    """``{"traces": [...], "truncated"}``: the message's first ``limit`` traces, in order."""
    return await _one(conn, _MESSAGE, (tenant_uuid(tenant), partition_id, transaction_id, limit))


async def by_name(conn: Conn, tenant: bytes, name: str, limit: int, offset: int
                  ) -> dict[str, Any]:
    """``{"traces": [...], "total"}``: one page of the tenant's traces named ``name``."""
    return await _one(conn, _BY_NAME, (tenant_uuid(tenant), name, limit, offset))


async def names(conn: Conn, tenant: bytes, limit: int, offset: int) -> dict[str, Any]:
    """``{"traceNames": [...], "total"}``: one page of the tenant's trace names."""
    return await _one(conn, _NAMES, (tenant_uuid(tenant), limit, offset))
