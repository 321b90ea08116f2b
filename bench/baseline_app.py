"""The naive baseline broker: one PostgreSQL transaction (one commit, one WAL flush) per request.

A falcon ASGI app served exactly like queen-mp's front (gunicorn with
``queen_mp.processes.arbiter.front_argv``: same worker class, worker count, keep-alive and
timeouts; see ``bench/push.py``). ``POST /api/v1/push`` takes queen's JSON body
``{"items":[{queue, partition, transactionId?, payload}]}``, inserts one row per item into
``naive.messages`` with a single set-based ``INSERT ... SELECT FROM unnest(...)`` (one round
trip, one commit per request, ``synchronous_commit=on``) and answers ``201`` with one result per
item in the same shape queen-mp renders, so both arms pay the same JSON cost.

There is no cross-request batching, no partition bookkeeping and no deduplication: this is the
"obvious" implementation the broker is measured against, not a product. The table is created by
the benchmark (``SCHEMA_SQL``); the app only reads ``BENCH_BASELINE_DSN`` and
``BENCH_BASELINE_POOL`` (connections per worker process, default 16).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import falcon
import falcon.asgi
import falcon.media
import orjson
from psycopg_pool import AsyncConnectionPool

__all__ = ["INSERT_SQL", "SCHEMA_SQL", "app_from_env", "create_app"]

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS naive;
CREATE TABLE IF NOT EXISTS naive.messages (
    id         bigserial PRIMARY KEY,
    queue      text NOT NULL,
    partition  text NOT NULL,
    txn        text,
    payload    jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- The least a broker needs to read a partition in order.
CREATE INDEX IF NOT EXISTS messages_queue_partition_id ON naive.messages (queue, partition, id);
"""

INSERT_SQL = """
INSERT INTO naive.messages (queue, partition, txn, payload)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]::jsonb[])
RETURNING id, created_at
"""


class BadRequest(falcon.HTTPBadRequest):
    pass


def _iso(ts: dt.datetime) -> str:
    t = ts.astimezone(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class Lifespan:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def process_startup(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        await self.pool.open(wait=True, timeout=30)

    async def process_shutdown(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        await self.pool.close()


class Health:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "healthy", "pid": os.getpid()}


class Push:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await req.stream.read()
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as ex:
            raise BadRequest(description=f"body is not valid JSON: {ex}") from None
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise BadRequest(description="body must be an object with an 'items' array")
        if not items:
            resp.status = falcon.HTTP_201
            resp.media = []
            return
        queues, partitions, txns, payloads = [], [], [], []
        for i, it in enumerate(items):
            if not isinstance(it, dict) or not isinstance(it.get("queue"), str):
                raise BadRequest(description=f"item {i}: 'queue' must be a string")
            queues.append(it["queue"])
            partitions.append(it.get("partition") or "Default")
            txns.append(it.get("transactionId"))
            value = it["payload"] if "payload" in it else it.get("data")
            payloads.append(None if value is None else orjson.dumps(value).decode())
        # autocommit: the single statement is the transaction, so exactly one commit.
        async with self.pool.connection() as conn:
            cur = await conn.execute(INSERT_SQL, (queues, partitions, txns, payloads),
                                     prepare=True)
            rows = await cur.fetchall()
        # ids come from one nextval() per row in input order: sorted ids map back to items.
        rows.sort()
        out = []
        for i, (mid, created) in enumerate(rows):
            m = str(mid)
            txn = txns[i] or m
            out.append({"index": i, "status": "queued", "messageId": m, "transactionId": txn,
                        "queue": queues[i], "partition": partitions[i], "partitionId": None,
                        "offset": mid, "createdAt": _iso(created), "traceId": None,
                        "error": None, "message_id": m, "transaction_id": txn,
                        "partition_id": None, "trace_id": None, "queueName": queues[i]})
        resp.status = falcon.HTTP_201
        resp.media = out


def _json_handlers() -> falcon.media.Handlers:
    json = falcon.media.JSONHandler(dumps=lambda o: orjson.dumps(o).decode(), loads=orjson.loads)
    return falcon.media.Handlers({falcon.MEDIA_JSON: json, "application/json": json})


def create_app(dsn: str, pool_size: int = 16) -> falcon.asgi.App:
    pool = AsyncConnectionPool(
        dsn, min_size=pool_size, max_size=pool_size, open=False,
        kwargs={"autocommit": True, "application_name": "bench-baseline",
                "options": "-c synchronous_commit=on"},
        name=f"baseline-{os.getpid()}")
    app = falcon.asgi.App(middleware=[Lifespan(pool)])
    app.req_options.media_handlers = _json_handlers()
    app.resp_options.media_handlers = _json_handlers()
    app.add_route("/health", Health())
    app.add_route("/api/v1/push", Push(pool))
    return app


def app_from_env() -> falcon.asgi.App:
    """Gunicorn's factory (``bench.baseline_app:app_from_env()``), called in each worker."""
    return create_app(os.environ["BENCH_BASELINE_DSN"],
                      int(os.environ.get("BENCH_BASELINE_POOL", "16")))
