"""The message browser (docs/api.md 2.9; 5 for the per-queue form).

==========================================================  ===================================
``GET /api/v1/messages``                                    ``MessagesResource``
``GET /api/v1/status/queues/{queue}/messages``              ``QueueMessagesResource``
``GET /api/v1/messages/{partitionId}/{transactionId}``      ``MessageResource``
==========================================================  ===================================

List filters (both list routes; the queue route takes its queue from the path): ``queue``,
``partition``, ``namespace``, ``task``, ``consumerGroup``, ``status``, ``from``, ``to``,
``fromOffset`` (with ``partition``: browse a partition from an offset; without ``from`` the
window then has no lower time bound), ``limit`` (1..1000, default 200, larger clamped),
``offset``. The single message takes ``consumerGroup``.

Messages live inside stored segments (docs/api.md 3.1-3.2) that SQL cannot decode. The listing
(``msg_list_v1``, sql/functions/messages.sql) finds the segments created in the window, counts the
matching messages of each from the group's cursor, live lease and DLQ rows (offset-range
arithmetic), and returns the total plus only the segments covering ``[offset, offset + limit)``
of the list order (createdAt, partitionId, offset); the broker applies the same status rules
per offset, decodes only the chunks holding the page's messages and slices. So ``total`` and
paging are **exact** (one snapshot), whatever the segment boundaries and the status filter.

Status of a message for the group (``consumerGroup``, default ``__QUEUE_MODE__``):
``dead_letter`` with a DLQ row of (partition, group, offset), else ``completed`` at or below the
cursor, else ``processing`` inside the group's live lease, else ``pending``. The DLQ row wins
over the cursor: dead-lettering moves the cursor past the offset, so the order of the HTTP
contract (``completed`` first), taken literally, would never show ``dead_letter``; docs/api.md 2.9
gives this order. ``leaseExpiresAt`` is the live lease's expiry for a ``processing`` message,
else null. ``from``/``to`` bound ``createdAt`` (both inclusive); no ``from`` = one hour before
``to`` (before now); no ``to`` = up to now.

The single message is found by its transactionId's xxh3_128 in the transactionId sidecar
(``msg_find_v1``: newest occurrence, hash on a 16-byte boundary), its frame decoded and the
transactionId compared (a hash collision moves on to the next older occurrence). The sidecar
lives ``max(dedupWindow, completedRetentionSeconds, 900 s)`` (docs/api.md 4), segments may live
longer: for a message the sidecar no longer covers, the segments below the sidecar's start are
decoded newest first, **bounded** (``FALLBACK_MAX_SEGMENTS`` segments or
``FALLBACK_MAX_MESSAGES`` messages); past the bound the answer is ``404``. ``data`` is decrypted;
an encrypted payload that cannot be decrypted (no key, or not the key that encrypted it) is
``data: null`` with ``encrypted: true``. A ``read-only`` caller is not given an encrypted
payload at all (``authz.reads_encrypted``): ``data: null``, ``encrypted: true`` and
``dataWithheld: true``, a key no other answer carries, so a plain message's answer is the same
for every role. ``status``, ``leaseExpiresAt``, ``errorMessage`` and
``retryCount`` are ``consumerGroup``'s (default queue mode): the DLQ row's error and retry count,
else no error and the failed acks charged to the message when it is its group's head.
``consumerGroups`` lists every group with a cursor on the partition or a DLQ row at the offset.

The single-message template is shared with the DLQ delete (falcon takes one resource per
template): ``MessageResource`` here extends ``queen_mp.http.dlq.MessageResource`` with ``on_get``
and the app registers it in its place.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.crypto import PayloadCipher
from queen_mp.db import message_procs
from queen_mp.db.message_procs import Found, GroupState, PageSegment, Segment
from queen_mp.front.delivery import Claim, Delivered, unpack_messages
from queen_mp.front.worker import FrontWorker
from queen_mp.http import dlq
from queen_mp.http.authz import reads_encrypted, tenant_of
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import JSON_UTF8, Internal, InvalidRequest, NotFound
from queen_mp.http.query import Query
from queen_mp.models.items import parse_group, path_partition_id, path_transaction_id
from queen_mp.wire.binary_push import check_name
from queen_mp.wire.errors import WireError
from queen_mp.wire.frames import Frame, decode_chunk, iter_chunks, iter_frames
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid_text
from queen_mp.wire.times import iso_ms

__all__ = ["MessageResource", "MessagesResource", "QueueMessagesResource"]

log = logging.getLogger("queen_mp.http.messages")

DEFAULT_LIMIT = 200
MAX_LIMIT = 1000
# NOTE(messages): offset + limit must stay an int8 in SQL; no list is anywhere near this long.
MAX_OFFSET = 1 << 62
STATUSES = ("pending", "processing", "completed", "dead_letter")
#: hash collisions tolerated before giving up on the sidecar (2^-128 each: never in practice)
MAX_COLLISIONS = 8
#: the fallback below the sidecar's start: segments fetched per query, and its bounds
FALLBACK_PAGE = 32
FALLBACK_MAX_SEGMENTS = 256
FALLBACK_MAX_MESSAGES = 100_000


# --------------------------------------------------------------------------------- helpers
def _status_of(offset: int, committed: int, lease_start: int | None, lease_end: int | None,
               dead: bool) -> str:
    """docs/api.md 2.9 for one offset and one group (sql/functions/messages.sql header)."""
    if dead:
        return "dead_letter"
    if offset <= committed:
        return "completed"
    if lease_start is not None and lease_end is not None and lease_start <= offset <= lease_end:
        return "processing"
    return "pending"


@dataclass(frozen=True, slots=True)
class _Filters:
    queue: str | None
    partition: str | None
    namespace: str | None
    task: str | None
    group: str
    status: str | None
    since: dt.datetime | None
    until: dt.datetime | None
    limit: int
    offset: int
    from_offset: int | None  # only offsets >= it (one partition's, ``partition`` required)


def _filters(req: falcon.asgi.Request, queue: str | None = None) -> _Filters:
    q = Query(req.query_string)
    if queue is None:
        queue = q.name("queue")
    status = q.text("status") or None
    if status is not None and status not in STATUSES:
        raise InvalidRequest(f"status={status!r}: one of {', '.join(STATUSES)}", field="status")
    since, until = q.time("from"), q.time("to")
    if since is not None and until is not None and since > until:
        raise InvalidRequest("'from' must not be after 'to'", field="from")
    partition = q.name("partition", slash_ok=True)
    from_offset = None
    if "fromOffset" in q:
        from_offset = q.integer("fromOffset", 1, minimum=1, maximum=MAX_OFFSET)
        if partition is None:
            raise InvalidRequest("fromOffset needs a partition: offsets are per partition",
                                 field="fromOffset")
    return _Filters(
        queue=queue, partition=partition, from_offset=from_offset,
        namespace=q.name("namespace", slash_ok=True), task=q.name("task", slash_ok=True),
        group=parse_group(q.text("consumerGroup")), status=status, since=since, until=until,
        limit=q.integer("limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT),
        offset=q.integer("offset", 0, minimum=0, maximum=MAX_OFFSET))


# ------------------------------------------------------------------------------- the listing
def _runs(seg: PageSegment, status: str | None,
          from_offset: int | None) -> tuple[list[tuple[int, int]], tuple[int, ...]]:
    """The offsets of ``seg`` matching ``status`` (from ``from_offset`` on, when given):
    inclusive ranges, minus the excluded set."""
    first = max(seg.base_offset, from_offset or 0)
    last = seg.base_offset + seg.msg_count - 1
    dead = tuple(o for o in seg.dlq_offsets if o >= first)
    if status is None:
        return [(first, last)], ()
    if status == "dead_letter":
        return [(o, o) for o in dead], ()
    low = max(first, seg.committed + 1)  # first offset above the cursor
    if seg.lease_start is not None and seg.lease_end is not None:
        p_lo, p_hi = max(low, seg.lease_start), min(last, seg.lease_end)
    else:
        p_lo, p_hi = low, low - 1  # empty
    if status == "completed":
        return [(first, min(last, seg.committed))], dead
    if status == "processing":
        return [(p_lo, p_hi)], dead
    if p_lo > p_hi:  # pending, no processing range inside
        return [(low, last)], dead
    return [(low, p_lo - 1), (p_hi + 1, last)], dead


def _select(runs: list[tuple[int, int]], excluded: Iterable[int], start: int,
            stop: int) -> tuple[int, list[int]]:
    """(how many offsets the runs hold minus ``excluded``, those numbered [start, stop))."""
    skip = sorted(set(excluded))
    count = 0
    out: list[int] = []
    for lo, hi in runs:
        at = lo
        for gap in [d for d in skip if lo <= d <= hi] + [hi + 1]:
            length = gap - at
            if length > 0:
                if count + length > start and count < stop:
                    a, b = max(start - count, 0), min(stop - count, length)
                    out.extend(range(at + a, at + b))
                count += length
            at = gap + 1
    return count, out


def _frames_at(seg: PageSegment, offsets: list[int], max_chunk: int) -> dict[int, Frame]:
    """The frames of ``offsets`` (ascending, inside ``seg``), decoding only their chunks."""
    out: dict[int, Frame] = {}
    want = iter(offsets)
    nxt = next(want, None)
    at = seg.base_offset
    for chunk in iter_chunks(seg.payload):
        end = at + chunk.count
        if nxt is not None and nxt < end:
            frames = decode_chunk(chunk.codec, chunk.data, max_size=max_chunk)
            for k, frame in enumerate(iter_frames(frames), start=at):
                if k == nxt:
                    out[k] = frame
                    nxt = next(want, None)
                    if nxt is None or nxt >= end:
                        break
        at = end
        if nxt is None:
            break
    return out


def _page_messages(page: message_procs.ListPage, f: _Filters,
                   max_chunk: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for seg in page.segments:
        runs, excluded = _runs(seg, f.status, f.from_offset)
        count, offsets = _select(runs, excluded, max(0, f.offset - seg.skip),
                                 f.offset + f.limit - seg.skip)
        if count != seg.matched:
            # NOTE(messages): the SQL and this module apply the same rules to one snapshot; a
            # difference is a bug, and a page built on it would be silently wrong.
            raise Internal(f"segment {seg.partition_id}/{seg.base_offset}: {count} matching "
                           f"messages here, {seg.matched} in SQL")
        try:
            frames = _frames_at(seg, offsets, max_chunk)
        except WireError as ex:
            raise Internal(f"stored segment {seg.partition_id}/{seg.base_offset} does not "
                           f"decode: {ex}") from None
        dead = set(seg.dlq_offsets)
        created = iso_ms(seg.created_at)
        pid = str(seg.partition_id)
        for off in offsets:
            frame = frames.get(off)
            if frame is None:
                raise Internal(f"stored segment {seg.partition_id}/{seg.base_offset} holds no "
                               f"frame for offset {off}")
            status = _status_of(off, seg.committed, seg.lease_start, seg.lease_end,
                                off in dead)
            messages.append({
                "id": uuid_text(frame.message_id), "transactionId": frame.transaction_id,
                "partitionId": pid, "queue": seg.queue, "partition": seg.partition,
                "namespace": seg.namespace, "task": seg.task, "offset": off,
                "status": status,
                "traceId": uuid_text(frame.trace_id) if frame.trace_id else None,
                "producerSub": frame.producer_sub, "createdAt": created,
                "leaseExpiresAt": (iso_ms(seg.lease_expires_at) if status == "processing"
                                   else None)})
    return messages


class _Listing:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def _answer(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      f: _Filters, *, queue_route: bool) -> None:
        tenant = tenant_of(req)
        page = await call_db(self.worker.pool, lambda conn: message_procs.list_page(
            conn, tenant, queue=f.queue, partition=f.partition, namespace=f.namespace,
            task=f.task, group=f.group, status=f.status, since=f.since, until=f.until,
            limit=f.limit, offset=f.offset, from_offset=f.from_offset))
        if page is None:
            if queue_route:
                raise NotFound(f"queue {f.queue!r} does not exist", field="queue")
            page = message_procs.ListPage(0, [])
        messages = _page_messages(page, f, self.worker.config.max_decompressed_mb << 20)
        resp.data = orjson.dumps({"messages": messages, "total": page.total,
                                  "pagination": {"limit": f.limit, "offset": f.offset}})
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200


class MessagesResource(_Listing):
    """``GET /api/v1/messages``: the list without payloads (docs/api.md 2.9)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await self._answer(req, resp, _filters(req), queue_route=False)


class QueueMessagesResource(_Listing):
    """``GET /api/v1/status/queues/{queue}/messages``: the same list for one queue (docs/api.md 5);
    ``404`` when the queue does not exist. A ``queue`` query parameter is ignored."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str) -> None:
        check_name(queue, "queue")
        await self._answer(req, resp, _filters(req, queue), queue_route=True)


# ------------------------------------------------------------------------ the single message
@dataclass(frozen=True, slots=True)
class _Hit:
    found: Found
    message: Delivered
    groups: list[GroupState]


def _claim(found: Found, pid: int, segment: Segment, start: int, end: int) -> Claim:
    return Claim(found.queue, pid, found.partition, start, end, 0, None, False,
                 [(segment.base_offset, segment.created_at, segment.payload)])


def _decode(claim: Claim, max_chunk: int) -> list[Delivered]:
    try:
        return list(unpack_messages(claim, None, max_chunk, decrypt=False))
    except WireError as ex:
        raise Internal(f"stored segment {claim.partition_id}/{claim.segments[0][0]} does not "
                       f"decode: {ex}") from None


async def _lookup(conn: Any, tenant: bytes, pid: int, txn: str, max_chunk: int) -> _Hit | None:
    """The newest occurrence of ``txn`` in partition ``pid``, in one snapshot; None = absent."""
    digest = txn_hash(txn)
    async with message_procs.snapshot(conn):
        found = await message_procs.find(conn, tenant, pid, digest)
        if found is None:
            return None
        head = found
        message: Delivered | None = None
        # 1. the sidecar, newest first; a decoded frame with another transactionId is a hash
        #    collision: look below it
        at: Found | None = found
        for _ in range(MAX_COLLISIONS):
            if at is None or at.offset is None or at.segment is None:
                break
            got = _decode(_claim(at, pid, at.segment, at.offset, at.offset), max_chunk)
            if len(got) != 1:
                raise Internal(f"stored segment {pid}/{at.segment.base_offset} holds no frame "
                               f"for offset {at.offset}")
            if got[0].transaction_id == txn:
                message = got[0]
                break
            at = await message_procs.find(conn, tenant, pid, digest, at.offset)
        # 2. below the sidecar's start: decode segments newest first, bounded
        if message is None and head.log_start_offset < head.txns_start:
            below, segments, scanned = head.txns_start, 0, 0
            while message is None and segments < FALLBACK_MAX_SEGMENTS \
                    and scanned < FALLBACK_MAX_MESSAGES:
                batch = await message_procs.segments_below(conn, tenant, pid, below,
                                                           FALLBACK_PAGE)
                if not batch:
                    break
                for seg in batch:
                    last = seg.base_offset + seg.msg_count - 1
                    hits = [m for m in _decode(_claim(head, pid, seg, seg.base_offset, last),
                                               max_chunk) if m.transaction_id == txn]
                    segments, scanned = segments + 1, scanned + seg.msg_count
                    below = seg.base_offset
                    if hits:
                        message = hits[-1]
                        break
                    if segments >= FALLBACK_MAX_SEGMENTS or scanned >= FALLBACK_MAX_MESSAGES:
                        log.info("message lookup %d/%r: not in the sidecar nor in the %d "
                                 "newest segments below it (%d messages); answering 404",
                                 pid, txn, segments, scanned)
                        break
        if message is None:
            return None
        groups = await message_procs.groups(conn, tenant, pid, message.offset)
    return _Hit(head, message, groups)


def _data(m: Delivered, cipher: PayloadCipher | None) -> orjson.Fragment | None:
    """The payload spliced verbatim (stored payloads are JSON text); decrypted when it can be."""
    payload = m.payload
    if m.encrypted:
        if cipher is None:
            log.warning("message at %d/%d is encrypted and this broker has no key",
                        m.claim.partition_id, m.offset)
            return None
        try:
            payload = cipher.decrypt(payload)
        except Exception as ex:
            log.warning("message at %d/%d does not decrypt: %r", m.claim.partition_id,
                        m.offset, ex)
            return None
    return orjson.Fragment(payload) if payload else None


def _group_status(g: GroupState | None, offset: int) -> tuple[str, dt.datetime | None]:
    if g is None:
        return "pending", None
    status = _status_of(offset, g.committed, g.lease_start, g.lease_end, g.dead)
    return status, (g.lease_expires_at if status == "processing" else None)


class MessageResource(dlq.MessageResource):
    """``GET /api/v1/messages/{partitionId}/{transactionId}?consumerGroup=``: one message with
    its payload and every group's view (docs/api.md 2.9); ``DELETE`` is the DLQ delete (2.8)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     partition_id: str, transaction_id: str) -> None:
        pid = path_partition_id(partition_id)
        txn = path_transaction_id(transaction_id)
        group = parse_group(Query(req.query_string).text("consumerGroup"))
        tenant = tenant_of(req)
        max_chunk = self.worker.config.max_decompressed_mb << 20
        hit = await call_db(self.worker.pool,
                            lambda conn: _lookup(conn, tenant, pid, txn, max_chunk))
        if hit is None:
            raise NotFound(f"partition {pid}, transactionId {txn!r}: no such message",
                           field="transactionId")
        m, found = hit.message, hit.found
        mine = next((g for g in hit.groups if g.name == group), None)
        status, expires = _group_status(mine, m.offset)
        if mine is not None and mine.dead:
            error, retries = mine.error, mine.retry_count or 0
        else:
            error, retries = None, mine.head_retry_count if mine is not None else 0
        groups = []
        for g in hit.groups:
            g_status, g_expires = _group_status(g, m.offset)
            groups.append({"name": g.name, "status": g_status,
                           "leaseExpiresAt": iso_ms(g_expires)})
        withheld = m.encrypted and not reads_encrypted(req)
        body: dict[str, Any] = {
            "id": uuid_text(m.message_id), "transactionId": m.transaction_id,
            "partitionId": str(pid), "queue": found.queue, "partition": found.partition,
            "namespace": found.namespace, "task": found.task, "offset": m.offset,
            "status": status, "traceId": uuid_text(m.trace_id) if m.trace_id else None,
            "producerSub": m.producer_sub, "createdAt": iso_ms(m.created_at),
            "leaseExpiresAt": iso_ms(expires),
            "data": None if withheld else _data(m, self.worker.cipher),
            "encrypted": m.encrypted, "errorMessage": error, "retryCount": retries,
            "consumerGroups": groups}
        if withheld:
            body["dataWithheld"] = True
        resp.data = orjson.dumps(body)
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200
