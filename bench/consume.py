"""Consume path: queen-mp against a naive SKIP LOCKED queue, same PostgreSQL, same run.

``python -m bench.consume`` (``make bench`` runs it after ``bench.push``) does, in one go:

1. creates two fresh databases (``queen_bench_<id>_q`` migrated by queen-mp at boot,
   ``queen_bench_<id>_b`` with ``naive.messages`` plus lease columns) and starts both arms as
   ``bench.push`` does: queen-mp (``python -m queen_mp.processes.cli serve``, 2 front workers,
   2 shards) and the baseline ``bench/consume_baseline.py`` (falcon under gunicorn with
   queen-mp's front settings; ``SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`` + ``UPDATE`` lease
   per pop, ``DELETE`` per ack batch);
2. **end-to-end latency** (``--e2e-rounds`` rounds of A B): one producer pushes single
   messages at ``--e2e-rate`` (50/s) while one consumer pops (queen-mp: long poll
   ``wait=true``, ``batch=10&partitions=10``, a consumer group; baseline: polls every 10 ms
   when a pop comes back empty) and acks each batch with one ``POST /api/v1/ack/batch``;
   latency = the consumer's receipt of the pop answer minus the producer's receipt of the push
   answer of that message (same process, monotonic clock);
3. **consume throughput** for pop batch 1, 100 and 1000: ``N`` messages pre-filled over 100
   partitions of a fresh queue (not timed), then ``--consumers`` (8) concurrent consumers pop
   and ack each batch with one ``/ack/batch`` call until every message is acked; msgs/s = N /
   time from the first pop to the last ack;
4. **parked-pop wake latency** (queen-mp only, the baseline has no long poll): 1,000 pops
   parked on 1,000 queues, then single pushes, one per queue, at ``--wake-rate``; latency =
   the parked pop's answer minus the push's answer. Push latency to queues nobody waits on
   is measured the same way without and then with the 1,000 parked pops, and so is a short
   closed-loop push burst (``bench/loadgen.py``);
5. prints a table per section (ratio queen-mp / baseline where a baseline applies), writes
   ``bench/results/consume-<timestamp>.json`` and stops everything it started.

See bench/README.md for how to read the figures. Exit status: 0 unless the harness itself
failed (a server that does not start or dies, an interrupted run); slow figures, HTTP errors
and undelivered messages are reported, never fatal.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import datetime as dt
import json
import os
import re
import resource
import secrets
import shutil
import sys
import tempfile
import threading
import time
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import orjson
import psycopg

from bench import push as pushbench
from bench.consume_baseline import SCHEMA_SQL
from bench.loadgen import PAYLOAD_BYTES, LoadRun, LoadSpec, percentiles
from bench.push import (
    CLK_TCK,
    LOCAL_DSN,
    RESULTS,
    Monitor,
    Server,
    cpu_ticks,
    create_database,
    db_name,
    delta_cpu_s,
    drop_database,
    fmt,
    kill_tree,
    log_findings,
    machine_ticks,
    med,
    process_tree,
    start_queen,
)

ARMS = ("queen-mp", "baseline")
BATCHES = (1, 100, 1000)
mono = time.monotonic


# ------------------------------------------------------------------------------ servers
def start_baseline(tmp: Path, dsn: str, workers: int, pool: int) -> Server:
    """bench.push.start_baseline's command line, serving bench/consume_baseline.py."""
    return pushbench.start_front_app(
        tmp, "baseline", "bench.consume_baseline:app_from_env()", workers,
        {"BENCH_BASELINE_DSN": dsn, "BENCH_BASELINE_POOL": str(pool)}, dsn)


def start_edge(tmp: Path, workers: int) -> Server:
    """The same command line serving bench/edge_app.py (no database)."""
    return pushbench.start_front_app(tmp, "edge", "bench.edge_app:app_from_env()", workers,
                                     {}, "")


# ------------------------------------------------------------------------------ HTTP client
class HttpError(Exception):
    pass


class Http:
    """One keep-alive HTTP/1.1 connection on raw asyncio streams (as bench/loadgen.py: a
    client library would cost several times more CPU on a machine the broker shares)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.timeout = timeout
        self.rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.host_hdr = f"Host: {self.host}:{self.port}\r\n".encode()

    async def connect(self) -> None:
        if self.rw is None:
            self.rw = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 22), self.timeout)

    def close(self) -> None:
        if self.rw is not None:
            with contextlib.suppress(Exception):
                self.rw[1].close()
            self.rw = None

    async def request(self, method: str, path: str, body: bytes | None = None,
                      timeout: float | None = None) -> tuple[int, bytes]:
        try:
            await self.connect()
            assert self.rw is not None
            reader, writer = self.rw
            head = f"{method} {path} HTTP/1.1\r\n".encode() + self.host_hdr
            if body is None:
                writer.write(head + b"\r\n")
            else:
                writer.write(head + b"Content-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
            async with asyncio.timeout(timeout or self.timeout):
                status, data, close = await self._read(reader)
            if close:
                self.close()
            return status, data
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError) as ex:
            self.close()
            raise HttpError(f"{type(ex).__name__}: {ex}") from ex
        except BaseException:  # cancelled mid-request: the connection is in an unknown state
            self.close()
            raise

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        low = head.lower()
        close = b"\r\nconnection: close" in low
        if b"\r\ntransfer-encoding: chunked" in low:
            chunks = []
            while True:
                size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                chunks.append((await reader.readexactly(size + 2))[:-2])
            return status, b"".join(chunks), close
        at = low.find(b"\r\ncontent-length:")
        if at < 0:
            if status in (204, 304) or 100 <= status < 200:
                return status, b"", close
            raise ValueError(f"answer {status} without content-length")
        length = int(low[at + 17:low.index(b"\r\n", at + 17)])
        return status, await reader.readexactly(length), close


# ------------------------------------------------------------------------------ the two arms
@dataclass(frozen=True)
class Arm:
    name: str
    url: str

    @property
    def long_poll(self) -> bool:
        """Speaks queen's pop and ack (the edge arm mimics them; it never answers 204)."""
        return self.name in ("queen-mp", "edge")

    def pop_path(self, queue: str, batch: int, partitions: int, group: str,
                 wait_ms: int = 2000, extra: str = "") -> str:
        q = quote(queue, safe="")
        if self.long_poll:
            return (f"/api/v1/pop/queue/{q}?batch={batch}&partitions={partitions}"
                    f"&consumerGroup={quote(group, safe='')}&wait=true&timeout={wait_ms}{extra}")
        # The baseline has no long poll (and no groups, no partitions): the caller polls.
        return f"/api/v1/pop/queue/{q}?batch={batch}&consumerGroup={quote(group, safe='')}"

    def ack_body(self, messages: list[dict[str, Any]], group: str) -> bytes:
        if self.long_poll:
            return orjson.dumps({"consumerGroup": group, "acknowledgments": [
                {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                 "leaseId": m["leaseId"], "status": "completed"} for m in messages]})
        return orjson.dumps({"acknowledgments": [{"id": m["id"], "leaseId": m["leaseId"]}
                                                 for m in messages]})


_PAD = "x" * PAYLOAD_BYTES


def payload(producer: str, seq: int) -> dict[str, Any]:
    """The 200-byte JSON payload of bench/loadgen.py."""
    head = len(f'{{"producer":"{producer}","seq":{seq},"pad":""}}')
    return {"producer": producer, "seq": seq, "pad": _PAD[:max(0, PAYLOAD_BYTES - head)]}


def push_body(items: list[tuple[str, str, str, dict[str, Any]]]) -> bytes:
    return orjson.dumps({"items": [{"queue": q, "partition": p, "transactionId": t,
                                    "payload": d} for q, p, t, d in items]})


def push_verdict(status: int, answer: bytes) -> str:
    """``queued`` for a 201 whose items are all queued, else what went wrong: ``http_503``,
    ``status_buffered`` (accepted into queen-mp's disk spool, replayed into PostgreSQL
    later: not deliverable yet), ..."""
    if status != 201:
        return f"http_{status}"
    if answer.count(b'"status":"') == answer.count(b'"status":"queued"'):
        return "queued"
    for word in (b"buffered", b"duplicate", b"failed"):
        if b'"status":"' + word + b'"' in answer:
            return "status_" + word.decode()
    return "bad_body"


async def push_to_all(url: str, queues: list[str], producer: str) -> None:
    """One message to each queue's Default partition, in 500-item requests (the wake
    section's queues; bench/parkmem.py's)."""
    http = Http(url, timeout=120)
    try:
        for s in range(0, len(queues), 500):
            body = push_body([(q, "Default", f"{producer}-{q}", payload(producer, i))
                              for i, q in enumerate(queues[s:s + 500])])
            status, answer = await http.request("POST", "/api/v1/push", body)
            if status != 201:
                raise RuntimeError(f"push to the wake queues: {status} {answer[:300]!r}")
    finally:
        http.close()


def lat_ms(values: list[float]) -> dict[str, float | None]:
    return percentiles(values, (50, 90, 99, 99.9))


@dataclass
class OpStats:
    """Counters and latencies of one consumer loop (or several, merged)."""
    pops: int = 0
    empty_pops: int = 0
    delivered: int = 0
    acked: int = 0
    ack_failed: int = 0
    pop_lat: list[float] = field(default_factory=list)
    ack_lat: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    # (kind "pop" / "ack", sent, answer read) of every request: e2e_breakdown's timeline
    ops: list[tuple[str, float, float]] = field(default_factory=list)

    def error(self, key: str, what: str) -> None:
        self.errors[key] += 1
        if len(self.samples) < 5:
            self.samples.append(what[:300])

    def reset(self) -> dict[str, Any]:
        """The report so far, then every counter back to zero (same object: the running
        consumer loops keep writing into it)."""
        rep = self.report()
        fresh = OpStats()
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))
        return rep

    def report(self) -> dict[str, Any]:
        return {"pops": self.pops, "empty_pops": self.empty_pops, "delivered": self.delivered,
                "acked": self.acked, "ack_failed_items": self.ack_failed,
                "msgs_per_pop": self.delivered / (self.pops - self.empty_pops)
                if self.pops > self.empty_pops else None,
                "pop_latency_ms": lat_ms(self.pop_lat), "ack_latency_ms": lat_ms(self.ack_lat),
                "errors": dict(self.errors), "error_samples": self.samples}


def e2e_breakdown(sent: dict[str, tuple[float, float]], recv: dict[str, float],
                  ops: list[tuple[str, float, float]]) -> dict[str, Any] | None:
    """Where a message's e2e time went, on the one consumer's timeline: the pop that carried
    it was already waiting when the push was answered (``caught``: all of it is that pop), or
    the consumer was busy and came back later: the rest of earlier pops and acks after the push
    answer, the client's own gaps between them, then the carrying pop from send to answer.
    Means in ms over every message and over the slowest 1% (what makes the p99)."""
    pops = {t1: t0 for kind, t0, t1 in ops if kind == "pop"}
    timeline = sorted((t0, t1, kind) for kind, t0, t1 in ops)
    starts = [t0 for t0, _, _ in timeline]
    rows: list[tuple[float, dict[str, float]]] = []
    for txn, (_, t_a) in sent.items():
        t_r = recv.get(txn)
        if t_r is None or t_r not in pops:
            continue
        p0 = pops[t_r]
        if p0 <= t_a:
            rows.append((t_r - t_a, {"caught": t_r - t_a}))
            continue
        part = {"earlier_pop": 0.0, "ack": 0.0, "client_gap": 0.0, "carrying_pop": t_r - p0}
        busy = 0.0
        i = max(0, bisect.bisect_right(starts, t_a) - 1)
        while i < len(timeline) and timeline[i][0] < p0:
            o0, o1, kind = timeline[i]
            span = max(0.0, min(o1, p0) - max(o0, t_a))
            part["ack" if kind == "ack" else "earlier_pop"] += span
            busy += span
            i += 1
        part["client_gap"] = max(0.0, p0 - t_a - busy)
        rows.append((t_r - t_a, part))
    if not rows:
        return None
    rows.sort(key=lambda r: r[0])

    def means(sel: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
        keys = ("caught", "earlier_pop", "ack", "client_gap", "carrying_pop")
        return {k: round(sum(p.get(k, 0.0) for _, p in sel) / len(sel) * 1e3, 3)
                for k in keys} | {
            "caught_share": round(sum("caught" in p for _, p in sel) / len(sel), 3)}

    def op_ms(kind: str) -> dict[str, float | None]:
        lat = percentiles([t1 - t0 for k, t0, t1 in ops if k == kind], (50, 99))
        return {k: round(v, 3) if v is not None else None for k, v in lat.items()
                if k in ("p50", "p99", "max")}

    return {"messages": len(rows), "all_ms": means(rows),
            "slowest_1pct_ms": means(rows[-max(1, len(rows) // 100):]),
            "pop_ms": op_ms("pop"), "ack_ms": op_ms("ack")}


class PgWaits:
    """What the arm's database backends were doing during a window, sampled from
    ``pg_stat_activity`` every ``every_s`` on a connection of its own in a thread (opt-in:
    ``--e2e-pg-waits``; the sampling costs the client and PostgreSQL a little CPU). Counts by
    (role, statement, wait event): "cpu" where the backend waits on nothing (running or
    runnable), else PostgreSQL's wait event, e.g. IO:WALSync (its own WAL flush) or
    LWLock:WALWrite (queued behind another backend's flush)."""

    _SQL = ("SELECT application_name, wait_event_type, wait_event, query FROM pg_stat_activity "
            "WHERE datname = %s AND state = 'active' AND pid <> pg_backend_pid()")

    def __init__(self, server_dsn: str, database: str, every_s: float = 0.005) -> None:
        self.server_dsn, self.database, self.every_s = server_dsn, database, every_s
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-waits", daemon=True)

    def __enter__(self) -> PgWaits:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with psycopg.connect(self.server_dsn, autocommit=True,
                             application_name="bench-pg-waits") as conn:
            while not self._stop.wait(self.every_s):
                for app, wtype, wevent, query in conn.execute(self._SQL, (self.database,)):
                    self.counts[(_role(app or ""), _statement(query or ""),
                                 f"{wtype}:{wevent}" if wtype else "cpu")] += 1
                self.samples += 1

    def report(self, top: int = 12) -> dict[str, Any]:
        """Shares of all active-backend samples, largest first."""
        total = sum(self.counts.values())
        return {"samples": self.samples, "active_backend_samples": total,
                "top": [{"role": r, "statement": q, "wait": w, "share": round(n / total, 3)}
                        for (r, q, w), n in self.counts.most_common(top)] if total else []}


def _role(app: str) -> str:
    """'queen-mp shard 0 acks' -> 'shard acks', 'queen-mp front-1234' -> 'front'."""
    return re.sub(r"[-\s]*\d+", "", app.removeprefix("queen-mp ")).strip() or "?"


def _statement(query: str) -> str:
    m = re.search(r"queen\.(\w+)", query)
    return m.group(1) if m else query.split(None, 1)[0].lower() if query else "?"


async def consumer_loop(arm: Arm, http: Http, queue: str, batch: int, partitions: int,
                        group: str, st: OpStats, on_batch: Any, poll_s: float,
                        wait_ms: int = 2000) -> None:
    """Pop, ack the whole batch with one /ack/batch call, repeat (until cancelled)."""
    path = arm.pop_path(queue, batch, partitions, group, wait_ms)
    while True:
        t0 = mono()
        try:
            status, body = await http.request("GET", path, timeout=wait_ms / 1000 + 30)
        except HttpError as ex:
            st.error("pop_" + str(ex).split(":")[0], str(ex))
            await asyncio.sleep(0.05)
            continue
        t1 = mono()
        st.pops += 1
        st.pop_lat.append(t1 - t0)
        st.ops.append(("pop", t0, t1))
        if status == 204:
            st.empty_pops += 1
            if not arm.long_poll:
                await asyncio.sleep(poll_s)
            continue
        if status != 200:
            st.error(f"pop_http_{status}", f"pop {status} {body[:200]!r}")
            await asyncio.sleep(0.05)
            continue
        msgs = orjson.loads(body)["messages"]
        st.delivered += len(msgs)
        on_batch(msgs, t1)
        ack = arm.ack_body(msgs, group)
        for attempt in range(3):
            t2 = mono()
            try:
                status, body = await http.request("POST", "/api/v1/ack/batch", ack)
            except HttpError as ex:
                st.error("ack_" + str(ex).split(":")[0], str(ex))
                continue
            t3 = mono()
            st.ack_lat.append(t3 - t2)
            st.ops.append(("ack", t2, t3))
            if status == 200:
                ok = body.count(b'"success":true')
                st.acked += ok
                if ok != len(msgs):
                    st.ack_failed += len(msgs) - ok
                    st.error("ack_item_failed", f"ack: {ok}/{len(msgs)} ok {body[:200]!r}")
                on_batch(None, ok)
                break
            st.error(f"ack_http_{status}", f"ack {status} {body[:200]!r} (attempt {attempt})")
            await asyncio.sleep(0.05)


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ------------------------------------------------------------------------------ CPU probe
class Probe:
    """CPU of the arm's process tree, of the PostgreSQL cluster, of this process (the
    producer/consumers) and busy time of the whole machine, over a window."""

    def __init__(self, monitor: Monitor, server: Server | None) -> None:
        self.mon, self.server = monitor, server
        self.c0 = self._snap()
        self.m0 = machine_ticks()
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = mono()

    def _snap(self) -> dict[str, dict[int, int]]:
        out = {"pg_cluster": cpu_ticks(self.mon.cluster_pids())}
        if self.server is not None:
            out["broker"] = cpu_ticks(process_tree(self.server.proc.pid))
        return out

    def stop(self) -> dict[str, Any]:
        c1, m1 = self._snap(), machine_ticks()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        el = mono() - self.t0
        cpu: dict[str, Any] = {k: round(delta_cpu_s(self.c0[k], c1[k]), 3) for k in c1}
        cpu["client"] = round((r1.ru_utime - self.r0.ru_utime)
                              + (r1.ru_stime - self.r0.ru_stime), 3)
        busy = (m1[0] - self.m0[0]) / CLK_TCK
        total = (m1[1] - self.m0[1]) / CLK_TCK
        cpu["machine_busy_s"] = round(busy, 3)
        cpu["machine_busy_pct"] = round(100 * busy / total, 1) if total else None
        cpu["other_s"] = round(busy - cpu.get("broker", 0) - cpu["pg_cluster"]
                               - cpu["client"], 3)
        cpu["window_s"] = round(el, 3)
        return cpu


# ------------------------------------------------------------------------------ the benchmark
@dataclass
class Bench:
    args: argparse.Namespace
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    tmp: Path | None = None
    dbs: dict[str, str] = field(default_factory=dict)
    servers: dict[str, Server] = field(default_factory=dict)
    monitor: Monitor | None = None
    load: LoadRun | None = None
    info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    e2e: list[dict[str, Any]] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)
    wake: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=mono)

    # -------------------------------------------------------------- setup
    def setup(self) -> None:
        a = self.args
        self.monitor = Monitor(a.server_dsn)
        # bench.push's machine description needs only a monitor.
        self.info = pushbench.Bench.machine_info(
            types.SimpleNamespace(monitor=self.monitor))  # type: ignore[arg-type]
        used = self.monitor.one("SELECT count(*) FROM pg_stat_activity")
        limit = int(self.monitor.one("SHOW max_connections"))
        self.info["pg_connections_in_use_at_start"] = used
        if limit - used < 60:
            # queen-mp (2 workers, 2 shards) opens about 30, the baseline 2 x --baseline-pool:
            # past max_connections queen-mp answers pushes `buffered` and background work fails.
            self.notes.append(f"PostgreSQL had {used} of {limit} connections in use by others "
                              "at the start; both arms need about 50")
            print(f"warning: {self.notes[-1]}", flush=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"queen-cbench-{self.run_id}-", dir="/tmp"))
        self.tmp.chmod(0o755)
        for arm in a.arms:
            name = f"queen_bench_{self.run_id}_{'q' if arm == 'queen-mp' else 'b'}"
            self.dbs[arm] = create_database(a.server_dsn, name)
        if "baseline" in self.dbs:
            with psycopg.connect(self.dbs["baseline"], autocommit=True) as conn:
                conn.execute(SCHEMA_SQL)
        print(f"run {self.run_id}: databases {', '.join(db_name(d) for d in self.dbs.values())}"
              f"; scratch {self.tmp}", flush=True)
        if "queen-mp" in self.dbs:
            data = self.tmp / "queen-data"
            data.mkdir()
            data.chmod(0o755)
            self.servers["queen-mp"] = start_queen(data, self.dbs["queen-mp"], a.workers,
                                                   a.shards)
        if "baseline" in self.dbs:
            self.servers["baseline"] = start_baseline(self.tmp, self.dbs["baseline"],
                                                      a.workers, a.baseline_pool)
        for s in self.servers.values():
            s.wait_ready()
            print(f"  {s.name} ready on {s.url} (pid {s.proc.pid}, log {s.log_path})",
                  flush=True)

    def clock(self) -> str:
        return f"{mono() - self.t0:5.0f} s"

    def arm(self, name: str) -> Arm:
        server = self.servers[name]
        if not server.alive():
            raise RuntimeError(f"{name} died (exit {server.proc.returncode}):\n"
                               f"{server.log_text()[-3000:]}")
        return Arm(name, server.url)

    def probe(self, arm: str | None) -> Probe:
        assert self.monitor is not None
        return Probe(self.monitor, self.servers[arm] if arm else None)

    # -------------------------------------------------------------- pushing
    async def prefill(self, arm: Arm, queue: str, n: int, partitions: int, tag: str
                      ) -> tuple[float, int]:
        """n messages over ``partitions`` partitions (round robin), pushed in 1000-item
        requests on 4 connections. Every item must come back ``queued`` or ``buffered``
        (queen-mp's spool replays it into PostgreSQL later: the drain then waits for it);
        a request with any other verdict is sent again (same transactionIds: queen-mp
        deduplicates), three times at most. Returns (seconds, items answered buffered)."""
        a = self.args
        per = a.prefill_request
        chunks = [(s, min(per, n - s)) for s in range(0, n, per)]
        todo: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        for c in chunks:
            todo.put_nowait(c)
        producer = f"{self.run_id}{tag}"
        buffered = 0

        async def worker() -> None:
            nonlocal buffered
            http = Http(arm.url, timeout=120)
            try:
                while not todo.empty():
                    start, count = todo.get_nowait()
                    body = push_body([(queue, f"p-{(start + i) % partitions:03d}",
                                       f"{producer}-{start + i}", payload(producer, start + i))
                                      for i in range(count)])
                    for attempt in range(4):
                        try:
                            status, answer = await http.request("POST", "/api/v1/push", body)
                        except HttpError as ex:
                            status, answer = 0, str(ex).encode()
                        q = answer.count(b'"status":"queued"')
                        b = answer.count(b'"status":"buffered"')
                        d = answer.count(b'"status":"duplicate"') if attempt else 0
                        if status == 201 and q + b + d == count:
                            buffered += b
                            break
                        self.notes.append(f"prefill {arm.name} {queue}: push answered "
                                          f"{status} {answer[:200]!r} (attempt {attempt + 1})")
                        await asyncio.sleep(0.5)
                    else:
                        raise RuntimeError(f"prefill of {queue} on {arm.name} failed")
            finally:
                http.close()

        t0 = mono()
        await asyncio.gather(*(worker() for _ in range(a.prefill_connections)))
        if buffered:
            self.notes.append(f"prefill {arm.name} {queue}: {buffered} of {n} items answered "
                              "buffered (spooled, replayed later)")
        return mono() - t0, buffered

    # -------------------------------------------------------------- 1. end-to-end latency
    async def run_e2e(self, arm: Arm, rnd: int) -> dict[str, Any]:
        a = self.args
        tag = f"e{arm.name[0]}{rnd}"
        queue, group = f"e2e-{self.run_id}-{tag}", "e2e"
        producer = f"{self.run_id}{tag}"
        sent: dict[str, tuple[float, float]] = {}
        recv: dict[str, float] = {}
        dup = 0

        def on_batch(msgs: list[dict[str, Any]] | None, t: Any) -> None:
            nonlocal dup
            if msgs is None:
                return
            for m in msgs:
                txn = m["transactionId"]
                if txn in recv:
                    dup += 1
                else:
                    recv[txn] = t

        st = OpStats()
        chttps = [Http(arm.url) for _ in range(a.e2e_consumers)]
        consumers = [asyncio.create_task(consumer_loop(
            arm, h, queue, a.e2e_batch, a.e2e_partitions, group, st, on_batch, a.poll_ms / 1000))
            for h in chttps]
        # Several producer connections: a push is sent on schedule even while an earlier one
        # is still being answered (one connection would pace the rate by the push latency).
        phttps = [Http(arm.url) for _ in range(a.e2e_producers)]
        free: asyncio.Queue[Http] = asyncio.Queue()
        for h in phttps:
            free.put_nowait(h)
        push_errors: Counter[str] = Counter()
        push_samples: list[str] = []

        async def push_one(seq: int, txn: str, items: int = 1) -> tuple[float, float] | None:
            phttp = await free.get()
            try:
                return await push_on(phttp, seq, txn, items)
            finally:
                free.put_nowait(phttp)

        async def push_on(phttp: Http, seq: int, txn: str, items: int
                          ) -> tuple[float, float] | None:
            # `items` messages in one request: seq .. seq + items - 1, txn-0 .. txn-(items-1)
            # when items > 1 (1,000 msgs/s as 100 requests of 10 stays inside what a 2-core
            # broker answers one request at a time).
            body = push_body([(queue, f"p-{(seq + i) % a.e2e_partitions:02d}",
                               txn if items == 1 else f"{txn}-{i}", payload(producer, seq + i))
                              for i in range(items)])
            t0 = mono()
            try:
                status, answer = await phttp.request("POST", "/api/v1/push", body)
            except HttpError as ex:
                push_errors[str(ex).split(":")[0]] += 1
                return None
            t1 = mono()
            verdict = push_verdict(status, answer)
            if verdict != "queued":
                push_errors[verdict] += 1
                if len(push_samples) < 5:
                    push_samples.append(f"{status} {answer[:200]!r}")
                return None
            return t0, t1

        try:
            # Warm-up: one message per partition (creates them), consumed before the window
            # (a message answered other than queued is not waited for).
            warm = 0
            for i in range(a.e2e_partitions):
                warm += await push_one(i, f"{producer}-warm-{i}") is not None
            deadline = mono() + 5
            while st.acked < warm and mono() < deadline:
                await asyncio.sleep(0.02)
            st_warm = st.reset()
            warm_errors = dict(push_errors)
            push_errors.clear()
            probe = self.probe(arm.name)
            waits = (PgWaits(a.server_dsn, db_name(self.dbs[arm.name]))
                     if a.e2e_pg_waits else None)
            if waits is not None:
                waits.__enter__()
            interval = 1 / a.e2e_rate
            t_start = mono()
            nxt = t_start
            seq = 0
            behind = 0
            inflight: set[asyncio.Task[None]] = set()

            async def push_and_record(seq: int, txn: str) -> None:
                got = await push_one(seq, txn, a.e2e_items)
                if got is not None:
                    if a.e2e_items == 1:
                        sent[txn] = got
                    else:
                        sent.update((f"{txn}-{i}", got) for i in range(a.e2e_items))

            while mono() - t_start < a.e2e_duration:
                now = mono()
                if nxt > now:
                    await asyncio.sleep(nxt - now)
                elif now - nxt > interval:
                    behind += 1
                    nxt = now
                nxt += interval
                if free.empty():
                    behind += 1  # every producer connection is still waiting for an answer
                task = asyncio.create_task(push_and_record(seq, f"{producer}-{seq}"))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                seq += a.e2e_items
            if inflight:
                await asyncio.wait(inflight)
            window = mono() - t_start
            cpu = probe.stop()
            if waits is not None:
                waits.__exit__()
            deadline = mono() + a.e2e_grace
            while mono() < deadline and any(t not in recv for t in sent):
                await asyncio.sleep(0.02)
        finally:
            await cancel_all(consumers)
            for h in [*chttps, *phttps]:
                h.close()
        from_answer = [recv[t] - v[1] for t, v in sent.items() if t in recv]
        from_send = [recv[t] - v[0] for t, v in sent.items() if t in recv]
        push_lat = [v[1] - v[0] for v in sent.values()]
        rep = st.report()
        return {
            "arm": arm.name, "round": rnd, "queue": queue, "window_s": round(window, 3),
            "pushed": len(sent), "push_attempts": seq, "pushes_behind_schedule": behind,
            "rate_per_s": len(sent) / window if window else None,
            "delivered": len(from_answer), "missing": len(sent) - len(from_answer),
            "redelivered": dup,
            "latency_ms": lat_ms(from_answer), "latency_from_send_ms": lat_ms(from_send),
            "negative_latencies": sum(1 for x in from_answer if x < 0),
            "push_latency_ms": lat_ms(push_lat), "push_errors": dict(push_errors),
            "push_error_samples": push_samples, "consumer": rep, "warmup_consumer": {
                k: st_warm[k] for k in ("pops", "delivered", "acked", "errors")},
            "warmup_push_errors": warm_errors,
            "cpu_s": cpu,
            "samples_ms": [round(x * 1e3, 3) for x in from_answer],
            "breakdown": (e2e_breakdown(sent, recv, st.ops) if a.e2e_consumers == 1
                          else None),
            "pg_waits": waits.report() if waits is not None else None,
        }

    # -------------------------------------------------------------- 2. consume throughput
    async def run_throughput(self, arm: Arm, batch: int, n: int, rnd: int) -> dict[str, Any]:
        a = self.args
        tag = f"t{arm.name[0]}{batch}r{rnd}"
        queue, group = f"tp-{self.run_id}-{tag}", "tp"
        parts = a.pop_partitions.get(batch, 1)
        fill_s, fill_buffered = await self.prefill(arm, queue, n, a.tp_partitions, tag)
        await asyncio.sleep(a.pause)
        seen: set[str] = set()
        dup = 0
        acked = 0
        done = asyncio.Event()
        t_end = 0.0

        def on_batch(msgs: list[dict[str, Any]] | None, t: Any) -> None:
            nonlocal dup, acked, t_end
            if msgs is None:
                acked += t
                if acked >= n and not done.is_set():
                    t_end = mono()
                    done.set()
                return
            for m in msgs:
                txn = m["transactionId"]
                if txn in seen:
                    dup += 1
                else:
                    seen.add(txn)

        st = OpStats()
        https = [Http(arm.url) for _ in range(a.consumers)]
        for h in https:
            await h.connect()
        probe = self.probe(arm.name)
        t0 = mono()
        tasks = [asyncio.create_task(consumer_loop(arm, h, queue, batch, parts, group, st,
                                                   on_batch, a.poll_ms / 1000, wait_ms=1000))
                 for h in https]
        capped = False
        try:
            await asyncio.wait_for(done.wait(), a.drain_cap)
        except TimeoutError:
            capped = True
            t_end = mono()
        finally:
            cpu = probe.stop()
            await cancel_all(tasks)
            for h in https:
                h.close()
        elapsed = t_end - t0
        # Drained? One more non-waiting pop must find nothing (queen-mp: it also creates
        # nothing; baseline: SKIP LOCKED over an empty queue).
        left = await self.leftover(arm, queue, group)
        rep = st.report()
        return {
            "arm": arm.name, "batch": batch, "round": rnd, "queue": queue, "messages": n,
            "consumers": a.consumers, "pop_partitions": parts if arm.long_poll else None,
            "prefill_s": round(fill_s, 3), "prefill_msgs_per_s": n / fill_s if fill_s else None,
            "prefill_buffered": fill_buffered,
            "elapsed_s": round(elapsed, 3), "drained": not capped,
            "msgs_per_s": min(acked, n) / elapsed if elapsed > 0 else None,
            "acked": acked, "distinct_delivered": len(seen), "redelivered": dup,
            "leftover_pop_status": left, "consumer": rep, "cpu_s": cpu,
        }

    async def leftover(self, arm: Arm, queue: str, group: str) -> int | str:
        http = Http(arm.url)
        try:
            path = arm.pop_path(queue, 1, 1, group).replace("wait=true", "wait=false")
            status, _ = await http.request("GET", path)
            return status
        except HttpError as ex:
            return str(ex)
        finally:
            http.close()

    # -------------------------------------------------------------- 3. parked-pop wakes
    async def parked_count(self, url: str) -> float | None:
        def read() -> float | None:
            status, body = pushbench.http_get(url + "/metrics/prometheus", timeout=10)
            if status != 200:
                return None
            total = None
            for line in body.decode().splitlines():
                if line.startswith("queen_parked_pops"):
                    total = (total or 0.0) + float(line.split()[-1])
            return total
        return await asyncio.to_thread(read)

    async def paced_pushes(self, arm: Arm, queues: list[str], rate: float, producer: str,
                           on_answer: Any = None) -> dict[str, Any]:
        """One single-item push per queue in ``queues``, started every 1/rate s (each on its
        own connection from a small pool, so a slow answer does not delay the next push)."""
        free: list[Http] = [Http(arm.url) for _ in range(8)]
        for h in free:
            await h.connect()
        lat: list[float] = []
        errors: Counter[str] = Counter()
        samples: list[str] = []

        async def one(i: int, queue: str) -> None:
            http = free.pop() if free else Http(arm.url)
            body = push_body([(queue, "Default", f"{producer}-{i}", payload(producer, i))])
            t0 = mono()
            try:
                status, answer = await http.request("POST", "/api/v1/push", body)
            except HttpError as ex:
                errors[str(ex).split(":")[0]] += 1
                return
            finally:
                free.append(http)
            t1 = mono()
            verdict = push_verdict(status, answer)
            if verdict != "queued":
                errors[verdict] += 1
                if len(samples) < 5:
                    samples.append(f"{status} {answer[:200]!r}")
                return
            lat.append(t1 - t0)
            if on_answer is not None:
                on_answer(queue, t0, t1)

        tasks = []
        t_start = mono()
        for i, q in enumerate(queues):
            delay = t_start + i / rate - mono()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, q)))
        await asyncio.gather(*tasks)
        window = mono() - t_start
        for h in free:
            h.close()
        return {"pushes": len(queues), "ok": len(lat), "window_s": round(window, 3),
                "latency_ms": lat_ms(lat), "errors": dict(errors), "error_samples": samples,
                "samples_ms": [round(x * 1e3, 3) for x in lat]}

    def push_burst(self, arm: Arm, tag: str) -> dict[str, Any]:
        a = self.args
        spec = LoadSpec(url=arm.url, connections=a.burst_connections, procs=1, items=1,
                        duration=a.burst_duration, partitions=100, queue=f"burst-{self.run_id}",
                        tag=f"{self.run_id}{tag}")
        probe = self.probe(arm.name)
        self.load = LoadRun(spec, start_delay=1.0)
        try:
            res = self.load.wait()
        finally:
            self.load = None
        cpu = probe.stop()
        return {"connections": a.burst_connections, "duration_s": a.burst_duration,
                "msgs_per_s": res["msgs_per_s"], "latency_ms": res["latency_ms"],
                "error_requests": res["error_requests"], "errors": res["errors"],
                "late_requests": res["late_requests"], "cpu_s": cpu}

    async def push_to_all(self, arm: Arm, queues: list[str], producer: str) -> None:
        await push_to_all(arm.url, queues, producer)

    async def run_wake(self, arm: Arm) -> dict[str, Any]:
        a = self.args
        n, wakes = a.parked, min(a.wakes, a.parked)
        queues = [f"wake-{self.run_id}-{i:04d}" for i in range(n)]
        # Queues nobody waits on: the "does a parked crowd slow pushes" probe.
        idle = [f"idle-{self.run_id}-{i:04d}" for i in range(wakes)]
        group = "wake"
        out: dict[str, Any] = {"parked_target": n, "wakes": wakes, "rate_per_s": a.wake_rate,
                               "layout": f"one parked pop per queue, {n} queues"}
        # Every queue gets created (queue row, its Default partition) by one bulk push, so
        # no phase below pays creation. The parked pops start their group with
        # subscriptionMode=new: these messages are not theirs.
        await self.push_to_all(arm, queues + idle, f"{self.run_id}-mk")
        # Leftover parked pops of the throughput cells time out within 2 s.
        deadline = mono() + 10
        while mono() < deadline and (await self.parked_count(arm.url) or 0) > 0:
            await asyncio.sleep(0.25)
        await asyncio.sleep(a.pause)

        # (a) push latency with no parked pop: paced single pushes to the idle queues (again
        # in (b), then with 1,000 pops parked elsewhere), and a closed-loop burst.
        print(f"  push latency without parked pops: {wakes} pushes at {a.wake_rate:g}/s ...",
              end="", flush=True)
        probe = self.probe(arm.name)
        without = await self.paced_pushes(arm, idle, a.wake_rate, f"{self.run_id}-np")
        without["cpu_s"] = probe.stop()
        print(f" p50 {fmt(without['latency_ms']['p50'])} ms, "
              f"p99 {fmt(without['latency_ms']['p99'])} ms", flush=True)
        if a.burst_duration > 0:
            print(f"  push burst without parked pops: {a.burst_connections} connections, "
                  f"{a.burst_duration:g}s ...", end="", flush=True)
            without["burst"] = await asyncio.to_thread(self.push_burst, arm, "bw0")
            print(f" {without['burst']['msgs_per_s']:,.0f} msgs/s, "
                  f"p50 {fmt(without['burst']['latency_ms']['p50'])} ms, "
                  f"p99 {fmt(without['burst']['latency_ms']['p99'])} ms", flush=True)

        # (b) park one pop per queue (autoAck: the wake path without ack traffic).
        print(f"  parking {n} pops ...", end="", flush=True)
        pushed: dict[str, tuple[float, float]] = {}
        answered: dict[str, list[tuple[float, int]]] = {q: [] for q in queues}
        pop_errors: Counter[str] = Counter()
        pop_samples: list[str] = []
        stop = asyncio.Event()
        https = [Http(arm.url, timeout=60) for _ in range(n)]
        sem = asyncio.Semaphore(100)

        async def opener(h: Http) -> None:
            async with sem:
                await h.connect()

        await asyncio.gather(*(opener(h) for h in https))
        path_tail = (f"?batch=1&consumerGroup={group}&subscriptionMode=new&autoAck=true"
                     f"&wait=true&timeout={a.park_timeout_ms}")

        async def parked(q: str, h: Http) -> None:
            path = f"/api/v1/pop/queue/{quote(q, safe='')}{path_tail}"
            while not stop.is_set():
                try:
                    status, body = await h.request("GET", path,
                                                   timeout=a.park_timeout_ms / 1000 + 30)
                except HttpError as ex:
                    pop_errors[str(ex).split(":")[0]] += 1
                    await asyncio.sleep(0.1)
                    continue
                t = mono()
                if status in (200, 204):
                    answered[q].append((t, status))
                else:
                    pop_errors[f"http_{status}"] += 1
                    if len(pop_samples) < 5:
                        pop_samples.append(f"{status} {body[:200]!r}")
                    await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(parked(q, h)) for q, h in zip(queues, https, strict=True)]
        try:
            t0 = mono()
            count = 0.0
            while mono() - t0 < a.park_wait:
                count = await self.parked_count(arm.url) or 0.0
                if count >= n:
                    break
                await asyncio.sleep(0.25)
            out["parked_before"] = count
            out["park_setup_s"] = round(mono() - t0, 3)
            print(f" {count:.0f} parked in {mono() - t0:.1f}s", flush=True)
            if count < n:
                self.notes.append(f"wake: only {count:.0f} of {n} pops parked after "
                                  f"{a.park_wait:g}s")
            await asyncio.sleep(a.pause)
            before = {q: len(v) for q, v in answered.items()}
            print(f"  wakes: {wakes} pushes at {a.wake_rate:g}/s, one per watched queue ...",
                  end="", flush=True)
            probe = self.probe(arm.name)
            with_ = await self.paced_pushes(
                arm, queues[:wakes], a.wake_rate, f"{self.run_id}-wp",
                on_answer=lambda q, t0, t1: pushed.__setitem__(q, (t0, t1)))
            deadline = mono() + a.e2e_grace
            while mono() < deadline and any(
                    not any(s == 200 for _, s in answered[q][before[q]:]) for q in pushed):
                await asyncio.sleep(0.02)
            with_["cpu_s"] = probe.stop()
            out["parked_during"] = await self.parked_count(arm.url)
            wl, ws, missed, neg = [], [], 0, 0
            for q, (ps, pa) in pushed.items():
                got = [t for t, s in answered[q][before[q]:] if s == 200]
                if not got:
                    missed += 1
                    continue
                wl.append(got[0] - pa)
                ws.append(got[0] - ps)
                neg += got[0] < pa
            timeouts_204 = sum(1 for q in queues for _, s in answered[q][before[q]:]
                               if s == 204)
            out["wake_latency_ms"] = lat_ms(wl)
            out["wake_latency_from_send_ms"] = lat_ms(ws)
            out["woken"], out["missed"], out["negative"] = len(wl), missed, neg
            out["spurious_204_during_wakes"] = timeouts_204
            out["wake_samples_ms"] = [round(x * 1e3, 3) for x in wl]
            print(f" p50 {fmt(out['wake_latency_ms']['p50'])} ms, "
                  f"p99 {fmt(out['wake_latency_ms']['p99'])} ms, missed {missed}; push p50 "
                  f"{fmt(with_['latency_ms']['p50'])} ms, p99 "
                  f"{fmt(with_['latency_ms']['p99'])} ms", flush=True)
            print(f"  push latency with {n} parked pops, to queues nobody waits on: {wakes} "
                  f"pushes at {a.wake_rate:g}/s ...", end="", flush=True)
            probe = self.probe(arm.name)
            with_idle = await self.paced_pushes(arm, idle, a.wake_rate, f"{self.run_id}-ip")
            with_idle["cpu_s"] = probe.stop()
            print(f" p50 {fmt(with_idle['latency_ms']['p50'])} ms, "
                  f"p99 {fmt(with_idle['latency_ms']['p99'])} ms", flush=True)
            if a.burst_duration > 0:
                print(f"  push burst with {n} parked pops: {a.burst_connections} connections, "
                      f"{a.burst_duration:g}s ...", end="", flush=True)
                burst = await asyncio.to_thread(self.push_burst, arm, "bw1")
                burst["parked_after"] = await self.parked_count(arm.url)
                with_idle["burst"] = burst
                print(f" {burst['msgs_per_s']:,.0f} msgs/s, "
                      f"p50 {fmt(burst['latency_ms']['p50'])} ms, "
                      f"p99 {fmt(burst['latency_ms']['p99'])} ms "
                      f"({burst['parked_after']} parked after)", flush=True)
        finally:
            stop.set()
            # Closing a socket does not end its parked pop: the broker would hold it to its
            # deadline (and its shutdown would wait for it). One message per queue ends them.
            t_rel = mono()
            try:
                await self.push_to_all(arm, queues, f"{self.run_id}-rel")
                await asyncio.wait(tasks, timeout=5)
            except Exception as ex:
                self.notes.append(f"wake: releasing the parked pops failed: {ex}")
            out["release_s"] = round(mono() - t_rel, 3)
            out["unreleased"] = sum(not t.done() for t in tasks)
            await cancel_all(tasks)
            for h in https:
                h.close()
        out["pop_errors"], out["pop_error_samples"] = dict(pop_errors), pop_samples
        out["push_without_parked"] = without
        out["push_with_parked"] = with_idle
        out["push_waking_a_parked_pop"] = with_
        return out

    # -------------------------------------------------------------- the schedule
    async def run(self) -> None:
        a = self.args
        arms = {name: self.arm(name) for name in a.arms}
        if "e2e" in a.sections:
            print(f"[{self.clock()}] 1. end-to-end latency: {a.e2e_rate:g} msgs/s for "
                  f"{a.e2e_duration:g}s, {a.e2e_rounds} round(s) of {' '.join(a.arms)}",
                  flush=True)
            for rnd in range(1, a.e2e_rounds + 1):
                for name in a.arms:
                    print(f"  round {rnd}, {name} ...", end="", flush=True)
                    r = await self.run_e2e(self.arm(name), rnd)
                    self.e2e.append(r)
                    lat = r["latency_ms"]
                    print(f" {r['delivered']}/{r['pushed']} delivered, p50 {fmt(lat['p50'])} "
                          f"ms, p99 {fmt(lat['p99'])} ms, max {fmt(lat['max'])} ms, "
                          f"{r['consumer']['pops']} pops ({r['consumer']['empty_pops']} empty)"
                          , flush=True)
                    await asyncio.sleep(a.pause)
        if "throughput" in a.sections:
            print(f"[{self.clock()}] 2. consume throughput: {a.consumers} consumers, "
                  f"{a.tp_partitions} partitions, batches {a.batches}", flush=True)
            for batch in a.batches:
                n = a.messages[batch]
                for rnd in range(1, a.tp_rounds + 1):
                    for name in a.arms:
                        print(f"  batch {batch}, round {rnd}, {name}: {n:,} msgs ...", end="",
                              flush=True)
                        r = await self.run_throughput(arms[name], batch, n, rnd)
                        self.arm(name)
                        self.throughput.append(r)
                        c = r["consumer"]
                        print(f" prefill {r['prefill_s']:.1f}s; {fmt(r['msgs_per_s'])} msgs/s "
                              f"in {r['elapsed_s']:.1f}s, {c['pops']} pops "
                              f"({c['empty_pops']} empty), errors {sum(c['errors'].values())}"
                              f"{'' if r['drained'] else ' NOT DRAINED (cap)'}", flush=True)
                        await asyncio.sleep(a.pause)
        if "wake" in a.sections and "queen-mp" in arms:
            print(f"[{self.clock()}] 3. parked-pop wakes: {a.parked} parked pops (queen-mp "
                  "only)", flush=True)
            self.wake = await self.run_wake(self.arm("queen-mp"))
            self.arm("queen-mp")
        print(f"[{self.clock()}] done; stopping the servers", flush=True)


# ------------------------------------------------------------------------------ reporting
def ratio(q: float | None, b: float | None) -> float | None:
    return q / b if q is not None and b else None


def summarize(bench: Bench) -> dict[str, Any]:
    s: dict[str, Any] = {"e2e": {}, "throughput": {}, "wake": {}}
    for arm in ARMS:
        rs = [r for r in bench.e2e if r["arm"] == arm]
        if not rs:
            continue
        pooled = sorted(x / 1e3 for r in rs for x in r["samples_ms"])
        lat = lat_ms(pooled)
        s["e2e"][arm] = {
            "rounds": len(rs), "pushed": sum(r["pushed"] for r in rs),
            "delivered": sum(r["delivered"] for r in rs),
            "missing": sum(r["missing"] for r in rs),
            "p50_ms": lat["p50"], "p99_ms": lat["p99"], "max_ms": lat["max"],
            "p50_ms_median_of_rounds": med([r["latency_ms"]["p50"] for r in rs]),
            "p99_ms_median_of_rounds": med([r["latency_ms"]["p99"] for r in rs]),
            "push_p50_ms": med([r["push_latency_ms"]["p50"] for r in rs]),
            "pops": sum(r["consumer"]["pops"] for r in rs),
            "empty_pops": sum(r["consumer"]["empty_pops"] for r in rs),
            "errors": sum(sum(r["consumer"]["errors"].values()) + sum(r["push_errors"].values())
                          for r in rs),
            "cpu_broker_s": med([r["cpu_s"].get("broker") for r in rs]),
            "cpu_pg_s": med([r["cpu_s"]["pg_cluster"] for r in rs]),
            "cpu_other_s": med([r["cpu_s"]["other_s"] for r in rs]),
            "window_s": med([r["window_s"] for r in rs]),
        }
    if "queen-mp" in s["e2e"] and "baseline" in s["e2e"]:
        q, b = s["e2e"]["queen-mp"], s["e2e"]["baseline"]
        s["e2e"]["ratio_queen_over_baseline"] = {
            k: ratio(q[k], b[k]) for k in ("p50_ms", "p99_ms", "max_ms", "cpu_broker_s",
                                           "cpu_pg_s")}
    for batch in sorted({r["batch"] for r in bench.throughput}):
        per: dict[str, Any] = {}
        for arm in ARMS:
            rs = [r for r in bench.throughput if r["arm"] == arm and r["batch"] == batch]
            if not rs:
                continue
            per[arm] = {
                "rounds": len(rs), "messages": rs[0]["messages"],
                "msgs_per_s": med([r["msgs_per_s"] for r in rs]),
                "elapsed_s": med([r["elapsed_s"] for r in rs]),
                "drained": all(r["drained"] for r in rs),
                "msgs_per_pop": med([r["consumer"]["msgs_per_pop"] for r in rs]),
                "pop_p50_ms": med([r["consumer"]["pop_latency_ms"]["p50"] for r in rs]),
                "pop_p99_ms": med([r["consumer"]["pop_latency_ms"]["p99"] for r in rs]),
                "ack_p50_ms": med([r["consumer"]["ack_latency_ms"]["p50"] for r in rs]),
                "ack_p99_ms": med([r["consumer"]["ack_latency_ms"]["p99"] for r in rs]),
                "empty_pops": sum(r["consumer"]["empty_pops"] for r in rs),
                "redelivered": sum(r["redelivered"] for r in rs),
                "errors": sum(sum(r["consumer"]["errors"].values()) for r in rs),
                "cpu_broker_s": med([r["cpu_s"].get("broker") for r in rs]),
                "cpu_pg_s": med([r["cpu_s"]["pg_cluster"] for r in rs]),
                "cpu_client_s": med([r["cpu_s"]["client"] for r in rs]),
                "cpu_other_s": med([r["cpu_s"]["other_s"] for r in rs]),
                "busy_pct": med([r["cpu_s"]["machine_busy_pct"] for r in rs]),
                "prefill_msgs_per_s": med([r["prefill_msgs_per_s"] for r in rs]),
            }
        if "queen-mp" in per and "baseline" in per:
            q, b = per["queen-mp"], per["baseline"]
            per["ratio_queen_over_baseline"] = {
                k: ratio(q[k], b[k]) for k in ("msgs_per_s", "pop_p50_ms", "ack_p50_ms")}
        s["throughput"][f"batch-{batch}"] = per
    w = bench.wake
    if w.get("wake_latency_ms"):
        wo, wi, ww = (w["push_without_parked"], w["push_with_parked"],
                      w["push_waking_a_parked_pop"])
        s["wake"] = {
            "parked": w.get("parked_before"), "woken": w.get("woken"), "missed": w.get("missed"),
            "wake_p50_ms": w["wake_latency_ms"]["p50"], "wake_p99_ms": w["wake_latency_ms"]["p99"],
            "wake_max_ms": w["wake_latency_ms"]["max"],
            "p99_within_50ms": (w["wake_latency_ms"]["p99"] or 1e9) <= 50,
            "push_p50_ms_without": wo["latency_ms"]["p50"],
            "push_p99_ms_without": wo["latency_ms"]["p99"],
            "push_p50_ms_with": wi["latency_ms"]["p50"],
            "push_p99_ms_with": wi["latency_ms"]["p99"],
            "push_p99_ratio_with_over_without": ratio(wi["latency_ms"]["p99"],
                                                      wo["latency_ms"]["p99"]),
            "push_p50_ms_waking": ww["latency_ms"]["p50"],
            "push_p99_ms_waking": ww["latency_ms"]["p99"],
        }
        if "burst" in wo and "burst" in wi:
            s["wake"]["burst_msgs_per_s_without"] = wo["burst"]["msgs_per_s"]
            s["wake"]["burst_msgs_per_s_with"] = wi["burst"]["msgs_per_s"]
            s["wake"]["burst_ratio_with_over_without"] = ratio(wi["burst"]["msgs_per_s"],
                                                               wo["burst"]["msgs_per_s"])
    return s


def render(bench: Bench, s: dict[str, Any]) -> str:
    a = bench.args
    out: list[str] = []
    if s["e2e"]:
        out += ["", f"1. End-to-end latency, push answer -> pop answer, {a.e2e_rate:g} msgs/s, "
                f"{a.e2e_partitions} partitions, {a.e2e_consumers} consumer(s), pop batch "
                f"{a.e2e_batch}; queen-mp long polls, the baseline polls every "
                f"{a.poll_ms:g} ms when empty. Percentiles over all rounds pooled; CPU s per "
                "round (median).", "",
                "| arm | rounds | delivered/pushed | p50 ms | p99 ms | max ms | push p50 ms "
                "| pops (empty) | CPU broker | CPU pg | CPU other | errors |",
                "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for arm in ARMS:
            r = s["e2e"].get(arm)
            if r:
                out.append(f"| {arm} | {r['rounds']} | {r['delivered']}/{r['pushed']} "
                           f"| {fmt(r['p50_ms'], 2)} | {fmt(r['p99_ms'], 2)} "
                           f"| {fmt(r['max_ms'], 2)} | {fmt(r['push_p50_ms'], 2)} "
                           f"| {r['pops']} ({r['empty_pops']}) | {fmt(r['cpu_broker_s'])} "
                           f"| {fmt(r['cpu_pg_s'])} | {fmt(r['cpu_other_s'])} "
                           f"| {r['errors']} |")
        rr = s["e2e"].get("ratio_queen_over_baseline")
        if rr:
            out.append(f"| **queen-mp / baseline** | | | **{fmt(rr['p50_ms'], 2)}x** "
                       f"| **{fmt(rr['p99_ms'], 2)}x** | {fmt(rr['max_ms'], 2)}x | | "
                       f"| {fmt(rr['cpu_broker_s'], 2)}x | {fmt(rr['cpu_pg_s'], 2)}x | | |")
    if s["throughput"]:
        out += ["", f"2. Consume throughput: N messages pre-filled over {a.tp_partitions} "
                f"partitions, {a.consumers} consumers popping and acking each batch with one "
                "/ack/batch call until all N are acked (medians over rounds; CPU s per cell).",
                "",
                "| batch | arm | N | msgs/s | s | msgs/pop | pop p50/p99 ms | ack p50/p99 ms "
                "| empty pops | CPU broker | CPU pg | CPU client | CPU other | busy % | errors |",
                "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for key, per in s["throughput"].items():
            batch = key.split("-")[1]
            for arm in ARMS:
                r = per.get(arm)
                if not r:
                    continue
                flag = "" if r["drained"] else " (cap, not drained)"
                out.append(
                    f"| {batch} | {arm} | {r['messages']:,} | {fmt(r['msgs_per_s'])}{flag} "
                    f"| {fmt(r['elapsed_s'])} | {fmt(r['msgs_per_pop'])} "
                    f"| {fmt(r['pop_p50_ms'])} / {fmt(r['pop_p99_ms'])} "
                    f"| {fmt(r['ack_p50_ms'])} / {fmt(r['ack_p99_ms'])} | {r['empty_pops']} "
                    f"| {fmt(r['cpu_broker_s'])} | {fmt(r['cpu_pg_s'])} "
                    f"| {fmt(r['cpu_client_s'])} | {fmt(r['cpu_other_s'])} "
                    f"| {fmt(r['busy_pct'])} "
                    f"| {r['errors'] + r['redelivered']} |")
            rr = per.get("ratio_queen_over_baseline")
            if rr:
                out.append(f"| {batch} | **queen-mp / baseline** | | "
                           f"**{fmt(rr['msgs_per_s'], 2)}x** | | | {fmt(rr['pop_p50_ms'], 2)}x "
                           f"| {fmt(rr['ack_p50_ms'], 2)}x | | | | | | | |")
    w = s.get("wake")
    if w:
        wd = bench.wake
        wo, wi, ww = (wd["push_without_parked"], wd["push_with_parked"],
                      wd["push_waking_a_parked_pop"])
        out += ["", f"3. Parked-pop wakes (queen-mp only; the baseline has no long poll): "
                f"{wd['parked_target']} pops parked, one per queue, woken by single pushes "
                f"at {a.wake_rate:g}/s; latency = parked pop's answer - push's answer.", "",
                "| parked | woken | missed | wake p50 ms | wake p99 ms | wake max ms "
                "| p99 <= 50 ms |",
                "|--:|--:|--:|--:|--:|--:|---|",
                f"| {fmt(w['parked'])} | {w['woken']} | {w['missed']} "
                f"| {fmt(w['wake_p50_ms'], 2)} | {fmt(w['wake_p99_ms'], 2)} "
                f"| {fmt(w['wake_max_ms'], 2)} | {'yes' if w['p99_within_50ms'] else 'NO'} |",
                "", f"Push latency with and without the parked pops ({wd['wakes']} paced "
                f"single pushes at {a.wake_rate:g}/s to queues nobody waits on, the same "
                "queues both times; burst = closed loop of 1-item pushes to another such "
                f"queue, {a.burst_connections} connections, {a.burst_duration:g} s). The "
                "last row is the pushes of the wake phase: each of them wakes a pop, whose "
                "claim and re-park run at the same moment.", "",
                "| condition | pushes ok | p50 ms | p99 ms | max ms | CPU broker | CPU other "
                "| burst msgs/s | burst p50 ms | burst p99 ms |",
                "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for label, r in (("no parked pop", wo), (f"{wd['parked_target']} parked pops", wi),
                         ("parked, each push wakes a pop", ww)):
            b = r.get("burst") or {}
            bl = b.get("latency_ms") or {}
            c = r.get("cpu_s") or {}
            out.append(f"| {label} | {r['ok']}/{r['pushes']} | {fmt(r['latency_ms']['p50'], 2)} "
                       f"| {fmt(r['latency_ms']['p99'], 2)} | {fmt(r['latency_ms']['max'], 2)} "
                       f"| {fmt(c.get('broker'), 2)} | {fmt(c.get('other_s'))} "
                       f"| {fmt(b.get('msgs_per_s'))} | {fmt(bl.get('p50'), 2)} "
                       f"| {fmt(bl.get('p99'), 2)} |")
        out.append(f"| **parked / no parked pop** | | "
                   f"{fmt(ratio(wi['latency_ms']['p50'], wo['latency_ms']['p50']), 2)}x "
                   f"| {fmt(w['push_p99_ratio_with_over_without'], 2)}x | "
                   f"| {fmt(ratio(wi['cpu_s'].get('broker'), wo['cpu_s'].get('broker')), 2)}x | "
                   f"| {fmt(w.get('burst_ratio_with_over_without'), 2)}x | | |")
    return "\n".join(out)


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.consume", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (about 90 s): shorter windows, fewer messages, one round, "
                         "200 wakes")
    ap.add_argument("--sections", default="e2e,throughput,wake",
                    help="which sections, comma list (e2e,throughput,wake)")
    ap.add_argument("--arms", default="queen-mp,baseline")
    # 1. end-to-end
    ap.add_argument("--e2e-rate", type=float, default=50.0, help="pushes per second (50)")
    ap.add_argument("--e2e-items", type=int, default=1, help="messages per push (1)")
    ap.add_argument("--e2e-producers", type=int, default=4,
                    help="producer connections: a push leaves on schedule even while earlier "
                         "ones wait for their answer (4)")
    ap.add_argument("--e2e-duration", type=float, default=6.0, help="window per round (6 s)")
    ap.add_argument("--e2e-rounds", type=int, default=2, help="A B rounds (2)")
    ap.add_argument("--e2e-partitions", type=int, default=10)
    ap.add_argument("--e2e-batch", type=int, default=10, help="pop batch (10)")
    ap.add_argument("--e2e-consumers", type=int, default=1)
    ap.add_argument("--e2e-pg-waits", action="store_true",
                    help="sample pg_stat_activity of the arm's database during each e2e "
                         "window (wait events by role and statement; costs a little CPU)")
    ap.add_argument("--e2e-grace", type=float, default=3.0,
                    help="wait for stragglers after a window (3 s)")
    ap.add_argument("--poll-ms", type=float, default=10.0,
                    help="baseline consumer sleep after an empty pop (10 ms)")
    # 2. throughput
    ap.add_argument("--batches", default="1,100,1000")
    ap.add_argument("--messages", default="1:1500,100:40000,1000:80000",
                    help="N per batch size, batch:N comma list")
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--tp-partitions", type=int, default=100)
    ap.add_argument("--tp-rounds", type=int, default=2, help="A B rounds per batch size (2)")
    ap.add_argument("--pop-partitions", default="1:1,100:1,1000:10",
                    help="queen-mp pop 'partitions' per batch size, batch:p comma list")
    ap.add_argument("--drain-cap", type=float, default=60.0,
                    help="give up draining a cell after this long (60 s)")
    ap.add_argument("--prefill-request", type=int, default=1000, help="items per push")
    ap.add_argument("--prefill-connections", type=int, default=4)
    # 3. wakes
    ap.add_argument("--parked", type=int, default=1000)
    ap.add_argument("--wakes", type=int, default=300)
    ap.add_argument("--wake-rate", type=float, default=25.0)
    ap.add_argument("--park-timeout-ms", type=int, default=30000)
    ap.add_argument("--park-wait", type=float, default=15.0,
                    help="longest wait for every pop to park (15 s)")
    ap.add_argument("--burst-duration", type=float, default=4.0,
                    help="closed-loop push burst with/without parked pops (4 s; 0 = skip)")
    ap.add_argument("--burst-connections", type=int, default=16)
    # servers
    ap.add_argument("--workers", type=int, default=2, help="front workers of both arms (2)")
    ap.add_argument("--shards", type=int, default=2, help="queen-mp shard processes (2)")
    ap.add_argument("--baseline-pool", type=int, default=8,
                    help="baseline PostgreSQL connections per worker (8, as queen-mp's "
                    "QUEEN_PG_POOL_SIZE per front worker)")
    ap.add_argument("--pause", type=float, default=1.5,
                    help="pause between cells (1.5 s; longer than the 1 s long poll of a "
                    "throughput consumer, which the broker finishes after the cell)")
    ap.add_argument("--server-dsn", default=os.environ.get("BENCH_PG_DSN", LOCAL_DSN))
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--keep-tmp", action="store_true",
                    help="keep the scratch dir (queen-mp data dir and both logs)")
    a = ap.parse_args(argv)
    if a.quick:
        a.e2e_duration, a.e2e_rounds, a.e2e_grace, a.tp_rounds = 4.0, 1, 2.0, 1
        a.messages = "1:1000,100:15000,1000:40000"
        a.wakes, a.burst_duration, a.drain_cap, a.park_wait = 200, 2.0, 30.0, 10.0
        a.pause = 1.0
    a.sections = [x.strip() for x in a.sections.split(",") if x.strip()]
    a.arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    for arm in a.arms:
        if arm not in ARMS:
            ap.error(f"unknown arm {arm!r}")
    a.batches = [int(x) for x in a.batches.split(",") if x.strip()]

    def pairs(text: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in (p.split(":") for p in text.split(",") if p)}

    a.messages = pairs(a.messages)
    a.pop_partitions = pairs(a.pop_partitions)
    for b in a.batches:
        if b not in a.messages:
            ap.error(f"--messages has no N for batch {b}")
    if a.parked < 1 or a.wakes < 1 or a.e2e_rate <= 0 or a.wake_rate <= 0:
        ap.error("--parked, --wakes, --e2e-rate and --wake-rate must be positive")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    started = dt.datetime.now(dt.UTC)
    t_started = mono()

    def work() -> None:
        bench.setup()
        asyncio.run(bench.run())

    status, failure, logs = pushbench.guarded(work, lambda: cleanup(bench))
    summary = summarize(bench)
    doc = {
        "benchmark": "consume", "status": status, "failure": failure, "run_id": bench.run_id,
        "started_at": started.isoformat(), "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "elapsed_s": round(mono() - t_started, 1),
        "machine": bench.info,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "definitions": {
            "e2e_latency": "consumer's monotonic time at the end of reading the pop answer "
                           "that carried the message minus the producer's monotonic time at "
                           "the end of reading that message's push answer (same process)",
            "throughput": "N / (first pop sent .. the ack answer that made the acked count "
                          "reach N); pre-fill not timed",
            "wake_latency": "parked pop's answer read minus the waking push's answer read",
            "cpu_s": "broker = the arm's process tree, pg_cluster = postmaster and children, "
                     "client = this process (producer and consumers), other = machine busy "
                     "minus the three (the burst load generator lands in other)"},
        "summary": summary, "e2e_rounds": bench.e2e, "throughput_cells": bench.throughput,
        "wake": bench.wake, "logs": logs, "notes": bench.notes,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"consume-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(render(bench, summary))
    print()
    for arm, f in logs.items():
        print(f"log {arm}: {f.get('warning_or_error_lines')} warning/error lines, "
              f"exit code {f.get('exit_code')}")
        for d in f.get("distinct", [])[:8]:
            print(f"    {d['count']:>5} x {d['line'][:200]}")
        for d in f.get("tracebacks", [])[:5]:
            print(f"    {d['count']:>5} x traceback: {d['exception'][:160]}  (after: "
                  f"{d['logged_by'][:120]})")
    for n in bench.notes:
        print(f"note: {n}")
    print(f"\nresults: {out} ({mono() - t_started:.0f} s)")
    return 0 if status == "ok" else (130 if status == "interrupted" else 1)


def tracebacks(text: str) -> list[dict[str, Any]]:
    """Each traceback of a log as (line that logged it, final exception line), counted."""
    lines = text.splitlines()
    seen: Counter[tuple[str, str]] = Counter()
    for i, ln in enumerate(lines):
        if "Traceback (most recent call last)" not in ln:
            continue
        before = lines[i - 1] if i and ln.startswith("Traceback") else ln
        end = ""
        for nxt in lines[i + 1:i + 200]:
            if nxt and not nxt.startswith((" ", "\t")) and not nxt.startswith(
                    ("During handling", "The above exception", "Traceback")):
                end = nxt
                break
        before = re.sub(r"^\S+ \S+ ", "", before)
        seen[(re.sub(r"\[\d+\]", "[pid]", before)[:200], end[:300])] += 1
    return [{"count": n, "logged_by": k[0], "exception": k[1]}
            for k, n in seen.most_common(10)]


def cleanup(bench: Bench) -> dict[str, Any]:
    logs: dict[str, Any] = {}
    if bench.load is not None:
        with contextlib.suppress(Exception):
            bench.load.kill()
    for arm, server in bench.servers.items():
        died = not server.alive()
        if died:
            bench.notes.append(f"{arm} had exited by itself (code {server.proc.returncode})")
        try:
            server.stop()
        except Exception as ex:
            bench.notes.append(f"stopping {arm}: {ex}")
            with contextlib.suppress(Exception):
                kill_tree(server.proc.pid)
        text = server.log_text()
        findings = log_findings(text)
        findings["tracebacks"] = tracebacks(text)
        findings["exit_code"] = server.exit_code
        logs[arm] = findings
        if server.exit_code not in (0, None) and not died:
            bench.notes.append(f"{arm} exited with {server.exit_code} on SIGTERM")
    if bench.monitor is not None:
        with contextlib.suppress(Exception):
            bench.monitor.close()
    for arm, dsn in bench.dbs.items():
        try:
            drop_database(bench.args.server_dsn, db_name(dsn))
        except Exception as ex:
            bench.notes.append(f"dropping the {arm} database failed: {ex}")
    if bench.tmp is not None:
        if bench.args.keep_tmp:
            print(f"kept {bench.tmp}", flush=True)
        else:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    return logs


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
