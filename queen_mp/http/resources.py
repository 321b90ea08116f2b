"""Admin and ops read routes, queue delete and stats refresh (docs/api.md 5).

Every route is one or a few calls of the ``sql/functions/admin.sql`` procedures through
``queen_mp.db.admin_procs``. Counts are computed from the log at request time, nothing is
cached (so ``POST /stats/refresh`` has nothing to recompute and only answers):

==================================================  ============================================
``GET    /api/v1/resources/overview``                ``OverviewResource``
``GET    /api/v1/resources/queues``                  ``QueuesResource``
``GET    /api/v1/resources/queues/{queue}``          ``QueueResource`` (404 when absent)
``DELETE /api/v1/resources/queues/{queue}``          ``QueueResource`` (200, ``existed``)
``POST   /api/v1/resources/queues/{queue}/purge``    ``PurgeResource`` (404 when absent)
``GET    /api/v1/resources/queues/{queue}/depth``    ``DepthResource`` (404 when absent)
``GET    /api/v1/resources/namespaces``              ``NamespacesResource``
``GET    /api/v1/resources/tasks``                   ``TasksResource``
``GET    /api/v1/resources/partitions``              ``PartitionsResource``
``GET    /api/v1/status``                            ``StatusResource``
``GET    /api/v1/status/queues``                     ``StatusQueuesResource``
``GET    /api/v1/status/queues/{queue}``             ``StatusQueueResource`` (404 when absent)
``GET    /api/v1/status/analytics``                  ``AnalyticsResource``
``POST   /api/v1/stats/refresh``                     ``StatsRefreshResource``
``GET    /api/v1/status/system``                     ``StatusSystemResource``
==================================================  ============================================

Message counts (defined in the sql/functions/admin.sql header): ``total`` = messages retained in the
log, ``pending`` = exact backlog (queue level: behind the lowest cursor of each partition; with
a group: behind that group's cursor), ``processing`` = messages inside live leases,
``deadLetter`` = DLQ rows.

Time series (``/status`` ``throughput``, ``/status/analytics`` ``dataPoints``): ``ingested``
counts the messages of the retained segments created in each bucket. ``processed`` is always
``null``: the broker keeps no per-minute record of consumption (a cursor holds only its
latest consumption time and a running total), and a number derived from those would be
invented. ``from``/``to`` default to the last hour; buckets are whole UTC minutes, hours, days.

A deleted queue's parked pops are not woken: like pops on any unknown queue they wait and
answer ``204`` at their deadline (docs/api.md 1.9).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp import __version__
from queen_mp.db import admin_procs, procs
from queen_mp.front.worker import SHARD_STALE_MS, FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import InvalidRequest, NotFound
from queen_mp.http.query import Query
from queen_mp.ipc.slots import pid_exists
from queen_mp.wire.binary_push import check_name
from queen_mp.wire.times import iso_ms

__all__ = [
    "AnalyticsResource",
    "DepthResource",
    "NamespacesResource",
    "OverviewResource",
    "PartitionsResource",
    "PurgeResource",
    "QueueResource",
    "QueuesResource",
    "StatsRefreshResource",
    "StatusQueueResource",
    "StatusQueuesResource",
    "StatusResource",
    "StatusSystemResource",
    "TasksResource",
]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
DEFAULT_RANGE = dt.timedelta(hours=1)
TOP_ERRORS = 10
# /status picks the smallest bucket that keeps the series at most this long
_STATUS_BUCKETS_MIN = (1, 5, 15, 30, 60, 180, 360, 720, 1440)
_STATUS_MAX_POINTS = 500
# the most buckets admin_throughput_v1 computes: a range beyond that many days (of the
# largest bucket) is a 400 here, not the procedure's refusal answered as a 503
_STATUS_MAX_BUCKETS = 100_000
_ANALYTICS_INTERVALS = {"minute": 60, "hour": 3600, "day": 86400}
_ANALYTICS_MAX_POINTS = 10_000


# --------------------------------------------------------------------------------- helpers
def _queue(name: str) -> str:
    check_name(name, "queue")
    return name


def _filter(q: Query, name: str, *, slash_ok: bool = True) -> str | None:
    """An optional name filter; absent or empty = no filter."""
    value = q.text(name)
    if not value:
        return None
    check_name(value, name, slash_ok=slash_ok)
    return value


def _paging(q: Query) -> tuple[int, int]:
    return (q.integer("limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT),
            q.integer("offset", 0, minimum=0))


def _time_range(q: Query) -> tuple[dt.datetime, dt.datetime]:
    """``from``/``to`` (ISO-8601 with a zone); default the hour up to now."""
    end = q.time("to") or dt.datetime.now(dt.UTC)
    start = q.time("from") or end - DEFAULT_RANGE
    if start >= end:
        raise InvalidRequest("'from' must be before 'to'", field="from")
    return start, end


def _messages(r: dict[str, Any], *, dead_letter: bool = True) -> dict[str, int]:
    out = {"total": int(r["total"]), "pending": int(r["pending"]),
           "processing": int(r["processing"])}
    if dead_letter:
        out["deadLetter"] = int(r["dead_letter"])
    return out


def _queue_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(r["id"]), "name": r["name"], "namespace": r["namespace"],
            "task": r["task"], "priority": r["priority"], "createdAt": iso_ms(r["created_at"]),
            "partitions": int(r["partitions"]), "messages": _messages(r)}


def _partition_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(r["partition_id"]), "name": r["partition_name"],
            "createdAt": iso_ms(r["created_at"]), "lastOffset": r["last_offset"],
            "logStartOffset": r["log_start_offset"], "lastWriteAt": iso_ms(r["last_write_at"]),
            "messages": _messages(r, dead_letter=False)}


def _group_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"name": r["consumer_group"], "partitions": int(r["cursors"]),
            "pending": int(r["pending"]), "processing": int(r["processing"]),
            "members": int(r["members"]), "totalConsumed": int(r["total_consumed"]),
            "lastConsumedAt": iso_ms(r["last_consumed_at"]),
            "subscriptionMode": r["subscription_mode"],
            "subscriptionTimestamp": iso_ms(r["subscription_from"])}


def _cursor_row(r: dict[str, Any]) -> dict[str, Any]:
    active = bool(r["lease_active"])
    return {"partition": r["partition_name"], "partitionId": str(r["partition_id"]),
            "committedOffset": r["committed_offset"], "lastOffset": r["last_offset"],
            "pending": int(r["pending"]), "leaseActive": active,
            "leaseExpiresAt": iso_ms(r["lease_expires_at"]) if active else None,
            "workerId": r["worker_id"] if active else None,
            "batchStart": r["batch_start"] if active else None,
            "batchEnd": r["batch_end"] if active else None,
            "deliveryAttempt": r["attempt_count"], "totalConsumed": r["total_consumed"],
            "lastConsumedAt": iso_ms(r["last_consumed_at"]),
            "lastPoppedAt": iso_ms(r["last_popped_at"])}


def _detail(d: admin_procs.QueueDetail, *, cursors: bool) -> dict[str, Any]:
    head = d.queue
    parts = [_partition_row(p) for p in d.partitions]
    totals = {"total": sum(p["messages"]["total"] for p in parts),
              "pending": sum(p["messages"]["pending"] for p in parts),
              "processing": sum(p["messages"]["processing"] for p in parts),
              "deadLetter": int(head["dead_letter"])}
    groups = [_group_row(g) for g in d.groups]
    if cursors:
        by_group: dict[str, list[dict[str, Any]]] = {}
        for c in d.cursors:
            by_group.setdefault(c["consumer_group"], []).append(_cursor_row(c))
        for g in groups:
            g["cursors"] = by_group.get(g["name"], [])
    return {"id": str(head["id"]), "name": head["name"], "namespace": head["namespace"],
            "task": head["task"], "priority": head["priority"],
            "createdAt": iso_ms(head["created_at"]), "updatedAt": iso_ms(head["updated_at"]),
            "options": head["options"], "partitions": parts,
            # NOTE(reads): evicted = deleted unconsumed after waiting over maxWaitTimeSeconds
            "totals": {"partitions": len(parts), "messages": totals,
                       "evicted": int(head.get("evicted") or 0)},
            "consumerGroups": groups}


async def _optional_json(req: falcon.asgi.Request, worker: FrontWorker) -> dict[str, Any]:
    """An optional JSON object body: none, empty, ``null`` or ``{}`` are all ``{}``."""
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


def _series(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # NOTE(admin): processed stays null: see the module docstring.
    return [{"timestamp": iso_ms(r["bucket_at"]), "ingested": int(r["ingested"]),
             "processed": None} for r in rows]


class _Resource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker


# --------------------------------------------------------------------------------- resources
class OverviewResource(_Resource):
    """``GET /api/v1/resources/overview``: counts over the whole tenant."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        tenant = tenant_of(req)
        r = await call_db(self.worker.pool, lambda conn: admin_procs.overview(conn, tenant))
        resp.media = {"queues": r["queues"], "partitions": r["partitions"],
                      "namespaces": r["namespaces"], "tasks": r["tasks"],
                      "consumerGroups": r["consumer_groups"], "messages": _messages(r),
                      "timestamp": iso_ms(dt.datetime.now(dt.UTC))}


class QueuesResource(_Resource):
    """``GET /api/v1/resources/queues?namespace=&task=&limit=100&offset=0``."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        namespace, task = _filter(q, "namespace"), _filter(q, "task")
        limit, offset = _paging(q)
        tenant = tenant_of(req)
        page = await call_db(self.worker.pool, lambda conn: admin_procs.queues_page(
            conn, tenant, namespace=namespace, task=task, limit=limit, offset=offset))
        resp.media = {"queues": [_queue_row(r) for r in page.rows], "total": page.total}


class QueueResource(_Resource):
    """``GET`` one queue with its partitions and groups; ``DELETE`` it with everything under it.

    The delete waits for in-flight pushes on the queue's partitions to commit (it locks the
    partition rows), then removes them with the rest; ``existed`` tells whether there was
    anything to delete, and both answers are ``200``.
    """

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str) -> None:
        queue = _queue(queue)
        tenant = tenant_of(req)
        d = await call_db(self.worker.pool,
                          lambda conn: admin_procs.queue_detail(conn, tenant, queue))
        if d is None:
            raise NotFound(f"queue {queue!r} does not exist", field="queue")
        resp.media = _detail(d, cursors=False)

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                        queue: str) -> None:
        queue = _queue(queue)
        tenant = tenant_of(req)
        existed = await call_db(self.worker.pool,
                                lambda conn: admin_procs.delete_queue(conn, tenant, queue))
        resp.media = {"deleted": True, "queue": queue, "existed": existed}


class PurgeResource(_Resource):
    """``POST /api/v1/resources/queues/{queue}/purge``: remove the messages, keep the queue.

    Unlike the delete, the queue's options, partitions (their offsets go on), consumer groups
    and subscriptions stay, so producers and consumers carry on; messages inside live leases
    stay too (``kept``), as retention leaves them.
    """

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      queue: str) -> None:
        queue = _queue(queue)
        tenant = tenant_of(req)
        got = await call_db(self.worker.pool,
                            lambda conn: admin_procs.purge_queue(conn, tenant, queue))
        if got is None:
            raise NotFound(f"queue {queue!r} does not exist", field="queue")
        resp.media = {"queue": queue, "partitions": int(got["partitions"]),
                      "purged": int(got["purged"]), "kept": int(got["kept"])}


class DepthResource(_Resource):
    """``GET /api/v1/resources/queues/{queue}/depth?group=``: exact backlog per partition."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str) -> None:
        queue = _queue(queue)
        group = _filter(Query(req.query_string), "group", slash_ok=False)
        tenant = tenant_of(req)
        rows = await call_db(self.worker.pool,
                             lambda conn: admin_procs.depth(conn, tenant, queue, group))
        if rows is None:
            raise NotFound(f"queue {queue!r} does not exist", field="queue")
        pending = sum(int(r["pending"]) for r in rows)
        resp.media = {"queue": queue, "group": group, "pending": pending,
                      "partitionsPending": sum(1 for r in rows if r["pending"] > 0),
                      "conflation": False, "effectivePending": pending,
                      "partitions": [{"partition": r["partition_name"],
                                      "pending": int(r["pending"])} for r in rows]}


class NamespacesResource(_Resource):
    """``GET /api/v1/resources/namespaces``."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        tenant = tenant_of(req)
        rows = await call_db(self.worker.pool,
                             lambda conn: admin_procs.namespaces(conn, tenant))
        resp.media = {"namespaces": [
            {"namespace": r["namespace"], "queues": r["queues"], "partitions": r["partitions"],
             "messages": {"total": int(r["total"]), "pending": int(r["pending"])}}
            for r in rows]}


class TasksResource(_Resource):
    """``GET /api/v1/resources/tasks``: one row per (namespace, task)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        tenant = tenant_of(req)
        rows = await call_db(self.worker.pool, lambda conn: admin_procs.tasks(conn, tenant))
        resp.media = {"tasks": [
            {"task": r["task"], "namespace": r["namespace"], "queues": r["queues"],
             "partitions": r["partitions"],
             "messages": {"total": int(r["total"]), "pending": int(r["pending"])}}
            for r in rows]}


class PartitionsResource(_Resource):
    """``GET /api/v1/resources/partitions?queue=&limit=100&offset=0``."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        queue = _filter(q, "queue", slash_ok=False)
        limit, offset = _paging(q)
        tenant = tenant_of(req)
        page = await call_db(self.worker.pool, lambda conn: admin_procs.partitions_page(
            conn, tenant, queue, limit, offset))
        resp.media = {"partitions": [
            {"id": str(r["id"]), "queue": r["queue_name"], "name": r["name"],
             "createdAt": iso_ms(r["created_at"]), "lastOffset": r["last_offset"],
             "logStartOffset": r["log_start_offset"], "lastWriteAt": iso_ms(r["last_write_at"])}
            for r in page.rows], "total": page.total}


# ------------------------------------------------------------------------------------ status
class StatusResource(_Resource):
    """``GET /api/v1/status?queue=&namespace=&task=&from=&to=``.

    ``queues`` and ``messages`` are the current state of the queues in scope; ``throughput``
    covers [from, to); ``deadLetterQueue`` counts the DLQ rows filed in [from, to).
    """

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        queue = _filter(q, "queue", slash_ok=False)
        namespace, task = _filter(q, "namespace"), _filter(q, "task")
        start, end = _time_range(q)
        span_min = (end - start).total_seconds() / 60
        bucket = next((b for b in _STATUS_BUCKETS_MIN if span_min / b <= _STATUS_MAX_POINTS),
                      _STATUS_BUCKETS_MIN[-1])
        if span_min / bucket > _STATUS_MAX_BUCKETS:
            raise InvalidRequest(f"'from'..'to' spans more than {_STATUS_MAX_BUCKETS} days "
                                 "(the series has at most that many day buckets)",
                                 field="from")
        tenant = tenant_of(req)

        async def run(conn: Any) -> tuple[Any, ...]:
            series = await admin_procs.throughput(conn, tenant, queue, namespace, task, start,
                                                  end, bucket * 60)
            page = await admin_procs.queues_page(conn, tenant, queue=queue,
                                                 namespace=namespace, task=task)
            live = await admin_procs.leases(conn, tenant, queue, namespace, task)
            dlq = await admin_procs.dlq_summary(conn, tenant, queue, namespace, task, start,
                                                end, TOP_ERRORS)
            return series, page, live, dlq

        series, page, live, dlq = await call_db(self.worker.pool, run)
        queues = [_queue_row(r) for r in page.rows]
        totals = {k: sum(row["messages"][k] for row in queues)
                  for k in ("total", "pending", "processing", "deadLetter")}
        resp.media = {"timeRange": {"from": iso_ms(start), "to": iso_ms(end)},
                      "bucketMinutes": bucket, "throughput": _series(series),
                      "queues": queues, "messages": totals,
                      "leases": {"active": live["active"],
                                 "partitionsWithLeases": live["partitions_with_leases"]},
                      "deadLetterQueue": dlq}


class StatusQueuesResource(_Resource):
    """``GET /api/v1/status/queues?namespace=&task=&limit=&offset=``: as /resources/queues,
    plus ``pagination``. ``from``/``to`` are checked but the counts are the current state."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        namespace, task = _filter(q, "namespace"), _filter(q, "task")
        _time_range(q)
        limit, offset = _paging(q)
        tenant = tenant_of(req)
        page = await call_db(self.worker.pool, lambda conn: admin_procs.queues_page(
            conn, tenant, namespace=namespace, task=task, limit=limit, offset=offset))
        resp.media = {"queues": [_queue_row(r) for r in page.rows], "total": page.total,
                      "pagination": {"limit": limit, "offset": offset}}


class StatusQueueResource(_Resource):
    """``GET /api/v1/status/queues/{queue}``: the queue detail, with every group's cursors."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     queue: str) -> None:
        queue = _queue(queue)
        tenant = tenant_of(req)
        d = await call_db(self.worker.pool, lambda conn: admin_procs.queue_detail(
            conn, tenant, queue, with_cursors=True))
        if d is None:
            raise NotFound(f"queue {queue!r} does not exist", field="queue")
        resp.media = _detail(d, cursors=True)


class AnalyticsResource(_Resource):
    """``GET /api/v1/status/analytics?interval=minute|hour|day&from=&to=`` (also takes the
    ``queue``/``namespace``/``task`` filters of /status)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        interval = q.text("interval") or "minute"
        if interval not in _ANALYTICS_INTERVALS:
            raise InvalidRequest(f"interval={interval!r}: minute, hour or day",
                                 field="interval")
        queue = _filter(q, "queue", slash_ok=False)
        namespace, task = _filter(q, "namespace"), _filter(q, "task")
        start, end = _time_range(q)
        step = _ANALYTICS_INTERVALS[interval]
        if (end - start).total_seconds() / step > _ANALYTICS_MAX_POINTS:
            raise InvalidRequest(f"more than {_ANALYTICS_MAX_POINTS} {interval} buckets "
                                 "between from and to", field="interval")
        tenant = tenant_of(req)
        rows = await call_db(self.worker.pool, lambda conn: admin_procs.throughput(
            conn, tenant, queue, namespace, task, start, end, step))
        resp.media = {"dataPoints": _series(rows), "interval": interval,
                      "from": iso_ms(start), "to": iso_ms(end)}


class StatsRefreshResource(_Resource):
    """``POST /api/v1/stats/refresh``: every count is computed when asked, so there is no
    cached summary to recompute; the body (optional) is read and checked, then answered."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        await _optional_json(req, self.worker)
        resp.media = {"success": True, "refreshedAt": iso_ms(dt.datetime.now(dt.UTC))}


class StatusSystemResource(_Resource):
    """``GET /api/v1/status/system``: this instance's processes (from shared memory: pids,
    restarts, shard beats) and its PostgreSQL server (version, connections, size,
    replication). Instance-wide like ``/health``, so no tenant's data is in it."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        server = await call_db(w.pool, procs.server_info)
        workers, shards = w.processes()
        resp.media = {
            "instance": w.config.instance_name, "version": __version__,
            "startedAt": iso_ms(dt.datetime.fromtimestamp(w.runtime.started_at, dt.UTC)),
            "uptimeSeconds": int(dt.datetime.now(dt.UTC).timestamp() - w.runtime.started_at),
            "supervisorPid": os.getppid(),
            "answeredBy": {"slot": w.slot, "pid": os.getpid()},
            "frontWorkers": [{"slot": x.slot, "pid": x.pid, "alive": pid_exists(x.pid),
                              "generation": x.generation, "restarts": x.restarts}
                             for x in workers],
            "shards": [{"index": s.index, "pid": s.pid,
                        "alive": s.beat_age_ms is not None and s.beat_age_ms <= SHARD_STALE_MS,
                        "lastBeatMsAgo": s.beat_age_ms, "boots": s.boots,
                        "restarts": s.restarts} for s in shards],
            "postgres": server,
        }
