"""``queenctl messages browse|peek`` and ``queenctl push`` (docs/api.md 2.1, 2.9, 2.15).

Nothing here consumes: ``browse`` lists the log through the message browser (no payloads,
every message's status for a group), ``peek`` reads payloads by offset through the leaseless
``POST /api/v1/fetch``; neither takes a lease nor moves a cursor, so consumers never notice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from queen_mp.processes.queenctl.base import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    Client,
    cell,
    command,
    emit,
    main,
    seg,
    subgroup,
    table,
)

__all__ = ["load_payloads"]

PUSH_BATCH = 1000  # items per request body: well under the broker's body and item limits

messages = subgroup("messages", "Read the log without consuming it: browse (list, statuses) "
                                "and peek (payloads by offset or time).")

_PARTITION = click.option("--partition", "-p", metavar="NAME",
                          help="Only this partition (name).")


def _clip(text: str, width: int | None) -> str:
    if width is not None and len(text) > width:
        return text[: width - 1] + "…"
    return text


# ------------------------------------------------------------------------------------ browse
def _render_browse(body: Any) -> str:
    rows = body.get("messages", []) if isinstance(body, dict) else []
    total = body.get("total", len(rows)) if isinstance(body, dict) else len(rows)
    if not rows:
        return f"no messages (total {total})"
    out = table(["CREATED_AT", "PARTITION", "PARTITION_ID", "OFFSET", "TRANSACTION_ID",
                 "STATUS", "LEASE_EXPIRES_AT"],
                [[m.get("createdAt"), m.get("partition"), m.get("partitionId"), m.get("offset"),
                  m.get("transactionId"), m.get("status"), m.get("leaseExpiresAt")]
                 for m in rows])
    page = body.get("pagination") or {}
    return out + f"\n({len(rows)} of {total} messages, offset {page.get('offset', 0)})"


@command(messages, "browse")
@click.argument("queue")
@_PARTITION
@click.option("--group", "-g", metavar="GROUP",
              help="The consumer group whose status each message shows (default queue mode).")
@click.option("--status", type=click.Choice(["pending", "processing", "completed",
                                             "dead_letter"]),
              help="Only messages with this status for the group.")
@click.option("--from", "from_", metavar="ISO",
              help="Created at or after this time [default: one hour before --to].")
@click.option("--to", metavar="ISO", help="Created at or before this time [default: now].")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True,
              help="Rows of the listing to skip (paging), not a log offset: see `peek`.")
def messages_browse(obj: Client, queue: str, partition: str | None, group: str | None,
                    status: str | None, from_: str | None, to: str | None, limit: int,
                    offset: int) -> None:
    """List QUEUE's messages by creation time, without payloads, each with its status for
    a consumer group (pending, processing, completed, dead_letter). Exit 4 if QUEUE is unknown.

    Times are ISO-8601 with a zone, e.g. 2026-05-16T08:00:00Z. Show a payload with
    `messages peek QUEUE --partition P --offset N --limit 1`.
    """
    body = obj.require("GET", f"/api/v1/status/queues/{seg(queue)}/messages", query={
        "partition": partition, "consumerGroup": group, "status": status, "from": from_,
        "to": to, "limit": limit, "offset": offset})
    emit(obj, body, _render_browse)


# -------------------------------------------------------------------------------------- peek
def _render_peek(width: int | None) -> Any:
    def render(entry: dict[str, Any]) -> str:
        records = entry["records"]
        head = (f"queue {entry['queue']} partition {entry['partition']}: log offsets "
                f"{entry['logStartOffset']}..{entry['highWatermark'] - 1}")
        if not records:
            return head + "\nno messages there"
        rows = [[r.get("offset"), r.get("ts"), r.get("transactionId"),
                 _clip(json.dumps(r.get("payload"), separators=(",", ":"),
                                  ensure_ascii=False), width)] for r in records]
        out = head + "\n" + table(["OFFSET", "CREATED_AT", "TRANSACTION_ID", "PAYLOAD"], rows)
        if entry.get("more"):
            out += f"\n(more from offset {records[-1]['offset'] + 1})"
        return out

    return render


def _first_offset_since(obj: Client, queue: str, partition: str, since: str) -> int | None:
    """The offset of the partition's first message created at or after ``since``."""
    body = obj.require("GET", f"/api/v1/status/queues/{seg(queue)}/messages",
                       query={"partition": partition, "from": since, "limit": 1})
    rows = body.get("messages") if isinstance(body, dict) else None
    return int(rows[0]["offset"]) if rows else None


def _fetch(obj: Client, queue: str, partition: str, offset: int | None,
           max_bytes: int) -> dict:
    """One partition's records from ``offset`` (None = its log start) and its bounds."""
    body = obj.require("POST", "/api/v1/fetch", body={"entries": [
        {"queue": queue, "partition": partition, "offset": offset or 0,
         "maxBytes": max_bytes}]})
    entry = body["entries"][0]
    error = entry.get("error")
    if offset is None and error == "OFFSET_OUT_OF_RANGE":
        # NOTE(queenctl): the broker reads offset 0 as 1, out of range once retention or a
        # purge moved the log start: ask again from the start it reported.
        return _fetch(obj, queue, partition, max(1, int(entry["logStartOffset"])), max_bytes)
    if error == "UNKNOWN_TOPIC_OR_PARTITION":
        _die(obj, EXIT_NOT_FOUND, "not_found", f"queue {queue!r} does not exist", body)
    if error == "OFFSET_OUT_OF_RANGE":
        _die(obj, EXIT_ERROR, "offset_out_of_range",
             f"offset {offset} is outside the log of {queue}/{partition} (log start "
             f"{entry['logStartOffset']}, next offset {entry['highWatermark']})", body)
    return entry


def _die(obj: Client, code: int, kind: str, text: str, body: Any = None) -> NoReturn:
    if body is not None and obj.as_json:
        click.echo(json.dumps(body, indent=2))
    click.echo(f"error: {kind}: {text}", err=True)
    sys.exit(code)


@command(messages, "peek")
@click.argument("queue")
@click.option("--partition", "-p", metavar="NAME", default="Default", show_default=True,
              help="The partition to read.")
@click.option("--offset", type=click.IntRange(min=0), default=None,
              help="First offset to show (a partition's offsets start at 1) [default: the "
                   "oldest one retention and purges kept].")
@click.option("--from", "from_", metavar="ISO",
              help="Start at the first message created at or after this time instead.")
@click.option("--limit", "-n", type=click.IntRange(1, 10000), default=20, show_default=True,
              help="Messages to show at most.")
@click.option("--max-bytes", type=click.IntRange(min=1), default=1 << 20, show_default=True,
              help="Payload bytes to read at most (the first message is always shown).")
@click.option("--full", is_flag=True, help="Do not clip payloads to 100 characters.")
def messages_peek(obj: Client, queue: str, partition: str, offset: int | None,
                  from_: str | None, limit: int, max_bytes: int, full: bool) -> None:
    """Show payloads of QUEUE's PARTITION from an offset or a time, without consuming: no
    lease is taken and no cursor moves (POST /api/v1/fetch, role read-write).

    Exit 4 if QUEUE is unknown, 1 if the offset is outside the log (retention removed it, or
    it is beyond the last message). With --json: the partition's entry of the fetch answer
    (queue, partition, logStartOffset, highWatermark, records) and `more`, true when records
    beyond the last one shown exist.
    """
    if offset is not None and from_ is not None:
        raise click.UsageError("give --offset or --from, not both")
    start = offset or None
    if from_ is not None:
        found = _first_offset_since(obj, queue, partition, from_)
        if found is None:  # nothing since then: show the bounds and no record
            entry = _fetch(obj, queue, partition, None, 1)
            entry["records"], entry["more"] = [], False
            emit(obj, entry, _render_peek(None if full else 100))
            return
        start = found
    entry = _fetch(obj, queue, partition, start, max_bytes)
    records = entry["records"]
    shown = records[:limit]
    last = shown[-1]["offset"] if shown else entry["highWatermark"] - 1
    entry["more"] = last + 1 < entry["highWatermark"]
    entry["records"] = shown
    emit(obj, entry, _render_peek(None if full else 100))


# -------------------------------------------------------------------------------------- push
def _bad_input(text: str) -> NoReturn:
    click.echo(f"error: invalid_json: {text}", err=True)
    sys.exit(EXIT_USAGE)


def load_payloads(texts: tuple[str, ...], path: str | None, lines: bool,
                  each: bool) -> list[Any]:
    """The payloads to push: each PAYLOAD argument, or the file (``-`` = stdin) as one JSON
    value, one per line (``lines``) or one per element of its top-level array (``each``).
    Anything that is not JSON exits 2 before a single item is sent."""
    payloads: list[Any] = []
    for i, text in enumerate(texts, 1):
        try:
            payloads.append(json.loads(text))
        except ValueError as ex:
            _bad_input(f"PAYLOAD argument {i} is not JSON ({ex}); quote strings: '\"text\"'")
    if path is None:
        return payloads
    name = "stdin" if path == "-" else path
    try:
        raw = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as ex:
        _bad_input(f"cannot read {name}: {ex}")
    if lines:
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    payloads.append(json.loads(line))
                except ValueError as ex:
                    _bad_input(f"{name} line {n}: {ex}")
        return payloads
    try:
        doc = json.loads(raw)
    except ValueError as ex:
        _bad_input(f"{name}: {ex}")
    if each:
        if not isinstance(doc, list):
            _bad_input(f"{name}: --each needs a JSON array at the top level")
        payloads.extend(doc)
    else:
        payloads.append(doc)
    return payloads


def _render_push(results: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if len(results) > 20:
        return f"pushed {len(results)} message(s): {summary}"
    rows = [[r.get("status"), r.get("partitionId"), r.get("offset"), r.get("transactionId"),
             r.get("messageId"), r.get("error")] for r in results]
    return (table(["STATUS", "PARTITION_ID", "OFFSET", "TRANSACTION_ID", "MESSAGE_ID", "ERROR"],
                  rows) + f"\n({summary})")


@command(main, "push")
@click.argument("queue")
@click.argument("payloads", nargs=-1, metavar="[PAYLOAD]...")
@click.option("--file", "-f", "path", metavar="PATH",
              help="Read payloads from this file ('-' = stdin): one JSON value, unless "
                   "--lines or --each.")
@click.option("--lines", is_flag=True, help="The file is JSON Lines: one payload per line.")
@click.option("--each", is_flag=True,
              help="The file holds a JSON array: one message per element.")
@click.option("--partition", "-p", metavar="NAME",
              help="The partition [default: Default]; created if needed.")
@click.option("--transaction-id", metavar="ID",
              help="Deduplication key of a single message [default: its message id].")
@click.option("--trace-id", metavar="UUID", help="Trace id of every message pushed.")
def push(obj: Client, queue: str, payloads: tuple[str, ...], path: str | None, lines: bool,
         each: bool, partition: str | None, transaction_id: str | None,
         trace_id: str | None) -> None:
    """Push one or many JSON payloads to QUEUE (created if needed; role read-write).

    \b
    Examples:
      queenctl push shop.orders '{"id": 1001}'
      queenctl push shop.orders '"a string"' '42' --partition eu
      queenctl push shop.orders --file orders.jsonl --lines
      queenctl push shop.orders --file batch.json --each

    Each PAYLOAD is a JSON text. Items go in bodies of 1000; one result line per message
    (queued, duplicate, buffered = spooled during maintenance, failed). Exit 0 when every
    message is queued, duplicate or buffered, 1 when one failed or the broker refused the
    request, 2 when an input is not JSON (nothing is sent then).
    """
    if (lines or each) and path is None:
        raise click.UsageError("--lines and --each apply to --file")
    if lines and each:
        raise click.UsageError("give --lines or --each, not both")
    items = load_payloads(payloads, path, lines, each)
    if not items:
        raise click.UsageError("nothing to push: give a PAYLOAD or --file")
    if transaction_id is not None and len(items) != 1:
        raise click.UsageError("--transaction-id needs exactly one message")
    body = [{"queue": queue, "payload": p, "partition": partition,
             "transactionId": transaction_id, "traceId": trace_id} for p in items]
    body = [{k: v for k, v in item.items() if v is not None or k == "payload"} for item in body]
    results: list[dict[str, Any]] = []
    for start in range(0, len(body), PUSH_BATCH):
        chunk = body[start:start + PUSH_BATCH]
        answer = obj.call("POST", "/api/v1/push", body={"items": chunk})
        if not answer.ok:
            # NOTE(queenctl): a refused body stores none of its items; earlier bodies stay.
            if results:
                click.echo(f"note: the first {len(results)} message(s) were pushed before "
                           "the broker refused the next body", err=True)
            obj.fail(answer)
        results.extend(answer.body)
    emit(obj, results, _render_push)
    failed = [r for r in results if r.get("status") == "failed"]
    if failed:
        click.echo(f"error: push_failed: {len(failed)} message(s) not stored: "
                   f"{cell(failed[0].get('error'))}", err=True)
        sys.exit(EXIT_ERROR)
