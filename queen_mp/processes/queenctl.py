"""``queenctl``: operate a running queen-mp broker over its HTTP API (docs/api.md 2.8, 2.10,
2.12, 5).

Commands::

    queenctl health [--wait SECONDS]
    queenctl maintenance on|off|status [--pop]
    queenctl spool status | drain [--retry-failed]
    queenctl queues list [--namespace N] [--task T] | show QUEUE
                    | configure QUEUE --set key=value ... | delete QUEUE [--yes]
    queenctl dlq list [--queue Q] [--group G] [--partition P] [--limit N] [--offset N]
                | retry PARTITION_ID TRANSACTION_ID [--group G]
                | delete PARTITION_ID TRANSACTION_ID [--group G]
    queenctl groups list | show GROUP | lag [--min-seconds N]
                   | seek GROUP QUEUE (--beginning | --end | --timestamp ISO)
    queenctl keys list | add [--standby] [--key-stdin] | use KEY_ID    [--file PATH]

``keys`` edits the broker's encryption key file on this machine (queen_mp/keyring.py), not
through the API; a broker uses a change from its next start.

Global options come before the command: ``--url`` (env ``QUEEN_URL``, default
``http://127.0.0.1:6632``), ``--token`` (env ``QUEEN_TOKEN``, sent as ``Authorization: Bearer``),
``--json`` (print the broker's raw JSON answer, for scripts), ``--timeout`` (seconds per request).
Output is an aligned table by default. An error answer ``{"error", "code"}`` is printed to stderr
as ``error: <code>: <text>`` (with ``--json`` its body also goes to stdout).

Exit codes:

- 0: success (``health``: the broker is healthy)
- 1: the broker answered an error (4xx other than 404, 5xx), or is unhealthy; or an aborted
  confirmation
- 2: usage error (bad options or arguments)
- 3: the broker is unreachable (connection refused, DNS, timeout)
- 4: not found (the broker answered 404: unknown queue, group, DLQ row or route)

Only the standard library speaks HTTP here (``urllib``): the tool has no dependency beyond
``click``, which the broker needs anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from queen_mp import keyring
from queen_mp.config import Config, ConfigError

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4
EXIT_UNHEALTHY = EXIT_ERROR  # kept for callers of the first version

DEFAULT_URL = "http://127.0.0.1:6632"

_EXIT_HELP = """\b
Exit codes:
  0  success (health: the broker is healthy)
  1  the broker answered an error, or is unhealthy
  2  usage error
  3  broker unreachable
  4  not found (404)"""

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


# -------------------------------------------------------------------------------- HTTP client
class Unreachable(Exception):
    """No HTTP answer at all: refused, unresolvable, reset or timed out."""


@dataclass
class Answer:
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class Client:
    url: str
    token: str | None
    timeout: float
    as_json: bool

    def call(self, method: str, path: str, *, query: dict[str, Any] | None = None,
             body: Any = None) -> Answer:
        """One request; any HTTP status comes back as an ``Answer``, no answer raises."""
        target = self.url + path
        params = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        if params:
            target += "?" + urllib.parse.urlencode(params)
        data = None
        headers = {"Accept": "application/json", "User-Agent": "queenctl"}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(target, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Answer(resp.status, _decode(resp.read()))
        except urllib.error.HTTPError as ex:
            with ex:
                return Answer(ex.code, _decode(ex.read()))
        except (urllib.error.URLError, OSError, ValueError) as ex:
            reason = getattr(ex, "reason", ex)
            raise Unreachable(f"broker unreachable at {self.url}: {reason}") from ex

    def require(self, method: str, path: str, **kw: Any) -> Any:
        """``call`` that exits on an error answer (1, or 4 for 404); returns the body."""
        answer = self.call(method, path, **kw)
        if not answer.ok:
            self.fail(answer)
        return answer.body

    def fail(self, answer: Answer) -> NoReturn:
        body = answer.body
        if self.as_json and body is not None:
            click.echo(json.dumps(body, indent=2))
        if isinstance(body, dict):
            code = body.get("code") or body.get("error") or f"http_{answer.status}"
            text = body.get("error") or body.get("message") or ""
            extra = {k: v for k, v in body.items()
                     if k in ("field", "limit", "index", "retryAfter", "reason", "detail")}
        else:
            code, text, extra = f"http_{answer.status}", str(body or ""), {}
        line = f"error: {code}: {text}".rstrip(": ")
        if extra:
            line += " (" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")"
        click.echo(line, err=True)
        sys.exit(EXIT_NOT_FOUND if answer.status == 404 else EXIT_ERROR)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _seg(value: str) -> str:
    """A path segment, percent-encoded (the broker decodes each segment)."""
    return urllib.parse.quote(str(value), safe="")


# ------------------------------------------------------------------------------------ output
def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value).replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; numbers right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [any(_is_number(r[i]) for r in cells)
               and all(_is_number(r[i]) or r[i] == "-" for r in cells)
               for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def fmt(row: Sequence[str]) -> str:
        parts = [(c.rjust(w) if numeric[i] else c.ljust(w))
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return "\n".join([fmt(list(headers))] + [fmt(r) for r in cells])


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d+)?", text))


def flatten(doc: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` as ``[("a.b", 1)]``; lists of scalars stay whole."""
    if isinstance(doc, dict):
        out: list[tuple[str, Any]] = []
        for key, value in doc.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.extend(flatten(value, name))
            else:
                out.append((name, value))
        return out
    return [(prefix or "value", doc)]


def key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {_cell(v)}".rstrip() for k, v in pairs)


def generic(doc: Any) -> str:
    """Best-effort table of an answer whose shape this tool does not know in detail."""
    if isinstance(doc, list):
        if not doc:
            return "(none)"
        if all(isinstance(r, dict) for r in doc):
            keys: list[str] = []
            for r in doc:
                keys.extend(k for k in r if k not in keys and not isinstance(r[k], (dict, list)))
            return table(keys, [[r.get(k) for k in keys] for r in doc])
        return "\n".join(_cell(v) for v in doc)
    if isinstance(doc, dict):
        return key_values(flatten(doc))
    return _cell(doc)


def emit(obj: Client, body: Any, render: Any) -> None:
    """``--json``: the raw answer; else ``render(body)`` (a string, or None to print nothing)."""
    if obj.as_json:
        click.echo(json.dumps(body, indent=2))
        return
    text = render(body)
    if text:
        click.echo(text)


def parse_value(raw: str) -> Any:
    """``--set`` values: ints, floats, true/false/yes/no/on/off, null; JSON for quoted strings,
    lists and objects; anything else is the string as typed."""
    text = raw.strip()
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("null", "none"):
        return None
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+)([eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+", text):
        return float(text)
    if text[:1] in ('"', "[", "{"):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return raw


def _parse_sets(values: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint="--set")
        out[key] = parse_value(raw)
    return out


# ----------------------------------------------------------------------------------- commands
@click.group(context_settings=CONTEXT_SETTINGS, epilog=_EXIT_HELP)
@click.option("--url", envvar="QUEEN_URL", default=DEFAULT_URL, show_default=True,
              help="Broker base URL [env QUEEN_URL].")
@click.option("--token", envvar="QUEEN_TOKEN", default=None,
              help="JWT sent as 'Authorization: Bearer' [env QUEEN_TOKEN].")
@click.option("--json", "as_json", is_flag=True, help="Print the broker's raw JSON answer.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to wait for each answer.")
@click.version_option(package_name="queen-mp", prog_name="queenctl")
@click.pass_context
def main(ctx: click.Context, url: str, token: str | None, as_json: bool, timeout: float) -> None:
    """Operate a queen-mp broker over its HTTP API."""
    ctx.obj = Client(url.rstrip("/"), token or None, timeout, as_json)


def _run(func: Any) -> Any:
    """Turn ``Unreachable`` into exit 3 for every command."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Unreachable as ex:
            click.echo(f"error: unreachable: {ex}", err=True)
            sys.exit(EXIT_UNREACHABLE)

    return wrapper


def command(group: click.Group, name: str | None = None, **kw: Any) -> Any:
    def deco(func: Any) -> Any:
        return group.command(name, context_settings=CONTEXT_SETTINGS, epilog=_EXIT_HELP,
                             **kw)(click.pass_obj(_run(func)))
    return deco


def subgroup(name: str, help: str) -> click.Group:
    grp = click.Group(name, help=help, context_settings=CONTEXT_SETTINGS, epilog=_EXIT_HELP)
    main.add_command(grp)
    return grp


# --- health
def _render_health(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    shards = body.get("shards") or {}
    rows = [("status", body.get("status")),
            ("database", f"{body.get('database')} {body.get('databaseHost') or ''}".rstrip()),
            ("shards", f"{shards.get('alive')}/{shards.get('total')}"),
            ("maintenance", body.get("maintenanceMode")),
            ("pop maintenance", body.get("popMaintenanceMode")),
            ("version", body.get("version")),
            ("uptime", f"{body.get('uptimeSeconds')}s"),
            ("instance", body.get("instance"))]
    if body.get("error"):
        rows.append(("error", f"{body.get('code', '')}: {body['error']}".lstrip(": ")))
    return key_values((k, v) for k, v in rows if v is not None)


@command(main)
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True,
              metavar="SECONDS",
              help="Retry until healthy for up to this long (readiness checks); 0 = ask once.")
def health(obj: Client, wait_s: float) -> None:
    """Is the broker healthy (PostgreSQL reachable, every shard alive)?

    Exit 0 healthy, 1 unhealthy (503), 3 unreachable.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            answer = obj.call("GET", "/health")
        except Unreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
            continue
        if answer.ok or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    emit(obj, answer.body, _render_health)
    if not answer.ok:
        if not isinstance(answer.body, dict) or "status" not in answer.body:
            obj.fail(answer)
        sys.exit(EXIT_NOT_FOUND if answer.status == 404 else EXIT_ERROR)


# --- maintenance
maintenance = subgroup("maintenance", "Push maintenance (pushes spool, transactions 503) and "
                                      "pop maintenance (pops claim nothing).")
_POP = click.option("--pop", is_flag=True, help="Pop maintenance instead of push maintenance.")


def _render_maintenance(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    msg = body.get("message")
    rest = {k: v for k, v in body.items() if k != "message"}
    text = key_values(flatten(rest))
    return f"{text}\n{msg}" if msg else text


def _set_maintenance(obj: Client, enabled: bool, pop: bool) -> None:
    path = "/api/v1/system/maintenance" + ("/pop" if pop else "")
    body = obj.require("POST", path, body={"enabled": enabled})
    emit(obj, body, _render_maintenance)


@command(maintenance, "on")
@_POP
def maintenance_on(obj: Client, pop: bool) -> None:
    """Turn (push or --pop) maintenance on, on every instance."""
    _set_maintenance(obj, True, pop)


@command(maintenance, "off")
@_POP
def maintenance_off(obj: Client, pop: bool) -> None:
    """Turn (push or --pop) maintenance off; the spool then drains."""
    _set_maintenance(obj, False, pop)


@command(maintenance, "status")
@_POP
def maintenance_status(obj: Client, pop: bool) -> None:
    """Show the maintenance flags and the spool."""
    path = "/api/v1/system/maintenance" + ("/pop" if pop else "")
    emit(obj, obj.require("GET", path), _render_maintenance)


# --- spool
spool = subgroup("spool", "The disk spool of pushes answered 'buffered'.")


@command(spool, "status")
def spool_status(obj: Client) -> None:
    """Pending and failed spool records, files, bytes, drain state."""
    emit(obj, obj.require("GET", "/api/v1/system/spool"), generic)


@command(spool, "drain")
@click.option("--retry-failed", is_flag=True,
              help="Re-queue permanently rejected records first.")
def spool_drain(obj: Client, retry_failed: bool) -> None:
    """Replay the spool now (refused with 409 during maintenance: exit 1)."""
    body = obj.require("POST", "/api/v1/system/spool/drain",
                       body={"retryFailed": retry_failed})
    emit(obj, body, generic)


# --- queues
queues = subgroup("queues", "List, inspect, configure and delete queues.")


def _render_queue_list(body: Any) -> str:
    rows = body.get("queues", []) if isinstance(body, dict) else []
    if not rows:
        return "no queues"
    out = table(["NAME", "NAMESPACE", "TASK", "PRIORITY", "PARTITIONS", "TOTAL", "PENDING",
                 "PROCESSING", "DLQ"],
                [[q.get("name"), q.get("namespace"), q.get("task"), q.get("priority"),
                  q.get("partitions"), *_msg_counts(q.get("messages"))] for q in rows])
    total = body.get("total")
    if isinstance(total, int) and total > len(rows):
        out += f"\n({len(rows)} of {total} queues)"
    return out


def _msg_counts(messages: Any) -> list[Any]:
    m = messages if isinstance(messages, dict) else {}
    return [m.get("total"), m.get("pending"), m.get("processing"), m.get("deadLetter")]


@command(queues, "list")
@click.option("--namespace", help="Only queues of this namespace.")
@click.option("--task", help="Only queues of this task.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
def queues_list(obj: Client, namespace: str | None, task: str | None, limit: int,
                offset: int) -> None:
    """Queues with their partitions and message counts."""
    body = obj.require("GET", "/api/v1/resources/queues",
                       query={"namespace": namespace, "task": task, "limit": limit,
                              "offset": offset})
    emit(obj, body, _render_queue_list)


def _render_queue(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    head = [(k, body.get(k)) for k in ("name", "id", "namespace", "task", "createdAt")]
    parts = [key_values(head)]
    if isinstance(body.get("totals"), dict):
        parts.append("totals\n" + _indent(key_values(flatten(body["totals"]))))
    if isinstance(body.get("options"), dict):
        parts.append("options\n" + _indent(key_values(sorted(body["options"].items()))))
    partitions = body.get("partitions")
    if isinstance(partitions, list):
        parts.append("partitions\n" + _indent(table(
            ["ID", "NAME", "LAST_OFFSET", "LOG_START", "LAST_WRITE", "MESSAGES"],
            [[p.get("id"), p.get("name"), p.get("lastOffset"), p.get("logStartOffset"),
              p.get("lastWriteAt"), _cell_messages(p.get("messages"))] for p in partitions])
            if partitions else "(none)"))
    groups = body.get("consumerGroups")
    if groups:
        parts.append("consumer groups\n" + _indent(generic(groups)))
    return "\n\n".join(parts)


def _cell_messages(messages: Any) -> Any:
    if isinstance(messages, dict):
        return " ".join(f"{k}={_cell(v)}" for k, v in messages.items())
    return messages


def _indent(text: str) -> str:
    return "\n".join("  " + line if line else line for line in text.splitlines())


@command(queues, "show")
@click.argument("queue")
def queues_show(obj: Client, queue: str) -> None:
    """One queue: options, partitions, totals, consumer groups (exit 4 if unknown)."""
    emit(obj, obj.require("GET", f"/api/v1/resources/queues/{_seg(queue)}"), _render_queue)


def _render_configured(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    verb = "created" if body.get("created") else "configured"
    head = f"{verb} queue {body.get('queue')} (id {body.get('queueId')}, namespace " \
           f"{_cell(body.get('namespace'))}, task {_cell(body.get('task') or None)})"
    opts = body.get("options")
    text = head
    if isinstance(opts, dict):
        text += "\n" + key_values(sorted(opts.items()))
    return text


@command(queues, "configure")
@click.argument("queue")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="An option to change (repeatable), e.g. --set leaseTime=30 "
                   "--set deadLetterQueue=true. Ints, floats, true/false, null are parsed; "
                   "other values are strings.")
@click.option("--namespace", help="Override the namespace derived from the name.")
@click.option("--task", help="Override the task derived from the name.")
def queues_configure(obj: Client, queue: str, sets: tuple[str, ...], namespace: str | None,
                     task: str | None) -> None:
    """Create QUEUE if needed and change only the options given (docs/api.md 2.7, 4)."""
    options = _parse_sets(sets)
    payload = {"queue": queue, "namespace": namespace, "task": task, "options": options}
    body = obj.require("POST", "/api/v1/configure", body=payload)
    emit(obj, body, _render_configured)
    ignored = body.get("ignoredOptions") if isinstance(body, dict) else None
    if ignored:
        click.echo(f"warning: unknown options ignored: {', '.join(map(str, ignored))}",
                   err=True)


@command(queues, "delete")
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def queues_delete(obj: Client, queue: str, yes: bool) -> None:
    """Delete QUEUE with all its messages, cursors, leases, DLQ rows and timers."""
    if not yes:
        click.confirm(f"Delete queue {queue!r} and everything in it?", abort=True, err=True)
    body = obj.require("DELETE", f"/api/v1/resources/queues/{_seg(queue)}")

    def render(b: Any) -> str:
        if isinstance(b, dict) and b.get("existed") is False:
            return f"queue {queue} did not exist"
        return f"deleted queue {queue}"

    emit(obj, body, render)


# --- dlq
dlq = subgroup("dlq", "Dead-letter rows: list, replay, delete.")
_GROUP_OPT = click.option("--group", "group", metavar="GROUP",
                          help="Only the row(s) of this consumer group "
                               "(__QUEUE_MODE__ = queue mode).")


def _render_dlq(body: Any) -> str:
    rows = body.get("messages", []) if isinstance(body, dict) else []
    total = body.get("total", len(rows)) if isinstance(body, dict) else len(rows)
    if not rows:
        return f"no dead-letter rows (total {total})"
    out = table(["FAILED_AT", "QUEUE", "PARTITION", "PARTITION_ID", "OFFSET", "GROUP",
                 "TRANSACTION_ID", "RETRIES", "ERROR"],
                [[r.get("failedAt"), r.get("queue"), r.get("partition"), r.get("partitionId"),
                  r.get("offset"), r.get("consumerGroup"), r.get("transactionId"),
                  r.get("retryCount"), _clip(r.get("errorMessage"), 60)] for r in rows])
    page = body.get("pagination") or {}
    return out + f"\n({len(rows)} of {total} rows, offset {page.get('offset', 0)})"


def _clip(value: Any, width: int) -> Any:
    if isinstance(value, str) and len(value) > width:
        return value[: width - 1] + "…"
    return value


@command(dlq, "list")
@click.option("--queue", help="Only this queue.")
@_GROUP_OPT
@click.option("--partition", help="Only this partition (name).")
@click.option("--from", "from_", metavar="ISO", help="Failed at or after this time.")
@click.option("--to", metavar="ISO", help="Failed before this time.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
def dlq_list(obj: Client, queue: str | None, group: str | None, partition: str | None,
             from_: str | None, to: str | None, limit: int, offset: int) -> None:
    """Dead-letter rows, oldest failure first."""
    body = obj.require("GET", "/api/v1/dlq", query={
        "queue": queue, "consumerGroup": group, "partition": partition, "from": from_,
        "to": to, "limit": limit, "offset": offset})
    emit(obj, body, _render_dlq)


@command(dlq, "retry")
@click.argument("partition_id")
@click.argument("transaction_id")
@_GROUP_OPT
def dlq_retry(obj: Client, partition_id: str, transaction_id: str, group: str | None) -> None:
    """Re-push a dead-lettered message to the tail of its partition (exit 4 if no row)."""
    body = obj.require("POST", f"/api/v1/messages/{_seg(partition_id)}/{_seg(transaction_id)}"
                               "/retry", query={"consumerGroup": group})
    emit(obj, body, lambda b: (
        f"retried {b.get('retried')} row(s): new message {b.get('messageId')} at offset "
        f"{b.get('offset')} (transactionId {b.get('newTransactionId')})"
        if isinstance(b, dict) else generic(b)))


@command(dlq, "delete")
@click.argument("partition_id")
@click.argument("transaction_id")
@_GROUP_OPT
def dlq_delete(obj: Client, partition_id: str, transaction_id: str, group: str | None) -> None:
    """Delete dead-letter row(s); the message log is not touched (exit 4 if no row)."""
    body = obj.require("DELETE", f"/api/v1/messages/{_seg(partition_id)}/{_seg(transaction_id)}",
                       query={"consumerGroup": group})
    emit(obj, body, lambda b: f"deleted {b.get('deleted')} dead-letter row(s)"
         if isinstance(b, dict) else generic(b))


# --- groups
groups = subgroup("groups", "Consumer groups: list, lag, seek.")


def _render_groups(body: Any) -> str:
    if not isinstance(body, list) or not body:
        return "no consumer groups"
    return table(["GROUP", "QUEUE", "STATE", "MEMBERS", "PARTITIONS", "LAGGING", "TOTAL_LAG",
                  "MAX_TIME_LAG_S", "MODE"],
                 [[g.get("name"), g.get("queueName"), g.get("state"), g.get("members"),
                   g.get("partitions"), g.get("partitionsWithLag"), g.get("totalLag"),
                   g.get("maxTimeLag"), g.get("subscriptionMode")] for g in body])


@command(groups, "list")
def groups_list(obj: Client) -> None:
    """One row per (group, queue) with its exact lag."""
    emit(obj, obj.require("GET", "/api/v1/consumer-groups"), _render_groups)


def _render_group(body: Any) -> str:
    if not isinstance(body, dict) or not body:
        return generic(body)
    rows = []
    for queue, info in body.items():
        for p in (info or {}).get("partitions", []):
            rows.append([queue, p.get("partition"), p.get("partitionId"),
                         p.get("committedOffset"), p.get("lastOffset"), p.get("offsetLag"),
                         p.get("timeLagSeconds"), p.get("leaseActive"),
                         p.get("lastConsumedAt")])
    return table(["QUEUE", "PARTITION", "PARTITION_ID", "COMMITTED", "LAST", "LAG",
                  "TIME_LAG_S", "LEASED", "LAST_CONSUMED_AT"], rows)


@command(groups, "show")
@click.argument("group")
def groups_show(obj: Client, group: str) -> None:
    """Cursors of one group per queue and partition (exit 4 if it has none)."""
    emit(obj, obj.require("GET", f"/api/v1/consumer-groups/{_seg(group)}"), _render_group)


def _render_lag(body: Any) -> str:
    if not isinstance(body, list) or not body:
        return "no lagging consumer groups"
    return table(["GROUP", "QUEUE", "PARTITION", "PARTITION_ID", "OFFSET_LAG", "TIME_LAG_S",
                  "OLDEST_UNCONSUMED_AT", "LAST_CONSUMED_AT"],
                 [[r.get("consumerGroup"), r.get("queueName"), r.get("partitionName"),
                   r.get("partitionId"), r.get("offsetLag"), r.get("timeLagSeconds"),
                   r.get("oldestUnconsumedAt"), r.get("lastConsumedAt")] for r in body])


@command(groups, "lag")
@click.option("--min-seconds", type=click.IntRange(min=0), default=None,
              help="Only cursors lagging at least this long (broker default 3600).")
def groups_lag(obj: Client, min_seconds: int | None) -> None:
    """Partitions whose oldest unconsumed message is older than --min-seconds."""
    body = obj.require("GET", "/api/v1/consumer-groups/lagging",
                       query={"minLagSeconds": min_seconds})
    emit(obj, body, _render_lag)


@command(groups, "seek")
@click.argument("group")
@click.argument("queue")
@click.option("--beginning", is_flag=True, help="Replay from the start of the log.")
@click.option("--end", is_flag=True, help="Skip everything stored now.")
@click.option("--timestamp", metavar="ISO",
              help="Next delivery is the first message created at or after this time.")
def groups_seek(obj: Client, group: str, queue: str, beginning: bool, end: bool,
                timestamp: str | None) -> None:
    """Move GROUP's cursors on every partition of QUEUE (exit 4 if QUEUE is unknown)."""
    chosen = [n for n, v in (("--beginning", beginning), ("--end", end),
                             ("--timestamp", timestamp)) if v]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --beginning, --end, --timestamp"
                               + (f" (got {', '.join(chosen)})" if chosen else ""))
    payload: dict[str, Any]
    if beginning:
        payload = {"toBeginning": True}
    elif end:
        payload = {"toEnd": True}
    else:
        payload = {"timestamp": timestamp}
    body = obj.require("POST", f"/api/v1/consumer-groups/{_seg(group)}/queues/{_seg(queue)}"
                               "/seek", body=payload)
    emit(obj, body, lambda b: (
        f"group {b.get('consumerGroup')} on {b.get('queueName')}: {b.get('partitionsUpdated')} "
        f"partition(s) moved to {b.get('target')}"
        + (f" {b['targetTimestamp']}" if b.get("targetTimestamp") else "")
        if isinstance(b, dict) else generic(b)))


# --- keys (the key file on this machine, not the API)
keys = subgroup("keys", "Encryption keys: the broker's key file on this machine (several keys, "
                        "one current). A broker reads the file when it starts: restart it "
                        "(every instance, with the same file) to use a change.")
_KEY_FILE = click.option(
    "--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="The key file [default: QUEEN_ENCRYPTION_KEY_FILE, else "
         "$QUEEN_DATA_DIR/encryption-keys.json, as the broker resolves it].")


def _key_file(path: Path | None) -> Path:
    if path is not None:
        return path.resolve()
    try:
        return keyring.key_file_path(Config.load())
    except ConfigError as ex:
        raise click.UsageError(str(ex)) from ex


def _key_error(ex: keyring.KeyFileError) -> NoReturn:
    click.echo(f"error: key_file: {ex}", err=True)
    sys.exit(EXIT_ERROR)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer of the key file at a time (a lock file beside it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ring_doc(path: Path, ring: keyring.Keyring | None) -> dict[str, Any]:
    return {"file": str(path), "current": ring.current if ring else None,
            "keys": [{"id": k.id, "created": k.created or None, "current": k.id == ring.current}
                     for k in ring.keys] if ring else []}


def _render_ring(doc: dict[str, Any]) -> str:
    rows = [[k["id"], "yes" if k["current"] else "", k["created"]] for k in doc["keys"]]
    return f"{doc['file']}\n" + table(["ID", "CURRENT", "CREATED"], rows)


@command(keys, "list")
@_KEY_FILE
def keys_list(obj: Client, path: Path | None) -> None:
    """The keys of the file (ids and dates, never the keys); exit 4 if there is no file."""
    path = _key_file(path)
    if not path.exists():
        click.echo(f"error: not_found: no key file at {path}", err=True)
        sys.exit(EXIT_NOT_FOUND)
    try:
        ring = keyring.read_key_file(path)
    except keyring.KeyFileError as ex:
        _key_error(ex)
    emit(obj, _ring_doc(path, ring), _render_ring)


@command(keys, "add")
@_KEY_FILE
@click.option("--standby", is_flag=True,
              help="Add the key without making it current: every instance can then decrypt "
                   "with it before any encrypts with it (`keys use` later).")
@click.option("--key-stdin", is_flag=True,
              help="Read the key (64 hex characters) from stdin instead of making a random "
                   "one, e.g. a former QUEEN_ENCRYPTION_KEY.")
def keys_add(obj: Client, path: Path | None, standby: bool, key_stdin: bool) -> None:
    """Add a key (random unless --key-stdin) and make it current; creates the file (mode
    0600) when there is none. Payloads under the older keys still decrypt."""
    path = _key_file(path)
    try:
        if key_stdin:
            secret = keyring.parse_hex_key(sys.stdin.read().strip(), "stdin")
            key = keyring.Key(keyring.key_id(secret), secret, keyring.new_key().created)
        else:
            key = keyring.new_key()
        with _locked(path):
            if path.exists():
                ring = keyring.read_key_file(path).with_key(key, make_current=not standby)
            else:
                ring = keyring.Keyring((key,), key.id)
            keyring.write_key_file(path, ring)
    except keyring.KeyFileError as ex:
        _key_error(ex)
    state = "current" if ring.current == key.id else "standby"
    emit(obj, _ring_doc(path, ring), lambda _: (
        f"added key {key.id} ({state}) to {path}\nrestart the broker to use it (every "
        "instance over the same database, with this same file)"))


@command(keys, "use")
@_KEY_FILE
@click.argument("key_id")
def keys_use(obj: Client, path: Path | None, key_id: str) -> None:
    """Make KEY_ID (a key of the file) the current key, the one new payloads are encrypted
    with."""
    path = _key_file(path)
    try:
        with _locked(path):
            ring = keyring.read_key_file(path).with_current(key_id)
            keyring.write_key_file(path, ring)
    except keyring.KeyFileError as ex:
        _key_error(ex)
    emit(obj, _ring_doc(path, ring), lambda _: (
        f"key {key_id} is now current in {path}\nrestart the broker to use it"))


if __name__ == "__main__":
    main(prog_name="queenctl")
