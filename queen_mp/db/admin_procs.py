"""Named calls into the admin procedures of ``sql/functions/admin.sql`` (docs/api.md 2.7, 4, 5).

Every function takes an open autocommit psycopg connection and returns plain Python values:
rows as dicts keyed by the procedure's column names, times as aware ``datetime``. One call is
one transaction, except ``queue_detail``, whose reads share one REPEATABLE READ snapshot so that
its totals are the sum of its partitions. psycopg errors do not leave this module: they are
translated with ``queen_mp.db.errors.translate`` (a write whose connection is lost is
``OutcomeUnknown``); a configure option the SQL refuses is ``InvalidOption``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from queen_mp.db.calls import fetch_rows, tenant_uuid
from queen_mp.db.errors import StatementError, translate

__all__ = [
    "InvalidOption",
    "Page",
    "QueueDetail",
    "configure",
    "delete_queue",
    "depth",
    "dlq_summary",
    "leases",
    "namespaces",
    "overview",
    "partitions_page",
    "purge_queue",
    "queue_detail",
    "queues_page",
    "tasks",
    "throughput",
]

Conn = psycopg.AsyncConnection[Any]

_INVALID_PARAMETER = "22023"


class InvalidOption(StatementError):
    """22023 from queue_configure_v1: ``field`` names the refused option (or body field)."""

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message, sqlstate=_INVALID_PARAMETER)
        self.field = field


@dataclass(frozen=True, slots=True)
class Page:
    total: int  # every match, the page notwithstanding
    rows: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class QueueDetail:
    queue: dict[str, Any]  # admin_queue_v1 row (``options``, ``dead_letter``), plus ``evicted``
    partitions: list[dict[str, Any]]  # admin_partition_stats_v1 rows
    groups: list[dict[str, Any]]  # admin_queue_groups_v1 rows
    cursors: list[dict[str, Any]]  # admin_queue_cursors_v1 rows ([] unless asked for)


async def _value(conn: Conn, query: str, params: Sequence[Any], *, write: bool) -> Any:
    try:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        if ex.sqlstate == _INVALID_PARAMETER and write:
            raise InvalidOption(ex.diag.message_primary or str(ex),
                                ex.diag.column_name) from ex
        # NOTE(admin): autocommit: a write is its own commit, so a connection lost after it
        # was sent leaves the outcome open.
        raise translate(ex, commit_sent=write) from ex
    assert row is not None
    return row[0]


def _page(rows: list[dict[str, Any]]) -> Page:
    """The procedures' empty-page convention: one row with id NULL carrying total_count."""
    total = int(rows[0]["total_count"]) if rows else 0
    return Page(total, [r for r in rows if r["id"] is not None])


# ------------------------------------------------------------------------------------ writes
async def configure(conn: Conn, tenant: bytes, queue: str, namespace: str | None,
                    task: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """``queue_configure_v1``: {created, queueId, queue, namespace, task, options}.

    ``options`` holds camelCase docs/api.md 4 keys only, already type-checked; ``task`` ``""``
    removes the task.
    """
    return await _value(conn, "SELECT queen.queue_configure_v1(%s, %s, %s, %s, %s::jsonb)",
                        (tenant_uuid(tenant), queue, namespace, task,
                         Jsonb(options)), write=True)


async def delete_queue(conn: Conn, tenant: bytes, queue: str) -> bool:
    """``queue_delete_v1``: True when the queue existed (and is now gone)."""
    return bool(await _value(conn, "SELECT queen.queue_delete_v1(%s, %s)",
                             (tenant_uuid(tenant), queue), write=True))


async def purge_queue(conn: Conn, tenant: bytes, queue: str) -> dict[str, int] | None:
    """``queue_purge_v1``: counts of what went and what live leases kept; None = no queue."""
    return await _value(conn, "SELECT queen.queue_purge_v1(%s, %s)",
                        (tenant_uuid(tenant), queue), write=True)


# ------------------------------------------------------------------------------------- reads
async def overview(conn: Conn, tenant: bytes) -> dict[str, Any]:
    rows = await fetch_rows(conn, "SELECT * FROM queen.admin_overview_v1(%s)",
                            (tenant_uuid(tenant),))
    return rows[0]


async def queues_page(conn: Conn, tenant: bytes, *, queue: str | None = None,
                      namespace: str | None = None, task: str | None = None,
                      limit: int | None = None, offset: int = 0) -> Page:
    """``admin_queues_v1``: a page of queues by name with their counts (limit None = all)."""
    return _page(await fetch_rows(
        conn, "SELECT * FROM queen.admin_queues_v1(%s, %s, %s, %s, %s, %s)",
        (tenant_uuid(tenant), queue, namespace, task, limit, offset)))


async def queue_detail(conn: Conn, tenant: bytes, queue: str, *,
                       with_cursors: bool = False) -> QueueDetail | None:
    """The queue, its partitions and groups from one snapshot; None when absent."""
    t = tenant_uuid(tenant)
    try:
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            head = await fetch_rows(conn, "SELECT * FROM queen.admin_queue_v1(%s, %s)", (t, queue))
            if not head:
                return None
            qid = head[0]["id"]
            parts = await fetch_rows(
                conn, "SELECT * FROM queen.admin_partition_stats_v1(%s, %s)", (t, qid))
            groups = await fetch_rows(
                conn, "SELECT * FROM queen.admin_queue_groups_v1(%s, %s)", (t, qid))
            cursors = (await fetch_rows(
                conn, "SELECT * FROM queen.admin_queue_cursors_v1(%s, %s)", (t, qid))
                if with_cursors else [])
            evicted = await fetch_rows(
                conn, "SELECT queen.queue_evicted_v1(%s, %s) AS evicted", (t, qid))
    except psycopg.Error as ex:
        raise translate(ex) from ex
    return QueueDetail({**head[0], "evicted": evicted[0]["evicted"]}, parts, groups, cursors)


async def depth(conn: Conn, tenant: bytes, queue: str,
                group: str | None) -> list[dict[str, Any]] | None:
    """``admin_depth_v1``: [{partition_id, partition_name, pending}], None = no such queue."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.admin_depth_v1(%s, %s, %s)",
                       (tenant_uuid(tenant), queue, group))
    if not rows:
        return None
    return [r for r in rows if r["partition_id"] is not None]


async def namespaces(conn: Conn, tenant: bytes) -> list[dict[str, Any]]:
    return await fetch_rows(conn, "SELECT * FROM queen.admin_namespaces_v1(%s)",
                            (tenant_uuid(tenant),))


async def tasks(conn: Conn, tenant: bytes) -> list[dict[str, Any]]:
    return await fetch_rows(conn, "SELECT * FROM queen.admin_tasks_v1(%s)", (tenant_uuid(tenant),))


async def partitions_page(conn: Conn, tenant: bytes, queue: str | None, limit: int,
                          offset: int) -> Page:
    """``admin_partitions_v1``: a page of partitions by (queue name, partition name)."""
    return _page(await fetch_rows(conn, "SELECT * FROM queen.admin_partitions_v1(%s, %s, %s, %s)",
                             (tenant_uuid(tenant), queue, limit, offset)))


async def throughput(conn: Conn, tenant: bytes, queue: str | None, namespace: str | None,
                     task: str | None, start: dt.datetime, end: dt.datetime,
                     bucket_s: int) -> list[dict[str, Any]]:
    """``admin_throughput_v1``: [{bucket_at, ingested}] for every bucket of [start, end)."""
    return await fetch_rows(
        conn, "SELECT * FROM queen.admin_throughput_v1(%s, %s, %s, %s, %s, %s, %s)",
        (tenant_uuid(tenant), queue, namespace, task, start, end, bucket_s))


async def leases(conn: Conn, tenant: bytes, queue: str | None, namespace: str | None,
                 task: str | None) -> dict[str, Any]:
    """``admin_leases_v1``: {active, partitions_with_leases}."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.admin_leases_v1(%s, %s, %s, %s)",
                       (tenant_uuid(tenant), queue, namespace, task))
    return rows[0]


async def dlq_summary(conn: Conn, tenant: bytes, queue: str | None, namespace: str | None,
                      task: str | None, start: dt.datetime, end: dt.datetime,
                      top: int) -> dict[str, Any]:
    """``admin_dlq_summary_v1``: {totalMessages, affectedPartitions, topErrors}."""
    return await _value(
        conn, "SELECT queen.admin_dlq_summary_v1(%s, %s, %s, %s, %s, %s, %s)",
        (tenant_uuid(tenant), queue, namespace, task, start, end, top), write=False)
