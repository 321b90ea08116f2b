"""The edge arm: what queen-mp's HTTP stack alone allows, with no broker behind it.

A falcon ASGI app served exactly like queen-mp's front and the naive broker (gunicorn with
``queen_mp.processes.arbiter.front_argv``: same worker class, worker count, keep-alive and
timeouts). It does the JSON work every broker on this stack must do for a request and nothing
else: no database, no shared memory, no durability.

- ``POST /api/v1/push`` parses queen's JSON body and answers ``201`` with one result per item,
  in the shape queen-mp renders (ids from a per-process counter);
- ``GET /api/v1/pop/queue/{queue}`` answers ``batch`` synthetic messages in queen-mp's pop shape
  (the benchmark's 200-byte payload, a fresh transactionId each): the queue never runs dry;
- ``POST /api/v1/ack/batch`` parses the acknowledgments and answers one success per item.

Its throughput is a ceiling, not a competitor: a target a ratio to another arm can reach only if
this arm reaches it, since the broker does all of this plus the work that makes it a broker.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
from typing import Any

import falcon
import falcon.asgi
import orjson

from bench.loadgen import payload

__all__ = ["app_from_env", "create_app"]

_JSON = "application/json; charset=UTF-8"
_PAYLOAD = orjson.Fragment(payload(b"edge", 0))


def _now() -> str:
    t = dt.datetime.now(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as ex:
        raise falcon.HTTPBadRequest(description=f"body is not valid JSON: {ex}") from None


class Health:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data = orjson.dumps({"status": "healthy", "pid": os.getpid()})
        resp.content_type = _JSON


class Push:
    def __init__(self, ids: itertools.count[int]) -> None:
        self.ids = ids

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        doc = _body(await req.stream.read())
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise falcon.HTTPBadRequest(description="body must be an object with 'items'")
        created, out = _now(), []
        for i, it in enumerate(items):
            if not isinstance(it, dict) or not isinstance(it.get("queue"), str):
                raise falcon.HTTPBadRequest(description=f"item {i}: 'queue' must be a string")
            n = next(self.ids)
            mid, txn = f"{os.getpid()}-{n}", it.get("transactionId") or f"{os.getpid()}-{n}"
            queue, partition = it["queue"], it.get("partition") or "Default"
            out.append({"index": i, "status": "queued", "messageId": mid, "transactionId": txn,
                        "queue": queue, "partition": partition, "partitionId": "1",
                        "offset": n, "createdAt": created, "traceId": None, "error": None,
                        "message_id": mid, "transaction_id": txn, "partition_id": "1",
                        "trace_id": None, "queueName": queue})
        resp.status = falcon.HTTP_201
        resp.data = orjson.dumps(out)
        resp.content_type = _JSON


class Pop:
    def __init__(self, ids: itertools.count[int]) -> None:
        self.ids = ids

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str) -> None:
        batch = req.get_param_as_int("batch", min_value=1, max_value=10_000, default=1)
        group = req.get_param("consumerGroup") or "__QUEUE_MODE__"
        created, lease, pid = _now(), f"lease-{next(self.ids)}", os.getpid()
        messages = []
        for _ in range(batch):
            n = next(self.ids)
            messages.append({"id": f"{pid}-{n}", "transactionId": f"edge-{pid}-{n}",
                             "traceId": None, "data": _PAYLOAD, "producerSub": None,
                             "createdAt": created, "queue": queue, "partitionId": "1",
                             "partition": "Default", "offset": n, "leaseId": lease,
                             "consumerGroup": group, "deliveryAttempt": 1})
        resp.data = orjson.dumps({
            "success": True, "queue": queue, "partition": "Default", "partitionId": "1",
            "leaseId": lease, "leaseExpiresAt": created, "consumerGroup": group,
            "partitionsClaimed": 1, "claims": [{"partitionId": "1", "partition": "Default",
                                                "start": 0, "end": batch - 1,
                                                "deliveryAttempt": 1}],
            "messages": messages})
        resp.content_type = _JSON


class AckBatch:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        doc = _body(await req.stream.read())
        acks = doc.get("acknowledgments") if isinstance(doc, dict) else None
        if not isinstance(acks, list):
            raise falcon.HTTPBadRequest(description="acknowledgments must be an array")
        out = []
        for i, a in enumerate(acks):
            if not isinstance(a, dict) or not isinstance(a.get("transactionId"), str):
                raise falcon.HTTPBadRequest(description=f"item {i}: transactionId missing")
            out.append({"index": i, "transactionId": a["transactionId"],
                        "partitionId": a.get("partitionId"), "success": True, "error": None,
                        "leaseReleased": True, "dlq": False, "noop": False})
        resp.data = orjson.dumps(out)
        resp.content_type = _JSON


def create_app() -> falcon.asgi.App:
    ids = itertools.count(1)
    app = falcon.asgi.App()
    app.add_route("/health", Health())
    app.add_route("/api/v1/push", Push(ids))
    app.add_route("/api/v1/pop/queue/{queue}", Pop(ids))
    app.add_route("/api/v1/ack/batch", AckBatch())
    return app


def app_from_env() -> falcon.asgi.App:
    """Gunicorn's factory (``bench.edge_app:app_from_env()``), called in each worker."""
    return create_app()
