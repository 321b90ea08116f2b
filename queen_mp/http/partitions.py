"""``POST /api/v1/partitions/changed`` (docs/api.md 2.15): partition discovery.

The one route that lists partition names: per queue, every partition (no ``since``) or those
written at or after ``since``, in creation order, a page of ``limit`` (<= 1,000) at a time, with
the cursor of the next page in ``next`` (null when the pass is over). Each page is its own
autocommit statement (``log_partitions_changed_v1``, sql/functions/reads.sql); nothing is
written, no lease or cursor is touched.

Answer ``200``::

    {"safeTime": ISO, "safeTimeDegraded": bool,
     "entries": [{"queue", "partitions": [{"name", "id", "lastOffset", "logStart",
                                            "lastWriteAt"}], "next", "error"?}]}

``safeTime``: every write committed after this answer is stamped at or after it, so asking
again with ``since = safeTime`` misses nothing (in-flight transactions hold it back; see
reads.sql). It is the smallest of the entries' pages (an empty ``entries`` still answers one),
in milliseconds rounded down. ``safeTimeDegraded`` says PostgreSQL hid other roles' sessions
from the broker, so safeTime fell back to a floor well below now. ``lastOffset`` is the offset
of the partition's last message (0: none), ``logStart`` the oldest offset retention kept,
``lastWriteAt`` the createdAt of its newest message (null: never written); a partition is
listed under ``since`` when ``lastWriteAt >= since``. ``error`` is ``UNKNOWN_TOPIC_OR_PARTITION``
when the queue does not exist for this tenant or has no partition.

Errors of the whole call: ``400`` (malformed body, more than 64 entries, a bad ``since``,
``limit`` or ``after``), ``413``, ``503``.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import read_procs
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import JSON_UTF8
from queen_mp.models.reads import ChangedEntry, parse_changed
from queen_mp.wire.times import iso_ms

__all__ = ["SCAN_PER_PAGE", "PartitionsChangedResource"]

#: Partitions examined per page at most: a selective ``since`` over a large queue answers a
#: short page with a ``next`` rather than one long statement.
SCAN_PER_PAGE = 10_000


def _entry(entry: ChangedEntry, page: read_procs.ChangedPage) -> dict[str, Any]:
    if not page.known:
        return {"queue": entry.queue, "error": "UNKNOWN_TOPIC_OR_PARTITION", "partitions": [],
                "next": None}
    return {"queue": entry.queue,
            "partitions": [{"name": p.name, "id": str(p.id), "lastOffset": p.last_offset,
                            "logStart": p.log_start, "lastWriteAt": iso_ms(p.last_write_at)}
                           for p in page.partitions],
            "next": None if page.next is None else str(page.next)}


class PartitionsChangedResource:
    """``POST /api/v1/partitions/changed``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker
        # NOTE(reads): the fallback when pg_stat_activity is masked must outlast any write
        # transaction: twice the statement timeout, at least a minute
        self.floor_s = max(60, 2 * -(-worker.config.pg_statement_timeout_ms // 1000))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        entries = parse_changed(await read_body(req, self.worker.config.max_body_mb << 20))
        tenant = tenant_of(req)

        async def pages(conn: Any) -> list[read_procs.ChangedPage]:
            if not entries:
                return [await read_procs.changed(conn, tenant, None, None, None, 1, 1,
                                                 self.floor_s)]
            return [await read_procs.changed(conn, tenant, e.queue, e.since, e.after, e.limit,
                                             SCAN_PER_PAGE, self.floor_s) for e in entries]

        got = await call_db(self.worker.pool, pages)
        resp.data = orjson.dumps({
            "safeTime": iso_ms(min(p.safe_time for p in got)),
            "safeTimeDegraded": any(p.degraded for p in got),
            "entries": [_entry(e, p) for e, p in zip(entries, got, strict=False)]})
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200
