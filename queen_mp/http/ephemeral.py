"""``/api/v1/ephemeral/*`` (docs/api.md "Ephemeral queues"): RAM-class queues on UNLOGGED tables.

Routes and answers (the published client's shapes, queen-mq 2.6 ``client.ephemeral``):

- ``POST configure {queue, options?}`` -> ``201 {queue, tier, configured, options}`` (the
  effective options: the declared ones over the defaults)
- ``POST reset {queue}`` -> ``200 {queue, dropped}``; ``DELETE queue/{queue}`` ->
  ``200 {queue, deleted, declared}`` (a miss is ``dropped: 0`` / ``deleted: false``, never 404)
- ``POST push {queue, partition?, messages: [{payload}]}`` -> ``201 {pushed}``, all or nothing;
  ``429 queue_full`` when the queue is at its bounds and its policy is ``reject``
- ``GET pop?queue=&partition=&batch=&wait=&timeout=&group=&autoAck=`` ->
  ``200 {queue, messages: [{id, partition, attempts, payload}]}`` (empty array on timeout)
- ``POST ack {queue, group?, acks: [{id, status?, error?}]}`` ->
  ``200 {results: [{id, outcome}]}``, outcome ``acked | redelivered | stale | unknown``
- ``GET queues`` -> ``{queues, count, truncated}``; ``GET queues/{queue}/depth`` -> the gauges,
  ``404 ephemeral_queue_not_found`` when the queue has neither messages nor a declaration.

Errors are docs/api.md 1.4's ``{"error", "code", ...}``. Every name, list and number is
bounded (queen_mp/models/ephemeral.py). The tenant is the caller's (``tenant_of``); a queue of
another tenant is another queue.

PERF(eph): push, pop and ack are also served on the front's lean path (queen_mp/http/hot.py,
``add_routes``' answer): their responders' ``answer`` is the whole of the route past the
middleware, whoever calls it. Falcon's request machinery cost a 1-message push about a fifth
of the front's time (py-spy of a front worker under 8 pushing connections).
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import ephemeral_procs
from queen_mp.db.errors import DatabaseError
from queen_mp.front.ephemeral import (
    EphemeralPopper,
    EphemeralPushFusion,
    TooManyParked,
    wake_bucket,
)
from queen_mp.front.worker import FrontWorker
from queen_mp.http.answer import Answer
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body, read_stream
from queen_mp.http.dbcall import api_error, call_db
from queen_mp.http.errors import JSON_UTF8, ApiError, InvalidRequest, Overloaded
from queen_mp.http.hot import HotAnswer, HotCall
from queen_mp.http.query import Query
from queen_mp.models import ephemeral as model
from queen_mp.wire.binary_push import check_queue_name

__all__ = ["EphAckResource", "EphConfigureResource", "EphDepthResource", "EphPopResource",
           "EphPushResource", "EphQueueResource", "EphQueuesResource", "EphResetResource",
           "QueueFull", "QueueNotFound", "ack_results", "add_routes"]


class QueueNotFound(ApiError):
    """The depth read of a queue that has neither messages nor a declaration."""

    status = 404
    code = "ephemeral_queue_not_found"


class QueueFull(ApiError):
    """The queue is at maxLength/maxBytes and its policy is reject (or the push alone is
    larger than the queue): backpressure, nothing was written."""

    status = 429
    code = "queue_full"


def _answer(resp: falcon.asgi.Response, status: str, body: Any) -> None:
    resp.data = body if isinstance(body, bytes) else orjson.dumps(body)
    resp.content_type = JSON_UTF8
    resp.status = status


async def _json(req: falcon.asgi.Request, worker: FrontWorker) -> Any:
    return _parse(await read_body(req, worker.config.max_body_mb << 20))


def _parse(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as ex:
        raise InvalidRequest(f"malformed JSON body: {ex}") from None


class _Shared:
    """What the resources of one app share: the worker, its one ``EphemeralPopper`` and its
    one ``EphemeralPushFusion``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker
        self._service: EphemeralPopper | None = None
        self._fusion: EphemeralPushFusion | None = None

    def fusion(self) -> EphemeralPushFusion:
        if self._fusion is None:  # the worker's pool exists once it started
            self._fusion = EphemeralPushFusion(self.worker.pool)
        return self._fusion

    def service(self) -> EphemeralPopper:
        if self._service is None:  # the worker's parking lot exists once it started
            self._service = EphemeralPopper(self.worker.pool, self.worker.popper.lot,
                                            self.worker.config.max_parked_pops)
        return self._service


PUSH = "/api/v1/ephemeral/push"
POP = "/api/v1/ephemeral/pop"
ACK = "/api/v1/ephemeral/ack"


def add_routes(app: falcon.asgi.App, worker: FrontWorker) -> dict[tuple[str, str], HotAnswer]:
    """Registers every ``/api/v1/ephemeral/*`` route on ``app``; the answers of those the
    lean path serves (``HotRoutes``' ``extra``), by (method, route template)."""
    shared = _Shared(worker)
    push, pop, ack = EphPushResource(shared), EphPopResource(shared), EphAckResource(shared)
    app.add_route("/api/v1/ephemeral/configure", EphConfigureResource(shared))
    app.add_route("/api/v1/ephemeral/reset", EphResetResource(shared))
    app.add_route("/api/v1/ephemeral/queue/{queue}", EphQueueResource(shared))
    app.add_route(PUSH, push)
    app.add_route(POP, pop)
    app.add_route(ACK, ack)
    app.add_route("/api/v1/ephemeral/queues", EphQueuesResource(shared))
    app.add_route("/api/v1/ephemeral/queues/{queue}/depth", EphDepthResource(shared))
    return {("POST", PUSH): push.hot, ("GET", POP): pop.hot, ("POST", ACK): ack.hot}


class _Resource:
    def __init__(self, shared: _Shared) -> None:
        self.worker = shared.worker
        self.service = shared.service
        self.fusion = shared.fusion

    def wake(self, tenant: bytes, queue: str) -> None:
        """Wake pops parked on ``queue``: the waker pokes this worker's and rings the other
        workers' (ipc/wakeup.py ``WorkerBells``); other instances hear it through the board."""
        waker = self.worker.waker
        if waker is not None:
            waker.wake([wake_bucket(tenant, queue)])


class EphConfigureResource(_Resource):
    """``POST /api/v1/ephemeral/configure``."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        spec = model.parse_configure(await _json(req, self.worker))
        tenant = tenant_of(req)
        out = await call_db(self.worker.pool, lambda conn: ephemeral_procs.configure(
            conn, tenant, spec.queue, spec.options))
        _answer(resp, falcon.HTTP_201, out)


class EphResetResource(_Resource):
    """``POST /api/v1/ephemeral/reset``."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        queue = model.parse_queue_body(await _json(req, self.worker))
        tenant = tenant_of(req)
        dropped = await call_db(self.worker.pool,
                                lambda conn: ephemeral_procs.reset(conn, tenant, queue))
        _answer(resp, falcon.HTTP_200, {"queue": queue, "dropped": dropped})


class EphQueueResource(_Resource):
    """``DELETE /api/v1/ephemeral/queue/{queue}``."""

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                        queue: str) -> None:
        check_queue_name(queue)
        tenant = tenant_of(req)
        out = await call_db(self.worker.pool,
                            lambda conn: ephemeral_procs.delete(conn, tenant, queue))
        _answer(resp, falcon.HTTP_200, out)


class _PostResource(_Resource):
    """A POST route of the lean path: its ``answer`` to the body, whoever read it."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        (await self.answer(await read_body(req, self.worker.config.max_body_mb << 20),
                           tenant_of(req))).apply(resp)

    async def hot(self, call: HotCall, body: bytes | AsyncIterable[bytes],
                  tenant: bytes) -> Answer:
        return await self.answer(await read_stream(call.content_length, body, call.encoding,
                                                   self.worker.config.max_body_mb << 20),
                                 tenant)

    async def answer(self, body: bytes, tenant: bytes) -> Answer:
        raise NotImplementedError


class EphPushResource(_PostResource):
    """``POST /api/v1/ephemeral/push``."""

    async def answer(self, body: bytes, tenant: bytes) -> Answer:
        push = model.parse_push(_parse(body))
        try:
            pushed = await self.fusion().push(tenant, push)
        except ephemeral_procs.QueueFull as ex:
            raise QueueFull(f"the ephemeral queue is full: {ex}", queue=push.queue) from None
        except DatabaseError as ex:
            raise api_error(ex) from None
        if pushed:
            self.wake(tenant, push.queue)
        return Answer(201, orjson.dumps({"pushed": pushed}))


class EphPopResource(_Resource):
    """``GET /api/v1/ephemeral/pop``."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        (await self.answer(req.query_string, tenant_of(req))).apply(resp)

    async def hot(self, call: HotCall, body: bytes | AsyncIterable[bytes],
                  tenant: bytes) -> Answer:
        return await self.answer(call.query_string, tenant)

    async def answer(self, query_string: str, tenant: bytes) -> Answer:
        q = Query(query_string)
        wait = q.flag("wait", False)
        request = model.pop_request(
            q.text("queue"), q.text("partition"), q.text("group"),
            q.integer("batch", 1, minimum=1, maximum=model.MAX_BATCH + 1), wait,
            q.integer("timeout", 30_000 if wait else 0, minimum=0,
                      maximum=model.MAX_TIMEOUT_MS + 1),
            q.flag("autoAck", False))
        try:
            popped = await self.service().pop(tenant, request)
        except TooManyParked as ex:
            raise Overloaded(str(ex), headers={"Retry-After": "1"}) from None
        except DatabaseError as ex:
            raise api_error(ex) from None
        self.worker.count_popped(popped.count)
        return Answer(200, b'{"queue":%s,"messages":%s}'
                      % (orjson.dumps(request.queue), popped.messages))


class EphAckResource(_PostResource):
    """``POST /api/v1/ephemeral/ack``."""

    async def answer(self, body: bytes, tenant: bytes) -> Answer:
        ack = model.parse_ack(_parse(body))
        if not ack.ids:
            return Answer(200, orjson.dumps({"results": []}))
        out = await call_db(self.worker.pool, lambda conn: ephemeral_procs.ack(
            conn, tenant, ack.queue, ack.group, ack.statuses, ack.epochs, ack.seqs,
            ack.deliveries))
        if out.redelivered:
            self.wake(tenant, ack.queue)
        return Answer(200, ack_results(ack, out.outcomes))


def ack_results(ack: model.Ack, outcomes: list[str]) -> bytes:
    """``{"results": [{id, outcome}]}``. PERF(eph): ids of ours (hex digits, digits and
    dashes) and the outcomes' words need no escaping, so the usual answer is joined as text;
    a dict per id and orjson cost an ack of 100 about 170k instructions, the join 15k
    (callgrind)."""
    if "" in ack.epochs:  # an id that is not ours may need escaping
        return orjson.dumps({"results": [{"id": i, "outcome": o}
                                         for i, o in zip(ack.ids, outcomes, strict=True)]})
    if outcomes.count("acked") == len(outcomes):
        return b'{"results":[{"id":"%s","outcome":"acked"}]}' % (
            '","outcome":"acked"},{"id":"'.join(ack.ids).encode())
    return ('{"results":[' + ",".join(map('{{"id":"{}","outcome":"{}"}}'.format, ack.ids,
                                          outcomes)) + "]}").encode()


class EphQueuesResource(_Resource):
    """``GET /api/v1/ephemeral/queues``."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        tenant = tenant_of(req)
        out = await call_db(self.worker.pool, lambda conn: ephemeral_procs.list_queues(
            conn, tenant, model.MAX_LIST))
        _answer(resp, falcon.HTTP_200, out)


class EphDepthResource(_Resource):
    """``GET /api/v1/ephemeral/queues/{queue}/depth``."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str) -> None:
        check_queue_name(queue)
        tenant = tenant_of(req)
        out = await call_db(self.worker.pool, lambda conn: ephemeral_procs.depth(
            conn, tenant, queue, model.MAX_LIST))
        if out is None:
            raise QueueNotFound(f'no ephemeral queue "{queue}" exists', queue=queue)
        _answer(resp, falcon.HTTP_200, out)
