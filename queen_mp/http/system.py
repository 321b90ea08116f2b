"""Maintenance switches and the disk spool (docs/api.md 5).

=====================================================  ==========================================
``GET  /api/v1/system/maintenance``                    switches + spool summary
``POST /api/v1/system/maintenance``  ``{"enabled"}``   push maintenance on/off
``GET  /api/v1/system/maintenance/pop``                pop switch
``POST /api/v1/system/maintenance/pop`` ``{"enabled"}``  pop maintenance on/off
``GET  /api/v1/system/spool``, ``/api/v1/status/buffers``  spool status
``POST /api/v1/system/spool/drain`` ``{"retryFailed"}``   replay now (``202``; ``409`` in
                                                       push maintenance)
=====================================================  ==========================================

The switches live in ``queen.system_settings`` (sql/functions/system.sql): a POST changes them
there (which NOTIFYs every instance) and publishes the answer on this instance's flags board at
once; a GET reads them from PostgreSQL (the board when PostgreSQL does not answer). Spool
figures are this instance's (each instance has its own spool directory).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.front.spooldrain import DrainStatus, spool_status
from queen_mp.front.worker import FrontWorker
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import JSON_UTF8, ApiError, Conflict, InvalidRequest, Unavailable
from queen_mp.ipc.wakeup import fetch_flags, publish_flags, set_maintenance
from queen_mp.spool import SpoolBusyError, SpoolError
from queen_mp.wire.times import iso_from_us

__all__ = ["MaintenanceResource", "PopMaintenanceResource", "SpoolDrainResource",
           "SpoolResource"]

_BODY_LIMIT = 1 << 20
_DB_PROBE_S = 1.0


def _reply(resp: falcon.asgi.Response, body: Any, status: str = falcon.HTTP_200) -> None:
    resp.data = orjson.dumps(body)
    resp.content_type = JSON_UTF8
    resp.status = status


async def _body(req: falcon.asgi.Request) -> dict[str, Any]:
    raw = await read_body(req, _BODY_LIMIT)
    if not raw.strip():
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as ex:
        raise InvalidRequest(f"body is not valid JSON: {ex}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    return doc


def _flag(doc: dict[str, Any], name: str, *, required: bool) -> bool | None:
    value = doc.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, bool):
        raise InvalidRequest(f'{name!r} must be true or false', field=name)
    return value


async def _status(w: FrontWorker) -> DrainStatus:
    return await asyncio.to_thread(spool_status, w.config.spool_path, w.flags)


def _disk_ok(w: FrontWorker) -> bool:
    """The spool's filesystem is below QUEEN_DISK_HIGH_PCT (docs/api.md 1.8)."""
    path = w.config.spool_path
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    if not st.f_blocks:
        return True
    used = 1 - st.f_bavail / st.f_blocks
    return used * 100 < w.config.disk_high_pct


async def _flags(w: FrontWorker) -> tuple[bool, bool]:
    """(push, pop) maintenance from PostgreSQL, refreshing the board; the board if PostgreSQL
    does not answer."""
    try:
        doc = await call_db(w.pool, fetch_flags)
    except ApiError:
        flags = w.flags.read()
        return flags.push, flags.pop
    publish_flags(w.flags, doc)
    return bool(doc["maintenance"]), bool(doc["popMaintenance"])


async def _switch(w: FrontWorker, kind: str, enabled: bool) -> dict[str, Any]:
    doc = await call_db(w.pool, lambda conn: set_maintenance(conn, kind, enabled))
    publish_flags(w.flags, doc)
    return doc


async def _db_healthy(w: FrontWorker) -> bool:
    try:
        async with asyncio.timeout(_DB_PROBE_S):
            await call_db(w.pool, lambda conn: conn.execute("SELECT 1"))
    except (ApiError, TimeoutError):
        return False
    return True


class MaintenanceResource:
    """``GET``/``POST /api/v1/system/maintenance``: push maintenance."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        (push, pop), st = await asyncio.gather(_flags(w), _status(w))
        _reply(resp, {"maintenanceMode": push, "popMaintenanceMode": pop,
                      "bufferedMessages": st.pending, "bufferHealthy": _disk_ok(w),
                      "spool": {"pending": st.pending, "failed": st.failed, "bytes": st.bytes,
                                "draining": st.draining}})

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        enabled = _flag(await _body(req), "enabled", required=True)
        assert enabled is not None
        doc = await _switch(w, "push", enabled)
        if not doc["maintenance"]:
            w.flags.request_drain()
        st = await _status(w)
        message = ("Maintenance mode enabled: pushes are written to the disk spool "
                   "(status buffered); transactions, KV and timer writes are refused"
                   if doc["maintenance"] else
                   "Maintenance mode disabled: buffered messages are being replayed")
        _reply(resp, {"maintenanceMode": bool(doc["maintenance"]),
                      "bufferedMessages": st.pending, "message": message})


class PopMaintenanceResource:
    """``GET``/``POST /api/v1/system/maintenance/pop``: pop maintenance."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        _, pop = await _flags(self.worker)
        _reply(resp, {"popMaintenanceMode": pop})

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        enabled = _flag(await _body(req), "enabled", required=True)
        assert enabled is not None
        doc = await _switch(self.worker, "pop", enabled)
        pop = bool(doc["popMaintenance"])
        message = ("Pop maintenance enabled: pops claim nothing (204)" if pop
                   else "Pop maintenance disabled: pops claim again")
        _reply(resp, {"popMaintenanceMode": pop, "message": message})


class SpoolResource:
    """``GET /api/v1/system/spool`` and ``GET /api/v1/status/buffers``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        st, healthy = await asyncio.gather(_status(w), _db_healthy(w))
        _reply(resp, {"pending": st.pending, "failed": st.failed, "files": st.files,
                      "bytes": st.bytes, "draining": st.draining,
                      "lastDrainAt": iso_from_us(st.last_drain_ms * 1000),
                      "dbHealthy": healthy})


class SpoolDrainResource:
    """``POST /api/v1/system/spool/drain``: replay now; ``retryFailed`` re-queues first."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        retry_failed = _flag(await _body(req), "retryFailed", required=False)
        if w.push_maintenance():
            raise Conflict("push maintenance is on: the spool drains when it ends")
        if retry_failed:
            try:
                await w.drainer.requeue_failed()
            except SpoolBusyError:
                pass  # another request is re-queueing them right now
            except SpoolError as ex:
                raise Unavailable(f"cannot re-queue the failed spool records: {ex}") from None
        w.flags.request_drain()
        st = await _status(w)
        _reply(resp, {"draining": True, "pending": st.pending}, falcon.HTTP_202)
