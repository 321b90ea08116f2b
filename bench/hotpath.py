"""An in-process driver of the broker's hot functions, for instruction counts under callgrind.

Wall clock on a shared 2-core machine is noise; ``valgrind --tool=callgrind`` counts the
instructions a piece of Python runs, the same on every run. This drives, with no server and no
database, the CPU work a request costs the broker between its sockets:

- ``push1`` / ``push100``: parse a JSON push body (1 item; 100 items over 10 partitions), group
  and pack the shard records, through a shared-memory ring, the shard's unpack and segment
  build, its verdicts packed and unpacked, and the 201 answer rendered;
- ``front1`` / ``front100``: the front worker's whole answer to a JSON push (1 item; 100
  items of one partition, as bench/suite.py's push section sends them):
  ``PushResource.answer``, so the body parsed, ``Ingest.push`` (group, hash, pack the shard
  record, read the shard's verdict record back, results) with a stand-in shard link that
  answers each record at once with the shard's common all-queued verdict, and the 201
  rendered; no event loop turn (the verdict is ready when awaited);
- ``front100u``: ``front100`` with UUIDv4 transactionIds, as clients mint them: about a fifth
  of such ids hold an "e" before three digits, a shape the number scan of
  ``models.items._orjson_reads_alike`` then looks up among the body's quotes (its costlier
  branch, which front100's ids never take; the live load generator's ids take it whenever its
  random run tag holds such a shape);
- ``lean1``: ``front1`` between the socket's bytes: a 1-item push's request bytes fed to the
  front's protocol (``CorkedHttpToolsProtocol``, its lean path, ``HotRoutes`` of the real
  app, admission and counting included) and its 201 written back, the verdict resolved one
  loop step later as a shard's reply is; each round also runs the driver's loop turn and
  future (uvloop);
- ``pop100``: a 100-message claim rendered as JSON (with the lease's hashes);
- ``pop100s10``: a 100-message claim over 10 segments of 10 (as bench/liveroles.py's pre-fill
  of 1,000-item pushes over 100 partitions stores them), each segment's time a new datetime
  in the broker's session zone (its connections ask for ``TimeZone=UTC``, which psycopg loads
  as ``datetime.UTC``), rendered as JSON, and its lease grant's hash set made as
  ``FrontWorker.grant_leases`` makes it;
- ``ack100``: a 100-acknowledgment batch body parsed, its fast-path request packed and
  unpacked, and the answer rendered;
- ``ephack100``: the front worker's share of an ephemeral ack of 100 ids (one delivery's, as
  popped): the body parsed, the call's lists joined as they are sent, the answer rendered;
- ``ephpop100``: an ephemeral claim of 100 messages (one run, as ``queen.eph_pop_v5`` answers
  a pop of one push's chunk) rendered as the answer's JSON (``render_messages``); psycopg's load
  of the row is not in it;
- ``qpb1k``: the front worker's share of a 1,000-item binary push (QPB1 frames mode, 10
  partitions, one zstd frame each, as bench/loadgen.py ``--format qpb1`` sends): the body
  parsed and checked, and the 201 answer rendered from its results (the client's zstd frames
  go to the shard as they came, so the shard's share is not the JSON push's);
- ``frontqpb1k``: the front worker's whole answer to that push as the suite's push section
  sends it (``bench.loadgen --format qpb1 --items 1000``, one partition a request: one group,
  one zstd frame of 1,000 frames): ``PushResource.answer`` with ``front100``'s stand-in shard
  link (the body parsed and checked, ``Ingest.push``, the 201 rendered from the run).

It runs ``--rounds`` of each chosen workload inside one ``operator.call``, a C function
nothing else here calls, so callgrind counts the rounds alone (not imports, whose count varies
with what had to be compiled)::

    valgrind --tool=callgrind --toggle-collect=_operator_call --callgrind-out-file=/dev/null \
        .venv/bin/python -m bench.hotpath --workloads push1 --rounds 200

``--check`` prints which modules are compiled (a ``.so``) and which run as Python source.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import operator
import os
import random
import shutil
import struct
import sys
import tempfile
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any
from unittest import mock

import orjson

from bench.loadgen import _Qpb1Encoder
from queen_mp.db.ephemeral_procs import PopOutcome, ack_outcome, ack_params
from queen_mp.db.pop_procs import Claim
from queen_mp.front.acks import COMMITTED
from queen_mp.front.delivery import json_messages
from queen_mp.front.ephemeral import render_messages
from queen_mp.front.ingest import Ingest, ItemResult, group_items, pieces_of, queued_run
from queen_mp.front.worker import FrontWorker
from queen_mp.http.ack import AckBatchResource, render_acks
from queen_mp.http.answer import Answer
from queen_mp.http.ephemeral import ack_results
from queen_mp.http.push import PushResource, parse_binary, parse_json_push, render_items
from queen_mp.ipc.flags import DIRECT
from queen_mp.ipc.ring import Ring
from queen_mp.models.ephemeral import parse_ack
from queen_mp.shards.fusion import Entry, build_segment
from queen_mp.wire.binary_push import QPB1_MAGIC
from queen_mp.wire.frames import pack_chunk_raw, pack_chunk_zstd, pack_frame, zstd_compress
from queen_mp.wire.hashing import hash_blob, txn_hashes
from queen_mp.wire.ids import uuid7, uuid7_many
from queen_mp.wire.records import (
    AckRequest,
    PushVerdict,
    RecordBatch,
    hash_set,
    pack_push_group,
    pack_queued_run,
    unpack_record,
)

TENANT = bytes(16)
PAYLOAD = {"producer": "hotpath-0", "seq": 12345, "pad": "x" * 160}

#: the modules the driver's work runs through (``--check`` reports how each is loaded)
MODULES = (
    "queen_mp.http.push", "queen_mp.http.ack", "queen_mp.front.ingest",
    "queen_mp.front.delivery", "queen_mp.front.acks", "queen_mp.models.items",
    "queen_mp.wire.frames", "queen_mp.wire.records", "queen_mp.wire.ids",
    "queen_mp.wire.hashing", "queen_mp.wire.times", "queen_mp.wire.binary_push",
    "queen_mp.ipc.ring", "queen_mp.ipc.shardlink", "queen_mp.shards.fusion",
)


def push_body(items: int, partitions: int, uuid_txns: bool = False) -> bytes:
    """``items`` items over ``partitions``; ``uuid_txns``: UUIDv4 transactionIds (fixed ones,
    the same every run) in place of ``t-<i>``."""
    return orjson.dumps({"items": [
        {"queue": "hot.q", "partition": f"p{i % partitions}",
         "transactionId": str(uuid.UUID(int=i * _SPREAD % (1 << 128), version=4))
         if uuid_txns else f"t-{i}", "payload": PAYLOAD} for i in range(items)]})


_SPREAD = 0x9E3779B97F4A7C15F39CC0605CEDC835  # an odd multiplier: distinct, spread-out ids


class PushPath:
    """What one push costs the front worker and the shard, minus sockets and PostgreSQL: the
    front worker's steps are ``Ingest.push``'s (group, hash, pack; verdicts to runs), the
    shard's ``PushFusion``'s fast path (one segment per group, each answered with its run)."""

    def __init__(self, items: int, partitions: int, ring: Ring) -> None:
        self.body = push_body(items, partitions)
        self.ring = ring
        self.request_id = 0

    def __call__(self) -> bytes:
        items = parse_json_push(self.body)
        groups, _ = group_items(items)
        self.request_id += 1
        records = [pack_push_group(
            1, 0, self.request_id, gi, TENANT, q, p,
            hash_blob(map(str.encode, (items[i].transaction_id for i in idx))), len(idx),
            pieces_of(items, idx, ()), 0)
            for gi, ((q, p), idx) in enumerate(groups.items())]
        self.ring.try_write(RecordBatch(tuple(records)).pack())
        # the shard: one ring record, a segment per partition, a verdict per group
        verdicts = []
        for raw in self.ring.read_many(64):
            for record in unpack_record(raw).records:
                group = unpack_record(record)
                entry = Entry(0, group, group.count)
                build_segment((group.tenant, group.queue, group.partition), [entry])
                verdicts.append(pack_queued_run(group.generation, group.slot, group.request_id,
                                                group.group_index, 7, 1_764_000_000_000_000,
                                                100, group.count))
        self.ring.try_write(RecordBatch(tuple(verdicts)).pack())
        # the front worker again: verdicts to runs (or results), results to the answer
        results: list[ItemResult | None] = [None] * len(items)
        members = list(groups.values())
        runs = []
        for raw in self.ring.read_many(64):
            for record in unpack_record(raw).records:
                v = unpack_record(record)
                assert isinstance(v, PushVerdict)
                idx = members[v.group_index]
                run = queued_run(idx, v)
                if run is not None:
                    runs.append(run)
                    continue
                for i, iv in zip(idx, v.items or v.each(), strict=True):
                    results[i] = ItemResult("queued", items[i].message_id, v.partition_id,
                                            iv.offset, v.created_at_us)
        return render_items(items, results, runs)


class _AnsweringLink:
    """A shard link whose records are answered at once: each group all queued, from offset
    100, unpacked from the shard's packed verdict as the real link's ``_deliver`` does."""

    generation, slot = 1, 0

    def __init__(self, count: int) -> None:
        self.loop = asyncio.new_event_loop()  # futures and ``time()``; never run
        self.count = count  # frames per record (the driver's bodies: one group)
        self.request_id = 0

    def next_request_id(self) -> int:
        self.request_id += 1
        return self.request_id

    def submit(self, shard: int, request_id: int, group_index: int, record: bytes,
               deadline: float) -> asyncio.Future[PushVerdict]:
        future: asyncio.Future[PushVerdict] = self.loop.create_future()
        future.set_result(PushVerdict.unpack(pack_queued_run(
            self.generation, self.slot, request_id, group_index, 7, 1_764_000_000_000_000,
            100, self.count)))
        return future


class FrontPush:
    """A JSON push of ``items`` items on one partition, answered by the front worker."""

    def __init__(self, items: int, uuid_txns: bool = False, body: bytes | None = None) -> None:
        self.body = push_body(items, 1, uuid_txns) if body is None else body
        link = _AnsweringLink(items)
        ingest = Ingest(link, 1, SimpleNamespace(route=lambda: DIRECT),  # type: ignore[arg-type]
                        5000, SimpleNamespace(known_encrypted=lambda t, q: False),  # type: ignore[arg-type]
                        None)
        # the worker's own tally of the results (its metrics' tally stood in for)
        tally = SimpleNamespace(inc=lambda family, labels, n: None)
        counter = SimpleNamespace(metrics=SimpleNamespace(tally=tally, messages_pushed=None))
        self.resource = PushResource(SimpleNamespace(  # type: ignore[arg-type]
            config=SimpleNamespace(max_decompressed_mb=64), ingest=ingest,
            count_pushed=partial(FrontWorker.count_pushed, counter)))

    def __call__(self) -> bytes:
        answer = _finish(self.resource.answer(self.body, TENANT, None, None))
        assert answer.data is not None
        return answer.data


def qpb1_body(items: int) -> bytes:
    """The QPB1 frames body ``bench.loadgen --format qpb1`` sends for ``items`` items of one
    partition (its ``--spread request``), from a fixed seed, sequence number and clock (its
    message ids the same every run)."""
    encoder = _Qpb1Encoder("bench", 1000, random.Random(26))
    with mock.patch("time.time_ns", return_value=1_764_000_000_000_000_000):
        body, _ = encoder.body(b"a1b2c3w0c7", 120_000, [42] * items, False)
    return body


class _TurnLink(_AnsweringLink):
    """``_AnsweringLink`` on a running loop, answering at the next step of it."""

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.count, self.request_id = loop, count, 0

    def submit(self, shard: int, request_id: int, group_index: int, record: bytes,
               deadline: float) -> asyncio.Future[PushVerdict]:
        future: asyncio.Future[PushVerdict] = self.loop.create_future()
        self.loop.call_soon(future.set_result, PushVerdict.unpack(pack_queued_run(
            self.generation, self.slot, request_id, group_index, 7, 1_764_000_000_000_000,
            100, self.count)))
        return future


class _Wire:
    """The transport of one connection: what the protocol writes resolves ``answered``."""

    def __init__(self) -> None:
        self.answered: asyncio.Future[bytes] | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 6632), "peername": ("127.0.0.1", 40000)}.get(
            name, default)

    def is_closing(self) -> bool:
        return False

    def writelines(self, data: Any) -> None:
        assert self.answered is not None
        self.answered.set_result(b"".join(data))

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class LeanPush:
    """A 1-item JSON push through the front's protocol, bytes in to bytes out."""

    def __init__(self, data_dir: str) -> None:
        import uvicorn
        import uvloop
        from uvicorn.server import ServerState

        from queen_mp.config import Config
        from queen_mp.http.app import create_app
        from queen_mp.processes.uvworker import CorkedHttpToolsProtocol

        self.loop = loop = uvloop.new_event_loop()
        body = push_body(1, 1)
        self.request = (b"POST /api/v1/push HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body))
        config = Config.load(env={"QUEEN_DATA_DIR": data_dir, "QUEEN_DISK_HIGH_PCT": "100"})
        ingest = Ingest(_TurnLink(1, loop), 1, SimpleNamespace(route=lambda: DIRECT),  # type: ignore[arg-type]
                        5000, SimpleNamespace(known_encrypted=lambda t, q: False),  # type: ignore[arg-type]
                        None)
        worker = SimpleNamespace(config=config, metrics=None, cipher=None, ingest=ingest,
                                 count_pushed=lambda results: None)
        app = create_app(config, None, worker)  # type: ignore[arg-type]
        uv = uvicorn.Config(app, http=CorkedHttpToolsProtocol, lifespan="off",
                            proxy_headers=False, server_header=False, log_level="warning",
                            access_log=False)  # as gunicorn serves it: no --access-logfile
        self.wire = _Wire()
        self.protocol = CorkedHttpToolsProtocol(config=uv, server_state=ServerState(),
                                                app_state={}, _loop=loop)
        self.protocol.connection_made(self.wire)  # type: ignore[arg-type]

    async def _one(self) -> bytes:
        self.wire.answered = self.loop.create_future()
        self.protocol.data_received(self.request)
        return await self.wire.answered

    async def _rounds(self, rounds: int) -> None:
        for _ in range(rounds):
            await self._one()

    def __call__(self) -> bytes:
        answer = self.loop.run_until_complete(self._one())
        assert answer.startswith(b"HTTP/1.1 201"), answer
        return answer

    def repeat(self, rounds: int) -> None:
        self.loop.run_until_complete(self._rounds(rounds))


def _finish(coro: Coroutine[Any, Any, Answer]) -> Answer:
    """Run ``coro`` to its end with no event loop: it must never wait."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("the push waited for something")


class Qpb1Path:
    """A 1,000-item QPB1 frames push as the front worker sees it: parse, check, answer."""

    def __init__(self, items: int, partitions: int) -> None:
        payload = orjson.dumps(PAYLOAD)
        ids = uuid7_many(items)
        per = items // partitions
        groups = []
        for g in range(partitions):
            frames = b"".join(pack_frame(ids[i], f"t-{i}".encode(), payload)
                              for i in range(g * per, (g + 1) * per))
            z = zstd_compress(frames)
            name, part = b"hot.q", f"p{g}".encode()
            groups.append(struct.pack("<H", len(name)) + name + struct.pack("<H", len(part))
                          + part + struct.pack("<II", per, len(z)) + z)
        self.body = QPB1_MAGIC + bytes([8]) + struct.pack("<I", partitions) + b"".join(groups)

    def __call__(self) -> bytes:
        items, _, _ = parse_binary(self.body, 64 << 20)
        results = [ItemResult("queued", it.message_id, 7 + int(it.partition[1:]), i,
                              1_764_000_000_000_000) for i, it in enumerate(items)]
        return render_items(items, results)


class PopPath:
    """A 100-message claim of one partition rendered as the JSON answer's messages."""

    def __init__(self, count: int) -> None:
        payload = orjson.dumps(PAYLOAD)
        frames = b"".join(pack_frame(uuid7(), f"t-{i}".encode(), payload)
                          for i in range(count))
        created = datetime(2026, 12, 2, 12, 0, 0, 123000, tzinfo=UTC)
        self.claim = Claim("hot.q", 7, "p0", 1, count, 1, None, False,
                           [(1, created, pack_chunk_raw(frames, count))])
        self.lease = str(uuid.UUID(int=42))

    def __call__(self) -> bytes:
        hashes: list[bytes] = []
        messages = json_messages(self.claim, self.lease, "__QUEUE_MODE__", None, 1 << 24,
                                 hashes)
        return b'{"messages":[' + messages + b"]}"


class PopSegmentsPath:
    """``count`` messages over ``segments`` segments, their times new each round (as a pop's
    rows bring them), rendered as JSON with the lease grant's hash set."""

    def __init__(self, count: int, segments: int) -> None:
        payload = orjson.dumps(PAYLOAD)
        per = count // segments
        self.blobs = []
        for s in range(segments):
            frames = b"".join(pack_frame(uuid7(), f"t-{s * per + i}".encode(), payload)
                              for i in range(per))
            self.blobs.append((1 + s * per, pack_chunk_zstd(frames, per)))
        self.count = count
        self.lease = str(uuid.UUID(int=42))
        self.t0 = datetime(2026, 12, 2, 12, 0, 0, 123000, tzinfo=UTC)
        self.round = 0

    def __call__(self) -> bytes:
        self.round += 1
        t = self.t0 + timedelta(seconds=self.round)
        claim = Claim("hot.q", 7, "p0", 1, self.count, 1, t, False,
                      [(base, t + timedelta(milliseconds=i), blob)
                       for i, (base, blob) in enumerate(self.blobs)])
        hashes: list[bytes] = []
        messages = json_messages(claim, self.lease, "__QUEUE_MODE__", None, 1 << 24, hashes)
        hash_set(hashes)
        return b'{"messages":[' + messages + b"]}"


class AckPath:
    """A 100-ack batch body parsed, its fast-path request packed and unpacked, answered."""

    def __init__(self, count: int) -> None:
        lease = str(uuid.UUID(int=42))
        self.body = orjson.dumps({"acknowledgments": [
            {"transactionId": f"t-{i}", "partitionId": "7", "leaseId": lease,
             "status": "completed"} for i in range(count)]})
        self.resource = AckBatchResource.__new__(AckBatchResource)

    def __call__(self) -> bytes:
        batch = self.resource.parse(self.body)
        lease = batch.lease_ids[0]
        assert lease is not None
        raw = AckRequest(1, 0, 1, 0, TENANT, lease.bytes, batch.partition_ids[0],
                         batch.groups[0], hash_set(txn_hashes(batch.transaction_ids))).pack()
        unpack_record(raw)
        body = render_acks(batch, [COMMITTED] * len(batch))
        assert body is not None
        return body


class EphAckPath:
    """An ephemeral ack of ``count`` ids of one delivery: parsed, its parameters made as
    ``ephemeral_procs.ack`` makes them, every id answered acked (PostgreSQL's NULL)."""

    def __init__(self, count: int) -> None:
        self.body = orjson.dumps({"queue": "hot.q", "acks": [
            {"id": f"0123456789abcdef-{1_000_000 + i}-555555"} for i in range(count)]})

    def __call__(self) -> bytes:
        ack = parse_ack(orjson.loads(self.body))
        ack_params(bytes(16), ack.queue, ack.group, ack.statuses, ack.epochs, ack.seqs,
                   ack.deliveries)
        return ack_results(ack, ack_outcome((None, 0), len(ack.seqs)).outcomes)


class EphPopPath:
    """An ephemeral claim of ``count`` messages, one run, rendered as the answer's JSON."""

    def __init__(self, count: int) -> None:
        payload = orjson.dumps({"producer": 1, "seq": 1, "pad": "x" * 160})
        self.out = PopOutcome("0123456789abcdef", ["p"], [1_000_001], [1], [1_638_400],
                              [count], b"\x1e".join([payload] * count), count, None, 0, 0)

    def __call__(self) -> bytes:
        return render_messages(self.out)


def compiled_modules() -> dict[str, bool]:
    """Each hot module: True when it was loaded from a compiled extension."""
    return {name: not importlib.import_module(name).__file__.endswith(".py")  # type: ignore[union-attr]
            for name in MODULES}


def repeat(work: Callable[[], bytes], rounds: int) -> None:
    for _ in range(rounds):
        work()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="push1,push100,pop100,ack100")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--check", action="store_true", help="print compiled/pure per module")
    a = ap.parse_args(argv)
    if a.check:
        for name, compiled in compiled_modules().items():
            print(f"{name:28} {'compiled' if compiled else 'python'}")
        return 0
    ring = Ring.create(f"/qhot-{os.getpid()}", 1 << 20, replace=True)
    tmp = tempfile.mkdtemp(prefix="qhot-")
    try:
        known: dict[str, Callable[[], bytes]] = {
            "push1": PushPath(1, 1, ring), "push100": PushPath(100, 10, ring),
            "front1": FrontPush(1), "front100": FrontPush(100),
            "front100u": FrontPush(100, uuid_txns=True),
            "pop100": PopPath(100), "pop100s10": PopSegmentsPath(100, 10),
            "ack100": AckPath(100), "ephack100": EphAckPath(100), "ephpop100": EphPopPath(100),
            "qpb1k": Qpb1Path(1000, 10), "frontqpb1k": FrontPush(1000, body=qpb1_body(1000))}
        for name in a.workloads.split(","):
            work = LeanPush(tmp) if name == "lean1" else known[name]
            work()  # warm: lazily built tables and caches are not the per-request cost
            if isinstance(work, LeanPush):  # the rounds in one run of its loop
                operator.call(work.repeat, a.rounds)
            else:
                operator.call(repeat, work, a.rounds)
    finally:
        ring.close()
        ring.unlink()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
