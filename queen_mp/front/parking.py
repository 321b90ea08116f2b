"""Parked long polls of one front worker, woken from the shared wake board.

A pop that found nothing parks under a key: (wake bucket, consumer group, partition filter),
or (None, group, namespace/task filter) for a discovery pop, which any bucket may wake. While
anything is parked, one task compares the board with its last snapshot every tick; for each
changed bucket it wakes only the FIRST waiter of each key. A woken pop that then claims
messages passes the baton to the next waiter of its key (there may be more to claim); one that
claims nothing parks again at the head. So one push to a queue with a thousand parked pops
costs a query per key, not a thousand queries.

A pop takes a ``token`` (the bucket's word) BEFORE it queries; ``park`` returns at once when
the word has moved since, so a push committing between the query and the park is never missed.

``on_parked(True)`` is called when the first pop parks, BEFORE its token is compared, and
``on_parked(False)`` when the last one leaves: the worker publishes it on the slot table, and
a shard rings it after a commit only while it is set. A commit whose ring was skipped because
nothing was parked yet bumped the board before that comparison, or is seen by the tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable
from operator import methodcaller
from typing import NamedTuple

from queen_mp.front.deadlines import DeadlineHeap
from queen_mp.ipc.wakeboard import WakeBoard

__all__ = ["ParkKey", "ParkingLot"]


class ParkKey(NamedTuple):
    """PERF(queen): a tuple, hashed in C: a pop hashes its key several times (its claim gate,
    the parking lot), and a frozen dataclass's ``__hash__`` is a Python call each time."""

    bucket: int | None  # None: woken by any bucket (namespace / task pops)
    group: str
    scope: Hashable  # partition name, or (namespace, task)


class _Deadlines(DeadlineHeap[asyncio.Future[None]]):
    """The parked pops' deadlines: each resolves its waiter, unless a wake came first (a
    woken waiter at the head leaves at the timer's next firing)."""

    __slots__ = ()
    slack_s = 0.001  # asyncio's own loop takes its clock's resolution
    stale = methodcaller("done")

    def _due(self, items: list[asyncio.Future[None]]) -> None:
        for waiter in items:
            if not waiter.done():
                waiter.set_result(None)


def _waiting(waiter: asyncio.Future[None]) -> bool:
    return not waiter.done()


class ParkingLot:
    def __init__(self, board: WakeBoard, tick_s: float,
                 on_parked: Callable[[bool], None] | None = None) -> None:
        self.board = board
        self.tick_s = tick_s
        self.on_parked = on_parked
        # NOTE(memory): a line is a list, not a deque: most keys have one waiter, and a deque
        # is 624 bytes from the start (a 64-slot block) against 64 for a list of one
        self._queues: dict[ParkKey, list[asyncio.Future[None]]] = {}
        # NOTE(memory): a bucket's keys, a lone key as itself: most buckets have one, and a
        # set is 216 bytes from the start
        self._by_bucket: dict[int | None, ParkKey | set[ParkKey]] = {}
        self._parked = 0
        self._sleeping = 0  # in ``sleep_until``: their deadlines are in the heap too
        # PERF(memory): the parked pops' deadlines under one timer, not a timer each; a
        # waiter woken first stays in the heap until its time or a compaction (``leave``)
        self._deadlines = _Deadlines()
        self._watcher: asyncio.Task[None] | None = None
        self._snapshot = board.snapshot()

    @property
    def parked(self) -> int:
        return self._parked

    def token(self, bucket: int | None) -> int | bytes:
        """The bucket's word (the whole board for a pop any bucket may wake)."""
        return self.board.value(bucket) if bucket is not None else self.board.snapshot()

    async def park(self, key: ParkKey, token: int | bytes, until: float, *,
                   front: bool = False) -> None:
        """Wait for a wake of ``key`` or ``until`` (monotonic seconds), whichever is first
        (``enter``, the wait, ``leave``)."""
        waiter = self.enter(key, token, until, front=front)
        if waiter is not None:
            try:
                await waiter
            finally:
                self.leave(key, waiter)

    def enter(self, key: ParkKey, token: int | bytes, until: float, *,
              front: bool = False) -> asyncio.Future[None] | None:
        """``park`` without its coroutine: the future to await, after which the caller calls
        ``leave(key, waiter)`` (in a ``finally``); None when the pop need not wait (the word
        moved since ``token``, or ``until`` passed), with nothing to leave.

        PERF(memory): a parked pop holds every frame of its chain; the popper awaits the
        waiter itself, one coroutine (some 0.3 KB) fewer a parked pop."""
        self._parked += 1
        if self._parked == 1 and self.on_parked is not None:
            self.on_parked(True)  # before the token is compared (module docstring)
        try:
            left = until - time.monotonic()
            if self.token(key.bucket) != token or left <= 0:
                self._unpark()
                return None
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            line = self._queues.get(key)
            if line is None:
                line = self._queues[key] = []
                keys = self._by_bucket.get(key.bucket)
                if keys is None:
                    self._by_bucket[key.bucket] = key
                elif type(keys) is set:
                    keys.add(key)
                elif keys != key:
                    self._by_bucket[key.bucket] = {keys, key}
            if front:
                line.insert(0, waiter)
            else:
                line.append(waiter)
            self._ensure_watcher()
            # PERF(memory): the deadline resolves the waiter itself, not
            # ``wait_for(shield(...))``, which added a coroutine, two futures, a callback
            # partial and their contexts to every parked pop
            self._deadlines.add(loop.time() + left, waiter)
        except BaseException:
            self._unpark()
            raise
        return waiter

    def leave(self, key: ParkKey, waiter: asyncio.Future[None]) -> None:
        """A waiter ``enter`` gave is done with (woken, timed out or cancelled)."""
        try:
            if len(self._deadlines) > 2 * (self._parked + self._sleeping) + 64:
                self._deadlines.compact(_waiting)
            line = self._queues.get(key)
            if line is not None:
                with contextlib.suppress(ValueError):
                    line.remove(waiter)
                if not line:
                    del self._queues[key]
                    keys = self._by_bucket.get(key.bucket)
                    if type(keys) is set:
                        keys.discard(key)
                        if not keys:
                            del self._by_bucket[key.bucket]
                    elif keys == key:
                        del self._by_bucket[key.bucket]
        finally:
            self._unpark()

    def _unpark(self) -> None:
        self._parked -= 1
        if not self._parked and self.on_parked is not None:
            self.on_parked(False)

    async def sleep_until(self, until: float) -> None:
        """Sleep until ``until`` (monotonic seconds) on the lot's deadline timer.

        PERF(memory): a pop that waited its whole timeout sleeps out its last margin here, not
        in ``asyncio.sleep`` (a future and a uvloop timer of 0.5 KB each): the suite's 1,000
        long polls time out together."""
        loop = asyncio.get_running_loop()
        left = until - time.monotonic()
        if left <= 0:
            return
        waiter: asyncio.Future[None] = loop.create_future()
        self._deadlines.add(loop.time() + left, waiter)
        self._sleeping += 1
        try:
            await waiter
        finally:
            self._sleeping -= 1

    def pass_baton(self, key: ParkKey) -> None:
        """Wake the next waiter of ``key``: the previous one found messages, maybe more wait."""
        line = self._queues.get(key)
        if line:
            for waiter in line:
                if not waiter.done():
                    waiter.set_result(None)
                    return

    def wake_buckets(self, buckets: list[int]) -> None:
        by_bucket = self._by_bucket
        keys: set[ParkKey] = set()
        for b in (None, *buckets):
            held = by_bucket.get(b)
            if type(held) is set:
                keys |= held
            elif held is not None:
                keys.add(held)
        for key in keys:
            self.pass_baton(key)

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._snapshot = self.board.snapshot()
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while self._parked:
            await asyncio.sleep(self.tick_s)
            self.poke()

    def poke(self) -> None:
        """Look at the board now, not at the next tick: a shard rings every front worker
        after a commit that bumped it (the tick stays for other instances' wakes)."""
        if not self._parked:
            return
        snap = self.board.snapshot()
        changed = WakeBoard.changed(self._snapshot, snap)
        self._snapshot = snap
        if changed:
            self.wake_buckets(changed)

    async def close(self) -> None:
        for line in self._queues.values():
            for waiter in line:
                if not waiter.done():
                    waiter.set_result(None)
        self._deadlines.clear()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
