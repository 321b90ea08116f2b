"""``queenctl top``: a live terminal view of a broker's rates, backlog and consumer lag.

Each frame reads five routes: ``GET /health`` (maintenance, shards), ``GET /metrics`` (counters
since start, docs/api.md 2.12), ``GET /api/v1/resources/overview`` (the tenant's totals),
``GET /api/v1/resources/queues`` (backlog per queue: its first page of 1,000 queues, by name, so
a tenant with more sees the busiest among those) and ``GET /api/v1/consumer-groups`` (lag per
group). Rates are the counters' differences between two
frames over the time between them; the first frame, having no earlier one, shows the averages
since the broker started. On a terminal each frame redraws the screen in place (ANSI home and
clear); anywhere else (a pipe, a file, a test) frames follow one another, and ``--json`` writes
one JSON object per frame and line.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

from queen_mp.processes.queenctl.base import Client, cell, command, main, table

__all__ = ["Frame", "build_frame", "render_frame"]

CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen: the next frame overwrites this one
_COUNTERS = ("pushed", "popped", "acked")


@dataclass(frozen=True)
class Sample:
    """What one poll read, with the monotonic time it was read at."""

    at: float
    metrics: dict[str, Any]
    health: dict[str, Any]
    overview: dict[str, Any]
    queues: list[dict[str, Any]]
    groups: list[dict[str, Any]]


@dataclass(frozen=True)
class Frame:
    """One screen: rates over ``window`` seconds (None = averages since start)."""

    time: str
    window: float | None
    rates: dict[str, float]
    broker: dict[str, Any]
    queues: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    totals: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "windowSeconds": self.window, "rates": self.rates,
                "broker": self.broker, "totals": self.totals, "queues": self.queues,
                "groups": self.groups}


def _poll(obj: Client) -> Sample:
    health = obj.call("GET", "/health")  # 503 (unhealthy) still has the body to show
    if not isinstance(health.body, dict) or "status" not in health.body:
        obj.fail(health)
    metrics = obj.require("GET", "/metrics")
    overview = obj.require("GET", "/api/v1/resources/overview")
    queues = obj.require("GET", "/api/v1/resources/queues", query={"limit": 1000})
    groups = obj.require("GET", "/api/v1/consumer-groups")
    return Sample(time.monotonic(), metrics, health.body,
                  overview if isinstance(overview, dict) else {},
                  queues.get("queues", []) if isinstance(queues, dict) else [],
                  groups if isinstance(groups, list) else [])


def _counters(metrics: dict[str, Any]) -> dict[str, float]:
    msgs = metrics.get("messages") or {}
    out = {name: float(msgs.get(name) or 0) for name in _COUNTERS}
    out["requests"] = float((metrics.get("requests") or {}).get("total") or 0)
    return out


def build_frame(now: Sample, before: Sample | None, top_n: int) -> Frame:
    """Rates between two samples (or since start), the busiest queues and the most lagging
    groups; a pure function of the samples, so its arithmetic is tested without a broker."""
    cur = _counters(now.metrics)
    window: float | None = None
    if before is None:
        span = max(1.0, float(now.metrics.get("uptime") or 1))
        rates = {f"{k}PerSec": v / span for k, v in cur.items()}
    else:
        window = max(1e-3, now.at - before.at)
        prev = _counters(before.metrics)
        rates = {f"{k}PerSec": max(0.0, cur[k] - prev[k]) / window for k in cur}
    earlier = {q.get("name"): q for q in (before.queues if before else [])}
    queues = []
    for q in now.queues:
        m = q.get("messages") or {}
        row = {"queue": q.get("name"), "pending": m.get("pending"),
               "processing": m.get("processing"), "deadLetter": m.get("deadLetter"),
               "total": m.get("total"), "inPerSec": None}
        old = earlier.get(q.get("name"))
        if window is not None and old is not None:
            row["inPerSec"] = round(max(0, _stored(q) - _stored(old)) / window, 3)
        queues.append(row)
    queues.sort(key=lambda r: (-(r["pending"] or 0), -(r["inPerSec"] or 0), str(r["queue"])))
    groups = [{"group": g.get("name"), "queue": g.get("queueName"), "state": g.get("state"),
               "lag": g.get("totalLag"), "maxTimeLagSeconds": g.get("maxTimeLag"),
               "members": g.get("members")} for g in now.groups]
    groups.sort(key=lambda r: (-(r["lag"] or 0), str(r["group"]), str(r["queue"])))
    h = now.health
    fusion = now.metrics.get("fusion") or {}
    broker = {"status": h.get("status"), "maintenance": h.get("maintenanceMode"),
              "popMaintenance": h.get("popMaintenanceMode"),
              "shards": h.get("shards"), "uptimeSeconds": now.metrics.get("uptime"),
              "spoolPending": (now.metrics.get("spool") or {}).get("pending"),
              "parkedPops": now.metrics.get("parkedPops"),
              "segmentsPerCommit": fusion.get("segmentsPerCommit"),
              "database": now.metrics.get("database")}
    counts = now.overview.get("messages") or {}
    totals = {"queues": int(now.overview.get("queues") or 0),
              "pending": int(counts.get("pending") or 0),
              "deadLetter": int(counts.get("deadLetter") or 0),
              "groupLag": sum(int(g["lag"] or 0) for g in groups)}
    return Frame(dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), window,
                 {k: round(v, 3) for k, v in rates.items()}, broker, queues[:top_n],
                 groups[:top_n], totals)


def _stored(queue: dict[str, Any]) -> int:
    """Retained messages of a queue; between two frames its growth is the ingest rate (less
    what retention removed meanwhile, hence clamped at 0)."""
    return int((queue.get("messages") or {}).get("total") or 0)


def render_frame(frame: Frame, url: str) -> str:
    b = frame.broker
    shards = b.get("shards") or {}
    over = "since start" if frame.window is None else f"last {frame.window:.1f}s"
    r = frame.rates
    flags = [name for name, on in (("MAINTENANCE", b.get("maintenance")),
                                   ("POP-MAINTENANCE", b.get("popMaintenance"))) if on]
    lines = [
        f"queenctl top  {url}  {frame.time}  {b.get('status')}"
        + (f"  [{' '.join(flags)}]" if flags else ""),
        f"shards {shards.get('alive')}/{shards.get('total')}  uptime {b.get('uptimeSeconds')}s"
        f"  spool {cell(b.get('spoolPending'))}  parked pops {cell(b.get('parkedPops'))}"
        f"  segments/commit {cell(b.get('segmentsPerCommit'))}",
        f"rates ({over}): push {r['pushedPerSec']:.1f}/s  pop {r['poppedPerSec']:.1f}/s"
        f"  ack {r['ackedPerSec']:.1f}/s  http {r['requestsPerSec']:.1f} req/s",
        f"totals: {frame.totals.get('queues')} queues, {frame.totals.get('pending')} pending, "
        f"{frame.totals.get('deadLetter')} dead letters, group lag "
        f"{frame.totals.get('groupLag')}",
        "",
    ]
    if frame.queues:
        lines.append(table(["QUEUE", "PENDING", "PROCESSING", "DLQ", "TOTAL", "IN/S"],
                           [[q["queue"], q["pending"], q["processing"], q["deadLetter"],
                             q["total"], _rate(q["inPerSec"])] for q in frame.queues]))
    else:
        lines.append("no queues")
    lines.append("")
    if frame.groups:
        lines.append(table(["GROUP", "QUEUE", "STATE", "MEMBERS", "LAG", "MAX_TIME_LAG_S"],
                           [[g["group"], g["queue"], g["state"], g["members"], g["lag"],
                             g["maxTimeLagSeconds"]] for g in frame.groups]))
    else:
        lines.append("no consumer groups")
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@command(main, "top")
@click.option("--interval", "-i", type=click.FloatRange(min=0.1), default=2.0,
              show_default=True, metavar="SECONDS", help="Time between two frames.")
@click.option("--iterations", "-n", type=click.IntRange(min=1), default=None,
              help="Stop after this many frames [default: run until Ctrl-C].")
@click.option("--once", is_flag=True, help="One frame (rates since start), then exit.")
@click.option("--top", "top_n", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows of queues (most pending first) and of groups (most lag first).")
def top(obj: Client, interval: float, iterations: int | None, once: bool, top_n: int) -> None:
    """A live view of push/pop/ack rates, backlog per queue and lag per consumer group.

    On a terminal the screen is redrawn in place every --interval; piped, frames are printed
    one after the other; with --json each frame is one JSON object on its own line (time,
    windowSeconds: null on the first frame, whose rates are averages since the broker started;
    rates, broker, totals, queues, groups). IN/S is the growth of a queue's stored messages
    between two frames. Needs role read-only (the metrics and health routes are public).
    """
    if once and iterations is not None:
        raise click.UsageError("give --once or --iterations, not both")
    limit = 1 if once else iterations
    redraw = sys.stdout.isatty() and not obj.as_json
    before: Sample | None = None
    shown = 0
    try:
        while True:
            now = _poll(obj)
            frame = build_frame(now, before, top_n)
            if obj.as_json:
                click.echo(json.dumps(frame.to_dict(), separators=(",", ":")))
            else:
                text = render_frame(frame, obj.url)
                click.echo((CLEAR + text) if redraw else (text + "\n" if limit != 1 else text))
            shown += 1
            if limit is not None and shown >= limit:
                return
            before = now
            time.sleep(max(0.0, interval - (time.monotonic() - now.at)))
    except KeyboardInterrupt:
        return
