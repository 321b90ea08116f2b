"""One real shard process's push path, in-process against PostgreSQL, for instruction counts.

bench/hotpath.py counts what a push costs without a database; a shard's CPU per message under
load is mostly what it does around the database: the request rings and doorbells, fusion, the
bundle's statement through psycopg on uvloop, the verdicts into the reply rings and the
doorbells it rings. This drives a ``queen_mp.shards.process.Shard`` (its own rings, doorbells,
slot table and wake board, as the supervisor creates them) with pre-packed 1-item
``PushGroup`` records, ``--segments`` partitions per bundle, half from each of two front
worker slots (of four, as ``QUEEN_WORKERS=2`` makes), and waits for every verdict before the
next bundle; PostgreSQL runs in its own processes, so callgrind counts the shard's side alone::

    valgrind --tool=callgrind --toggle-collect=_operator_call --callgrind-out-file=/dev/null \
        .venv/bin/python -m bench.shardpath --bundles 200

Without ``--dsn`` it starts a private cluster (queen_mp/db/embedded.py, fsync off: the wait for
a commit is not counted anyway) and migrates a database there. ``--bundles`` are counted inside
one ``operator.call`` after ``--warm`` bundles outside it; divide by bundles x segments for the
instructions a message. ``--items 100 --segments 10`` gives each group 100 frames in one raw
piece, as a front worker packs the suite's 100-item JSON push (each request's items in one
partition): the stored chunk is then compressed, and the dedup filter probes and remembers
100 hashes a segment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import operator
import os
import shutil
import sys
import tempfile
from pathlib import Path

import orjson
import psycopg
import uvloop

from queen_mp.config import Config
from queen_mp.db.embedded import EmbeddedPostgres
from queen_mp.db.migrations import apply_migrations
from queen_mp.heap import freeze_startup_objects
from queen_mp.ipc import layout
from queen_mp.ipc.doorbell import Doorbell
from queen_mp.ipc.ring import Ring
from queen_mp.ipc.slots import SlotTable
from queen_mp.runtime import Runtime
from queen_mp.shards.process import Shard
from queen_mp.wire.frames import pack_frame
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid7
from queen_mp.wire.records import KIND_RECORD_BATCH, Piece, PushGroup, RecordBatch, peek_kind

TENANT = bytes(16)
LIVE_SLOTS = 2


def bundle_records(bundle: int, segments: int, partitions: int, items: int = 1) -> list[bytes]:
    """One ``RecordBatch`` per live slot: ``segments`` groups of ``items`` frames each (one
    raw piece, as a front worker packs a JSON push) on distinct partitions."""
    per_slot: list[list[bytes]] = [[] for _ in range(LIVE_SLOTS)]
    for i in range(segments):
        seq = bundle * segments + i
        frames, hashes = [], []
        for j in range(items):
            txn = f"sp-{os.getpid()}-{seq}-{j}"
            payload = orjson.dumps({"producer": "shardpath", "seq": seq * items + j,
                                    "pad": "x" * 160})
            frames.append(pack_frame(uuid7(), txn.encode(), payload))
            hashes.append(txn_hash(txn))
        slot = i % LIVE_SLOTS
        per_slot[slot].append(PushGroup(
            generation=1, slot=slot, request_id=seq, group_index=0, tenant=TENANT,
            queue="shardpath", partition=f"p-{seq % partitions:04d}", hashes=b"".join(hashes),
            count=items, pieces=(Piece(0, items, b"".join(frames)),), deadline_ms=0).pack())
    return [RecordBatch(tuple(r)).pack() for r in per_slot]


class Front:
    """The two live front workers' side of the rings: write requests, count verdicts."""

    def __init__(self, rt: Runtime, loop: asyncio.AbstractEventLoop) -> None:
        self.requests = [Ring.attach(rt.request_ring(s, 0), epoch=1) for s in range(LIVE_SLOTS)]
        self.replies = [Ring.attach(rt.reply_ring(s, 0)) for s in range(LIVE_SLOTS)]
        self.bells = [Doorbell.attach(rt.slot_doorbell(s)) for s in range(LIVE_SLOTS)]
        self.shard_bell = Doorbell.attach(rt.shard_doorbell(0))
        self.loop = loop
        self.want = 0
        self.done: asyncio.Future[None] | None = None
        for slot, bell in enumerate(self.bells):
            loop.add_reader(bell.fileno(), self._drain, slot)

    def _drain(self, slot: int) -> None:
        self.bells[slot].clear()
        for raw in self.replies[slot].read_many(512):
            batch = peek_kind(raw) == KIND_RECORD_BATCH
            self.want -= len(RecordBatch.unpack(raw).records) if batch else 1
        if self.want <= 0 and self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def push(self, records: list[bytes], segments: int) -> None:
        self.want = segments
        self.done = self.loop.create_future()
        for ring, record in zip(self.requests, records, strict=True):
            assert ring.try_write(record)
        self.shard_bell.ring()
        await self.done

    def close(self) -> None:
        for bell in self.bells:
            self.loop.remove_reader(bell.fileno())
            bell.close()
        self.shard_bell.close()
        for ring in (*self.requests, *self.replies):
            ring.close()


class Driver:
    """A shard and its two live front workers on one loop."""

    def __init__(self, config: Config, rt: Runtime, a: argparse.Namespace) -> None:
        self.a = a
        self.shard = Shard(config, rt, 0)
        self.loop = asyncio.get_running_loop()
        bell = self.shard.bell
        # the shard's doorbell watch, as its AsyncDoorbellWaiter sets it up
        self.loop.add_reader(bell.fileno(), lambda: bell.clear() and self.shard.drain_requests())
        self.front = Front(rt, self.loop)
        self.plans = [bundle_records(b, a.segments, a.partitions, a.items)
                      for b in range(a.warm + a.bundles)]
        # as Shard.run does once it is up: the collector's young generation at the shard's
        # threshold, the startup objects out of its reach (at CPython's default threshold a
        # tenth of the counted instructions were collections the shard does not make)
        freeze_startup_objects()

    async def run(self, first: int, count: int) -> None:
        for b in range(first, first + count):
            await self.front.push(self.plans[b], self.a.segments)

    async def close(self) -> None:
        self.loop.remove_reader(self.shard.bell.fileno())
        self.front.close()
        await self.shard.writer.close()
        await self.shard.waker.close()
        self.shard.wake_board.close()


async def _setup(config: Config, rt: Runtime, a: argparse.Namespace) -> Driver:
    return Driver(config, rt, a)


def count_stored(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(s.msg_count), 0) FROM queen.log_segments s"
                           " JOIN queen.log_partitions lp ON lp.id = s.partition_id"
                           " JOIN queen.queues q ON q.id = lp.queue_id"
                           " WHERE q.name = 'shardpath'").fetchone()
    return int(row[0]) if row else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=None, help="a migrated-or-empty database (default: private)")
    ap.add_argument("--bundles", type=int, default=200)
    ap.add_argument("--warm", type=int, default=50)
    ap.add_argument("--segments", type=int, default=20, help="groups (partitions) per bundle")
    ap.add_argument("--items", type=int, default=1,
                    help="frames per group (100: the suite's 100-item JSON push, one partition "
                         "a request)")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--wake-notify", action="store_true",
                    help="QUEEN_WAKE_NOTIFY on, as a broker runs by default (no other instance "
                         "listens: the Waker learns that and sends nothing)")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="queen-shardpath-", dir="/tmp"))
    tmp.chmod(0o755)
    pg = None
    rt = None
    try:
        dsn = a.dsn
        if dsn is None:
            pg = EmbeddedPostgres(tmp / "pg", fsync=False)
            dsn = pg.start()
        apply_migrations(dsn)
        rt = Runtime.new(slots=2 * LIVE_SLOTS, shards=1, ring_bytes=1 << 20,
                         metrics_dir=str(tmp))
        layout.create_all(rt)
        with SlotTable.attach(rt.slot_table) as table:
            for _ in range(LIVE_SLOTS):
                table.claim()
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
        env.update({"QUEEN_PG_DSN": dsn, "QUEEN_DATA_DIR": str(tmp),
                    "QUEEN_WAKE_NOTIFY": "1" if a.wake_notify else "0",
                    "QUEEN_LOG_LEVEL": "warning"})
        os.environ.clear()
        os.environ.update(env)
        os.environ.update(rt.to_env())
        config = Config.load()
        loop = uvloop.new_event_loop()
        try:
            driver = loop.run_until_complete(_setup(config, rt, a))
            try:
                loop.run_until_complete(driver.run(0, a.warm))
                operator.call(loop.run_until_complete, driver.run(a.warm, a.bundles))
            finally:
                loop.run_until_complete(driver.close())
            stored, pushed = count_stored(dsn), (a.warm + a.bundles) * a.segments * a.items
            if stored != pushed:
                raise SystemExit(f"{stored} messages stored, not {pushed}")
        finally:
            loop.close()
    finally:
        if rt is not None:
            layout.unlink_all(rt)
        if pg is not None:
            with contextlib.suppress(Exception):
                pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
