"""A front worker's side of the rings: send records to shards, await their verdicts.

Requests go into the (slot, shard) request ring stamped with the slot's generation; replies come
back on the (slot, shard) reply ring and are matched by (request id, group index). A reply of
another generation belongs to a dead predecessor of this slot and is dropped. When a shard
process is replaced (its boot count on the heartbeat board changes) or stops beating, every
request still waiting on it fails with ``ShardGone``: its outcome is unknown, so the caller
spools it, and deduplication on replay keeps that idempotent.

Batching. ``submit`` only queues a record and hands back a future: the records every request
of one loop turn queued for a shard leave at the end of the turn as one ring record
(``RecordBatch``) and one doorbell ring, and every deadline is kept by one watchdog timer,
armed at the earliest of them. A request costs a future and a dict entry, not a Task, a
lock, a timeout context and a timer handle.
While a shard is booting (no pid on the heartbeat board) its records wait here, so that each
waiter is stamped with the boot count of the shard that reads it; one that is still here at
its deadline fails with ``ShardGone`` (nothing was sent), one sent and unanswered with
``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from queen_mp.ipc.doorbell import AsyncDoorbellWaiter, Doorbell
from queen_mp.ipc.heartbeat import HeartbeatBoard
from queen_mp.ipc.ring import SCRATCH_MAX, Ring
from queen_mp.runtime import Runtime
from queen_mp.wire.errors import RecordDecodeError
from queen_mp.wire.records import (
    KIND_ACK_VERDICT,
    KIND_RECORD_BATCH,
    AckVerdict,
    PushVerdict,
    RecordBatch,
    batch_parts,
    peek_kind,
)

Verdict = PushVerdict | AckVerdict
Key = tuple[int, int]  # (request id, group index)
Parts = Sequence[bytes | bytearray | memoryview]  # a ring record's bytes, joined by the ring

__all__ = ["ShardGone", "ShardLink", "Verdict", "verdicts_of"]

log = logging.getLogger("queen_mp.shardlink")

_WATCH_EVERY_S = 0.2
_SHARD_SILENT_MS = 5000
_WRITE_POLL_S = 0.0005
_BOOT_POLL_S = 0.05
_BATCH_HEAD_BYTES = RecordBatch.packed_size(())
_EARLY_S = 0.001  # a deadline this close is due now (the watchdog fires on a whole ms)


class ShardGone(Exception):
    """The shard holding a request died or was replaced before answering."""


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Verdict]
    shard: int
    deadline: float
    boots: int = -1  # the shard's boot count once the record went to its ring; -1 before


@dataclass(slots=True)
class _Outbox:
    """One shard's records not yet in its ring, in order; None keys have no waiter."""

    records: list[tuple[Key | None, bytes]] = field(default_factory=list)
    urgent: bool = False  # a queued record wants the shard now (``post`` records do not)
    # a record larger than the ring, or a full ring: the rest waits behind the pump
    pump: asyncio.Task[None] | None = None
    backlog: deque[Parts] = field(default_factory=deque)


class ShardLink:
    def __init__(self, runtime: Runtime, slot: int, generation: int) -> None:
        self.runtime = runtime
        self.slot = slot
        self.generation = generation
        self._ids = itertools.count(1)
        self._waiters: dict[Key, _Waiter] = {}
        self._requests: list[Ring] = []
        self._replies: list[Ring] = []
        self._bells: list[Doorbell] = []
        self._outboxes: list[_Outbox] = []
        self._flush_due = False
        self._boot_retry: asyncio.TimerHandle | None = None
        # every waiter's deadline, armed at the earliest (``_watch_at``, loop time)
        self._watchdog: asyncio.TimerHandle | None = None
        self._watch_at = 0.0
        #: called whenever a shard rings this worker (a reply, or a commit that woke queues)
        self.on_ring: Callable[[], None] | None = None
        self._own_bell: Doorbell | None = None
        self._waiter: AsyncDoorbellWaiter | None = None
        self._board: HeartbeatBoard | None = None
        self._watch: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the link was started on (its worker's only one).

        PERF(ipc): ``asyncio.get_running_loop()`` makes a ``getpid`` system call each time
        on Python 3.11 (its fork check; glibc no longer caches the pid): three per 1-item
        push, 3 of the 5.3 system calls of a push at 64 connections (strace -c), before the
        hot path took the loop from here."""
        loop = self._loop
        assert loop is not None, "shard link not started"
        return loop

    async def start(self) -> None:
        rt = self.runtime
        loop = self._loop = asyncio.get_running_loop()
        for shard in range(rt.shards):
            self._requests.append(Ring.attach(rt.request_ring(self.slot, shard),
                                              epoch=self.generation))
            self._replies.append(Ring.attach(rt.reply_ring(self.slot, shard)))
            self._bells.append(Doorbell.attach(rt.shard_doorbell(shard)))
            self._outboxes.append(_Outbox())
        self._board = HeartbeatBoard.attach(rt.heartbeat, rt.shards)
        self._own_bell = Doorbell.attach(rt.slot_doorbell(self.slot))
        self._waiter = AsyncDoorbellWaiter(self._own_bell, loop, self._drain_replies)
        self._waiter.start()
        self._watch = loop.create_task(self._watch_shards())
        self._drain_replies()  # replies a predecessor left behind are dropped here

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._boot_retry is not None:
            self._boot_retry.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for box in self._outboxes:
            if box.pump is not None:
                box.pump.cancel()
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

    def submit(self, shard: int, request_id: int, group_index: int, record: bytes,
               deadline: float) -> asyncio.Future[Verdict]:
        """Queue one record for ``shard``; the future resolves to its verdict, or fails with
        ``TimeoutError`` (sent, no verdict by ``deadline``, loop time) or ``ShardGone``."""
        loop = self.loop
        key = (request_id, group_index)
        future: asyncio.Future[Verdict] = loop.create_future()
        if self._watchdog is None or deadline < self._watch_at:
            # PERF(ipc): one timer for every waiter, not one per loop turn (a TimerHandle
            # made, started and cancelled: 10k instructions a turn, most 1-item pushes);
            # ``_expire`` re-arms it for the earliest deadline left.
            self._arm(loop, deadline)
        self._waiters[key] = _Waiter(future, shard, deadline)
        box = self._outboxes[shard]
        box.records.append((key, record))
        box.urgent = True
        self._flush_soon(loop)
        return future

    def post(self, shard: int, record: bytes) -> None:
        """Queue a record that has no verdict and no hurry (a lease grant for the ack
        registry): it goes into the ring at the end of the turn, but rings no doorbell.

        PERF(ipc): a grant is only read by the ack that follows it, and every ack rings
        (the shard drains every ring when woken, grants before acks): ringing for it cost
        each pop a FIFO write and a shard wake-up. A ring that fills with grants rings
        from its pump."""
        self._outboxes[shard].records.append((None, record))
        self._flush_soon(self.loop)

    # ------------------------------------------------------------------ sending
    def _flush_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """End of the turn: each shard's queued records into its ring, one ring each."""
        self._flush_due = False
        board = self._board
        assert board is not None
        waiting = False
        for shard, box in enumerate(self._outboxes):
            if not box.records:
                continue
            pid, _, boots = board.read(shard)
            if not pid:  # booting: keep them until it beats (each waiter has its deadline)
                waiting = True
                continue
            batch: list[bytes] = []
            for key, record in box.records:
                if key is not None:
                    waiter = self._waiters.get(key)
                    if waiter is None:  # expired while queued here
                        continue
                    waiter.boots = boots
                batch.append(record)
            box.records = []
            urgent, box.urgent = box.urgent, False
            if batch:
                self._send(shard, box, batch, urgent)
        if waiting and self._boot_retry is None:
            self._boot_retry = self.loop.call_later(_BOOT_POLL_S, self._retry_boot)

    def _retry_boot(self) -> None:
        self._boot_retry = None
        self._flush()

    def _send(self, shard: int, box: _Outbox, records: list[bytes], urgent: bool) -> None:
        ring = self._requests[shard]
        limit = ring.max_record
        # PERF(ipc): a batch is no larger than what the shard puts together in its scratch
        # when it wraps the ring (``Ring.read_each``), not in a block of its own
        batch_max = min(limit, SCRATCH_MAX)
        n = len(records)
        # PERF(ipc): the common turn, whose records fit one ring record, sized in C without
        # ``_batches``' loop (4.5k instructions for a turn of one record, 16.8k of two)
        if n == 1 and len(records[0]) <= limit:
            # PERF(ipc): a lone record by ``try_write``, not ``try_write_parts`` (see there)
            if box.pump is None and ring.try_write(records[0]):
                if urgent:
                    self._bells[shard].ring()
                return
            payloads: list[Parts] = [records]
        elif sum(map(len, records)) + 4 * n + _BATCH_HEAD_BYTES <= batch_max:
            payloads = [batch_parts(records)]
        else:
            payloads = _batches(records, batch_max)
        for parts in payloads:
            # PERF(ipc): a batch goes into the ring in its parts, never joined first (see
            # ``Ring.try_write_parts``)
            if box.pump is None and _size(parts) <= limit and ring.try_write_parts(parts):
                continue
            box.backlog.append(parts)
            urgent = True  # a full ring: the shard must drain it
            if box.pump is None:
                box.pump = self.loop.create_task(self._pump(shard, box))
        if urgent:
            self._bells[shard].ring()

    async def _pump(self, shard: int, box: _Outbox) -> None:
        """Full ring or a record larger than it: publish as the shard drains, without
        blocking the event loop; later records wait behind, in order.

        A record that fits the ring waits for room for all of it and goes in whole: one in
        fragments is put together by the shard in a block of its own
        (``Ring.read_with_epoch``), which over glibc's mmap threshold (a batch of 100-item
        pushes) is mapped, faulted in and unmapped: about 12% of a shard's CPU under the
        suite's 100-item pushes, whose 64 connections fill a front worker's ring (perf).
        A larger one goes fragment by fragment."""
        ring, bell = self._requests[shard], self._bells[shard]
        try:
            while box.backlog:
                parts = box.backlog[0]
                if _size(parts) <= ring.max_record:
                    while not ring.try_write_parts(parts):
                        bell.ring()
                        await asyncio.sleep(_WRITE_POLL_S)
                else:
                    pending = ring.begin_write(b"".join(parts))
                    try:
                        while not pending.pump():
                            bell.ring()
                            await asyncio.sleep(_WRITE_POLL_S)
                    finally:
                        if not pending.done:
                            pending.abandon()
                box.backlog.popleft()
                bell.ring()
        finally:
            box.pump = None

    # ------------------------------------------------------------------ deadlines
    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watch_at = when
        self._watchdog = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """Fail every waiter past its deadline (or drop it, its caller gone); re-arm for the
        earliest deadline left. Runs about once per push timeout while requests come."""
        self._watchdog = None
        loop = self.loop
        due = loop.time() + _EARLY_S
        earliest = float("inf")
        for key, waiter in list(self._waiters.items()):
            if waiter.future.done():  # its caller went away
                del self._waiters[key]
                continue
            if waiter.deadline > due:
                earliest = min(earliest, waiter.deadline)
                continue
            del self._waiters[key]
            if waiter.boots < 0:
                waiter.future.set_exception(ShardGone(f"shard {waiter.shard} is not running"))
            else:
                waiter.future.set_exception(TimeoutError("no verdict before the deadline"))
        if self._waiters and self._watchdog is None:
            self._arm(loop, earliest)

    # ------------------------------------------------------------------ replies
    def _drain_replies(self) -> None:
        more = False
        for ring in self._replies:
            for raw in ring.read_many(512):
                self._deliver(raw)
            more = more or ring.used > 0
        if more:
            self.loop.call_soon(self._drain_replies)
        if self.on_ring is not None:
            self.on_ring()

    def _deliver(self, raw: bytes | memoryview) -> None:
        try:
            kind = peek_kind(raw)
            if kind == KIND_RECORD_BATCH:
                for record in RecordBatch.unpack(raw).records:
                    self._deliver(record)
                return
            verdict: Verdict = (AckVerdict.unpack(raw) if kind == KIND_ACK_VERDICT
                                else PushVerdict.unpack(raw))
        except RecordDecodeError:
            log.exception("undecodable reply record dropped")
            return
        if verdict.generation != self.generation:
            return
        waiter = self._waiters.pop((verdict.request_id, verdict.group_index), None)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(verdict)

    async def _watch_shards(self) -> None:
        assert self._board is not None
        while True:
            await asyncio.sleep(_WATCH_EVERY_S)
            for key, waiter in list(self._waiters.items()):
                if waiter.boots < 0:
                    continue  # not sent yet: its shard is booting
                pid, _, boots = self._board.read(waiter.shard)
                age = self._board.age_ms(waiter.shard)
                gone = (boots != waiter.boots or not pid
                        or (age is not None and age > _SHARD_SILENT_MS))
                if gone:
                    self._waiters.pop(key, None)
                    if not waiter.future.done():
                        waiter.future.set_exception(
                            ShardGone(f"shard {waiter.shard} restarted"))


async def verdicts_of(calls: list[asyncio.Future[Verdict]]
                      ) -> list[Verdict | BaseException]:
    """Each submitted record's verdict or exception, in order, as
    ``gather(return_exceptions=True)`` gives them.

    PERF(ipc): a request of one record, the common push and ack, awaits its future alone: no
    gathering future and no done-callback per request."""
    if len(calls) == 1:
        try:
            return [await calls[0]]
        except Exception as ex:
            return [ex]
    return list(await asyncio.gather(*calls, return_exceptions=True))


def _batches(records: list[bytes], max_record: int) -> list[Parts]:
    """Ring records for ``records`` in order, each as its parts: runs that fit ``max_record``
    travel as a ``RecordBatch`` (a run of one as itself); a larger record travels alone."""
    out: list[Parts] = []
    run: list[bytes] = []
    size = RecordBatch.packed_size(())
    for record in records:
        grown = size + 4 + len(record)
        if run and grown > max_record:
            out.append(run if len(run) == 1 else batch_parts(run))
            run, grown = [], RecordBatch.packed_size(()) + 4 + len(record)
        run.append(record)
        size = grown
    if run:
        out.append(run if len(run) == 1 else batch_parts(run))
    return out


def _size(parts: Parts) -> int:
    """The bytes of the ring record of ``parts``."""
    return sum(map(len, parts))
