"""Layer-1 deduplication knowledge of one shard: which transaction hashes its partitions hold.

``log_push_one_v1`` probes every stored hash of the partition inside the dedup window above
``p_verified``; with ``p_verified = 0`` that is every segment of the last hour, so the probe of a
busy partition grows with its depth (0.66 ms a segment at 400 segments, bench/README.md). The
shard writes its partitions' segments itself, one flush in flight per partition, so it can
remember what it wrote and promise the procedure "offsets up to ``v`` hold none of these
hashes": the probe then reads only what lies above ``v``, usually nothing.

The promise must cover every offset up to ``v`` inside the window. Offsets the shard did not
write (before it first saw the partition: a restart, an eviction; or in between its own, by a
transaction, a timer or another broker instance) are a gap: the promise stops below it until
the shard has read back the stored hashes of the gap (``wanted`` / ``recalled``: one read of
what the gap holds instead of every later push probing it), or until the gap is older than
the queue's window (plus a clock margin).

Storage. The shard keeps a 32-bit fingerprint of each hash (its first 4 bytes), in runs kept
in the order of their first offset: the newest few in a set (up to ``HOT_MAX``), the rest in
sorted numpy arrays merged like a binary counter, never across epochs (``window / EPOCHS``
seconds of commits), so that a whole run leaves when its epoch leaves the window: an entry
costs 4 bytes (3 in a closed epoch's run of ``PACK_MIN`` or more, and in an open epoch's
run big against the segments that probe it: ``_Run``) and is forgotten at most an
epoch late, never early. A fingerprint is not the hash: a match only means "maybe", and the
promise then stops below the lowest matching run, so SQL probes that run and the newer ones
instead of the whole window. At a few thousand entries a partition, a 1,000-hash segment meets
a stray match about once in a thousand.

Past ``max_entries`` in memory, the runs of ``SPILL_MIN`` fingerprints or more of the least
recently pushed partitions go to a local file (``SpillFile``): such a partition stays known,
and a probe or a merge reads its runs back (one ``pread`` a run, from the page cache) where
SQL would probe the partition's whole window. Runs merged with a spilled one are spilled
again, so what went out stays out. Once the file is full (or off), or no partition has a run
left to spill, whole partitions are dropped, least recently pushed first. While the
filter is nearly full (``ADMIT_SHARE`` of the bound) and, with a spill file, for ``AGE_S``
seconds after the bound last dropped a partition, a partition first seen or dropped is
taken in (its gap read back) only once it was pushed more often than the least recently
pushed one held (both counts halve every ``AGE_S`` seconds): otherwise its
pushes probe their window in SQL. Until issue 26 every partition pushed was taken in, so under
pushes going round over more partitions than fit, the one dropped was exactly the one pushed
next, and every push probed its whole window and then read it back (``bench.dedupfilter
--past-budget``); now a stable subset stays known, a busy partition still gets in at once and
idle ones give way as their counts halve.
"""

from __future__ import annotations

import struct
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from queen_mp.shards.dedupspill import MIN_SLOT, SpillFile
from queen_mp.wire.hashing import hash_prefixes

__all__ = ["DedupFilter", "Recall"]

Key = tuple[bytes, str, str]  # tenant, queue, partition
CLOCK_MARGIN_S = 60.0  # broker and PostgreSQL clocks may disagree this much
EPOCHS = 8  # epochs per window: runs leave the filter at most window / EPOCHS late
HOT_MAX = 32  # newest fingerprints of a partition kept in a set before they become a run
# A gap wider than this many offsets (16 bytes a hash to read) is not read back: it is known
# once it left the window, as every gap was before read-backs.
MAX_GAP_READ_BACK = 1 << 20
# Above this share of the bound a partition is taken in only in place of a less pushed one:
# one dropped for room does not make room for the next one seen (each reads its window back).
ADMIT_SHARE = 7 / 8
# Push counts halve this often. PERF(filter): by the clock each bundle reads anyway; a count
# of commits cost 580 instructions a 1-item segment (callgrind, bench.dedupfilter 1:10000).
AGE_S = 60.0
TIDY_VISITS = 512  # partitions ``tidy`` visits a call (a heartbeat)
_FEW = 8  # segments of up to this many hashes are probed fingerprint by fingerprint
# An array probe of fewer hashes than _FEW_PACKED + n // _FEW_PACKED_PER looks each one up in a
# closed packed run of n (``_Run.holds_few``) instead of decoding the run: a decode costs some
# 6 us at 900 entries, 18 at 20,000, a lookup 0.4-0.5 us a hash (timeit, bench/README.md)
_FEW_PACKED = 16
_FEW_PACKED_PER = 1024

_U32 = np.dtype("=u4")  # native order: the filter lives in one process
_LE16, _LE32 = np.dtype("<u2"), np.dtype("<u4")  # a packed run's layout (see _Run)
_TOPS = np.arange(256, dtype=_U32) << 24
_TAB_BYTES = 2 * 257
_BUCKET = struct.Struct("<HH").unpack_from
PACK_MIN = 512  # runs of this many fingerprints or more are packed (see _Run)
SPILL_MIN = MIN_SLOT >> 2  # runs of this many fingerprints or more may go to the spill file
# A run of the open epoch is packed too when a merge for a segment of PACK_OPEN_SEGMENT hashes
# or more makes it of PACK_OPEN_MIN to PACK_OPEN_RATIO times the segment's fingerprints, and
# made plain again when a probe of fewer hashes than either meets it (see _Run).
PACK_OPEN_MIN = 4096
PACK_OPEN_RATIO = 16
PACK_OPEN_SEGMENT = 512
# PERF(filter): the fingerprints of k < HOT_MAX hashes as a tuple of ints in one C call (a
# struct layout per k, made once): ``hash_prefixes`` took a memoryview, a cast, a slice and a
# list, twice for every segment (probe and commit)
_FEW_FPS = [struct.Struct("=" + "I12x" * k).unpack for k in range(HOT_MAX)]
# numpy's C count of the true elements: ``np.count_nonzero`` wraps it in a Python frame
try:
    from numpy._core.multiarray import count_nonzero as _count_nonzero
except ImportError:  # numpy 1.x
    _count_nonzero = np.count_nonzero


def _fingerprints(hashes: bytes) -> np.ndarray:
    """The first 4 bytes of each 16-byte hash, as a compact array of its own (the runs' form
    of ``hash_prefixes(hashes, 4)``, which the set side uses)."""
    # PERF(filter): one strided view, not a view and its slice: 7.9k -> 6.5k instructions for
    # 100 hashes (callgrind, a loop of 10,000 in operator.call)
    return np.ndarray((len(hashes) >> 4,), _U32, hashes, 0, (16,)).copy()


class _Run:
    """Sorted fingerprints of commits of one epoch, none at an offset below ``lo``.

    A run of a closed epoch (sealed, or read back) of ``PACK_MIN`` to 65,535 fingerprints is
    ``packed`` in 3 bytes an entry: their top byte is implicit in a table of where each top
    byte's entries start (257 little-endian u16), then come the low 3 bytes of each,
    little-endian, then a pad byte (a decode reads 4 bytes at each record). PERF(memory): the
    1,000 partitions of the suite's push cells hold runs of some 2,000 fingerprints each
    (bench.dedupfilter --pss at 8M entries), where 4 bytes an entry were 32 MB of the shard;
    fewer than 32 bits would make stray matches, and so SQL probes, twice as likely a bit
    dropped. Smaller runs stay a plain array (``plain``): the table would outweigh the byte
    saved, and a 1-item push probes them inline with ``bisect``. A probe reads a closed
    packed run hash by hash (``holds_few``) when it looks for fewer than ``_FEW_PACKED`` + n /
    ``_FEW_PACKED_PER`` hashes, and decodes it (a transient copy) otherwise.

    A run of the open epoch is packed when a merge for a segment of ``PACK_OPEN_SEGMENT``
    hashes or more makes it of ``PACK_OPEN_MIN`` or more and at most ``PACK_OPEN_RATIO`` times
    that segment (``pack``), and made plain again by an array probe of fewer hashes than
    either asks (``decoded_for``; a probe of up to ``_FEW`` reads it packed): an array probe
    decodes a packed run, some 1.5 instructions an entry and a few numpy calls, so no probe
    decodes more than ``PACK_OPEN_RATIO`` entries a hash it looks for. PERF(memory): the
    suite's peak is in its 1,000-item push cells, the filter at its 8M bound in one open
    epoch, every run plain before (bench.dedupfilter --pss --rate 150000 --cases
    1:400000,10:600000,100:1500000,1000:5500000: anonymous pages +37.2 -> +31.7 MB, PSS
    +38.0 -> +32.6 MB at 8M entries, twice each alternated). PERF(filter): 1,000-item segments
    pay the decodes and the packing (callgrind, bench.dedupfilter --partitions 250 --cases
    1000:2000000: 445.4M -> 497.1M instructions, +52 a message); 100-item ones, whose runs
    stay plain, 1,535.3M -> 1,545.6M (--cases 100:2000000). PACK_OPEN_MIN 1,024 saved 1-2 MB
    more but cost 681.6M there;
    packing every run of 512 or more, open ones too, cost 516k -> 1,260k instructions a
    1,000-item segment (1000:8000000).
    """

    __slots__ = ("at", "closed", "epoch", "lo", "n", "packed", "plain", "store", "view")

    def __init__(self, epoch: int, lo: int, fps: np.ndarray, closed: bool = False,
                 pack: bool = False) -> None:
        self.epoch = epoch
        self.lo = lo
        self.closed = closed
        self.store: SpillFile | None = None  # where the run lies when spilled (``spill``)
        n = self.n = len(fps)
        if (closed or pack) and PACK_MIN <= n < 1 << 16:
            # PERF(filter): written in place, two C calls: each top byte's start by a binary
            # search of the sorted run, and the records as 4-byte little-endian writes 3 bytes
            # apart in ascending order (numpy's strided copy; the unit tests decode every
            # layout back), each one's top byte overwritten by the next record (the last
            # one's lands in the pad). A bincount, a strided copy of the low 3 bytes and a
            # join cost 87k instructions more a 1,000-item segment once open runs were packed
            # (bench.dedupfilter --partitions 250 --cases 1000:2000000: 586.4M -> 499.2M).
            packed = bytearray(_TAB_BYTES + 3 * n + 1)
            self.packed: bytearray | None = packed  # bytes' find, without a copy to bytes
            tab = np.frombuffer(packed, _LE16, 257)
            tab[:256] = fps.searchsorted(_TOPS)
            tab[256] = n
            np.ndarray((n,), _LE32, packed, _TAB_BYTES, (3,))[...] = fps
            self.plain: np.ndarray | None = None
            self.view: memoryview | None = None
        else:
            self.packed = None
            self.plain = fps
            # PERF(memory): made by the first probe of a few hashes (``lowest_match``), which
            # alone reads it: the runs of multi-item pushes never need one. bench.dedupfilter
            # --pss --rate 150000: anonymous pages at 8M entries +37.33 -> +36.31 MB, after
            # the 1,000-item case +32.66 -> +31.54 (twice each, alternated); instructions
            # (callgrind, PYTHONHASHSEED=0) --cases 1:200000 2,923.4M -> 2,916.3M, 10:200000
            # 687.0M -> 676.8M, --partitions 250 --cases 100:2000000 1,545.6M -> 1,511.2M,
            # 1000:2000000 497.2M -> 493.9M (no memoryview made a run)
            self.view = None

    def fps(self) -> np.ndarray:
        """The fingerprints, ascending (a packed or spilled run's: a transient copy)."""
        if self.plain is not None:
            return self.plain
        packed = self.packed
        if packed is None:
            return np.frombuffer(self.spilled(), _U32)
        starts = np.frombuffer(packed, _LE16, 257)
        full = np.ndarray((self.n,), _LE32, packed, _TAB_BYTES, (3,)) & 0xFFFFFF
        # PERF(filter): C calls only (``np.diff`` and ``np.repeat`` are Python functions):
        # 10.3 -> 6.9 us a run of 2,000 (timeit), decoded for every probe of a multi-item
        # segment
        full |= _TOPS.repeat(starts[1:] - starts[:-1])
        return full

    def spilled(self) -> bytes:
        """A spilled run's fingerprints read back, as their native 4-byte ints."""
        store = self.store
        assert store is not None
        return store.get(self.at, self.n)

    def spill(self, store: SpillFile) -> bool:
        """Move the fingerprints to ``store``; whether they went (else they stay here)."""
        at = store.put(np.ascontiguousarray(self.fps()))
        if at < 0:
            return False
        self.at, self.store = at, store
        self.plain = self.packed = self.view = None
        return True

    def release(self) -> None:
        """Free a spilled run's slot: the run left the filter or was merged into another."""
        if self.store is not None:
            self.store.free(self.at, self.n)
            self.store = None

    def decoded_for(self, m: int) -> np.ndarray:
        """A packed run's fingerprints for an array probe of ``m`` hashes (``lowest_match``),
        kept plain from then on if the run is open and ``m`` smaller than it was packed for."""
        fps = self.fps()
        if not self.closed and (self.n > PACK_OPEN_RATIO * m or m < PACK_OPEN_SEGMENT):
            # smaller segments than this open run was packed for: plain again, so that a
            # probe decodes at most PACK_OPEN_RATIO entries a hash, and a decode's fixed
            # cost is shared by PACK_OPEN_SEGMENT hashes or more
            self.plain, self.packed = fps, None
        return fps

    def holds_few(self, ints: Iterable[int]) -> bool:
        """Whether a packed run holds one of these fingerprints: each looked for among the
        records of its top byte (``bytes.find``, a hit counting only at a record's start)."""
        packed = self.packed
        assert packed is not None
        for v in ints:
            a, e = _BUCKET(packed, (v >> 24) << 1)
            if a == e:
                continue
            rest, end = (v & 0xFFFFFF).to_bytes(3, "little"), _TAB_BYTES + 3 * e
            at = packed.find(rest, _TAB_BYTES + 3 * a, end)
            while at >= 0 and (at - _TAB_BYTES) % 3:
                at = packed.find(rest, at + 1, end)
            if at >= 0:
                return True
        return False


class _Partition:
    __slots__ = ("gaps", "held", "hi", "hot", "hot_epoch", "hot_lo", "pid", "probed", "pushes",
                 "runs", "span", "window")

    def __init__(self, pid: int, window: int, pushes: int) -> None:
        self.pid = pid
        self.pushes = pushes  # commits, halved every so often: who may take its place
        self.window = window
        self.span = max(1.0, window / EPOCHS)
        self.hi = 0
        self.hot: set[int] = set()  # fingerprints of offsets hot_lo .. hi, epoch hot_epoch
        self.hot_lo = 0
        self.hot_epoch = 0
        self.runs: list[_Run] = []  # ascending offsets: oldest first
        self.held = 0
        self.gaps: dict[int, tuple[int, float]] = {}  # first offset -> (last, known after)
        # the last probe's hash blob and its fingerprints, sorted, for its commit (``add``)
        self.probed: tuple[bytes, np.ndarray] | None = None

    def known_to(self, now: float) -> int:
        """The highest offset below every gap that is still unknown: where promises stop."""
        limit = self.hi
        for lo, (_, after) in list(self.gaps.items()):
            if now >= after:
                del self.gaps[lo]  # its rows left the window: nothing to know any more
            else:
                limit = min(limit, lo - 1)
        return limit

    def lowest_match(self, hashes: bytes) -> int:
        """The lowest first offset of a run that may hold one of these hashes; 0 if none.

        PERF(filter): a handful of fingerprints is probed here, inline, run by run: ``bisect``
        over each run's view (0.37 us against 1.6 for numpy's scalar ``searchsorted`` and its
        scalar compare at 3,000 entries, which cost 7.1 against 2.0 us for the array probe's four
        numpy calls); a method call per run and the prefixes' helper cost more than the
        probe itself on a 1-hash segment.

        PERF(filter): ``HOT_MAX`` or more fingerprints are sorted first, and kept for the
        segment's commit (``add``: one flush of a partition is in flight at a time, so its next
        commit is this segment's, or one of other hashes that makes its own): sorted keys walk
        each run's binary search in order, out of cache less often (100 keys against 2,000
        runs of 4,000: 10.0 us a run unsorted, 7.0 sorted with the sort, timeit), and the
        commit sorts nothing again.

        PERF(filter): a closed epoch's packed run met by an array probe of a few more than
        ``_FEW`` hashes is read packed, hash by hash (``_Run.holds_few``), not decoded whole:
        past the first epoch every probe meets up to ``EPOCHS`` sealed runs, each decoded
        for it (some 6 us for 900 entries). bench.dedupfilter --partitions 1000 --rate 2000
        --cases 10:16000000 (the window's steady state), alternated: 97.2, 105.2 -> 71.5,
        73.8 us a 10-item segment; 100 and 1,000-item segments, whose probes still decode,
        unchanged (bench/README.md)."""
        runs = self.runs
        if len(hashes) > 16 * _FEW:
            m = len(hashes) >> 4
            if runs:
                incoming = _fingerprints(hashes)
                if m >= HOT_MAX:  # fewer are remembered in the hot set
                    incoming.sort()
                    self.probed = (hashes, incoming)
                ints: list[int] | None = None
                for run in runs:  # oldest first: the first match is the lowest
                    fps = run.plain
                    if fps is None:
                        if run.packed is None:  # spilled: read back, not kept
                            fps = run.fps()
                        elif run.closed and m < _FEW_PACKED + run.n // _FEW_PACKED_PER:
                            if ints is None:
                                ints = incoming.tolist()
                            if run.holds_few(ints):
                                return run.lo
                            continue
                        else:
                            fps = run.decoded_for(m)
                    # PERF(filter): four C calls (the array's own ``searchsorted`` and
                    # ``take``, ``==``, ``count_nonzero``), no Python frame of numpy's:
                    # ``np.searchsorted`` and ``.any()`` go through Python wrappers, and the
                    # index was clipped by a ufunc and gathered by fancy indexing; 6.7 -> 2.9
                    # us a probe of 100 against 2,000 (timeit). Inline, not a method of the
                    # run: a Python frame less a run probed (see _add_run for the count)
                    if _count_nonzero(fps.take(fps.searchsorted(incoming), mode="clip")
                                      == incoming):
                        return run.lo
            # PERF(filter): fewer than HOT_MAX hashes (the only ones that meet a hot set, but
            # for a partition whose segment sizes change) as one struct unpack: 3.0k against
            # hash_prefixes' 6.2k instructions for 10 hashes (callgrind, a loop of 10,000);
            # bench.dedupfilter --bundle 17 --rate 150000 --cases 10:2000000 7,962.5M -> 7,739.3M
            if self.hot and not self.hot.isdisjoint(
                    _FEW_FPS[m](hashes) if m < HOT_MAX else hash_prefixes(hashes, 4)):
                return self.hot_lo
            return 0
        ints = _FEW_FPS[len(hashes) >> 4](hashes)
        for run in runs:
            view = run.view
            if view is None:
                if run.plain is not None:
                    view = run.view = memoryview(run.plain)  # the same memory, as Python ints
                elif run.packed is None:  # spilled: read back, not kept
                    view = memoryview(run.spilled()).cast("I")
                else:
                    if run.holds_few(ints):
                        return run.lo
                    continue
            n = len(view)
            for v in ints:
                at = bisect_left(view, v)
                if at < n and view[at] == v:
                    return run.lo
        if self.hot and not self.hot.isdisjoint(ints):
            return self.hot_lo
        return 0

    def add(self, base: int, hashes: bytes, now: float) -> int:
        """Remember the segment at offsets ``base ..``; how many fingerprints that adds."""
        epoch = int(now // self.span)
        big = len(hashes) >= 16 * HOT_MAX
        if self.hot and (big or self.hot_epoch != epoch):
            self.flush_hot()
        if big:
            probed, self.probed = self.probed, None
            if probed is not None and probed[0] is hashes:
                fps = probed[1]  # lowest_match's, sorted
            else:
                fps = _fingerprints(hashes)
                fps.sort()
            self._add_run(epoch, base, fps)
            return len(fps)
        if not self.hot:
            self.hot_lo, self.hot_epoch = base, epoch
        self.hot.update(_FEW_FPS[len(hashes) >> 4](hashes))
        if len(self.hot) >= HOT_MAX:
            self.flush_hot()
        return len(hashes) >> 4

    def fill_gap(self, lo: int, rows: Sequence[tuple[int, float, bytes]], now: float) -> int:
        """Remember the stored segments of the gap at ``lo``, ``(base, age_s, hashes)``
        ascending, one run per epoch (of ``now - age``: never before their commit), in offset
        order among the runs; how many fingerprints that adds."""
        del self.gaps[lo]
        epochs: list[tuple[int, int, list[bytes]]] = []  # (epoch, first base, hash blobs)
        for base, age, hashes in rows:
            epoch = int((now - age) // self.span)
            if epochs and epochs[-1][0] == epoch:
                epochs[-1][2].append(hashes)
            else:
                epochs.append((epoch, base, [hashes]))
        filled = []
        for epoch, first, blobs in epochs:
            fps = _fingerprints(b"".join(blobs))  # one array an epoch, not one per row
            fps.sort()
            filled.append(_Run(epoch, first, fps, closed=True))
        at = bisect_left(self.runs, lo, key=lambda r: r.lo)
        self.runs[at:at] = filled
        return sum(r.n for r in filled)

    def flush_hot(self) -> None:
        if not self.hot:
            return
        fps = np.fromiter(self.hot, dtype=_U32, count=len(self.hot))
        self.hot = set()
        fps.sort()
        self._add_run(self.hot_epoch, self.hot_lo, fps)

    def _add_run(self, epoch: int, lo: int, fps: np.ndarray) -> None:
        """A run of these sorted fingerprints from offset ``lo`` on, merged like a binary
        counter: the newest run of its epoch takes in the one before while that one holds
        less than twice as many.

        PERF(filter): the cascade of merges made as one: a concatenation and a sort of every
        run it takes in (numpy's stable sort merges their sorted runs), and no run object for
        a segment that merges at once; the runs made are the same. With the inline probe
        (``lowest_match``) and ``_fingerprints``' one view, callgrind (PYTHONHASHSEED=0,
        bench.dedupfilter --bundle 17 --rate 150000 --cases 100:2000000): 1,126.7M ->
        1,024.1M instructions, 112.7k -> 102.4k a segment."""
        runs = self.runs
        if runs and runs[-1].epoch != epoch:
            self._seal()
        n = size = len(fps)
        k = len(runs)
        while k and runs[k - 1].epoch == epoch and runs[k - 1].n < 2 * size:
            k -= 1
            size += runs[k].n
        if k == len(runs):
            runs.append(_Run(epoch, lo, fps))
            return
        # the largest open run packed (see PACK_OPEN_MIN): none for small segments
        most = PACK_OPEN_RATIO * n if n >= PACK_OPEN_SEGMENT else 0
        gone = runs[k:]
        taken = [r.fps() for r in gone]
        taken.append(fps)
        merged = np.concatenate(taken)
        merged.sort(kind="stable")  # sorted runs: a merge
        store = _spilled_among(gone)
        if store is None:
            # positional: keywords cost the call a dict
            runs[k:] = [_Run(epoch, gone[0].lo, merged, False, PACK_OPEN_MIN <= size <= most)]
        else:
            runs[k:] = [_spilled_again(_Run(epoch, gone[0].lo, merged), gone, store)]

    def _seal(self) -> None:
        """One run for the newest epoch, now closed (packed if big enough): a probe then
        searches one run an epoch."""
        runs = self.runs
        epoch = runs[-1].epoch
        k = len(runs) - 1
        while k > 0 and runs[k - 1].epoch == epoch:
            k -= 1
        if k < len(runs) - 1:
            gone = runs[k:]
            merged = np.concatenate([r.fps() for r in gone])
            merged.sort()
            store = _spilled_among(gone)
            if store is None:
                runs[k:] = [_Run(epoch, gone[0].lo, merged, closed=True)]
            else:
                run = _spilled_again(_Run(epoch, gone[0].lo, merged), gone, store)
                run.closed = True
                runs[k:] = [run]
        elif runs[k].plain is not None and runs[k].n >= PACK_MIN:
            runs[k] = _Run(epoch, runs[k].lo, runs[k].fps(), closed=True)
        else:
            runs[k].closed = True  # packed while open, spilled or too small: stays as it is

    def spill(self, store: SpillFile) -> bool:
        """Move the runs of ``SPILL_MIN`` fingerprints or more out to ``store`` (the newest
        ones, smaller, and the hot set stay); False if the file refused one."""
        for run in self.runs:
            if run.store is None and run.n >= SPILL_MIN and not run.spill(store):
                return False
        return True

    def spillable(self) -> bool:
        """Whether the newest run could go to the spill file (what a commit or a seal made)."""
        runs = self.runs
        return bool(runs) and runs[-1].n >= SPILL_MIN and runs[-1].store is None

    def release(self) -> None:
        """Free the slots of the spilled runs: the partition left the filter."""
        for run in self.runs:
            run.release()

    def close(self, now: float, before: float) -> int:
        """What the next push would do to an ended epoch, done for a partition not pushed
        since: its hot set becomes a run, the newest epoch's runs one sealed (packed) run, the
        runs that left the window go; how many entries left."""
        epoch = int(now // self.span)
        self.probed = None  # a probe whose bundle failed
        if self.hot and self.hot_epoch != epoch:
            self.flush_hot()
        if self.runs and self.runs[-1].epoch != epoch:
            self._seal()
        return self.expire(before)

    def expire(self, before: float) -> int:
        """Forget the runs whose epoch ended before ``before``; how many entries that was."""
        gone = 0
        span = self.span
        runs = self.runs
        while runs and (runs[0].epoch + 1) * span < before:
            run = runs.pop(0)
            run.release()
            gone += run.n
        # The set never needs it: add() turned it into a run when its epoch ended.
        return gone


def _spilled_among(runs: list[_Run]) -> SpillFile | None:
    """The spill file of the first spilled one of these runs; None if all are in memory."""
    for run in runs:
        if run.store is not None:
            return run.store
    return None


def _spilled_again(run: _Run, gone: list[_Run], store: SpillFile) -> _Run:
    """The merge of ``gone``, some of them spilled, spilled in their place: what went out of
    memory stays out (it stays in memory only if the file is full)."""
    for g in gone:
        g.release()
    run.spill(store)
    return run


class Recall(NamedTuple):
    """A read-back the filter asks for: ``pid``'s stored hashes at offsets ``lo .. below - 1``
    of the last ``secs`` seconds, handed back to ``recalled`` with ``part`` as the receipt."""

    key: Key
    part: _Partition
    pid: int
    lo: int
    below: int
    secs: int


class DedupFilter:
    """``entries`` counts the fingerprints held, in memory and spilled; ``max_entries`` bounds
    those in memory (``entries - spilled``)."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic,
                 spill: SpillFile | None = None) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self.entries = 0
        self._store = spill if spill is not None else SpillFile(None, 0)
        # partitions with a run in memory that could be spilled, least recently pushed first
        self._spillable: OrderedDict[Key, _Partition] = OrderedDict()
        # With a spill file, partitions are taken in freely until the bound forgets some
        # (the file full, or nothing left to spill): the admission rule then holds for AGE_S.
        self._forgetting_until = 0.0
        self._admit_below = max(1, int(max_entries * ADMIT_SHARE))
        self._parts: OrderedDict[Key, _Partition] = OrderedDict()  # least recently pushed first
        self._refused: dict[Key, int] = {}  # push counts of partitions not held
        self._age_due = clock() + AGE_S
        self._wanted: OrderedDict[tuple[Key, int], _Partition] = OrderedDict()
        self._closing: list[Key] = []  # partitions ``tidy`` has yet to visit this round
        self._close_due = clock() + AGE_S

    @property
    def spilled(self) -> int:
        """Of ``entries``, those in the spill file."""
        return self._store.entries

    def verified(self, key: Key, hashes: bytes) -> int:
        """``p_verified`` for a segment of these hashes: the highest offset up to which the
        shard knows every stored hash of the window and none of these may be among them."""
        return self.verified_all((key,), (hashes,))[0]

    def verified_all(self, keys: Sequence[Key], hashes: Sequence[bytes]) -> list[int]:
        """``verified`` of each segment of a bundle (PERF(filter): one call a bundle, not one
        a segment: a call was most of a 1-item segment's cost here)."""
        parts = self._parts
        now = None
        out: list[int] = []
        for key, blob in zip(keys, hashes, strict=True):
            part = parts.get(key)
            if part is None:
                out.append(0)
                continue
            if part.gaps:
                if now is None:
                    now = self.clock()
                limit = part.known_to(now)
            else:
                limit = part.hi
            if limit <= 0:
                out.append(0)
                continue
            if len(blob) == 16 and not part.runs:
                # PERF(filter): one hash and no runs (a partition of 1-item pushes) probed
                # here: lowest_match's call and loop were most of this segment's cost
                hot = part.hot
                lowest = part.hot_lo if hot and _FEW_FPS[1](blob)[0] in hot else 0
            else:
                lowest = part.lowest_match(blob)
            out.append(limit if lowest == 0 else min(limit, lowest - 1))
        return out

    def committed(self, key: Key, pid: int, base: int, count: int, hashes: bytes,
                  window_s: int) -> None:
        """A segment of ours was stored at ``base .. base + count - 1``."""
        self.committed_all(((key, pid, base, count, hashes, window_s),))

    def committed_all(self, stored: Iterable[tuple[Key, int, int, int, bytes, int]]) -> None:
        """``committed`` of each ``(key, pid, base, count, hashes, window_s)`` a bundle stored
        (PERF(filter): one call a bundle)."""
        if self.max_entries == 0:
            return  # the filter is off: every push probes the whole window
        now = self.clock()
        parts = self._parts
        store = self._store
        for key, pid, base, count, hashes, window_s in stored:
            if window_s <= 0:
                self._drop(key)  # no probe at all: nothing to remember
                continue
            part = parts.get(key)
            if part is None or part.pid != pid or base <= part.hi or window_s > part.window:
                # First sight, a recreated partition, or a longer window than the one entries
                # were forgotten by: everything below `base` is a gap.
                self._drop(key)
                if (self.entries - store.entries >= self._admit_below
                        and (not store.max_bytes or now < self._forgetting_until)
                        and not self._admit(key)):
                    continue  # not remembered: its pushes probe in SQL
                part = parts[key] = _Partition(pid, window_s, self._refused.pop(key, 0) + 1)
            else:
                parts.move_to_end(key)
                part.window = window_s
                part.pushes += 1
            if base > part.hi + 1:  # written by someone else
                part.flush_hot()
                lo = part.hi + 1
                part.gaps[lo] = (base - 1, now + window_s + CLOCK_MARGIN_S)
                self._wanted[(key, lo)] = part
            hot = part.hot
            if (len(hashes) == 16 and hot and len(hot) < HOT_MAX - 1
                    and part.hot_epoch == int(now // part.span)):
                # PERF(filter): add's common case for one hash (a 1-item push), without its
                # call: the set gains at most one fingerprint and stays under HOT_MAX
                hot.add(_FEW_FPS[1](hashes)[0])
                added = 1
            else:
                added = part.add(base, hashes, now)
                if part.spillable():
                    self._spillable[key] = part
                    self._spillable.move_to_end(key)
            part.hi = base + count - 1
            # PERF(filter): the calls only when there is something to do (most segments: none)
            runs = part.runs
            if runs and (runs[0].epoch + 1) * part.span < now - window_s - CLOCK_MARGIN_S:
                added -= part.expire(now - window_s - CLOCK_MARGIN_S)
            part.held += added
            self.entries += added
            if self.entries - store.entries > self.max_entries:
                self._bound()
        if now >= self._age_due:
            self._age(now)

    def tidy(self, visits: int = TIDY_VISITS) -> int:
        """Close the ended epochs of partitions not pushed since (``_Partition.close``), a
        round every ``AGE_S``, up to ``visits`` partitions a call; how many entries left.

        PERF(memory): a partition seals its newest epoch only when pushed in the next one, so
        the partitions of a load that ended kept their last epoch unsealed - plain arrays of 4
        bytes an entry in runs merged like a binary counter, and a set of up to ``HOT_MAX``
        ints - until pushed again or dropped for room: bench/suite.py's push cells leave
        their 1,000 partitions so, and every later section carried them. Called from the
        shard's heartbeat: a round of 100,000 partitions takes some 200 beats, none of them
        long (a visit without work is a few attribute reads)."""
        now = self.clock()
        if not self._closing:
            if now < self._close_due or not self._parts:
                return 0
            self._close_due = now + AGE_S
            self._closing = list(self._parts)
        before = now - CLOCK_MARGIN_S
        parts = self._parts
        closing = self._closing
        gone = 0
        for key in closing[-visits:]:
            part = parts.get(key)
            if part is not None:
                left = part.close(now, before - part.window)
                part.held -= left
                gone += left
                if part.spillable():  # its epoch sealed: one run now, maybe big
                    self._spillable[key] = part
        del closing[-visits:]
        self.entries -= gone
        return gone

    def tidying(self) -> bool:
        """Whether a round of ``tidy`` is under way."""
        return bool(self._closing)

    def wanted(self, limit: int) -> list[Recall]:
        """Read-backs of gaps, each asked once, up to ``limit`` offsets together (at least
        one gap)."""
        out: list[Recall] = []
        total = 0
        while self._wanted and (not out or total < limit):
            (key, lo), part = self._wanted.popitem(last=False)
            gap = part.gaps.get(lo)
            if (self._parts.get(key) is part and gap is not None
                    and gap[0] + 1 - lo <= MAX_GAP_READ_BACK):
                out.append(Recall(key, part, part.pid, lo, gap[0] + 1,
                                  int(part.window + CLOCK_MARGIN_S) + 1))
                total += gap[0] + 1 - lo
        return out

    def recalled(self, recall: Recall, rows: Sequence[tuple[int, float, bytes]]) -> None:
        """The answer to ``recall``: every stored segment of its gap inside the window. Void if
        the partition started over or the gap aged out meanwhile."""
        part = self._parts.get(recall.key)
        if part is not recall.part or part is None or recall.lo not in part.gaps:
            return
        added = part.fill_gap(recall.lo, rows, self.clock())
        part.held += added
        self.entries += added
        self._spillable[recall.key] = part  # the runs read back may be big
        self._bound()

    def unrecalled(self, recall: Recall) -> None:
        """``recall`` failed: ask again with the next ones."""
        if self._parts.get(recall.key) is recall.part and recall.lo in recall.part.gaps:
            self._wanted[(recall.key, recall.lo)] = recall.part

    def _admit(self, key: Key) -> bool:
        """Whether a partition not held may take the place of the least recently pushed one
        (then dropped): only once pushed clearly more often."""
        seen = self._refused.get(key, 0) + 1
        least, part = next(iter(self._parts.items()))  # entries held: not empty
        if seen <= 2 * part.pushes + 2:
            self._refused[key] = seen
            return False
        self._drop(least)
        return True

    def _age(self, now: float) -> None:
        """Halve every push count (forgetting those at 0): pushes long ago count less."""
        for part in self._parts.values():
            part.pushes >>= 1
        self._refused = {k: c >> 1 for k, c in self._refused.items() if c > 1}
        self._age_due = now + AGE_S

    def _bound(self) -> None:
        """Big runs out to the spill file, least recently pushed partition first, and when
        there are none or the file refuses, the least recently pushed partitions forgotten,
        until the memory holds ``max_entries``."""
        parts = self._parts
        store = self._store
        spillable = self._spillable
        while self.entries - store.entries > self.max_entries and parts:
            if spillable and store.max_bytes:
                key, part = spillable.popitem(last=False)
                if part.spill(store):
                    continue
                spillable[key] = part  # the file is full: first again once it has room
                spillable.move_to_end(key, last=False)
            self._drop(next(iter(parts)))
            self._forgetting_until = self.clock() + AGE_S

    def _drop(self, key: Key) -> None:
        part = self._parts.pop(key, None)
        if part is not None:
            self._refused[key] = part.pushes
            self.entries -= part.held
            part.release()
            self._spillable.pop(key, None)
            for lo in part.gaps:
                self._wanted.pop((key, lo), None)
