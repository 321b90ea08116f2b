"""``queenctl dlq``: dead-letter rows, list, replay, delete (docs/api.md 2.8).

``retry`` and ``delete`` take one row (PARTITION_ID TRANSACTION_ID) or a filter, the listing's
(``--queue``, ``--group``, ``--partition``, ``--from``, ``--to``; ``--all`` for no filter).
By filter the broker does the work, at most 1000 rows a call (``POST /api/v1/dlq/retry``,
``DELETE /api/v1/dlq``); the command calls again while rows still match and a call did
something, and stops once it has acted on as many rows as matched at its first call, so a
consumer that dead-letters the replayed messages again cannot keep it looping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from queen_mp.processes.queenctl.base import (
    Answer,
    Client,
    command,
    emit,
    generic,
    seg,
    subgroup,
    table,
)

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


def _filter_options(func: Any) -> Any:
    """The listing's filters (``--group`` is ``_GROUP_OPT``, shared with the single-row form)."""
    for opt in reversed([
            click.option("--queue", help="Only this queue."),
            click.option("--partition", help="Only this partition (name)."),
            click.option("--from", "from_", metavar="ISO", help="Failed at or after this time."),
            click.option("--to", metavar="ISO", help="Failed at or before this time.")]):
        func = opt(func)
    return func


@command(dlq, "list")
@_filter_options
@_GROUP_OPT
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
def dlq_list(obj: Client, queue: str | None, group: str | None, partition: str | None,
             from_: str | None, to: str | None, limit: int, offset: int) -> None:
    """Dead-letter rows, oldest failure first."""
    body = obj.require("GET", "/api/v1/dlq", query={
        "queue": queue, "consumerGroup": group, "partition": partition, "from": from_,
        "to": to, "limit": limit, "offset": offset})
    emit(obj, body, _render_dlq)


# --- retry and delete: one row, or every row a filter matches
#: the most rows one by-filter call acts on (docs/api.md 2.8)
MAX_BATCH = 1000


@dataclass(frozen=True, slots=True)
class _Bulk:
    """What a by-filter ``retry`` or ``delete`` was asked to do."""

    query: dict[str, Any]  # the listing's filters as the route takes them, None = absent
    everything: bool  # --all
    batch: int  # rows per call (the route's ``limit``)
    once: bool
    yes: bool

    def describe(self) -> str:
        given = [f"{k}={v}" for k, v in self.query.items() if v is not None]
        return "matching " + ", ".join(given) if given else "of every queue"


def _bulk_options(func: Any) -> Any:
    for opt in reversed([
            click.option("--all", "everything", is_flag=True,
                         help="With no filter: act on every dead-letter row of the tenant."),
            click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=None,
                         help=f"Rows the broker acts on per call (default {MAX_BATCH})."),
            click.option("--once", is_flag=True,
                         help="One call only (at most --batch rows), then say how many "
                              "rows still match."),
            click.option("--yes", "-y", is_flag=True,
                         help="Do not ask for confirmation (by filter).")]):
        func = opt(func)
    return _filter_options(func)


def _bulk(partition_id: str | None, transaction_id: str | None, group: str | None,
          queue: str | None, partition: str | None, from_: str | None, to: str | None,
          everything: bool, batch: int | None, once: bool, yes: bool) -> _Bulk | None:
    """None for the single-row form; the by-filter request otherwise; usage errors (exit 2,
    nothing sent) for a mix of both, a lone PARTITION_ID, or no filter without --all."""
    filters = {"queue": queue, "partition": partition, "from": from_, "to": to}
    if partition_id is not None:
        if transaction_id is None:
            raise click.UsageError("give PARTITION_ID and TRANSACTION_ID (one row), or a "
                                   "filter (--queue, --group, --partition, --from, --to)")
        if any(v is not None for v in filters.values()) or everything or once \
                or batch is not None:
            raise click.UsageError("PARTITION_ID TRANSACTION_ID name one row: --queue, "
                                   "--partition, --from, --to, --all, --batch and --once "
                                   "apply to the by-filter form")
        return None
    query = {"queue": queue, "consumerGroup": group, "partition": partition, "from": from_,
             "to": to}
    if not everything and all(v is None for v in query.values()):
        raise click.UsageError("no row named and no filter: give PARTITION_ID "
                               "TRANSACTION_ID, a filter (--queue, --group, --partition, "
                               "--from, --to), or --all for every dead-letter row")
    return _Bulk(query, everything, batch or MAX_BATCH, once, yes)


#: per kind: (method, route, the answer's count of rows acted on, of progress, its verb)
_KINDS = {"retry": ("POST", "/api/v1/dlq/retry", "retried", "replayed", "Replay"),
          "delete": ("DELETE", "/api/v1/dlq", "deleted", "deleted", "Delete")}
_SUMMED = ("replayed", "retried", "skipped", "deleted")


def _run_bulk(obj: Client, kind: str, bulk: _Bulk) -> None:
    """Call the by-filter route until no row matches, a call does nothing, as many rows as
    matched at the first call are done, or once with ``--once``; then report the sums."""
    method, path, rows_key, progress_key, verb = _KINDS[kind]
    if not bulk.yes:
        found = obj.require("GET", "/api/v1/dlq", query={**bulk.query, "limit": 1})
        total = found.get("total", 0) if isinstance(found, dict) else 0
        if total:  # nothing to confirm otherwise: the call acts on none (or refuses the filter)
            click.confirm(f"{verb} {total} dead-letter row(s) {bulk.describe()}?", abort=True,
                          err=True)
    query = {**bulk.query, "all": True if bulk.everything else None, "limit": bulk.batch}
    sums: dict[str, Any] = {"success": True, "calls": 0}
    bound: int | None = None
    done = 0
    while True:
        answer: Answer = obj.call(method, path, query=query)
        if not answer.ok:
            if sums["calls"]:
                click.echo(f"{_summary(kind, sums)} before this error", err=True)
            obj.fail(answer)
        body = answer.body if isinstance(answer.body, dict) else {}
        sums["calls"] += 1
        for key in _SUMMED:
            if key in body:
                sums[key] = sums.get(key, 0) + int(body[key])
        sums["remaining"] = remaining = int(body.get("remaining", 0))
        acted, progressed = int(body.get(rows_key, 0)), int(body.get(progress_key, 0)) > 0
        if bound is None:
            bound = acted + remaining
        done += acted
        if bulk.once or not remaining or not progressed or done >= bound:
            break
    _finish(obj, kind, sums, bulk, stalled=not progressed)


def _summary(kind: str, sums: dict[str, Any]) -> str:
    calls = f"{sums['calls']} call(s)"
    if kind == "delete":
        return f"deleted {sums.get('deleted', 0)} dead-letter row(s) in {calls}"
    text = (f"replayed {sums.get('replayed', 0)} message(s), {sums.get('retried', 0)} "
            f"dead-letter row(s), in {calls}")
    if sums.get("skipped"):
        text += f"; {sums['skipped']} skipped"
    return text


def _finish(obj: Client, kind: str, sums: dict[str, Any], bulk: _Bulk,
            stalled: bool = False) -> None:
    emit(obj, sums, lambda s: f"{_summary(kind, s)}; {s['remaining']} row(s) still match")
    left = sums["remaining"]
    if not left:
        return
    if bulk.once:
        why = "run again (without --once: until none is left)"
    elif stalled and kind == "retry":
        why = ("the last call replayed none of them: their partition is gone, or the queue "
               "is encrypted now and the broker has no key; `queenctl dlq delete` with the "
               "same filter removes them")
    elif stalled:
        why = "the last call deleted none of them (another caller at work?); run it again"
    else:
        why = ("more than matched when this command started (rows filed meanwhile); run it "
               "again to go on")
    click.echo(f"note: {left} dead-letter row(s) {bulk.describe()} remain: {why}", err=True)


@command(dlq, "retry")
@click.argument("partition_id", required=False)
@click.argument("transaction_id", required=False)
@_GROUP_OPT
@_bulk_options
def dlq_retry(obj: Client, partition_id: str | None, transaction_id: str | None,
              group: str | None, **by_filter: Any) -> None:
    """Re-push dead-lettered messages to the tail of their partitions.

    PARTITION_ID TRANSACTION_ID: that row (with --group, only that group's; exit 4 if none).
    Without them, every row the filter matches (--queue, --group, --partition, --from, --to,
    or --all), replayed by the broker --batch rows a call, called again until none is left;
    asks first unless --yes. --json prints the sums of the calls' answers (calls, replayed,
    retried, skipped) and the rows that still match (remaining).
    """
    bulk = _bulk(partition_id, transaction_id, group, **by_filter)
    if bulk is not None:
        _run_bulk(obj, "retry", bulk)
        return
    assert transaction_id is not None
    body = obj.require("POST", f"/api/v1/messages/{seg(partition_id)}/{seg(transaction_id)}"
                               "/retry", query={"consumerGroup": group})
    emit(obj, body, lambda b: (
        f"retried {b.get('retried')} row(s): new message {b.get('messageId')} at offset "
        f"{b.get('offset')} (transactionId {b.get('newTransactionId')})"
        if isinstance(b, dict) else generic(b)))


@command(dlq, "delete")
@click.argument("partition_id", required=False)
@click.argument("transaction_id", required=False)
@_GROUP_OPT
@_bulk_options
def dlq_delete(obj: Client, partition_id: str | None, transaction_id: str | None,
               group: str | None, **by_filter: Any) -> None:
    """Delete dead-letter rows; the message log is not touched.

    PARTITION_ID TRANSACTION_ID: that message's rows (with --group, only that group's; exit
    4 if none). Without them, every row the filter matches (--queue, --group, --partition,
    --from, --to, or --all), deleted by the broker --batch rows a call, called again until
    none is left; asks first unless --yes. --json prints the sums of the calls' answers
    (calls, deleted) and the rows that still match (remaining).
    """
    bulk = _bulk(partition_id, transaction_id, group, **by_filter)
    if bulk is not None:
        _run_bulk(obj, "delete", bulk)
        return
    assert transaction_id is not None
    body = obj.require("DELETE", f"/api/v1/messages/{seg(partition_id)}/{seg(transaction_id)}",
                       query={"consumerGroup": group})
    emit(obj, body, lambda b: f"deleted {b.get('deleted')} dead-letter row(s)"
         if isinstance(b, dict) else generic(b))
