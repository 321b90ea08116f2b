"""``POST /api/v1/ack`` and ``POST /api/v1/ack/batch`` (docs/api.md 2.3, 2.4).

Both answer a top-level array, one element per item in input order. The whole body is checked
before anything is applied (a 400 applies nothing). When some group's commit failed or was
lost the answer is 503 (``timeout`` / ``outcome_unknown``) with the array as ``results``.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db.ack_procs import AckItem
from queen_mp.db.errors import DatabaseError
from queen_mp.front.acks import AckOutcome
from queen_mp.front.worker import FrontWorker
from queen_mp.http.answer import Answer
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import api_error
from queen_mp.http.errors import (
    InvalidRequest,
    OutcomeUnknown,
    Timeout,
    Unavailable,
)
from queen_mp.models.items import decode_ack_items, parse_ack_item

__all__ = ["MAX_BODY", "AckBatchResource", "AckResource"]

MAX_ACKS = 100_000
MAX_BODY = 64 << 20


_COMMIT_ERRORS = frozenset(("timeout", "outcome_unknown", "unavailable"))
_ITEM = b'{"index":%d,"transactionId":"%s","partitionId":"%d",%s'
_TAIL = b'"success":%s,"error":%s,"leaseReleased":%s,"dlq":%s,"noop":%s}'
_JSON_BOOL = {True: b"true", False: b"false"}


def _render(outcomes: list[AckOutcome]) -> bytes | None:
    """The 200 body, byte for byte ``orjson.dumps([o.to_json() for o in outcomes])``; None
    when some item failed with a commit error (the caller answers 503 with the results).

    PERF(ack): no dict per item and one ``orjson.dumps`` for every transactionId at once
    (an item was a dict built and serialised, a third of a 100-ack batch's instructions).
    The ids come back from one dumped list split at ``","``: with no backslash in it, every
    quote is a string's own, so that sequence occurs only between two strings; otherwise
    each id is dumped alone."""
    if not outcomes:
        return b"[]"
    ids = [o.item.transaction_id for o in outcomes]
    dumped = orjson.dumps(ids)
    txns = (dumped[2:-2].split(b'","') if b"\\" not in dumped
            else [orjson.dumps(t)[1:-1] for t in ids])
    tails: dict[tuple[bool, str | None, bool, bool, bool], bytes] = {}
    parts: list[bytes] = []
    append = parts.append
    for o, txn in zip(outcomes, txns, strict=True):
        key = (o.success, o.error, o.lease_released, o.dlq, o.noop)
        tail = tails.get(key)
        if tail is None:
            if o.error in _COMMIT_ERRORS:
                return None
            tail = tails[key] = _TAIL % (
                _JSON_BOOL[o.success], orjson.dumps(o.error), _JSON_BOOL[o.lease_released],
                _JSON_BOOL[o.dlq], _JSON_BOOL[o.noop])
        item = o.item
        append(_ITEM % (item.index, txn, item.partition_id, tail))
    return b"[%s]" % b",".join(parts)


def _load(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as ex:
        raise InvalidRequest(f"malformed JSON body: {ex}") from None


class _AckBase:
    batch = False  # the body is docs/api.md 2.4's object of acknowledgments, not one ack

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        (await self.answer(await read_body(req, MAX_BODY), tenant_of(req))).apply(resp)

    async def answer(self, body: bytes, tenant: bytes) -> Answer:
        """The answer to the ack ``body`` of ``tenant``."""
        items = self.parse(body)
        try:
            outcomes, results = await self.worker.acker.ack(tenant, items)
        except DatabaseError as ex:
            raise api_error(ex) from None
        self.worker.after_acks(tenant, results)
        body = _render(outcomes)
        if body is not None:
            return Answer(200, body)
        body_items = [o.to_json() for o in outcomes]
        failed = {o.error for o in outcomes if o.error in _COMMIT_ERRORS}
        if failed:
            if "outcome_unknown" in failed:
                raise OutcomeUnknown("ack commit lost: outcome unknown; retry the call",
                                     results=body_items)
            if "timeout" in failed:
                raise Timeout("ack timeout: retry the call", results=body_items)
            raise Unavailable("database connection lost during the ack; retry the call",
                              results=body_items)
        return Answer(200, orjson.dumps(body_items))

    def parse(self, body: bytes) -> list[AckItem]:
        """Every item of ``body``, checked before anything is applied."""
        items = decode_ack_items(body, self.batch, MAX_ACKS)
        return items if items is not None else self.items(_load(body))

    def items(self, doc: Any) -> list[AckItem]:
        """The exact reading of a parsed body (``decode_ack_items`` left it to this)."""
        raise NotImplementedError


class AckResource(_AckBase):
    def items(self, doc: Any) -> list[AckItem]:
        return [parse_ack_item(doc, 0, None)]


class AckBatchResource(_AckBase):
    batch = True

    def items(self, doc: Any) -> list[AckItem]:
        if not isinstance(doc, dict):
            raise InvalidRequest("the body must be an object with acknowledgments")
        acks = doc.get("acknowledgments")
        if not isinstance(acks, list):
            raise InvalidRequest("acknowledgments must be an array", field="acknowledgments")
        if len(acks) > MAX_ACKS:
            raise InvalidRequest(f"{len(acks)} acknowledgments, over {MAX_ACKS}",
                                 field="acknowledgments")
        group = doc.get("consumerGroup")
        if group is not None and not isinstance(group, str):
            raise InvalidRequest("consumerGroup must be a string or null",
                                 field="consumerGroup")
        return [parse_ack_item(a, i, group) for i, a in enumerate(acks)]
