"""Ephemeral queues in SQL alone: PostgreSQL CPU per message of push, pop and ack, no broker.

``bench/ephemeral.py`` measures the routes, where the broker, the HTTP client and the load of
the machine share the figures. This one calls ``queen.eph_push_v3``, ``eph_pop_v5`` and
``eph_ack_v5`` over one connection, one call after the other, and reads from ``/proc`` (so the
server must run on this machine) the CPU time of that connection's backend and of the whole
cluster (the backend, autovacuum, the writers): what a message costs PostgreSQL itself, the
figure the storage layout decides.

- ``push``: ``--messages`` (40,000; a quarter of it in pushes of 1) in pushes of 1 and of 100
  to 4 partitions, each kind to a fresh queue; ``push x4``: as many again in fused calls
  (``queen.eph_push_v5``, as a front worker's ``EphemeralPushFusion`` sends them), each of 4
  pushes, one per partition;
- ``pop+ack``: that queue popped in batches of ``--pop-batch`` (100), each batch acknowledged
  by one call, until empty; by one group, and for pushes of 100 also by two groups in turn,
  and by one group in batches of 70 (``--odd-batch``): a delivery that is not one push's
  messages, part of a chunk or runs of two, as a broker's pops of any other size make them.

``python -m bench.ephemeral_sql`` prints a Markdown table (CPU microseconds per message of the
backend and of the cluster, and wall microseconds) from a private PostgreSQL cluster
(``--server-dsn DSN``: a database on that server instead). With ``--callgrind`` it prints
instructions instead: a call of push, pop and ack, and a call of 1, 4 and 8 fused pushes of 1
message (``eph_push_v3`` alone for 1), one per partition, as a front worker sends the pushes
that reach it in one event loop turn.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass

import orjson
import psycopg

from bench.push import (
    cpu_ticks,
    create_database,
    db_name,
    delta_cpu_s,
    drop_database,
    ppid_of,
    private_server,
    process_tree,
)
from bench.pushsql import _exit_total
from queen_mp.db import ephemeral_procs
from queen_mp.db.binarrays import register_arrays
from queen_mp.db.migrations import apply_migrations
from queen_mp.front.ephemeral import render_messages
from queen_mp.models.ephemeral import parse_id

_TENANT = uuid.UUID(int=0)
_PAYLOAD = orjson.dumps({"producer": 1, "seq": 1, "pad": "x" * 160}).decode()


@dataclass(frozen=True)
class Row:
    op: str
    batch: int
    groups: int
    msgs: int
    cpu_us_per_msg: float  # the backend's
    cluster_us_per_msg: float  # every process of the cluster: the backend, autovacuum, ...
    wall_us_per_msg: float


class _Backend:
    """One autocommit connection and the CPU seconds its backend has used."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        register_arrays(self.conn)  # as the broker's pooled connections do
        row = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        self.pid = int(row[0])
        self.postmaster = ppid_of(self.pid)

    def cpu_s(self) -> float:
        """From schedstat: nanoseconds, where stat counts 10 ms ticks."""
        with open(f"/proc/{self.pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9

    def cluster(self) -> dict[int, int]:
        return cpu_ticks(process_tree(self.postmaster))

    # the parameters and results as queen_mp/db/ephemeral_procs.py passes them (binary arrays)
    def push(self, queue: str, partition: str, n: int) -> None:
        self.conn.execute(ephemeral_procs.PUSH_SQL, ephemeral_procs.push_params(
            _TENANT.bytes, queue, partition, [_PAYLOAD] * n))

    def push_fused(self, queue: str, partitions: list[str], n: int) -> None:
        """One push of ``n`` messages to each of ``partitions`` (sorted), in one call."""
        k = len(partitions)
        self.conn.execute(ephemeral_procs.PUSH_MANY_SQL, ephemeral_procs.push_many_params(
            [_TENANT.bytes] * k, [queue] * k, partitions, [[_PAYLOAD] * n] * k))

    def pop_ack(self, queue: str, group: str, batch: int, acker: _Backend | None = None
                ) -> int:
        """A pop of ``batch`` and the ack of what it got (on ``acker``'s connection if given);
        the messages moved."""
        row = self.conn.execute(ephemeral_procs.POP_SQL, (_TENANT, queue, None, group, batch,
                                                          False), binary=True).fetchone()
        assert row is not None
        got = ephemeral_procs.pop_outcome(row)
        if not got.claimed:
            return 0
        parts = [parse_id(m["id"]) for m in orjson.loads(render_messages(got))]
        ok = [p for p in parts if p is not None]
        n = len(ok)
        row = (acker or self).conn.execute(ephemeral_procs.ACK_SQL, ephemeral_procs.ack_params(
            _TENANT.bytes, queue, group, ["completed"] * n, [p[0] for p in ok],
            [str(p[1]) for p in ok], [str(p[2]) for p in ok]), binary=True).fetchone()
        assert row is not None
        out = ephemeral_procs.ack_outcome(row, n).outcomes
        assert out == ["acked"] * n, out
        return len(ok)


def _measure(b: _Backend, op: str, batch: int, groups: int, fn: object) -> Row:
    k0, c0, t0 = b.cluster(), b.cpu_s(), time.perf_counter()
    msgs = fn()  # type: ignore[operator]
    wall, cpu, cluster = time.perf_counter() - t0, b.cpu_s() - c0, delta_cpu_s(k0, b.cluster())
    return Row(op, batch, groups, msgs, cpu * 1e6 / msgs, cluster * 1e6 / msgs,
               wall * 1e6 / msgs)


def _cell(b: _Backend, batch: int, groups: int, messages: int, pop_batch: int) -> list[Row]:
    """A fresh queue: ``messages`` pushed in batches of ``batch``, then drained by ``groups``
    groups (registered before the first push, so each sees every message)."""
    queue = f"sql-{batch}-{groups}-{uuid.uuid4().hex[:6]}"
    b.conn.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)", (
        _TENANT, queue, '{"maxLength": 10000000, "maxBytes": 1073741824}'))
    names = [f"g{i}" for i in range(groups)]
    for g in names:
        b.pop_ack(queue, g, 1)
    per = messages // batch

    def push_all() -> int:
        for i in range(per):
            b.push(queue, f"p{i % 4}", batch)
        return per * batch

    def drain() -> int:
        done = 0
        for g in names:
            while got := b.pop_ack(queue, g, pop_batch):
                done += got
        return done

    def push_fused() -> int:
        parts = [f"p{i}" for i in range(4)]
        for _ in range(per // 4):
            b.push_fused(queue, parts, batch)
        return per // 4 * 4 * batch

    rows = [_measure(b, "push", batch, groups, push_all)]
    if groups == 1:  # the partitions exist now (a fused call creates none)
        rows.append(_measure(b, "push x4", batch, groups, push_fused))
    rows.append(_measure(b, "pop+ack", pop_batch, groups, drain))
    left = b.conn.execute("SELECT queen.eph_depth_v1(%s, %s, 10)::text",
                          (_TENANT, queue)).fetchone()
    assert left is not None and orjson.loads(left[0])["depth"] == 0, left
    return rows


@dataclass(frozen=True)
class InstrRow:
    push_size: int
    pop_batch: int
    push: float  # instructions a call
    pop: float
    ack: float


def _calls(dsn: str, pattern: str, n: int, fn: object, pair: bool = False) -> list[int]:
    """``n`` calls of ``fn`` on a fresh backend (a pair: ``fn(first, second)``), closed after;
    the instruction totals callgrind wrote when they exited."""
    bs = [_Backend(dsn) for _ in range(2 if pair else 1)]
    for _ in range(n):
        fn(*bs)  # type: ignore[operator]
    for b in bs:
        b.conn.close()
    return [_exit_total(pattern.format(pid=b.pid)) for b in bs]


def _instr_cell(dsn: str, pattern: str, size: int, batch: int, calls: int, warmup: int
                ) -> InstrRow:
    """Pushes of ``size`` to 4 partitions of a fresh queue, then pops of ``batch`` by one
    group, each acknowledged whole: a backend (pair) that made ``warmup + calls`` calls minus
    one that made ``warmup``, per call."""
    queue = f"cg-{size}-{batch}-{uuid.uuid4().hex[:6]}"
    b = _Backend(dsn)
    b.conn.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)", (
        _TENANT, queue, '{"maxLength": 10000000, "maxBytes": 1073741824}'))
    b.pop_ack(queue, "g", 1)  # the group registered: the messages wait for it
    b.conn.close()
    at = iter(range(1 << 30))

    def push(b: _Backend) -> None:
        b.push(queue, f"p{next(at) % 4}", size)

    def pop_ack(p: _Backend, a: _Backend) -> None:
        assert p.pop_ack(queue, "g", batch, acker=a), "the queue ran dry"

    short = _calls(dsn, pattern, warmup, push)
    long = _calls(dsn, pattern, warmup + calls, push)
    _calls(dsn, pattern, -(-(2 * warmup + calls) * batch // size) + 8, push)
    pshort = _calls(dsn, pattern, warmup, pop_ack, pair=True)
    plong = _calls(dsn, pattern, warmup + calls, pop_ack, pair=True)
    return InstrRow(size, batch, (long[0] - short[0]) / calls, (plong[0] - pshort[0]) / calls,
                    (plong[1] - pshort[1]) / calls)


@dataclass(frozen=True)
class FusedRow:
    requests: int  # 1-message pushes a call (1: eph_push_v3 alone, as a lone push goes)
    per_call: float  # instructions


def _fused_cell(dsn: str, pattern: str, k: int, calls: int, warmup: int) -> FusedRow:
    """``k`` pushes of 1 message, one per partition of a queue, in one call (``k`` = 1: one
    push alone), as a front worker fuses the pushes of one event loop turn."""
    queue = f"cgf-{k}-{uuid.uuid4().hex[:6]}"
    parts = [f"p{i}" for i in range(max(k, 1))]
    b = _Backend(dsn)
    b.conn.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)", (
        _TENANT, queue, '{"maxLength": 10000000, "maxBytes": 1073741824}'))
    for part in parts:  # the partitions exist: a fused call creates none
        b.push(queue, part, 1)
    b.conn.close()

    def call(b: _Backend) -> None:
        if k == 1:
            b.push(queue, parts[0], 1)
        else:
            b.push_fused(queue, parts, 1)

    short = _calls(dsn, pattern, warmup, call)
    long = _calls(dsn, pattern, warmup + calls, call)
    return FusedRow(k, (long[0] - short[0]) / calls)


def instructions(args: argparse.Namespace) -> tuple[list[InstrRow], list[FusedRow]]:
    """``--callgrind``: instructions a call of push, pop and ack, and of fused pushes of 1,
    the server (``--server-dsn``, on this machine) run under callgrind, its backends' files
    named by ``--callgrind``."""
    rows = []
    fused = []
    dsn = create_database(args.server_dsn, f"queen_bench_{uuid.uuid4().hex[:8]}_ephcg")
    try:
        apply_migrations(dsn)
        for size, batch in ((100, args.pop_batch), (100, args.odd_batch), (1, args.pop_batch)):
            calls, warmup = (args.calls, args.warmup) if size > 1 else (
                max(1, args.calls // 3), max(1, args.warmup // 2))
            rows.append(_instr_cell(dsn, args.callgrind, size, batch, calls, warmup))
        for k in (1, 4, 8):
            fused.append(_fused_cell(dsn, args.callgrind, k, args.calls, args.warmup))
    finally:
        drop_database(args.server_dsn, db_name(dsn))
    return rows, fused


def _markdown(head: list[str], cells: list[list[str]]) -> str:
    """A Markdown table, the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines) + "\n"


def render_instructions(rows: list[InstrRow], fused: list[FusedRow]) -> str:
    calls = _markdown(["pushes of", "pop batch", "push instr/call", "pop instr/call",
                       "ack instr/call", "pop+ack instr/msg"],
                      [[str(r.push_size), str(r.pop_batch), f"{r.push:,.0f}", f"{r.pop:,.0f}",
                        f"{r.ack:,.0f}", f"{(r.pop + r.ack) / r.pop_batch:,.0f}"] for r in rows])
    return calls + "\n" + _markdown(
        ["fused pushes of 1 a call", "instr/call", "instr/push"],
        [[str(f.requests), f"{f.per_call:,.0f}", f"{f.per_call / f.requests:,.0f}"]
         for f in fused])


def run(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    with private_server(args.server_dsn) as server_dsn:
        dsn = create_database(server_dsn, f"queen_bench_{uuid.uuid4().hex[:8]}_ephsql")
        try:
            apply_migrations(dsn)
            b = _Backend(dsn)
            for batch, groups, pop_batch in ((1, 1, args.pop_batch), (100, 1, args.pop_batch),
                                             (100, 2, args.pop_batch),
                                             (100, 1, args.odd_batch)):
                messages = args.messages // 4 if batch == 1 else args.messages
                rows += _cell(b, batch, groups, messages, pop_batch)
            b.conn.close()
        finally:
            drop_database(server_dsn, db_name(dsn))
    return rows


def render(rows: list[Row]) -> str:
    return _markdown(["op", "batch", "groups", "msgs", "backend CPU us/msg",
                      "cluster CPU us/msg", "wall us/msg"],
                     [[r.op, str(r.batch), str(r.groups), f"{r.msgs:,}",
                       f"{r.cpu_us_per_msg:.1f}", f"{r.cluster_us_per_msg:.1f}",
                       f"{r.wall_us_per_msg:.1f}"] for r in rows])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.ephemeral_sql", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-dsn", default=None,
                    help="PostgreSQL server on this machine to create the database on "
                         "(default: a private cluster started for the run)")
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--pop-batch", type=int, default=100)
    ap.add_argument("--odd-batch", type=int, default=70,
                    help="the pop batch of the last cell, that no push's size divides (70)")
    ap.add_argument("--callgrind", metavar="PATTERN", default=None,
                    help="count instructions instead: the --server-dsn server runs under "
                         "valgrind --tool=callgrind --trace-children=yes, its backends' "
                         "--callgrind-out-file as PATTERN with {pid}, e.g. '/tmp/cg/cg.{pid}'")
    ap.add_argument("--calls", type=int, default=30,
                    help="--callgrind: measured calls a cell (pushes of 1: a third)")
    ap.add_argument("--warmup", type=int, default=10,
                    help="--callgrind: unmeasured calls first (pushes of 1: half)")
    args = ap.parse_args(argv)
    if args.callgrind and not args.server_dsn:
        ap.error("--callgrind needs --server-dsn (the server run under callgrind)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.callgrind:
        print(render_instructions(*instructions(args)))
    else:
        print(render(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
