"""Calls into ``sql/functions/reads.sql``: reads by offset and partition discovery (docs/api.md
2.15). Both only read; neither takes a lock.

``fetch`` answers one ``FetchedEntry`` per request entry, in request order, with the stored
segments that cover its records (the caller decodes them); ``changed`` one page of one queue's
partitions with its ``safeTime``. psycopg errors leave as ``queen_mp.db.errors`` ones.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from queen_mp.db.errors import DatabaseError, translate
from queen_mp.db.pop_procs import StoredChunks

__all__ = ["GUARD_S", "ChangedPage", "ChangedPartition", "FetchedEntry", "changed", "fetch"]

_FETCH = ("SELECT * FROM queen.log_fetch_v1(%s, %s::text[], %s::text[], %s::int8[], %s::int8[],"
          " %s::int8, %s::int4)")
_CHANGED = ("SELECT queen.log_partitions_changed_v1(%s, %s, %s::timestamptz, %s::int8, %s::int4,"
            " %s::int4, %s::int4, %s::int4)")
#: seconds safeTime stays below the database's now() at least (reads.sql says why)
GUARD_S = 5


@dataclass(frozen=True, slots=True)
class FetchedEntry:
    """One entry's bounds (``high`` = the next offset to be assigned, ``log_start`` the oldest
    kept), its error (``OFFSET_OUT_OF_RANGE``, ``UNKNOWN_TOPIC_OR_PARTITION``) and the stored
    segments covering its records from the asked offset, ascending."""

    error: str | None
    high: int
    log_start: int
    segments: list[StoredChunks]


@dataclass(frozen=True, slots=True)
class ChangedPartition:
    id: int
    name: str
    last_offset: int
    log_start: int
    last_write_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class ChangedPage:
    """One page: ``known`` false = the queue is absent or has no partition; ``next`` the
    cursor of the next page (None: the pass is over)."""

    safe_time: dt.datetime
    degraded: bool
    known: bool
    partitions: list[ChangedPartition]
    next: int | None


async def fetch(conn: psycopg.AsyncConnection[Any], tenant: bytes, queues: list[str],
                partitions: list[str], offsets: list[int], max_bytes: list[int], budget: int,
                max_records: int) -> list[FetchedEntry]:
    """``log_fetch_v1`` for every (queue, partition, offset, maxBytes) entry in one statement
    (one snapshot); ``budget`` bounds the stored bytes of the whole call."""
    try:
        cur = await conn.execute(_FETCH, (
            uuid.UUID(bytes=tenant), queues, partitions, offsets, max_bytes, budget,
            max_records), binary=True)  # PERF(queen): payloads as stored, not hex text
        rows = await cur.fetchall()
    except psycopg.Error as ex:
        raise translate(ex) from ex
    heads: list[tuple[str | None, int, int]] = []
    segments: list[list[StoredChunks]] = []
    for k, error, high, log_start, base, _count, created, payload in rows:
        if k == len(heads):
            heads.append((error, int(high), int(log_start)))
            segments.append([])
        elif k != len(heads) - 1:
            raise DatabaseError(f"log_fetch_v1 answered entry {k} after {len(heads)}")
        if base is not None:
            segments[k].append((int(base), created, bytes(payload)))
    if len(heads) != len(queues):
        raise DatabaseError(f"log_fetch_v1 answered {len(heads)} entries for {len(queues)}")
    return [FetchedEntry(e, h, s, segs) for (e, h, s), segs in zip(heads, segments, strict=True)]


def _time(value: Any) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromisoformat(value)


async def changed(conn: psycopg.AsyncConnection[Any], tenant: bytes, queue: str | None,
                  since: dt.datetime | None, after: int | None, limit: int, scan: int,
                  floor_s: int) -> ChangedPage:
    """``log_partitions_changed_v1``: one page (``queue`` None: the safeTime alone), as its own
    autocommit statement (the safeTime argument in reads.sql needs READ COMMITTED and a
    statement of its own)."""
    try:
        cur = await conn.execute(_CHANGED, (
            uuid.UUID(bytes=tenant), queue, since, after, limit, scan, GUARD_S, floor_s))
        row = await cur.fetchone()
    except psycopg.Error as ex:
        raise translate(ex) from ex
    assert row is not None
    doc = row[0]
    safe = _time(doc["safeTime"])
    assert safe is not None
    return ChangedPage(
        safe, bool(doc["degraded"]), bool(doc["known"]),
        [ChangedPartition(int(p["id"]), p["name"], int(p["lastOffset"]), int(p["logStart"]),
                          _time(p["lastWriteAt"])) for p in doc["partitions"]],
        None if doc["next"] is None else int(doc["next"]))
