"""Bodies of the read routes (docs/api.md 2.15): ``POST /api/v1/fetch`` and
``POST /api/v1/partitions/changed``, checked whole before anything is read, into frozen records.

Fetch: ``{"entries": [{"queue", "partition"?, "offset", "maxBytes"?}], "maxBytes"?}``.

- ``entries``: an array of at most ``MAX_FETCH_ENTRIES`` (1,024) entries (more: ``400`` naming
  the limit); ``[]`` reads nothing.
- ``queue``: a queue name (1.7 rules: ``400 invalid_name``, ``413 name_too_long``);
  ``partition``: a partition name, default ``Default``; a JSON integer is read as its decimal
  name (``3`` = ``"3"``), as upstream reads it.
- ``offset``: an integer >= 0 (the first message of a partition is offset 1; 0 reads from the
  log start). Negative offsets (Kafka's "latest"/"earliest" sentinels) are refused: the bounds
  of every answer say where a partition starts and ends.
- ``maxBytes`` (per entry, and the top-level one for the whole call): an integer >= 1, default
  ``DEFAULT_MAX_BYTES``; larger than ``MAX_ENTRY_BYTES`` / ``MAX_CALL_BYTES`` is clamped, as pop
  ``batch`` is (1.7): a reader asking for more gets what is served and pages on.

Partitions changed: ``{"entries": [{"queue", "limit"?, "since"?, "after"?}]}``.

- ``entries``: at most ``MAX_CHANGED_ENTRIES`` (64): an entry is a whole queue, each up to 1,000
  partitions a page.
- ``limit``: an integer >= 1, default 1,000, larger clamped to 1,000.
- ``since``: an ISO-8601 time with a zone (1.3), or null / absent for every partition.
- ``after``: the ``next`` cursor of an earlier page, as it was answered (a decimal string; null,
  absent or ``""`` = the first page); anything else is refused.

A JSON ``null`` in an optional field reads as not given. Unknown keys are ignored (1.2).
"""

from __future__ import annotations

import datetime as dt
import reprlib
from dataclasses import dataclass
from typing import Any

from queen_mp.models.errors import InvalidRequest
from queen_mp.models.items import DEFAULT_PARTITION, loads_json
from queen_mp.wire.binary_push import check_partition_name, check_queue_name
from queen_mp.wire.times import parse_iso

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_CALL_BYTES",
    "MAX_CHANGED_ENTRIES",
    "MAX_CHANGED_LIMIT",
    "MAX_ENTRY_BYTES",
    "MAX_FETCH_ENTRIES",
    "ChangedEntry",
    "FetchEntry",
    "FetchPlan",
    "parse_changed",
    "parse_fetch",
]

MAX_FETCH_ENTRIES = 1024
DEFAULT_MAX_BYTES = 1 << 20  # 1 MiB, upstream's per-entry default
MAX_ENTRY_BYTES = 8 << 20  # 8 MiB, the most one entry reads (the 2.6 client's default ask)
MAX_CALL_BYTES = 64 << 20  # 64 MiB, the most one call reads
MAX_CHANGED_ENTRIES = 64
MAX_CHANGED_LIMIT = 1000
_INT64 = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class FetchEntry:
    """One partition to read from ``offset`` on, at most ``max_bytes`` of payload."""

    queue: str
    partition: str
    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """A checked fetch body: its entries in request order and the call's byte ceiling."""

    entries: tuple[FetchEntry, ...]
    max_bytes: int


@dataclass(frozen=True, slots=True)
class ChangedEntry:
    """One queue's page of partitions: all, or those written at or after ``since``."""

    queue: str
    limit: int
    since: dt.datetime | None
    after: int | None


def _object(body: bytes) -> dict[str, Any]:
    try:
        doc = loads_json(body)
    except ValueError as ex:
        raise InvalidRequest(f"malformed JSON body: {ex}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    return doc


def _entries(doc: dict[str, Any], limit: int) -> list[Any]:
    entries = doc.get("entries")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise InvalidRequest("'entries' must be an array", field="entries")
    if len(entries) > limit:
        raise InvalidRequest(f"{len(entries)} entries, over the limit of {limit} per call",
                             field="entries", limit=limit)
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise InvalidRequest(f"entry {i} must be a JSON object", field="entries", index=i)
    return entries


def _integer(value: Any, field: str, index: int | None, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _INT64:
        where = f"entry {index}: " if index is not None else ""
        raise InvalidRequest(f"{where}'{field}' must be an integer >= {minimum}, "
                             f"got {reprlib.repr(value)}",
                             field=field, index=index)
    return value


def _queue(e: dict[str, Any], i: int) -> str:
    queue = e.get("queue")
    if not isinstance(queue, str):
        raise InvalidRequest(f"entry {i}: 'queue' must be a string", field="queue", index=i)
    check_queue_name(queue, index=i)
    return queue


def _max_bytes(value: Any, field: str, index: int | None, ceiling: int) -> int:
    if value is None:
        return min(DEFAULT_MAX_BYTES, ceiling) if index is not None else ceiling
    return min(_integer(value, field, index, 1), ceiling)


def parse_fetch(body: bytes) -> FetchPlan:
    """The fetch body checked whole (module docstring); the first fault is refused."""
    doc = _object(body)
    raw = _entries(doc, MAX_FETCH_ENTRIES)
    call_bytes = _max_bytes(doc.get("maxBytes"), "maxBytes", None, MAX_CALL_BYTES)
    out: list[FetchEntry] = []
    for i, e in enumerate(raw):
        queue = _queue(e, i)
        partition = e.get("partition")
        if partition is None:
            partition = DEFAULT_PARTITION
        elif isinstance(partition, int) and not isinstance(partition, bool):
            partition = str(partition)
        elif not isinstance(partition, str):
            raise InvalidRequest(f"entry {i}: 'partition' must be a string",
                                 field="partition", index=i)
        check_partition_name(partition, index=i)
        if "offset" not in e or e["offset"] is None:
            raise InvalidRequest(f"entry {i}: 'offset' is required", field="offset", index=i)
        offset = _integer(e["offset"], "offset", i, 0)
        out.append(FetchEntry(queue, partition, offset,
                              _max_bytes(e.get("maxBytes"), "maxBytes", i, MAX_ENTRY_BYTES)))
    return FetchPlan(tuple(out), call_bytes)


def parse_changed(body: bytes) -> tuple[ChangedEntry, ...]:
    """The partitions/changed body checked whole (module docstring)."""
    doc = _object(body)
    out: list[ChangedEntry] = []
    for i, e in enumerate(_entries(doc, MAX_CHANGED_ENTRIES)):
        queue = _queue(e, i)
        limit = e.get("limit")
        limit = MAX_CHANGED_LIMIT if limit is None else min(
            _integer(limit, "limit", i, 1), MAX_CHANGED_LIMIT)
        since = e.get("since")
        if since is not None:
            if not isinstance(since, str):
                raise InvalidRequest(f"entry {i}: 'since' must be an ISO-8601 time",
                                     field="since", index=i)
            try:
                since = parse_iso(since)
            except ValueError as ex:
                raise InvalidRequest(f"entry {i}: 'since' is not a time: {ex}",
                                     field="since", index=i) from None
        after = e.get("after")
        if after is None or after == "":
            after = None
        elif isinstance(after, str) and after.isascii() and after.isdigit() and len(after) <= 18:
            after = int(after)
        else:
            raise InvalidRequest(f"entry {i}: 'after' must be the 'next' of an earlier answer, "
                                 f"got {reprlib.repr(after)}", field="after", index=i)
        out.append(ChangedEntry(queue, limit, since, after))
    return tuple(out)
