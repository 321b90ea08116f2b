"""The benchmark suite (``make bench``): queen-mp against its peers and the physical limit, in
one run, on one PostgreSQL, with one payload (200-byte JSON naming producer and sequence).

Arms (bench/README.md says what each one is and why it is built that way):

- ``queen-mp``       the broker, JSON push (``queen-mp-qpb1``: binary QPB1 zstd-framed push);
- ``naive``          a falcon app under queen-mp's gunicorn command line: one INSERT and one
                     commit per request, pop with ``FOR UPDATE SKIP LOCKED``, ack by DELETE
                     (bench/consume_baseline.py);
- ``pgmq``           pgmq 1.13 from the SQL bundled in the ``pgmq`` package, driven over
                     psycopg by bench/pgclients.py (send_batch / read / delete);
- ``physical``       psycopg binary COPY of the same rows, 1,000 per commit: what PostgreSQL
                     alone costs to keep the messages durably.

Sections: ``push`` (batch 1/10/100/1000, 64 connections, 1,000 partitions), ``consume``
(drain a pre-filled queue, pop batch 100 + one ack per batch), ``mixed`` (push and consume at
once with 1/4/16 consumers), ``fanout`` (4 consumer groups), ``e2e`` (latency at 1,000 msg/s),
``wake`` (1,000 parked pops). Every cell alternates the arms (A B C D, A B C D, ...) and every
figure is the median of the rounds; queen-mp's figures are also given as ratios to each other
arm of the same run. The queen-mp messages of ``push``, ``mixed`` and ``fanout`` go through
the zero-loss ledger (bench/ledger.py): any loss fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import consume as cons
from bench import ledger as ledgers
from bench import report
from bench.loadgen import LoadRun, LoadSpec, percentiles
from bench.pgclients import (
    PgLoadRun,
    PgLoadSpec,
    PgmqConsumeRun,
    PgmqConsumeSpec,
    create_pgmq_queue,
    create_physical_table,
    install_pgmq,
    pgmq_e2e,
)
from bench.push import (
    CLK_TCK,
    Interrupted,
    counters_delta,
    cpu_ticks,
    create_database,
    db_name,
    delta_cpu_s,
    machine_ticks,
    process_tree,
    queen_counters,
)
from queen_mp.db.embedded import EmbeddedPostgres

mono = time.monotonic
PUSH_ARMS = ("queen-mp", "queen-mp-qpb1", "naive", "pgmq", "physical")
HTTP_SERVER = {"queen-mp": "queen-mp", "queen-mp-qpb1": "queen-mp", "naive": "baseline"}
STATS_LAG_S = 11.0  # idle backends publish pg_stat_database counters up to 10 s late


# ------------------------------------------------------------------------------ measuring
def _read(path: str) -> bytes:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        return f.read()
    return b""


def _kb(path: str, key: bytes) -> int:
    for line in _read(path).splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """Samples, every ``every`` s, the CPU ticks of the broker's process tree, of the arm's
    PostgreSQL backends (found by their process title) and of the whole cluster, keeping the
    last value seen per pid: a client that disconnects before the window is read still counts
    (its backend's CPU up to its last sample). Also the peak of the broker tree's summed RSS
    and PSS (PSS counts shared pages once, RSS once per process)."""

    def __init__(self, postmaster: int, db: str, root: int | None, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.postmaster, self.root, self.every = postmaster, root, every
        self.title = f" {db} ".encode()
        self.ticks: dict[str, dict[int, int]] = {"broker": {}, "pg_db": {}, "pg_all": {}}
        self.peak_rss = self.peak_pss = 0
        self._stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.sample()

    def sample(self) -> None:
        cluster = process_tree(self.postmaster)
        ticks = cpu_ticks(cluster)
        db = {p: t for p, t in ticks.items()
              if self.title in _read(f"/proc/{p}/cmdline").replace(b"\0", b" ")}
        broker = process_tree(self.root) if self.root else []
        with self.lock:
            self.ticks["pg_all"].update(ticks)
            self.ticks["pg_db"].update(db)
            if broker:
                self.ticks["broker"].update(cpu_ticks(broker))
        if broker:
            rss = sum(_kb(f"/proc/{p}/status", b"VmRSS:") for p in broker)
            pss = sum(_kb(f"/proc/{p}/smaps_rollup", b"Pss:") for p in broker)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)

    def snapshot(self) -> dict[str, dict[int, int]]:
        with self.lock:
            return {k: dict(v) for k, v in self.ticks.items()}

    def run(self) -> None:
        while not self._stop_ev.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._stop_ev.set()
        self.join(2.0)
        self.sample()


class Meter:
    """One measured window of one arm: CPU (broker tree, the arm's PostgreSQL backends, the
    whole cluster, the machine), WAL, queen-mp's fusion counters and peak RSS. The commit
    count is read later (``Suite.settle``): backends publish it up to 10 s after going idle."""

    def __init__(self, suite: Suite, arm: str) -> None:
        self.suite, self.arm = suite, arm
        mon = suite.monitor
        assert mon is not None
        self.db = db_name(suite.dsn_of(arm))
        server = suite.servers.get(HTTP_SERVER.get(arm, ""))
        self.root = server.proc.pid if server is not None else None
        self.url = server.url if server is not None and arm.startswith("queen") else None
        mon.cluster_pids()  # resolves the postmaster
        assert mon.postmaster is not None
        self.sampler = Sampler(mon.postmaster, self.db, self.root)
        self.c0 = self.sampler.snapshot()
        self.m0 = machine_ticks()
        self.wal0 = mon.cluster_stats()["wal_bytes"]
        self.x0 = mon.db_stats(self.db)["xact_commit"]
        self.q0 = queen_counters(self.url) if self.url else {}
        self.sampler.start()
        self.stopped = False
        self.t0 = mono()

    def discard(self) -> tuple[float, float]:
        """Stop sampling; the suite's memory peaks still see what was sampled."""
        if not self.stopped:
            self.sampler.stop()
            self.stopped = True
        rss, pss = round(self.sampler.peak_rss / 1024, 1), round(self.sampler.peak_pss / 1024, 1)
        if self.arm.startswith("queen-mp"):  # the target is the broker's, not the naive app's
            self.suite.rss_peak = max(self.suite.rss_peak, rss)
            self.suite.pss_peak = max(self.suite.pss_peak, pss)
        return rss, pss

    def stop(self, client_cpu_s: float | None = None, msgs: float | None = None
             ) -> dict[str, Any]:
        """End the window now; the client's CPU and message count may come later
        (``figures``), once the load generators have exited and reported them."""
        mon = self.suite.monitor
        assert mon is not None
        self.window = mono() - self.t0
        self.peaks = self.discard()
        self.c1, self.m1 = self.sampler.snapshot(), machine_ticks()
        self.wal = mon.cluster_stats()["wal_bytes"] - self.wal0
        self.t_end = mono()
        self.q1 = queen_counters(self.url) if self.url else {}
        return self.figures(client_cpu_s, msgs) if client_cpu_s is not None else {}

    def figures(self, client_cpu_s: float, msgs: float | None) -> dict[str, Any]:
        window = self.window
        out: dict[str, Any] = {"window_s": round(window, 3)}
        for k in ("broker", "pg_db", "pg_all"):
            out[f"cpu_{k}_s"] = (round(delta_cpu_s(self.c0[k], self.c1[k]), 3)
                                 if self.c1[k] else None)
        out["cpu_client_s"] = round(client_cpu_s, 3)
        busy = (self.m1[0] - self.m0[0]) / CLK_TCK
        total = (self.m1[1] - self.m0[1]) / CLK_TCK
        out["busy_pct"] = round(100 * busy / total, 1) if total else None
        out["cpu_other_s"] = round(busy - (out["cpu_broker_s"] or 0)
                                   - (out["cpu_pg_all_s"] or 0) - client_cpu_s, 3)
        out["wal_bytes_per_s"] = self.wal / window
        out["wal_bytes_per_msg"] = self.wal / msgs if msgs else None
        if self.url:
            d = counters_delta(self.q0, self.q1)
            commits = d.get("queen_fusion_commits_total", 0.0)
            out["segs_per_commit"] = (d.get("queen_fusion_segments_total", 0.0) / commits
                                      if commits else None)
        if self.root is not None:
            out["rss_peak_mb"], out["pss_peak_mb"] = self.peaks
        out["_commits"] = {"db": self.db, "x0": self.x0, "t_end": self.t_end,
                           "window": window, "arm": self.arm}
        return out


def med(values: list[Any]) -> float | None:
    vals = sorted(v for v in values if isinstance(v, (int, float)))
    if not vals:
        return None
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


# ------------------------------------------------------------------------------ the suite
class Suite(cons.Bench):
    """queen-mp and the naive broker come from bench/consume.py's setup; pgmq and the
    physical table get a database each on the same server."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.cells: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []
        self.idle_commits: dict[str, float] = {}
        self.rss_peak = self.pss_peak = 0.0
        self.ledger: dict[str, Any] = {}
        self.e2e_samples: dict[str, list[float]] = {}
        self.pgmq_version: str | None = None
        self.meter: Meter | None = None
        self.pg: EmbeddedPostgres | None = None
        self.pg_dir: Path | None = None

    def setup(self) -> None:
        a = self.args
        if a.embedded:
            # A private cluster: every arm on the same server, with connections for all of
            # them (64 client connections per arm next to both brokers' pools), and nobody
            # else's load on it.
            self.pg_dir = Path(tempfile.mkdtemp(prefix="queen-suite-pg-", dir="/tmp"))
            self.pg_dir.chmod(0o755)
            self.pg = EmbeddedPostgres(self.pg_dir / "pg", fsync=True)
            a.server_dsn = self.pg.start()
            print(f"private PostgreSQL cluster in {self.pg_dir} (port {self.pg.port}, "
                  "fsync on)", flush=True)
        arms = a.arms
        a.arms = ["queen-mp", "baseline"]  # the two HTTP servers bench/consume.py starts
        try:
            super().setup()
        finally:
            a.arms = arms
        for key in ("pgmq", "physical"):
            name = f"queen_bench_{self.run_id}_{key[:2]}"
            self.dbs[key] = create_database(a.server_dsn, name)
        self.pgmq_version = install_pgmq(self.dbs["pgmq"])
        create_pgmq_queue(self.dbs["pgmq"], "bench")
        create_physical_table(self.dbs["physical"])
        assert self.tmp is not None
        self.ledger_root = self.tmp / "ledger"
        self.ledger_root.mkdir()
        self.measure_idle_commits()

    def dsn_of(self, arm: str) -> str:
        return self.dbs[{"queen-mp-qpb1": "queen-mp", "naive": "baseline"}.get(arm, arm)]

    def measure_idle_commits(self) -> None:
        """Background commits per second of each database with no load (queen-mp's
        housekeeping and timers); subtracted from the commits read STATS_LAG_S late."""
        assert self.monitor is not None
        arms = ("queen-mp", "naive", "pgmq", "physical")
        x0 = {a: self.monitor.db_stats(db_name(self.dsn_of(a)))["xact_commit"] for a in arms}
        t0 = mono()
        time.sleep(STATS_LAG_S + 1 if not self.args.quick else 3)
        for a in arms:
            x1 = self.monitor.db_stats(db_name(self.dsn_of(a)))["xact_commit"]
            self.idle_commits[a] = (x1 - x0[a]) / (mono() - t0)
        print(f"idle commits/s: {self.idle_commits}", flush=True)

    def settle(self, running: str | None = None, force: bool = False) -> None:
        """Read the commit counters of finished windows once their backends have published
        them; never of the database about to be loaded (``running``)."""
        assert self.monitor is not None
        busy_db = db_name(self.dsn_of(running)) if running else None
        keep = []
        for p in self.pending:
            c = p["_commits"]
            wait = c["t_end"] + STATS_LAG_S - mono()
            if c["db"] == busy_db or (wait > 0 and not force):
                keep.append(p)
                continue
            if wait > 0:
                time.sleep(wait)
            x1 = self.monitor.db_stats(c["db"])["xact_commit"]
            base = "queen-mp" if c["arm"].startswith("queen") else c["arm"]
            idle = self.idle_commits.get(base, 0.0) * max(0.0, mono() - c["t_end"])
            commits = max(0.0, x1 - c["x0"] - idle)
            p["commits_per_s"] = commits / c["window"]
            p["msgs_per_commit"] = p["msgs"] / commits if commits else None
            del p["_commits"]
        self.pending = keep

    def probe(self, arm: str | None) -> cons.Probe:
        """bench/consume.py opens its CPU probe where a measured window starts: a Meter
        starts there too (``take_meter`` collects it)."""
        if self.meter is not None:
            self.meter.discard()
        self.meter = Meter(self, {"baseline": "naive"}.get(arm or "", arm or "queen-mp"))
        return super().probe(arm)

    def take_meter(self) -> Meter:
        m, self.meter = self.meter, None
        assert m is not None
        return m

    def record(self, cell: dict[str, Any]) -> None:
        self.cells.append(cell)
        if "_commits" in cell:
            self.pending.append(cell)

    # -------------------------------------------------------------- push
    def push_spec(self, arm: str, batch: int, tag: str) -> LoadSpec | PgLoadSpec:
        a = self.args
        if arm in ("queen-mp", "queen-mp-qpb1", "naive"):
            server = self.servers[HTTP_SERVER[arm]]
            queen = arm.startswith("queen")
            return LoadSpec(url=server.url, connections=a.connections, procs=a.procs,
                            items=batch, duration=a.duration, partitions=a.partitions,
                            queue="bench", tag=tag,
                            format="qpb1" if arm == "queen-mp-qpb1" else "json",
                            ledger_dir=str(self.ledger_root / "push") if queen else None)
        if arm == "pgmq":
            return PgLoadSpec(dsn=self.dbs["pgmq"], kind="pgmq", connections=a.connections,
                              procs=a.procs, items=batch, duration=a.duration, queue="bench",
                              tag=tag)
        return PgLoadSpec(dsn=self.dbs["physical"], kind="copy",
                          connections=a.physical_connections, procs=a.procs, items=1000,
                          duration=a.duration, partitions=a.partitions, tag=tag)

    def push_cell(self, arm: str, batch: int, rnd: int, warmup: float = 0.0
                  ) -> dict[str, Any]:
        self.settle(running=arm)
        tag = f"{self.run_id[:4]}{arm[0]}{arm[-1]}{batch}r{rnd}"
        spec = self.push_spec(arm, batch, tag)
        if warmup:
            spec.duration = warmup
        run = LoadRun(spec) if isinstance(spec, LoadSpec) else PgLoadRun(spec)
        self.load = run  # type: ignore[assignment]
        time.sleep(max(0.0, run.start_at - time.time()))
        meter = Meter(self, arm)
        time.sleep(max(0.0, run.end_at - time.time()))
        meter.stop()  # before the clients exit: their backends' CPU is read while they live
        res = run.wait()
        self.load = None
        lat = res["latency_ms"]
        cell: dict[str, Any] = {
            "section": "push", "variant": f"batch {batch}", "batch": batch, "arm": arm,
            "round": rnd, "msgs": res["items_queued"], "msgs_per_s": res["msgs_per_s"],
            "requests_per_s": res["requests_per_s"], "p50_ms": lat["p50"],
            "p99_ms": lat["p99"], "p999_ms": lat.get("p99_9"),
            "errors": res["error_requests"] + sum(
                v for k, v in res["statuses"].items() if k != "queued"),
            "late_requests": res["late_requests"],
        }
        cell.update(meter.figures(res["loadgen_cpu_s"], res["items_queued"]))
        cell["raw"] = {k: v for k, v in res.items() if k not in ("workers", "spec")}
        if warmup:
            cell.pop("_commits")
            return cell
        self.record(cell)
        print(f"  push batch {batch:>4} r{rnd} {arm:<14} {res['msgs_per_s']:>10,.0f} msgs/s  "
              f"p50 {lat['p50'] or 0:7.1f} ms  p99 {lat['p99'] or 0:7.1f} ms  "
              f"errors {cell['errors']}", flush=True)
        return cell

    def run_push(self) -> None:
        a = self.args
        print(f"[{self.clock()}] push: {a.connections} connections, {a.partitions} partitions,"
              f" {a.duration:g} s windows, {a.rounds} rounds", flush=True)
        # Warm-up, not recorded: provisions queen-mp's partitions, opens every connection.
        for arm in a.arms:
            if arm != "physical":
                self.push_cell(arm, 100, 0, warmup=a.warmup)
        for batch in a.batches:
            arms = [x for x in a.arms if x != "physical" and (
                x != "queen-mp-qpb1" or batch in a.qpb1_batches)]
            if batch == max(a.batches) and "physical" in a.arms:
                arms.append("physical")
            for rnd in range(1, a.rounds + 1):
                for arm in arms:
                    self.push_cell(arm, batch, rnd)
        self.settle(force=True)

    # -------------------------------------------------------------- consume
    async def pgmq_fill(self, queue: str, n: int, tag: str) -> None:
        body = [f'{{"producer":"{tag}","seq":{i},"pad":"x"}}' for i in range(n)]
        async with await psycopg.AsyncConnection.connect(self.dbs["pgmq"],
                                                         autocommit=True) as conn:
            for s in range(0, n, 1000):
                await conn.execute("SELECT pgmq.send_batch(%s, %s::jsonb[])",
                                   (queue, body[s:s + 1000]))

    async def run_consume(self) -> None:
        a = self.args
        print(f"[{self.clock()}] consume: drain {a.consume_messages:,} pre-filled messages, "
              f"pop batch {a.consume_batch} + one ack per batch, {a.consumers} consumers",
              flush=True)
        for rnd in range(1, a.rounds + 1):
            for arm in ("queen-mp", "naive", "pgmq"):
                if arm not in a.arms:
                    continue
                self.settle(running=arm)
                if arm == "pgmq":
                    queue = f"c{self.run_id}r{rnd}"
                    create_pgmq_queue(self.dbs["pgmq"], queue)
                    await self.pgmq_fill(queue, a.consume_messages, f"c{rnd}")
                    meter = Meter(self, arm)
                    run = PgmqConsumeRun(PgmqConsumeSpec(
                        dsn=self.dbs["pgmq"], queue=queue, consumers=a.consumers,
                        procs=1, batch=a.consume_batch, target=a.consume_messages,
                        idle_stop=2.0))
                    res = await asyncio.to_thread(run.wait)
                    cell = {"msgs": res["consumed"], "msgs_per_s": res["msgs_per_s"],
                            "p50_ms": res["read_latency_ms"]["p50"],
                            "p99_ms": res["read_latency_ms"]["p99"],
                            "errors": sum(res["errors"].values()),
                            "redelivered": res["redelivered"], "drained": True}
                    cell.update(meter.stop(res["cpu_s"], res["consumed"]))
                else:
                    server = "queen-mp" if arm == "queen-mp" else "baseline"
                    r = await self.run_throughput(self.arm(server), a.consume_batch,
                                                  a.consume_messages, rnd)
                    c = r["consumer"]
                    cell = {"msgs": r["acked"], "msgs_per_s": r["msgs_per_s"],
                            "p50_ms": c["pop_latency_ms"]["p50"],
                            "p99_ms": c["pop_latency_ms"]["p99"],
                            "errors": sum(c["errors"].values()),
                            "redelivered": r["redelivered"], "drained": r["drained"],
                            "leftover_pop_status": r["leftover_pop_status"]}
                    cell.update(self.take_meter().stop(r["cpu_s"]["client"], r["acked"]))
                cell.update({"section": "consume", "variant": f"batch {a.consume_batch}",
                             "arm": arm, "round": rnd})
                self.record(cell)
                print(f"  consume r{rnd} {arm:<9} {cell['msgs_per_s'] or 0:>10,.0f} msgs/s "
                      f"errors {cell['errors']} redelivered {cell['redelivered']}", flush=True)
                await asyncio.sleep(a.pause)
        self.settle(force=True)

    # -------------------------------------------------------------- e2e
    async def run_e2e_all(self) -> None:
        a = self.args
        print(f"[{self.clock()}] e2e: {a.e2e_rate * a.e2e_items:g} msgs/s "
              f"({a.e2e_rate:g} pushes/s x {a.e2e_items})", flush=True)
        for rnd in range(1, a.e2e_rounds + 1):
            for arm in ("queen-mp", "naive", "pgmq"):
                if arm not in a.arms:
                    continue
                if arm == "pgmq":
                    queue = f"e{self.run_id}r{rnd}"
                    create_pgmq_queue(self.dbs["pgmq"], queue)
                    r = await pgmq_e2e(self.dbs["pgmq"], queue, a.e2e_rate * a.e2e_items,
                                       a.e2e_duration)
                    samples = r["samples_ms"]
                    cell = {"msgs": r["sent"], "missing": r["missing"],
                            "sent_per_s": r.get("sent_per_s")}
                else:
                    server = "queen-mp" if arm == "queen-mp" else "baseline"
                    r = await self.run_e2e(self.arm(server), rnd)
                    samples = r["samples_ms"]
                    cell = {"msgs": r["pushed"], "missing": r["missing"],
                            "sent_per_s": r["rate_per_s"],
                            "redelivered": r["redelivered"],
                            "behind": r["pushes_behind_schedule"]}
                    cell.update(self.take_meter().stop(r["cpu_s"]["client"], r["pushed"]))
                lat = percentiles([x / 1e3 for x in samples], (50, 90, 99, 99.9))
                cell.update({"section": "e2e", "variant": f"{a.e2e_rate * a.e2e_items:g}/s",
                             "arm": arm, "round": rnd, "p50_ms": lat["p50"],
                             "p99_ms": lat["p99"], "p999_ms": lat["p99_9"],
                             "max_ms": lat["max"]})
                self.e2e_samples.setdefault(arm, []).extend(samples)
                self.record(cell)
                print(f"  e2e r{rnd} {arm:<9} p50 {lat['p50'] or 0:.1f} ms p99 "
                      f"{lat['p99'] or 0:.1f} ms p99.9 {lat['p99_9'] or 0:.1f} ms, "
                      f"missing {cell['missing']}", flush=True)
                await asyncio.sleep(a.pause)

    # -------------------------------------------------------------- wake
    async def run_wake_cell(self) -> None:
        print(f"[{self.clock()}] wake: {self.args.parked} parked pops", flush=True)
        w = await self.run_wake(self.arm("queen-mp"))
        self.wake = w
        lat = w.get("wake_latency_ms") or {}
        self.record({"section": "wake", "variant": f"{self.args.parked} parked",
                     "arm": "queen-mp", "round": 1, "p50_ms": lat.get("p50"),
                     "p99_ms": lat.get("p99"), "max_ms": lat.get("max"),
                     "msgs": w.get("woken"), "missing": w.get("missed")})
        print(f"  wake p50 {lat.get('p50')} ms p99 {lat.get('p99')} ms", flush=True)
        if self.meter is not None:
            self.meter.discard()
            self.meter = None

    # -------------------------------------------------------------- ledger
    async def check_ledger(self, name: str, queue: str, groups: list[str]) -> None:
        print(f"[{self.clock()}] ledger {name}: draining {queue} for {groups}", flush=True)
        url = self.servers["queen-mp"].url
        pushed = ledgers.load_push_ledger(str(self.ledger_root / name))
        consumed = await ledgers.drain(url, queue, groups)
        verdict = ledgers.check(pushed, consumed)
        verdict["offsets"] = ledgers.check_offsets(self.dbs["queen-mp"], queue, pushed=pushed)
        self.ledger[name] = verdict
        ok = verdict["ok"] and verdict["offsets"].get("ok", False)
        counts = {g: {k: v for k, v in d.items() if k != "examples"}
                  for g, d in verdict["groups"].items()}
        print(f"  ledger {name}: {'OK' if ok else 'FAILED'} {json.dumps(counts)}", flush=True)

    async def run_all(self) -> None:
        a = self.args
        if "push" in a.sections:
            await asyncio.to_thread(self.run_push)
            if "queen-mp" in a.arms:
                await self.check_ledger("push", "bench", ["ledger"])
        if "consume" in a.sections:
            await self.run_consume()
        if "e2e" in a.sections:
            await self.run_e2e_all()
        if "wake" in a.sections and "queen-mp" in a.arms:
            await self.run_wake_cell()
        print(f"[{self.clock()}] done", flush=True)


# ------------------------------------------------------------------------------ summary
FIGURES = ("msgs_per_s", "requests_per_s", "p50_ms", "p99_ms", "p999_ms", "commits_per_s",
           "msgs_per_commit", "wal_bytes_per_s", "wal_bytes_per_msg", "segs_per_commit",
           "cpu_broker_s", "cpu_pg_db_s", "cpu_pg_all_s", "cpu_client_s", "cpu_other_s",
           "busy_pct", "rss_peak_mb", "pss_peak_mb", "errors", "missing", "max_ms")


def summarize(suite: Suite) -> dict[str, Any]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for c in suite.cells:
        groups.setdefault((c["section"], c["variant"], c["arm"]), []).append(c)
    rows = []
    for (section, variant, arm), cells in groups.items():
        row: dict[str, Any] = {"section": section, "variant": variant, "arm": arm,
                               "rounds": len(cells)}
        for f in FIGURES:
            row[f] = med([c.get(f) for c in cells])
        rows.append(row)
    ratios = []
    for r in rows:
        if not r["arm"].startswith("queen-mp"):
            continue
        for o in rows:
            same = (o["section"], o["variant"]) == (r["section"], r["variant"])
            # the physical limit is one figure for every push batch size
            physical = o["arm"] == "physical" and r["section"] == "push"
            if o["arm"].startswith("queen-mp") or not (same or physical):
                continue
            ratios.append({"section": r["section"], "variant": r["variant"], "arm": r["arm"],
                           "vs": o["arm"], "vs_variant": o["variant"],
                           **{f: (r[f] / o[f] if isinstance(r[f], (int, float))
                                  and isinstance(o[f], (int, float)) and o[f] else None)
                              for f in ("msgs_per_s", "p50_ms", "p99_ms", "cpu_broker_s",
                                        "commits_per_s", "wal_bytes_per_msg")}})
    return {"rows": rows, "ratios": ratios, "targets": targets(rows, suite)}


def _row(rows: list[dict[str, Any]], section: str, variant: str, arm: str) -> dict[str, Any]:
    for r in rows:
        if (r["section"], r["variant"], r["arm"]) == (section, variant, arm):
            return r
    return {}


def targets(rows: list[dict[str, Any]], suite: Suite) -> list[dict[str, Any]]:
    """The issue's targets, each computed from this run's medians."""
    def ratio(a: dict[str, Any], b: dict[str, Any], f: str = "msgs_per_s") -> float | None:
        return a[f] / b[f] if a.get(f) and b.get(f) else None

    q1, n1 = _row(rows, "push", "batch 1", "queen-mp"), _row(rows, "push", "batch 1", "naive")
    q100 = _row(rows, "push", "batch 100", "queen-mp")
    m100 = _row(rows, "push", "batch 100", "pgmq")
    b1000 = _row(rows, "push", "batch 1000", "queen-mp-qpb1")
    phys = _row(rows, "push", "batch 1000", "physical")
    cq = _row(rows, "consume", f"batch {suite.args.consume_batch}", "queen-mp")
    cm = _row(rows, "consume", f"batch {suite.args.consume_batch}", "pgmq")
    e2e = next((r for r in rows if r["section"] == "e2e" and r["arm"] == "queen-mp"), {})
    wake = next((r for r in rows if r["section"] == "wake"), {})
    out = [
        ("push 1-item JSON vs naive (x)", ratio(q1, n1), 3.0, ">="),
        ("push 1-item segments per commit", q1.get("segs_per_commit"), 8.0, ">="),
        ("push 100-item JSON vs pgmq send_batch 100 (x)", ratio(q100, m100), 3.0, ">="),
        ("push 1000-item QPB1 vs physical limit (x)", ratio(b1000, phys), 0.6, ">="),
        ("consume batch 100 vs pgmq read+delete (x)", ratio(cq, cm), 2.0, ">="),
        ("e2e p99 at 1,000 msg/s (ms)", e2e.get("p99_ms"), 20.0, "<"),
        ("parked-pop wake p99, 1,000 parked (ms)", wake.get("p99_ms"), 50.0, "<"),
        ("peak RSS of all broker processes (MB)", suite.rss_peak or None, 300.0, "<"),
    ]
    res = []
    for name, value, threshold, op in out:
        met = None if value is None else (value >= threshold if op == ">=" else
                                          value < threshold)
        res.append({"target": name, "value": value, "threshold": threshold, "op": op,
                    "met": met})
    return res


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, short windows")
    ap.add_argument("--sections", default="push,consume,e2e,wake")
    ap.add_argument("--arms", default=",".join(PUSH_ARMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0, help="push window (10 s)")
    ap.add_argument("--batches", default="1,10,100,1000")
    ap.add_argument("--qpb1-batches", default="1000")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--warmup", type=float, default=4.0, help="push warm-up per arm (4 s)")
    ap.add_argument("--physical-connections", type=int, default=8,
                    help="COPY connections of the physical arm (8: more only queue on 2 cores)")
    ap.add_argument("--procs", type=int, default=2, help="load generator processes (2)")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--consume-messages", type=int, default=60000)
    ap.add_argument("--consume-batch", type=int, default=100)
    ap.add_argument("--embedded", action=argparse.BooleanOptionalAction, default=True,
                    help="run every arm on a private PostgreSQL cluster started for the run "
                         "(default; --no-embedded uses --server-dsn)")
    ap.add_argument("--docs", type=Path, default=None,
                    help="write the report here (docs/benchmarks.md for the published run)")
    a, rest = ap.parse_known_args(argv)
    # bench/consume.py's knobs (servers, e2e, wake) with the suite's defaults.
    c = cons.parse_args(["--e2e-rate", "100", "--e2e-items", "10", "--e2e-duration", "10",
                         "--e2e-rounds", "3", "--e2e-batch", "100", "--arms",
                         "queen-mp,baseline", *rest])
    for k, v in vars(c).items():
        if k not in ("quick", "sections", "arms", "batches", "messages"):
            setattr(a, k, v)
    a.batches = [int(x) for x in a.batches.split(",") if x]
    a.qpb1_batches = [int(x) for x in a.qpb1_batches.split(",") if x]
    a.sections = [x for x in a.sections.split(",") if x]
    a.arms = [x for x in a.arms.split(",") if x]
    if a.quick:
        a.rounds, a.duration, a.e2e_rounds, a.e2e_duration = 1, 4.0, 1, 4.0
        a.consume_messages, a.wakes, a.burst_duration, a.pause = 15000, 100, 2.0, 1.0
    a.tp_partitions = 100
    a.pop_partitions = {a.consume_batch: 1}
    a.messages = {a.consume_batch: a.consume_messages}
    return a


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    suite = Suite(args)
    started = dt.datetime.now(dt.UTC)
    t0 = mono()
    status, failure = "ok", None
    logs: dict[str, Any] = {}
    try:
        suite.setup()
        asyncio.run(suite.run_all())
    except Interrupted as ex:
        status, failure = "interrupted", str(ex)
    except Exception as ex:
        status, failure = "error", f"{type(ex).__name__}: {ex}"
        print(f"\nerror: {failure}; cleaning up", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        logs = cons.cleanup(suite)
        if suite.pg is not None:
            with contextlib.suppress(Exception):
                suite.pg.stop()
            if suite.pg_dir is not None:
                shutil.rmtree(suite.pg_dir, ignore_errors=True)
    summary = summarize(suite)
    ledger_ok = all(v["ok"] and v["offsets"].get("ok", False) for v in suite.ledger.values())
    doc = {
        "benchmark": "suite", "status": status, "failure": failure, "run_id": suite.run_id,
        "command": " ".join(["python -m bench.suite", *(argv if argv is not None
                                                         else sys.argv[1:])]),
        "started_at": started.isoformat(), "elapsed_s": round(mono() - t0, 1),
        "machine": suite.info, "pgmq_sql_version": suite.pgmq_version,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "idle_commits_per_s": suite.idle_commits,
        "summary": summary, "cells": suite.cells, "ledger": suite.ledger,
        "ledger_ok": ledger_ok, "rss_peak_mb": suite.rss_peak, "pss_peak_mb": suite.pss_peak,
        "e2e_samples_ms": suite.e2e_samples,
        "wake_samples_ms": (suite.wake or {}).get("wake_samples_ms"),
        "wake": {k: v for k, v in (suite.wake or {}).items() if k != "wake_samples_ms"},
        "logs": logs, "notes": suite.notes,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = args.results_dir / f"suite-{stamp}.json"
    out.write_text(json.dumps(doc, indent=2, default=str))
    text = report.render(doc, plots_dir=args.results_dir / f"suite-{stamp}")
    print(text)
    if args.docs is not None:
        report.write_docs(doc, args.docs)
        print(f"report: {args.docs}")
    print(f"results: {out} ({mono() - t0:.0f} s)")
    if suite.ledger and not ledger_ok:
        print("\n!!! ZERO-LOSS LEDGER FAILED: see 'ledger' in the results !!!", file=sys.stderr)
        return 3
    return 0 if status == "ok" else (130 if status == "interrupted" else 1)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
