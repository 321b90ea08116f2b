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
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import dict_row

from queen_mp.db.errors import DatabaseError, translate

__all__ = ["PUSH_MULTI", "Segment", "SegmentVerdict", "fetch_rows", "segment_verdicts",
           "tenant_uuid"]

# PERF(queen): arrays go in binary (%b): psycopg's text form hex-escapes every bytea element
# and runs a quoting regex over the result, 47 ms per MB of segment blobs against 0.9 ms.
PUSH_MULTI = ("SELECT queen.log_push_multi_v1(%b::text[], %b::text[], %b::int4[], %b::bytea[],"
              " %b::int8[], %b::bytea[], %b::uuid[])")


@dataclass(frozen=True, slots=True)
class Segment:
    """One stored segment: a row of ``log_segments`` as ``log_segment_at_v1`` (and the message
    reads) answer it."""

    base_offset: int
    msg_count: int
    created_at: dt.datetime
    payload: bytes


class SegmentVerdict(NamedTuple):
    """What ``log_push_multi_v1`` answered for one segment (= one partition) of a bundle.

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


def segment_verdicts(answer: Any, n: int) -> list[SegmentVerdict]:
    """``log_push_multi_v1``'s answer (a jsonb array of one object per segment, keys ``i``
    input ordinal, ``pid``, ``ts``, ``s`` status, ``base``, ``w``, ``dups``) by input ordinal;
    anything but exactly one well-formed verdict per ordinal fails the whole bundle."""
    if not isinstance(answer, list) or len(answer) != n:
        raise DatabaseError(f"log_push_multi_v1 answered {answer!r} for {n} segments")
    out: list[SegmentVerdict | None] = [None] * n
    try:
        for r in answer:
            i = r["i"]
            if not 0 <= i < n or out[i] is not None:
                raise DatabaseError(f"log_push_multi_v1: bad ordinal {i}")
            status = r["s"]
            if status == "queued":
                out[i] = _TUPLE_NEW(SegmentVerdict, (r["pid"], r["ts"], True, r["base"],
                                                     r.get("w") or 0, ()))
            elif status == "duplicate":
                dups = tuple((int(d["i"]), int(d["off"])) for d in r.get("dups") or ())
                out[i] = _TUPLE_NEW(SegmentVerdict, (r["pid"], r["ts"], False, None,
                                                     r.get("w") or 0, dups))
            else:
                raise DatabaseError(f"log_push_multi_v1: unknown status {status!r}")
    except (KeyError, TypeError, ValueError) as ex:
        raise DatabaseError(f"log_push_multi_v1: malformed verdict ({ex!r})") from ex
    return out  # type: ignore[return-value]  # n ordinals, each once: no None is left


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
