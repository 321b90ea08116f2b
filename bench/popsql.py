"""The consume loop in SQL alone: PostgreSQL's work per pop and per ack, no broker.

``bench/pushsql.py`` does this for the push bundle; this one for the consume section's loop
(bench/suite.py: pop batch 100 from one partition, a consumer group, a lease; one ack of the
whole batch). Two autocommit connections, each its own backend, send what the front worker and
the shard send, through the broker's own calls: ``queen_mp.db.pop_procs.claim``
(``log_pop_v3``, binary results) on one, and ``queen_mp.db.ack_procs.ack_multi`` (ack fusion's
statement, binary array parameters, one row per ack: the registry fast path the suite's
consumers take) on the other, one pop and its ack after the other. The queue is filled first
(not measured) with ``--partitions`` partitions of segments of ``--segment`` messages each, as
the suite's 1,000-item pre-fill pushes leave them (100 partitions: 10 messages per segment).
The walk takes the partition with the oldest pending message, so with 100 partitions each
measured pop is its partition's first claim (no claim record to start from,
schema/019_claim_record_base.sql); ``--partitions 4`` measures pops that follow an acked claim
of their partition, as the suite's later rounds do.

It prints each backend's CPU per call (``/proc/<pid>/schedstat``, noisy on a shared machine),
or with ``--callgrind PATTERN`` its instructions per call: the server runs under
``valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=DIR/cg.%p`` (PATTERN
``DIR/cg.{pid}``) and a pair of backends that made warm-up + ``--calls`` pops and acks minus a
pair that made the warm-up alone (each writes its file at exit), as bench/pushsql.py does.
``PYTHONPATH=TREE python -m bench.popsql --dsn DSN`` migrates a fresh database with TREE's
migrations and calls TREE's code: run it with a base tree and a head tree in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.pushsql import Driver as PushDriver
from bench.pushsql import Shape, _exit_total
from queen_mp.db import ack_procs, pop_procs
from queen_mp.db.binarrays import register_arrays
from queen_mp.db.migrations import apply_migrations
from queen_mp.wire.ids import uuid7

_TENANT = uuid.UUID(int=0).bytes
_QUEUE = "pushsql"  # the queue bench/pushsql.py's driver fills
_GROUP = "popsql"


@dataclass(frozen=True)
class Row:
    what: str
    calls: int
    msgs: int
    cpu_us_per_call: float | None
    instr_per_call: float | None  # callgrind only


class Backend:
    """One autocommit connection as the broker configures it."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], pid: int) -> None:
        self.conn = conn
        self.pid = pid

    @classmethod
    async def open(cls, dsn: str) -> Backend:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        register_arrays(conn)
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        return cls(conn, int(row[0]))

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9


class Loop:
    """Pops and acks on a pair of backends; counts the messages they moved."""

    def __init__(self, dsn: str, batch: int) -> None:
        self.dsn = dsn
        self.batch = batch
        self.request = pop_procs.PopRequest(
            tenant=_TENANT, queue=_QUEUE, partition=None, namespace=None, task=None,
            group=_GROUP, batch=batch, partitions=1, wait=False, timeout_ms=0,
            auto_ack=False, sub_mode="all", sub_from=None)
        self.msgs = 0

    async def pair(self) -> tuple[Backend, Backend]:
        return await Backend.open(self.dsn), await Backend.open(self.dsn)

    async def step(self, pop: Backend, ack: Backend) -> None:
        """One pop of ``batch`` messages and the ack of every claim it made."""
        lease = uuid.UUID(bytes=uuid7())
        res = await pop_procs.claim(pop.conn, self.request, lease, 10_000)
        if not res.claims:
            raise RuntimeError("the queue ran dry: raise --fill")
        for c in res.claims:
            got = await ack_procs.ack_multi(ack.conn, _TENANT, [c.partition_id], [_GROUP],
                                            [lease.bytes], [c.end], [c.count])
            assert got[0].ok, got
            self.msgs += c.count

    async def run(self, n: int) -> tuple[float, float]:
        """``n`` steps on a fresh pair; (pop backend CPU s, ack backend CPU s); the pair is
        closed after (its backends exit)."""
        pop, ack = await self.pair()
        self.last_pids = (pop.pid, ack.pid)
        p0, a0 = pop.cpu_s(), ack.cpu_s()
        for _ in range(n):
            await self.step(pop, ack)
        p1, a1 = pop.cpu_s(), ack.cpu_s()
        await pop.conn.close()
        await ack.conn.close()
        return p1 - p0, a1 - a0


async def measure(loop: Loop, calls: int, warmup: int, pattern: str | None) -> list[Row]:
    if pattern is None:
        pop_s = ack_s = 0.0
        pop, ack = await loop.pair()
        for _ in range(warmup):
            await loop.step(pop, ack)
        m0 = loop.msgs
        p0, a0 = pop.cpu_s(), ack.cpu_s()
        for _ in range(calls):
            await loop.step(pop, ack)
        pop_s, ack_s = pop.cpu_s() - p0, ack.cpu_s() - a0
        await pop.conn.close()
        await ack.conn.close()
        msgs = loop.msgs - m0
        return [Row("pop", calls, msgs, pop_s * 1e6 / calls, None),
                Row("ack", calls, msgs, ack_s * 1e6 / calls, None)]
    await loop.run(warmup)
    short_pids = loop.last_pids
    short = [_exit_total(pattern.format(pid=p)) for p in short_pids]
    m0 = loop.msgs
    await loop.run(warmup + calls)
    long = [_exit_total(pattern.format(pid=p)) for p in loop.last_pids]
    # the files to compare function by function (callgrind_annotate), pop's then ack's
    for what, sp, lp in zip(("pop", "ack"), short_pids, loop.last_pids, strict=True):
        print(f"{what}: {pattern.format(pid=sp)} (warm-up) {pattern.format(pid=lp)} "
              f"(warm-up + calls)", file=sys.stderr)
    msgs = (loop.msgs - m0) * calls // (warmup + calls)
    return [Row(what, calls, msgs, None, (lg - sh) / calls)
            for what, sh, lg in zip(("pop", "ack"), short, long, strict=True)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", required=True, help="a server on this machine (postgres db)")
    ap.add_argument("--calls", type=int, default=200, help="measured pops (and acks)")
    ap.add_argument("--warmup", type=int, default=40, help="unmeasured pops (and acks) first")
    ap.add_argument("--batch", type=int, default=100, help="messages per pop")
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--segment", type=int, default=10, help="messages per stored segment")
    ap.add_argument("--callgrind", metavar="PATTERN", default=None,
                    help="the server runs under callgrind; its backends' --callgrind-out-file "
                         "with {pid} for the backend's pid, e.g. '/tmp/cg/cg.{pid}'")
    ap.add_argument("--keep", action="store_true", help="keep the database")
    args = ap.parse_args(argv)
    pops = (args.warmup * 2 + args.calls) if args.callgrind else args.warmup + args.calls
    per_partition = -(-pops * args.batch // args.partitions) + args.batch
    name = f"queen_popsql_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    dsn = psycopg.conninfo.make_conninfo(args.dsn, dbname=name)
    try:
        apply_migrations(dsn)
        filler = PushDriver(dsn, args.partitions)
        for _ in range(-(-per_partition // args.segment)):
            filler.call(*filler.bundle(Shape(args.partitions, args.segment)))
        filler.conn.close()
        print(f"queen_mp from {pop_procs.__file__}")
        print("| call | calls | msgs | cpu us/call | instr/call | instr/msg |")
        print("|---|---|---|---|---|---|")
        for r in asyncio.run(measure(Loop(dsn, args.batch), args.calls, args.warmup,
                                     args.callgrind)):
            cpu = "-" if r.cpu_us_per_call is None else f"{r.cpu_us_per_call:.1f}"
            ic = "-" if r.instr_per_call is None else f"{r.instr_per_call:,.0f}"
            im = "-" if r.instr_per_call is None else f"{r.instr_per_call * r.calls / r.msgs:,.0f}"
            print(f"| {r.what} | {r.calls} | {r.msgs} | {cpu} | {ic} | {im} |", flush=True)
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
