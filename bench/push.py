"""Push throughput: queen-mp against a naive commit-per-request baseline, same PostgreSQL.

``python -m bench.push`` (what ``make bench`` runs) does, in one go:

1. creates two fresh databases on the server (``--server-dsn``, default the local
   127.0.0.1:5432 as postgres): ``queen_bench_<id>_q`` for queen-mp (migrated by queen-mp
   itself at boot) and ``queen_bench_<id>_b`` for the baseline (``naive.messages``);
2. starts ``python -m queen_mp.processes.cli serve`` (2 front workers, 2 shards, a data dir of
   its own under /tmp) and the baseline (``bench/baseline_app.py`` under gunicorn with
   queen-mp's front settings: UvicornWorker, 2 workers, keep-alive 75 s, timeout 120 s);
3. warms both up (provisions the 1,000 partitions, opens connections), measures their idle
   commit rate, then for each workload (1-item requests, then 100-item requests) runs
   ``--rounds`` rounds of A B (queen-mp, baseline) with 64 closed-loop connections for
   ``--duration`` seconds each (``bench/loadgen.py``);
4. prints a markdown table of the medians, the ratio queen-mp / baseline and every round, and
   writes everything (machine, settings, each round's raw figures, log findings) to
   ``bench/results/push-<timestamp>.json``;
5. stops every process it started and drops both databases, also on Ctrl-C, SIGTERM or error.

See bench/README.md for how to read the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.baseline_app import SCHEMA_SQL
from bench.loadgen import LoadRun, LoadSpec
from queen_mp.db.embedded import EmbeddedPostgres
from queen_mp.processes.arbiter import front_argv

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
CLK_TCK = os.sysconf("SC_CLK_TCK")
ARMS = ("queen-mp", "baseline")


class Interrupted(BaseException):
    pass


# ------------------------------------------------------------------------------ processes, /proc
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def process_tree(pid: int) -> list[int]:
    kids = _children_map()
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(kids.get(p, []))
    return seen


def proc_file(pid: int, name: str) -> bytes | None:
    """``/proc/<pid>/<name>``, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return None


def database_pids(pids: list[int], database: str) -> list[int]:
    """The PostgreSQL processes among ``pids`` whose title names ``database`` (a backend's
    title is ``postgres: ... <user> <database> <client> <state>``, an autovacuum worker's
    ``postgres: autovacuum worker <database>``)."""
    needle = f" {database} ".encode()
    out = []
    for pid in pids:
        title = proc_file(pid, "cmdline")
        if title is not None and needle in title.replace(b"\0", b" ") + b" ":
            out.append(pid)
    return out


def cpu_ticks(pids: list[int]) -> dict[int, int]:
    """utime + stime of each live pid, in clock ticks."""
    out = {}
    for pid in pids:
        stat = proc_file(pid, "stat")
        if stat is None:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        out[pid] = int(fields[11]) + int(fields[12])
    return out


def reaped_ticks(pid: int) -> int:
    """cutime + cstime of ``pid``: the CPU of the children it has waited for, in clock ticks
    (a postmaster reaps every backend that exits, so this holds what their last samples miss)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[13]) + int(fields[14])


def shard_pids(pids: Iterable[int]) -> set[int]:
    """The broker's shard processes among ``pids`` (named qmp-shard-N by their fork)."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                if f.read().startswith(b"qmp-shard"):
                    out.add(pid)
        except OSError:
            continue
    return out


def ppid_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


def delta_cpu_s(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds spent between two snapshots by the processes alive at the end (a process
    that started in between counts from zero; one that exited in between is lost)."""
    return sum(t - before.get(pid, 0) for pid, t in after.items()) / CLK_TCK


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    for p in reversed(process_tree(pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def http_get(url: str, timeout: float = 3.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as ex:
        return ex.code, ex.read()


# ------------------------------------------------------------------------------ servers
@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    dsn: str
    exit_code: int | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.log_text()[-4000:]}")
            try:
                status, body = http_get(self.url + "/health")
                last = (status, body[:300])
                if status == 200:
                    return
            except OSError as ex:
                last = ex
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready in {timeout:.0f}s (last: {last}):\n"
                           f"{self.log_text()[-4000:]}")

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc.poll() is None:
            tree = process_tree(self.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  {self.name} did not stop on SIGTERM in {timeout:.0f}s; killing it",
                      file=sys.stderr)
                for pid in reversed(tree):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                self.proc.wait()
            # Anything of the tree still around (it should not be) goes too.
            for pid in tree[1:]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.exit_code = self.proc.returncode


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as out:
        # Own session: a terminal Ctrl-C reaches only this script, which then stops the
        # servers in order (SIGTERM, wait, SIGKILL as a last resort).
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("QUEEN_", "BENCH_", "PROMETHEUS_MULTIPROC"))}


def start_queen(data_dir: Path, dsn: str, workers: int, shards: int) -> Server:
    port = free_port()
    env = _clean_env()
    env.update({"QUEEN_PORT": str(port), "QUEEN_DATA_DIR": str(data_dir),
                "QUEEN_WORKERS": str(workers), "QUEEN_V2_FUSION_SHARDS": str(shards),
                "QUEEN_LOG_LEVEL": "info", "QUEEN_SHUTDOWN_TIMEOUT_S": "20",
                "QUEEN_PG_DSN": dsn})
    log = data_dir / "broker.log"
    proc = _spawn([sys.executable, "-m", "queen_mp.processes.cli", "serve"], env, log)
    return Server("queen-mp", f"http://127.0.0.1:{port}", proc, log, dsn)


def start_front_app(tmp: Path, name: str, app: str, workers: int, env: dict[str, str],
                    dsn: str) -> Server:
    """``app`` (a gunicorn app spec) under queen-mp's front command line
    (queen_mp/processes/arbiter.py): the baseline and edge arms differ from queen-mp's front in
    their app alone."""
    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", app,
            *front_argv(workers, f"127.0.0.1:{port}", 20, "info", f"bench-{name}")]
    log = tmp / f"{name}.log"
    proc = _spawn(argv, {**_clean_env(), **env}, log)
    return Server(name, f"http://127.0.0.1:{port}", proc, log, dsn)


def start_baseline(tmp: Path, dsn: str, workers: int, pool: int) -> Server:
    return start_front_app(tmp, "baseline", "bench.baseline_app:app_from_env()", workers,
                           {"BENCH_BASELINE_DSN": dsn, "BENCH_BASELINE_POOL": str(pool)}, dsn)


# ------------------------------------------------------------------------------ PostgreSQL
def db_name(dsn: str) -> str:
    name = conninfo_to_dict(dsn)["dbname"]
    assert isinstance(name, str)
    return name


def create_database(server_dsn: str, name: str) -> str:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(
            sql.Identifier(name)))
    return make_conninfo(server_dsn, dbname=name)


def drop_database(server_dsn: str, name: str, prefix: str = "queen_bench_") -> None:
    """Drops ``name``, which must start with ``prefix`` (no other database is ever dropped)."""
    assert name.startswith(prefix), name
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


@contextlib.contextmanager
def private_server(server_dsn: str | None) -> Iterator[str]:
    """``server_dsn`` as it is, or (None) the DSN of a private PostgreSQL cluster (fsync on)
    started for the run and removed after it: a section run on its own then measures nobody
    else's load and uses none of the shared server's connections."""
    if server_dsn is not None:
        yield server_dsn
        return
    root = Path(tempfile.mkdtemp(prefix="queen-bench-pg-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "pg", fsync=True)
    try:
        yield pg.start()
    finally:
        with contextlib.suppress(Exception):
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)


class RoleCpu:
    """CPU seconds per process role between a ``snap`` and ``since``: the broker's process
    tree, the PostgreSQL cluster of its database (every backend and auxiliary process) and
    this process, the load client. The per-message split the other sections report."""

    def __init__(self, broker_pid: int, dsn: str) -> None:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            # while the backend lives: once the connection closes, its /proc entry goes
            self.broker_pid, self.postmaster = broker_pid, ppid_of(row[0])

    @staticmethod
    def _client_s() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def snap(self) -> tuple[dict[int, int], dict[int, int], float]:
        return (cpu_ticks(process_tree(self.broker_pid)), cpu_ticks(process_tree(self.postmaster)),
                self._client_s())

    def since(self, snap: tuple[dict[int, int], dict[int, int], float]) -> dict[str, float]:
        now = self.snap()
        return {"broker": delta_cpu_s(snap[0], now[0]), "pg": delta_cpu_s(snap[1], now[1]),
                "client": now[2] - snap[2]}


class Monitor:
    """One autocommit connection to the server's maintenance database: reading the statistics
    from there never adds a commit to the databases being measured."""

    def __init__(self, server_dsn: str) -> None:
        self.conn = psycopg.connect(server_dsn, autocommit=True,
                                    application_name="bench-monitor")
        self.postmaster: int | None = None

    def close(self) -> None:
        self.conn.close()

    def one(self, query: str, params: tuple = ()) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return None if row is None else row[0]

    def db_stats(self, name: str) -> dict[str, int]:
        cur = self.conn.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, blks_read, blks_hit "
            "FROM pg_stat_database WHERE datname = %s", (name,))
        row = cur.fetchone()
        keys = ("xact_commit", "xact_rollback", "tup_inserted", "blks_read", "blks_hit")
        return dict(zip(keys, row or (0,) * len(keys), strict=True))

    def cluster_stats(self) -> dict[str, int]:
        """Cluster-wide WAL figures (every database of the server, other users' included)."""
        row = self.conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_records, wal_write, wal_sync "
            "FROM pg_stat_wal").fetchone()
        assert row is not None
        return {"wal_bytes": int(row[0]), "wal_records": int(row[1]),
                "wal_write": int(row[2]), "wal_sync": int(row[3])}

    def backend_pids(self, name: str) -> list[int]:
        rows = self.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                 (name,)).fetchall()
        return [r[0] for r in rows]

    def cluster_pids(self) -> list[int]:
        """The postmaster and all its children (every backend and auxiliary process)."""
        if self.postmaster is None:
            me = self.one("SELECT pg_backend_pid()")
            self.postmaster = ppid_of(int(me))
        return process_tree(self.postmaster)


# ------------------------------------------------------------------------------ queen metrics
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def queen_counters(url: str) -> dict[str, float]:
    """Every ``*_total`` sample of ``/metrics/prometheus``, summed over processes, plus one
    key per labelled sample (``name{labels}``)."""
    status, body = http_get(url + "/metrics/prometheus", timeout=10)
    if status != 200:
        raise RuntimeError(f"/metrics/prometheus answered {status}: {body[:300]!r}")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or not m.group(1).endswith("_total"):
            continue
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        out[name] = out.get(name, 0.0) + value
        if labels:
            key = name + labels
            out[key] = out.get(key, 0.0) + value
    return out


def counters_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    keys = set(before) | set(after)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(keys)
            if after.get(k, 0.0) != before.get(k, 0.0)}


# ------------------------------------------------------------------------------ log findings
_BAD = re.compile(r"\b(WARNING|ERROR|CRITICAL|Traceback|Exception)\b")


def log_findings(text: str) -> dict[str, Any]:
    bad = [ln for ln in text.splitlines() if _BAD.search(ln)]
    distinct: dict[str, int] = {}
    for ln in bad:
        # Drop timestamp and pid so that repeats of one message group together.
        key = re.sub(r"^\S+ \S+ ", "", ln)
        key = re.sub(r"\[\d+\]", "[pid]", key)[:300]
        distinct[key] = distinct.get(key, 0) + 1
    summaries = [ln for ln in text.splitlines() if "bundle summary" in ln]
    return {"lines": len(text.splitlines()), "warning_or_error_lines": len(bad),
            "distinct": [{"count": n, "line": k} for k, n in
                         sorted(distinct.items(), key=lambda kv: -kv[1])[:30]],
            "bundle_summaries_tail": summaries[-6:]}


# ------------------------------------------------------------------------------ the benchmark
@dataclass
class Bench:
    args: argparse.Namespace
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    server_dsn: str = LOCAL_DSN
    tmp: Path | None = None
    dbs: dict[str, str] = field(default_factory=dict)       # arm -> dsn
    servers: dict[str, Server] = field(default_factory=dict)  # arm -> server
    monitor: Monitor | None = None
    load: LoadRun | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    queued_by_arm: dict[str, int] = field(default_factory=dict)

    # -------------------------------------------------------------- setup
    def setup(self) -> None:
        a = self.args
        self.server_dsn = a.server_dsn
        self.monitor = Monitor(self.server_dsn)
        self.info = self.machine_info()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"queen-bench-{self.run_id}-", dir="/tmp"))
        self.tmp.chmod(0o755)
        for arm in a.arms:
            name = f"queen_bench_{self.run_id}_{'q' if arm == 'queen-mp' else 'b'}"
            self.dbs[arm] = create_database(self.server_dsn, name)
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

    def machine_info(self) -> dict[str, Any]:
        assert self.monitor is not None
        m = self.monitor
        settings = {}
        for name in ("synchronous_commit", "fsync", "wal_sync_method", "commit_delay",
                     "shared_buffers", "max_connections", "wal_level", "full_page_writes"):
            settings[name] = m.one("SELECT current_setting(%s)", (name,))

        def git(*cmd: str) -> str | None:
            try:
                return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True,
                                      check=True).stdout.strip()
            except (OSError, subprocess.CalledProcessError):
                return None

        cpu_model = None
        with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {
            "nproc": os.cpu_count(), "cpu_model": cpu_model, "loadavg_at_start": os.getloadavg(),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "postgres_version": m.one("SHOW server_version"),
            "postgres_settings": settings,
            "git_commit": git("rev-parse", "HEAD"),
            "git_dirty_tracked_files": None if dirty is None else len(dirty.splitlines()),
        }

    # -------------------------------------------------------------- one measured run
    def measure(self, arm: str, items: int, duration: float, tag: str,
                spread: str | None = None, settle: float | None = None) -> dict[str, Any]:
        a = self.args
        assert self.monitor is not None
        mon = self.monitor
        server = self.servers[arm]
        if not server.alive():
            raise RuntimeError(f"{arm} died (exit {server.proc.returncode}):\n"
                               f"{server.log_text()[-3000:]}")
        name = db_name(self.dbs[arm])
        pg0, wal0 = mon.db_stats(name), mon.cluster_stats()
        q0 = queen_counters(server.url) if arm == "queen-mp" else None
        spec = LoadSpec(url=server.url, connections=a.connections, procs=a.procs, items=items,
                        duration=duration, partitions=a.partitions, spread=spread or a.spread,
                        tag=f"{self.run_id}{tag}")
        self.load = LoadRun(spec)
        time.sleep(max(0.0, self.load.start_at - time.time()))
        broker_pids = process_tree(server.proc.pid)
        c0 = {"broker": cpu_ticks(broker_pids),
              "pg_db": cpu_ticks(mon.backend_pids(name)),
              "pg_cluster": cpu_ticks(mon.cluster_pids())}
        m0 = machine_ticks()
        time.sleep(max(0.0, self.load.end_at - time.time()))
        c1 = {"broker": cpu_ticks(process_tree(server.proc.pid)),
              "pg_db": cpu_ticks(mon.backend_pids(name)),
              "pg_cluster": cpu_ticks(mon.cluster_pids())}
        m1 = machine_ticks()
        res = self.load.wait()
        self.load = None
        # Backends publish their statistics at most once a second and, once idle, up to
        # PGSTAT_IDLE_INTERVAL (10 s) later: wait that out before reading the "after".
        time.sleep(a.settle if settle is None else settle)
        pg1, wal1 = mon.db_stats(name), mon.cluster_stats()
        q1 = queen_counters(server.url) if arm == "queen-mp" else None
        self.queued_by_arm[arm] = (self.queued_by_arm.get(arm, 0)
                                   + res["items_queued_incl_late"])

        window = res["window_s"]
        pg = {k: pg1[k] - pg0[k] for k in pg0}
        wal = {k: wal1[k] - wal0[k] for k in wal0}
        commits = pg["xact_commit"]
        cpu = {k: round(delta_cpu_s(c0[k], c1[k]), 3) for k in c0}
        cpu["loadgen"] = round(res["loadgen_cpu_s"], 3)
        busy = (m1[0] - m0[0]) / CLK_TCK
        total = (m1[1] - m0[1]) / CLK_TCK
        cpu["machine_busy_s"] = round(busy, 3)
        cpu["machine_busy_pct"] = round(100 * busy / total, 1) if total else None
        # Whatever else ran on the machine meanwhile (other users, this script): the noise.
        cpu["other_s"] = round(busy - cpu["broker"] - cpu["pg_cluster"] - cpu["loadgen"], 3)
        out: dict[str, Any] = {
            "arm": arm, "items_per_request": items, "tag": tag,
            "msgs_per_s": res["msgs_per_s"], "requests_per_s": res["requests_per_s"],
            "latency_ms": res["latency_ms"], "ok_requests": res["ok_requests"],
            "error_requests": res["error_requests"], "late_requests": res["late_requests"],
            "items_queued": res["items_queued"], "statuses": res["statuses"],
            "errors": res["errors"], "error_samples": res["error_samples"],
            "pg": pg, "xact_commit_delta": commits, "commits_per_s": commits / window,
            "msgs_per_commit": res["items_queued"] / commits if commits else None,
            "wal_cluster": wal,
            "wal_bytes_per_msg_cluster": (wal["wal_bytes"] / res["items_queued"]
                                          if res["items_queued"] else None),
            "cpu_s": cpu,
            "load": {k: v for k, v in res.items() if k != "workers"},
        }
        if q0 is not None and q1 is not None:
            d = counters_delta(q0, q1)
            fc = d.get("queen_fusion_commits_total", 0.0)
            fs = d.get("queen_fusion_segments_total", 0.0)
            fi = d.get("queen_batch_items_fired_total", 0.0)
            out["fusion"] = {"commits": fc, "segments": fs, "items": fi,
                             "segments_per_commit": fs / fc if fc else None,
                             "items_per_commit": fi / fc if fc else None,
                             "counters_delta": d}
        if not server.alive():
            raise RuntimeError(f"{arm} died during the run (exit {server.proc.returncode}):\n"
                               f"{server.log_text()[-3000:]}")
        return out

    # -------------------------------------------------------------- the schedule
    def run(self) -> None:
        a = self.args
        assert self.monitor is not None
        print(f"warm-up: {a.warmup:g}s of 100-item requests spread over the partitions, "
              f"per arm", flush=True)
        self.info["warmup"] = {}
        for arm in a.arms:
            r = self.measure(arm, 100, a.warmup, f"{arm[0]}warm", spread="item", settle=0.5)
            self.info["warmup"][arm] = {k: r[k] for k in ("msgs_per_s", "error_requests",
                                                          "errors", "statuses")}
            if r["error_requests"]:
                self.notes.append(f"warm-up of {arm}: {r['error_requests']} failed requests "
                                  f"{r['errors']}")
        # Idle background commit rate of each arm (it is inside every commits/s figure).
        time.sleep(a.settle)
        before = {arm: self.monitor.db_stats(db_name(self.dbs[arm]))["xact_commit"]
                  for arm in a.arms}
        t0 = time.monotonic()
        time.sleep(a.settle)
        el = time.monotonic() - t0
        self.info["idle_commits_per_s"] = {
            arm: (self.monitor.db_stats(db_name(self.dbs[arm]))["xact_commit"] - before[arm])
            / el for arm in a.arms}
        print(f"idle commits/s: {fmt_map(self.info['idle_commits_per_s'])}", flush=True)
        for items in a.items:
            for rnd in range(1, a.rounds + 1):
                for arm in a.arms:
                    print(f"  {items}-item requests, round {rnd}, {arm}: {a.duration:g}s ...",
                          end="", flush=True)
                    r = self.measure(arm, items, a.duration, f"{arm[0]}{items}r{rnd}")
                    r["round"] = rnd
                    self.rounds.append(r)
                    lat = r["latency_ms"]
                    print(f" {r['msgs_per_s']:,.0f} msgs/s, p50 {fmt(lat['p50'])} ms, "
                          f"p99 {fmt(lat['p99'])} ms, {r['commits_per_s']:,.0f} commits/s, "
                          f"errors {r['error_requests']}", flush=True)

    # -------------------------------------------------------------- integrity and logs
    def verify(self) -> dict[str, Any]:
        """Rows in each database against the items the load generator saw ``queued``."""
        out: dict[str, Any] = {}
        for arm, dsn in self.dbs.items():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    if arm == "baseline":
                        stored = conn.execute("SELECT count(*) FROM naive.messages").fetchone()
                        parts = conn.execute(
                            "SELECT count(DISTINCT partition) FROM naive.messages").fetchone()
                    else:
                        stored = conn.execute(
                            "SELECT coalesce(sum(msg_count), 0) FROM queen.log_segments"
                        ).fetchone()
                        parts = conn.execute("SELECT count(*) FROM queen.log_partitions"
                                             ).fetchone()
                assert stored is not None and parts is not None
                claimed = self.queued_by_arm.get(arm, 0)
                out[arm] = {"rows_stored": int(stored[0]), "items_answered_queued": claimed,
                            "partitions": int(parts[0]), "match": int(stored[0]) == claimed}
                if int(stored[0]) != claimed:
                    self.notes.append(f"{arm}: {stored[0]} messages stored but {claimed} "
                                      f"answered queued")
            except psycopg.Error as ex:
                out[arm] = {"error": str(ex)}
        return out


# ------------------------------------------------------------------------------ reporting
def fmt(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def fmt_map(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in d.items())


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(rounds: list[dict[str, Any]], arms: list[str], items_list: list[int]
              ) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for items in items_list:
        per: dict[str, Any] = {}
        for arm in arms:
            rs = [r for r in rounds if r["arm"] == arm and r["items_per_request"] == items]
            if not rs:
                continue
            per[arm] = {
                "rounds": len(rs),
                "msgs_per_s": med([r["msgs_per_s"] for r in rs]),
                "requests_per_s": med([r["requests_per_s"] for r in rs]),
                "p50_ms": med([r["latency_ms"]["p50"] for r in rs]),
                "p99_ms": med([r["latency_ms"]["p99"] for r in rs]),
                "commits_per_s": med([r["commits_per_s"] for r in rs]),
                "msgs_per_commit": med([r["msgs_per_commit"] for r in rs]),
                "segments_per_commit": med([(r.get("fusion") or {}).get("segments_per_commit")
                                            for r in rs]),
                "cpu_broker_s": med([r["cpu_s"]["broker"] for r in rs]),
                "cpu_pg_db_s": med([r["cpu_s"]["pg_db"] for r in rs]),
                "cpu_pg_cluster_s": med([r["cpu_s"]["pg_cluster"] for r in rs]),
                "cpu_loadgen_s": med([r["cpu_s"]["loadgen"] for r in rs]),
                "cpu_other_s": med([r["cpu_s"]["other_s"] for r in rs]),
                "machine_busy_pct": med([r["cpu_s"]["machine_busy_pct"] for r in rs]),
                "errors_total": sum(r["error_requests"] for r in rs),
                "non_queued_items": sum(v for r in rs for k, v in r["statuses"].items()
                                        if k != "queued"),
            }
        if "queen-mp" in per and "baseline" in per:
            q, b = per["queen-mp"], per["baseline"]

            def ratio(key: str, q: dict = q, b: dict = b) -> float | None:
                return q[key] / b[key] if q[key] is not None and b[key] else None

            per["ratio_queen_over_baseline"] = {k: ratio(k) for k in (
                "msgs_per_s", "requests_per_s", "p50_ms", "p99_ms", "commits_per_s",
                "msgs_per_commit")}
        summary[f"{items}-item"] = per
    return summary


def render_table(summary: dict[str, Any], rounds: list[dict[str, Any]], duration: float) -> str:
    lines = [
        f"Medians over rounds; {duration:g} s per round; CPU in seconds per round "
        "(broker = its process tree, pg db = backends of its database, pg all = whole "
        "cluster, other = everything else on the machine); busy = whole machine.",
        "",
        "| workload | arm | msgs/s | req/s | p50 ms | p99 ms | commits/s | msgs/commit "
        "| segs/commit | CPU broker | CPU pg db | CPU pg all | CPU loadgen | CPU other "
        "| busy % | errors |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for wl, per in summary.items():
        for arm in ARMS:
            s = per.get(arm)
            if s is None:
                continue
            errs = s["errors_total"] + s["non_queued_items"]
            lines.append(
                f"| {wl} | {arm} | {fmt(s['msgs_per_s'])} | {fmt(s['requests_per_s'])} "
                f"| {fmt(s['p50_ms'])} | {fmt(s['p99_ms'])} | {fmt(s['commits_per_s'])} "
                f"| {fmt(s['msgs_per_commit'], 2)} | {fmt(s['segments_per_commit'], 2)} "
                f"| {fmt(s['cpu_broker_s'])} | {fmt(s['cpu_pg_db_s'])} "
                f"| {fmt(s['cpu_pg_cluster_s'])} | {fmt(s['cpu_loadgen_s'])} "
                f"| {fmt(s['cpu_other_s'])} | {fmt(s['machine_busy_pct'])} | {errs} |")
        r = per.get("ratio_queen_over_baseline")
        if r:
            lines.append(
                f"| {wl} | **queen-mp / baseline** | **{fmt(r['msgs_per_s'], 2)}x** "
                f"| {fmt(r['requests_per_s'], 2)}x | {fmt(r['p50_ms'], 2)}x "
                f"| {fmt(r['p99_ms'], 2)}x | {fmt(r['commits_per_s'], 2)}x "
                f"| {fmt(r['msgs_per_commit'], 2)}x | | | | | | | | |")
    lines += ["", "Every round:", "",
              "| workload | round | arm | msgs/s | p50 ms | p99 ms | commits/s | segs/commit "
              "| busy % | errors |",
              "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rounds:
        lat = r["latency_ms"]
        segs = (r.get("fusion") or {}).get("segments_per_commit")
        lines.append(
            f"| {r['items_per_request']}-item | {r['round']} | {r['arm']} "
            f"| {fmt(r['msgs_per_s'])} | {fmt(lat['p50'])} | {fmt(lat['p99'])} "
            f"| {fmt(r['commits_per_s'])} | {fmt(segs, 2)} "
            f"| {fmt(r['cpu_s']['machine_busy_pct'])} | {r['error_requests']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.push", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per round (30)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 5 s rounds, 2 s warm-up (overrides --duration)")
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per workload (2)")
    ap.add_argument("--items", default="1,100", help="items per request, comma list (1,100)")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--procs", type=int, default=2, help="load generator processes (2)")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--spread", choices=["request", "item"], default="request",
                    help="one random partition per request (default) or per item")
    ap.add_argument("--workers", type=int, default=2, help="front workers of both arms (2)")
    ap.add_argument("--shards", type=int, default=2, help="queen-mp shard processes (2)")
    ap.add_argument("--baseline-pool", type=int, default=16,
                    help="baseline PostgreSQL connections per worker (16)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--settle", type=float, default=11.0,
                    help="wait before reading pg_stat_database after a run (11 s)")
    ap.add_argument("--arms", default="queen-mp,baseline")
    ap.add_argument("--server-dsn", default=os.environ.get("BENCH_PG_DSN", LOCAL_DSN))
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--keep-tmp", action="store_true",
                    help="keep the scratch dir (queen-mp data dir and both logs)")
    a = ap.parse_args(argv)
    if a.quick:
        a.duration, a.warmup = 5.0, 2.0
    a.items = [int(x) for x in a.items.split(",") if x.strip()]
    a.arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    for arm in a.arms:
        if arm not in ARMS:
            ap.error(f"unknown arm {arm!r}")
    if a.rounds < 1 or a.duration <= 0:
        ap.error("--rounds >= 1 and --duration > 0")
    return a


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def guarded(work: Callable[[], None], clean: Callable[[], dict[str, Any]]
            ) -> tuple[str, str | None, dict[str, Any]]:
    """Run ``work`` with SIGTERM and SIGINT raising ``Interrupted``, then always ``clean``
    (with both signals ignored: a second Ctrl-C must not cut the cleanup short). Returns
    (status: ok / interrupted / error, the failure, what ``clean`` returned)."""
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    status, failure = "ok", None
    try:
        work()
    except Interrupted as ex:
        status, failure = "interrupted", str(ex)
        print(f"\ninterrupted ({ex}); cleaning up", file=sys.stderr, flush=True)
    except Exception as ex:
        status, failure = "error", f"{type(ex).__name__}: {ex}"
        print(f"\nerror: {failure}; cleaning up", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        logs = clean()
    return status, failure, logs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    started = dt.datetime.now(dt.UTC)
    integrity: dict[str, Any] = {}

    def work() -> None:
        bench.setup()
        bench.run()
        integrity.update(bench.verify())

    status, failure, logs = guarded(work, lambda: cleanup(bench))
    summary = summarize(bench.rounds, args.arms, args.items)
    doc = {
        "benchmark": "push", "status": status, "failure": failure, "run_id": bench.run_id,
        "started_at": started.isoformat(), "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "machine": bench.info,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cpu_accounting": (
            "utime+stime from /proc/<pid>/stat between the start and the end of the window. "
            "broker: the process tree of the arm (queen-mp: supervisor, shards, gunicorn and "
            "its workers; baseline: gunicorn and its workers). pg_db: backends connected to "
            "the arm's database (pg_stat_activity at both ends). pg_cluster: the postmaster "
            "and all its children (other users' sessions too). loadgen: getrusage of the load "
            "generator processes. machine_busy: /proc/stat non-idle time of all CPUs. other: "
            "machine_busy minus the three (other users' processes and this script)."),
        "commit_accounting": (
            "xact_commit delta of the arm's database in pg_stat_database, read before the run "
            "and `settle` seconds after it; commits/s divides by the window. Includes idle "
            "background commits (machine.idle_commits_per_s)."),
        "summary": summary, "rounds": bench.rounds, "integrity": integrity,
        "logs": logs, "notes": bench.notes,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"push-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(doc, indent=2, default=str))
    if bench.rounds:
        print()
        print(render_table(summary, bench.rounds, args.duration))
    print()
    for arm, v in integrity.items():
        print(f"integrity {arm}: {v}")
    for arm, f in logs.items():
        if not isinstance(f, dict):
            continue
        print(f"log {arm}: {f.get('warning_or_error_lines')} warning/error lines, "
              f"exit code {f.get('exit_code')}")
        for d in f.get("distinct", [])[:8]:
            print(f"    {d['count']:>5} x {d['line'][:200]}")
    for n in bench.notes:
        print(f"note: {n}")
    print(f"\nresults: {out}")
    return 0 if status == "ok" else (130 if status == "interrupted" else 1)


def cleanup(bench: Bench) -> dict[str, Any]:
    logs: dict[str, Any] = {}
    if bench.load is not None:
        with contextlib.suppress(Exception):
            bench.load.kill()
    for arm, server in bench.servers.items():
        try:
            server.stop()
        except Exception as ex:
            bench.notes.append(f"stopping {arm}: {ex}")
            with contextlib.suppress(Exception):
                kill_tree(server.proc.pid)
        findings = log_findings(server.log_text())
        findings["exit_code"] = server.exit_code
        logs[arm] = findings
        if server.exit_code not in (0, None):
            bench.notes.append(f"{arm} exited with {server.exit_code} on SIGTERM")
    if bench.monitor is not None:
        with contextlib.suppress(Exception):
            bench.monitor.close()
    for arm, dsn in bench.dbs.items():
        try:
            drop_database(bench.server_dsn, db_name(dsn))
        except Exception as ex:
            bench.notes.append(f"dropping the {arm} database failed: {ex}")
    if bench.tmp is not None:
        if bench.args.keep_tmp:
            print(f"kept {bench.tmp}", flush=True)
        else:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    return logs


if __name__ == "__main__":
    sys.exit(main())
