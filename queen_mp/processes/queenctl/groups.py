"""``queenctl groups``: consumer groups, lag and seek (docs/api.md 2.10)."""

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
    emit(obj, obj.require("GET", f"/api/v1/consumer-groups/{seg(group)}"), _render_group)


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
    body = obj.require("POST", f"/api/v1/consumer-groups/{seg(group)}/queues/{seg(queue)}"
                               "/seek", body=payload)
    emit(obj, body, lambda b: (
        f"group {b.get('consumerGroup')} on {b.get('queueName')}: {b.get('partitionsUpdated')} "
        f"partition(s) moved to {b.get('target')}"
        + (f" {b['targetTimestamp']}" if b.get("targetTimestamp") else "")
        if isinstance(b, dict) else generic(b)))
