"""``POST /api/v1/locks`` (docs/api.md 2.14): locks and semaphores kept as KV rows.

Body ``{"operations": [op, ...]}``, ops of ``queen_mp.models.locks`` (acquire, renew, release,
get), each on another lock. Answers:

- ``200 {"results": [...]}``: exactly one result per op, index-aligned, the objects of
  ``queen.locks_apply_v1`` (sql/functions/locks.sql). A verdict is never an HTTP error: a lock
  somebody else holds is ``acquired: false`` in a 200, a stale token ``reason: "lost"``.
  An empty ``operations`` array answers ``{"results": []}``.
- errors in the KV shape ``{"error": code, "code": code, "reason", "detail"}`` plus ``index``/
  ``field``/``limit`` when they apply: ``400`` (``reason`` says which rule), ``413``
  (``name_too_long``, ``body_too_large``), ``503 maintenance`` (a call with a write while push
  maintenance is on; a call of ``get`` ops only is served), ``503 unavailable`` / ``timeout`` /
  ``outcome_unknown`` (a call sent again by the same owners converges: an acquire answers the
  permit its first attempt took, a renew carries its own landed renew through).
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import lock_procs
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import (
    JSON_UTF8,
    ApiError,
    InvalidRequest,
    Maintenance,
    from_request,
    kv_error,
)
from queen_mp.models.errors import RequestError
from queen_mp.models.locks import parse_lock_ops

__all__ = ["LocksResource"]

#: a locks call is small (64 ops of short names): 1 MiB is far above any honest one
MAX_LOCKS_BODY = 1 << 20


def _operations(body: bytes) -> Any:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as ex:
        raise InvalidRequest(f"malformed JSON body: {ex}", reason="locks_bad_request") from None
    if not isinstance(doc, dict) or "operations" not in doc:
        raise InvalidRequest('the body must be {"operations": [op, ...]}', field="operations",
                             reason="locks_bad_request")
    return doc["operations"]


class LocksResource:
    """``POST /api/v1/locks``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        try:
            results = await self._apply(req)
        except (ApiError, RequestError) as ex:
            raise kv_error(from_request(ex)) from None
        resp.data = orjson.dumps({"results": results})
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200

    async def _apply(self, req: falcon.asgi.Request) -> list[dict[str, Any]]:
        limit = min(MAX_LOCKS_BODY, self.worker.config.max_body_mb << 20)
        ops = parse_lock_ops(_operations(await read_body(req, limit)))
        if self.worker.push_maintenance() and any(op["op"] != "get" for op in ops):
            # NOTE(locks): the flags board, before PostgreSQL; require_writable_v1 still
            # guards a write that races the switch.
            raise Maintenance("push maintenance is on: lock writes are refused (retry later)",
                              reason="maintenance")
        tenant = tenant_of(req)
        return await call_db(self.worker.pool, lambda conn: lock_procs.apply(conn, tenant, ops))
