"""Named calls into the consumer-group procedures, ``sql/functions/groups.sql`` (docs/api.md 2.10).

Every function takes an open autocommit psycopg connection (one procedure call = one
transaction) and returns plain Python values: rows as dicts keyed by the procedure's column
names, times as aware ``datetime``. psycopg errors do not leave this module: they are translated
with ``queen_mp.db.errors.translate`` (a write whose connection is lost is ``OutcomeUnknown``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from queen_mp.db.calls import fetch_rows, tenant_uuid
from queen_mp.db.errors import translate

__all__ = [
    "DeleteResult",
    "SubscriptionResult",
    "cursors",
    "delete_group",
    "lagging",
    "list_groups",
    "seek",
    "set_subscription",
]

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class DeleteResult:
    deleted_partitions: int  # cursor rows deleted (their leases with them)
    metadata_rows: int  # consumer_groups_meta rows deleted


@dataclass(frozen=True, slots=True)
class SubscriptionResult:
    queues_found: int  # 0 with an explicit queue = unknown queue, nothing done
    meta_rows: int  # subscription records inserted or updated
    cursor_rows: int  # cursors (not consumed from yet) moved to the new start


async def _write(conn: Conn, query: str, params: Sequence[Any]) -> tuple[Any, ...]:
    try:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        # NOTE(groups): autocommit: the statement is its own commit, so a connection lost
        # after it was sent leaves the outcome open.
        raise translate(ex, commit_sent=True) from ex
    assert row is not None
    return row


async def list_groups(conn: Conn, tenant: bytes) -> list[dict[str, Any]]:
    """``group_list_v1``: one row per (group, queue)."""
    return await fetch_rows(conn, "SELECT * FROM queen.group_list_v1(%s)", (tenant_uuid(tenant),))


async def cursors(conn: Conn, tenant: bytes, group: str | None) -> list[dict[str, Any]]:
    """``group_cursors_v1``: one row per cursor of ``group`` (every group if None)."""
    return await fetch_rows(conn, "SELECT * FROM queen.group_cursors_v1(%s, %s)",
                       (tenant_uuid(tenant), group))


async def lagging(conn: Conn, tenant: bytes, min_seconds: int) -> list[dict[str, Any]]:
    """``group_lagging_v1``: cursors whose oldest pending message is >= min_seconds old."""
    return await fetch_rows(conn, "SELECT * FROM queen.group_lagging_v1(%s, %s)",
                       (tenant_uuid(tenant), min_seconds))


async def delete_group(conn: Conn, tenant: bytes, group: str, queue: str | None,
                       delete_metadata: bool) -> DeleteResult:
    """``group_delete_v1``: cursors (and leases) of ``group`` on ``queue`` or everywhere."""
    row = await _write(conn, "SELECT * FROM queen.group_delete_v1(%s, %s, %s, %s)",
                       (tenant_uuid(tenant), group, queue, delete_metadata))
    return DeleteResult(int(row[0]), int(row[1]))


async def set_subscription(conn: Conn, tenant: bytes, group: str, queue: str | None,
                           start: dt.datetime) -> SubscriptionResult:
    """``group_subscription_v1``: 'timestamp' start for one queue or every recorded one."""
    row = await _write(conn, "SELECT * FROM queen.group_subscription_v1(%s, %s, %s, %s)",
                       (tenant_uuid(tenant), group, queue, start))
    return SubscriptionResult(int(row[0]), int(row[1]), int(row[2]))


async def seek(conn: Conn, tenant: bytes, group: str, queue: str, target: str,
               start: dt.datetime | None) -> int | None:
    """``group_seek_v1``: partitions set, or None when the queue does not exist.

    ``target`` is 'beginning', 'end' or 'timestamp' (then ``start`` is required).
    """
    row = await _write(conn, "SELECT queen.group_seek_v1(%s, %s, %s, %s, %s)",
                       (tenant_uuid(tenant), group, queue, target, start))
    return None if row[0] is None else int(row[0])
