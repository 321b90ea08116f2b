"""``/streams/v1/*``: the Streams SDK's routes (docs/api.md "Streams"; client-contract.md 1.11).

Snake_case JSON, as the SDK sends and reads it; bodies parsed by ``queen_mp.models.streams``,
the work done by ``queen_mp.front.streams``. Answers:

- ``POST /streams/v1/queries``: ``200 {"success": true, "query_id", "name", "config_hash",
  "fresh", "reset"}``; ``409 conflict`` (``success: false``) when the name is registered with
  another config hash and ``reset`` is not true (the SDK raises StreamsConfigHashMismatch).
- ``POST /streams/v1/state/get``: ``200 {"success": true, "rows": [{"key", "value",
  "updated_at"}], "truncated"}``; ``404 not_found`` for a query id this tenant never registered.
- ``POST /streams/v1/cycle``: ``200 {"success": true, "repeat", "state_ops_applied",
  "push_results", "ack_result"}`` once committed (``repeat: true``: this very cycle had already
  committed, nothing applied now); ``200 {"success": false, "reason", "error"}`` when it was
  refused as a whole (``lease_lost``, ``ack_rejected``, ``duplicate``, ``state_changed``:
  nothing applied); ``404`` for an unknown query, or a partition outside the query's source
  queue; ``503 maintenance`` while push maintenance is on.

Every route: ``400``/``413`` for a body the models refuse, the 503 codes of a database failure
(``outcome_unknown`` on a cycle: retry it, the repeat rules make that safe), tenancy through
``tenant_of`` (another tenant's query ids answer as unknown ones), role ``read-write``.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db.errors import DatabaseError
from queen_mp.front.ingest import EncryptionUnavailable
from queen_mp.front.queueflags import FlagsUnavailable
from queen_mp.front.streams import Streams
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import sub_of, tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import api_error
from queen_mp.http.errors import JSON_UTF8, Conflict, Maintenance, NotFound, Unavailable
from queen_mp.models.streams import parse_cycle, parse_register, parse_state_get

__all__ = ["CycleResource", "QueriesResource", "StateGetResource"]


def _answer(resp: falcon.asgi.Response, body: dict[str, Any]) -> None:
    resp.data = orjson.dumps(body)
    resp.content_type = JSON_UTF8
    resp.status = falcon.HTTP_200


class _StreamsResource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker
        self._streams: Streams | None = None

    @property
    def streams(self) -> Streams:
        # NOTE(streams): built on first use: the worker's pool and ingest exist only once the
        # worker started (after fork), and resources are made before that.
        if self._streams is None:
            self._streams = Streams(self.worker.pool, self.worker.ingest)
        return self._streams

    async def body(self, req: falcon.asgi.Request) -> bytes:
        return await read_body(req, self.worker.config.max_body_mb << 20)


class QueriesResource(_StreamsResource):
    """``POST /streams/v1/queries``."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = parse_register(await self.body(req))
        try:
            res = await self.streams.register(tenant_of(req), q)
        except DatabaseError as ex:
            raise api_error(ex) from None
        if not res["ok"]:
            raise Conflict(
                f"config_hash mismatch: the operator chain of query {q.name!r} changed "
                f"(registered {res['configHash']}, given {q.config_hash}). Pass reset: true "
                "to wipe its state, or use a new query name.",
                success=False, query_id=str(res["queryId"]), name=q.name)
        _answer(resp, {"success": True, "query_id": str(res["queryId"]), "name": q.name,
                       "config_hash": q.config_hash, "fresh": bool(res["fresh"]),
                       "reset": bool(res["reset"])})


class StateGetResource(_StreamsResource):
    """``POST /streams/v1/state/get``."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = parse_state_get(await self.body(req))
        try:
            res = await self.streams.state_get(tenant_of(req), q)
        except DatabaseError as ex:
            raise api_error(ex) from None
        if not res["found"]:
            raise NotFound(f"no query {q.query_id} (register it with POST /streams/v1/queries)",
                           success=False, field="query_id")
        _answer(resp, {"success": True, "rows": res["rows"], "truncated": res["truncated"]})


class CycleResource(_StreamsResource):
    """``POST /streams/v1/cycle``."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        q = parse_cycle(await self.body(req), sub_of(req))
        if w.push_maintenance():
            # NOTE(streams): the flags board, before PostgreSQL; SQL still refuses (QM001) a
            # cycle that races the switch.
            raise Maintenance("push maintenance is on: writes are refused (retry later)")
        tenant = tenant_of(req)
        try:
            out = await self.streams.cycle(tenant, q)
        except (EncryptionUnavailable, FlagsUnavailable) as ex:
            raise Unavailable(str(ex)) from None
        except DatabaseError as ex:
            raise api_error(ex) from None
        reason = out.body.get("reason")
        if reason in ("unknown_query", "unknown_partition"):
            raise NotFound(out.body["error"] if reason == "unknown_partition"
                           else f"no query {q.query_id} (register it with POST "
                           "/streams/v1/queries)", success=False, reason=reason,
                           field="query_id" if reason == "unknown_query" else "partition_id")
        if out.body["success"]:
            w.after_transaction(tenant, set(out.woken), out.pushed)
        _answer(resp, out.body)
