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
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from queen_mp.ipc.wakeboard import WakeBoard

__all__ = ["ParkKey", "ParkingLot"]


class ParkKey(NamedTuple):
    """PERF(queen): a tuple, hashed in C: a pop hashes its key several times (its claim gate,
    the parking lot), and a frozen dataclass's ``__hash__`` is a Python call each time."""

    bucket: int | None  # None: woken by any bucket (namespace / task pops)
    group: str
    scope: Hashable  # partition name, or (namespace, task)


@dataclass(eq=False)
class _Waiter:
    key: ParkKey
    future: asyncio.Future[None] = field(repr=False)


class ParkingLot:
    def __init__(self, board: WakeBoard, tick_s: float,
                 on_parked: Callable[[bool], None] | None = None) -> None:
        self.board = board
        self.tick_s = tick_s
        self.on_parked = on_parked
        self._queues: dict[ParkKey, deque[_Waiter]] = {}
        self._by_bucket: dict[int | None, set[ParkKey]] = {}
        self._parked = 0
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
        """Wait for a wake of ``key`` or ``until`` (monotonic seconds), whichever is first."""
        self._parked += 1
        if self._parked == 1 and self.on_parked is not None:
            self.on_parked(True)  # before the token is compared (module docstring)
        try:
            if self.token(key.bucket) != token:
                return
            left = until - time.monotonic()
            if left <= 0:
                return
            await self._wait(key, left, front)
        finally:
            self._parked -= 1
            if not self._parked and self.on_parked is not None:
                self.on_parked(False)

    async def _wait(self, key: ParkKey, left: float, front: bool) -> None:
        waiter = _Waiter(key, asyncio.get_running_loop().create_future())
        line = self._queues.get(key)
        if line is None:
            line = self._queues[key] = deque()
            self._by_bucket.setdefault(key.bucket, set()).add(key)
        if front:
            line.appendleft(waiter)
        else:
            line.append(waiter)
        self._ensure_watcher()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter.future), left)
        finally:
            with contextlib.suppress(ValueError):
                line.remove(waiter)
            if not line and self._queues.get(key) is line:
                del self._queues[key]
                keys = self._by_bucket.get(key.bucket)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._by_bucket[key.bucket]

    def pass_baton(self, key: ParkKey) -> None:
        """Wake the next waiter of ``key``: the previous one found messages, maybe more wait."""
        line = self._queues.get(key)
        if line:
            for waiter in line:
                if not waiter.future.done():
                    waiter.future.set_result(None)
                    return

    def wake_buckets(self, buckets: list[int]) -> None:
        keys: set[ParkKey] = set(self._by_bucket.get(None, ()))
        for b in buckets:
            keys |= self._by_bucket.get(b, set())
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
        after a commit that bumped it, a front worker after a wake it sent, and the worker's
        listener after it replayed another instance's (the tick is the backstop)."""
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
                if not waiter.future.done():
                    waiter.future.set_result(None)
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
