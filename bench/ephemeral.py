"""Ephemeral queues beside durable ones: push and pop/ack msgs/s on one broker, in one run.

Issue 27 item 4 wants ephemeral queues "far cheaper than durable queues". Both kinds are driven
the same way on the same broker and database, one after the other, with the suite's 200-byte
JSON payload:

- ``push``: ``--connections`` clients (8) push batches of ``--batch`` messages (1 and 100) for
  ``--duration`` seconds (10); msgs/s, p50/p99 of a request, WAL bytes per message.
- ``pop/ack``: the queue is topped up to ``--pop-backlog`` messages (40,000; unmeasured), then
  ``--consumers`` (1, then 4) concurrent consumers pop batches of ``--pop-batch`` (100) and
  acknowledge each batch with one call, until the queue is empty or the duration is over;
  msgs/s acknowledged and WAL bytes per message. Several consumers of one queue is where a
  queue-wide lock would show.

Every cell also splits its CPU per message by role: the broker's process tree, the
PostgreSQL cluster, and this process (the load client).

Durable: ``POST /api/v1/push`` and ``GET /api/v1/pop/queue/{q}`` + ``POST /api/v1/ack/batch``.
Ephemeral: ``POST /api/v1/ephemeral/push``, ``GET /api/v1/ephemeral/pop`` and ``POST
/api/v1/ephemeral/ack``. WAL is read with ``pg_current_wal_lsn()`` around each cell (the whole
cluster's: run it on a server nothing else writes to); with ``fsync`` and
``synchronous_commit`` on, the durable cells pay one WAL flush per commit, the ephemeral ones
none (UNLOGGED tables).

``python -m bench.ephemeral`` prints a Markdown table (``--quick``: 3 s cells) from a private
PostgreSQL cluster started for the run (``--server-dsn DSN``: that server instead); the suite
runs it as its ``ephemeral`` section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import psycopg

from bench.consume import Http
from bench.push import (
    RoleCpu,
    Server,
    create_database,
    db_name,
    drop_database,
    private_server,
    start_queen,
)

_PAD = "x" * 160


@dataclass(frozen=True)
class Cell:
    kind: str  # durable | ephemeral
    op: str  # push | pop/ack
    batch: int
    connections: int
    msgs: int
    seconds: float
    msgs_per_s: float
    p50_ms: float
    p99_ms: float
    wal_bytes_per_msg: float
    errors: int
    cpu_broker_us_per_msg: float | None = None
    cpu_pg_us_per_msg: float | None = None
    cpu_client_us_per_msg: float | None = None


def _payload(producer: int, seq: int) -> dict[str, Any]:
    return {"producer": producer, "seq": seq, "pad": _PAD}


class _Kind:
    """The HTTP calls of one kind of queue."""

    def __init__(self, kind: str, queue: str) -> None:
        self.kind, self.queue = kind, queue

    def push_request(self, producer: int, start: int, batch: int) -> tuple[str, bytes]:
        if self.kind == "durable":
            return "/api/v1/push", orjson.dumps({"items": [
                {"queue": self.queue, "partition": f"p{producer}",
                 "payload": _payload(producer, start + i)} for i in range(batch)]})
        return "/api/v1/ephemeral/push", orjson.dumps({
            "queue": self.queue, "partition": f"p{producer}",
            "messages": [{"payload": _payload(producer, start + i)} for i in range(batch)]})

    def pushed(self, status: int, body: bytes) -> int:
        if status != 201:
            return 0
        if self.kind == "durable":
            return sum(1 for x in orjson.loads(body) if x.get("status") == "queued")
        return int(orjson.loads(body)["pushed"])

    async def pop_ack(self, http: Http, batch: int) -> tuple[int, bool]:
        """(messages acknowledged, ok) of one pop and its ack."""
        if self.kind == "durable":
            status, body = await http.request("GET", f"/api/v1/pop/queue/{self.queue}?"
                                              + urlencode({"batch": batch, "wait": "false"}))
            if status == 204:
                return 0, True
            if status != 200:
                return 0, False
            msgs = orjson.loads(body)["messages"]
            status, body = await http.request("POST", "/api/v1/ack/batch", orjson.dumps({
                "acknowledgments": [{"transactionId": m["transactionId"],
                                     "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                                     "status": "completed"} for m in msgs]}))
            return (len(msgs), True) if status == 200 else (0, False)
        status, body = await http.request("GET", "/api/v1/ephemeral/pop?"
                                          + urlencode({"queue": self.queue, "batch": batch}))
        if status != 200:
            return 0, False
        msgs = orjson.loads(body)["messages"]
        if not msgs:
            return 0, True
        status, body = await http.request("POST", "/api/v1/ephemeral/ack", orjson.dumps({
            "queue": self.queue, "acks": [{"id": m["id"]} for m in msgs]}))
        if status != 200:
            return 0, False
        return sum(1 for x in orjson.loads(body)["results"] if x["outcome"] == "acked"), True


class _Wal:
    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

    def lsn(self) -> str:
        row = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def since(self, lsn: str) -> int:
        row = self.conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)",
                                (lsn,)).fetchone()
        assert row is not None
        return int(row[0])


async def _push_cell(url: str, kind: _Kind, batch: int, connections: int, duration: float,
                     wal: _Wal, cpu: RoleCpu) -> Cell:
    times: list[float] = []
    counts = [0] * connections
    errors = 0
    stop = 0.0  # set once the cell's clock starts

    async def producer(i: int) -> None:
        nonlocal errors
        seq = 0
        with closing(Http(url)) as http:
            while seq == 0 or time.monotonic() < stop:  # a request at least, however slow
                path, body = kind.push_request(i, seq, batch)
                t0 = time.perf_counter()
                status, answer = await http.request("POST", path, body)
                times.append(time.perf_counter() - t0)
                got = kind.pushed(status, answer)
                errors += batch - got
                counts[i] += got
                seq += batch

    lsn, c0 = wal.lsn(), cpu.snap()
    t0 = time.monotonic()
    stop = t0 + duration
    await asyncio.gather(*(producer(i) for i in range(connections)))
    seconds = time.monotonic() - t0
    msgs = sum(counts)
    return _cell(kind.kind, "push", batch, connections, msgs, seconds, times,
                 wal.since(lsn), errors, cpu.since(c0))


async def _fill(url: str, kind: _Kind, n: int, connections: int) -> int:
    """Pushes about ``n`` messages (100 per request, unmeasured); how many were stored."""
    counts = [0] * connections
    per = -(-n // connections)

    async def producer(i: int) -> None:
        with closing(Http(url)) as http:
            while counts[i] < per:
                path, body = kind.push_request(i, 1_000_000_000 + counts[i], 100)
                status, answer = await http.request("POST", path, body)
                got = kind.pushed(status, answer)
                if not got:
                    raise RuntimeError(f"filling {kind.kind}: {status} {answer[:300]!r}")
                counts[i] += got

    await asyncio.gather(*(producer(i) for i in range(connections)))
    return sum(counts)


async def _pop_cell(url: str, kind: _Kind, batch: int, connections: int, duration: float,
                    wal: _Wal, cpu: RoleCpu) -> Cell:
    times: list[float] = []
    counts = [0] * connections
    errors = 0
    stop = 0.0  # set once the cell's clock starts

    async def consumer(i: int) -> None:
        nonlocal errors
        empty = 0
        with closing(Http(url)) as http:
            while (not times or time.monotonic() < stop) and empty < 2:
                t0 = time.perf_counter()
                got, ok = await kind.pop_ack(http, batch)
                times.append(time.perf_counter() - t0)
                errors += 0 if ok else 1
                counts[i] += got
                empty = empty + 1 if got == 0 else 0

    lsn, c0 = wal.lsn(), cpu.snap()
    t0 = time.monotonic()
    stop = t0 + duration
    await asyncio.gather(*(consumer(i) for i in range(connections)))
    seconds = time.monotonic() - t0
    return _cell(kind.kind, "pop/ack", batch, connections, sum(counts), seconds, times,
                 wal.since(lsn), errors, cpu.since(c0))


def _cell(kind: str, op: str, batch: int, connections: int, msgs: int, seconds: float,
          times: list[float], wal_bytes: int, errors: int, cpu_s: dict[str, float]) -> Cell:
    times = sorted(times) or [0.0]
    per = 1e6 / msgs if msgs else None
    return Cell(kind, op, batch, connections, msgs, seconds, msgs / seconds if seconds else 0.0,
                statistics.median(times) * 1e3, times[int(len(times) * 0.99)] * 1e3,
                wal_bytes / msgs if msgs else 0.0, errors,
                *((cpu_s[k] * per if per else None) for k in ("broker", "pg", "client")))


async def _run(url: str, dsn: str, args: argparse.Namespace, cpu: RoleCpu) -> list[Cell]:
    wal = _Wal(dsn)
    cells: list[Cell] = []
    tag = uuid.uuid4().hex[:6]
    with closing(Http(url)) as http:
        for kind in ("durable", "ephemeral"):
            queue = f"bench-{kind}-{tag}"
            if kind == "ephemeral":
                status, answer = await http.request(
                    "POST", "/api/v1/ephemeral/configure", orjson.dumps({
                        "queue": queue,
                        "options": {"maxLength": 10_000_000, "maxBytes": 1 << 30}}))
                if status != 201:
                    raise RuntimeError(f"configure: {status} {answer[:300]!r}")
            k = _Kind(kind, queue)
            for batch in args.batches:
                cell = await _push_cell(url, k, batch, args.connections, args.duration, wal,
                                        cpu)
                cells.append(cell)
                print(f"  {kind:>9} push  batch {batch:>4}: {cell.msgs_per_s:>9,.0f} msgs/s "
                      f"p50 {cell.p50_ms:.1f} ms, {cell.wal_bytes_per_msg:,.0f} WAL B/msg",
                      file=sys.stderr, flush=True)
            stored = sum(c.msgs for c in cells if c.kind == kind)
            for consumers in args.consumers:
                if stored < args.pop_backlog:  # every pop cell starts from the same backlog
                    stored += await _fill(url, k, args.pop_backlog - stored, args.connections)
                cell = await _pop_cell(url, k, args.pop_batch, consumers, args.duration, wal,
                                       cpu)
                stored -= cell.msgs
                cells.append(cell)
                print(f"  {kind:>9} pop/ack batch {args.pop_batch:>4}, {consumers} consumers: "
                      f"{cell.msgs_per_s:>9,.0f} msgs/s, {cell.wal_bytes_per_msg:,.0f} WAL "
                      "B/msg", file=sys.stderr, flush=True)
    wal.conn.close()
    return cells


def run(args: argparse.Namespace) -> list[Cell]:
    """One broker over a fresh database of ``--server-dsn``'s server (or of a private
    cluster), both kinds measured."""
    with private_server(args.server_dsn) as server_dsn:
        dsn = create_database(server_dsn, f"queen_bench_{uuid.uuid4().hex[:8]}_eph")
        try:
            with tempfile.TemporaryDirectory(prefix="queen-bench-eph-") as tmp:
                server: Server = start_queen(Path(tmp), dsn, workers=args.workers, shards=1)
                try:
                    server.wait_ready()
                    cpu = RoleCpu(server.proc.pid, dsn)
                    return asyncio.run(_run(server.url, dsn, args, cpu))
                finally:
                    server.stop()
        finally:
            drop_database(server_dsn, db_name(dsn))


def render(cells: list[Cell]) -> str:
    def us(v: float | None) -> str:
        return f"{v:,.0f}" if v is not None else "-"

    lines = ["| queue | op | batch | conns | msgs | msgs/s | p50 ms | p99 ms | WAL B/msg "
             "| broker us/msg | PG us/msg | client us/msg | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        lines.append(f"| {c.kind} | {c.op} | {c.batch} | {c.connections} | {c.msgs:,} | "
                     f"{c.msgs_per_s:,.0f} | {c.p50_ms:.1f} | {c.p99_ms:.1f} | "
                     f"{c.wal_bytes_per_msg:,.0f} | {us(c.cpu_broker_us_per_msg)} | "
                     f"{us(c.cpu_pg_us_per_msg)} | {us(c.cpu_client_us_per_msg)} | "
                     f"{c.errors} |")
    by = {(c.kind, c.op, c.batch, c.connections): c for c in cells}
    lines.append("")
    for (kind, op, batch, conns), c in by.items():
        if kind != "ephemeral":
            continue
        d = by.get(("durable", op, batch, conns))
        if d is not None and d.msgs_per_s:
            lines.append(f"- {op} batch {batch}, {conns} connections: ephemeral "
                         f"{c.msgs_per_s / d.msgs_per_s:.2f}x the durable msgs/s")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.ephemeral", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-dsn", default=None,
                    help="PostgreSQL server to create the database on (default: a private "
                         "cluster started for the run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--batches", default="1,100", help="push batch sizes (1,100)")
    ap.add_argument("--pop-batch", type=int, default=100)
    ap.add_argument("--consumers", default="1,4", help="consumer counts of pop/ack (1,4)")
    ap.add_argument("--pop-backlog", type=int, default=None,
                    help="messages stored when a pop/ack cell starts (40000; --quick: 15000)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per cell (10)")
    ap.add_argument("--quick", action="store_true", help="3 s cells")
    ap.add_argument("--json", type=Path, help="also write the cells here")
    args = ap.parse_args(argv)
    args.batches = [int(x) for x in str(args.batches).split(",") if x]
    args.consumers = [int(x) for x in str(args.consumers).split(",") if x]
    if args.quick:
        args.duration = 3.0
    if args.pop_backlog is None:
        args.pop_backlog = 15_000 if args.quick else 40_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cells = run(args)
    print(render(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
