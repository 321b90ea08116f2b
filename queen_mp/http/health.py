"""``GET /health``: PostgreSQL answers within 2 s and every shard beats, else 503.

The maintenance switches come from the instance's flags board (queen_mp/ipc/flags.py), what
the push path obeys; the database probe's own reading is used only until the board was filled
once.
"""

from __future__ import annotations

import asyncio
import time

import falcon
import falcon.asgi

from queen_mp import __version__
from queen_mp.db import procs
from queen_mp.front.worker import FrontWorker

__all__ = ["HealthResource"]

_PROBE_TIMEOUT_S = 2.0


class HealthResource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        alive, total = w.shards_alive(), w.runtime.shards
        flags = w.flags.read()
        body: dict[str, object] = {
            "status": "healthy", "database": "connected", "version": __version__,
            "uptimeSeconds": int(time.time() - w.runtime.started_at),
            "maintenanceMode": flags.push, "popMaintenanceMode": flags.pop,
            "shards": {"alive": alive, "total": total},
            "instance": w.config.instance_name,
            "workerId": w.slot, "worker_id": w.slot,
        }
        problem: str | None = None
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT_S):
                async with w.pool.connection() as conn:
                    probe = await procs.health(conn)
            if not flags.known:
                body["maintenanceMode"] = probe["maintenance"]
                body["popMaintenanceMode"] = probe["popMaintenance"]
            body["databaseHost"] = probe["server"]
            body["databaseWritable"] = not probe["inRecovery"]
        except Exception as ex:
            body["database"] = "disconnected"
            problem = f"database connection failed: {type(ex).__name__}: {ex}".strip()
        if problem is None and alive < total:
            problem = f"{total - alive} of {total} shard processes not alive"
        if problem is not None:
            body.update(status="unhealthy", error=problem, code="unavailable")
            resp.status = falcon.HTTP_503
        resp.media = body
