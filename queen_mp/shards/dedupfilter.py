"""Layer-1 deduplication knowledge of one shard: which transaction hashes its partitions hold.

``log_push_one_v1`` probes every stored hash of the partition inside the dedup window above
``p_verified``; with ``p_verified = 0`` that is every segment of the last hour, so the probe of a
busy partition grew with its depth (0.66 ms a segment at 400 segments, bench/README.md). The
shard writes its partitions' segments itself, one flush in flight per partition, so it can
remember what it wrote and promise the procedure "offsets up to ``hi`` hold none of these
hashes": the probe then reads only what another writer (a transaction, a timer, another broker
instance) added above ``hi``, usually nothing.

The promise must cover every offset up to ``hi`` inside the window. A partition first seen with
offsets below ``floor`` (written before this shard knew it) is complete only once those rows
are older than the queue's window (plus a clock margin); until then, and whenever a hash may be
known (a repeat, or the same 64-bit prefix), the shard sends 0 and SQL probes everything, as
before. A gap in the offsets (someone else wrote in between) resets the partition. Memory is
bounded: entries older than the window are forgotten, and past ``max_entries`` whole partitions
are dropped, least recently pushed first (they start over as incomplete).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

__all__ = ["DedupFilter"]

Key = tuple[bytes, str, str]  # tenant, queue, partition
CLOCK_MARGIN_S = 60.0  # broker and PostgreSQL clocks may disagree this much


def _prefixes(hashes: bytes) -> list[int]:
    """The first 8 bytes of each 16-byte xxh3_128 hash, as ints (set members), in native
    byte order (the filter lives in one process); one C-level pass."""
    return memoryview(hashes).cast("Q")[::2].tolist()


class _Partition:
    __slots__ = ("chunks", "complete_at", "hi", "known", "pid", "window")

    def __init__(self, pid: int, window: int, floor: int, complete_at: float) -> None:
        self.pid = pid
        self.window = window
        self.hi = floor
        self.complete_at = complete_at
        self.known: set[int] = set()
        self.chunks: deque[tuple[float, list[int]]] = deque()  # (written at, prefixes)


class DedupFilter:
    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self.entries = 0
        self._parts: OrderedDict[Key, _Partition] = OrderedDict()

    def verified(self, key: Key, hashes: bytes) -> int:
        """``p_verified`` for a segment of these hashes: ``hi`` when the shard knows every
        stored hash of the window up to ``hi`` and none of these is among them, else 0."""
        part = self._parts.get(key)
        if part is None or self.clock() < part.complete_at:
            return 0
        known = part.known
        for h in _prefixes(hashes):
            if h in known:
                return 0
        return part.hi

    def committed(self, key: Key, pid: int, base: int, count: int, hashes: bytes,
                  window_s: int) -> None:
        """A segment of ours was stored at ``base .. base + count - 1``."""
        if self.max_entries == 0:
            return  # the filter is off: every push probes the whole window
        now = self.clock()
        if window_s <= 0:
            self._drop(key)  # no probe at all: nothing to remember
            return
        part = self._parts.get(key)
        if (part is None or part.pid != pid or base != part.hi + 1
                or window_s > part.window):
            # First sight, a recreated partition, rows of another writer in between, or a
            # longer window than the one entries were forgotten by: offsets below `base` are
            # unknown until they leave the window.
            self._drop(key)
            part = _Partition(pid, window_s, base - 1,
                              now + window_s + CLOCK_MARGIN_S if base > 1 else 0.0)
            self._parts[key] = part
        else:
            self._parts.move_to_end(key)
            part.window = window_s
        new = _prefixes(hashes)
        part.known.update(new)
        part.chunks.append((now, new))
        part.hi = base + count - 1
        self.entries += len(new)
        self._expire(part, now - window_s - CLOCK_MARGIN_S)
        while self.entries > self.max_entries and self._parts:
            self._drop(next(iter(self._parts)))

    def _expire(self, part: _Partition, before: float) -> None:
        while part.chunks and part.chunks[0][0] < before:
            _, old = part.chunks.popleft()
            part.known.difference_update(old)
            self.entries -= len(old)

    def _drop(self, key: Key) -> None:
        part = self._parts.pop(key, None)
        if part is not None:
            self.entries -= sum(len(c) for _, c in part.chunks)
