"""The falcon ASGI application of a front worker.

``create_app`` assembles everything from a ``Config`` and a ``Runtime`` and injects the
per-process ``FrontWorker`` (rings, pool, metrics) into the resources; nothing here reads the
environment at import. Gunicorn loads ``queen_mp.http.app:app_from_env()`` in each worker, so each
worker builds its own app after fork.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import falcon.media
import orjson

from queen_mp.auth import Verifier
from queen_mp.config import Config
from queen_mp.front.worker import FrontWorker
from queen_mp.http import ephemeral, errors, groups, resources
from queen_mp.http.ack import AckBatchResource, AckResource
from queen_mp.http.admission import Admission
from queen_mp.http.authz import Authz
from queen_mp.http.configure import ConfigureResource
from queen_mp.http.console import (
    CONSOLE_PATH,
    ConsoleAssetResource,
    ConsoleResource,
    RootResource,
    load_assets,
)
from queen_mp.http.dlq import DlqResource, DlqRetryResource, RetryResource
from queen_mp.http.edge import EdgeMiddleware
from queen_mp.http.errors import JSON_UTF8
from queen_mp.http.fetch import FetchResource
from queen_mp.http.health import HealthResource
from queen_mp.http.hot import HotRoutes
from queen_mp.http.kv import KvResource
from queen_mp.http.leases import LeaseExtendResource
from queen_mp.http.locks import LocksResource
from queen_mp.http.messages import MessageResource, MessagesResource, QueueMessagesResource
from queen_mp.http.metrics import MetricsJsonResource, PrometheusResource
from queen_mp.http.openapi import OPENAPI_PATH, OpenApiResource
from queen_mp.http.partitions import PartitionsChangedResource
from queen_mp.http.pop import PopResource
from queen_mp.http.push import PushResource
from queen_mp.http.streams import CycleResource, QueriesResource, StateGetResource
from queen_mp.http.system import (
    MaintenanceResource,
    PopMaintenanceResource,
    SpoolDrainResource,
    SpoolResource,
)
from queen_mp.http.timers import TimerQueueResource, TimerResource, TimersResource
from queen_mp.http.traces import (
    MessageTracesResource,
    TraceNamesResource,
    TracesByNameResource,
    TracesResource,
)
from queen_mp.http.transaction import TransactionResource
from queen_mp.runtime import Runtime

__all__ = ["app_from_env", "create_app"]


class Lifespan:
    """Opens the worker's resources after fork and closes them in reverse at shutdown."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def process_startup(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        await self.worker.start()

    async def process_shutdown(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        await self.worker.stop()


def _json_handlers() -> falcon.media.Handlers:
    json = falcon.media.JSONHandler(dumps=lambda o: orjson.dumps(o).decode(), loads=orjson.loads)
    return falcon.media.Handlers({falcon.MEDIA_JSON: json, JSON_UTF8: json})


_HTTP_VERSIONS = frozenset({"1.0", "1.1", "2", "3"})  # falcon's _validate_asgi_scope


class App(falcon.asgi.App):
    """falcon's ASGI app, answering 400 to an HTTP version that falcon would raise on.

    uvicorn's h11 passes any ``HTTP/d.d`` request line; falcon raises UnsupportedError for a
    version other than 1.0, 1.1, 2, 3 before any handler runs, and uvicorn answers that with
    a bare 500 (found by tests/fuzz)."""

    #: the hot routes, answered without falcon's request machinery (queen_mp/http/hot.py)
    hot: HotRoutes | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        version = scope.get("http_version", "1.1")
        if version in _HTTP_VERSIONS:
            hot = self.hot
            call = hot.match(scope) if hot is not None else None
            if hot is not None and call is not None:
                await hot.serve(call, receive, send)
            else:
                await super().__call__(scope, receive, send)
            return
        err = errors.InvalidRequest(f"HTTP/{version} is not supported (HTTP/1.0 or 1.1)")
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", JSON_UTF8.encode()),
                                (b"access-control-allow-origin", b"*")]})
        await send({"type": "http.response.body", "body": orjson.dumps(err.to_dict())})


def create_app(config: Config, runtime: Runtime, worker: FrontWorker | None = None
               ) -> falcon.asgi.App:
    worker = worker or FrontWorker(config, runtime)
    # NOTE(auth): right after the edge (OPTIONS, CORS) and before admission, so a request
    # refused 401/403 never takes admission permits nor reads its body.
    authz = Authz(Verifier.from_config(config))
    edge, admission = EdgeMiddleware(worker), Admission.for_worker(worker)
    worker.disk_used = admission.disk_pct  # the disk gauge shows what admission sees
    app = App(media_type=JSON_UTF8, middleware=[Lifespan(worker), edge, authz, admission])
    authz.bind(app)
    app.req_options.media_handlers = _json_handlers()
    app.resp_options.media_handlers = _json_handlers()
    app.req_options.strip_url_path_trailing_slash = True
    # NOTE(queen): falcon's own HTTPError handler is more specific than Exception; take it
    # over too so that routing errors (405, 404) render in our JSON shape.
    app.add_error_handler(Exception, errors.handle_error)
    app.add_error_handler(falcon.HTTPError, errors.handle_error)

    app.add_route("/health", HealthResource(worker))
    app.add_route("/metrics", MetricsJsonResource(worker))
    app.add_route("/metrics/prometheus", PrometheusResource(worker))
    app.add_route(OPENAPI_PATH, OpenApiResource())  # public, like /health
    assets = load_assets(config)  # public too: the files hold no data (docs/console.md)
    app.add_route("/", RootResource())
    app.add_route(CONSOLE_PATH, ConsoleResource(assets))
    app.add_route(CONSOLE_PATH + "/{asset:path}", ConsoleAssetResource(assets))
    push = PushResource(worker)
    app.add_route("/api/v1/push", push)
    app.add_route("/api/v1/consumer-groups", groups.GroupsResource(worker))
    # the literal 'lagging' segment wins over {group} in falcon's router
    app.add_route("/api/v1/consumer-groups/lagging", groups.LaggingResource(worker))
    app.add_route("/api/v1/consumer-groups/{group}", groups.GroupResource(worker))
    app.add_route("/api/v1/consumer-groups/{group}/subscription",
                  groups.SubscriptionResource(worker))
    app.add_route("/api/v1/consumer-groups/{group}/queues/{queue}",
                  groups.GroupQueueResource(worker))
    app.add_route("/api/v1/consumer-groups/{group}/queues/{queue}/seek",
                  groups.SeekResource(worker))
    pop = PopResource(worker)
    app.add_route("/api/v1/pop", pop)
    app.add_route("/api/v1/pop/queue/{queue}", pop, suffix="queue")
    app.add_route("/api/v1/pop/queue/{queue}/partition/{partition:path}", pop,
                  suffix="partition")
    app.add_route("/api/v1/lease/{lease_id}/extend", LeaseExtendResource(worker))
    ack, ack_batch = AckResource(worker), AckBatchResource(worker)
    app.add_route("/api/v1/ack", ack)
    app.add_route("/api/v1/ack/batch", ack_batch)
    app.add_route("/api/v1/transaction", TransactionResource(worker))
    app.add_route("/api/v1/kv", KvResource(worker))
    app.add_route("/api/v1/timers", TimersResource(worker))
    app.add_route("/api/v1/timers/{queue}", TimerQueueResource(worker))
    # NOTE(timers): the key is the rest of the path, so it keeps its '/'
    app.add_route("/api/v1/timers/{queue}/{timer_key:path}", TimerResource(worker))
    app.add_route("/api/v1/locks", LocksResource(worker))
    app.add_route("/api/v1/traces", TracesResource(worker))
    # NOTE(traces): the literal 'names' and 'by-name' segments win over {partition_id}; a
    # trace name and a transactionId keep their '/' (the clients leave '/' unquoted)
    app.add_route("/api/v1/traces/names", TraceNamesResource(worker))
    app.add_route("/api/v1/traces/by-name/{name:path}", TracesByNameResource(worker))
    app.add_route("/api/v1/traces/{partition_id}/{transaction_id:path}",
                  MessageTracesResource(worker))
    app.add_route("/api/v1/fetch", FetchResource(worker))
    app.add_route("/api/v1/partitions/changed", PartitionsChangedResource(worker))
    lean = ephemeral.add_routes(app, worker)  # /api/v1/ephemeral/*
    app.add_route("/api/v1/dlq", DlqResource(worker))
    app.add_route("/api/v1/dlq/retry", DlqRetryResource(worker))
    # NOTE(dlq): plain {transaction_id}: a path converter cannot be followed by /retry, and
    # the two templates must agree at that level (so a transactionId with '/' is unroutable).
    app.add_route("/api/v1/messages", MessagesResource(worker))
    # NOTE(messages): one resource per template: messages.MessageResource is the DLQ delete
    # (dlq.MessageResource) plus the GET of docs/api.md 2.9.
    app.add_route("/api/v1/messages/{partition_id}/{transaction_id}", MessageResource(worker))
    app.add_route("/api/v1/messages/{partition_id}/{transaction_id}/retry",
                  RetryResource(worker))
    app.add_route("/api/v1/configure", ConfigureResource(worker))
    app.add_route("/api/v1/resources/overview", resources.OverviewResource(worker))
    app.add_route("/api/v1/resources/queues", resources.QueuesResource(worker))
    app.add_route("/api/v1/resources/queues/{queue}", resources.QueueResource(worker))
    app.add_route("/api/v1/resources/queues/{queue}/depth", resources.DepthResource(worker))
    app.add_route("/api/v1/resources/queues/{queue}/purge", resources.PurgeResource(worker))
    app.add_route("/api/v1/resources/namespaces", resources.NamespacesResource(worker))
    app.add_route("/api/v1/resources/tasks", resources.TasksResource(worker))
    app.add_route("/api/v1/resources/partitions", resources.PartitionsResource(worker))
    app.add_route("/api/v1/status", resources.StatusResource(worker))
    app.add_route("/api/v1/status/queues", resources.StatusQueuesResource(worker))
    app.add_route("/api/v1/status/queues/{queue}", resources.StatusQueueResource(worker))
    app.add_route("/api/v1/status/queues/{queue}/messages", QueueMessagesResource(worker))
    app.add_route("/api/v1/status/analytics", resources.AnalyticsResource(worker))
    app.add_route("/api/v1/status/system", resources.StatusSystemResource(worker))
    app.add_route("/api/v1/stats/refresh", resources.StatsRefreshResource(worker))
    app.add_route("/api/v1/system/maintenance", MaintenanceResource(worker))
    app.add_route("/api/v1/system/maintenance/pop", PopMaintenanceResource(worker))
    spool = SpoolResource(worker)
    app.add_route("/api/v1/system/spool", spool)
    app.add_route("/api/v1/status/buffers", spool)
    app.add_route("/api/v1/system/spool/drain", SpoolDrainResource(worker))
    app.add_route("/streams/v1/queries", QueriesResource(worker))
    app.add_route("/streams/v1/state/get", StateGetResource(worker))
    app.add_route("/streams/v1/cycle", CycleResource(worker))
    app.add_sink(_not_found, prefix="/")
    app.hot = HotRoutes(app._router.find, app.req_options.strip_url_path_trailing_slash,
                        edge, authz, admission, push, pop, ack, ack_batch, lean)
    return app


async def _not_found(req: falcon.asgi.Request, resp: falcon.asgi.Response, **_: Any) -> None:
    raise errors.NotFound(f"no route for {req.method} {req.path}")


def app_from_env() -> falcon.asgi.App:
    """Gunicorn's factory: the supervisor exported the resolved settings and runtime."""
    return create_app(Config.load(), Runtime.from_env())
