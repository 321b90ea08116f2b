"""``POST /api/v1/configure``: create a queue or update some of its options (docs/api.md 2.7, 4).

Body ``{"queue", "namespace"?, "task"?, "options"?}``. The queue is created if needed (§4
defaults) and ONLY the options present are written; the others keep their stored values.
Option keys are the camelCase names of §4 or their snake_case aliases (``lease_time``); unknown
keys are not an error, they come back in ``ignoredOptions``; a ``null`` value counts as absent.
A wrong type or a value out of range is ``400`` with ``field`` = the key as sent. A non-null
``namespace``/``task`` replaces the stored (first derived, §1.9) value; ``"task": ""`` removes
the task. ``encryptionEnabled: true`` on a broker without a key (``QUEEN_ENCRYPTION_KEY``, or
the key file it creates at its first start: queen_mp/keyring.py) is ``400``.
``ttl`` other than its default 3600 and ``maxSize`` other than 0 are ``400`` (``FIXED``: upstream
acts on no ``ttl``; its ``maxSize`` is a per-partition cap that a background sweep enforces by
deleting the oldest segments, pending or leased, which this broker does not do).

Who sees a change when: pops and acks read the options in SQL on every call, so the next one
after the ``200`` uses them. Pushes decide encryption from ``queen_mp.front.queueflags``, memoised
per front worker for 5 s: a push may still use the previous ``encryptionEnabled`` for up to
5 s after the answer (in every front worker and instance, this one included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import admin_procs
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import InvalidRequest
from queen_mp.wire.binary_push import check_name

__all__ = ["FIXED", "OPTIONS", "ConfigureResource", "Option", "parse_options"]

_INT4_MAX = (1 << 31) - 1
_INT8_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Option:
    """One docs/api.md 4 option: its wire name, its snake_case alias and its type/range."""

    name: str
    alias: str
    kind: type  # bool or int
    minimum: int = 0
    maximum: int = _INT4_MAX


OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option("leaseTime", "lease_time", int),
    Option("retryLimit", "retry_limit", int),
    Option("deadLetterQueue", "dead_letter_queue", bool),
    Option("dlqAfterMaxRetries", "dlq_after_max_retries", bool),
    Option("dedupWindow", "dedup_window", int),
    Option("retentionSeconds", "retention_seconds", int),
    Option("completedRetentionSeconds", "completed_retention_seconds", int),
    Option("encryptionEnabled", "encryption_enabled", bool),
    Option("delayedProcessing", "delayed_processing", int),
    Option("windowBuffer", "window_buffer", int),
    Option("priority", "priority", int, -(1 << 31), _INT4_MAX),
    Option("maxSize", "max_size", int, 0, _INT8_MAX),
    Option("retryDelay", "retry_delay", int),
    Option("ttl", "ttl", int),
    Option("maxWaitTimeSeconds", "max_wait_time_seconds", int),
    Option("retentionEnabled", "retention_enabled", bool),
)}
_BY_ALIAS = {o.alias: o for o in OPTIONS.values()}
#: options kept for upstream compatibility that this broker cannot honour: only their stored
#: value is accepted (a client echoing the options it read back still works), any other value
#: is refused rather than silently kept (issue 27)
FIXED: dict[str, tuple[int, str]] = {
    "ttl": (3600, "upstream stores ttl and nothing acts on it; use maxWaitTimeSeconds (evicts "
                  "messages that waited too long) or retentionSeconds with retentionEnabled "
                  "(deletes old messages)"),
    "maxSize": (0, "upstream caps each partition's pending messages by a background sweep "
                   "that deletes the oldest segments past the cap (leased ones included); this "
                   "broker has no such sweep, so use retentionSeconds with retentionEnabled, "
                   "or maxWaitTimeSeconds, to bound a queue"),
}


def _check(opt: Option, key: str, value: Any) -> Any:
    if opt.kind is bool:
        if not isinstance(value, bool):
            raise InvalidRequest(f"option {key!r} must be a boolean", field=key)
        return value
    # NOTE(admin): bool is an int subclass; JSON true is not an integer here.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(f"option {key!r} must be an integer", field=key)
    if not opt.minimum <= value <= opt.maximum:
        raise InvalidRequest(f"option {key!r} = {value} is out of range "
                             f"{opt.minimum}..{opt.maximum}", field=key)
    fixed = FIXED.get(opt.name)
    if fixed is not None and value != fixed[0]:
        raise InvalidRequest(f"option {key!r} = {value} is not supported (only {fixed[0]}, its "
                             f"default, is accepted): {fixed[1]}", field=key)
    return value


def parse_options(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the given options by camelCase name, the unknown keys in body order)."""
    given: dict[str, Any] = {}
    sent_as: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in raw.items():
        opt = OPTIONS.get(key) or _BY_ALIAS.get(key)
        if opt is None:
            ignored.append(key)
            continue
        if value is None:
            continue
        value = _check(opt, key, value)
        if opt.name in given and given[opt.name] != value:
            raise InvalidRequest(f"options {sent_as[opt.name]!r} and {key!r} disagree",
                                 field=key)
        given[opt.name] = value
        sent_as[opt.name] = key
    return given, ignored


def _text(doc: dict[str, Any], field: str) -> str | None:
    value = doc.get(field)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{field!r} must be a string or null", field=field)
    return value


class ConfigureResource:
    """``POST /api/v1/configure``."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await read_body(req, self.worker.config.max_body_mb << 20)
        try:
            doc = orjson.loads(body) if body.strip() else None
        except orjson.JSONDecodeError as ex:
            raise InvalidRequest(f"body is not valid JSON: {ex}") from None
        if not isinstance(doc, dict):
            raise InvalidRequest("body must be a JSON object with a 'queue'")
        queue = _text(doc, "queue")
        if queue is None:
            raise InvalidRequest("'queue' is required", field="queue")
        check_name(queue, "queue")
        namespace = _text(doc, "namespace")
        if namespace is not None:
            check_name(namespace, "namespace", slash_ok=True)
        task = _text(doc, "task")
        if task:  # NOTE(admin): "" is allowed: it removes the task
            check_name(task, "task", slash_ok=True)
        raw = doc.get("options")
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise InvalidRequest("'options' must be a JSON object", field="options")
        options, ignored = parse_options(raw)
        if options.get("encryptionEnabled") and self.worker.cipher is None:
            raise InvalidRequest("encryptionEnabled needs an encryption key on the broker "
                                 "(QUEEN_ENCRYPTION_KEY, or the key file its start log names)",
                                 field="encryptionEnabled")

        tenant = tenant_of(req)

        async def run(conn: Any) -> dict[str, Any]:
            try:
                return await admin_procs.configure(conn, tenant, queue, namespace, task,
                                                   options)
            except admin_procs.InvalidOption as ex:  # NOTE(admin): only if SQL is stricter
                raise InvalidRequest(f"refused by the database: {ex}",
                                     field=ex.field) from None

        res = await call_db(self.worker.pool, run)
        resp.status = falcon.HTTP_200
        resp.media = {"configured": True, "created": bool(res["created"]),
                      "queue": res["queue"], "queueId": str(res["queueId"]),
                      "namespace": res["namespace"], "task": res["task"] or "",
                      "options": {name: res["options"][name] for name in OPTIONS},
                      "ignoredOptions": ignored}
