"""Message traces (docs/api.md 2.13): named events a consumer records on a message, and their reads.

==========================================================  =================================
``POST /api/v1/traces``                                     ``TracesResource``
``GET /api/v1/traces/{partitionId}/{transactionId}``        ``MessageTracesResource``
``GET /api/v1/traces/by-name/{traceName}``                  ``TracesByNameResource``
``GET /api/v1/traces/names``                                ``TraceNamesResource``
==========================================================  =================================

The body is validated by ``queen_mp.models.traces.parse_trace``; the message is the one whose
transactionId hash the partition's sidecar holds (``queen.trace_record_v1``,
sql/functions/traces.sql, says how, and the one case where absence cannot be proven cheaply).
A recorded event answers ``201 {"success": true, "traceId"}``; an unknown message, partition,
or a partition of another tenant answers ``404`` with ``success: false`` (the 2.6 client merges
the answer into its result and never raises: its ``trace()`` swallows failures).

The reads answer in recording order, as ``{"traces": [...]}`` of trace objects (``id``,
``transactionId``, ``partitionId``, ``consumerGroup``, ``eventType``, ``data``, ``traceNames``,
``createdAt``; by name also ``queue`` and ``partition``); another tenant's traces are as
absent ones (an empty list). Every list is bounded: a message's traces by ``limit`` (1..1000,
default 1000, larger clamped; ``truncated`` says more exist), the by-name and names pages by
``limit`` (default 100 / 50, at most 1000, larger clamped) and ``offset``, with ``total``.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import trace_procs
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import JSON_UTF8, InvalidRequest, NotFound
from queen_mp.http.query import Query
from queen_mp.models.items import loads_json, path_partition_id, path_transaction_id
from queen_mp.models.traces import MAX_TRACE_BODY_BYTES, parse_trace
from queen_mp.wire.binary_push import check_name
from queen_mp.wire.hashing import txn_hash

__all__ = ["MessageTracesResource", "TraceNamesResource", "TracesByNameResource",
           "TracesResource"]

MAX_LIMIT = 1000
MAX_OFFSET = 1 << 62


def _answer(resp: falcon.asgi.Response, body: dict[str, Any],
            status: str = falcon.HTTP_200) -> None:
    resp.data = orjson.dumps(body)
    resp.content_type = JSON_UTF8
    resp.status = status


class _Traces:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker


class TracesResource(_Traces):
    """``POST /api/v1/traces``: record one event on a message."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await read_body(req, min(MAX_TRACE_BODY_BYTES,
                                        self.worker.config.max_body_mb << 20))
        try:
            doc = loads_json(body)
        except ValueError as ex:
            raise InvalidRequest(f"malformed JSON body: {ex}") from None
        event = parse_trace(doc)
        tenant, digest = tenant_of(req), txn_hash(event.transaction_id)
        done = await call_db(self.worker.pool,
                             lambda conn: trace_procs.record(conn, tenant, event, digest))
        if not done.get("recorded"):
            raise NotFound(f"message not found: partition {event.partition_id}, transactionId "
                           f"{event.transaction_id!r}", field="transactionId", success=False)
        _answer(resp, {"success": True, "traceId": done["traceId"]}, falcon.HTTP_201)


class MessageTracesResource(_Traces):
    """``GET /api/v1/traces/{partitionId}/{transactionId}?limit=``: one message's traces."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     partition_id: str, transaction_id: str) -> None:
        pid, txn = path_partition_id(partition_id), path_transaction_id(transaction_id)
        limit = Query(req.query_string).integer("limit", MAX_LIMIT, minimum=1,
                                                maximum=MAX_LIMIT)
        tenant = tenant_of(req)
        got = await call_db(self.worker.pool,
                            lambda conn: trace_procs.for_message(conn, tenant, pid, txn, limit))
        _answer(resp, {"traces": got["traces"], "count": len(got["traces"]),
                       "truncated": got["truncated"]})


class TracesByNameResource(_Traces):
    """``GET /api/v1/traces/by-name/{traceName}?limit=&offset=``: a page of one name's traces."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     name: str) -> None:
        check_name(name, "traceName", slash_ok=True)
        q = Query(req.query_string)
        limit = q.integer("limit", 100, minimum=1, maximum=MAX_LIMIT)
        offset = q.integer("offset", 0, minimum=0, maximum=MAX_OFFSET)
        tenant = tenant_of(req)
        got = await call_db(self.worker.pool,
                            lambda conn: trace_procs.by_name(conn, tenant, name, limit, offset))
        _answer(resp, {"traces": got["traces"], "count": len(got["traces"]),
                       "total": got["total"], "limit": limit, "offset": offset})


class TraceNamesResource(_Traces):
    """``GET /api/v1/traces/names?limit=&offset=``: a page of the tenant's trace names."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        limit = q.integer("limit", 50, minimum=1, maximum=MAX_LIMIT)
        offset = q.integer("offset", 0, minimum=0, maximum=MAX_OFFSET)
        tenant = tenant_of(req)
        got = await call_db(self.worker.pool,
                            lambda conn: trace_procs.names(conn, tenant, limit, offset))
        _answer(resp, {"traceNames": got["traceNames"], "count": len(got["traceNames"]),
                       "total": got["total"], "limit": limit, "offset": offset})
