"""``GET /metrics/prometheus`` (every process's samples) and ``GET /metrics`` (JSON summary)."""

from __future__ import annotations

import asyncio
import time

import falcon
import falcon.asgi
from prometheus_client.parser import text_string_to_metric_families

from queen_mp.front.worker import FrontWorker
from queen_mp.metrics import render_latest

__all__ = ["MetricsJsonResource", "PrometheusResource"]


class PrometheusResource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        self.worker.refresh_gauges()  # this worker's pool and disk figures as of now
        # PERF(queen): collecting reads one file per process; keep it off the event loop.
        body = await asyncio.to_thread(render_latest, self.worker.runtime.metrics_dir)
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.data = body


def _totals(text: str) -> dict[str, float]:
    """Sum every sample of a family over its labels, and keep each ``name{result}`` too."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if "result" in sample.labels:
                key = f"{sample.name}{{{sample.labels['result']}}}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


class MetricsJsonResource:
    """The shape the 2.6 client's ``Admin.metrics()`` reads (docs/api.md 2.12)."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        text = (await asyncio.to_thread(render_latest, w.runtime.metrics_dir)).decode()
        t = _totals(text)
        uptime = max(1.0, time.time() - w.runtime.started_at)
        commits = t.get("queen_fusion_commits_total", 0.0)
        segments = t.get("queen_fusion_segments_total", 0.0)
        pushed = t.get("queen_batch_items_fired_total", 0.0)
        requests = t.get("queen_http_requests_total", 0.0)
        stats = w.pool.get_stats() if w.pool is not None else {}
        resp.media = {
            "uptime": int(uptime),
            "requests": {"total": int(requests), "rate": requests / uptime},
            "messages": {"pushed": int(pushed),
                         "popped": int(t.get("queen_messages_popped_total", 0.0)),
                         "acked": int(t.get("queen_messages_acked_total", 0.0)),
                         "evicted": int(t.get("queen_messages_evicted_total", 0.0)),
                         "pushRate": pushed / uptime},
            "database": {"poolSize": stats.get("pool_size", 0),
                         "idleConnections": stats.get("pool_available", 0),
                         "waitingRequests": stats.get("requests_waiting", 0)},
            "fusion": {"commits": int(commits), "segments": int(segments),
                       "segmentsPerCommit": segments / commits if commits else 0.0},
            "ackFusion": {"commits": int(t.get("queen_ack_fusion_commits_total", 0.0)),
                          "rows": int(t.get("queen_ack_fusion_rows_total", 0.0))},
            "ackRegistry": {"hits": int(t.get("queen_ack_registry_lookups_total{hit}", 0.0)),
                            "misses": int(t.get("queen_ack_registry_lookups_total{miss}",
                                                0.0))},
            "spool": {"pending": int(t.get("queen_spool_pending", 0.0)), "failed": 0},
            "parkedPops": int(t.get("queen_parked_pops", 0.0)),
        }
