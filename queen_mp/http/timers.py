"""Timer routes (docs/api.md 2.11 and the timer rows of section 6).

==========================================================  =====================  ==========
``POST   /api/v1/timers``  ``{"operations": [op...]}``      ``TimersResource``     ops, one tx
``GET    /api/v1/timers/{queue}?limit=&offset=``            ``TimerQueueResource`` list
``GET    /api/v1/timers/{queue}/{timerKey...}``             ``TimerResource``      peek
``DELETE /api/v1/timers/{queue}/{timerKey...}``             ``TimerResource``      cancel
==========================================================  =====================  ==========

``POST`` validates every op (``queen_mp.models.timers.parse_timer_ops``), mints message ids and
transactionIds, then runs ``require_writable_v1`` (push maintenance: ``503 maintenance``),
``timer_provision_v1`` (queues of schedule ops) and ``timer_apply_v1`` in ONE transaction, and
answers ``200 {"results": [...]}`` index-aligned with the ops (each result gets ``index``).
``DELETE`` is a cancel op through the same transaction (``200`` with the op's result, whatever
its status: ``cancelled``, ``absent`` or ``too_late``). The list shows pending timers in
``deliverAt`` order; the peek shows one timer of any state still remembered (``404`` when
none), with its payload as stored (base64) and, decoded, as ``data``.

A timer's payload is stored plain and encrypted only when it fires into its queue, so the
reads hide it themselves from a caller that may not read encrypted payloads
(``authz.reads_encrypted``, a ``read-only`` token) when the queue has ``encryptionEnabled``
(the front worker's memoised flag, ``queen_mp.front.queueflags``): ``payload: null`` (and
``data: null`` on the peek) with ``encrypted: true`` and ``dataWithheld: true``, two keys no
other timer carries, so every other answer is the same for every role. A queue whose flag
PostgreSQL cannot tell answers ``503 unavailable`` to such a caller rather than the payload.

The timer key is the rest of the path, so it keeps its ``/`` (falcon's ``path`` converter);
the ASGI server has percent-decoded it. A key ending in ``/`` loses that slash (the app strips
trailing slashes) and cannot be addressed here.

Errors use the KV/timer shape (docs/api.md 1.4, 2.11):
``{"error": code, "code": code, "reason": stable id, "detail": text}`` plus the usual extras
(``index``, ``field``, ``limit``).
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import errors as dberrors
from queen_mp.db import timer_procs
from queen_mp.front.queueflags import FlagsUnavailable
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import reads_encrypted, sub_of, tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import (
    JSON_UTF8,
    ApiError,
    Internal,
    Maintenance,
    NotFound,
    Unavailable,
    from_wire,
)
from queen_mp.http.query import Query
from queen_mp.models import timers
from queen_mp.wire.errors import WireError

__all__ = ["TimerQueueResource", "TimerResource", "TimersResource"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000

Responder = Callable[..., Awaitable[None]]


# --------------------------------------------------------------------------------- helpers
def _shaped(ex: ApiError | WireError) -> ApiError:
    """The KV/timer error shape: ``error`` = ``code``, the text in ``detail``."""
    api = ex if isinstance(ex, ApiError) else from_wire(ex)
    reason = getattr(ex, "reason", None) or api.extra.get("reason") or api.code
    extra = {k: v for k, v in api.extra.items() if k not in ("reason", "detail")}
    out = type(api)(api.code, headers=api.headers, **extra)
    out.extra["reason"] = reason
    out.extra["detail"] = api.message
    return out


def timer_errors(fn: Responder) -> Responder:
    """Render every API or wire error of a responder in the KV/timer shape."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            await fn(*args, **kwargs)
        except (ApiError, WireError) as ex:
            raise _shaped(ex) from None

    return wrapper


def _db_errors(ex: dberrors.DatabaseError) -> ApiError | None:
    """Statement errors that ``call_db`` would call ``unavailable``: maintenance and bugs."""
    if isinstance(ex, timer_procs.Maintenance):
        return Maintenance("push maintenance is on: timer writes are refused",
                           reason="maintenance")
    if isinstance(ex, dberrors.StatementError):
        return Internal(f"timer procedure failed: {ex}", reason="internal")
    return None


def _refuse_in_maintenance(worker: FrontWorker) -> None:
    """Push maintenance per the flags board, before PostgreSQL (whose require_writable_v1
    still refuses a write that races the switch)."""
    if worker.push_maintenance():
        raise Maintenance("push maintenance is on: timer writes are refused",
                          reason="maintenance")


async def _run_ops(worker: FrontWorker, tenant: bytes, ops: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    provision = timers.queues_to_provision(ops)

    async def work(conn: Any) -> list[dict[str, Any]]:
        try:
            return await timer_procs.run_ops(conn, tenant, ops, provision)
        except dberrors.DatabaseError as ex:
            mapped = _db_errors(ex)
            if mapped is None:
                raise
            raise mapped from None

    return await call_db(worker.pool, work)


def _reply(resp: falcon.asgi.Response, body: Any) -> None:
    resp.data = orjson.dumps(body)
    resp.content_type = JSON_UTF8
    resp.status = falcon.HTTP_200


def _with_data(timer: dict[str, Any], max_decompressed: int) -> dict[str, Any]:
    """The peek's ``data``: the payload as JSON (null when empty or undecodable)."""
    data: Any = None
    try:
        stored = base64.b64decode(timer.get("payload") or "")
        raw = timers.payload_json(stored, bool(timer.get("payloadZstd")), max_decompressed)
        if raw:
            data = orjson.Fragment(raw)
    except (binascii.Error, WireError, orjson.JSONDecodeError, ValueError):
        data = None
    return {**timer, "data": data}


async def _withholding(worker: FrontWorker, req: falcon.asgi.Request, tenant: bytes,
                       queue: str) -> bool:
    """Whether the caller gets ``queue``'s timer payloads withheld: it may not read encrypted
    payloads and the queue is encrypted. Asks the flag only for such a caller."""
    if reads_encrypted(req):
        return False
    try:
        return await worker.ingest.flags.encrypted(tenant, queue)
    except FlagsUnavailable as ex:
        raise Unavailable(f"cannot tell whether queue {queue!r} is encrypted: {ex}",
                          reason="unavailable") from None


def _withheld(timer: dict[str, Any]) -> dict[str, Any]:
    """A timer without its payload, saying why (the same keys in the same places otherwise)."""
    return {**timer, "payload": None, "encrypted": True, "dataWithheld": True}


# --------------------------------------------------------------------------------- resources
class TimersResource:
    """``POST /api/v1/timers``: ``{"operations": [op...]}`` -> ``{"results": [...]}``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    @timer_errors
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        cfg = self.worker.config
        body = await read_body(req, cfg.max_body_mb << 20)
        try:
            doc = orjson.loads(body) if body else None
        except orjson.JSONDecodeError as ex:
            raise timers.TimerInvalidRequest(f"body is not valid JSON: {ex}",
                                             reason="malformed_json") from None
        if not isinstance(doc, dict) or "operations" not in doc:
            raise timers.TimerInvalidRequest("body must be an object with an 'operations' array",
                                             reason="missing_field", field="operations")
        ops = timers.parse_timer_ops(doc["operations"],
                                     max_decompressed=cfg.max_decompressed_mb << 20)
        if not ops:
            _reply(resp, {"results": []})
            return
        _refuse_in_maintenance(self.worker)
        results = await _run_ops(self.worker, tenant_of(req), timers.mint(ops, sub_of(req)))
        _reply(resp, {"results": [{"index": i, **r} for i, r in enumerate(results)]})


class TimerQueueResource:
    """``GET /api/v1/timers/{queue}?limit=&offset=``: pending timers, one page."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    @timer_errors
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str) -> None:
        timers.check_queue(queue)
        q = Query(req.query_string)
        limit = q.integer("limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
        offset = q.integer("offset", 0, minimum=0, maximum=(1 << 63) - 1)
        tenant = tenant_of(req)
        page = await call_db(self.worker.pool, lambda conn: timer_procs.list_pending(
            conn, tenant, queue, limit, offset))
        rows = page["timers"]
        if rows and await _withholding(self.worker, req, tenant, queue):
            rows = [_withheld(t) for t in rows]
        _reply(resp, {"queue": queue, "timers": rows, "total": page["total"],
                      "pagination": {"limit": limit, "offset": offset}})


class TimerResource:
    """``GET`` (peek) and ``DELETE`` (cancel) ``/api/v1/timers/{queue}/{timerKey...}``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    @timer_errors
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str, timer_key: str) -> None:
        timers.check_queue(queue)
        timers.check_timer_key(timer_key)
        tenant = tenant_of(req)
        timer = await call_db(self.worker.pool, lambda conn: timer_procs.get(
            conn, tenant, queue, timer_key))
        if timer is None:
            raise NotFound(f"no timer {timer_key!r} in queue {queue!r}", reason="absent",
                           field="timerKey")
        if await _withholding(self.worker, req, tenant, queue):
            _reply(resp, _withheld({**timer, "data": None}))
            return
        _reply(resp, _with_data(timer, self.worker.config.max_decompressed_mb << 20))

    @timer_errors
    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                        queue: str, timer_key: str) -> None:
        timers.check_queue(queue)
        timers.check_timer_key(timer_key)
        _refuse_in_maintenance(self.worker)
        op = {"op": "cancel", "queue": queue, "timerKey": timer_key, "txn": None}
        (result,) = await _run_ops(self.worker, tenant_of(req), [op])
        _reply(resp, result)
