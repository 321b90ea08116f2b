"""``queenctl queues``: list, show, configure, delete, purge (docs/api.md 2.7, 5.1)."""

from __future__ import annotations

from typing import Any

import click

from queen_mp.processes.queenctl.base import (
    Client,
    cell,
    command,
    emit,
    flatten,
    generic,
    key_values,
    parse_sets,
    seg,
    subgroup,
    table,
)

# --- queues
queues = subgroup("queues", "List, inspect, configure, purge and delete queues.")


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
        return " ".join(f"{k}={cell(v)}" for k, v in messages.items())
    return messages


def _indent(text: str) -> str:
    return "\n".join("  " + line if line else line for line in text.splitlines())


@command(queues, "show")
@click.argument("queue")
def queues_show(obj: Client, queue: str) -> None:
    """One queue: options, partitions, totals, consumer groups (exit 4 if unknown)."""
    emit(obj, obj.require("GET", f"/api/v1/resources/queues/{seg(queue)}"), _render_queue)


def _render_configured(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    verb = "created" if body.get("created") else "configured"
    head = f"{verb} queue {body.get('queue')} (id {body.get('queueId')}, namespace " \
           f"{cell(body.get('namespace'))}, task {cell(body.get('task') or None)})"
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
    options = parse_sets(sets)
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
    body = obj.require("DELETE", f"/api/v1/resources/queues/{seg(queue)}")

    def render(b: Any) -> str:
        if isinstance(b, dict) and b.get("existed") is False:
            return f"queue {queue} did not exist"
        return f"deleted queue {queue}"

    emit(obj, body, render)


def _render_purge(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    text = (f"purged queue {body.get('queue')}: {body.get('purged')} message(s) removed from "
            f"{body.get('partitions')} partition(s)")
    if body.get("kept"):
        text += (f"\n{body['kept']} message(s) kept: inside a live lease or after one in its "
                 "partition; purge again once they are acknowledged")
    return text


@command(queues, "purge")
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def queues_purge(obj: Client, queue: str, yes: bool) -> None:
    """Remove every message of QUEUE and keep the queue (role admin; exit 4 if unknown).

    Unlike `delete`, its options, partitions, consumer groups and subscriptions stay and
    offsets go on where they were; every group's backlog drops to 0. Messages inside a live
    lease stay (with the later ones of their partition), as do dead-letter rows (`dlq
    delete`) and deduplication of recent transactionIds.
    """
    if not yes:
        click.confirm(f"Remove every message of queue {queue!r}?", abort=True, err=True)
    emit(obj, obj.require("POST", f"/api/v1/resources/queues/{seg(queue)}/purge"),
         _render_purge)
