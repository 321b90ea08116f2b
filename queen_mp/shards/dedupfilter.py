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

Storage. A partition keeps its newest prefixes in a small set (up to ``HOT_MAX``) and the rest
in sorted numpy runs whose sizes halve from the oldest to the newest (merged like a binary
counter), so a probe is a set test plus one vectorised binary search per run, and an entry
costs about 16 bytes (its run and its chunk, which says when it leaves the window) instead of
the ~100 of a Python set member. Entries of expired chunks leave the runs at the next rebuild
(when they are a third of what the runs hold): until then they can only make the shard send
0, never promise what it does not know.
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable

import numpy as np

from queen_mp.wire.hashing import hash_prefixes

__all__ = ["DedupFilter"]

Key = tuple[bytes, str, str]  # tenant, queue, partition
CLOCK_MARGIN_S = 60.0  # broker and PostgreSQL clocks may disagree this much
# Segments committed within this span share one chunk, stamped with its latest commit: an
# entry is then forgotten up to this much later than its own commit, never earlier.
CHUNK_SPAN_S = 1.0
HOT_MAX = 32  # newest prefixes of a partition kept in a set before they become a sorted run

_U64 = np.dtype("=u8")  # native order: the filter lives in one process


def _prefixes(hashes: bytes) -> np.ndarray:
    """The first 8 bytes of each 16-byte xxh3_128 hash, as a compact array of its own."""
    return np.frombuffer(hashes, dtype=_U64)[::2].copy()


class _Chunk:
    __slots__ = ("first", "last", "prefixes")

    def __init__(self, now: float) -> None:
        self.first = self.last = now
        self.prefixes = array("Q")  # no object per commit: 8 bytes an entry


class _Partition:
    __slots__ = ("chunks", "complete_at", "hi", "hot", "pid", "runs", "stale", "window")

    def __init__(self, pid: int, window: int, floor: int, complete_at: float) -> None:
        self.pid = pid
        self.window = window
        self.hi = floor
        self.complete_at = complete_at
        self.hot: set[int] = set()
        self.runs: list[np.ndarray] = []  # sorted, oldest and largest first
        self.stale = 0  # expired entries still in the runs
        self.chunks: deque[_Chunk] = deque()

    def holds_any(self, hashes: bytes) -> bool:
        if self.hot and not self.hot.isdisjoint(hash_prefixes(hashes)):
            return True
        if not self.runs:
            return False
        incoming = _prefixes(hashes)
        for run in self.runs:
            at = np.searchsorted(run, incoming)
            np.minimum(at, len(run) - 1, out=at)
            if (run[at] == incoming).any():
                return True
        return False

    def add(self, hashes: bytes, chunk: _Chunk) -> int:
        """Remember the prefixes of these hashes (also in ``chunk``); how many there are."""
        if len(hashes) >= 16 * HOT_MAX:
            new = _prefixes(hashes)
            chunk.prefixes.frombytes(new.tobytes())
            new.sort()
            self._add_run(new)
            return len(new)
        ints = hash_prefixes(hashes)
        chunk.prefixes.extend(ints)
        self.hot.update(ints)
        if len(self.hot) >= HOT_MAX:
            run = np.fromiter(self.hot, dtype=_U64, count=len(self.hot))
            self.hot = set()
            run.sort()
            self._add_run(run)
        return len(ints)

    def _add_run(self, run: np.ndarray) -> None:
        runs = self.runs
        runs.append(run)
        while len(runs) > 1 and len(runs[-2]) < 2 * len(runs[-1]):
            newer = runs.pop()
            merged = np.concatenate((runs.pop(), newer))
            merged.sort(kind="stable")  # two sorted runs: a linear merge
            runs.append(merged)

    def expire(self, before: float) -> int:
        """Forget the chunks that left the window; the number of entries forgotten."""
        gone = 0
        while self.chunks and self.chunks[0].last < before:
            old = self.chunks.popleft().prefixes
            gone += len(old)
            if self.hot:
                self.hot.difference_update(old)
        if gone:
            self.stale += gone
            held = sum(len(r) for r in self.runs)
            if self.stale * 3 >= held:
                self._rebuild()
        return gone

    def _rebuild(self) -> None:
        live = [np.frombuffer(c.prefixes, dtype=_U64) for c in self.chunks if c.prefixes]
        self.hot = set()
        self.runs = []
        self.stale = 0
        if live:
            run = np.concatenate(live)
            run.sort()
            self.runs.append(run)


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
        return 0 if part.holds_any(hashes) else part.hi

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
        chunk = part.chunks[-1] if part.chunks else None
        if chunk is None or now - chunk.first >= CHUNK_SPAN_S:
            chunk = _Chunk(now)
            part.chunks.append(chunk)
        chunk.last = now
        self.entries += part.add(hashes, chunk)
        part.hi = base + count - 1
        self.entries -= part.expire(now - window_s - CLOCK_MARGIN_S)
        while self.entries > self.max_entries and self._parts:
            self._drop(next(iter(self._parts)))

    def _drop(self, key: Key) -> None:
        part = self._parts.pop(key, None)
        if part is not None:
            self.entries -= sum(len(c.prefixes) for c in part.chunks)
