"""``POST /api/v1/kv`` (docs/api.md 2.11): a batch of KV ops in one PostgreSQL transaction.

Body ``{"operations": [op, ...]}`` (ops of docs/api.md 2.5, validated by
``queen_mp.models.kv.parse_kv_ops``; ``getPrefix`` is allowed here). Answers:

- ``200 {"success": true, "results": [...]}``: index-aligned, each result the object of
  ``queen.kv_apply_v1`` (sql/functions/kv.sql) with its ``index`` added. A failed precondition of an
  op without ``required`` is a result (``applied: false``, ``reason``, ``version``, ``value``),
  not an error. An empty ``operations`` array answers ``{"success": true, "results": []}``.
- ``200 {"success": false, "reason": "kv_precondition", "error", "failedIndex", "kvReason",
  "version", "value", "results"}`` when an op with ``required: true`` failed: the transaction
  rolled back, nothing was written, and every result is ``{"index", "op", "applied": false}``
  (the failed one also carries ``reason``, ``version``, ``value``).
- errors in the KV shape ``{"error": code, "code": code, "reason", "detail"}`` (docs/api.md 1.4,
  2.11), plus ``index``/``field``/``limit`` when they apply: ``400`` (``reason`` says which
  rule), ``413 name_too_long`` / ``body_too_large``, ``503 maintenance`` (a call with a write
  while push maintenance is on; a read-only call is served), ``503 unavailable`` / ``timeout``
  / ``outcome_unknown``. ``reason`` is the code itself when no finer id exists.

NOTE(kv): admission permits (docs/api.md 1.8, 429) are not taken yet: no route has them so far.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import kv_procs
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
from queen_mp.models.kv import WRITE_OPS, parse_kv_ops

__all__ = ["KvResource", "kv_error"]


def _operations(body: bytes) -> list[Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as ex:
        raise InvalidRequest(f"malformed JSON body: {ex}", reason="kv_bad_request") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("operations"), list):
        raise InvalidRequest('the body must be {"operations": [op, ...]}', field="operations",
                             reason="kv_bad_request")
    return doc["operations"]


def _failure(ops: list[dict[str, Any]], outcome: kv_procs.KvOutcome) -> dict[str, Any]:
    results: list[dict[str, Any]] = [{"index": i, "op": op["op"], "applied": False}
                                     for i, op in enumerate(ops)]
    if outcome.failed_index is not None and 0 <= outcome.failed_index < len(results):
        results[outcome.failed_index].update(
            reason=outcome.kv_reason, version=outcome.version, value=outcome.value)
    return {"success": False, "reason": "kv_precondition", "error": outcome.error_text,
            "failedIndex": outcome.failed_index, "kvReason": outcome.kv_reason,
            "version": outcome.version, "value": outcome.value, "results": results}


class KvResource:
    """``POST /api/v1/kv``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        try:
            body = await self._apply(req)
        except (ApiError, RequestError) as ex:
            raise kv_error(from_request(ex)) from None
        resp.data = orjson.dumps(body)
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200

    async def _apply(self, req: falcon.asgi.Request) -> dict[str, Any]:
        raw = _operations(await read_body(req, self.worker.config.max_body_mb << 20))
        ops = parse_kv_ops(raw, in_transaction=False)
        if self.worker.push_maintenance() and any(op["op"] in WRITE_OPS for op in ops):
            # NOTE(kv): the flags board, before PostgreSQL; require_writable_v1 still guards
            # a write that races the switch.
            raise Maintenance("push maintenance is on: writes are refused (retry later)",
                              reason="maintenance")
        tenant = tenant_of(req)
        outcome = await call_db(self.worker.pool,
                                lambda conn: kv_procs.apply(conn, tenant, ops))
        if not outcome.ok:
            return _failure(ops, outcome)
        return {"success": True,
                "results": [{"index": i, **r} for i, r in enumerate(outcome.results)]}
