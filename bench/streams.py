"""Streams: events/s through a tumbling-window count run by the published client's Stream DSL,
and the latency of its ``POST /streams/v1/cycle`` calls.

Issue 27 asks ``make bench`` for a streams section. The workload is the one a user of the
Streams SDK (queen-mq 2.6, ``queen.streams``) writes first:

    Stream.from_(q.queue(src)).window_tumbling(seconds=1, idle_flush_ms=200)
          .aggregate({"count": lambda m: 1}).to(q.queue(sink))

``--events`` (20,000) events of the suite's 200-byte JSON payload are pushed first over
``--partitions`` (4) partitions; then one runner (``--batch-size`` 200 per cycle, up to
``--max-partitions`` 4 per pop) consumes them. The window is from the runner's start until the
query's consumer group has committed every event and no window state is left (every window
emitted): events/s = events / that time. Each cycle (state writes, sink pushes and the input's
ack in one transaction on the broker) is one ``/streams/v1/cycle`` call, timed around the
client's HTTP request: p50/p99/max. CPU per event is split by role (broker process tree,
PostgreSQL cluster, this process: the SDK and its runner). The sink's counts must add up to the
events pushed: a run that counts one twice or loses one fails.

``python -m bench.streams`` prints a Markdown table (``--quick``: 4,000 events) from a private
PostgreSQL cluster started for the run (``--server-dsn DSN``: that server instead); the suite
runs it as its ``streams`` section, in a process of its own (``run_in_child``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import httpx
import psycopg
from queen import Queen, Stream

from bench.push import (
    RoleCpu,
    Server,
    create_database,
    db_name,
    drop_database,
    private_server,
    start_queen,
)

CYCLE = "/streams/v1/cycle"
PUSH_CHUNK = 1_000  # items per push request while filling
_PAD = "x" * 160


@dataclass(frozen=True)
class Figures:
    events: int
    partitions: int
    batch_size: int
    seconds: float
    events_per_s: float
    cycles: int
    cycle_p50_ms: float
    cycle_p99_ms: float
    cycle_max_ms: float
    counted: int  # the sum of the counts the sink received: must equal events
    errors: int  # the runner's errorsTotal
    cpu_broker_us_per_event: float
    cpu_pg_us_per_event: float
    cpu_client_us_per_event: float

    @property
    def ok(self) -> bool:
        return self.counted == self.events and self.errors == 0


@contextlib.contextmanager
def timed_cycles(samples: list[float]) -> Iterator[None]:
    """Appends the seconds of every ``/streams/v1/cycle`` request made through httpx's async
    client while inside (the SDK posts its cycles with it)."""
    original = httpx.AsyncClient.post

    async def post(self: httpx.AsyncClient, url: Any, *args: Any, **kwargs: Any
                   ) -> httpx.Response:
        if not str(url).endswith(CYCLE):
            return await original(self, url, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            return await original(self, url, *args, **kwargs)
        finally:
            samples.append(time.perf_counter() - t0)

    httpx.AsyncClient.post = post  # type: ignore[method-assign]
    try:
        yield
    finally:
        httpx.AsyncClient.post = original  # type: ignore[method-assign]


def fill(http: httpx.Client, queue: str, events: int, partitions: int) -> None:
    items = [{"queue": queue, "partition": f"p{i % partitions}",
              "payload": {"producer": i % partitions, "seq": i, "pad": _PAD}}
             for i in range(events)]
    for start in range(0, events, PUSH_CHUNK):
        r = http.post("/api/v1/push", json={"items": items[start:start + PUSH_CHUNK]})
        r.raise_for_status()
        bad = [a for a in r.json() if a["status"] != "queued"]
        assert not bad, bad[:3]


def _progress(db: psycopg.Connection[Any], queue: str, group: str, query: str
              ) -> tuple[int, int]:
    """(offsets the group committed on ``queue``, window state rows left of ``query``)."""
    row = db.execute(
        "SELECT (SELECT COALESCE(sum(c.committed_offset), 0) FROM queen.log_consumers c"
        "  JOIN queen.log_partitions lp ON lp.id = c.partition_id"
        "  JOIN queen.queues q ON q.id = lp.queue_id"
        "  WHERE q.name = %s AND c.consumer_group = %s),"
        " (SELECT count(*) FROM queen.stream_state s JOIN queen.stream_queries sq"
        "  ON sq.id = s.query_id WHERE sq.name = %s)", (queue, group, query)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def counted(http: httpx.Client, sink: str) -> int:
    """The sum of the window counts in ``sink`` (drained with autoAck pops)."""
    total = 0
    while True:
        r = http.get(f"/api/v1/pop/queue/{sink}", params={
            "consumerGroup": "bench-check", "batch": "1000", "autoAck": "true",
            "partitions": "100", "wait": "false"})
        r.raise_for_status()
        if r.status_code == 204 or not r.json()["messages"]:
            return total
        total += sum(int(m["data"]["count"]) for m in r.json()["messages"])


async def _run_stream(url: str, dsn: str, src: str, sink: str, query: str,
                      args: argparse.Namespace, cpu: RoleCpu, samples: list[float]
                      ) -> tuple[float, dict[str, Any], dict[str, float]]:
    group = f"streams.{query}"
    with psycopg.connect(dsn, autocommit=True) as db, timed_cycles(samples):
        async with Queen(url) as q:
            c0 = cpu.snap()
            t0 = time.monotonic()
            runner = await (Stream.from_(q.queue(src))
                            .window_tumbling(seconds=args.window_seconds, idle_flush_ms=200)
                            .aggregate({"count": lambda m: 1})
                            .to(q.queue(sink))
                            .run(query_id=query, url=url, batch_size=args.batch_size,
                                 max_partitions=args.max_partitions, max_wait_millis=200))
            try:
                deadline = t0 + args.timeout
                while True:
                    done, left = _progress(db, src, group, query)
                    if done >= args.events and left == 0:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"streams: {done} of {args.events} events committed, "
                                           f"{left} window rows left after {args.timeout:.0f} s")
                    await asyncio.sleep(0.05)
                seconds = time.monotonic() - t0
                used = cpu.since(c0)
            finally:
                await runner.stop()
            return seconds, runner.metrics(), used


def run(args: argparse.Namespace) -> Figures:
    """One broker over a fresh database; fill, then one runner consumes it all."""
    with private_server(args.server_dsn) as server_dsn:
        dsn = create_database(server_dsn, f"queen_bench_{uuid.uuid4().hex[:8]}_str")
        try:
            with tempfile.TemporaryDirectory(prefix="queen-bench-streams-") as tmp:
                server: Server = start_queen(Path(tmp), dsn, workers=args.workers, shards=1)
                try:
                    server.wait_ready()
                    return measure(server, dsn, args)
                finally:
                    server.stop()
        finally:
            drop_database(server_dsn, db_name(dsn))


def measure(server: Server, dsn: str, args: argparse.Namespace) -> Figures:
    """Fill a source queue, run the stream over it until every event is committed and every
    window emitted, check the counts."""
    tag = uuid.uuid4().hex[:6]
    src, sink, query = f"bench-stream-src-{tag}", f"bench-stream-sink-{tag}", f"bench-{tag}"
    cpu = RoleCpu(server.proc.pid, dsn)
    samples: list[float] = []
    with httpx.Client(base_url=server.url, timeout=120) as http:
        print(f"  streams: filling {args.events:,} events over {args.partitions} partitions",
              file=sys.stderr, flush=True)
        fill(http, src, args.events, args.partitions)
        seconds, metrics, used = asyncio.run(
            _run_stream(server.url, dsn, src, sink, query, args, cpu, samples))
        total = counted(http, sink)
    times = sorted(samples) or [0.0]
    per = 1e6 / args.events
    return Figures(
        args.events, args.partitions, args.batch_size, seconds, args.events / seconds,
        len(samples), statistics.median(times) * 1e3, times[int(len(times) * 0.99)] * 1e3,
        times[-1] * 1e3, total, int(metrics.get("errorsTotal", 0)),
        used["broker"] * per, used["pg"] * per, used["client"] * per)


def run_in_child(argv: list[str]) -> Figures:
    """``python -m bench.streams ARGV`` in a process of its own, its figures. The published
    client's ``Queen`` installs SIGINT/SIGTERM handlers when it is created, which works only in
    a main thread and would replace the suite's own: the suite runs the section this way."""
    with tempfile.TemporaryDirectory(prefix="queen-bench-streams-") as tmp:
        out = Path(tmp) / "figures.json"
        proc = subprocess.run([sys.executable, "-m", "bench.streams", *argv, "--json", str(out)],
                              cwd=Path(__file__).resolve().parent.parent, check=False)
        if not out.exists():
            raise RuntimeError(f"bench.streams exited with {proc.returncode} and no figures")
        doc = json.loads(out.read_text())
    return Figures(**{f.name: doc[f.name] for f in fields(Figures)})


def render(f: Figures) -> str:
    lines = ["| events | partitions | batch | events/s | cycles | cycle p50 ms | cycle p99 ms "
             "| cycle max ms | broker us/event | PG us/event | client us/event | counted |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
             f"| {f.events:,} | {f.partitions} | {f.batch_size} | {f.events_per_s:,.0f} | "
             f"{f.cycles:,} | {f.cycle_p50_ms:.1f} | {f.cycle_p99_ms:.1f} | "
             f"{f.cycle_max_ms:.1f} | {f.cpu_broker_us_per_event:,.0f} | "
             f"{f.cpu_pg_us_per_event:,.0f} | {f.cpu_client_us_per_event:,.0f} | "
             f"{f.counted:,}{'' if f.ok else ' **WRONG**'} |"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.streams", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-dsn", default=None,
                    help="PostgreSQL server to create the database on (default: a private "
                         "cluster started for the run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=200, help="events per cycle (200)")
    ap.add_argument("--max-partitions", type=int, default=4, help="partitions per pop (4)")
    ap.add_argument("--window-seconds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after (600 s)")
    ap.add_argument("--quick", action="store_true", help="4,000 events")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.quick:
        args.events = 4_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    f = run(args)
    print(render(f))
    if args.json:
        args.json.write_text(json.dumps({**asdict(f), "ok": f.ok}, indent=2))
    return 0 if f.ok else 3


if __name__ == "__main__":
    sys.exit(main())
