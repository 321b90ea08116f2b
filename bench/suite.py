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
                     alone costs to keep the messages durably;
- ``edge``           the ceiling of the HTTP stack: a falcon app under queen-mp's gunicorn
                     command line that does a request's JSON work and nothing else (no
                     database; bench/edge_app.py). A ratio target the edge misses is out of
                     reach of any broker served by this stack on this machine;
- ``rabbitmq-quorum``, ``rabbitmq-classic``, ``nats``, ``nats-fsync``: the peers a user would
                     pick instead (bench/peers.py): RabbitMQ quorum / classic durable queues
                     with publisher confirms, NATS JetStream file streams with PubAck (by
                     default acknowledged before fsync) and a private nats-server fsyncing
                     every write. Push (batch 1 and 100) and consume only; an unreachable
                     peer is skipped, and the report says why.

Sections: ``push`` (batch 1/10/100/1000, 64 connections, 1,000 partitions), ``consume``
(drain a pre-filled queue, pop batch 100 + one ack per batch), ``mixed`` (push and consume at
once: 16 closed-loop connections pushing 10-item requests over 100 partitions while 1/4/16
consumers pop batch 100 and ack each batch with one call; msgs/s = acked inside the window,
next to pushed/s and the backlog at the window's end), ``fanout`` (queen-mp only: a queue
pre-filled with 40,000 messages over 100 partitions drained by 4 consumer groups of 2 consumers
each at once; msgs/s = deliveries of all groups / time until the last group acked them all;
naive and pgmq have no consumer groups, and a copy of the queue per group would be another
design, not the same workload), ``e2e`` (latency at 1,000 msg/s), ``wake`` (1,000 parked
pops), ``ephemeral`` (bench/ephemeral.py: push and pop/ack msgs/s of ephemeral queues
beside durable ones on one broker, pop/ack with 1 and 4 consumers), ``partitions``
(bench/partitions.py: a pop's cost against its queue's partition count), ``streams``
(bench/streams.py: events/s through a tumbling-window count run by the published client's
Stream DSL, and the p50/p99 of its ``/streams/v1/cycle`` calls). Every cell alternates the
arms (A B C D, A B C D, ...) and every figure is the median of the rounds; queen-mp's
figures are also given as ratios to each other arm of the same run.
The queen-mp messages of ``push``, ``mixed`` and ``fanout`` go through the zero-loss ledger
(bench/ledger.py): any loss fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import resource
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench import consume as cons
from bench import ephemeral, partitions, report, streams
from bench import ledger as ledgers
from bench.loadgen import LoadRun, LoadSpec, payload, percentiles
from bench.peers import (
    CODE,
    DEFAULT_NATS_SERVER,
    DEFAULT_NATS_URL,
    DEFAULT_RABBITMQ_URL,
    PEER_BATCHES,
    PEERS,
    PeerLoadRun,
    PeerLoadSpec,
    PeerSet,
    redact,
)
from bench.peers import drain as peer_drain
from bench.peers import prefill as peer_prefill
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
    counters_delta,
    cpu_ticks,
    create_database,
    database_pids,
    db_name,
    delta_cpu_s,
    guarded,
    http_get,
    machine_ticks,
    med,
    process_tree,
    queen_counters,
    reaped_ticks,
    shard_pids,
)
from queen_mp.config import Config
from queen_mp.db.embedded import EmbeddedPostgres

mono = time.monotonic
# queen-mp-qpb1 shares queen-mp's database: one arm between them lets the commit counters of
# the first settle before the second loads that database.
PUSH_ARMS = ("queen-mp", "naive", "queen-mp-qpb1", "pgmq", "physical", "edge", *PEERS)
# Arms whose messages PostgreSQL keeps: their CPU per message counts the cluster's CPU too.
PG_ARMS = ("queen-mp", "queen-mp-qpb1", "naive", "pgmq", "physical")
HTTP_SERVER = {"queen-mp": "queen-mp", "queen-mp-qpb1": "queen-mp", "naive": "baseline",
               "edge": "edge"}
SECTIONS = ("push", "consume", "mixed", "fanout", "e2e", "wake", "partitions", "ephemeral",
            "streams")
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


def filter_entries(url: str) -> float | None:
    """The shard dedup filters' entries (``queen_dedup_filter_entries``, summed): the
    broker's largest memory that grows with what was pushed (a 4-byte fingerprint a message
    plus each run's objects: 1.8M entries of 100- and 1,000-item pushes were 15.5 MB of the
    shard's PSS) and stays for the queue's dedup window, so a cell's PSS reads with it."""
    with contextlib.suppress(OSError):
        status, body = http_get(url + "/metrics/prometheus", timeout=10)
        if status == 200:
            return sum(float(line.split()[-1]) for line in body.decode().splitlines()
                       if line.startswith(("queen_dedup_filter_entries ",
                                           "queen_dedup_filter_entries{")))
    return None


def _role(pid: int, root: int) -> str:
    """A broker process's name in the PSS breakdown: the tree's root (queen-mp's supervisor,
    which runs the front's arbiter), a shard (qmp-shard-N) or a front worker by pid."""
    if pid == root:
        return "supervisor"
    comm = _read(f"/proc/{pid}/comm").strip().decode(errors="replace")
    return comm if comm.startswith("qmp-") else f"worker {pid}"


class Sampler(threading.Thread):
    """Samples, every ``every`` s, the CPU ticks of the broker's process tree, of the arm's
    PostgreSQL backends (found by their process title) and of the whole cluster, keeping the
    last value seen per pid: a client that disconnects before the window is read still counts
    (its backend's CPU up to its last sample). The cluster's CPU is exact: the live
    backends' ticks at each end of the window and what the postmaster reaped in between
    (``cluster_cpu_s``), so a backend born and gone between two samples counts too (pgmq's
    consumers in a 0.3 s drain were seen as 0.0 s). Also the peak of the broker tree's summed
    RSS and PSS (PSS counts shared pages once, RSS once per process), and each process's PSS in
    the sample that set the PSS peak (``peak_procs``, kB): which process holds it."""

    def __init__(self, postmaster: int, db: str, root: int | None, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.postmaster, self.root, self.every = postmaster, root, every
        self.db = db
        self.ticks: dict[str, dict[int, int]] = {"broker": {}, "pg_db": {}, "pg_live": {},
                                                 "pg_reaped": {}}
        self.peak_rss = self.peak_pss = 0
        self.peak_procs: dict[str, int] = {}
        self._stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.sample()

    def sample(self) -> None:
        # reaped first: a backend exiting between the two reads is then missed, never counted
        # both in this total and among the live below
        reaped = reaped_ticks(self.postmaster)
        cluster = process_tree(self.postmaster)
        ticks = cpu_ticks(cluster)
        db = {p: ticks[p] for p in database_pids(list(ticks), self.db)}
        broker = process_tree(self.root) if self.root else []
        with self.lock:
            self.ticks["pg_live"] = ticks
            self.ticks["pg_reaped"] = {self.postmaster: reaped}
            self.ticks["pg_db"].update(db)
            if broker:
                self.ticks["broker"].update(cpu_ticks(broker))
        if broker:
            rss = sum(_kb(f"/proc/{p}/status", b"VmRSS:") for p in broker)
            each = {p: _kb(f"/proc/{p}/smaps_rollup", b"Pss:") for p in broker}
            pss = sum(each.values())
            self.peak_rss = max(self.peak_rss, rss)
            if pss > self.peak_pss:
                assert self.root is not None
                self.peak_pss = pss
                self.peak_procs = {_role(p, self.root): kb for p, kb in each.items()}

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


def cluster_cpu_s(c0: dict[str, dict[int, int]], c1: dict[str, dict[int, int]]) -> float:
    """The cluster's CPU seconds between two ``Sampler.snapshot``s: the backends live at the
    end from their start (or birth), plus what the postmaster reaped in between, less the part
    of the reaped that the backends live at the start had already spent before it."""
    live0, live1 = c0["pg_live"], c1["pg_live"]
    reaped = sum(c1["pg_reaped"].values()) - sum(c0["pg_reaped"].values())
    before = sum(t for p, t in live0.items() if p not in live1)
    return (sum(t - live0.get(p, 0) for p, t in live1.items()) + reaped - before) / CLK_TCK


class Meter:
    """One measured window of one arm: CPU (broker tree, the arm's PostgreSQL backends, the
    whole cluster, the machine), WAL, queen-mp's fusion counters and peak RSS. The commit
    count is read later (``Suite.settle``): backends publish it up to 10 s after going idle.
    ``window`` names it (default: the suite's ``where``) for the run's memory peak."""

    def __init__(self, suite: Suite, arm: str, window: str | None = None) -> None:
        self.suite, self.arm = suite, arm
        self.window_name = f"{window or suite.where} [{arm}]"
        mon = suite.monitor
        assert mon is not None
        self.db = db_name(suite.dsn_of(arm))
        server = suite.servers.get(HTTP_SERVER.get(arm, ""))
        self.root = server.proc.pid if server is not None else None
        # A peer's "broker" is its server process (beam.smp, nats-server), found at setup.
        self.peer = arm in PEERS
        if self.peer and suite.peers is not None:
            self.root = suite.peers.pid(arm)
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
            self.suite.note_memory(rss, pss, self.window_name, self.sampler.peak_procs)
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
        self.filter_entries = filter_entries(self.url) if self.url else None
        if self.suite.pss_peak_window == self.window_name:
            self.suite.pss_peak_filter_entries = self.filter_entries
        return self.figures(client_cpu_s, msgs) if client_cpu_s is not None else {}

    def figures(self, client_cpu_s: float, msgs: float | None) -> dict[str, Any]:
        window = self.window
        out: dict[str, Any] = {"window_s": round(window, 3)}
        for k in ("broker", "pg_db"):
            out[f"cpu_{k}_s"] = (round(delta_cpu_s(self.c0[k], self.c1[k]), 3)
                                 if self.c1[k] else None)
        out["cpu_pg_all_s"] = (round(cluster_cpu_s(self.c0, self.c1), 3)
                               if self.c1["pg_live"] else None)
        out["cpu_client_s"] = round(client_cpu_s, 3)
        busy = (self.m1[0] - self.m0[0]) / CLK_TCK
        total = (self.m1[1] - self.m0[1]) / CLK_TCK
        out["busy_pct"] = round(100 * busy / total, 1) if total else None
        out["cpu_other_s"] = round(busy - (out["cpu_broker_s"] or 0)
                                   - (out["cpu_pg_all_s"] or 0) - client_cpu_s, 3)
        out["wal_bytes_per_s"] = self.wal / window
        out["wal_bytes_per_msg"] = self.wal / msgs if msgs else None
        if msgs:  # CPU per message of the cell's msgs figure, by role
            per = 1e6 / msgs
            broker, client = out["cpu_broker_s"], out["cpu_client_s"]
            pg = out["cpu_pg_all_s"] if self.arm in PG_ARMS else None
            out["cpu_broker_us_per_msg"] = broker * per if broker is not None else None
            # the shard processes' part of the broker's (qmp-shard-N: shards/process.py)
            shards = shard_pids(self.c1["broker"]) if self.c1["broker"] else set()
            out["cpu_shard_us_per_msg"] = (
                delta_cpu_s({p: t for p, t in self.c0["broker"].items() if p in shards},
                            {p: t for p, t in self.c1["broker"].items() if p in shards}) * per
                if shards else None)
            out["cpu_pg_us_per_msg"] = pg * per if pg is not None else None
            out["cpu_client_us_per_msg"] = client * per
            out["cpu_us_per_msg"] = sum(x for x in (broker, pg, client) if x is not None) * per
        if self.url:
            d = counters_delta(self.q0, self.q1)
            commits = d.get("queen_fusion_commits_total", 0.0)
            segments = d.get("queen_fusion_segments_total", 0.0)
            out["segs_per_commit"] = segments / commits if commits else None
            # partitions whose window of stored hashes the dedup filter read back: about one
            # a segment once the filter is past QUEEN_DEDUP_FILTER_ENTRIES (its drops thrash)
            out["read_backs_per_seg"] = (d.get("queen_dedup_read_backs_total", 0.0) / segments
                                         if segments else None)
            # segments whose dedup probe read stored hashes in SQL: most of them past the
            # filter's bound, each reading its partition's window (PostgreSQL's CPU grows)
            out["sql_probes_per_seg"] = (d.get("queen_dedup_sql_probes_total", 0.0) / segments
                                         if segments else None)
            out["dedup_filter_entries"] = self.filter_entries
        if self.root is not None:
            out["rss_peak_mb"], out["pss_peak_mb"] = self.peaks
        if self.peer:  # PostgreSQL's commits and WAL are not a peer's: no figure
            out["wal_bytes_per_s"] = out["wal_bytes_per_msg"] = None
            return out
        out["_commits"] = {"db": self.db, "x0": self.x0, "t_end": self.t_end,
                           "window": window, "arm": self.arm}
        return out


# ------------------------------------------------------------------------------ deliveries
class _Stop(Exception):
    """Raised from a consumer's ack callback once the window is over: ends
    ``cons.consumer_loop`` right after an ack, never between a pop and its ack."""


def _rusage_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Deliveries:
    """One consumer group's deliveries to the measured consumers (``cons.consumer_loop``),
    for the zero-loss ledger. Inside the window the callback only keeps a reference to each
    pop answer's messages and the fate of its ack (O(1) per batch, so the consumers' CPU stays
    theirs); ``compact`` files them after the window as ``ledger.drain`` would
    (``ledger.Consumed``); ``consumed`` merges the ledger's drain of the same group, run
    later, into it: a message delivered again by the drain is a redelivery, explained if the
    measured consumer's ack was not a full success (the drain does the same within itself)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.acked = 0
        self.batches: list[tuple[float, list[dict[str, Any]], list[str]]] = []
        self.out = ledgers.Consumed(group)
        self.firsts: dict[tuple[str, int], tuple[bytes, list[str]]] = {}
        self.again: list[tuple[ledgers.Redelivery, list[str]]] = []

    def callback(self, stop: asyncio.Event | None = None, on_ack: Any = None) -> Any:
        """``on_batch`` of one consumer loop (it pops and acks one batch at a time)."""
        cur: list[Any] = [None, None]

        def on_batch(msgs: list[dict[str, Any]] | None, t: Any) -> None:
            if msgs is not None:
                fate = ["pending"]  # an ack that never got a 200 leaves it pending
                self.batches.append((t, msgs, fate))
                cur[0], cur[1] = msgs, fate
                return
            if cur[1] is not None:
                n = len(cur[0])
                cur[1][0] = "ok" if t == n else f"failed:{n - t} of {n} items"
                cur[0] = cur[1] = None
            self.acked += t
            if on_ack is not None:
                on_ack(t)
            if stop is not None and stop.is_set():
                raise _Stop

        return on_batch

    def compact(self) -> None:
        """Files the batches kept so far (after the consumers have stopped)."""
        out = self.out
        self.batches.sort(key=lambda b: b[0])
        for _, msgs, fate in self.batches:
            for m in msgs:
                data = m.get("data")
                pid, mid = int(m["partitionId"]), str(m["id"])
                attempt = int(m.get("deliveryAttempt") or 0)
                if not (isinstance(data, dict) and isinstance(data.get("producer"), str)
                        and isinstance(data.get("seq"), int)):
                    out.foreign.append({"message_id": mid, "partition_id": pid,
                                        "offset": m.get("offset"),
                                        "transaction_id": m.get("transactionId"),
                                        "data": str(data)[:120]})
                    continue
                producer, seq = data["producer"], data["seq"]
                raw = uuid.UUID(mid).bytes
                first = self.firsts.get((producer, seq))
                if first is None:
                    self.firsts[producer, seq] = (raw, fate)
                elif first[0] == raw:  # the same message again
                    self.again.append((ledgers.Redelivery(
                        mid, pid, int(m.get("offset", -1)), attempt, producer, seq,
                        "pending", False), first[1]))
                    continue
                # else: another message with the same producer/seq: check() calls it stored
                # twice (a DUPLICATE)
                out.add(producer, seq, raw, transaction_id=m.get("transactionId"),
                        partition_id=pid, attempt=attempt)
        self.batches = []

    def consumed(self, drained: ledgers.Consumed | None) -> ledgers.Consumed:
        """The measured consumers' deliveries and the drain's, as one ``Consumed``. A
        redelivery's first ack is read now: every ack of the window has been answered."""
        self.compact()
        out = self.out
        for rd, fate in self.again:
            rd.first_ack = fate[0]
            out.redeliveries.append(rd)
        self.again = []
        window = {"first_deliveries": out.first_deliveries,
                  "redeliveries": len(out.redeliveries), "acked": self.acked}
        if drained is None:
            out.stats = {"measured_consumers": window}
            return out
        for producer, seqs in drained.seqs.items():
            ids, parts = drained.ids[producer], drained.partitions[producer]
            attempts = drained.attempts[producer]
            for i, seq in enumerate(seqs):
                raw = bytes(ids[16 * i:16 * i + 16])
                first = self.firsts.get((producer, seq))
                if first is not None and first[0] == raw:
                    out.redeliveries.append(ledgers.Redelivery(
                        str(uuid.UUID(bytes=raw)), parts[i], -1, attempts[i], producer, seq,
                        first[1][0], False))
                else:  # the drain already compared its transactionId
                    out.add(producer, seq, raw, partition_id=parts[i], attempt=attempts[i])
        out.foreign += drained.foreign
        out.txn_mismatches += drained.txn_mismatches
        out.redeliveries += drained.redeliveries
        out.stats = {**drained.stats, "measured_consumers": window}
        return out


def _mixed_variant(consumers: int) -> str:
    return f"{consumers} consumer" + ("" if consumers == 1 else "s")


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
        #: the measured window that set ``pss_peak``, and each process's PSS (MB) then
        self.pss_peak_window: str | None = None
        self.pss_peak_procs: dict[str, float] = {}
        self.pss_peak_filter_entries: float | None = None  # at the end of that window
        #: what runs now (section, cell, warm-up): the name of the windows metered meanwhile
        self.where = "setup"
        self.probes = 0
        self.ledger: dict[str, Any] = {}
        self.e2e_samples: dict[str, list[float]] = {}
        self.pgmq_version: str | None = None
        self.meter: Meter | None = None
        self.pg: EmbeddedPostgres | None = None
        self.pg_dir: Path | None = None
        self.peers: PeerSet | None = None
        self.partitions: partitions.Figures | None = None

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
        for key in ("pgmq", "physical", "edge"):
            # the edge's database stays empty: its Meter reads no commits there
            name = f"queen_bench_{self.run_id}_{key[:2]}"
            self.dbs[key] = create_database(a.server_dsn, name)
        if "edge" in arms:
            assert self.tmp is not None
            edge = self.servers["edge"] = cons.start_edge(self.tmp, a.workers)
            edge.wait_ready()
            print(f"  edge ready on {edge.url} (pid {edge.proc.pid})", flush=True)
        if any(x in PEERS for x in arms):
            print("peers:", flush=True)
            self.peers = PeerSet(arms, self.tmp, rabbitmq_url=a.rabbitmq_url,
                                 nats_url=a.nats_url, nats_server=a.nats_server)
            self.peers.setup()
            for arm, p in self.peers.peers.items():
                if not p.ok:
                    self.notes.append(f"{arm} skipped: {p.reason}")
                elif p.reason:
                    self.notes.append(f"{arm}: {p.reason}")
        self.pgmq_version = install_pgmq(self.dbs["pgmq"])
        create_pgmq_queue(self.dbs["pgmq"], "bench")
        create_physical_table(self.dbs["physical"])
        assert self.tmp is not None
        self.ledger_root = self.tmp / "ledger"
        self.ledger_root.mkdir()
        self.measure_idle_commits()

    def dsn_of(self, arm: str) -> str:
        # the peers keep nothing in PostgreSQL: the edge's empty database stands in
        return self.dbs["edge" if arm in PEERS else
                        {"queen-mp-qpb1": "queen-mp", "naive": "baseline"}.get(arm, arm)]

    def peer_ok(self, arm: str) -> bool:
        """A peer arm that runs: reachable and ready at setup (else skipped, with a note)."""
        return self.peers is not None and self.peers.ok(arm)

    def peer_failed(self, arm: str, where: str, ex: Exception) -> None:
        """A peer that fails inside a cell (its server went away, a worker crashed) is
        skipped from then on, with a note: it must not cost the rest of the run."""
        why = f"failed in {where}: {type(ex).__name__}: {ex}"[:500]
        print(f"  {arm}: {why}; skipped from here on", flush=True)
        self.notes.append(f"{arm} {why}; skipped for the rest of the run")
        self.load = None
        if self.peers is not None and arm in self.peers.peers:
            peer = self.peers.peers[arm]
            peer.ok, peer.reason = False, f"{why} (skipped for the rest of the run)"

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
        them. A window of the database about to be loaded (``running``) is read before the
        load starts, waiting for its lag if needed, so no other window's commits land in it
        (the arm order keeps that wait rare)."""
        assert self.monitor is not None
        busy_db = db_name(self.dsn_of(running)) if running else None
        keep = []
        for p in self.pending:
            c = p["_commits"]
            wait = c["t_end"] + STATS_LAG_S - mono()
            if wait > 0 and not force and c["db"] != busy_db:
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
        starts there too (``take_meter`` collects it). It samples until the next probe or
        the end of the section: named by the section and its count of probes so far."""
        if self.meter is not None:
            self.meter.discard()
        self.probes += 1
        self.meter = Meter(self, {"baseline": "naive"}.get(arm or "", arm or "queen-mp"),
                           f"{self.where}, from probe {self.probes}")
        return super().probe(arm)

    def at(self, where: str) -> None:
        """Name what runs from now on (``Meter``'s default window name)."""
        self.where, self.probes = where, 0

    def note_memory(self, rss: float, pss: float, window: str, procs: dict[str, int]) -> None:
        """A queen-mp window's memory peaks: the run's, with the window that set the PSS one
        (the peak may come from a window that is no cell: a warm-up, a wake phase)."""
        self.rss_peak = max(self.rss_peak, rss)
        if pss > self.pss_peak:
            self.pss_peak, self.pss_peak_window = pss, window
            self.pss_peak_filter_entries = None
            self.pss_peak_procs = {k: round(v / 1024, 1) for k, v in sorted(procs.items())}

    def take_meter(self) -> Meter:
        m, self.meter = self.meter, None
        assert m is not None
        return m

    def record(self, cell: dict[str, Any]) -> None:
        self.cells.append(cell)
        if "_commits" in cell:
            self.pending.append(cell)

    # -------------------------------------------------------------- push
    def push_spec(self, arm: str, batch: int, tag: str, name: str = ""
                  ) -> LoadSpec | PgLoadSpec | PeerLoadSpec:
        a = self.args
        if arm in PEERS:
            assert self.peers is not None
            return PeerLoadSpec(arm=arm, url=self.peers.url(arm), name=name,
                                connections=a.connections, procs=a.procs, items=batch,
                                duration=a.duration, tag=tag)
        if arm in HTTP_SERVER:
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
        peer = arm in PEERS
        self.settle(running=None if peer else arm)
        tag = f"{self.run_id[:4]}{arm[0]}{arm[-1]}{batch}r{rnd}"
        name = ""
        if peer:  # a fresh queue / stream per cell, deleted after it
            assert self.peers is not None
            name = f"qb_{self.run_id}_{CODE[arm]}{batch}r{rnd}{'w' if warmup else ''}"
            asyncio.run(self.peers.create(arm, name))
        spec = self.push_spec(arm, batch, tag, name)
        self.at(f"push batch {batch} warm-up" if warmup else f"push batch {batch} r{rnd}")
        if warmup:
            spec.duration = warmup
        run: LoadRun | PgLoadRun | PeerLoadRun = (
            LoadRun(spec) if isinstance(spec, LoadSpec) else
            PgLoadRun(spec) if isinstance(spec, PgLoadSpec) else PeerLoadRun(spec))
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
        if peer:
            self.peer_push_check(cell, arm, name, res["items_queued_incl_late"])
        if warmup:
            cell.pop("_commits", None)
            return cell
        self.record(cell)
        print(f"  push batch {batch:>4} r{rnd} {arm:<16} {res['msgs_per_s']:>10,.0f} msgs/s  "
              f"p50 {lat['p50'] or 0:7.1f} ms  p99 {lat['p99'] or 0:7.1f} ms  "
              f"errors {cell['errors']}", flush=True)
        return cell

    def peer_push_check(self, cell: dict[str, Any], arm: str, name: str, confirmed: int
                        ) -> None:
        """After a peer's push window: what its queue / stream holds against what was
        confirmed (late confirms included), then the queue / stream goes."""
        assert self.peers is not None
        peers = self.peers
        try:
            stored: int | None = asyncio.run(peers.count(arm, name))
        except Exception as ex:
            stored = None
            self.notes.append(f"{arm} push {name}: count failed: {type(ex).__name__}: {ex}")
        asyncio.run(peers.delete(arm, name))
        cell.update({"queue": name, "stored": stored, "confirmed_incl_late": confirmed})
        if stored is not None and stored < confirmed:
            self.notes.append(f"{arm} push {name}: {confirmed} messages confirmed but only "
                              f"{stored} stored")

    def run_push(self) -> None:
        a = self.args
        print(f"[{self.clock()}] push: {a.connections} connections, {a.partitions} partitions,"
              f" {a.duration:g} s windows, {a.rounds} rounds", flush=True)
        skip = {x for x in a.arms if x in PEERS and not self.peer_ok(x)}
        # Warm-up, not recorded: provisions queen-mp's partitions, opens every connection.
        for arm in a.arms:
            if arm != "physical" and arm not in skip:
                self.guarded_push_cell(arm, 100, 0, warmup=a.warmup)
        for batch in a.batches:
            arms = push_arms(a.arms, batch, max(a.batches), a.qpb1_batches, a.peer_batches,
                             skip)
            for rnd in range(1, a.rounds + 1):
                for arm in arms:
                    self.guarded_push_cell(arm, batch, rnd)
        self.settle(force=True)

    def guarded_push_cell(self, arm: str, batch: int, rnd: int, warmup: float = 0.0) -> None:
        if arm not in PEERS:
            self.push_cell(arm, batch, rnd, warmup=warmup)
            return
        if not self.peer_ok(arm):
            return
        try:
            self.push_cell(arm, batch, rnd, warmup=warmup)
        except Exception as ex:
            if self.load is not None:
                with contextlib.suppress(Exception):
                    self.load.kill()
            self.peer_failed(arm, f"push batch {batch} r{rnd}", ex)

    # -------------------------------------------------------------- consume
    async def pgmq_fill(self, queue: str, n: int, tag: str) -> None:
        producer = tag.encode()
        body = [payload(producer, i).decode() for i in range(n)]  # the same 200 bytes
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
            for arm in ("queen-mp", "naive", "pgmq", "edge", *PEERS):
                if arm not in a.arms or (arm in PEERS and not self.peer_ok(arm)):
                    continue
                self.settle(running=None if arm in PEERS else arm)
                self.at(f"consume r{rnd}")
                if arm in PEERS:
                    try:
                        cell = await self.peer_consume_cell(arm, rnd)
                    except Exception as ex:
                        self.peer_failed(arm, f"consume r{rnd}", ex)
                        continue
                elif arm == "pgmq":
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
                    r = await self.run_throughput(self.arm(HTTP_SERVER[arm]), a.consume_batch,
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
                print(f"  consume r{rnd} {arm:<16} {cell['msgs_per_s'] or 0:>10,.0f} msgs/s "
                      f"errors {cell['errors']} redelivered {cell['redelivered']}", flush=True)
                await asyncio.sleep(a.pause)
        self.settle(force=True)

    async def peer_consume_cell(self, arm: str, rnd: int) -> dict[str, Any]:
        """A fresh queue / stream pre-filled (untimed) as queen-mp's is, then drained by
        ``--consumers`` consumers in this process (bench/peers.py ``drain``); the Meter runs
        from the consumers' start to the ack that completed the drain."""
        a = self.args
        assert self.peers is not None
        peers, url = self.peers, self.peers.url(arm)
        name = f"qc_{self.run_id}_{CODE[arm]}r{rnd}"
        n = a.consume_messages
        box: dict[str, Any] = {}

        def started() -> None:
            box["meter"], box["cpu0"] = Meter(self, arm), _rusage_s()

        def done() -> None:
            box["cpu1"] = _rusage_s()
            box["meter"].stop()

        await peers.create(arm, name)
        try:
            fill_s = await peer_prefill(arm, url, name, n, f"{self.run_id}c{CODE[arm]}{rnd}",
                                        a.prefill_connections, a.prefill_request)
            stored = await peers.count(arm, name)
            if stored != n:
                self.notes.append(f"{arm} consume {name}: pre-fill stored {stored} of {n}")
            await asyncio.sleep(a.pause)
            r = await peer_drain(arm, url, name, stored, a.consumers, a.consume_batch,
                                 a.drain_cap, on_start=started, on_done=done)
        finally:
            with contextlib.suppress(Exception):
                box["meter"].discard()
            with contextlib.suppress(Exception):  # else cleanup() retries at the end
                await peers.delete(arm, name)
        lat = r["batch_latency_ms"]
        cell = {"msgs": r["acked"], "msgs_per_s": r["msgs_per_s"], "p50_ms": lat["p50"],
                "p99_ms": lat["p99"], "errors": sum(r["errors"].values()),
                "redelivered": r["redelivered"], "drained": r["drained"],
                "leftover": r["leftover"], "queue": name, "prefill_s": round(fill_s, 3),
                "prefill_stored": stored, "msgs_per_batch": r["msgs_per_batch"]}
        cell.update(box["meter"].figures(box["cpu1"] - box["cpu0"], r["acked"]))
        cell["raw"] = r
        return cell

    # -------------------------------------------------------------- mixed
    async def run_mixed(self) -> None:
        """Push and consume at once. Per cell a fresh queue, a closed-loop load generator
        (``--mixed-connections`` connections, ``--mixed-items``-item requests, 100 partitions)
        and, over the same window, C consumers popping ``--mixed-batch`` and acking each batch
        with one call. queen-mp's consumers are the group ``mixed`` (long poll); its ledger
        check drains that group at the end of the section (after the commit counters are
        read, so the drain does not count as the cell's commits)."""
        a = self.args
        arms = [x for x in ("queen-mp", "naive", "pgmq") if x in a.arms]
        print(f"[{self.clock()}] mixed: {a.mixed_connections} push connections x "
              f"{a.mixed_items} items, consumers {a.mixed_consumers} x pop batch "
              f"{a.mixed_batch} + one ack per batch, {a.duration:g} s windows, {a.rounds} "
              "rounds", flush=True)
        checks: list[tuple[str, str, Path, dict[str, Deliveries]]] = []
        for consumers in a.mixed_consumers:
            for rnd in range(1, a.rounds + 1):
                for arm in arms:
                    self.settle(running=arm)
                    self.at(f"mixed {_mixed_variant(consumers)} r{rnd}")
                    if arm == "pgmq":
                        cell = await asyncio.to_thread(self.mixed_pgmq_cell, consumers, rnd)
                    else:
                        cell, check = await self.mixed_http_cell(arm, consumers, rnd)
                        if check is not None:
                            checks.append(check)
                    self.record(cell)
                    print(f"  mixed {cell['variant']:<12} r{rnd} {arm:<9} "
                          f"{cell['msgs_per_s'] or 0:>9,.0f} msgs/s consumed, "
                          f"{cell['pushed_per_s'] or 0:>9,.0f} pushed/s, backlog "
                          f"{cell['backlog_end']:,}, pop p50 {cell['p50_ms'] or 0:.1f} ms "
                          f"p99 {cell['p99_ms'] or 0:.1f} ms, errors {cell['errors']}",
                          flush=True)
                    await asyncio.sleep(a.pause)
        self.settle(force=True)
        for name, queue, ldir, seen in checks:
            await self.check_ledger(name, queue, list(seen), ledger_dir=ldir, seen=seen)

    def _mixed_cell(self, arm: str, consumers: int, rnd: int, push: dict[str, Any],
                    consumed: int, window: float, pop_lat: dict[str, Any]) -> dict[str, Any]:
        pushed = push["items_queued"]
        return {
            "section": "mixed", "variant": _mixed_variant(consumers), "arm": arm, "round": rnd,
            "consumers": consumers, "msgs": consumed,
            "msgs_per_s": consumed / window if window > 0 else None,
            "pushed": pushed, "pushed_per_s": push["msgs_per_s"],
            "backlog_end": pushed - consumed,
            "p50_ms": pop_lat.get("p50"), "p99_ms": pop_lat.get("p99"),
            "push_p50_ms": push["latency_ms"]["p50"], "push_p99_ms": push["latency_ms"]["p99"],
            "late_requests": push["late_requests"],
        }

    @staticmethod
    def _push_errors(res: dict[str, Any]) -> int:
        return res["error_requests"] + sum(v for k, v in res["statuses"].items()
                                           if k != "queued")

    async def mixed_http_cell(self, arm: str, consumers: int, rnd: int
                              ) -> tuple[dict[str, Any], Any]:
        a = self.args
        queen = arm == "queen-mp"
        server = self.servers[HTTP_SERVER[arm]]
        http_arm = self.arm(HTTP_SERVER[arm])
        tag = f"{self.run_id[:4]}m{arm[0]}{consumers}r{rnd}"
        queue = f"mx-{self.run_id}-{arm[0]}{consumers}r{rnd}"
        ldir = self.ledger_root / f"mixed-{consumers}c-r{rnd}" if queen else None
        spec = LoadSpec(url=server.url, connections=a.mixed_connections, procs=a.procs,
                        items=a.mixed_items, duration=a.duration, partitions=100, queue=queue,
                        tag=tag, ledger_dir=str(ldir) if ldir else None)
        st = cons.OpStats()
        stop = asyncio.Event()
        seen = Deliveries("mixed") if queen else None
        https = [cons.Http(server.url) for _ in range(consumers)]
        tasks: list[asyncio.Task[Any]] = []
        run = LoadRun(spec)
        self.load = run
        try:
            for h in https:
                await h.connect()
            await asyncio.sleep(max(0.0, run.start_at - time.time()))
            meter = Meter(self, arm)
            cpu0 = _rusage_s()
            for h in https:
                # queen-mp: stop after an ack once the window is over (a consumer cancelled
                # between pop and ack would leave its messages leased, out of the drain's
                # reach). naive: no ledger; its consumers are cancelled at the window's end.
                cb = (seen.callback(stop) if seen is not None
                      else (lambda msgs, t: None))
                tasks.append(asyncio.create_task(cons.consumer_loop(
                    http_arm, h, queue, a.mixed_batch, a.mixed_pop_partitions, "mixed", st,
                    cb, a.poll_ms / 1000, wait_ms=1000)))
            await asyncio.sleep(max(0.0, run.end_at - time.time()))
            rep = st.reset()
            cpu1 = _rusage_s()
            meter.stop()
            stop.set()
            if not queen:
                await cons.cancel_all(tasks)
            res = await asyncio.to_thread(run.wait)
            cancelled = await self._stop_consumers(tasks, st) if queen else len(tasks)
        except BaseException:
            run.kill()
            await cons.cancel_all(tasks)
            raise
        finally:
            self.load = None
            for h in https:
                h.close()
        cell = self._mixed_cell(arm, consumers, rnd, res, rep["acked"], meter.window,
                                rep["pop_latency_ms"])
        cell.update({
            "queue": queue,
            "errors": self._push_errors(res) + sum(rep["errors"].values())
            + rep["ack_failed_items"],
            "pops": rep["pops"], "empty_pops": rep["empty_pops"],
            "msgs_per_pop": rep["msgs_per_pop"], "consumers_cancelled": cancelled})
        cell.update(meter.figures(res["loadgen_cpu_s"] + cpu1 - cpu0, rep["acked"]))
        cell["raw"] = {"push": {k: v for k, v in res.items() if k not in ("workers", "spec")},
                       "consumer": rep}
        check = None
        if seen is not None and ldir is not None:
            seen.compact()
            check = (f"mixed {_mixed_variant(consumers)} r{rnd}", queue, ldir, {"mixed": seen})
        return cell, check

    async def _stop_consumers(self, tasks: list[asyncio.Task[Any]], st: cons.OpStats,
                              quiet: float = 1.5, cap: float = 15.0) -> int:
        """After the window (the stop event set, the producers gone): each consumer ends
        after its next ack (``_Stop``); those left once no ack has come for ``quiet`` s are
        parked on a queue with nothing left for them and are cancelled (no push can arrive
        any more, so a parked pop claims nothing). Returns how many were cancelled."""
        t_end = mono() + cap
        last, t_last = st.acked, mono()
        pending = {t for t in tasks if not t.done()}
        while pending and mono() < t_end:
            _, pending = await asyncio.wait(pending, timeout=0.1)
            if st.acked != last:
                last, t_last = st.acked, mono()
            elif mono() - t_last >= quiet:
                break
        await cons.cancel_all(list(pending))
        for t in tasks:
            if t.cancelled():
                continue
            ex = t.exception()
            if ex is not None and not isinstance(ex, _Stop):
                raise RuntimeError(f"consumer loop failed: {type(ex).__name__}: {ex}") from ex
        return len(pending)

    def mixed_pgmq_cell(self, consumers: int, rnd: int) -> dict[str, Any]:
        """pgmq: the load generator's ``send_batch`` calls and ``PgmqConsumeRun`` (non-drain:
        read + delete for the window), both started at the same instant."""
        a = self.args
        queue = f"m{self.run_id}c{consumers}r{rnd}"
        create_pgmq_queue(self.dbs["pgmq"], queue)
        load = PgLoadRun(PgLoadSpec(dsn=self.dbs["pgmq"], kind="pgmq",
                                    connections=a.mixed_connections, procs=a.procs,
                                    items=a.mixed_items, duration=a.duration, queue=queue,
                                    partitions=100, tag=f"{self.run_id[:4]}mp{consumers}r{rnd}"))
        self.load = load  # type: ignore[assignment]
        consume = None
        try:
            consume = PgmqConsumeRun(PgmqConsumeSpec(
                dsn=self.dbs["pgmq"], queue=queue, consumers=consumers, procs=1,
                batch=a.mixed_batch, duration=a.duration, poll_ms=int(a.poll_ms)),
                start_delay=max(0.0, load.start_at - time.time()))
            time.sleep(max(0.0, load.start_at - time.time()))
            meter = Meter(self, "pgmq")
            time.sleep(max(0.0, load.end_at - time.time()))
            meter.stop()
            res = load.wait()
            cres = consume.wait()
        except BaseException:
            load.kill()
            if consume is not None:
                consume.kill()
            raise
        finally:
            self.load = None
        cell = self._mixed_cell("pgmq", consumers, rnd, res, cres["consumed"], a.duration,
                                cres["read_latency_ms"])
        cell.update({
            "queue": queue,
            "errors": self._push_errors(res) + sum(cres["errors"].values()),
            "pops": cres["reads"], "empty_pops": cres["empty_reads"],
            "redelivered": cres["redelivered"]})
        cell.update(meter.figures(res["loadgen_cpu_s"] + cres["cpu_s"], cres["consumed"]))
        cell["raw"] = {"push": {k: v for k, v in res.items() if k not in ("workers", "spec")},
                       "consumer": {k: v for k, v in cres.items()
                                    if k not in ("workers", "spec")}}
        return cell

    # -------------------------------------------------------------- fanout
    async def run_fanout(self) -> None:
        """queen-mp only: naive and pgmq have no consumer groups (a message is consumed once,
        by whoever deletes it), and giving each group its own copy of the queue would be
        another design (N times the writes), not the same workload."""
        a = self.args
        print(f"[{self.clock()}] fanout: {a.fanout_messages:,} messages, {a.fanout_groups} "
              f"groups x {a.fanout_consumers} consumers, pop batch {a.fanout_batch} + one ack "
              f"per batch, {a.rounds} rounds", flush=True)
        checks = []
        for rnd in range(1, a.rounds + 1):
            self.settle(running="queen-mp")
            self.at(f"fanout r{rnd}")
            cell, check = await self.fanout_cell(rnd)
            self.record(cell)
            checks.append(check)
            per = ", ".join(f"{g} {v if v is None else round(v, 2)} s"
                            for g, v in cell["group_elapsed_s"].items())
            print(f"  fanout r{rnd} {cell['msgs_per_s'] or 0:>10,.0f} deliveries/s "
                  f"({cell['messages']:,} x {a.fanout_groups} groups in "
                  f"{cell['elapsed_s']:.2f} s; {per}) pop p50 {cell['p50_ms'] or 0:.1f} ms "
                  f"p99 {cell['p99_ms'] or 0:.1f} ms, errors {cell['errors']}", flush=True)
            await asyncio.sleep(a.pause)
        self.settle(force=True)
        for name, queue, ldir, seen in checks:
            await self.check_ledger(name, queue, list(seen), ledger_dir=ldir, seen=seen)

    def fanout_fill(self, queue: str, ldir: Path, rnd: int) -> tuple[int, float, dict[str, Any]]:
        """Closed-loop windows of ``--prefill-request``-item pushes (each item on its own
        partition of 100), through the ledger, until ``--fanout-messages`` are queued.
        Returns (messages stored in the queue, seconds, the ledger's totals)."""
        a = self.args
        server = self.servers["queen-mp"]
        queued, rate, k, t0 = 0, 0.0, 0, mono()  # rate: items/s of one connection
        while queued < a.fanout_messages:
            k += 1
            if k > 30:
                raise RuntimeError(f"fanout prefill of {queue}: {queued} queued after 30 windows")
            left = a.fanout_messages - queued
            # A short first window measures the rate; then as many connections as requests
            # are left, for as long as what is left minus the requests still in flight at the
            # window's end takes (each connection finishes its last request after it).
            conns = max(1, min(a.prefill_connections, -(-left // a.prefill_request)))
            duration = (0.25 if not rate else
                        min(20.0, max(0.1, (left - conns * a.prefill_request) / (rate * conns))))
            run = LoadRun(LoadSpec(url=server.url, connections=conns, procs=1,
                                   items=a.prefill_request, duration=duration, partitions=100,
                                   spread="item", queue=queue,
                                   tag=f"{self.run_id[:4]}f{rnd}k{k}", ledger_dir=str(ldir)),
                           start_delay=1.0)
            self.load = run
            try:
                res = run.wait()
            finally:
                self.load = None
            got = res["items_queued_incl_late"]
            queued += got
            if res["items_queued"]:  # per connection, in-window items only
                rate = res["items_queued"] / duration / conns
        totals = ledgers.load_push_ledger(str(ldir)).totals()
        stored = ledgers.check_offsets(self.dbs["queen-mp"], queue)["messages"]
        return max(stored, totals["queued"]), mono() - t0, totals

    async def fanout_cell(self, rnd: int) -> tuple[dict[str, Any], Any]:
        a = self.args
        arm = self.arm("queen-mp")
        queue = f"fo-{self.run_id}-r{rnd}"
        ldir = self.ledger_root / f"fanout-r{rnd}"
        n, fill_s, totals = await asyncio.to_thread(self.fanout_fill, queue, ldir, rnd)
        await asyncio.sleep(a.pause)
        groups = [f"fanout-{i}" for i in range(1, a.fanout_groups + 1)]
        seen = {g: Deliveries(g) for g in groups}
        stats = {g: cons.OpStats() for g in groups}
        t_done: dict[str, float] = {}
        all_done = asyncio.Event()

        def on_ack(g: str) -> Any:
            def hook(ok: int) -> None:
                if g not in t_done and seen[g].acked >= n:
                    t_done[g] = mono()
                    if len(t_done) == len(groups):
                        all_done.set()
            return hook

        https = {g: [cons.Http(arm.url) for _ in range(a.fanout_consumers)] for g in groups}
        tasks: list[asyncio.Task[Any]] = []
        capped = False
        try:
            for hs in https.values():
                for h in hs:
                    await h.connect()
            meter = Meter(self, "queen-mp")
            cpu0 = _rusage_s()
            t0 = mono()
            tasks = [asyncio.create_task(cons.consumer_loop(
                arm, h, queue, a.fanout_batch, a.fanout_pop_partitions, g, stats[g],
                seen[g].callback(on_ack=on_ack(g)), a.poll_ms / 1000, wait_ms=1000))
                for g in groups for h in https[g]]
            try:
                await asyncio.wait_for(all_done.wait(), a.drain_cap)
            except TimeoutError:
                capped = True
            t_end = mono()
            cpu1 = _rusage_s()
            meter.stop()
        finally:
            # Every group has acked everything (or the cap): the consumers are parked on a
            # queue nobody pushes to, so cancelling them leaves nothing leased.
            await cons.cancel_all(tasks)
            for hs in https.values():
                for h in hs:
                    h.close()
        for t in tasks:
            ex = None if t.cancelled() else t.exception()
            if ex is not None:
                raise RuntimeError(f"consumer loop failed: {type(ex).__name__}: {ex}") from ex
        elapsed = t_end - t0
        reps = {g: stats[g].report() for g in groups}
        acked = sum(seen[g].acked for g in groups)
        lat = cons.lat_ms([x for g in groups for x in stats[g].pop_lat])
        cell: dict[str, Any] = {
            "section": "fanout", "variant": f"{len(groups)} groups", "arm": "queen-mp",
            "round": rnd, "queue": queue, "messages": n, "groups": len(groups),
            "consumers_per_group": a.fanout_consumers, "msgs": acked,
            "msgs_per_s": acked / elapsed if elapsed > 0 else None,
            "elapsed_s": round(elapsed, 3), "drained": not capped,
            "group_elapsed_s": {g: round(t_done[g] - t0, 3) if g in t_done else None
                                for g in groups},
            "group_acked": {g: seen[g].acked for g in groups},
            "p50_ms": lat["p50"], "p99_ms": lat["p99"],
            "errors": sum(sum(r["errors"].values()) + r["ack_failed_items"]
                          for r in reps.values()),
            "prefill_s": round(fill_s, 3), "prefill_ledger": totals,
        }
        cell.update(meter.figures(cpu1 - cpu0, acked))
        cell["raw"] = {"consumers": reps}
        for d in seen.values():
            d.compact()
        # Consumers cancelled in a long poll: the broker ends those polls within 1 s; the
        # ledger's drain (end of the section) must not meet one of them.
        await asyncio.sleep(1.2)
        return cell, (f"fanout r{rnd}", queue, ldir, seen)

    # -------------------------------------------------------------- e2e
    async def run_e2e_all(self) -> None:
        a = self.args
        print(f"[{self.clock()}] e2e: {a.e2e_rate * a.e2e_items:g} msgs/s "
              f"({a.e2e_rate:g} pushes/s x {a.e2e_items})", flush=True)
        for rnd in range(1, a.e2e_rounds + 1):
            for arm in ("queen-mp", "naive", "pgmq"):
                if arm not in a.arms:
                    continue
                self.at(f"e2e r{rnd}")
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
                            "behind": r["pushes_behind_schedule"],
                            "breakdown": r.get("breakdown"), "pg_waits": r.get("pg_waits")}
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
                if cell.get("breakdown"):
                    b = cell["breakdown"]
                    print(f"    where it went (ms), all: {b['all_ms']}\n"
                          f"    slowest 1%: {b['slowest_1pct_ms']}\n"
                          f"    consumer pop {b['pop_ms']}, ack {b['ack_ms']}", flush=True)
                if cell.get("pg_waits"):
                    print("    PostgreSQL, share of active-backend samples: " + ", ".join(
                        f"{w['role']} {w['statement']} {w['wait']} {w['share']:.0%}"
                        for w in cell["pg_waits"]["top"][:8]), flush=True)
                await asyncio.sleep(a.pause)
        self.settle(force=True)

    # -------------------------------------------------------------- wake
    async def run_wake_cell(self) -> None:
        print(f"[{self.clock()}] wake: {self.args.parked} parked pops", flush=True)
        self.at(f"wake ({self.args.parked} parked)")
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
    async def check_ledger(self, name: str, queue: str, groups: list[str], *,
                           ledger_dir: Path | None = None,
                           seen: dict[str, Deliveries] | None = None) -> None:
        """Drains ``queue`` for ``groups`` and checks them against the push ledger in
        ``ledger_dir`` (default: the ledger root's ``name``). ``seen``: what the measured
        consumers of those groups already consumed (``Deliveries``), merged with the drain."""
        print(f"[{self.clock()}] ledger {name}: draining {queue} for {groups}", flush=True)
        url = self.servers["queen-mp"].url
        try:
            pushed = ledgers.load_push_ledger(str(ledger_dir or self.ledger_root / name))
            consumed = await ledgers.drain(url, queue, groups)
            if seen:
                consumed = {g: seen[g].consumed(c) if g in seen else c
                            for g, c in consumed.items()}
            verdict = ledgers.check(pushed, consumed)
            verdict["offsets"] = ledgers.check_offsets(self.dbs["queen-mp"], queue,
                                                       pushed=pushed)
        except Exception as ex:  # a check that could not run must not pass
            verdict = {"ok": False, "verdict": f"CHECK DID NOT RUN: {type(ex).__name__}: {ex}",
                       "groups": {}, "offsets": {"ok": False, "verdict": "not checked"}}
            print(f"  ledger {name}: {verdict['verdict']}", flush=True)
            self.ledger[name] = verdict
            return
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
        if "mixed" in a.sections:
            await self.run_mixed()
        if "fanout" in a.sections and "queen-mp" in a.arms:
            await self.run_fanout()
        if "e2e" in a.sections:
            await self.run_e2e_all()
        if "wake" in a.sections and "queen-mp" in a.arms:
            await self.run_wake_cell()
        if "partitions" in a.sections and "queen-mp" in a.arms:
            await asyncio.to_thread(self.run_partitions)
        if "ephemeral" in a.sections and "queen-mp" in a.arms:
            await asyncio.to_thread(self.run_ephemeral)
        if "streams" in a.sections and "queen-mp" in a.arms:
            await asyncio.to_thread(self.run_streams)
        print(f"[{self.clock()}] done", flush=True)

    # -------------------------------------------------------------- ephemeral
    def run_ephemeral(self) -> None:
        """bench/ephemeral.py on a broker and a database of its own: push and pop/ack msgs/s
        of ephemeral queues beside durable ones, in the same run (issue 27 item 4). Rows of
        section ``ephemeral``, arms ``queen-mp`` (durable) and ``queen-mp-ephemeral``."""
        a = self.args
        print(f"[{self.clock()}] ephemeral: push and pop/ack, durable and ephemeral queues",
              flush=True)
        cells = ephemeral.run(ephemeral.parse_args(
            ["--server-dsn", a.server_dsn, *(["--quick"] if a.quick else [])]))
        for c in cells:
            who = f", {c.connections} consumer{'' if c.connections == 1 else 's'}" if (
                c.op == "pop/ack") else ""
            self.record({"section": "ephemeral", "variant": f"{c.op}, batch {c.batch}{who}",
                         "arm": "queen-mp" if c.kind == "durable" else "queen-mp-ephemeral",
                         "round": 1, "msgs": c.msgs, "msgs_per_s": c.msgs_per_s,
                         "p50_ms": c.p50_ms, "p99_ms": c.p99_ms,
                         "wal_bytes_per_msg": c.wal_bytes_per_msg, "errors": c.errors,
                         "cpu_broker_us_per_msg": c.cpu_broker_us_per_msg,
                         "cpu_pg_us_per_msg": c.cpu_pg_us_per_msg,
                         "cpu_client_us_per_msg": c.cpu_client_us_per_msg})
        print(ephemeral.render(cells), flush=True)

    # -------------------------------------------------------------- streams
    def run_streams(self) -> None:
        """bench/streams.py on a broker and a database of its own: a tumbling-window count
        through the published client's Stream DSL (issue 27). One row of section ``streams``:
        msgs/s = events/s, p50/p99 = the ``/streams/v1/cycle`` calls, CPU per event by role.
        A run whose window counts do not add up to the events pushed fails the suite."""
        a = self.args
        print(f"[{self.clock()}] streams: tumbling-window count through the Stream DSL",
              flush=True)
        f = streams.run_in_child(["--server-dsn", a.server_dsn, *(["--quick"] if a.quick else [])])
        self.record({"section": "streams",
                     "variant": f"tumbling count, {f.events:,} events, batch {f.batch_size}",
                     "arm": "queen-mp", "round": 1, "msgs": f.events,
                     "msgs_per_s": f.events_per_s, "requests_per_s": f.cycles / f.seconds,
                     "p50_ms": f.cycle_p50_ms, "p99_ms": f.cycle_p99_ms,
                     "max_ms": f.cycle_max_ms, "errors": f.errors,
                     "missing": f.events - f.counted,
                     "cpu_broker_us_per_msg": f.cpu_broker_us_per_event,
                     "cpu_pg_us_per_msg": f.cpu_pg_us_per_event,
                     "cpu_client_us_per_msg": f.cpu_client_us_per_event})
        print(streams.render(f), flush=True)
        if not f.ok:
            raise RuntimeError(f"streams: the windows counted {f.counted:,} of {f.events:,} "
                               f"events ({f.errors} runner errors)")

    # -------------------------------------------------------------- partitions
    def run_partitions(self) -> None:
        """bench/partitions.py on a broker and a database of its own (issue 26's scale
        targets); its figures become rows of section ``partitions``."""
        a = self.args
        print(f"[{self.clock()}] partitions: pop cost against partition count", flush=True)
        f = partitions.run(partitions.parse_args(
            ["--server-dsn", a.server_dsn, *(["--quick"] if a.quick else [])]))
        self.partitions = f
        for pop in (f.small, f.large):
            self.record({"section": "partitions", "variant": f"pop, {pop.partitions:,} partitions",
                         "arm": "queen-mp", "round": 1, "msgs": pop.pops,
                         "p50_ms": pop.p50_ms, "p99_ms": pop.p99_ms,
                         "cpu_broker_us_per_msg": pop.broker_cpu_us_per_pop,
                         "cpu_pg_us_per_msg": pop.pg_cpu_us_per_pop})
        self.record({"section": "partitions", "variant": f"drain {f.drain_partitions:,} partitions",
                     "arm": "queen-mp", "round": 1, "msgs": f.drain_pops,
                     "msgs_per_s": f.drain_pops / f.drain_s,
                     "p50_ms": f.drain_s / f.drain_pops * 1e3,
                     "cpu_broker_us_per_msg": f.drain_cpu.front_us + f.drain_cpu.shard_us,
                     "cpu_pg_us_per_msg": f.drain_cpu.pg_us,
                     "cpu_client_us_per_msg": f.drain_cpu.client_us})
        self.record({"section": "partitions",
                     "variant": f"first group pop, {f.drain_partitions:,} partitions",
                     "arm": "queen-mp", "round": 1, "msgs": f.first_group_claimed,
                     "p50_ms": f.first_group_pop_ms})
        for label, pop in (("leased pop + ack, no live lease", f.unleased),
                           (f"leased pop + ack, {f.live_leases:,} live leases", f.leased)):
            self.record({"section": "partitions", "variant": label, "arm": "queen-mp",
                         "round": 1, "msgs": pop.pops, "p50_ms": pop.p50_ms,
                         "p99_ms": pop.p99_ms,
                         "cpu_broker_us_per_msg": pop.broker_cpu_us_per_pop,
                         "cpu_pg_us_per_msg": pop.pg_cpu_us_per_pop})
        for target, value, _, met in f.verdicts():
            print(f"  {target}: {value} ({'met' if met else 'missed'})", flush=True)
        drain = (f"autovacuum during the drain: {f.autovacuum_seen}; snapshots held"
                 f" meanwhile: {f.snapshots_seen}; ready-index entries read a pop:"
                 f" {f.drain_ready_reads:,.1f}; PostgreSQL's own processes (WAL writer,"
                 f" checkpointer, ...) {f.drain_cpu.pg_shared_us:,.0f} us a pop;"
                 f" {f.slow_pops_seen}")
        print(f"  {drain}", flush=True)
        self.notes.append(f"partitions: {drain}")


# ------------------------------------------------------------------------------ summary
FIGURES = ("msgs_per_s", "pushed_per_s", "backlog_end", "requests_per_s", "p50_ms", "p99_ms",
           "p999_ms", "commits_per_s", "msgs_per_commit", "wal_bytes_per_s",
           "wal_bytes_per_msg", "segs_per_commit", "read_backs_per_seg",
           "sql_probes_per_seg",
           "cpu_broker_s", "cpu_pg_db_s", "cpu_pg_all_s", "cpu_client_s", "cpu_other_s",
           "cpu_us_per_msg", "cpu_broker_us_per_msg", "cpu_shard_us_per_msg",
           "cpu_pg_us_per_msg", "cpu_client_us_per_msg",
           "busy_pct", "rss_peak_mb", "pss_peak_mb", "errors", "missing", "max_ms")
RATIO_FIGURES = ("msgs_per_s", "p50_ms", "p99_ms", "cpu_broker_s", "cpu_us_per_msg",
                 "commits_per_s", "wal_bytes_per_msg")


def push_arms(arms: list[str], batch: int, largest: int, qpb1_batches: list[int],
              peer_batches: list[int], skip: set[str] | frozenset[str] = frozenset()
              ) -> list[str]:
    """The arms of a push batch size, in ``--arms`` order: queen-mp-qpb1 only at
    ``--qpb1-batches``, the peers only at ``--peer-batches`` (and not when skipped), the
    physical limit last and only at the largest batch size."""
    out = [x for x in arms if x != "physical" and x not in skip
           and (x != "queen-mp-qpb1" or batch in qpb1_batches)
           and (x not in PEERS or batch in peer_batches)]
    if batch == largest and "physical" in arms:
        out.append("physical")
    return out


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
    return {"rows": rows, "ratios": ratios(rows), "targets": targets(rows, suite)}


# The edge arm keeps nothing: a ratio to its commits or WAL would divide by (nearly) zero.
_NO_EDGE_RATIO = ("commits_per_s", "wal_bytes_per_msg")


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each queen-mp arm's medians over those of every other arm of its section and variant
    (and of the physical push row, for every push batch size)."""
    out = []
    for r in rows:
        if not r["arm"].startswith("queen-mp"):
            continue
        for o in rows:
            same = (o["section"], o["variant"]) == (r["section"], r["variant"])
            # the physical limit is one figure for every push batch size
            physical = o["arm"] == "physical" and r["section"] == "push"
            if o["arm"].startswith("queen-mp") or not (same or physical):
                continue
            out.append({"section": r["section"], "variant": r["variant"], "arm": r["arm"],
                        "vs": o["arm"], "vs_variant": o["variant"],
                        **{f: (r[f] / o[f] if isinstance(r.get(f), (int, float))
                               and isinstance(o.get(f), (int, float)) and o[f]
                               and not (o["arm"] == "edge" and f in _NO_EDGE_RATIO) else None)
                           for f in RATIO_FIGURES}})
    return out


def _row(rows: list[dict[str, Any]], section: str, variant: str, arm: str) -> dict[str, Any]:
    for r in rows:
        if (r["section"], r["variant"], r["arm"]) == (section, variant, arm):
            return r
    return {}


# (target, section, variant, peer arm, threshold): issue 26's comparisons with the brokers a user
# would pick instead. Each of the three workloads >= 1x RabbitMQ quorum with confirms; 100-item
# pushes and consume >= 1x NATS JetStream (which acknowledges before fsync by default: the
# report says so, and nats-fsync measures it with an fsync per write where it can run).
PEER_TARGETS: tuple[tuple[str, str, str, str, float | None], ...] = (
    ("push 1-item JSON vs rabbitmq-quorum (x)", "push", "batch 1", "rabbitmq-quorum", 1.0),
    ("push 100-item JSON vs rabbitmq-quorum (x)", "push", "batch 100", "rabbitmq-quorum", 1.0),
    ("consume batch 100 vs rabbitmq-quorum (x)", "consume", "", "rabbitmq-quorum", 1.0),
    ("push 100-item JSON vs nats (x)", "push", "batch 100", "nats", 1.0),
    ("consume batch 100 vs nats (x)", "consume", "", "nats", 1.0),
    ("push 100-item JSON vs nats-fsync (x)", "push", "batch 100", "nats-fsync", 1.0),
    ("consume batch 100 vs nats-fsync (x)", "consume", "", "nats-fsync", 1.0),
)


def targets(rows: list[dict[str, Any]], suite: Suite) -> list[dict[str, Any]]:
    """The issue's targets, each computed from this run's medians."""
    def ratio(a: dict[str, Any], b: dict[str, Any], f: str = "msgs_per_s") -> float | None:
        return a[f] / b[f] if a.get(f) and b.get(f) else None

    q1, n1 = _row(rows, "push", "batch 1", "queen-mp"), _row(rows, "push", "batch 1", "naive")
    m1 = _row(rows, "push", "batch 1", "pgmq")
    q100 = _row(rows, "push", "batch 100", "queen-mp")
    m100 = _row(rows, "push", "batch 100", "pgmq")
    b1000 = _row(rows, "push", "batch 1000", "queen-mp-qpb1")
    phys = _row(rows, "push", "batch 1000", "physical")
    cq = _row(rows, "consume", f"batch {suite.args.consume_batch}", "queen-mp")
    cm = _row(rows, "consume", f"batch {suite.args.consume_batch}", "pgmq")
    e1, e100 = (_row(rows, "push", f"batch {b}", "edge") for b in (1, 100))
    ce = _row(rows, "consume", f"batch {suite.args.consume_batch}", "edge")
    e2e = next((r for r in rows if r["section"] == "e2e" and r["arm"] == "queen-mp"), {})
    wake = next((r for r in rows if r["section"] == "wake"), {})
    # (name, value, threshold, op, the edge arm's value of the same ratio: its ceiling).
    # Issue 26's targets (they replace issue 8's).
    out = [
        ("push 1-item JSON vs naive (x)", ratio(q1, n1), 2.0, ">=", ratio(e1, n1)),
        ("push 1-item JSON vs pgmq send (x)", ratio(q1, m1), 1.5, ">=", ratio(e1, m1)),
        ("push 1-item segments per commit", q1.get("segs_per_commit"), 8.0, ">=", None),
        ("push 100-item JSON vs pgmq send_batch 100 (x)", ratio(q100, m100), 1.5, ">=",
         ratio(e100, m100)),
        ("push 1000-item QPB1 vs physical limit (x)", ratio(b1000, phys), 0.8, ">=", None),
        ("consume batch 100 vs pgmq read+delete (x)", ratio(cq, cm), 1.0, ">=", ratio(ce, cm)),
        ("e2e p99 at 1,000 msg/s (ms)", e2e.get("p99_ms"), 10.0, "<", None),
        ("parked-pop wake p99, 1,000 parked (ms)", wake.get("p99_ms"), 20.0, "<", None),
        ("peak PSS of all broker processes (MB)", suite.pss_peak or None, 150.0, "<", None),
    ]
    consume = f"batch {suite.args.consume_batch}"
    for label, section, variant, peer, threshold in PEER_TARGETS:
        variant = consume if section == "consume" else variant
        q, p = _row(rows, section, variant, "queen-mp"), _row(rows, section, variant, peer)
        out.append((label, ratio(q, p), threshold, ">=",
                    ratio(_row(rows, section, variant, "edge"), p)))
    # Issue 26: a pop costs the same whatever its queue's partition count (bench/partitions.py)
    f: partitions.Figures | None = getattr(suite, "partitions", None)
    out += [
        (f"pop p50, {f.large.partitions:,} vs {f.small.partitions} partitions (x)" if f else
         "pop p50, 50,000 vs 10 partitions (x)",
         f.large.p50_ms / f.small.p50_ms if f else None, 1.5, "<", None),
        (f"drain {f.drain_partitions:,} one-message partitions (s)" if f else
         "drain 5,000 one-message partitions (s)", f.drain_s if f else None, 10.0, "<", None),
        ("a new group's first pop on them (ms)", f.first_group_pop_ms if f else None, 100.0,
         "<", None),
    ]
    res = []
    for name, value, threshold, op, ceiling in out:
        met = None if value is None or threshold is None else (
            value >= threshold if op == ">=" else value < threshold)
        res.append({"target": name, "value": value, "threshold": threshold, "op": op,
                    "met": met, "edge_ceiling": ceiling})
    return res


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, short windows")
    ap.add_argument("--sections", default=",".join(SECTIONS))
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
    ap.add_argument("--mixed-consumers", default=None,
                    help="consumer counts of the mixed section (1,4,16; --quick: 1,16)")
    ap.add_argument("--mixed-connections", type=int, default=16,
                    help="push connections of the mixed section (16)")
    ap.add_argument("--mixed-items", type=int, default=10, help="items per push, mixed (10)")
    ap.add_argument("--mixed-batch", type=int, default=100, help="pop batch, mixed (100)")
    ap.add_argument("--mixed-pop-partitions", type=int, default=10,
                    help="queen-mp pop 'partitions', mixed (10)")
    ap.add_argument("--fanout-groups", type=int, default=4)
    ap.add_argument("--fanout-consumers", type=int, default=2, help="consumers per group (2)")
    ap.add_argument("--fanout-messages", type=int, default=None,
                    help="messages pre-filled for the fanout section (40000; --quick: 10000)")
    ap.add_argument("--fanout-batch", type=int, default=100, help="pop batch, fanout (100)")
    ap.add_argument("--fanout-pop-partitions", type=int, default=10,
                    help="queen-mp pop 'partitions', fanout (10)")
    ap.add_argument("--peer-batches", default=",".join(map(str, PEER_BATCHES)),
                    help="push batch sizes of the peer arms (1,100; others are skipped)")
    ap.add_argument("--rabbitmq-url", default=DEFAULT_RABBITMQ_URL,
                    help="RabbitMQ of the rabbitmq-* arms (amqp://guest:guest@127.0.0.1:5672/)")
    ap.add_argument("--nats-url", default=DEFAULT_NATS_URL,
                    help="NATS JetStream of the nats arm (nats://127.0.0.1:4222)")
    ap.add_argument("--nats-server", default=DEFAULT_NATS_SERVER,
                    help="nats-server binary of the nats-fsync arm's private server "
                         "(the venv's, from the bench extra, else /usr/sbin/nats-server; "
                         "sync_interval: always needs 2.10 or later)")
    ap.add_argument("--embedded", action=argparse.BooleanOptionalAction, default=True,
                    help="run every arm on a private PostgreSQL cluster started for the run "
                         "(default; --no-embedded uses --server-dsn)")
    ap.add_argument("--docs", type=Path, default=None,
                    help="write the report here (docs/benchmarks.md for the published run)")
    a, rest = ap.parse_known_args(argv)
    # bench/consume.py's knobs (servers, e2e, wake) with the suite's defaults.
    # queen-mp runs with the product defaults of config.py for its 2 front workers: one shard.
    c = cons.parse_args(["--shards", str(Config.load(env={}).v2_fusion_shards),
                         "--e2e-rate", "100", "--e2e-items", "10", "--e2e-duration", "10",
                         "--e2e-rounds", "3", "--e2e-batch", "100", "--arms",
                         "queen-mp,baseline", *rest])
    for k, v in vars(c).items():
        if k not in ("quick", "sections", "arms", "batches", "messages"):
            setattr(a, k, v)
    a.batches = [int(x) for x in a.batches.split(",") if x]
    a.qpb1_batches = [int(x) for x in a.qpb1_batches.split(",") if x]
    a.peer_batches = [int(x) for x in a.peer_batches.split(",") if x]
    a.sections = [x for x in a.sections.split(",") if x]
    a.arms = [x for x in a.arms.split(",") if x]
    for x in a.sections:
        if x not in SECTIONS:
            ap.error(f"unknown section {x!r} (sections: {', '.join(SECTIONS)})")
    for x in a.arms:
        if x not in PUSH_ARMS:
            ap.error(f"unknown arm {x!r} (arms: {', '.join(PUSH_ARMS)})")
    if a.quick:
        a.rounds, a.duration, a.e2e_rounds, a.e2e_duration = 1, 4.0, 1, 4.0
        a.consume_messages, a.wakes, a.burst_duration, a.pause = 15000, 100, 2.0, 1.0
    a.mixed_consumers = [int(x) for x in (a.mixed_consumers or (
        "1,16" if a.quick else "1,4,16")).split(",") if x]
    if a.fanout_messages is None:
        a.fanout_messages = 10000 if a.quick else 40000
    a.tp_partitions = 100
    a.pop_partitions = {a.consume_batch: 1}
    a.messages = {a.consume_batch: a.consume_messages}
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    suite = Suite(args)
    started = dt.datetime.now(dt.UTC)
    t0 = mono()

    def work() -> None:
        suite.setup()
        asyncio.run(suite.run_all())

    def clean() -> dict[str, Any]:
        if suite.peers is not None:  # before the scratch dir goes: the private server's
            suite.notes.extend(suite.peers.cleanup())
        logs = cons.cleanup(suite)
        if suite.pg is not None:
            with contextlib.suppress(Exception):
                suite.pg.stop()
            if suite.pg_dir is not None:
                shutil.rmtree(suite.pg_dir, ignore_errors=True)
        return logs

    status, failure, logs = guarded(work, clean)
    if suite.pss_peak_window is not None:
        suite.notes.append(
            f"peak PSS of the broker, {suite.pss_peak} MB, set in {suite.pss_peak_window}: "
            + ", ".join(f"{k} {v} MB" for k, v in suite.pss_peak_procs.items())
            + ("" if suite.pss_peak_filter_entries is None else
               f"; the shards' dedup filters held {suite.pss_peak_filter_entries:,.0f} "
               "entries at the window's end"))
    summary = summarize(suite)
    ledger_ok = all(v["ok"] and v["offsets"].get("ok", False) for v in suite.ledger.values())
    doc = {
        "benchmark": "suite", "status": status, "failure": failure, "run_id": suite.run_id,
        "command": " ".join(["python -m bench.suite", *(argv if argv is not None
                                                         else sys.argv[1:])]),
        "started_at": started.isoformat(), "elapsed_s": round(mono() - t0, 1),
        "machine": suite.info, "pgmq_sql_version": suite.pgmq_version,
        "peers": suite.peers.doc() if suite.peers is not None else {},
        "settings": {k: (str(v) if isinstance(v, Path) else redact(v) if k.endswith("_url")
                         else v) for k, v in vars(args).items()},
        "idle_commits_per_s": suite.idle_commits,
        "summary": summary, "cells": suite.cells, "ledger": suite.ledger,
        "ledger_ok": ledger_ok, "rss_peak_mb": suite.rss_peak, "pss_peak_mb": suite.pss_peak,
        "pss_peak_window": suite.pss_peak_window, "pss_peak_procs_mb": suite.pss_peak_procs,
        "pss_peak_filter_entries": suite.pss_peak_filter_entries,
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
    if args.docs is not None and status == "ok" and (ledger_ok or not suite.ledger):
        report.write_docs(doc, args.docs)
        print(f"report: {args.docs}")
    elif args.docs is not None:
        print(f"{args.docs} left as it was: this run did not complete cleanly")
    print(f"results: {out} ({mono() - t0:.0f} s)")
    if suite.ledger and not ledger_ok:
        print("\n!!! ZERO-LOSS LEDGER FAILED: see 'ledger' in the results !!!", file=sys.stderr)
        return 3
    return 0 if status == "ok" else (130 if status == "interrupted" else 1)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
