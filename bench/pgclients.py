"""PostgreSQL-direct load generators: the pgmq arm and the physical-limit arm (no HTTP).

Same shape as bench/loadgen.py: ``procs`` worker processes (``python -m bench.pgclients
--worker ...``), each running its share of the connections as closed loops over a fixed window
that starts at the same wall-clock instant everywhere; each worker prints a JSON report and the
parent merges them with ``bench.loadgen.merge`` so every push arm reports the same keys.

**pgmq**: the SQL-only pgmq install bundled with the ``pgmq`` Python package. We do not use its
client (connection pool checkout, context logging, ``orjson`` of dicts, ``Message`` objects per
row); we send the very statements it sends (``pgmq/_sql.py``: ``SEND_BATCH``, ``SEND``,
``READ``, ``READ_WITH_POLL``, ``DELETE_BATCH``) on plain psycopg ``AsyncConnection`` s in
autocommit, with the message passed as the already-encoded 200-byte JSON. On a 2-core machine
every CPU second the client burns is taken from PostgreSQL, so a thick wrapper would make
pgmq's server-side design look slower than it is. One call = one statement = one transaction
committed with the server's default ``synchronous_commit``.

**copy** (physical limit): one ``COPY physical.messages ... FROM STDIN (FORMAT BINARY)`` of
``items`` rows inside one transaction per call, into a table with nothing but an identity
primary key: what PostgreSQL alone costs to store the message durably, whatever a broker does.

Producer ids are ``<tag>w<proc>c<conn>`` and sequence numbers count up per producer. A failed
call still consumes its sequence numbers (they are never reused), so with ``ledger_dir`` the
ledger lists exactly the calls that are known committed; a row found in the database outside
the ledger comes from a call whose outcome was unknown (timeout, connection lost on commit).

Consumers (pgmq): ``pgmq.read`` then one ``pgmq.delete`` of the ids read, two transactions per
batch like pop + ack of the HTTP arms. Drain mode (``target`` set) with several processes: the
processes share no counter, so each one stops when its reads have come back empty for
``idle_stop`` s (or it alone reached ``target``, or ``max_duration``) and the parent sums.

Run standalone::

    python -m bench.pgclients --dsn "host=127.0.0.1 user=postgres dbname=x" --kind pgmq \
        --items 100 --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import re
import resource
import secrets
import sys
import time
import zlib
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import psycopg
from psycopg.types.json import Jsonb, set_json_loads

from bench.loadgen import (
    PAYLOAD_BYTES,
    PushTally,
    WorkerGroup,
    merge,
    payload,
    percentiles,
    split,
)

__all__ = ["PAYLOAD_BYTES", "PgLoadRun", "PgLoadSpec", "PgmqConsumeRun", "PgmqConsumeSpec",
           "create_pgmq_queue", "create_physical_table", "install_pgmq", "pgmq_e2e"]

# From pgmq/_sql.py (pgmq 1.1.4), so the server runs what pgmq's own client asks for. One change:
# the jsonb[] of send_batch goes in binary (%b). psycopg's text array dumper escapes each element
# in Python (~17 us/message vs ~2 us binary); the server parses every element as JSON either way.
CREATE_QUEUE = "SELECT pgmq.create(queue_name=>%s);"
SEND = "SELECT * FROM pgmq.send(queue_name=>%s::text, msg=>%s::jsonb);"
SEND_BATCH = "SELECT * FROM pgmq.send_batch(queue_name=>%s::text, msgs=>%b::jsonb[]);"
READ = ("SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers "
        "FROM pgmq.read(queue_name=>%s::text, vt=>%s::integer, qty=>%s::integer);")
READ_WITH_POLL = ("SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers "
                  "FROM pgmq.read_with_poll(queue_name=>%s::text, vt=>%s::integer, "
                  "qty=>%s::integer, max_poll_seconds=>%s::integer, "
                  "poll_interval_ms=>%s::integer);")
DELETE_BATCH = "SELECT * FROM pgmq.delete(queue_name=>%s::text, msg_ids=>%s::bigint[]);"

COPY = "COPY physical.messages (producer, seq, partition, payload) FROM STDIN (FORMAT BINARY)"
COPY_TYPES = ["text", "int8", "text", "jsonb"]
PHYSICAL_DDL = (
    "CREATE SCHEMA IF NOT EXISTS physical; "
    "CREATE TABLE IF NOT EXISTS physical.messages ("
    "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, producer text NOT NULL, "
    "seq bigint NOT NULL, partition text NOT NULL, payload jsonb NOT NULL, "
    "created_at timestamptz NOT NULL DEFAULT now())")

_PRODUCER = re.compile(rb'"producer": ?"([^"]*)"')
_SEQ = re.compile(rb'"seq": ?(\d+)')
_IO_ERRORS = (psycopg.Error, OSError, TimeoutError)


def _raw(b: bytes) -> bytes:
    return b


def _jsonb(body: bytes) -> Jsonb:
    """The payload is already JSON: skip json.dumps (binary COPY still gets its version byte)."""
    return Jsonb(body, dumps=_raw)


async def _connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    set_json_loads(_raw, conn)  # consumers parse only producer/seq, and only for the ledger
    return conn


async def _connect_counted(dsn: str, timeout: float, errors: Counter[str]
                           ) -> psycopg.AsyncConnection[Any] | None:
    """A new connection, or None once the failure is counted (after a 50 ms pause)."""
    try:
        return await asyncio.wait_for(_connect(dsn), timeout)
    except _IO_ERRORS as ex:
        errors[f"connect_{type(ex).__name__}"] += 1
        await asyncio.sleep(0.05)
        return None


async def _close(conn: psycopg.AsyncConnection[Any] | None) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)


def install_pgmq(dsn: str) -> str:
    """Install the SQL bundled with the pgmq package (its script cannot be re-run: skip)."""
    from pgmq.install import get_embedded_sql_version, install_pgmq_from_sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq'").fetchone():
            return get_embedded_sql_version()
    return install_pgmq_from_sql(dsn=dsn)


def create_pgmq_queue(dsn: str, queue: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CREATE_QUEUE, (queue,))


def create_physical_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PHYSICAL_DDL)


# ------------------------------------------------------------------------------------ push side
@dataclass
class PgLoadSpec:
    dsn: str
    kind: str  # "pgmq" (send_batch) or "copy" (physical limit)
    connections: int = 64
    procs: int = 2
    items: int = 1
    duration: float = 10.0
    queue: str = "bench"
    partitions: int = 1000
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    timeout: float = 30.0
    ledger_dir: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("pgmq", "copy"):
            raise ValueError(f"unknown kind {self.kind!r}")


class _Short(Exception):
    pass


class _PushWorker(PushTally):
    def __init__(self, spec: PgLoadSpec, proc: int) -> None:
        super().__init__()
        self.spec = spec
        self.prefix = f"{spec.tag}w{proc}"
        self.rng = random.Random(zlib.crc32(self.prefix.encode()))
        self.ledger: dict[str, list[list[int]]] = {}

    async def call(self, conn: psycopg.AsyncConnection[Any], producer: bytes, seq: int) -> None:
        n = self.spec.items
        if self.spec.kind == "pgmq":
            msgs = [_jsonb(payload(producer, s)) for s in range(seq, seq + n)]
            cur = await conn.execute(SEND_BATCH, (self.spec.queue, msgs))
            if len(await cur.fetchall()) != n:
                raise _Short(f"send_batch returned a wrong number of ids for {n} messages")
            return
        name = producer.decode()
        part = f"p-{self.rng.randrange(self.spec.partitions):04d}"
        async with conn.transaction(), conn.cursor() as cur, cur.copy(COPY) as copy:
            copy.set_types(COPY_TYPES)
            for s in range(seq, seq + n):
                await copy.write_row((name, s, part, _jsonb(payload(producer, s))))

    def committed(self, producer: str, seq: int, n: int) -> None:
        ranges = self.ledger.setdefault(producer, [])
        if ranges and ranges[-1][1] == seq - 1:
            ranges[-1][1] = seq + n - 1
        else:
            ranges.append([seq, seq + n - 1])

    async def connection(self, conn: psycopg.AsyncConnection[Any] | None, index: int,
                         end: float) -> None:
        spec = self.spec
        n = spec.items
        name = f"{self.prefix}c{index}"
        producer = name.encode()
        seq = 0
        clock = time.perf_counter
        while clock() < end:
            if conn is None:
                conn = await _connect_counted(spec.dsn, spec.timeout, self.errors)
                if conn is None:
                    continue
            t0 = clock()
            try:
                async with asyncio.timeout(spec.timeout):
                    await self.call(conn, producer, seq)
            except (*_IO_ERRORS, _Short) as ex:
                late = "late_" if clock() > end else ""
                self.errors[f"{late}{type(ex).__name__}"] += 1
                self.sample(f"{type(ex).__name__}: {ex}")
                if isinstance(ex, TimeoutError) or conn.broken or conn.closed:
                    await _close(conn)
                    conn = None
                seq += n
                continue
            t1 = clock()
            self.committed(name, seq, n)
            seq += n
            self.answered(t0, t1, end, n)
        await _close(conn)

    async def run(self, connections: int, start_at: float) -> dict:
        # Connect before the window: a PostgreSQL backend fork is not part of a call's cost.
        conns: list[psycopg.AsyncConnection[Any] | None] = []
        for c in await asyncio.gather(*(_connect(self.spec.dsn) for _ in range(connections)),
                                      return_exceptions=True):
            if isinstance(c, BaseException):
                self.errors[f"connect_{type(c).__name__}"] += 1
                self.sample(f"connect: {c}")
                conns.append(None)
            else:
                conns.append(c)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        started_wall = time.time()
        await asyncio.gather(*(self.connection(c, i, start + self.spec.duration)
                               for i, c in enumerate(conns)))
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if self.spec.ledger_dir:
            _write_json(os.path.join(self.spec.ledger_dir, f"{self.prefix}.json"), self.ledger)
        return self.report(connections, start_at, started_wall, self.spec.duration, ru0, ru1,
                           statuses={"queued": self.items_ok})


def _write_json(path: str, doc: object) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)


# --------------------------------------------------------------------------------- consume side
@dataclass
class PgmqConsumeSpec:
    dsn: str
    queue: str
    consumers: int = 8
    procs: int = 1
    batch: int = 100
    vt: int = 30
    target: int | None = None  # drain mode (see the module docstring)
    duration: float = 10.0
    idle_stop: float = 5.0
    poll_ms: int = 10
    ledger_dir: str | None = None
    max_duration: float = 600.0  # drain mode safety stop (not in the brief's interface)
    timeout: float = 30.0


class _ConsumeWorker:
    def __init__(self, spec: PgmqConsumeSpec) -> None:
        self.spec = spec
        self.consumed = 0
        self.reads = 0
        self.empty_reads = 0
        self.redelivered = 0
        self.read_lat = array("d")
        self.del_lat = array("d")
        self.first_read: float | None = None
        self.last_delete: float | None = None
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []
        self.ledger: dict[str, Counter[int]] = {}
        self.stops: Counter[str] = Counter()
        self.last_msg = self.end = 0.0

    def stop_reason(self, now: float) -> str | None:
        s = self.spec
        if s.target is None:
            return "duration" if now >= self.end else None
        if self.consumed >= s.target:
            return "target"
        if now - self.last_msg >= s.idle_stop:
            return "idle"
        return "max_duration" if now >= self.end else None

    def account(self, rows: list[tuple[Any, ...]], deleted: list[tuple[Any, ...]]) -> None:
        self.consumed += len(deleted)
        if not self.spec.ledger_dir:
            return
        gone = {d[0] for d in deleted}
        for r in rows:
            if r[0] in gone:
                msg = bytes(r[5])
                p, s = _PRODUCER.search(msg), _SEQ.search(msg)
                if p is None or s is None:
                    self.errors["unparsable_message"] += 1
                    continue
                self.ledger.setdefault(p[1].decode(), Counter())[int(s[1])] += 1

    async def loop(self, conn: psycopg.AsyncConnection[Any] | None) -> None:
        s = self.spec
        clock = time.perf_counter
        while not (reason := self.stop_reason(clock())):
            if conn is None:
                conn = await _connect_counted(s.dsn, s.timeout, self.errors)
                if conn is None:
                    continue
            try:
                t0w, t0 = time.time(), clock()
                async with asyncio.timeout(s.timeout):
                    rows = await (await conn.execute(READ, (s.queue, s.vt, s.batch))).fetchall()
                t1 = clock()
                self.reads += 1
                if not rows:  # left out of read_lat: a drain's idle tail would swamp it
                    self.empty_reads += 1
                    await asyncio.sleep(s.poll_ms / 1000)
                    continue
                self.read_lat.append(t1 - t0)
                self.last_msg = t1
                if self.first_read is None or t0w < self.first_read:
                    self.first_read = t0w
                self.redelivered += sum(1 for r in rows if r[1] > 1)
                async with asyncio.timeout(s.timeout):
                    deleted = await (await conn.execute(
                        DELETE_BATCH, (s.queue, [r[0] for r in rows]))).fetchall()
                self.del_lat.append(clock() - t1)
                self.last_delete = time.time()
                self.account(rows, deleted)
            except _IO_ERRORS as ex:
                self.errors[type(ex).__name__] += 1
                if len(self.samples) < 5:
                    self.samples.append(f"{type(ex).__name__}: {ex}"[:400])
                if isinstance(ex, TimeoutError) or conn.broken or conn.closed:
                    await _close(conn)
                    conn = None
        self.stops[reason] += 1
        await _close(conn)

    async def run(self, consumers: int, start_at: float) -> dict:
        s = self.spec
        conns: list[psycopg.AsyncConnection[Any] | None] = []
        for c in await asyncio.gather(*(_connect(s.dsn) for _ in range(consumers)),
                                      return_exceptions=True):
            if isinstance(c, BaseException):
                self.errors[f"connect_{type(c).__name__}"] += 1
            conns.append(None if isinstance(c, BaseException) else c)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.time()
        self.last_msg = time.perf_counter()
        self.end = self.last_msg + (s.duration if s.target is None else s.max_duration)
        await asyncio.gather(*(self.loop(c) for c in conns))
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if s.ledger_dir:
            _write_json(os.path.join(s.ledger_dir, f"consumed-{os.getpid()}.json"),
                        {p: {str(k): v for k, v in c.items()} for p, c in self.ledger.items()})
        return {
            "pid": os.getpid(), "consumers": consumers, "started_at": started,
            "start_skew_s": started - start_at, "consumed": self.consumed, "reads": self.reads,
            "empty_reads": self.empty_reads, "redelivered": self.redelivered,
            "first_read_at": self.first_read, "last_delete_at": self.last_delete,
            "stops": dict(self.stops), "errors": dict(self.errors),
            "error_samples": self.samples,
            "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
            "read_lat_b64": base64.b64encode(self.read_lat.tobytes()).decode(),
            "delete_lat_b64": base64.b64encode(self.del_lat.tobytes()).decode(),
        }


def merge_consume(spec: PgmqConsumeSpec, reports: list[dict]) -> dict:
    read_lat, del_lat = array("d"), array("d")
    errors: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    samples: list[str] = []
    for r in reports:
        read_lat.frombytes(base64.b64decode(r.pop("read_lat_b64")))
        del_lat.frombytes(base64.b64decode(r.pop("delete_lat_b64")))
        errors.update(r["errors"])
        stops.update(r["stops"])
        samples.extend(r["error_samples"])
    firsts = [r["first_read_at"] for r in reports if r["first_read_at"] is not None]
    lasts = [r["last_delete_at"] for r in reports if r["last_delete_at"] is not None]
    elapsed = max(lasts) - min(firsts) if firsts and lasts else 0.0
    consumed = sum(r["consumed"] for r in reports)
    return {
        "spec": asdict(spec),
        "consumed": consumed,
        "reads": sum(r["reads"] for r in reports),
        "empty_reads": sum(r["empty_reads"] for r in reports),
        "elapsed_s": elapsed,
        "msgs_per_s": consumed / elapsed if elapsed > 0 else 0.0,
        "read_latency_ms": percentiles(read_lat),
        "delete_latency_ms": percentiles(del_lat),
        "redelivered": sum(r["redelivered"] for r in reports),
        "errors": dict(errors),
        "error_samples": samples[:10],
        "stops": dict(stops),
        "cpu_s": sum(r["cpu_s"] for r in reports),
        "max_start_skew_s": max((abs(r["start_skew_s"]) for r in reports), default=0.0),
        "workers": reports,
    }


# ------------------------------------------------------------------------------- process groups
class _Group(WorkerGroup):
    def __init__(self, role: str, spec: PgLoadSpec | PgmqConsumeSpec, shares: list[int],
                 start_delay: float) -> None:
        self.start_at = time.time() + start_delay
        doc = json.dumps(asdict(spec))
        super().__init__([
            [sys.executable, "-m", "bench.pgclients", "--worker", role, "--spec", doc,
             "--proc", str(i), "--n", str(n), "--start-at", repr(self.start_at)]
            for i, n in enumerate(shares) if n])


class PgLoadRun(_Group):
    """``spec.procs`` push workers started together; ``wait`` merges like bench.loadgen."""

    def __init__(self, spec: PgLoadSpec, start_delay: float = 2.0) -> None:
        self.spec = spec
        super().__init__("push", spec, split(spec.connections, spec.procs), start_delay)
        self.end_at = self.start_at + spec.duration

    def wait(self) -> dict:
        s = self.spec
        reports = self.reports(self.start_at + s.duration + s.timeout + 30)
        return merge(cast(Any, s), reports)


class PgmqConsumeRun(_Group):
    """``spec.procs`` consumer processes started together; ``wait`` sums their reports."""

    def __init__(self, spec: PgmqConsumeSpec, start_delay: float = 1.0) -> None:
        self.spec = spec
        super().__init__("consume", spec, split(spec.consumers, spec.procs), start_delay)

    def wait(self) -> dict:
        s = self.spec
        run = s.duration if s.target is None else s.max_duration
        return merge_consume(s, self.reports(self.start_at + run + s.timeout + 30))


# ------------------------------------------------------------------------------ end-to-end latency
async def pgmq_e2e(dsn: str, queue: str, rate: float, duration: float, batch: int = 10,
                   poll: str = "read_with_poll", vt: int = 30, grace: float = 5.0) -> dict:
    """One paced producer, one consumer; latency = read returned - send returned (same clock).

    ``poll="read_with_poll"`` waits in pgmq's own server-side loop (``max_poll_seconds=1``,
    ``poll_interval_ms=10``); ``poll="read"`` polls from the client every 10 ms instead.
    The queue is created if missing and should be empty.
    """
    if poll not in ("read_with_poll", "read"):
        raise ValueError(f"unknown poll {poll!r}")
    prod, cons = await _connect(dsn), await _connect(dsn)
    await prod.execute(CREATE_QUEUE, (queue,))
    producer = f"e2e{secrets.token_hex(3)}".encode()
    sent: dict[int, float] = {}
    got: dict[int, float] = {}
    errors: Counter[str] = Counter()
    clock = time.monotonic
    produced_at: list[float] = []

    async def produce() -> None:
        interval = 1.0 / rate
        nxt = clock()
        end = nxt + duration
        seq = 0
        while nxt < end:
            await asyncio.sleep(max(0.0, nxt - clock()))
            try:
                row = await (await prod.execute(SEND, (queue, _jsonb(payload(producer, seq)))
                                                )).fetchone()
                if row is not None:
                    sent[row[0]] = clock()
            except psycopg.Error as ex:
                errors[f"send_{type(ex).__name__}"] += 1
            seq += 1
            nxt = max(nxt + interval, clock())  # late: send now, but never a catch-up burst
        produced_at.append(clock())

    async def consume() -> None:
        while not produced_at or (clock() < produced_at[0] + grace
                                  and not sent.keys() <= got.keys()):
            try:
                if poll == "read_with_poll":
                    cur = await cons.execute(READ_WITH_POLL, (queue, vt, batch, 1, 10))
                else:
                    cur = await cons.execute(READ, (queue, vt, batch))
                rows = await cur.fetchall()
                t = clock()
                if not rows:
                    if poll == "read":
                        await asyncio.sleep(0.01)
                    continue
                for r in rows:
                    got.setdefault(r[0], t)
                await cons.execute(DELETE_BATCH, (queue, [r[0] for r in rows]))
            except psycopg.Error as ex:
                errors[f"consume_{type(ex).__name__}"] += 1
                await asyncio.sleep(0.01)

    try:
        await asyncio.gather(produce(), consume())
    finally:
        await _close(prod)
        await _close(cons)
    lat = [got[i] - t for i, t in sent.items() if i in got]
    return {
        "sent": len(sent),
        "sent_per_s": len(sent) / duration,  # below ``rate`` when sends are slower than 1/rate
        "received": len(lat),
        "missing": len(sent) - len(lat),
        # A commit can be visible to the consumer before the producer has read its answer.
        "read_before_send_returned": sum(1 for x in lat if x < 0),
        "errors": dict(errors),
        "latency_ms": percentiles([max(0.0, x) for x in lat], qs=(50, 90, 99, 99.9)),
        "samples_ms": [max(0.0, x) * 1e3 for x in lat],
    }


# ------------------------------------------------------------------------------------------- CLI
def _worker_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench.pgclients --worker")
    ap.add_argument("role", choices=["push", "consume"])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--proc", type=int, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--start-at", type=float, required=True)
    a = ap.parse_args(argv)
    doc = json.loads(a.spec)
    if a.role == "push":
        out = asyncio.run(_PushWorker(PgLoadSpec(**doc), a.proc).run(a.n, a.start_at))
    else:
        out = asyncio.run(_ConsumeWorker(PgmqConsumeSpec(**doc)).run(a.n, a.start_at))
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker_main(argv[1:])
        return
    ap = argparse.ArgumentParser(prog="python -m bench.pgclients", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--kind", choices=["pgmq", "copy", "consume", "e2e"], default="pgmq")
    ap.add_argument("--connections", type=int, default=64, help="push connections / consumers")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--items", type=int, default=1, help="messages per call / read batch")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--queue", default="bench")
    ap.add_argument("--target", type=int, default=None, help="consume: drain mode")
    ap.add_argument("--rate", type=float, default=50.0, help="e2e: messages/s")
    ap.add_argument("--ledger-dir", default=None)
    a = ap.parse_args(argv)
    res: dict
    if a.kind == "copy":
        create_physical_table(a.dsn)
    else:
        install_pgmq(a.dsn)
        create_pgmq_queue(a.dsn, a.queue)
    if a.kind in ("pgmq", "copy"):
        res = PgLoadRun(PgLoadSpec(dsn=a.dsn, kind=a.kind, connections=a.connections,
                                   procs=a.procs, items=a.items, duration=a.duration,
                                   queue=a.queue, ledger_dir=a.ledger_dir)).wait()
    elif a.kind == "consume":
        res = PgmqConsumeRun(PgmqConsumeSpec(dsn=a.dsn, queue=a.queue, consumers=a.connections,
                                             procs=a.procs, batch=a.items, target=a.target,
                                             duration=a.duration,
                                             ledger_dir=a.ledger_dir)).wait()
    else:
        res = asyncio.run(pgmq_e2e(a.dsn, a.queue, a.rate, a.duration, batch=a.items))
        res.pop("samples_ms")
    res.pop("workers", None)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
