"""Ack throughput: the ack registry + ack fusion ON against both OFF, same PostgreSQL, one run.

``python -m bench.ack`` (``make bench`` runs it after the other benchmarks) does, in one go:

1. creates two fresh databases on the server (``--server-dsn``, default the local
   127.0.0.1:5432 as postgres), ``queen_bench_<id>_on`` and ``queen_bench_<id>_off``, and starts
   two queen-mp brokers (``python -m queen_mp.processes.cli serve``, 2 front workers, 2 shards, each
   migrating its own database at boot): **on** with the defaults (``QUEEN_ACK_REGISTRY=1``,
   ``QUEEN_ACK_FUSION=1``) and **off** with ``QUEEN_ACK_REGISTRY=0 QUEEN_ACK_FUSION=0`` (every
   ack takes the authoritative ``log_ack_by_hash_v1`` path);
2. pre-fills, before anything is timed, one queue per (arm, batch size, round) with ``N``
   messages over ``--partitions`` (50) partitions;
3. for each pop batch size (``--batches``, 1, 10, 100) runs ``--rounds`` rounds in the order
   A B A B (on, off): ``--consumers`` (16) concurrent consumers, each a closed loop on its own
   keep-alive connection, pop (``batch=n``, one partition per pop, long poll) and ack every
   batch with one ``POST /api/v1/ack/batch`` (all ``completed``, with the lease) until all
   ``N`` messages are acked; acks/s = messages acked / (last ack answer - first pop sent);
4. prints a table of the medians and the ratio on / off, and writes
   ``bench/results/ack-<timestamp>.json`` (git-ignored) with every round's raw figures;
5. stops every process it started and drops both databases, also on Ctrl-C, SIGTERM or error.

Exit status: 0 unless the harness itself failed (a broker that does not start or dies, an
interrupted run). Failed acks, unacked messages and log warnings are reported, never fatal.
See bench/README.md for how to read the figures (commits per ack in particular).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import psycopg

from bench import push as pushbench
from bench.push import (
    CLK_TCK,
    LOCAL_DSN,
    RESULTS,
    Interrupted,
    Monitor,
    Server,
    cpu_ticks,
    create_database,
    db_name,
    delta_cpu_s,
    drop_database,
    free_port,
    log_findings,
    machine_ticks,
    process_tree,
)
from queen_mp.db.embedded import EmbeddedPostgres

ARMS = ("on", "off")
SETTINGS = {"on": {"QUEEN_ACK_REGISTRY": "1", "QUEEN_ACK_FUSION": "1"},
            "off": {"QUEEN_ACK_REGISTRY": "0", "QUEEN_ACK_FUSION": "0"}}
GROUP = "bench"
mono = time.monotonic


# ------------------------------------------------------------------------------ servers
def start_broker(arm: str, data_dir: Path, dsn: str, workers: int, shards: int) -> Server:
    port = free_port()
    env = pushbench._clean_env()
    env.update({"QUEEN_PORT": str(port), "QUEEN_DATA_DIR": str(data_dir),
                "QUEEN_WORKERS": str(workers), "QUEEN_V2_FUSION_SHARDS": str(shards),
                "QUEEN_LOG_LEVEL": "info", "QUEEN_SHUTDOWN_TIMEOUT_S": "20",
                "QUEEN_PG_DSN": dsn, **SETTINGS[arm]})
    log = data_dir / "broker.log"
    proc = pushbench._spawn([sys.executable, "-m", "queen_mp.processes.cli", "serve"], env, log)
    return Server(arm, f"http://127.0.0.1:{port}", proc, log, dsn)


# ------------------------------------------------------------------------------ HTTP client
class HttpError(Exception):
    pass


class Http:
    """One keep-alive HTTP/1.1 connection on raw asyncio streams: a few tens of microseconds
    of CPU per request, so the client takes little of the 2 cores from the system under test
    (bench/loadgen.py explains why no HTTP library)."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes | None = None,
                      timeout: float = 60.0) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._request(method, path, body), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                TimeoutError) as ex:
            await self.close()
            raise HttpError(f"{method} {path}: {ex!r}") from ex

    async def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            data = b"".join(parts)
        else:
            data = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, data


def connect(dsn: str, attempts: int = 20) -> psycopg.Connection:
    """An autocommit connection, retried while the (shared) server is out of slots."""
    for n in range(attempts):
        try:
            return psycopg.connect(dsn, autocommit=True, application_name="bench-ack-check")
        except psycopg.OperationalError as ex:
            if "too many clients" not in str(ex) or n == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------ the workload
def partition_name(p: int) -> str:
    return f"p-{p:02d}"


async def prefill(url: str, queue: str, messages: int, partitions: int, tag: str,
                  connections: int = 8) -> int:
    """``messages`` over ``partitions`` partitions in requests of up to 100 items (one
    partition per request); returns the number answered ``queued``."""
    per = [messages // partitions + (1 if p < messages % partitions else 0)
           for p in range(partitions)]
    jobs: list[bytes] = []
    for p, n in enumerate(per):
        for start in range(0, n, 100):
            items = [{"queue": queue, "partition": partition_name(p),
                      "transactionId": f"{tag}-{p}-{i}", "payload": {"p": p, "i": i}}
                     for i in range(start, min(n, start + 100))]
            jobs.append(orjson.dumps({"items": items}))
    queued = 0

    async def worker() -> None:
        nonlocal queued
        http = Http(url)
        try:
            while jobs:
                body = jobs.pop()
                for attempt in range(6):
                    status, data = await http.request("POST", "/api/v1/push", body)
                    # 429 / 503: nothing or maybe something stored; a retry is safe (the
                    # transactionIds deduplicate, a repeat answers "duplicate")
                    if status not in (429, 503) or attempt == 5:
                        break
                    await asyncio.sleep(1.0)
                if status != 201:
                    raise RuntimeError(f"prefill push answered {status}: {data[:300]!r}")
                queued += data.count(b'"status":"queued"') + data.count(b'"status":"duplicate"')
        finally:
            await http.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return queued


@dataclass
class Tally:
    acked: int = 0  # messages whose ack answered success
    batches: int = 0  # /ack/batch calls
    pops: int = 0
    empty_pops: int = 0
    failed_items: int = 0
    errors: list[str] = field(default_factory=list)
    pop_ms: list[float] = field(default_factory=list)
    ack_ms: list[float] = field(default_factory=list)
    first_pop: float | None = None
    last_ack: float | None = None
    stalled: bool = False


async def consume(url: str, queue: str, batch: int, consumers: int, expected: int,
                  deadline_s: float, idle_stop: float) -> Tally:
    """``consumers`` closed loops: pop (long poll, one partition) -> ack the whole batch."""
    t = Tally()
    done = asyncio.Event()
    progress = [mono()]
    pop_path = (f"/api/v1/pop/queue/{queue}?batch={batch}&consumerGroup={GROUP}"
                "&wait=true&timeout=2000")
    stop_at = mono() + deadline_s

    async def loop() -> None:
        http = Http(url)
        try:
            while not done.is_set() and mono() < stop_at:
                t0 = mono()
                if t.first_pop is None:
                    t.first_pop = t0
                try:
                    status, data = await http.request("GET", pop_path)
                except HttpError as ex:
                    t.errors.append(str(ex))
                    continue
                t1 = mono()
                t.pops += 1
                if status == 204:
                    t.empty_pops += 1
                    continue
                if status != 200:
                    t.errors.append(f"pop {status}: {data[:200]!r}")
                    await asyncio.sleep(0.05)
                    continue
                t.pop_ms.append((t1 - t0) * 1000)
                body = orjson.loads(data)
                lease = body["leaseId"]
                items = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                          "status": "completed", "leaseId": lease} for m in body["messages"]]
                doc = orjson.dumps({"consumerGroup": GROUP, "acknowledgments": items})
                try:
                    status, data = await http.request("POST", "/api/v1/ack/batch", doc)
                except HttpError as ex:
                    t.errors.append(str(ex))
                    continue
                t2 = mono()
                t.ack_ms.append((t2 - t1) * 1000)
                t.batches += 1
                if status != 200:
                    t.errors.append(f"ack {status}: {data[:200]!r}")
                    continue
                ok = data.count(b'"success":true')
                t.acked += ok
                t.failed_items += len(items) - ok
                t.last_ack = t2
                if ok:
                    progress[0] = t2
                if t.acked >= expected:
                    done.set()
        finally:
            await http.close()

    async def watchdog() -> None:
        # nothing acked for idle_stop seconds: the messages are not coming (reported)
        while not done.is_set():
            await asyncio.sleep(0.25)
            if mono() - progress[0] > idle_stop:
                t.stalled = True
                done.set()

    tasks = [asyncio.create_task(loop()) for _ in range(consumers)]
    tasks.append(asyncio.create_task(watchdog()))
    waiter = asyncio.create_task(done.wait())
    await asyncio.wait([waiter, *tasks], timeout=deadline_s + 5,
                       return_when=asyncio.FIRST_COMPLETED)
    # everything acked: parked pops of the other consumers are not part of the figure
    for task in [*tasks, waiter]:
        task.cancel()
    await asyncio.gather(*tasks, waiter, return_exceptions=True)
    return t


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]


def metrics(url: str) -> dict[str, Any]:
    status, body = pushbench.http_get(url + "/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}: {body[:300]!r}")
    return json.loads(body)


# ------------------------------------------------------------------------------ the benchmark
@dataclass
class Bench:
    args: argparse.Namespace
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    tmp: Path | None = None
    dbs: dict[str, str] = field(default_factory=dict)
    servers: dict[str, Server] = field(default_factory=dict)
    monitor: Monitor | None = None
    conns: dict[str, psycopg.Connection] = field(default_factory=dict)  # integrity checks
    queued: dict[tuple[str, str], int] = field(default_factory=dict)  # (arm, queue) -> queued
    pg: EmbeddedPostgres | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def messages_for(self, batch: int) -> int:
        return self.args.messages[self.args.batches.index(batch)]

    def setup(self) -> None:
        a = self.args
        self.tmp = Path(tempfile.mkdtemp(prefix=f"queen-bench-ack-{self.run_id}-", dir="/tmp"))
        self.tmp.chmod(0o755)
        if a.embedded:
            self.pg = EmbeddedPostgres(self.tmp / "pg", fsync=True)
            a.server_dsn = self.pg.start()
            print(f"private PostgreSQL cluster in {self.tmp / 'pg'} (port {self.pg.port})",
                  flush=True)
        self.monitor = Monitor(a.server_dsn)
        self.info = machine_info(self.monitor)
        self.info["embedded_cluster"] = a.embedded
        for arm in ARMS:
            self.dbs[arm] = create_database(a.server_dsn, f"queen_bench_{self.run_id}_{arm}")
            # opened now: the server may be short of connections once both brokers run
            self.conns[arm] = connect(self.dbs[arm])
        print(f"run {self.run_id}: databases {', '.join(db_name(d) for d in self.dbs.values())}"
              f"; scratch {self.tmp}", flush=True)
        for arm in ARMS:
            data = self.tmp / f"queen-{arm}"
            data.mkdir()
            data.chmod(0o755)
            self.servers[arm] = start_broker(arm, data, self.dbs[arm], a.workers, a.shards)
        for s in self.servers.values():
            s.wait_ready()
            print(f"  {s.name}: ready on {s.url} (pid {s.proc.pid}, log {s.log_path})",
                  flush=True)

    def queue(self, batch: int, rnd: int) -> str:
        return f"ack-b{batch}-r{rnd}"

    def fill(self) -> None:
        a = self.args
        t0 = mono()
        total = 0
        for arm in ARMS:
            for batch in a.batches:
                n = self.messages_for(batch)
                for rnd in range(1, a.rounds + 1):
                    q = self.queue(batch, rnd)
                    got = asyncio.run(prefill(self.servers[arm].url, q, n, a.partitions,
                                              f"{self.run_id}{arm}{batch}r{rnd}"))
                    self.queued[(arm, q)] = got
                    if got != n:
                        self.notes.append(f"prefill {arm} {q}: {got} of {n} queued")
                    total += got
        print(f"pre-filled {total:,} messages in {mono() - t0:.1f}s", flush=True)

    def check_alive(self, arm: str) -> None:
        s = self.servers[arm]
        if not s.alive():
            raise RuntimeError(f"{arm} died (exit {s.proc.returncode}):\n{s.log_text()[-3000:]}")

    def measure(self, arm: str, batch: int, rnd: int) -> dict[str, Any] | None:
        a = self.args
        assert self.monitor is not None
        self.check_alive(arm)
        server = self.servers[arm]
        name = db_name(self.dbs[arm])
        q = self.queue(batch, rnd)
        n = self.queued.get((arm, q), self.messages_for(batch))
        if n == 0:
            self.notes.append(f"{arm} batch {batch} round {rnd}: nothing was queued; skipped")
            return None
        pg0, m0 = self.monitor.db_stats(name), metrics(server.url)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = {"broker": cpu_ticks(process_tree(server.proc.pid)),
              "pg_db": cpu_ticks(self.monitor.backend_pids(name))}
        mt0 = machine_ticks()
        tally = asyncio.run(consume(server.url, q, batch, a.consumers, n, a.max_run,
                                    a.idle_stop))
        mt1 = machine_ticks()
        c1 = {"broker": cpu_ticks(process_tree(server.proc.pid)),
              "pg_db": cpu_ticks(self.monitor.backend_pids(name))}
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = {k: delta_cpu_s(c0[k], c1[k]) for k in c0}
        # Backends publish their statistics at most once a second, idle ones up to 10 s later
        # (PGSTAT_IDLE_INTERVAL): wait before reading the "after" (--settle).
        time.sleep(a.settle)
        pg1, m1 = self.monitor.db_stats(name), metrics(server.url)
        self.check_alive(arm)
        elapsed = ((tally.last_ack or 0) - (tally.first_pop or 0)) if tally.last_ack else None
        xact = pg1["xact_commit"] - pg0["xact_commit"]
        d_commits = m1["ackFusion"]["commits"] - m0["ackFusion"]["commits"]
        d_rows = m1["ackFusion"]["rows"] - m0["ackFusion"]["rows"]
        d_hits = m1["ackRegistry"]["hits"] - m0["ackRegistry"]["hits"]
        d_misses = m1["ackRegistry"]["misses"] - m0["ackRegistry"]["misses"]
        # Ack transactions. Fast path: one per fusion flush (ackFusion.commits). SQL path: one
        # per (partition, group, lease) group of a request (queen_mp/front/acks.py); every pop here
        # claims one partition, so one per /ack/batch call that did not take the fast path:
        # all of them with the registry off; with it on, the registry misses plus the hits
        # whose flush failed (they fall back to the SQL path: hits - ackFusion.rows, as every
        # lease is acked once here, so no two rows fold). No DLQ filing happens in this
        # workload (all completed), so nothing else commits on the ack path.
        fallback = max(0, d_hits - d_rows)
        sql_path = tally.batches if arm == "off" else d_misses + fallback
        ack_commits = d_commits + sql_path
        conn = self.conns.get(arm)
        if conn is None or conn.closed:
            conn = self.conns[arm] = connect(self.dbs[arm])
        committed = conn.execute(
            "SELECT COALESCE(sum(c.committed_offset), 0) FROM queen.log_consumers c"
            " JOIN queen.log_partitions lp ON lp.id = c.partition_id"
            " JOIN queen.queues qq ON qq.id = lp.queue_id"
            " WHERE qq.name = %s AND c.consumer_group = %s", (q, GROUP)).fetchone()
        out = {
            "arm": arm, "batch": batch, "round": rnd, "queue": q, "messages": n,
            "acked": tally.acked, "committed_in_db": int(committed[0]) if committed else None,
            "ack_calls": tally.batches, "pops": tally.pops, "empty_pops": tally.empty_pops,
            "failed_items": tally.failed_items, "errors": len(tally.errors),
            "error_samples": tally.errors[:5], "elapsed_s": elapsed,
            "acks_per_s": tally.acked / elapsed if elapsed else None,
            "ack_calls_per_s": tally.batches / elapsed if elapsed else None,
            "ack_ms": {"p50": pct(tally.ack_ms, 50), "p99": pct(tally.ack_ms, 99)},
            "pop_ms": {"p50": pct(tally.pop_ms, 50), "p99": pct(tally.pop_ms, 99)},
            "registry_hits": d_hits, "registry_misses": d_misses,
            "fusion_commits": d_commits, "fusion_rows": d_rows,
            "hits_fallen_back": fallback if arm == "on" else 0,
            "ack_commits": ack_commits,
            "ack_commits_per_call": ack_commits / tally.batches if tally.batches else None,
            "xact_commit_delta": xact,
            "xact_per_call": xact / tally.batches if tally.batches else None,
            "cpu_s": {"broker": round(cpu["broker"], 3), "pg_db": round(cpu["pg_db"], 3),
                      "client": round((ru1.ru_utime - ru0.ru_utime)
                                      + (ru1.ru_stime - ru0.ru_stime), 3)},
            "machine_busy_pct": (round(100 * (mt1[0] - mt0[0]) / (mt1[1] - mt0[1]), 1)
                                 if mt1[1] > mt0[1] else None),
            "other_cpu_s": round(((mt1[0] - mt0[0]) / CLK_TCK) - cpu["broker"] - cpu["pg_db"]
                                 - (ru1.ru_utime - ru0.ru_utime) - (ru1.ru_stime - ru0.ru_stime),
                                 3),
            "cpu_ms_per_1k_acks": {
                k: round(1e6 * v / tally.acked, 1) if tally.acked else None
                for k, v in cpu.items()},
        }
        out["stalled"] = tally.stalled
        if arm == "on" and fallback:
            self.notes.append(f"on batch {batch} round {rnd}: {fallback} registry hits fell back "
                              "to the SQL path (a failed fusion flush: see the on log)")
        if tally.acked < n:
            why = (f"nothing acked for {a.idle_stop:g}s" if tally.stalled
                   else f"not within {a.max_run:g}s")
            self.notes.append(f"{arm} batch {batch} round {rnd}: only {tally.acked} of {n} "
                              f"acked, {why} ({len(tally.errors)} errors)")
        return out

    def run(self) -> None:
        a = self.args
        for batch in a.batches:
            for rnd in range(1, a.rounds + 1):
                for arm in ARMS:
                    print(f"  batch {batch:>3}, round {rnd}, {arm:>3}: "
                          f"{self.messages_for(batch):,} messages ...", end="", flush=True)
                    r = self.measure(arm, batch, rnd)
                    if r is None:
                        print(" skipped (nothing queued)", flush=True)
                        continue
                    self.rounds.append(r)
                    print(f" {fmt(r['acks_per_s'], 0)} acks/s in {fmt(r['elapsed_s'], 2)}s, "
                          f"ack p50 {fmt(r['ack_ms']['p50'])} ms, "
                          f"{fmt(r['ack_commits_per_call'], 3)} ack commits/call, "
                          f"{fmt(r['xact_per_call'], 2)} xact/call, hits {r['registry_hits']}, "
                          f"misses {r['registry_misses']}, errors {r['errors']}, "
                          f"machine busy {fmt(r['machine_busy_pct'], 0)}%", flush=True)


def machine_info(m: Monitor) -> dict[str, Any]:
    settings = {name: m.one("SELECT current_setting(%s)", (name,))
                for name in ("synchronous_commit", "fsync", "wal_sync_method", "commit_delay",
                             "max_connections")}
    return {"nproc": os.cpu_count(), "loadavg_at_start": os.getloadavg(),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "postgres_version": m.one("SHOW server_version"), "postgres_settings": settings}


# ------------------------------------------------------------------------------ summary
def fmt(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(rounds: list[dict[str, Any]], batches: list[int]) -> list[dict[str, Any]]:
    out = []
    for batch in batches:
        row: dict[str, Any] = {"batch": batch}
        for arm in ARMS:
            rs = [r for r in rounds if r["arm"] == arm and r["batch"] == batch]
            row[arm] = {k: med([r[k] for r in rs]) for k in
                        ("acks_per_s", "ack_calls_per_s", "ack_commits_per_call",
                         "xact_per_call")}
            for k in ("broker", "pg_db"):
                row[arm][f"cpu_{k}"] = med([r["cpu_ms_per_1k_acks"][k] for r in rs])
            row[arm]["ack_p50_ms"] = med([r["ack_ms"]["p50"] for r in rs])
            row[arm]["ack_p99_ms"] = med([r["ack_ms"]["p99"] for r in rs])
            row[arm]["hits"] = sum(r["registry_hits"] for r in rs)
            row[arm]["misses"] = sum(r["registry_misses"] for r in rs)
            row[arm]["errors"] = sum(r["errors"] + r["failed_items"] for r in rs)
            row[arm]["rounds"] = len(rs)

        def ratio(key: str, row: dict[str, Any] = row) -> float | None:
            on, off = row["on"][key], row["off"][key]
            return on / off if on is not None and off else None

        row["ratio_on_off"] = {k: ratio(k) for k in ("acks_per_s", "ack_commits_per_call",
                                                     "xact_per_call", "ack_p50_ms",
                                                     "cpu_broker", "cpu_pg_db")}
        out.append(row)
    return out


def render(summary: list[dict[str, Any]]) -> str:
    head = ("| batch | arm | acks/s | ack calls/s | ack p50 ms | ack p99 ms | ack commits/call "
            "| xact/call (pg_stat) | CPU ms/1k acks broker | CPU ms/1k acks pg | hits | misses "
            "| errors |")
    lines = [head, "|---|---|" + "---:|" * 11]
    for row in summary:
        for arm in ARMS:
            r = row[arm]
            lines.append(f"| {row['batch']} | {arm} | {fmt(r['acks_per_s'], 0)} "
                         f"| {fmt(r['ack_calls_per_s'], 0)} | {fmt(r['ack_p50_ms'])} "
                         f"| {fmt(r['ack_p99_ms'])} | {fmt(r['ack_commits_per_call'], 3)} "
                         f"| {fmt(r['xact_per_call'], 2)} | {fmt(r['cpu_broker'], 0)} "
                         f"| {fmt(r['cpu_pg_db'], 0)} | {r['hits']} | {r['misses']} "
                         f"| {r['errors']} |")
        q = row["ratio_on_off"]
        lines.append(f"| {row['batch']} | **on/off** | **{fmt(q['acks_per_s'], 2)}** | "
                     f"| {fmt(q['ack_p50_ms'], 2)} | | {fmt(q['ack_commits_per_call'], 2)} "
                     f"| {fmt(q['xact_per_call'], 2)} | {fmt(q['cpu_broker'], 2)} "
                     f"| {fmt(q['cpu_pg_db'], 2)} | | | |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main
def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ack", description=__doc__.split("\n")[0])
    p.add_argument("--server-dsn", default=os.environ.get("BENCH_PG_DSN", LOCAL_DSN),
                   help="superuser DSN of the PostgreSQL server (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run (< 90 s): fewer messages, 2 s settle")
    p.add_argument("--batches", type=int_list, default=[1, 10, 100],
                   help="pop batch sizes (default 1,10,100)")
    p.add_argument("--messages", type=int_list, default=None,
                   help="messages per run, one per batch size (default 5000,40000,100000; "
                        "quick 800,5000,15000)")
    p.add_argument("--rounds", type=int, default=None, help="A B rounds (default 3; quick 2)")
    p.add_argument("--consumers", type=int, default=16, help="concurrent consumers (16)")
    p.add_argument("--partitions", type=int, default=50, help="partitions per queue (50)")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds before reading pg_stat_database after a run "
                        "(default 11; quick 2: then xact/call is approximate)")
    p.add_argument("--embedded", action="store_true",
                   help="run on a private PostgreSQL cluster (initdb in the scratch dir, fsync "
                        "on) instead of --server-dsn: no other users' connections or load")
    p.add_argument("--max-run", type=float, default=None,
                   help="give up a run after this many seconds (default 120; quick 30; "
                        "reported, not fatal)")
    p.add_argument("--idle-stop", type=float, default=5.0,
                   help="end a run when nothing was acked for this many seconds (5)")
    p.add_argument("--workers", type=int, default=2, help="front workers per broker (2)")
    p.add_argument("--shards", type=int, default=2, help="shards per broker (2)")
    p.add_argument("--keep-tmp", action="store_true", help="keep the scratch dir and logs")
    a = p.parse_args(argv)
    if a.messages is None:
        defaults = {1: (800, 5000), 10: (5000, 40000), 100: (15000, 100000)}
        a.messages = [defaults.get(b, (100 * b, 600 * b))[0 if a.quick else 1]
                      for b in a.batches]
    if len(a.messages) != len(a.batches):
        p.error("--messages needs one value per --batches value")
    if a.rounds is None:
        a.rounds = 2 if a.quick else 3
    if a.max_run is None:
        a.max_run = 30.0 if a.quick else 120.0
    if a.settle is None:
        a.settle = 2.0 if a.quick else 11.0
    return a


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    started = dt.datetime.now(dt.UTC)
    code = 0
    try:
        bench.setup()
        bench.fill()
        bench.run()
    except (Interrupted, KeyboardInterrupt) as ex:
        print(f"\ninterrupted: {ex!r}", file=sys.stderr)
        code = 130
    except Exception as ex:  # harness failure: report, clean up, exit non-zero
        print(f"\nharness failure: {ex!r}", file=sys.stderr)
        code = 1
    finally:
        logs = cleanup(bench)
    if bench.rounds:
        summary = summarize(bench.rounds, args.batches)
        print()
        print(render(summary))
        for note in bench.notes:
            print(f"note: {note}")
        for arm, found in logs.items():
            if found.get("warning_or_error_lines"):
                print(f"{arm} log: {found['warning_or_error_lines']} warning/error lines, "
                      f"e.g. {found['distinct'][:3]}")
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"ack-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        path.write_text(json.dumps({
            "run_id": bench.run_id, "started": started.isoformat(),
            "args": {k: v for k, v in vars(args).items() if k != "server_dsn"},
            "settings": SETTINGS, "machine": bench.info, "summary": summary,
            "rounds": bench.rounds, "notes": bench.notes, "logs": logs,
            "exit_code": code}, indent=2, default=str))
        print(f"raw results: {path}")
    return code


def cleanup(bench: Bench) -> dict[str, Any]:
    logs: dict[str, Any] = {}
    for conn in bench.conns.values():
        with contextlib.suppress(Exception):
            conn.close()
    for arm, server in bench.servers.items():
        try:
            server.stop()
        except Exception as ex:
            print(f"stopping {arm}: {ex!r}", file=sys.stderr)
        logs[arm] = log_findings(server.log_text())
        logs[arm]["exit_code"] = server.exit_code
    if bench.monitor is not None:
        bench.monitor.close()
    if bench.pg is not None:  # the private cluster goes, and its databases with it
        try:
            bench.pg.stop()
        except Exception as ex:
            print(f"stopping the private cluster: {ex!r}", file=sys.stderr)
    else:
        for dsn in bench.dbs.values():
            try:
                drop_database(bench.args.server_dsn, db_name(dsn))
            except Exception as ex:
                print(f"dropping {db_name(dsn)}: {ex!r}", file=sys.stderr)
    if bench.tmp is not None and not bench.args.keep_tmp:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    elif bench.tmp is not None:
        print(f"scratch kept: {bench.tmp}")
    return logs


if __name__ == "__main__":
    sys.exit(main())
