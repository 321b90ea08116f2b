"""The naive consume baseline: a PostgreSQL table polled with ``FOR UPDATE SKIP LOCKED``.

``bench/baseline_app.py`` (push: one ``INSERT ... SELECT FROM unnest`` and one commit per
request) plus the two consume routes the consume benchmark (``bench/consume.py``) needs, served
the same way (gunicorn with ``queen_mp.processes.arbiter.front_argv``: queen-mp's front options):

``GET /api/v1/pop/queue/{queue}?batch=n``
    one statement, one commit: ``SELECT id ... WHERE queue = $1 AND not leased ORDER BY id
    LIMIT n FOR UPDATE SKIP LOCKED`` feeding an ``UPDATE`` that leases the rows for 60 s under
    a fresh lease id, ``RETURNING`` them. ``200`` with ``{"success", "leaseId", "messages"}``
    (each message in queen-mp's field names, payload forwarded as stored), or ``204`` when
    nothing is claimable. No long poll: ``wait`` is ignored, a consumer must poll.
``POST /api/v1/ack/batch``
    ``{"acknowledgments":[{"id", "leaseId"}]}``: one ``DELETE ... WHERE id = ANY($1) AND
    lease_id = $2`` per lease id present (one per pop batch), autocommit, so one commit per
    request; ``200`` with one ``{"index", "success"}`` per item (false if the row was gone or
    leased under another id).

No partitions (``partition`` is stored and echoed, never used for ordering or locking), no
consumer groups, no retries, no dead letters, no cursor: what "a table of messages and SKIP
LOCKED" costs. ``SCHEMA_SQL`` extends ``baseline_app.SCHEMA_SQL`` with the lease columns and
the ``(queue, id)`` index such a poller needs; the benchmark creates it.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import falcon
import falcon.asgi
import orjson
from psycopg_pool import AsyncConnectionPool

from bench.baseline_app import SCHEMA_SQL as PUSH_SCHEMA_SQL
from bench.baseline_app import BadRequest, Health, Lifespan, Push, _iso, _json_handlers

__all__ = ["ACK_SQL", "POP_SQL", "SCHEMA_SQL", "app_from_env", "create_app"]

SCHEMA_SQL = PUSH_SCHEMA_SQL + """
ALTER TABLE naive.messages ADD COLUMN IF NOT EXISTS lease_id uuid;
ALTER TABLE naive.messages ADD COLUMN IF NOT EXISTS lease_until timestamptz;
-- A FIFO poller reads a queue in id order.
CREATE INDEX IF NOT EXISTS messages_queue_id ON naive.messages (queue, id);
"""

LEASE_S = 60

POP_SQL = f"""
WITH picked AS (
    SELECT id FROM naive.messages
    WHERE queue = %s AND (lease_until IS NULL OR lease_until < now())
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE naive.messages m
SET lease_id = %s, lease_until = now() + interval '{LEASE_S} seconds'
FROM picked
WHERE m.id = picked.id
RETURNING m.id, m.partition, m.txn, m.payload::text, m.created_at, m.lease_until
"""

ACK_SQL = """
DELETE FROM naive.messages WHERE id = ANY(%s::int8[]) AND lease_id = %s RETURNING id
"""


class Pop:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def on_get_queue(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                           queue: str) -> None:
        try:
            batch = int(req.get_param("batch") or 1)
        except ValueError:
            raise BadRequest(description="batch must be an integer") from None
        if not 1 <= batch <= 10_000:
            raise BadRequest(description="batch must be 1..10000")
        lease = uuid.uuid4()
        async with self.pool.connection() as conn:
            cur = await conn.execute(POP_SQL, (queue, batch, lease), prepare=True)
            rows = await cur.fetchall()
        if not rows:
            resp.status = falcon.HTTP_204
            return
        rows.sort()
        lease_id = str(lease)
        expires = _iso(rows[0][5])
        group = req.get_param("consumerGroup") or "__QUEUE_MODE__"
        messages = [{"id": str(mid), "transactionId": txn or str(mid), "traceId": None,
                     "data": orjson.Fragment(payload) if payload is not None else None,
                     "producerSub": None, "createdAt": _iso(created), "queue": queue,
                     "partitionId": None, "partition": partition, "offset": mid,
                     "leaseId": lease_id, "consumerGroup": group, "deliveryAttempt": 1}
                    for mid, partition, txn, payload, created, _ in rows]
        resp.status = falcon.HTTP_200
        resp.data = orjson.dumps({"success": True, "queue": queue, "leaseId": lease_id,
                                  "leaseExpiresAt": expires, "consumerGroup": group,
                                  "messages": messages})
        resp.content_type = "application/json; charset=utf-8"


class AckBatch:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await req.stream.read()
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as ex:
            raise BadRequest(description=f"body is not valid JSON: {ex}") from None
        acks = doc.get("acknowledgments") if isinstance(doc, dict) else None
        if not isinstance(acks, list):
            raise BadRequest(description="body must be an object with an 'acknowledgments' "
                                         "array")
        by_lease: dict[str, list[int]] = {}
        ids: list[int] = []
        for i, a in enumerate(acks):
            try:
                mid, lease = int(a["id"]), str(a["leaseId"])
            except (KeyError, TypeError, ValueError):
                raise BadRequest(description=f"acknowledgment {i}: 'id' and 'leaseId' "
                                             "are required") from None
            by_lease.setdefault(lease, []).append(mid)
            ids.append(mid)
        deleted: set[int] = set()
        if by_lease:
            async with self.pool.connection() as conn:
                if len(by_lease) == 1:  # the usual case: one pop batch, one statement
                    (lease, mids), = by_lease.items()
                    cur = await conn.execute(ACK_SQL, (mids, lease), prepare=True)
                    deleted.update(r[0] for r in await cur.fetchall())
                else:
                    async with conn.transaction():
                        for lease, mids in by_lease.items():
                            cur = await conn.execute(ACK_SQL, (mids, lease), prepare=True)
                            deleted.update(r[0] for r in await cur.fetchall())
        out: list[dict[str, Any]] = [{"index": i, "success": mid in deleted,
                                      "error": None if mid in deleted else "not_leased"}
                                     for i, mid in enumerate(ids)]
        resp.status = falcon.HTTP_200
        resp.data = orjson.dumps(out)
        resp.content_type = "application/json; charset=utf-8"


def create_app(dsn: str, pool_size: int = 16) -> falcon.asgi.App:
    # The same pool settings as bench/baseline_app.create_app (autocommit, synchronous commit).
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
    app.add_route("/api/v1/pop/queue/{queue}", Pop(pool), suffix="queue")
    app.add_route("/api/v1/ack/batch", AckBatch(pool))
    return app


def app_from_env() -> falcon.asgi.App:
    """Gunicorn's factory (``bench.consume_baseline:app_from_env()``), called in each worker."""
    return create_app(os.environ["BENCH_BASELINE_DSN"],
                      int(os.environ.get("BENCH_BASELINE_POOL", "16")))
