"""Named calls into the dead-letter procedures of ``sql/functions/dlq.sql`` (docs/api.md 2.8).

Every function takes an open autocommit psycopg connection (one procedure call = one
transaction) and returns plain Python values: rows as frozen records, times as aware
``datetime``. psycopg errors do not leave this module: they are translated with
``queen_mp.db.errors.translate`` (a write whose connection is lost is ``OutcomeUnknown``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from queen_mp.db.calls import fetch_rows, tenant_uuid
from queen_mp.db.errors import translate

__all__ = ["DlqFilter", "DlqPage", "DlqRow", "RetryResult", "delete", "delete_matching", "find",
           "list_page", "match", "retry"]

Conn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class DlqRow:
    """One ``queen.log_dlq`` row with its queue name (log_dlq in sql/schema/001_baseline.sql)."""

    id: int
    queue: str
    partition_id: int
    partition: str
    consumer_group: str
    offset: int
    message_id: bytes  # 16 bytes; all zero when the message was retained away before filing
    transaction_id: str
    trace_id: bytes | None
    producer_sub: str | None
    encrypted: bool  # payload is the stored AES-GCM ciphertext (frame flag 4)
    payload: bytes | None  # as stored in the frame; None = no snapshot
    error: str | None
    retry_count: int
    created_at: dt.datetime | None  # the original message's createdAt
    failed_at: dt.datetime  # when the row was filed
    queue_encrypted: bool = False  # the queue's flag NOW (dlq_find_v1 only)


@dataclass(frozen=True, slots=True)
class DlqFilter:
    """The listing's filters (GET /api/v1/dlq), also what the by-filter retry and delete act
    on. None = any; ``since``/``until`` bound failedAt, both inclusive."""

    queue: str | None
    group: str | None
    partition: str | None
    since: dt.datetime | None
    until: dt.datetime | None

    def params(self, tenant: bytes) -> tuple[Any, ...]:
        return (tenant_uuid(tenant), self.queue, self.group, self.partition, self.since,
                self.until)


@dataclass(frozen=True, slots=True)
class DlqPage:
    total: int  # every match, the page notwithstanding
    rows: list[DlqRow]


@dataclass(frozen=True, slots=True)
class RetryResult:
    ok: bool
    error: str | None  # None | 'not_found' | 'partition_not_found'
    retried: int  # DLQ rows deleted
    offset: int | None  # offset of the replayed message
    created_at_us: int | None  # its createdAt, epoch microseconds
    queue: str | None


def _row(r: dict[str, Any]) -> DlqRow:
    trace = r["trace_id"]
    payload = r["payload"]
    return DlqRow(
        id=r["id"], queue=r["queue_name"], partition_id=r["partition_id"],
        partition=r["partition_name"], consumer_group=r["consumer_group"], offset=r["offset"],
        message_id=r["message_id"].bytes, transaction_id=r["transaction_id"],
        trace_id=trace.bytes if trace is not None else None, producer_sub=r["producer_sub"],
        encrypted=bool(r["encrypted"]), payload=bytes(payload) if payload is not None else None,
        error=r["error"], retry_count=r["retry_count"], created_at=r["message_created_at"],
        failed_at=r["failed_at"], queue_encrypted=bool(r.get("queue_encrypted")))


async def _write(conn: Conn, query: str, params: Sequence[Any]) -> Any:
    try:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        # NOTE(dlq): autocommit: the statement is its own commit, so a connection lost after
        # it was sent leaves the outcome open.
        raise translate(ex, commit_sent=True) from ex
    assert row is not None
    return row[0]


async def list_page(conn: Conn, tenant: bytes, where: DlqFilter, *, limit: int,
                    offset: int) -> DlqPage:
    """``dlq_list_v1``: one page in (failedAt, partitionId, offset) order, and the total."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.dlq_list_v1(%s, %s, %s, %s, %s, %s, %s, %s)",
                            (*where.params(tenant), limit, offset))
    total = int(rows[0]["total"]) if rows else 0
    # NOTE(dlq): an empty page is one row whose columns but `total` are NULL.
    return DlqPage(total, [_row(r) for r in rows if r["id"] is not None])


async def find(conn: Conn, tenant: bytes, partition_id: int, transaction_id: str,
               group: str | None) -> list[DlqRow]:
    """``dlq_find_v1``: the rows of (partition, transactionId[, group]); the first replays."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.dlq_find_v1(%s, %s, %s, %s)",
                       (tenant_uuid(tenant), partition_id, transaction_id, group))
    return [_row(r) for r in rows]


async def retry(conn: Conn, tenant: bytes, partition_id: int, transaction_id: str,
                offset: int, group: str | None, blob: bytes, hashes: bytes) -> RetryResult:
    """``dlq_retry_v1``: delete the rows at ``offset`` and push ``blob`` to the tail, at once."""
    res = await _write(conn, "SELECT queen.dlq_retry_v1(%s, %s, %s, %s, %s, %s, %s)",
                       (tenant_uuid(tenant), partition_id, transaction_id, offset, group, blob,
                        hashes))
    return RetryResult(bool(res["ok"]), res["error"], int(res["retried"]), res["offset"],
                       res["ts"], res["queue"])


async def delete(conn: Conn, tenant: bytes, partition_id: int, transaction_id: str,
                 group: str | None) -> int:
    """``dlq_delete_v1``: rows deleted (0 = none matched)."""
    return int(await _write(conn, "SELECT queen.dlq_delete_v1(%s, %s, %s, %s)",
                            (tenant_uuid(tenant), partition_id, transaction_id, group)))


async def match(conn: Conn, tenant: bytes, where: DlqFilter, limit: int) -> list[DlqRow]:
    """``dlq_match_v1``: the first ``limit`` matching rows in list order, as ``find`` shapes
    them (with the queue's current encryption flag): what a retry by filter replays."""
    rows = await fetch_rows(conn, "SELECT * FROM queen.dlq_match_v1(%s, %s, %s, %s, %s, %s, %s)",
                            (*where.params(tenant), limit))
    return [_row(r) for r in rows]


async def delete_matching(conn: Conn, tenant: bytes, where: DlqFilter, limit: int) -> int:
    """``dlq_delete_matching_v1``: rows deleted, the first ``limit`` matches in list order."""
    return int(await _write(conn, "SELECT queen.dlq_delete_matching_v1(%s, %s, %s, %s, %s, %s, %s)",
                            (*where.params(tenant), limit)))
