"""A front worker's side of the rings: send records to shards, await their verdicts.

Requests go into the (slot, shard) request ring stamped with the slot's generation; replies come
back on the (slot, shard) reply ring and are matched by (request id, group index). A reply of
another generation belongs to a dead predecessor of this slot and is dropped. When a shard
process is replaced (its boot count on the heartbeat board changes) or stops beating, every
request still waiting on it fails with ``ShardGone``: its outcome is unknown, so the caller
spools it, and deduplication on replay keeps that idempotent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from queen_mp.ipc.doorbell import AsyncDoorbellWaiter, Doorbell
from queen_mp.ipc.heartbeat import HeartbeatBoard
from queen_mp.ipc.ring import Ring
from queen_mp.runtime import Runtime
from queen_mp.wire.errors import RecordDecodeError
from queen_mp.wire.records import KIND_ACK_VERDICT, AckVerdict, PushVerdict, peek_kind

Verdict = PushVerdict | AckVerdict

__all__ = ["ShardGone", "ShardLink"]

log = logging.getLogger("queen_mp.shardlink")

_WATCH_EVERY_S = 0.2
_SHARD_SILENT_MS = 5000
_WRITE_POLL_S = 0.0005


class ShardGone(Exception):
    """The shard holding a request died or was replaced before answering."""


@dataclass
class _Waiter:
    future: asyncio.Future[Verdict]
    shard: int
    boots: int


class ShardLink:
    def __init__(self, runtime: Runtime, slot: int, generation: int) -> None:
        self.runtime = runtime
        self.slot = slot
        self.generation = generation
        self._ids = itertools.count(1)
        self._waiters: dict[tuple[int, int], _Waiter] = {}
        self._requests: list[Ring] = []
        self._replies: list[Ring] = []
        self._bells: list[Doorbell] = []
        self._locks: list[asyncio.Lock] = []
        self._to_ring: set[int] = set()
        #: called whenever a shard rings this worker (a reply, or a commit that woke queues)
        self.on_ring: Callable[[], None] | None = None
        self._own_bell: Doorbell | None = None
        self._waiter: AsyncDoorbellWaiter | None = None
        self._board: HeartbeatBoard | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        rt = self.runtime
        for shard in range(rt.shards):
            self._requests.append(Ring.attach(rt.request_ring(self.slot, shard),
                                              epoch=self.generation))
            self._replies.append(Ring.attach(rt.reply_ring(self.slot, shard)))
            self._bells.append(Doorbell.attach(rt.shard_doorbell(shard)))
            self._locks.append(asyncio.Lock())
        self._board = HeartbeatBoard.attach(rt.heartbeat, rt.shards)
        self._own_bell = Doorbell.attach(rt.slot_doorbell(self.slot))
        self._waiter = AsyncDoorbellWaiter(self._own_bell, asyncio.get_running_loop(),
                                           self._drain_replies)
        self._waiter.start()
        self._watch = asyncio.get_running_loop().create_task(self._watch_shards())
        self._drain_replies()  # replies a predecessor left behind are dropped here

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._waiter is not None:
            self._waiter.stop()
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(ShardGone("front worker stopping"))
        self._waiters.clear()
        for obj in (*self._requests, *self._replies, *self._bells):
            obj.close()
        if self._own_bell is not None:
            self._own_bell.close()
        if self._board is not None:
            self._board.close()

    def next_request_id(self) -> int:
        return next(self._ids)

    async def call(self, shard: int, request_id: int, group_index: int, record: bytes,
                   deadline: float) -> Verdict:
        """Send one record and wait for its verdict until ``deadline`` (loop time)."""
        assert self._board is not None
        loop = asyncio.get_running_loop()
        key = (request_id, group_index)
        pid, _, boots = self._board.read(shard)
        while not pid:  # the shard is (re)booting: wait for it rather than fail at once
            if loop.time() > deadline:
                raise ShardGone(f"shard {shard} is not running")
            await asyncio.sleep(0.05)
            pid, _, boots = self._board.read(shard)
        waiter = _Waiter(loop.create_future(), shard, boots)
        self._waiters[key] = waiter
        try:
            await self._send(shard, record, deadline)
            # NOTE(memory): the ring holds its copy; a 1,000-item group would otherwise stay
            # alive here (about 250 kB) until its verdict comes back.
            del record
            async with asyncio.timeout_at(deadline):
                return await waiter.future
        finally:
            self._waiters.pop(key, None)

    async def post(self, shard: int, record: bytes, deadline: float) -> None:
        """Send a record that has no verdict (a lease grant for the ack registry)."""
        await self._send(shard, record, deadline)

    async def _send(self, shard: int, record: bytes, deadline: float) -> None:
        ring = self._requests[shard]
        async with self._locks[shard]:
            if len(record) > ring.max_record or not ring.try_write(record):
                # Full ring or a record larger than it: publish fragment by fragment as the
                # shard drains, without blocking the event loop.
                pending = ring.begin_write(record)
                loop = asyncio.get_running_loop()
                try:
                    while not pending.pump():
                        self._bells[shard].ring()
                        if loop.time() > deadline:
                            raise TimeoutError("request ring stayed full")
                        await asyncio.sleep(_WRITE_POLL_S)
                finally:
                    if not pending.done:
                        pending.abandon()
        self._ring_soon(shard)

    def _ring_soon(self, shard: int) -> None:
        """Ring once per loop iteration, not once per record.

        PERF(ipc): a ring is a futex wake and a thread switch in the shard; the requests that
        arrive in one iteration of the loop (many, under load) share one.
        """
        if not self._to_ring:
            asyncio.get_running_loop().call_soon(self._ring_pending)
        self._to_ring.add(shard)

    def _ring_pending(self) -> None:
        for shard in self._to_ring:
            self._bells[shard].ring()
        self._to_ring.clear()

    def _drain_replies(self) -> None:
        more = False
        for ring in self._replies:
            for raw in ring.read_many(512):
                self._deliver(raw)
            more = more or ring.used > 0
        if more:
            asyncio.get_running_loop().call_soon(self._drain_replies)
        if self.on_ring is not None:
            self.on_ring()

    def _deliver(self, raw: bytes) -> None:
        try:
            verdict: Verdict = (AckVerdict.unpack(raw) if peek_kind(raw) == KIND_ACK_VERDICT
                                else PushVerdict.unpack(raw))
        except RecordDecodeError:
            log.exception("undecodable reply record dropped")
            return
        if verdict.generation != self.generation:
            return
        waiter = self._waiters.get((verdict.request_id, verdict.group_index))
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(verdict)

    async def _watch_shards(self) -> None:
        assert self._board is not None
        while True:
            await asyncio.sleep(_WATCH_EVERY_S)
            for key, waiter in list(self._waiters.items()):
                pid, _, boots = self._board.read(waiter.shard)
                age = self._board.age_ms(waiter.shard)
                gone = (boots != waiter.boots or not pid
                        or (age is not None and age > _SHARD_SILENT_MS))
                if gone and not waiter.future.done():
                    waiter.future.set_exception(ShardGone(f"shard {waiter.shard} restarted"))
                    self._waiters.pop(key, None)
