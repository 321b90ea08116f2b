"""What the named calls of queen_mp/db share: the tenant as the uuid the procedures take, a
set-returning procedure's answer as dict rows, with psycopg errors translated at this boundary,
and the push bundle statement that both the shards and the timer firer send, with its answer
decoded into one ``SegmentVerdict`` per segment.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import dict_row

from queen_mp.db.errors import DatabaseError, translate

__all__ = ["PUSH_MULTI", "Segment", "SegmentVerdict", "fetch_rows", "segment_verdicts",
           "tenant_uuid"]

# PERF(queen): arrays go in binary (%b): psycopg's text form hex-escapes every bytea element
# and runs a quoting regex over the result, 47 ms per MB of segment blobs against 0.9 ms.
# The timer firer names its partitions (NULL ids); the shards send the ids they cached
# (queen_mp/db/bundles.py).
PUSH_MULTI = ("SELECT queen.log_push_multi_v3(NULL, %b::text[], %b::text[], %b::int4[],"
              " %b::bytea[], %b::int8[], %b::bytea[], %b::uuid[])")


@dataclass(frozen=True, slots=True)
class Segment:
    """One stored segment: a row of ``log_segments`` as ``log_segment_at_v1`` (and the message
    reads) answer it."""

    base_offset: int
    msg_count: int
    created_at: dt.datetime
    payload: bytes


class SegmentVerdict(NamedTuple):
    """What ``log_push_multi_v3`` answered for one segment (= one partition) of a bundle.

    ``queued``: the segment is stored at ``base_offset .. base_offset + count - 1``.
    Otherwise it was a duplicate and nothing of it was written: ``duplicates`` holds
    (frame index in the segment, offset of the stored original) of each frame found stored,
    and the other frames are to be pushed again.

    PERF(queen): a NamedTuple built in C from its fields (``tuple.__new__``), one per segment
    of every bundle commit: a slots dataclass took six descriptor calls to fill.
    """

    partition_id: int
    created_at_us: int  # the bundle's timestamp, microseconds since the epoch
    queued: bool
    base_offset: int | None  # None unless queued
    window: int  # the queue's dedupWindow (s) as the statement saw it; 0 = none
    duplicates: tuple[tuple[int, int], ...]  # (frame index, original's offset); () if queued


_TUPLE_NEW = tuple.__new__


def segment_verdicts(answer: Sequence[int] | None, n: int) -> list[SegmentVerdict]:
    """``log_push_multi_v3``'s answer (one int8[], input order: n partition ids, n base offsets
    with 0 for a duplicate, n timestamps, n dedup windows, then a (segment, frame, original
    offset) triple per duplicate frame) as one verdict per segment; anything but exactly that
    shape fails the whole bundle.

    PERF(queen): arrays, not a JSON array of objects: PostgreSQL spent about a fifth of a
    20-segment bundle building the jsonb (push.sql says why), and the shard decoded it again.
    """
    if answer is None or len(answer) < 4 * n or (len(answer) - 4 * n) % 3:
        raise DatabaseError(f"log_push_multi_v3 answered {answer!r} for {n} segments")
    pids, bases, stamps, windows = (answer[0:n], answer[n:2 * n], answer[2 * n:3 * n],
                                    answer[3 * n:4 * n])
    # PERF(queen): every verdict built in C (map over zip), then the rare duplicates replaced
    out = list(map(_TUPLE_NEW, repeat(SegmentVerdict),
                   zip(pids, stamps, repeat(True), bases, windows, repeat(()))))
    if n and min(bases) > 0 and len(answer) == 4 * n:
        return out
    dups: dict[int, list[tuple[int, int]]] = {}
    for j in range(4 * n, len(answer), 3):
        k = answer[j]
        if not 0 <= k < n or bases[k] != 0:
            raise DatabaseError(f"log_push_multi_v3: duplicate frame of segment {k}")
        dups.setdefault(k, []).append((answer[j + 1], answer[j + 2]))
    for k, base in enumerate(bases):
        if base <= 0:
            if base < 0 or k not in dups:
                raise DatabaseError(f"log_push_multi_v3: bad base offset {base} of segment {k}")
            out[k] = _TUPLE_NEW(SegmentVerdict, (pids[k], stamps[k], False, None, windows[k],
                                                 tuple(dups[k])))
    return out


def tenant_uuid(tenant: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=tenant)


async def fetch_rows(conn: psycopg.AsyncConnection[Any], query: str,
                     params: Sequence[Any]) -> list[dict[str, Any]]:
    try:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchall()
    except psycopg.Error as ex:
        raise translate(ex) from ex
