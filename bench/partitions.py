"""Partition scale: does a pop cost the same on a queue of 50,000 partitions as on one of 10?

Unlimited ordered partitions are the broker's promise, so the work of one pop must not grow
with the number of partitions of its queue. Three measurements, each on a queue of its own in
a fresh database (issue 26's targets in brackets):

- ``pop p50``: single-message pops (queue mode, ``autoAck``) from a queue of ``--small``
  partitions (10) and from one of ``--large`` partitions (50,000), each partition holding
  enough messages for every pop; p50 and p99 per pop, and the broker's and PostgreSQL's CPU
  per pop. [large p50 within 1.5x of small]
- ``drain``: a queue of ``--drain`` (5,000) partitions with one message each, drained by one
  consumer popping one message at a time (autoAck) until a pop finds nothing.
  [under 10 s]
- ``first group pop``: a new consumer group's first pop on the drained queue's partitions
  after each got one more message (its cursor rows are created by that pop).
  [under 100 ms]
- ``live leases``: single-message leased pops, each acked before the next, from a queue
  where ``--leases`` (1,000) other partitions hold live leases, against the same on a queue
  where none does. Reported, not a target of its own: the pop walks the ready index in
  message order and skips every leased cursor it meets there.

``python -m bench.partitions`` (``--quick``: 2,000 large partitions, 1,000 drained) prints a
Markdown report and writes the figures to ``--json`` if given. It drives queen-mp over real
HTTP on the local PostgreSQL (``--server-dsn``), the same broker command line as the suite.
The timed pops and acks go through the suite's own client (bench/consume.py ``Http``: one
keep-alive connection on raw asyncio streams), as the suite's other cells send theirs: an HTTP
client library cost about 800 us of CPU a request here (httpx, measured in the drain), more
than the broker's front worker, and the drain's pops are sequential, so its wall time is about
the sum of every role's CPU a pop; the client's share is reported beside the broker's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg

from bench.consume import Http
from bench.push import (
    LOCAL_DSN,
    Server,
    cpu_ticks,
    create_database,
    database_pids,
    db_name,
    delta_cpu_s,
    drop_database,
    ppid_of,
    proc_file,
    process_tree,
    shard_pids,
    start_queen,
)

PUSH_CHUNK = 1_000  # items per push request while filling
STATS_FLUSH_S = 1.5  # a backend flushes its statistics at most once a second


@dataclass(frozen=True)
class PopFigures:
    partitions: int
    pops: int
    p50_ms: float
    p99_ms: float
    broker_cpu_us_per_pop: float
    pg_cpu_us_per_pop: float


@dataclass(frozen=True)
class DrainCpu:
    """CPU microseconds a pop of the drain, by role: the broker's front workers and shards,
    PostgreSQL (the server's processes that work for the bench's database: ``Broker.cpu``),
    and this client (``Http``), whose requests are sequential, so the drain's wall time is
    about their sum plus the waits."""

    front_us: float
    shard_us: float
    pg_us: float
    client_us: float
    pg_shared_us: float = 0.0  # of pg_us: the server's own processes (WAL writer, checkpointer)


@dataclass(frozen=True)
class Figures:
    small: PopFigures
    large: PopFigures
    drain_partitions: int
    drain_s: float
    drain_pops: int
    drain_cpu: DrainCpu
    first_group_pop_ms: float
    first_group_claimed: int
    unleased: PopFigures
    leased: PopFigures
    live_leases: int
    drain_autovacuum: tuple[str, ...] = ()  # what autovacuum ran on the server meanwhile
    drain_snapshots: tuple[str, ...] = ()  # transactions that held a snapshot meanwhile
    drain_ready_reads: float = 0.0  # ready-index entries a drain's pop read
    drain_slowest: tuple[tuple[int, float], ...] = ()  # (pop number, ms) of its slowest pops
    drain_others: tuple[tuple[str, int], ...] = ()  # other databases' statements (samples)

    @property
    def autovacuum_seen(self) -> str:
        """``drain_autovacuum`` as the reports print it."""
        return "; ".join(self.drain_autovacuum) if self.drain_autovacuum else "none seen"

    @property
    def slow_pops_seen(self) -> str:
        """``drain_slowest`` and ``drain_others`` as the reports print them."""
        slow = ", ".join(f"{ms:,.0f} ms (#{n:,})" for n, ms in self.drain_slowest)
        others = "; ".join(f"{what} x{n}" for what, n in self.drain_others) or "none seen"
        return f"slowest pops: {slow or '-'}; other databases' statements (samples): {others}"

    @property
    def snapshots_seen(self) -> str:
        """``drain_snapshots`` as the reports print it."""
        return "; ".join(self.drain_snapshots) if self.drain_snapshots else "none seen"

    def verdicts(self) -> list[tuple[str, str, str, bool]]:
        """(target, value, threshold, met) rows."""
        ratio = self.large.p50_ms / self.small.p50_ms
        return [
            (f"pop p50, {self.large.partitions:,} vs {self.small.partitions} partitions",
             f"{ratio:.2f}x ({self.large.p50_ms:.2f} vs {self.small.p50_ms:.2f} ms)",
             "<= 1.5x", ratio <= 1.5),
            (f"drain {self.drain_partitions:,} one-message partitions one pop at a time",
             f"{self.drain_s:.1f} s", "< 10 s", self.drain_s < 10),
            (f"a new group's first pop on {self.drain_partitions:,} partitions",
             f"{self.first_group_pop_ms:.1f} ms", "< 100 ms", self.first_group_pop_ms < 100),
        ]


class Broker:
    """One queen-mp over one fresh database, with the CPU of its processes and PostgreSQL's."""

    def __init__(self, server_dsn: str, tmp: Path) -> None:
        self.server_dsn = server_dsn
        self.dsn = create_database(server_dsn, f"queen_bench_{uuid.uuid4().hex[:8]}_parts")
        self.server: Server = start_queen(tmp, self.dsn, workers=2, shards=1)
        try:
            self.server.wait_ready()
            self.http = httpx.Client(base_url=self.server.url, timeout=120)  # untimed fills
            self.loop = asyncio.new_event_loop()
            self.raw = Http(self.server.url, timeout=120)
            with psycopg.connect(self.dsn) as conn:
                backend = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert backend is not None
                # while the backend lives: once the connection closes, its /proc entry goes
                self.postmaster = ppid_of(backend[0])
        except BaseException:  # no broker left running behind a failed start
            self.server.stop()
            drop_database(server_dsn, db_name(self.dsn))
            raise

    def cpu(self) -> tuple[dict[int, int], dict[int, int]]:
        """CPU ticks of the broker's processes, and of the server's processes that work for
        this database (its backends, autovacuum workers on it, the server's own processes).

        NOTE(bench): not the whole server's: on a shared server other users' sessions went into
        the figure (a drain on this 2-core machine: 1,338 us of PostgreSQL a pop, of which
        the broker's own backends had some 500, another helper's database most of the rest)."""
        cluster = process_tree(self.postmaster)
        return (cpu_ticks(process_tree(self.server.proc.pid)),
                cpu_ticks(database_pids(cluster, db_name(self.dsn)) + shared_pids(cluster)))

    def ready_reads(self) -> int:
        """Entries the ready index has given its scans so far (its ``idx_tup_read``), dead ones
        included: PostgreSQL's statistics reach the view once a backend flushes them (at most
        once a second), so the caller waits a little before and after what it counts."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT idx_tup_read FROM pg_stat_user_indexes"
                               " WHERE indexrelname = 'log_consumers_ready_idx'").fetchone()
        return int(row[0]) if row else 0

    def fill(self, queue: str, partitions: int, per: int) -> None:
        items = [(f"p{i}", k) for k in range(per) for i in range(partitions)]
        for start in range(0, len(items), PUSH_CHUNK):
            chunk = items[start:start + PUSH_CHUNK]
            r = self.http.post("/api/v1/push", json={"items": [
                {"queue": queue, "partition": p, "payload": {"k": k}} for p, k in chunk]})
            r.raise_for_status()
            bad = [a for a in r.json() if a["status"] != "queued"]
            assert not bad, bad[:3]

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, parsed JSON body or None) of one request on the timed connection."""
        status, data = self.loop.run_until_complete(self.raw.request(
            method, path, None if body is None else json.dumps(body).encode()))
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        return status, json.loads(data) if data else None

    def pop(self, queue: str, **params: str) -> tuple[float, int]:
        """(seconds, messages) of one pop that does not wait."""
        path = f"/api/v1/pop/queue/{queue}?" + urlencode({"wait": "false", **params})
        t0 = time.perf_counter()
        status, answer = self.request("GET", path)
        elapsed = time.perf_counter() - t0
        return elapsed, 0 if status == 204 else len(answer["messages"])

    def ack(self, message: dict[str, Any]) -> None:
        self.request("POST", "/api/v1/ack", {
            "transactionId": message["transactionId"], "partitionId": message["partitionId"],
            "leaseId": message["leaseId"], "status": "completed"})

    def leased_pop(self, queue: str) -> tuple[float, dict[str, Any]]:
        """(seconds, the message) of one single-message pop that takes a lease."""
        t0 = time.perf_counter()
        status, answer = self.request("GET", f"/api/v1/pop/queue/{queue}?wait=false")
        elapsed = time.perf_counter() - t0
        if status != 200:
            raise RuntimeError(f"pop on {queue}: {status}")
        (message,) = answer["messages"]
        return elapsed, message

    def close(self) -> None:
        self.raw.close()
        self.loop.close()
        self.http.close()
        self.server.stop()
        drop_database(self.server_dsn, db_name(self.dsn))


class ServerWatch:
    """What else the server runs while a measurement does: autovacuum workers take the cores
    the drain's sequential pops need (and, on the bench's own database, count in PostgreSQL's
    share), and a transaction that holds a snapshot (on the bench's database, or anywhere by
    a replication slot or a prepared transaction) keeps every entry a pop left dead in the
    ready index until it ends, so each later pop walks them all (``Broker.ready_reads``). The
    report names both (database: statement) beside the drain, and the sessions of other
    databases it saw running statements (how many samples each: they share the cores)."""

    #: autovacuum workers, and transactions open over a second that hold a snapshot
    _ACTIVITY = ("SELECT backend_type, datname, state, query FROM pg_stat_activity"
                 " WHERE pid <> pg_backend_pid() AND (backend_type = 'autovacuum worker'"
                 " OR (backend_xmin IS NOT NULL AND xact_start < now() - interval '1 second'))")
    #: what holds the horizon of every database
    _GLOBAL = ("SELECT 'replication slot', slot_name FROM pg_replication_slots"
               " WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL"
               " UNION ALL SELECT 'prepared transaction', gid FROM pg_prepared_xacts")

    #: other databases' sessions running a statement
    _OTHERS = ("SELECT datname, application_name, left(query, 60) FROM pg_stat_activity"
               " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
               " AND state = 'active' AND datname <> %s")

    def __init__(self, server_dsn: str, own_db: str, every_s: float = 0.5) -> None:
        self.server_dsn, self.own_db, self.every_s = server_dsn, own_db, every_s
        self.vacuums: dict[str, None] = {}
        self.holders: dict[str, None] = {}
        self.others: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ServerWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            for kind, name in conn.execute(self._GLOBAL):
                self.holders.setdefault(f"{kind} {name}", None)
            while not self.stop.is_set():
                for kind, db, state, query in conn.execute(self._ACTIVITY):
                    seen = self.vacuums if kind == "autovacuum worker" else self.holders
                    seen.setdefault(f"{db}: {query}" if seen is self.vacuums
                                    else f"{db}: {kind} {state}: {query[:80]}", None)
                for db, app, query in conn.execute(self._OTHERS, (self.own_db,)):
                    self.others[f"{db}: {app}: {query}"] += 1
                self.stop.wait(self.every_s)


#: how the titles of the server's own processes end (``postgres: [cluster: ]walwriter``):
#: they work for every database (``Broker.cpu``)
_SHARED = (b": walwriter", b": checkpointer", b": background writer", b": autovacuum launcher")


def shared_pids(pids: list[int]) -> list[int]:
    """The server's own processes among ``pids`` (WAL writer, checkpointer: every commit's
    flush and checkpoint go through them)."""
    return [pid for pid in pids
            if (proc_file(pid, "cmdline") or b"").replace(b"\0", b" ").rstrip().endswith(_SHARED)]


def pop_stats(partitions: int, times: list[float], before: tuple[dict[int, int], dict[int, int]],
              after: tuple[dict[int, int], dict[int, int]]) -> PopFigures:
    """p50/p99 of ``times`` and the broker's and PostgreSQL's CPU per pop between two
    ``Broker.cpu`` readings."""
    pops = len(times)
    times = sorted(times)
    return PopFigures(
        partitions, pops, statistics.median(times) * 1e3, times[int(pops * 0.99)] * 1e3,
        delta_cpu_s(before[0], after[0]) / pops * 1e6,
        delta_cpu_s(before[1], after[1]) / pops * 1e6)


def drain_roles(broker: Broker, before: tuple[dict[int, int], dict[int, int]],
                after: tuple[dict[int, int], dict[int, int]], client_s: float,
                pops: int) -> DrainCpu:
    """``DrainCpu`` between two ``Broker.cpu`` readings; ``client_s`` this process's CPU."""
    shards = shard_pids(after[0])
    front = {p: t for p, t in after[0].items() if p not in shards}
    shard = {p: t for p, t in after[0].items() if p in shards}
    server = set(shared_pids(list(after[1])))
    return DrainCpu(delta_cpu_s(before[0], front) / pops * 1e6,
                    delta_cpu_s(before[0], shard) / pops * 1e6,
                    delta_cpu_s(before[1], after[1]) / pops * 1e6, client_s / pops * 1e6,
                    delta_cpu_s(before[1], {p: t for p, t in after[1].items() if p in server})
                    / pops * 1e6)


def pop_figures(broker: Broker, queue: str, partitions: int, pops: int) -> PopFigures:
    per = max(1, -(-(pops + 20) // partitions))  # every pop finds a message
    broker.fill(queue, partitions, per)
    for _ in range(20):  # warm the pool and the plans
        broker.pop(queue, autoAck="true")
    times: list[float] = []
    before = broker.cpu()
    for _ in range(pops):
        elapsed, got = broker.pop(queue, autoAck="true")
        assert got == 1, f"a pop on {queue} found {got} messages"
        times.append(elapsed)
    return pop_stats(partitions, times, before, broker.cpu())


def lease_figures(broker: Broker, queue: str, leases: int, pops: int) -> PopFigures:
    """Leased pops, each acked before the next, while ``leases`` partitions of the queue hold
    leases taken first (never acked); CPU per pop counts its ack too."""
    partitions = leases + pops + 20
    broker.fill(queue, partitions, 1)
    for _ in range(leases):
        broker.leased_pop(queue)
    for _ in range(20):  # warm the pool and the plans
        broker.ack(broker.leased_pop(queue)[1])
    times: list[float] = []
    before = broker.cpu()
    for _ in range(pops):
        elapsed, message = broker.leased_pop(queue)
        broker.ack(message)
        times.append(elapsed)
    return pop_stats(partitions, times, before, broker.cpu())


def run(args: argparse.Namespace) -> Figures:
    with tempfile.TemporaryDirectory(prefix="queen-bench-parts-") as tmp:
        broker = Broker(args.server_dsn, Path(tmp))
        try:
            print(f"pop p50: {args.small} partitions ...", file=sys.stderr)
            small = pop_figures(broker, "scale-small", args.small, args.pops)
            print(f"pop p50: {args.large:,} partitions ...", file=sys.stderr)
            large = pop_figures(broker, "scale-large", args.large, args.pops)

            print(f"drain: {args.drain:,} one-message partitions ...", file=sys.stderr)
            broker.fill("scale-drain", args.drain, 1)
            time.sleep(STATS_FLUSH_S)
            reads0 = broker.ready_reads()
            before, client0 = broker.cpu(), time.process_time()
            t0 = time.perf_counter()
            drained = pops = 0
            times: list[float] = []
            with ServerWatch(args.server_dsn, db_name(broker.dsn)) as watch:
                while True:
                    elapsed, got = broker.pop("scale-drain", autoAck="true")
                    times.append(elapsed)
                    pops += 1
                    if got == 0:
                        break
                    drained += got
            drain_s = time.perf_counter() - t0
            drain_cpu = drain_roles(broker, before, broker.cpu(),
                                    time.process_time() - client0, pops)
            assert drained == args.drain, f"drained {drained} of {args.drain}"
            time.sleep(STATS_FLUSH_S)
            ready_reads = (broker.ready_reads() - reads0) / pops

            broker.fill("scale-drain", args.drain, 1)
            first_s, claimed = broker.pop("scale-drain", consumerGroup="newcomer",
                                          autoAck="true")

            print(f"live leases: 0 and {args.leases:,} ...", file=sys.stderr)
            unleased = lease_figures(broker, "scale-unleased", 0, args.pops)
            leased = lease_figures(broker, "scale-leased", args.leases, args.pops)
        finally:
            broker.close()
    return Figures(small, large, args.drain, drain_s, pops, drain_cpu, first_s * 1e3, claimed,
                   unleased, leased, args.leases, tuple(watch.vacuums), tuple(watch.holders),
                   ready_reads, tuple(sorted(((n + 1, t * 1e3) for n, t in enumerate(times)),
                                             key=lambda x: -x[1])[:3]),
                   tuple(watch.others.most_common(5)))


def render(f: Figures) -> str:
    lines = ["| target | value | threshold | verdict |", "|---|---:|---:|---|"]
    for target, value, threshold, met in f.verdicts():
        lines.append(f"| {target} | {value} | {threshold} | {'**MET**' if met else '**MISSED**'} |")
    lines += ["", "| queue | partitions | pops | p50 ms | p99 ms | broker CPU us/pop "
              "| PostgreSQL CPU us/pop |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, p in (("small", f.small), ("large", f.large),
                    ("no live lease (leased pop + ack)", f.unleased),
                    (f"{f.live_leases:,} live leases (leased pop + ack)", f.leased)):
        lines.append(f"| {name} | {p.partitions:,} | {p.pops:,} | {p.p50_ms:.2f} | "
                     f"{p.p99_ms:.2f} | {p.broker_cpu_us_per_pop:,.0f} | "
                     f"{p.pg_cpu_us_per_pop:,.0f} |")
    lines.append("")
    lines.append(f"Drain: {f.drain_pops:,} pops in {f.drain_s:.1f} s "
                 f"({f.drain_s / f.drain_pops * 1e3:.1f} ms a pop; CPU a pop: front "
                 f"{f.drain_cpu.front_us:,.0f} us, shard {f.drain_cpu.shard_us:,.0f} us, "
                 f"PostgreSQL {f.drain_cpu.pg_us:,.0f} us (its own processes "
                 f"{f.drain_cpu.pg_shared_us:,.0f}), client {f.drain_cpu.client_us:,.0f} "
                 f"us; ready-index entries read a pop: {f.drain_ready_reads:,.1f}). "
                 f"A new group's first pop: "
                 f"{f.first_group_pop_ms:.1f} ms, {f.first_group_claimed} message(s).")
    lines.append(f"Autovacuum during the drain: {f.autovacuum_seen}. "
                 f"Snapshots held during the drain: {f.snapshots_seen}. "
                 f"Drain {f.slow_pops_seen}.")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-dsn", default=LOCAL_DSN)
    ap.add_argument("--small", type=int, default=10)
    ap.add_argument("--large", type=int, default=50_000)
    ap.add_argument("--drain", type=int, default=5_000)
    ap.add_argument("--pops", type=int, default=300, help="measured pops per queue")
    ap.add_argument("--leases", type=int, default=1_000,
                    help="live leases on the queue of the lease measurement")
    ap.add_argument("--quick", action="store_true",
                    help="2,000 large partitions, 1,000 drained, 100 pops")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.quick:
        args.large, args.drain, args.pops = 2_000, 1_000, 100
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = run(args)
    print(render(figures))
    if args.json:
        out: dict[str, Any] = asdict(figures)
        out["verdicts"] = figures.verdicts()
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
