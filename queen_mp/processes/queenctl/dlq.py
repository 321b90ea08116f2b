"""``queenctl dlq``: dead-letter rows, list, replay, delete (docs/api.md 2.8)."""

from __future__ import annotations

from typing import Any

import click

from queen_mp.processes.queenctl.base import (
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
    body = obj.require("POST", f"/api/v1/messages/{seg(partition_id)}/{seg(transaction_id)}"
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
    body = obj.require("DELETE", f"/api/v1/messages/{seg(partition_id)}/{seg(transaction_id)}",
                       query={"consumerGroup": group})
    emit(obj, body, lambda b: f"deleted {b.get('deleted')} dead-letter row(s)"
         if isinstance(b, dict) else generic(b))
