"""``POST /api/v1/fetch`` (docs/api.md 2.15): leaseless, cursorless reads by offset.

The body is checked whole first (``queen_mp.models.reads.parse_fetch``); one statement
(``log_fetch_v1``, sql/functions/reads.sql) then reads every entry's bounds and the stored
segments covering its records, in one snapshot; the frames are decoded here, payloads decrypted
as pops decrypt them (``queen_mp.front.delivery``). No lease, cursor or claim is touched: two
readers of the same offsets get the same records, and no consumer group notices them.

Answer ``200 {"entries": [...]}``, one per request entry in request order::

    {"queue", "partition", "highWatermark", "logStartOffset", "error"?,
     "records": [{"offset", "transactionId", "payload", "ts"}]}

``highWatermark`` is the next offset the partition will assign (last offset + 1) and
``logStartOffset`` the oldest one retention kept, whether or not records came back. Records run
from the asked offset (0 reads as 1, the first offset) in offset order, contiguous, while the
entry's payload bytes stay within its ``maxBytes``, the call's within the top-level ``maxBytes``
and the entry's records within ``MAX_RECORDS``; the first record of the whole call is always
sent, so a record larger than every budget cannot stall a reader. A payload counts its JSON
bytes, at least 1. ``ts`` is the createdAt of the push that stored the record.

``error``: ``OFFSET_OUT_OF_RANGE`` (the offset is below ``logStartOffset``, retention passed
it, or above ``highWatermark``) and ``UNKNOWN_TOPIC_OR_PARTITION`` (no such queue for this
tenant); such an entry has no records. A partition never written of an existing queue reads as
an empty log (bounds 1, 1). Errors of the whole call: ``400`` (a malformed body, more than
1,024 entries, a negative offset...), ``413`` (a name or the body over its limit), ``503`` (the
database, or a stored payload that cannot be decrypted, as for a pop).
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import read_procs
from queen_mp.front.delivery import Claim, Undeliverable, unpack_messages
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import JSON_UTF8, Internal, Unavailable
from queen_mp.models.reads import FetchEntry, parse_fetch
from queen_mp.wire.errors import WireError
from queen_mp.wire.times import iso_ms

__all__ = ["MAX_RECORDS", "FetchResource"]

#: Records of one entry in one answer at most (upstream's bound too): a reader pages on.
MAX_RECORDS = 10_000


class _Budget:
    """The call's payload bytes left, and whether a record was sent yet (the first always is)."""

    __slots__ = ("left", "sent")

    def __init__(self, total: int) -> None:
        self.left = total
        self.sent = False


def _records(entry: FetchEntry, got: read_procs.FetchedEntry, budget: _Budget, cipher: Any,
             max_chunk: int) -> list[dict[str, Any]]:
    """The entry's records within its bounds, decoded (and decrypted) from its segments."""
    if got.error is not None or not got.segments:
        return []
    start = max(entry.offset, 1)
    claim = Claim(entry.queue, 0, entry.partition, start, got.high - 1, 0, None, False,
                  got.segments)
    out: list[dict[str, Any]] = []
    used = 0
    try:
        for m in unpack_messages(claim, cipher, max_chunk):
            size = max(len(m.payload), 1)
            if budget.sent and (used + size > entry.max_bytes or size > budget.left
                                or len(out) >= MAX_RECORDS):
                break
            out.append({"offset": m.offset, "transactionId": m.transaction_id,
                        "payload": orjson.Fragment(m.payload) if m.payload else None,
                        "ts": iso_ms(m.created_at)})
            used += size
            budget.left -= size
            budget.sent = True
    except Undeliverable as ex:
        raise Unavailable(f"cannot deliver: {ex}") from None
    except WireError as ex:
        raise Internal(f"stored segment of {entry.queue}/{entry.partition} does not decode: "
                       f"{ex}") from None
    return out


class FetchResource:
    """``POST /api/v1/fetch``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        worker = self.worker
        plan = parse_fetch(await read_body(req, worker.config.max_body_mb << 20))
        entries = plan.entries
        tenant = tenant_of(req)
        fetched: list[read_procs.FetchedEntry] = []
        if entries:
            fetched = await call_db(worker.pool, lambda conn: read_procs.fetch(
                conn, tenant, [e.queue for e in entries], [e.partition for e in entries],
                [e.offset for e in entries], [e.max_bytes for e in entries], plan.max_bytes,
                MAX_RECORDS))
        budget = _Budget(plan.max_bytes)
        max_chunk = worker.config.max_decompressed_mb << 20
        answer = []
        for entry, got in zip(entries, fetched, strict=True):
            one: dict[str, Any] = {"queue": entry.queue, "partition": entry.partition,
                                   "highWatermark": got.high, "logStartOffset": got.log_start}
            if got.error is not None:
                one["error"] = got.error
            one["records"] = _records(entry, got, budget, worker.cipher, max_chunk)
            answer.append(one)
        resp.data = orjson.dumps({"entries": answer})
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200
