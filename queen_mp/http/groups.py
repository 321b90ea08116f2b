"""``/api/v1/consumer-groups``: listings with exact lag, delete, subscription and seek.

docs/api.md 2.10 (and 1.2 for the snake_case aliases of the lagging rows). Every route is one call
of a ``queen_mp/sql/functions/groups.sql`` procedure through ``queen_mp.db.group_procs``:

==========================================================  ==================================
``GET    /api/v1/consumer-groups``                          ``GroupsResource``
``GET    /api/v1/consumer-groups/lagging?minLagSeconds=``   ``LaggingResource``
``GET    /api/v1/consumer-groups/{group}``                  ``GroupResource``
``DELETE /api/v1/consumer-groups/{group}?deleteMetadata=``  ``GroupResource``
``DELETE /api/v1/consumer-groups/{group}/queues/{queue}``   ``GroupQueueResource``
``POST   /api/v1/consumer-groups/{group}/subscription``     ``SubscriptionResource``
``POST   /api/v1/consumer-groups/{group}/queues/{queue}/seek``  ``SeekResource``
==========================================================  ==================================

``lagging`` is a literal route, which falcon's router prefers over ``{group}``; its
``LaggingResource`` also answers ``DELETE`` for a group really named ``lagging``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import group_procs
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import (
    InvalidRequest,
    NotFound,
)
from queen_mp.http.query import Query
from queen_mp.wire.binary_push import check_name
from queen_mp.wire.times import iso_ms, parse_iso

__all__ = [
    "GroupQueueResource",
    "GroupResource",
    "GroupsResource",
    "LaggingResource",
    "SeekResource",
    "SubscriptionResource",
]

DEFAULT_MIN_LAG_S = 3600  # upstream's default for /lagging


# --------------------------------------------------------------------------------- helpers
def _parse_time(value: Any, field: str) -> dt.datetime:
    """docs/api.md 1.3 in: any ISO-8601 time with ``Z`` or an offset."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"'{field}' must be an ISO-8601 time string", field=field)
    try:
        return parse_iso(value)
    except ValueError as ex:
        raise InvalidRequest(f"'{field}' is not an ISO-8601 time with a zone: {ex}",
                             field=field) from None


def _group(name: str) -> str:
    check_name(name, "consumerGroup")
    return name


def _queue(name: str) -> str:
    check_name(name, "queue")
    return name


async def _json_object(req: falcon.asgi.Request, worker: FrontWorker) -> dict[str, Any]:
    """An optional JSON object body: no body, an empty one or ``{}`` are all ``{}``."""
    body = await read_body(req, worker.config.max_body_mb << 20)
    if not body.strip():
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as ex:
        raise InvalidRequest(f"body is not valid JSON: {ex}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise InvalidRequest("body must be a JSON object")
    return doc


# --------------------------------------------------------------------------------- renderers
def _render_summary(r: dict[str, Any]) -> dict[str, Any]:
    return {"name": r["consumer_group"], "queueName": r["queue_name"],
            "topics": [r["queue_name"]], "members": r["members"],
            "partitions": r["partitions"], "partitionsWithLag": r["partitions_with_lag"],
            "totalLag": r["total_lag"], "maxTimeLag": r["max_time_lag"], "state": r["state"],
            "lastActivityAt": iso_ms(r["last_activity_at"]),
            "subscriptionMode": r["subscription_mode"],
            "subscriptionTimestamp": iso_ms(r["subscription_from"]),
            "subscriptionCreatedAt": iso_ms(r["subscription_created_at"])}


def _render_cursor(r: dict[str, Any]) -> dict[str, Any]:
    return {"partition": r["partition_name"], "partitionId": str(r["partition_id"]),
            "committedOffset": r["committed_offset"], "lastOffset": r["last_offset"],
            "offsetLag": r["offset_lag"], "timeLagSeconds": r["time_lag_seconds"],
            "oldestUnconsumedAt": iso_ms(r["oldest_unconsumed_at"]),
            "leaseActive": r["lease_active"], "workerId": r["worker_id"],
            "leaseExpiresAt": iso_ms(r["lease_expires_at"]) if r["lease_active"] else None,
            "lastConsumedAt": iso_ms(r["last_consumed_at"]),
            "totalConsumed": r["total_consumed"]}


def _render_lagging(r: dict[str, Any]) -> dict[str, Any]:
    pid = str(r["partition_id"])
    oldest, last = iso_ms(r["oldest_unconsumed_at"]), iso_ms(r["last_consumed_at"])
    return {"consumerGroup": r["consumer_group"], "queueName": r["queue_name"],
            "partitionName": r["partition_name"], "partitionId": pid,
            "workerId": r["worker_id"], "offsetLag": r["offset_lag"],
            "timeLagSeconds": r["time_lag_seconds"], "oldestUnconsumedAt": oldest,
            "lastConsumedAt": last,
            # docs/api.md 1.2: the snake_case aliases of exactly these rows
            "consumer_group": r["consumer_group"], "queue_name": r["queue_name"],
            "partition_name": r["partition_name"], "partition_id": pid,
            "worker_id": r["worker_id"], "offset_lag": r["offset_lag"],
            "time_lag_seconds": r["time_lag_seconds"], "oldest_unconsumed_at": oldest,
            "last_consumed_at": last}


async def _delete(worker: FrontWorker, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                  group: str, queue: str | None) -> None:
    group = _group(group)
    if queue is not None:
        queue = _queue(queue)
    delete_metadata = Query(req.query_string).flag("deleteMetadata", True)
    tenant = tenant_of(req)
    res = await call_db(worker.pool, lambda conn: group_procs.delete_group(
        conn, tenant, group, queue, delete_metadata))
    body: dict[str, Any] = {"success": True, "consumerGroup": group,
                            "deletedPartitions": res.deleted_partitions,
                            "metadataDeleted": delete_metadata,
                            "metadataRowsDeleted": res.metadata_rows}
    if queue is not None:
        body["queueName"] = queue
    resp.media = body


# --------------------------------------------------------------------------------- resources
class GroupsResource:
    """``GET /api/v1/consumer-groups``: one row per (group, queue)."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        tenant = tenant_of(req)
        rows = await call_db(self.worker.pool, lambda conn: group_procs.list_groups(conn, tenant))
        resp.media = [_render_summary(r) for r in rows]


class LaggingResource:
    """``GET /api/v1/consumer-groups/lagging?minLagSeconds=3600``: lagging cursors."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        min_lag = Query(req.query_string).integer("minLagSeconds", DEFAULT_MIN_LAG_S, minimum=0)
        tenant = tenant_of(req)
        rows = await call_db(self.worker.pool,
                             lambda conn: group_procs.lagging(conn, tenant, min_lag))
        resp.media = [_render_lagging(r) for r in rows]

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        # NOTE(groups): the literal route shadows a group named 'lagging'; GET cannot reach
        # its detail, but its DELETE can still be served.
        await _delete(self.worker, req, resp, "lagging", None)


class GroupResource:
    """``GET`` the cursors of one group by queue; ``DELETE`` the group everywhere."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     group: str) -> None:
        group = _group(group)
        tenant = tenant_of(req)
        rows = await call_db(self.worker.pool,
                             lambda conn: group_procs.cursors(conn, tenant, group))
        if not rows:
            raise NotFound(f"consumer group {group!r} has no cursor", field="consumerGroup")
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for r in rows:
            out.setdefault(r["queue_name"], {"partitions": []})["partitions"].append(
                _render_cursor(r))
        resp.media = out

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                        group: str) -> None:
        await _delete(self.worker, req, resp, group, None)


class GroupQueueResource:
    """``DELETE /api/v1/consumer-groups/{group}/queues/{queue}``: the group on one queue."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                        group: str, queue: str) -> None:
        await _delete(self.worker, req, resp, group, queue)


class SubscriptionResource:
    """``POST /api/v1/consumer-groups/{group}/subscription``.

    ``{"subscriptionTimestamp": ISO, "queue"?}``: the group's start becomes that time on the
    queue (or on every queue it has a subscription record for), and its cursors that have not
    consumed anything yet move there. ``rowsUpdated`` = subscription records written
    (``metadataUpdated``) + cursors moved (``partitionsUpdated``). An unknown queue is ``404``.
    """

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      group: str) -> None:
        group = _group(group)
        doc = await _json_object(req, self.worker)
        if doc.get("subscriptionTimestamp") is None:
            raise InvalidRequest("'subscriptionTimestamp' is required",
                                 field="subscriptionTimestamp")
        start = _parse_time(doc["subscriptionTimestamp"], "subscriptionTimestamp")
        queue = doc.get("queue")
        if queue is not None:
            if not isinstance(queue, str):
                raise InvalidRequest("'queue' must be a string", field="queue")
            queue = _queue(queue)
        tenant = tenant_of(req)
        res = await call_db(self.worker.pool, lambda conn: group_procs.set_subscription(
            conn, tenant, group, queue, start))
        if queue is not None and res.queues_found == 0:
            raise NotFound(f"queue {queue!r} does not exist", field="queue")
        resp.media = {"success": True, "consumerGroup": group, "newTimestamp": iso_ms(start),
                      "rowsUpdated": res.meta_rows + res.cursor_rows,
                      "metadataUpdated": res.meta_rows, "partitionsUpdated": res.cursor_rows}


class SeekResource:
    """``POST /api/v1/consumer-groups/{group}/queues/{queue}/seek``: replay or skip.

    Exactly one of ``{"toBeginning": true}``, ``{"toEnd": true}``, ``{"timestamp": ISO}``
    (``false``/``null`` values count as absent); none or several is ``400``.
    """

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      group: str, queue: str) -> None:
        group, queue = _group(group), _queue(queue)
        doc = await _json_object(req, self.worker)
        chosen: list[str] = []
        for key in ("toBeginning", "toEnd"):
            value = doc.get(key)
            if value is None or value is False:
                continue
            if value is not True:
                raise InvalidRequest(f"'{key}' must be a boolean", field=key)
            chosen.append(key)
        start: dt.datetime | None = None
        if doc.get("timestamp") is not None:
            start = _parse_time(doc["timestamp"], "timestamp")
            chosen.append("timestamp")
        if len(chosen) != 1:
            what = "none" if not chosen else ", ".join(chosen)
            raise InvalidRequest("seek needs exactly one of toBeginning, toEnd, timestamp "
                                 f"(got {what})")
        target = {"toBeginning": "beginning", "toEnd": "end", "timestamp": "timestamp"}[
            chosen[0]]
        tenant = tenant_of(req)
        n = await call_db(self.worker.pool, lambda conn: group_procs.seek(
            conn, tenant, group, queue, target, start))
        if n is None:
            raise NotFound(f"queue {queue!r} does not exist", field="queue")
        resp.status = falcon.HTTP_200
        resp.media = {"success": True, "consumerGroup": group, "queueName": queue,
                      "target": target, "targetTimestamp": iso_ms(start),
                      "partitionsUpdated": n}
