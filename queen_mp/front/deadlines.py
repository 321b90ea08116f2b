"""Many deadlines of one event loop under one loop timer.

PERF(memory): a uvloop timer is about 0.5 KB (its handle, its libuv timer, their callback); an
entry of this heap (loop time, seq, item) about 0.1 KB. A front worker keeps two such heaps:
its parked pops' deadlines (``front/parking.py``) and its connections' keep-alive checks
(``processes/uvworker.py`` ``IdleSweep``), each of them thousands under the suite's long polls.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["DeadlineHeap"]

T = TypeVar("T")


class DeadlineHeap(Generic[T]):
    """Items due at loop times: a heap of (loop time, seq, item) under one loop timer armed
    for its first. When the timer fires, the due items (and, with ``stale``, those at the head
    that no longer wait) are popped and handed to ``_due`` in one list, after the pops: a
    handler may add its item again. An item that stops waiting early stays until its time or
    a ``compact``."""

    __slots__ = ("__weakref__", "_heap", "_seq", "_timer", "_timer_at")

    #: what the timer counts as due already, past its loop time
    slack_s = 0.0
    #: an item at the head that no longer waits, popped before its time (None: only by time)
    stale: Callable[[T], bool] | None = None

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, when: float, item: T) -> None:
        """``item`` due at ``when`` (loop time of the running loop)."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, item))
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = asyncio.get_running_loop().call_at(when, self._fire)

    def compact(self, keep: Callable[[T], bool]) -> None:
        """Drops the entries whose item no longer waits."""
        self._heap = [e for e in self._heap if keep(e[2])]
        heapq.heapify(self._heap)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        self._heap.clear()

    def _due(self, items: list[T]) -> None:
        raise NotImplementedError

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        loop = asyncio.get_running_loop()
        heap, stale = self._heap, self.stale
        now = loop.time() + self.slack_s
        due = []
        while heap and (heap[0][0] <= now or (stale is not None and stale(heap[0][2]))):
            due.append(heapq.heappop(heap)[2])
        self._due(due)
        if heap and self._timer is None:  # a handler's ``add`` may have armed it
            self._timer_at = heap[0][0]
            self._timer = loop.call_at(self._timer_at, self._fire)
