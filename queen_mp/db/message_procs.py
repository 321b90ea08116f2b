"""Named calls into the message browser, ``sql/functions/messages.sql`` (docs/api.md 2.9).

Every function takes an open autocommit psycopg connection and returns plain Python values:
rows as frozen records, times as aware ``datetime``, payloads as ``bytes``. One call is one
statement (one snapshot); ``snapshot`` opens the REPEATABLE READ READ ONLY transaction in which
the single-message lookup makes several calls that must agree. psycopg errors do not leave this
module: they are translated with ``queen_mp.db.errors.translate``. Nothing here writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from queen_mp.db.calls import Segment, fetch_rows, tenant_uuid
from queen_mp.db.errors import translate

__all__ = [
    "Found",
    "GroupState",
    "ListPage",
    "PageSegment",
    "Segment",
    "find",
    "groups",
    "list_page",
    "segments_below",
    "snapshot",
]

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class PageSegment:
    """One segment covering the page (``msg_list_v1`` row) with the group's state."""

    skip: int  # matching messages before this segment, in list order
    matched: int  # matching messages inside it (>= 1)
    queue: str
    namespace: str
    task: str | None
    partition_id: int
    partition: str
    base_offset: int
    msg_count: int
    created_at: dt.datetime
    payload: bytes
    committed: int  # the group's cursor; 0 without a cursor row
    lease_start: int | None  # the group's LIVE lease (batch range); None without one
    lease_end: int | None
    lease_expires_at: dt.datetime | None
    dlq_offsets: tuple[int, ...]  # distinct dead-lettered offsets of the segment, ascending


@dataclass(frozen=True, slots=True)
class ListPage:
    total: int  # every matching message, the page notwithstanding
    segments: list[PageSegment]


@dataclass(frozen=True, slots=True)
class Found:
    """``msg_find_v1``: a partition of the tenant and the newest sidecar occurrence."""

    queue: str
    namespace: str
    task: str | None
    partition: str
    log_start_offset: int
    txns_start: int  # the sidecar covers offsets >= txns_start only
    last_offset: int
    offset: int | None  # None = no occurrence in the sidecar
    segment: Segment | None  # the segment holding ``offset``


@dataclass(frozen=True, slots=True)
class GroupState:
    """``msg_groups_v1``: one group's view of one offset."""

    name: str
    committed: int
    lease_start: int | None  # LIVE lease only
    lease_end: int | None
    lease_expires_at: dt.datetime | None
    head_retry_count: int  # failed acks of the head, when the offset is the head
    dead: bool  # a DLQ row of (partition, group, offset)
    error: str | None
    retry_count: int | None  # of that DLQ row


@asynccontextmanager
async def snapshot(conn: Conn) -> AsyncIterator[Conn]:
    """One REPEATABLE READ READ ONLY transaction: every call inside sees one snapshot."""
    try:
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield conn
    except psycopg.Error as ex:
        raise translate(ex) from ex


async def list_page(conn: Conn, tenant: bytes, *, queue: str | None, partition: str | None,
                    namespace: str | None, task: str | None, group: str, status: str | None,
                    since: dt.datetime | None, until: dt.datetime | None, limit: int,
                    offset: int, from_offset: int | None = None) -> ListPage | None:
    """``msg_list_v1``: the page's segments in list order and the total; None when ``queue``
    names no queue of the tenant. ``since`` None = one hour before ``until`` (or now), or no
    lower bound with ``from_offset`` (offsets below it are not counted nor listed)."""
    rows = await fetch_rows(
        conn, "SELECT * FROM queen.msg_list_v1(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (tenant_uuid(tenant), queue, partition, namespace, task, group, status, since, until,
         limit, offset, from_offset))
    if not rows:
        return None
    segments = [
        PageSegment(
            skip=r["skip"], matched=r["matched"], queue=r["queue_name"],
            namespace=r["namespace"], task=r["task"], partition_id=r["partition_id"],
            partition=r["partition_name"], base_offset=r["base_offset"],
            msg_count=r["msg_count"], created_at=r["created_at"], payload=bytes(r["payload"]),
            committed=r["committed_offset"], lease_start=r["lease_start"],
            lease_end=r["lease_end"], lease_expires_at=r["lease_expires_at"],
            dlq_offsets=tuple(r["dlq_offsets"] or ()))
        # NOTE(messages): an empty page is one row whose columns but `total` are NULL.
        for r in rows if r["skip"] is not None]
    return ListPage(int(rows[0]["total"]), segments)


async def find(conn: Conn, tenant: bytes, partition_id: int, txn_hash: bytes,
               before: int | None = None) -> Found | None:
    """``msg_find_v1``: None when the partition is not the tenant's (or does not exist)."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.msg_find_v1(%s, %s, %s, %s)",
                       (tenant_uuid(tenant), partition_id, txn_hash, before))
    if not rows:
        return None
    r = rows[0]
    segment = None
    if r["base_offset"] is not None:
        segment = Segment(r["base_offset"], r["msg_count"], r["created_at"],
                          bytes(r["payload"]))
    return Found(queue=r["queue_name"], namespace=r["namespace"], task=r["task"],
                 partition=r["partition_name"], log_start_offset=r["log_start_offset"],
                 txns_start=r["txns_start"], last_offset=r["last_offset"],
                 offset=r["found_offset"], segment=segment)


async def segments_below(conn: Conn, tenant: bytes, partition_id: int, below: int,
                         limit: int) -> list[Segment]:
    """``msg_segments_below_v1``: up to ``limit`` segments with base_offset < ``below``,
    newest first."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.msg_segments_below_v1(%s, %s, %s, %s)",
                       (tenant_uuid(tenant), partition_id, below, limit))
    return [Segment(r["base_offset"], r["msg_count"], r["created_at"], bytes(r["payload"]))
            for r in rows]


async def groups(conn: Conn, tenant: bytes, partition_id: int, offset: int) -> list[GroupState]:
    """``msg_groups_v1``: every group with a cursor on the partition or a DLQ row at the offset,
    by name."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.msg_groups_v1(%s, %s, %s)",
                       (tenant_uuid(tenant), partition_id, offset))
    return [GroupState(name=r["consumer_group"], committed=r["committed_offset"],
                       lease_start=r["lease_start"], lease_end=r["lease_end"],
                       lease_expires_at=r["lease_expires_at"],
                       head_retry_count=r["head_retry_count"], dead=bool(r["dead"]),
                       error=r["error"], retry_count=r["retry_count"]) for r in rows]
