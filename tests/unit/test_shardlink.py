"""``ShardLink`` (queen_mp/ipc/shardlink.py) against real rings, with the test as the shard:
a loop turn's records leave as one ring record and one doorbell ring, verdicts resolve their
futures however they are batched, and deadlines fail what is left (``TimeoutError`` once
sent, ``ShardGone`` while the shard boots)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from queen_mp.ipc import layout
from queen_mp.ipc.doorbell import Doorbell
from queen_mp.ipc.heartbeat import HeartbeatBoard
from queen_mp.ipc.ring import Ring
from queen_mp.ipc.shardlink import ShardGone, ShardLink, verdicts_of
from queen_mp.runtime import Runtime
from queen_mp.wire.records import (
    KIND_RECORD_BATCH,
    AckVerdict,
    RecordBatch,
    peek_kind,
)

SLOT, GENERATION = 1, 7


@pytest.fixture
def runtime(tmp_path) -> Iterator[Runtime]:
    rt = Runtime(f"/qmpl{os.getpid():x}", 2, 2, 64 * 1024, 0.0, str(tmp_path))
    layout.create_all(rt)
    board = HeartbeatBoard.attach(rt.heartbeat, rt.shards)
    for shard in range(rt.shards):
        board.booted(shard, os.getpid())
    board.close()
    try:
        yield rt
    finally:
        layout.unlink_all(rt)


def _verdict(request_id: int, index: int, status: int = 0) -> bytes:
    return AckVerdict(GENERATION, SLOT, request_id, index, status, 1, 2).pack()


@contextlib.asynccontextmanager
async def _linked(runtime: Runtime) -> AsyncIterator[tuple[ShardLink, Ring]]:
    """A started link and the request ring of its slot to shard 0, the test as the shard."""
    link = ShardLink(runtime, SLOT, GENERATION)
    await link.start()
    requests = Ring.attach(runtime.request_ring(SLOT, 0))
    try:
        yield link, requests
    finally:
        requests.close()
        await link.stop()


def test_a_turn_of_records_is_one_ring_record_and_one_ring(runtime: Runtime) -> None:
    async def go() -> None:
        link = ShardLink(runtime, SLOT, GENERATION)
        await link.start()
        requests = Ring.attach(runtime.request_ring(SLOT, 0))
        bell = Doorbell.attach(runtime.shard_doorbell(0))
        other = Ring.attach(runtime.request_ring(SLOT, 1))
        try:
            deadline = asyncio.get_running_loop().time() + 5
            rid = link.next_request_id()
            futures = [link.submit(0, rid, i, b"record-%d" % i, deadline) for i in range(3)]
            link.post(0, b"grant")
            alone = link.submit(1, rid, 3, b"to shard 1", deadline)
            await asyncio.sleep(0)
            assert bell.value == 1
            raw = requests.read_many(10)
            assert len(raw) == 1 and peek_kind(raw[0]) == KIND_RECORD_BATCH
            assert [bytes(r) for r in RecordBatch.unpack(raw[0]).records] == [
                b"record-0", b"record-1", b"record-2", b"grant"]
            assert other.read_many(10) == [b"to shard 1"]  # a record alone travels as itself

            # the verdicts come back batched or not, in any order
            replies = Ring.attach(runtime.reply_ring(SLOT, 0))
            replies.try_write(RecordBatch((_verdict(rid, 2), _verdict(rid, 0, 1))).pack())
            replies.try_write(_verdict(rid, 1))
            replies.try_write(_verdict(rid, 9))  # nobody waits for it: dropped
            replies.try_write(AckVerdict(GENERATION + 1, SLOT, rid, 3, 0).pack())  # not ours
            Doorbell.attach(runtime.slot_doorbell(SLOT)).ring()
            got = await verdicts_of(futures)
            assert [(v.group_index, v.status) for v in got] == [(0, 1), (1, 0), (2, 0)]
            assert not alone.done()
            replies.close()
        finally:
            for obj in (requests, other, bell):
                obj.close()
            await link.stop()
        with pytest.raises(ShardGone):
            alone.result()

    asyncio.run(go())


def test_deadlines_fail_what_is_left(runtime: Runtime) -> None:
    async def go() -> None:
        board = HeartbeatBoard.attach(runtime.heartbeat, runtime.shards)
        board.clear(1)  # shard 1 is booting
        link = ShardLink(runtime, SLOT, GENERATION)
        await link.start()
        booting = Ring.attach(runtime.request_ring(SLOT, 1))
        try:
            loop = asyncio.get_running_loop()
            rid = link.next_request_id()
            sent = link.submit(0, rid, 0, b"a", loop.time() + 0.05)
            held = link.submit(1, rid, 1, b"b", loop.time() + 0.05)
            late = link.submit(0, rid, 2, b"c", loop.time() + 5)  # same turn, later deadline
            early = link.submit(0, rid, 3, b"d", loop.time() + 0.02)  # an earlier one
            outcomes = await verdicts_of([sent, held, early])
            assert isinstance(outcomes[0], TimeoutError)
            assert isinstance(outcomes[1], ShardGone)  # never went to the booting shard
            assert isinstance(outcomes[2], TimeoutError)
            assert not late.done()
            assert booting.read_many(10) == []
            board.booted(1, os.getpid())
            await asyncio.sleep(0.1)
            assert booting.read_many(10) == []  # its record expired while held
        finally:
            booting.close()
            board.close()
            await link.stop()

    asyncio.run(go())


def test_a_grant_alone_goes_into_the_ring_without_a_ring(runtime: Runtime) -> None:
    """``post`` records (lease grants) wait in the ring for the shard's next wake-up (the ack
    that reads them rings); the next ``submit`` rings for both."""
    async def go() -> None:
        link = ShardLink(runtime, SLOT, GENERATION)
        await link.start()
        requests = Ring.attach(runtime.request_ring(SLOT, 0))
        bell = Doorbell.attach(runtime.shard_doorbell(0))
        try:
            link.post(0, b"grant")
            await asyncio.sleep(0)
            assert bell.value == 0
            assert [bytes(r) for r in requests.read_many(10)] == [b"grant"]
            link.post(0, b"grant 2")
            await asyncio.sleep(0)
            ack = link.submit(0, link.next_request_id(), 0, b"ack",
                              asyncio.get_running_loop().time() + 5)
            await asyncio.sleep(0)
            assert bell.value == 1
            assert [bytes(r) for r in requests.read_many(10)] == [b"grant 2", b"ack"]
            ack.cancel()
        finally:
            for obj in (requests, bell):
                obj.close()
            await link.stop()

    asyncio.run(go())


def test_one_timer_keeps_the_deadlines_of_every_turn(runtime: Runtime) -> None:
    """Requests of later turns share the timer armed for the first one's deadline; only an
    earlier deadline arms it anew, and it fails each request at its own deadline."""
    async def go() -> None:
        link = ShardLink(runtime, SLOT, GENERATION)
        await link.start()
        requests = Ring.attach(runtime.request_ring(SLOT, 0))
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        call_at = loop.call_at

        def spy(when, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
            if callback == link._expire:  # a deadline timer, not another sleep's
                armed.append(when)
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = spy  # type: ignore[method-assign]
        try:
            rid = link.next_request_id()
            first = link.submit(0, rid, 0, b"a", loop.time() + 0.3)
            later = []
            for i in range(1, 4):
                await asyncio.sleep(0)  # a turn of its own each
                later.append(link.submit(0, rid, i, b"b", loop.time() + 5))
            assert len(armed) == 1
            await asyncio.sleep(0)
            early = link.submit(0, rid, 9, b"c", loop.time() + 0.05)
            assert len(armed) == 2
            t0 = loop.time()
            assert isinstance((await verdicts_of([early]))[0], TimeoutError)
            assert loop.time() - t0 < 0.25 and not first.done()
            assert isinstance((await verdicts_of([first]))[0], TimeoutError)
            assert not any(f.done() for f in later)
            for f in later:
                f.cancel()
        finally:
            del loop.call_at
            requests.close()
            await link.stop()

    asyncio.run(go())


def test_a_turn_larger_than_one_ring_record_goes_as_several(runtime: Runtime) -> None:
    """Records of one turn that do not fit one ring record leave as batches that do, in
    order; what the ring has no room for yet follows as the shard drains it."""
    async def go() -> None:
        async with _linked(runtime) as (link, requests):
            deadline = asyncio.get_running_loop().time() + 5
            rid = link.next_request_id()
            sent = [bytes([0xF0 + i]) * 20_000 for i in range(4)]  # no record kind
            futures = [link.submit(0, rid, i, r, deadline) for i, r in enumerate(sent)]
            await asyncio.sleep(0)
            got: list[bytes] = []
            for _ in range(200):
                for raw in requests.read_many(10):
                    if peek_kind(raw) == KIND_RECORD_BATCH:
                        got.extend(bytes(r) for r in RecordBatch.unpack(raw).records)
                    else:
                        got.append(bytes(raw))
                if len(got) == len(sent):
                    break
                await asyncio.sleep(0.005)
            assert got == sent
            for f in futures:
                f.cancel()

    asyncio.run(go())


def test_a_record_behind_a_full_ring_goes_in_whole_and_a_larger_one_in_fragments(
        runtime: Runtime) -> None:
    """What waits for room (the ring full) goes in whole once the shard made room for all of
    it: the shard then reads it in place, never puts it together from fragments (a block
    of its own, mapped and unmapped when large). A record larger than the ring still goes,
    fragment by fragment, as the shard drains."""
    async def go() -> None:
        async with _linked(runtime) as (link, requests):
            deadline = asyncio.get_running_loop().time() + 5
            rid = link.next_request_id()
            first = [bytes([0xE0 + i]) * 20_000 for i in range(3)]  # one batch of 60 KB
            futures = [link.submit(0, rid, i, r, deadline) for i, r in enumerate(first)]
            await asyncio.sleep(0)
            behind = bytes([0xE5]) * 20_000  # the 64 KiB ring has no room for it now
            huge = bytes([0xE6]) * 100_000  # larger than the ring
            futures += [link.submit(0, rid, 3, behind, deadline),
                        link.submit(0, rid, 4, huge, deadline)]
            await asyncio.sleep(0)
            got: list[tuple[bytes, bool]] = []

            def use(raw: bytes | memoryview) -> None:
                whole = isinstance(raw, memoryview)  # in place (or the reader's scratch)
                if peek_kind(raw) == KIND_RECORD_BATCH:
                    got.extend((bytes(r), whole) for r in RecordBatch.unpack(raw).records)
                else:
                    got.append((bytes(raw), whole))

            for _ in range(400):
                requests.read_each(1, use)  # a slow shard: one record at a time
                if len(got) == 5:
                    break
                await asyncio.sleep(0.002)
            assert [r for r, _ in got] == [*first, behind, huge]
            assert [whole for _, whole in got] == [True, True, True, True, False]
            for f in futures:
                f.cancel()

    asyncio.run(go())
