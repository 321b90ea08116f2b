"""The edge of every answer: CORS, OPTIONS, and the count of requests by route template.

Falcon runs it as the first middleware; the hot routes (queen_mp/http/hot.py) call
``account`` and add the CORS header themselves.
"""

from __future__ import annotations

import time

import falcon
import falcon.asgi

from queen_mp.front.worker import FrontWorker

__all__ = ["EdgeMiddleware"]


class EdgeMiddleware:
    """CORS on every answer, OPTIONS as 204, and request accounting by route template."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def process_request(self, req: falcon.asgi.Request,
                              resp: falcon.asgi.Response) -> None:
        req.context.started = time.perf_counter()
        if req.method == "OPTIONS":
            resp.status = falcon.HTTP_204
            resp.set_header("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
            resp.set_header("Access-Control-Allow-Headers",
                            req.get_header("Access-Control-Request-Headers") or "*")
            resp.complete = True

    async def process_response(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                               resource: object, req_succeeded: bool) -> None:
        resp.set_header("Access-Control-Allow-Origin", "*")
        if req.method != "OPTIONS":
            self.account(req.uri_template or "unmatched", resp.status_code, req.context.started)

    def account(self, route: str, status: int, started: float) -> None:
        """Count an answered request of ``route`` (a template) begun at ``started``
        (``time.perf_counter``)."""
        metrics = self.worker.metrics
        if metrics is None:
            return
        metrics.tally.inc(metrics.http_requests, (route, str(status)))
        metrics.tally.observe(metrics.http_latency, (route,), time.perf_counter() - started)
