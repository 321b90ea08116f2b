"""The push bundle in SQL alone: PostgreSQL's work per message of ``log_push_multi``, no broker.

``bench/push.py`` measures the route, where the client, the broker and PostgreSQL share the
two cores. This one sends the shard's bundle statement (``queen_mp.db.bundles``: the same
prepared text, the same binary array parameters, the same text result, decoded by the same
``_verdicts``) over one autocommit connection, one call after the other, and reads the CPU time
of that connection's backend from ``/proc`` (so the server must run on this machine). With
``--callgrind`` the server runs under ``valgrind --tool=callgrind`` and the figure is the
backend's instruction count per call, zeroed before and dumped after each shape
(``callgrind_control``), which other processes on the machine cannot disturb.

Shapes (``--shapes``, default ``20x1,1x1,10x100``): ``SxM`` = bundles of S segments of M
messages each, over S distinct partitions of one queue of ``--partitions`` (1,000) partitions,
taken in turn, as the shard fuses them: 1-item pushes from many publishers (20x1), a lone
1-item push (1x1), 100-item pushes (10x100). Every segment passes ``p_verified`` = the last
offset this driver wrote to its partition, as the shard's dedup filter does in steady state (no
dedup probe); the queue keeps its default dedup window. Each partition is named by the id its
last verdict gave, as the shard's fusion caches them (``--names``: by name alone).

``--history NxM`` first stores N hashes in every partition, in segments of M, and then every
measured segment passes ``p_verified`` = 0, as a push to a partition the shard's dedup filter
no longer holds (past ``QUEEN_DEDUP_FILTER_ENTRIES``): the procedure probes the partition's
whole window (docs/scaling.md), so give it a few ``--partitions``.

``PYTHONPATH=TREE python bench/pushsql.py --dsn DSN`` measures TREE's function and call (it
migrates a fresh database with TREE's migrations): run it with a base tree and a head tree in
turn to compare them.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
import uuid
from dataclasses import dataclass

import psycopg
import zstandard
from psycopg import pq

from queen_mp.db import bundles
from queen_mp.db.migrations import apply_migrations
from queen_mp.db.prepared import first_value

_TENANT = uuid.UUID(int=0).bytes
_QUEUE = "pushsql"
_MSG = b'{"producer": 1, "seq": %d, "pad": "' + b"x" * 160 + b'"}'


@dataclass(frozen=True)
class Shape:
    segments: int
    messages: int  # per segment

    @property
    def name(self) -> str:
        return f"{self.segments}x{self.messages}"


@dataclass(frozen=True)
class Row:
    shape: str
    calls: int
    msgs: int
    cpu_us_per_msg: float
    cpu_us_per_segment: float
    instr_per_call: float | None  # callgrind only
    instr_per_segment: float | None
    instr_per_msg: float | None


def parse_shape(text: str) -> Shape:
    s, m = text.split("x")
    return Shape(int(s), int(m))


def _blob(n: int, seq: int) -> bytes:
    """A zstd payload of ``n`` messages, as a chunk of the wire carries them (roughly)."""
    return zstandard.ZstdCompressor(level=1).compress(
        b"".join(_MSG % (seq + k) for k in range(n)))


class Driver:
    """One autocommit connection with the shard's prepared bundle statement."""

    def __init__(self, dsn: str, partitions: int, names: bool = False) -> None:
        self.dsn = dsn
        self.connect()
        self.partitions = [f"p{i}" for i in range(partitions)]
        self.last = [0] * partitions  # offsets this driver wrote: the dedup filter's promise
        self.pids = [0] * partitions  # ids the verdicts gave (0: by name), as fusion caches
        self.names = names
        self.forgotten = False  # p_verified 0: every segment probes its whole window
        self.next = 0  # the next partition to take
        self.seq = 0

    def connect(self) -> None:
        """A new connection (backend), the bundle statement prepared on it."""
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        self.pid = int(row[0])
        res = self.conn.pgconn.prepare(bundles._PUSH.name, bundles._PUSH.sql)
        assert res.status == pq.ExecStatus.COMMAND_OK, res.error_message

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    def bundle(self, shape: Shape) -> tuple[list[int], bundles.PushBundle]:
        """The next bundle of ``shape``: its partition indexes and its segments (``verified``
        is filled in by ``call``)."""
        n = len(self.partitions)
        idx = [(self.next + k) % n for k in range(shape.segments)]
        self.next = (self.next + shape.segments) % n
        blobs = []
        for _ in idx:
            blobs.append(_blob(shape.messages, self.seq))
            self.seq += shape.messages
        return idx, bundles.PushBundle(
            queues=[_QUEUE] * len(idx), partitions=[self.partitions[i] for i in idx],
            counts=[shape.messages] * len(idx),
            hashes=[os.urandom(16 * shape.messages) for _ in idx],
            verified=[], blobs=blobs, tenants=[_TENANT] * len(idx),
            pids=[] if self.names else [self.pids[i] for i in idx])

    def call(self, idx: list[int], bundle: bundles.PushBundle) -> None:
        """One bundle, each segment promising what this driver wrote before it."""
        verified = [0] * len(idx) if self.forgotten else [self.last[i] for i in idx]
        params = bundles.bundle_params(bundle._replace(verified=verified))
        pgconn = self.conn.pgconn
        bundles._PUSH.send(self.conn, params)  # as the shard sends it (result format too)
        results = []
        while (res := pgconn.get_result()) is not None:
            results.append(res)
        verdicts = bundles._verdicts(first_value(results, pgconn), len(idx))
        for i, count, v in zip(idx, bundle.counts, verdicts, strict=True):
            assert v.queued and v.base_offset is not None, v
            self.last[i] = v.base_offset + count - 1
            self.pids[i] = v.partition_id


def _exit_total(pattern: str) -> int:
    """The instruction total callgrind wrote when the backend of ``pattern`` exited."""
    for _ in range(300):
        for path in glob.glob(pattern):
            with open(path) as f:
                for line in f:
                    if line.startswith(("summary:", "totals:")):
                        return int(line.split()[1])
        time.sleep(0.1)
    raise RuntimeError(f"no callgrind totals in {pattern}")


def _timed(driver: Driver, shape: Shape, calls: int) -> float:
    work = [driver.bundle(shape) for _ in range(calls)]
    c0 = driver.cpu_s()
    for idx, bundle in work:
        driver.call(idx, bundle)
    return driver.cpu_s() - c0


def _backend_instr(driver: Driver, shape: Shape, warmup: int, calls: int,
                   pattern: str) -> int:
    """Instructions of a fresh backend's whole life: connect, ``warmup`` + ``calls`` calls,
    exit (callgrind writes its file at exit)."""
    driver.connect()
    pid = driver.pid
    _timed(driver, shape, warmup + calls)
    driver.conn.close()
    return _exit_total(pattern.format(pid=pid))


def run(driver: Driver, shape: Shape, calls: int, warmup: int, cg_pattern: str | None) -> Row:
    """CPU of ``calls`` calls after ``warmup``; with callgrind, instructions per call as the
    difference between a backend that made ``warmup`` + ``calls`` calls and one that made
    ``warmup`` (no client-side control of the server's valgrind needed)."""
    msgs = calls * shape.segments * shape.messages
    segs = calls * shape.segments
    if cg_pattern is None:
        _timed(driver, shape, warmup)
        cpu = _timed(driver, shape, calls)
        return Row(shape.name, calls, msgs, cpu * 1e6 / msgs, cpu * 1e6 / segs,
                   None, None, None)
    short = _backend_instr(driver, shape, warmup, 0, cg_pattern)
    long = _backend_instr(driver, shape, warmup, calls, cg_pattern)
    instr = long - short
    driver.connect()
    return Row(shape.name, calls, msgs, float("nan"), float("nan"), instr / calls,
               instr / segs, instr / msgs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", required=True, help="a server on this machine (postgres db)")
    ap.add_argument("--shapes", default="20x1,1x1,10x100")
    ap.add_argument("--calls", type=int, default=500, help="measured calls per shape")
    ap.add_argument("--warmup", type=int, default=100, help="unmeasured calls per shape")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--callgrind", metavar="PATTERN", default=None,
                    help="the server runs under callgrind; its backends' --callgrind-out-file "
                         "with {pid} for the backend's pid, e.g. '/tmp/cg/cg.{pid}'")
    ap.add_argument("--keep", action="store_true", help="keep the database")
    ap.add_argument("--history", type=parse_shape, default=None, metavar="NxM",
                    help="store N hashes a partition in M-item segments first, then measure "
                         "with p_verified 0 (a partition the dedup filter dropped)")
    ap.add_argument("--names", action="store_true",
                    help="name every partition (no cached ids), as before log_push_multi_v3")
    args = ap.parse_args(argv)
    name = f"queen_pushsql_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    dsn = psycopg.conninfo.make_conninfo(args.dsn, dbname=name)
    try:
        apply_migrations(dsn)
        driver = Driver(dsn, args.partitions, args.names)
        # provision every partition first (not measured)
        for _ in range(args.partitions // 20):
            driver.call(*driver.bundle(Shape(20, 1)))
        if args.history is not None:
            fill = Shape(min(20, args.partitions), args.history.messages)
            stored, per = args.history.segments, args.history.messages
            for _ in range(stored // per * args.partitions // fill.segments):
                driver.call(*driver.bundle(fill))
            driver.forgotten = True
        print(f"queen_mp from {bundles.__file__}")
        print("| shape | calls | msgs | cpu us/msg | cpu us/seg | instr/call | instr/seg "
              "| instr/msg |")
        print("|---|---|---|---|---|---|---|---|")
        for text in args.shapes.split(","):
            r = run(driver, parse_shape(text), args.calls, args.warmup, args.callgrind)
            ic = "-" if r.instr_per_call is None else f"{r.instr_per_call:,.0f}"
            iseg = "-" if r.instr_per_segment is None else f"{r.instr_per_segment:,.0f}"
            imsg = "-" if r.instr_per_msg is None else f"{r.instr_per_msg:,.0f}"
            print(f"| {r.shape} | {r.calls} | {r.msgs} | {r.cpu_us_per_msg:.2f} | "
                  f"{r.cpu_us_per_segment:.2f} | {ic} | {iseg} | {imsg} |", flush=True)
        driver.conn.close()
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
