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

from queen_mp.db.ack_procs import AckBatch, AckItem
from queen_mp.db.errors import DatabaseError
from queen_mp.front.acks import Verdict
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
from queen_mp.models.items import decode_ack_batch, parse_ack_item

__all__ = ["MAX_BODY", "AckBatchResource", "AckResource", "render_acks"]

MAX_ACKS = 100_000
MAX_BODY = 64 << 20


_COMMIT_ERRORS = frozenset(("timeout", "outcome_unknown", "unavailable"))
_TAIL = b'"success":%s,"error":%s,"leaseReleased":%s,"dlq":%s,"noop":%s}'
_JSON_BOOL = {True: b"true", False: b"false"}
#: each item's JSON up to its transactionId's text, by index (the first opens the array),
#: made once per index up to ``_HEADS_KEPT`` (NOTE(memory): 10,000 of them are about 0.7 MB)
_HEADS: list[bytes] = []
_HEADS_KEPT = 10_000


def _heads(n: int) -> list[bytes]:
    """The heads of items ``0 .. n-1`` (``_HEADS``, grown as far as it is kept)."""
    have = len(_HEADS)
    if n <= have:
        return _HEADS[:n]
    made = [b'%s{"index":%d,"transactionId":"' % (b"," if i else b"[", i)
            for i in range(have, n)]
    heads = _HEADS + made
    _HEADS.extend(made[:_HEADS_KEPT - have])
    return heads


def _item_json(batch: AckBatch, index: int, verdict: Verdict) -> dict[str, Any]:
    success, error, released, dlq, noop = verdict
    return {"index": index, "transactionId": batch.transaction_ids[index],
            "partitionId": str(batch.partition_ids[index]), "success": success,
            "error": error, "leaseReleased": released, "dlq": dlq, "noop": noop}


def _tail(pid: int, verdict: Verdict) -> bytes:
    """An item's JSON after its transactionId: its partitionId and its verdict."""
    success, error, released, dlq, noop = verdict
    return b'","partitionId":"%d",' % pid + _TAIL % (
        _JSON_BOOL[success], orjson.dumps(error), _JSON_BOOL[released], _JSON_BOOL[dlq],
        _JSON_BOOL[noop])


def render_acks(batch: AckBatch, verdicts: list[Verdict]) -> bytes | None:
    """The 200 body, byte for byte ``orjson.dumps`` of each item's ``_item_json``; None when
    some item failed with a commit error (the caller answers 503 with the results).

    PERF(ack): by columns: three pieces per item (its head up to the transactionId, made
    once per index and kept; the id; the rest), the transactionIds dumped by one
    ``orjson.dumps`` of their list and split, each distinct (partition, verdict) rendered
    once, the pieces laid out by slice assignments and joined once: no interpreter step per
    item (a 100-item answer 175k -> 70k instructions against six pieces an item with the
    indexes dumped each time, callgrind). The ids' dumped list splits at ``","`` when it
    holds no backslash (every quote is then a string's own, so that sequence occurs only
    between two strings); otherwise each id is dumped alone."""
    n = len(verdicts)
    if not n:
        return b"[]"
    ids = batch.transaction_ids
    dumped = orjson.dumps(ids)
    txns = (dumped[2:-2].split(b'","') if b"\\" not in dumped
            else [orjson.dumps(t)[1:-1] for t in ids])
    pids = batch.partition_ids
    if pids.count(pids[0]) == n and verdicts.count(verdicts[0]) == n:
        if verdicts[0][1] in _COMMIT_ERRORS:
            return None
        parts = [_tail(pids[0], verdicts[0])] * (3 * n)
    else:
        keys = list(zip(pids, verdicts, strict=True))
        rendered = {k: _tail(*k) for k in set(keys)}
        if any(v[1] in _COMMIT_ERRORS for _, v in rendered):
            return None
        parts = [b""] * (3 * n)
        parts[2::3] = map(rendered.__getitem__, keys)
    parts[::3] = _heads(n)
    parts[1::3] = txns
    parts.append(b"]")
    return b"".join(parts)


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
        batch = self.parse(body)
        try:
            verdicts, results = await self.worker.acker.ack(tenant, batch)
        except DatabaseError as ex:
            raise api_error(ex) from None
        self.worker.after_acks(tenant, results)
        body = render_acks(batch, verdicts)
        if body is not None:
            return Answer(200, body)
        body_items = [_item_json(batch, i, v) for i, v in enumerate(verdicts)]
        failed = {v[1] for v in verdicts if v[1] in _COMMIT_ERRORS}
        if failed:
            if "outcome_unknown" in failed:
                raise OutcomeUnknown("ack commit lost: outcome unknown; retry the call",
                                     results=body_items)
            if "timeout" in failed:
                raise Timeout("ack timeout: retry the call", results=body_items)
            raise Unavailable("database connection lost during the ack; retry the call",
                              results=body_items)
        return Answer(200, orjson.dumps(body_items))

    def parse(self, body: bytes) -> AckBatch:
        """Every item of ``body``, checked before anything is applied."""
        batch = decode_ack_batch(body, self.batch, MAX_ACKS)
        return batch if batch is not None else AckBatch.of(self.items(_load(body)))

    def items(self, doc: Any) -> list[AckItem]:
        """The exact reading of a parsed body (``decode_ack_batch`` left it to this)."""
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
