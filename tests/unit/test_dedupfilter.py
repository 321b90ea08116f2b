"""The shard's dedup knowledge: it may only promise what it wrote, inside the window."""

from __future__ import annotations

import random
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from queen_mp.shards.dedupfilter import (
    _FEW,
    _FEW_PACKED,
    _FEW_PACKED_PER,
    ADMIT_SHARE,
    AGE_S,
    CLOCK_MARGIN_S,
    EPOCHS,
    HOT_MAX,
    MAX_GAP_READ_BACK,
    PACK_MIN,
    PACK_OPEN_MIN,
    PACK_OPEN_RATIO,
    PACK_OPEN_SEGMENT,
    DedupFilter,
    _Run,
)
from queen_mp.shards.dedupspill import SpillFile

KEY = (b"\0" * 16, "q", "p")


def hashes(*txns: str) -> bytes:
    return b"".join(xxhash.xxh3_128_digest(t.encode()) for t in txns)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_unknown_partition_gets_no_promise() -> None:
    assert DedupFilter(100).verified(KEY, hashes("a")) == 0


def test_empty_partition_is_complete_at_once() -> None:
    f = DedupFilter(100)
    f.committed(KEY, 7, 1, 2, hashes("a", "b"), 3600)
    assert f.verified(KEY, hashes("c")) == 2
    # a hash it holds: no promise, SQL must find the original
    assert f.verified(KEY, hashes("c", "a")) == 0
    f.committed(KEY, 7, 3, 1, hashes("c"), 3600)
    assert f.verified(KEY, hashes("d")) == 3


def test_rows_before_first_sight_block_the_promise_for_a_window() -> None:
    clock = Clock()
    f = DedupFilter(100, clock)
    f.committed(KEY, 7, 51, 1, hashes("a"), 60)  # offsets 1..50 were written by others
    assert f.verified(KEY, hashes("b")) == 0
    clock.t += 60 + CLOCK_MARGIN_S + 1
    assert f.verified(KEY, hashes("b")) == 51


def test_a_gap_from_another_writer_stops_the_promise_below_it_until_read_back() -> None:
    clock = Clock()
    f = DedupFilter(100, clock)
    f.committed(KEY, 7, 1, 1, hashes("a"), 60)
    f.committed(KEY, 7, 5, 1, hashes("e"), 60)  # 2..4 written by a transaction or a timer
    assert f.verified(KEY, hashes("x")) == 1
    [ask] = f.wanted(1000)
    assert (ask.lo, ask.below) == (2, 5)
    f.committed(KEY, 7, 6, 1, hashes("f"), 60)
    f.recalled(ask, [(2, 1.0, hashes("b", "c")), (4, 0.5, hashes("d"))])
    assert f.verified(KEY, hashes("x")) == 6 and f.entries == 6
    assert f.verified(KEY, hashes("x", "c")) == 1  # the read-back run starts at 2
    assert f.verified(KEY, hashes("x", "a")) == 0


def test_a_gap_read_back_lands_below_the_runs_written_after_it() -> None:
    f = DedupFilter(1_000)
    before = [f"a{i}" for i in range(2 * HOT_MAX)]
    f.committed(KEY, 7, 1, len(before), hashes(*before), 60)
    after = [f"n{i}" for i in range(HOT_MAX)]  # a run of its own, above the gap
    gap_lo = len(before) + 1
    f.committed(KEY, 7, gap_lo + 2, len(after), hashes(*after), 60)  # gap: 2 offsets
    [ask] = f.wanted(1000)
    f.recalled(ask, [(gap_lo, 0.1, hashes("b", "c"))])
    # "c" (in the gap) and "n0" (above it): the promise stops below the gap's run
    assert f.verified(KEY, hashes("c", "n0")) == gap_lo - 1
    assert f.verified(KEY, hashes("c", "a3")) == 0  # and never above an older run's
    assert f.verified(KEY, hashes("n0")) == gap_lo + 1
    assert f.verified(KEY, hashes("z")) == gap_lo + 1 + len(after)


def test_a_gap_never_read_back_is_known_once_it_left_the_window() -> None:
    clock = Clock()
    f = DedupFilter(1_000, clock)
    f.committed(KEY, 7, 1, 1, hashes("a"), 60)
    f.committed(KEY, 7, 5, 1, hashes("e"), 60)  # 2..4 by another writer, never read back
    clock.t += 60 + CLOCK_MARGIN_S - 1
    assert f.verified(KEY, hashes("x")) == 1
    clock.t += 1
    assert f.verified(KEY, hashes("x")) == 5
    assert f.wanted(1000) == []  # nothing left to ask


def test_recreated_partition_and_longer_window_reset() -> None:
    f = DedupFilter(100)
    f.committed(KEY, 7, 1, 1, hashes("a"), 60)
    f.committed(KEY, 8, 1, 1, hashes("b"), 60)  # new partition id: the old knowledge is void
    assert f.verified(KEY, hashes("a")) == 1  # "a" belongs to the deleted partition
    f2 = DedupFilter(100, Clock())
    f2.committed(KEY, 8, 1, 1, hashes("b"), 60)
    f2.committed(KEY, 8, 2, 1, hashes("c"), 120)  # longer window: forgotten entries may count
    assert f2.verified(KEY, hashes("x")) == 0


def test_old_entries_are_forgotten_and_memory_is_bounded() -> None:
    clock = Clock()
    f = DedupFilter(3, clock)
    f.committed(KEY, 7, 1, 2, hashes("a", "b"), 10)
    clock.t += 10 + CLOCK_MARGIN_S + 10 / EPOCHS + 1  # forgotten at most an epoch late
    f.committed(KEY, 7, 3, 1, hashes("c"), 10)
    assert f.entries == 1  # a and b left the window
    other = (b"\0" * 16, "q", "other")
    f.committed(other, 9, 1, 3, hashes("x", "y", "z"), 10)
    assert f.entries <= 3 and f.verified(KEY, hashes("n")) == 0  # KEY was dropped


def test_window_zero_keeps_nothing() -> None:
    f = DedupFilter(100)
    f.committed(KEY, 7, 1, 1, hashes("a"), 0)
    assert f.entries == 0 and f.verified(KEY, hashes("a")) == 0


def test_zero_entries_turns_the_filter_off() -> None:
    f = DedupFilter(0)
    f.committed(KEY, 7, 1, 2, hashes("a", "b"), 3600)
    assert f.entries == 0 and f.verified(KEY, hashes("c")) == 0


def test_an_epoch_is_forgotten_by_its_end_never_earlier() -> None:
    clock = Clock()
    window = 80
    span = window / EPOCHS
    clock.t = 100 * span  # the start of an epoch
    f = DedupFilter(100, clock)
    f.committed(KEY, 7, 1, 1, hashes("a"), window)
    clock.t += span / 2
    f.committed(KEY, 7, 2, 1, hashes("b"), window)  # same epoch as "a"
    clock.t += window + CLOCK_MARGIN_S  # "a" is out of the window, "b" not yet
    f.committed(KEY, 7, 3, 1, hashes("c"), window)
    assert f.entries == 3 and f.verified(KEY, hashes("a")) == 0  # kept: "b" still needs it
    clock.t += span
    f.committed(KEY, 7, 4, 1, hashes("d"), window)
    assert f.entries == 2 and f.verified(KEY, hashes("a")) == 4


def test_a_match_only_withholds_the_promise_from_its_own_run_up() -> None:
    clock = Clock()
    f = DedupFilter(1_000_000, clock)
    old = [f"old{i}" for i in range(3 * HOT_MAX)]
    f.committed(KEY, 7, 1, len(old), hashes(*old), 3600)
    clock.t += 3600 / EPOCHS  # the next epoch: a run of its own
    new = [f"new{i}" for i in range(2 * HOT_MAX)]
    f.committed(KEY, 7, len(old) + 1, len(new), hashes(*new), 3600)
    hi = len(old) + len(new)
    assert f.verified(KEY, hashes("x")) == hi
    # a hash of the newer run: SQL probes from that run's first offset up, not the window
    assert f.verified(KEY, hashes("x", new[5])) == len(old)
    assert f.verified(KEY, hashes("x", old[5], new[5])) == 0


def test_every_stored_hash_is_found_in_the_set_and_in_the_runs() -> None:
    f = DedupFilter(1_000_000)
    txns = [f"t{i}" for i in range(5 * HOT_MAX + 3)]
    off = 1
    for size in (1, HOT_MAX - 1, 2, 2 * HOT_MAX, 1, 1, HOT_MAX + 1, len(txns)):
        chunk, txns = txns[:size], txns[size:]
        if not chunk:
            break
        f.committed(KEY, 7, off, len(chunk), hashes(*chunk), 3600)
        off += len(chunk)
    assert f.verified(KEY, hashes("new")) == off - 1
    for i in range(off - 1):  # t{i} is stored at offset i + 1: the promise stops below it
        assert f.verified(KEY, hashes("new", f"t{i}")) < i + 1, i


def test_a_big_segment_finds_a_stored_hash_like_a_small_one() -> None:
    """Small segments are checked fingerprint by fingerprint, big ones as arrays: both."""
    f = DedupFilter(1_000_000)
    txns = [f"t{i}" for i in range(4 * HOT_MAX)]
    for i in range(0, len(txns), HOT_MAX // 2):
        chunk = txns[i:i + HOT_MAX // 2]
        f.committed(KEY, 7, i + 1, len(chunk), hashes(*chunk), 3600)
    fresh = [f"new{j}" for j in range(2 * HOT_MAX)]
    assert f.verified(KEY, hashes(*fresh)) == len(txns)
    for i in range(len(txns)):
        assert f.verified(KEY, hashes(*fresh, f"t{i}")) < i + 1, i
        assert f.verified(KEY, hashes("new", f"t{i}")) < i + 1, i


# fingerprints at the packed layout's edges: the first and last top byte, either side of a
# top byte's boundary, the low bytes at their extremes; and two neighbours whose records'
# bytes (cc bb aa ff ee dd) hold a third's (bb aa ff: MISALIGNED) across their boundary
EDGES = (0, 1, 0xFF, 0x100, 0xFFFF, 0x10000, 0x00FFFFFF, 0x01000000, 0x12AABBCC, 0x12DDEEFF,
         0x7FFFFFFF, 0x80000000, 0xFEFFFFFF, 0xFF000000, 0xFFFFFF00, 0xFFFFFFFE, 0xFFFFFFFF)
MISALIGNED = 0x12FFAABB


def with_fps(fps: list[int]) -> bytes:
    """Hashes whose fingerprints (first 4 bytes, native order) are ``fps``."""
    rnd = random.Random(len(fps))
    return b"".join(struct.pack("=I", fp) + rnd.randbytes(12) for fp in fps)


@pytest.mark.parametrize("n", [1, PACK_MIN - 1, PACK_MIN, PACK_MIN + 1, (1 << 16) - 1, 1 << 16])
def test_a_run_keeps_its_fingerprints_exactly_packed_or_not(n: int) -> None:
    """Edge fingerprints, duplicates (one 40 times), and a whole top byte's share in one
    bucket: decoded back as they were, found by either probe, and nothing else found."""
    rnd = random.Random(n)
    fps = list(EDGES[:n]) + [0x34567890] * min(40, max(0, n - len(EDGES)))
    fps += [0x5A000000 | rnd.getrandbits(24) for _ in range(min(300, n - len(fps)))]
    while len(fps) < n:  # nothing between the two neighbours
        if (v := rnd.getrandbits(32)) >> 24 != 0x12:
            fps.append(v)
    run = _Run(3, 11, np.sort(np.array(fps, dtype=np.uint32)), closed=True)
    assert run.n == n and (run.packed is not None) == (PACK_MIN <= n < 1 << 16)
    assert run.fps().tolist() == sorted(fps)
    clock = Clock()
    f = DedupFilter(1 << 20, clock)
    f.committed(KEY, 7, 1, n, with_fps(fps), 3600)
    clock.t += 3600 / EPOCHS  # the next epoch's run seals it (packed if big enough)
    f.committed(KEY, 7, n + 1, HOT_MAX, with_fps([0x3C3C3C3C] * HOT_MAX), 3600)
    assert [r.packed is not None for r in f._parts[KEY].runs] == [run.packed is not None, False]
    held = set(fps)
    absent = [v for e in (*EDGES, MISALIGNED) for v in (e - 1, e, e + 1)
              if 0 <= v < 1 << 32 and v not in held]
    assert MISALIGNED in absent
    fresh = with_fps(absent)
    assert f.verified(KEY, fresh) == n + HOT_MAX  # none of them: everything is promised
    for v in absent:
        assert f.verified(KEY, with_fps([v])) == n + HOT_MAX, hex(v)
    for v in sorted(held)[:: max(1, len(held) // 200)] + [v for v in EDGES if v in held]:
        assert f.verified(KEY, with_fps([v])) == 0, hex(v)  # few: fingerprint by fingerprint
        assert f.verified(KEY, fresh + with_fps([v])) == 0, hex(v)  # many: as arrays


@pytest.mark.parametrize("n", [PACK_MIN, 20_000, (1 << 16) - 1])
def test_array_probes_of_every_size_read_a_closed_packed_run_alike(n: int) -> None:
    """A sealed packed run met by array probes from _FEW + 1 hashes to past the size that
    looks each one up packed (``holds_few``) instead of decoding the run: each held
    fingerprint, edges and the misaligned neighbour's included, withholds the promise, none
    of the absent ones does, and the run stays packed."""
    rnd = random.Random(n)
    fps = [v for v in EDGES if v >> 24 != 0x12] + [0x12AABBCC, 0x12DDEEFF]
    while len(fps) < n:
        if (v := rnd.getrandbits(32)) >> 24 != 0x12:
            fps.append(v)
    clock = Clock()
    f = DedupFilter(1 << 20, clock)
    f.committed(KEY, 7, 1, n, with_fps(fps), 3600)
    clock.t += 3600 / EPOCHS
    f.committed(KEY, 7, n + 1, HOT_MAX, with_fps([0x3C3C3C3C] * HOT_MAX), 3600)
    sealed = f._parts[KEY].runs[0]
    assert sealed.closed and sealed.packed is not None and sealed.n == n
    held = set(fps)
    absent = [v for e in (*EDGES, MISALIGNED) for v in (e - 1, e, e + 1)
              if 0 <= v < 1 << 32 and v not in held and v != 0x3C3C3C3C]
    promised = n + HOT_MAX
    for m in (_FEW + 1, _FEW_PACKED, _FEW_PACKED + n // _FEW_PACKED_PER,
              _FEW_PACKED + n // _FEW_PACKED_PER + 1, len(absent)):
        others = (absent * (m // len(absent) + 1))[:m - 1]
        assert f.verified(KEY, with_fps([*others, absent[-1]])) == promised, m
        for v in [0x12AABBCC, 0x12DDEEFF, *EDGES[:3], *rnd.sample(fps, 5)]:
            assert f.verified(KEY, with_fps([*others, v])) == 0, (m, hex(v))
    assert sealed.packed is not None  # read packed or decoded for the probe: still packed


def test_packed_runs_merge_seal_and_expire_like_plain_ones() -> None:
    """Segments that merge into packed runs, an epoch sealed over them, then forgotten:
    every stored hash withholds the promise from its own offset, and entries count back
    to what is still held."""
    clock = Clock()
    f = DedupFilter(1 << 20, clock)
    txns = [f"t{i}" for i in range(6 * PACK_MIN)]
    size = PACK_MIN // 2 + 7
    for i in range(0, len(txns), size):
        chunk = txns[i:i + size]
        f.committed(KEY, 7, i + 1, len(chunk), hashes(*chunk), 3600)
    assert f.entries == len(txns)
    assert [r.packed for r in f._parts[KEY].runs] == [None, None]  # the open epoch: plain
    clock.t += 3600 / EPOCHS  # a run of the next epoch seals the first into one run
    hi = len(txns) + HOT_MAX
    f.committed(KEY, 7, len(txns) + 1, HOT_MAX, hashes(*(f"l{j}" for j in range(HOT_MAX))), 3600)
    assert [(r.n, r.packed is not None) for r in f._parts[KEY].runs] == [
        (len(txns), True), (HOT_MAX, False)]
    assert f.verified(KEY, hashes("new")) == hi
    for i in range(0, len(txns), 97):
        assert f.verified(KEY, hashes("new", f"t{i}")) < i + 1, i
        assert f.verified(KEY, hashes(*(f"n{j}" for j in range(40)), f"t{i}")) < i + 1, i
    clock.t += 3600 + CLOCK_MARGIN_S + 3600 / EPOCHS
    f.committed(KEY, 7, hi + 1, 1, hashes("later"), 3600)
    assert f.entries == 1  # "later" alone: both epochs left


def test_big_segments_pack_the_open_epoch_and_smaller_probes_unpack_it() -> None:
    """Segments big enough for their merged runs to be packed while the epoch is open: every
    stored hash is found by probes of every size; a probe of fewer than PACK_OPEN_SEGMENT
    hashes makes such a run plain again (a few hashes read it packed), and the epoch's seal
    keeps what is packed."""
    clock = Clock()
    f = DedupFilter(1 << 20, clock)
    size = PACK_OPEN_SEGMENT
    assert PACK_OPEN_RATIO * size >= PACK_OPEN_MIN
    txns = [f"b{i}" for i in range(PACK_OPEN_MIN)]  # merged into one run of PACK_OPEN_MIN
    for i in range(0, len(txns), size):
        f.committed(KEY, 7, i + 1, size, hashes(*txns[i:i + size]), 3600)
    runs = f._parts[KEY].runs
    assert [(r.n, r.packed is not None, r.closed) for r in runs] == [
        (len(txns), True, False)]
    n = len(txns)
    fresh = [f"n{j}" for j in range(size)]
    assert f.verified(KEY, hashes(*fresh)) == n
    for i in range(0, n, 61):
        assert f.verified(KEY, hashes("new", f"b{i}")) < i + 1, i  # few: read packed
        assert f.verified(KEY, hashes(*fresh, f"b{i}")) < i + 1, i
    assert runs[0].packed is not None
    assert f.verified(KEY, hashes(*fresh[1:])) == n  # fewer than PACK_OPEN_SEGMENT
    assert runs[0].packed is None and runs[0].n == n  # plain again, the same fingerprints
    for i in range(0, n, 61):
        assert f.verified(KEY, hashes("new", f"b{i}")) < i + 1, i
    f.committed(KEY, 7, n + 1, size, hashes(*(f"c{j}" for j in range(size))), 3600)
    assert [(r.n, r.packed is not None) for r in runs] == [(n, False), (size, False)]
    clock.t += 3600 / EPOCHS  # the epoch ended: tidy seals both into one packed run
    tidy_round(f)
    assert [(r.n, r.packed is not None, r.closed) for r in runs] == [(n + size, True, True)]
    assert f.verified(KEY, hashes(*(f"m{j}" for j in range(40)), "b5")) < 6
    assert runs[0].packed is not None  # a closed run stays packed for any probe
    assert f.entries == n + size


def test_one_hash_commits_and_probes_across_the_set_runs_and_epochs() -> None:
    """1-item pushes (one hash a segment, the filter's inline paths): every stored hash,
    probed alone, withholds the promise from its own offset, through the set filling past
    HOT_MAX, runs and an epoch change; each commit adds one entry, a repeat too."""
    clock = Clock()
    f = DedupFilter(1_000_000, clock)
    txns = [f"one{i}" for i in range(3 * HOT_MAX + 5)]
    for i, t in enumerate(txns):
        if i == 2 * HOT_MAX + 1:
            clock.t += 3600 / EPOCHS  # a new epoch while the set holds some
        f.committed(KEY, 7, i + 1, 1, hashes(t), 3600)
        assert f.verified(KEY, hashes(f"fresh{i}")) == i + 1
        for j in range(i + 1):
            assert f.verified(KEY, hashes(txns[j])) < j + 1, (i, j)
    assert f.entries == len(txns)
    f.committed(KEY, 7, len(txns) + 1, 1, hashes(txns[-1]), 3600)  # the same hash again
    assert f.entries == len(txns) + 1
    assert f.verified(KEY, hashes(txns[-1])) < len(txns)


def tidy_round(f: DedupFilter) -> int:
    """What the shard's heartbeats do between pushes: a whole round of ``tidy`` if one is
    due; the entries it let go."""
    gone = f.tidy(visits=3)
    while f.tidying():
        gone += f.tidy(visits=3)
    return gone


def test_tidy_closes_the_ended_epoch_of_a_partition_not_pushed_since() -> None:
    """Runs merged like a binary counter and a set of fingerprints, left by the last pushes
    of an epoch: once it ended (and a round is due), ``tidy`` makes them one packed run, as
    the next push would; every hash is still found and the entries stay."""
    clock = Clock()
    f = DedupFilter(1 << 20, clock)
    others = [(b"\0" * 16, "q", f"o{i}") for i in range(5)]
    for i, key in enumerate(others):
        f.committed(key, 8 + i, 1, 1, hashes(f"o{i}"), 3600)
    txns = [f"t{i}" for i in range(3 * PACK_MIN + 5)]
    off = 1
    for i in range(0, 3 * PACK_MIN, PACK_MIN // 2):
        chunk = txns[i:i + PACK_MIN // 2]
        f.committed(KEY, 7, off, len(chunk), hashes(*chunk), 3600)
        off += len(chunk)
    for t in txns[3 * PACK_MIN:]:  # a few 1-item pushes: the set
        f.committed(KEY, 7, off, 1, hashes(t), 3600)
        off += 1
    part = f._parts[KEY]
    assert len(part.runs) > 1 and part.hot
    assert tidy_round(f) == 0  # not due: nothing happens inside the epoch
    clock.t += AGE_S
    assert tidy_round(f) == 0
    assert len(part.runs) > 1 and part.hot  # the epoch goes on: the open runs stay
    clock.t += 3600 / EPOCHS
    assert tidy_round(f) == 0
    assert [(r.n, r.packed is not None) for r in part.runs] == [(len(txns), True)]
    assert not part.hot and f.entries == len(txns) + len(others) == part.held + len(others)
    assert f.verified(KEY, hashes("new")) == off - 1
    for i, t in enumerate(txns):
        assert f.verified(KEY, hashes("new", t)) < i + 1, i
    for i, key in enumerate(others):  # the set of a 1-item partition: a run of its own
        assert f.verified(key, hashes(f"o{i}")) == 0 and not f._parts[key].hot


def test_tidy_forgets_runs_that_left_the_window_without_a_push() -> None:
    clock = Clock()
    f = DedupFilter(1 << 20, clock)
    f.committed(KEY, 7, 1, 40, hashes(*(f"t{i}" for i in range(40))), 600)
    clock.t += 600 + CLOCK_MARGIN_S + 600 / EPOCHS + AGE_S
    assert tidy_round(f) == 40
    assert f.entries == 0 and f._parts[KEY].held == 0
    assert f.verified(KEY, hashes("t3")) == 40  # forgotten only once out of the window


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 80), st.floats(0, 30), st.booleans()), min_size=1,
                max_size=40))
def test_never_a_promise_over_a_live_hash(steps: list[tuple[int, float, bool]]) -> None:
    # model: (time, offset, txn) of every commit; live = inside window + margin (+ an epoch)
    clock = Clock()
    f = DedupFilter(1_000_000, clock)
    window = 20
    span = window / EPOCHS
    log: list[tuple[float, int, str]] = []
    off = 1
    for step, (size, advance, tidy) in enumerate(steps):
        clock.t += advance
        if tidy:  # heartbeats came before this push
            tidy_round(f)
        txns = [f"s{step}-{j}" for j in range(size)]
        f.committed(KEY, 7, off, size, hashes(*txns), window)
        log += [(clock.t, off + j, t) for j, t in enumerate(txns)]
        off += size
        horizon = clock.t - window - CLOCK_MARGIN_S
        for at, stored_at, t in log[-200:]:
            if at >= horizon:  # live: its offset must never be promised away
                assert f.verified(KEY, hashes("fresh", t)) < stored_at
        assert f.verified(KEY, hashes(f"fresh-{step}")) == off - 1
        # memory: whole epochs leave, so at most one epoch more than the window is held
        assert f.entries <= sum(1 for at, _, _ in log if at >= horizon - span)


@given(st.lists(st.tuples(st.integers(1, 80), st.floats(0, 30), st.integers(1, 40)),
                min_size=1, max_size=40))
@settings(deadline=None)
def test_never_a_promise_over_a_live_hash_with_open_runs_packed(
        steps: list[tuple[int, float, int]]) -> None:
    """The model above with packing scaled down to these sizes: open runs packed by big
    segments, probed packed by few hashes and made plain again by probes of more."""
    import queen_mp.shards.dedupfilter as dedupfilter

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dedupfilter, "PACK_MIN", 16)
        mp.setattr(dedupfilter, "PACK_OPEN_MIN", 32)
        mp.setattr(dedupfilter, "PACK_OPEN_RATIO", 2)
        mp.setattr(dedupfilter, "PACK_OPEN_SEGMENT", 8)
        clock = Clock()
        f = DedupFilter(1_000_000, clock)
        window = 20
        log: list[tuple[float, int, str]] = []
        off = 1
        for step, (size, advance, probe) in enumerate(steps):
            clock.t += advance
            txns = [f"s{step}-{j}" for j in range(size)]
            f.committed(KEY, 7, off, size, hashes(*txns), window)
            log += [(clock.t, off + j, t) for j, t in enumerate(txns)]
            off += size
            horizon = clock.t - window - CLOCK_MARGIN_S
            fresh = [f"fresh{step}-{j}" for j in range(probe)]
            for at, stored_at, t in log[-100:]:
                if at >= horizon:
                    assert f.verified(KEY, hashes(*fresh, t)) < stored_at
            assert f.verified(KEY, hashes(*fresh)) == off - 1


def test_rows_before_first_sight_are_read_back_once_then_promised() -> None:
    clock = Clock()
    f = DedupFilter(1_000, clock)
    f.committed(KEY, 7, 51, 1, hashes("a"), 60)  # offsets 1..50 were written by others
    assert f.verified(KEY, hashes("b")) == 0
    [ask] = f.wanted(1000)
    assert (ask.pid, ask.lo, ask.below) == (7, 1, 51) and ask.secs > 60 + CLOCK_MARGIN_S
    assert f.wanted(1000) == []  # asked once
    older = [f"o{i}" for i in range(50)]
    rows = [(1, 30.0, hashes(*older[:10])), (11, 2.0, hashes(*older[10:]))]
    f.recalled(ask, rows)
    assert f.entries == 51
    assert f.verified(KEY, hashes("b")) == 51
    for i, t in enumerate(older):  # stored at offset i + 1: never promised away
        assert f.verified(KEY, hashes("b", t)) < i + 1
    # the read-back rows leave by their own age: the 30 s old ones first
    clock.t += 60 + CLOCK_MARGIN_S - 30 + 60 / EPOCHS + 1
    f.committed(KEY, 7, 52, 1, hashes("c"), 60)
    assert f.entries == 52 - 10
    assert f.verified(KEY, hashes("b", older[0])) == 52


def test_a_read_back_is_void_once_the_partition_started_over_and_retried_on_failure() -> None:
    f = DedupFilter(1_000, Clock())
    f.committed(KEY, 7, 51, 1, hashes("a"), 60)
    [ask] = f.wanted(1000)
    f.committed(KEY, 8, 3, 1, hashes("z"), 60)  # recreated partition: 1..2 of another writer
    f.recalled(ask, [(1, 1.0, hashes(*[f"o{i}" for i in range(50)]))])
    assert f.verified(KEY, hashes("b")) == 0 and f.entries == 1
    [again] = f.wanted(1000)
    assert (again.pid, again.lo, again.below) == (8, 1, 3)
    f.unrecalled(again)  # a failed read-back is asked for again
    [third] = f.wanted(1000)
    f.recalled(third, [(1, 1.0, hashes("o1", "o2"))])
    assert f.verified(KEY, hashes("b")) == 3


def test_a_gap_too_wide_to_read_back_waits_for_the_window() -> None:
    clock = Clock()
    f = DedupFilter(1_000, clock)
    f.committed(KEY, 7, MAX_GAP_READ_BACK + 2, 1, hashes("a"), 60)
    assert f.wanted(1 << 30) == [] and f.verified(KEY, hashes("b")) == 0
    clock.t += 60 + CLOCK_MARGIN_S
    assert f.verified(KEY, hashes("b")) == MAX_GAP_READ_BACK + 2


def test_read_backs_are_batched_by_offsets() -> None:
    f = DedupFilter(1_000)
    for p in range(4):
        f.committed((b"\0" * 16, "q", f"p{p}"), 10 + p, 101, 1, hashes("a"), 60)
    assert [a.pid for a in f.wanted(150)] == [10, 11]  # 100 + 100 offsets: past 150
    assert [a.pid for a in f.wanted(10)] == [12]  # always at least one
    assert [a.pid for a in f.wanted(10)] == [13]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.floats(0, 15), st.booleans(), st.booleans()),
                min_size=1, max_size=40))
def test_never_a_promise_over_a_live_hash_with_other_writers(
        steps: list[tuple[int, float, bool, bool]]) -> None:
    # model: (time, offset, txn) of every stored frame, ours or another writer's (written
    # straight before ours); read-backs answered from the model as the SQL function would
    clock = Clock()
    f = DedupFilter(1_000_000, clock)
    window = 20
    log: list[tuple[float, int, str]] = []
    segments: list[tuple[float, int, list[str]]] = []  # (time, base, txns) as log_txns rows
    off = 1
    for step, (size, advance, other, read_back) in enumerate(steps):
        clock.t += advance
        if other:
            theirs = [f"o{step}-{j}" for j in range(size // 2 + 1)]
            segments.append((clock.t, off, theirs))
            log += [(clock.t, off + j, t) for j, t in enumerate(theirs)]
            off += len(theirs)
        txns = [f"s{step}-{j}" for j in range(size)]
        f.committed(KEY, 7, off, size, hashes(*txns), window)
        segments.append((clock.t, off, txns))
        log += [(clock.t, off + j, t) for j, t in enumerate(txns)]
        off += size
        if read_back:
            for ask in f.wanted(1 << 20):
                rows = [(base, clock.t - at, hashes(*ts)) for at, base, ts in segments
                        if ask.lo <= base < ask.below and at >= clock.t - ask.secs]
                f.recalled(ask, rows)
        horizon = clock.t - window - CLOCK_MARGIN_S
        newest_at, newest = log[-1][1], log[-1][2]
        for at, stored_at, t in log[-300:]:
            if at >= horizon:  # live: its offset must never be promised away
                assert f.verified(KEY, hashes("fresh", t)) < stored_at
                assert f.verified(KEY, hashes(newest, t)) < min(stored_at, newest_at)
        recent = [(o, t) for at, o, t in log[-16:] if at >= horizon]
        for o1, t1 in recent:  # pairs: a hash below a gap and one in it, or above it
            for o2, t2 in recent:
                assert f.verified(KEY, hashes(t1, t2)) < min(o1, o2)
        if read_back:  # every gap read back: the promise covers everything again
            assert f.verified(KEY, hashes(f"fresh-{step}")) == off - 1
        else:
            assert f.verified(KEY, hashes(f"fresh-{step}")) <= off - 1


def test_a_bundle_at_once_is_its_segments_one_by_one() -> None:
    """``committed_all``/``verified_all`` (one call a bundle, as fusion makes them) leave the
    state and give the promises of ``committed``/``verified`` called segment by segment,
    including a partition twice in one bundle, one without a window, a gap and a bound that
    drops partitions."""
    keys = [(b"\0" * 16, "q", f"p{i}") for i in range(5)]
    rows = [(keys[0], 7, 1, 2, hashes("a", "b"), 3600), (keys[4], 11, 1, 1, hashes("f"), 0),
            (keys[1], 8, 1, 1, hashes("c"), 3600), (keys[0], 7, 3, 1, hashes("d"), 3600),
            (keys[2], 9, 5, 1, hashes("e"), 3600),
            (keys[3], 10, 1, 40, hashes(*(f"x{i}" for i in range(40))), 3600)]
    one, many = DedupFilter(44, Clock()), DedupFilter(44, Clock())
    for row in rows:
        one.committed(*row)
    many.committed_all(rows)
    probes = [hashes("y"), hashes("z"), hashes("e"), hashes("x3"), hashes("q")]
    expected = [one.verified(k, h) for k, h in zip(keys, probes, strict=True)]
    assert many.verified_all(keys, probes) == expected
    assert expected != [0] * 5  # something was promised
    assert many.entries == one.entries
    assert [r.lo for r in many.wanted(1 << 20)] == [r.lo for r in one.wanted(1 << 20)] != []


def _answer(f: DedupFilter, log: dict[int, list[tuple[int, float, bytes]]], now: float) -> int:
    """Every read-back the filter asks, answered from ``log`` (pid -> rows) as SQL would;
    how many there were."""
    asks = f.wanted(1 << 30)
    for ask in asks:
        f.recalled(ask, [(base, now - at, h) for base, at, h in log[ask.pid]
                         if ask.lo <= base < ask.below and at >= now - ask.secs])
    return len(asks)


def test_pushes_round_over_more_partitions_than_fit_keep_a_stable_subset() -> None:
    # Least recently pushed first dropped exactly the partition pushed next: every push
    # probed its whole window and read it back. Now those taken in last leave, once.
    clock = Clock()
    cap, n, size = 1_000, 40, 5  # a round of pushes is 200 entries: 5 rounds fit
    f = DedupFilter(cap, clock)
    keys = [(b"\0" * 16, "q", f"p{i}") for i in range(n)]
    log: dict[int, list[tuple[int, float, bytes]]] = {i: [] for i in range(n)}
    last = [0] * n
    promised = asked = 0
    for r in range(12):
        for i in range(n):
            clock.t += 0.01
            blob = hashes(*(f"r{r}-{i}-{j}" for j in range(size)))
            if r >= 6:
                promised += f.verified(keys[i], blob) == last[i]
            f.committed(keys[i], i, last[i] + 1, size, blob, 3600)
            log[i].append((last[i] + 1, clock.t, blob))
            last[i] += size
            n_asks = _answer(f, log, clock.t)
            asked += n_asks if r >= 6 else 0
            assert f.entries <= cap
    assert asked == 0  # no read-back once the subset is stable
    assert promised >= 6 * 3  # the same few partitions promised every round
    known = [i for i in range(n) if f.verified(keys[i], hashes("fresh")) == last[i]]
    for i in known:  # and the promise is exact: every stored hash of theirs is found
        for base, _, blob in log[i]:
            assert f.verified(keys[i], blob[:16]) < base


def test_a_busy_partition_takes_the_place_of_less_pushed_ones() -> None:
    f = DedupFilter(100)
    old = [(b"\0" * 16, "q", f"old{i}") for i in range(5)]
    for i, key in enumerate(old):
        f.committed(key, i, 1, 20, hashes(*(f"o{i}-{j}" for j in range(20))), 3600)
    new = (b"\0" * 16, "q", "new")
    assert f.entries >= 100 * ADMIT_SHARE
    for n in range(1, 5):  # full: not taken in while pushed no more than the others
        f.committed(new, 9, n, 1, hashes(f"n{n}"), 3600)
        assert f.verified(new, hashes("x")) == 0 and f.wanted(1000) == []
    f.committed(new, 9, 5, 1, hashes("n5"), 3600)  # pushed clearly more: in old0's place
    [ask] = f.wanted(1000)
    assert (ask.pid, ask.lo, ask.below) == (9, 1, 5)
    f.recalled(ask, [(n, 1.0, hashes(f"n{n}")) for n in range(1, 5)])
    assert f.verified(new, hashes("x")) == 5 and f.verified(new, hashes("n1")) == 0
    assert f.verified(old[0], hashes("x")) == 0 and f.verified(old[1], hashes("x")) == 20
    assert f.entries <= 100


def test_push_counts_age_so_idle_partitions_give_way() -> None:
    clock = Clock()
    f = DedupFilter(100, clock)
    keys = [(b"\0" * 16, "q", f"p{i}") for i in range(45)]  # 5 pushed long ago, 40 now
    log: dict[int, list[tuple[int, float, bytes]]] = {i: [] for i in range(45)}
    last = [0] * 45

    def push(i: int, size: int) -> None:
        blob = hashes(*(f"{i}-{last[i] + j}" for j in range(size)))
        f.committed(keys[i], i, last[i] + 1, size, blob, 3600)
        log[i].append((last[i] + 1, clock.t, blob))
        last[i] += size
        _answer(f, log, clock.t)

    for _ in range(10):
        for i in range(5):
            push(i, 2)  # the bound full of 5 partitions pushed 10 times each
    for _ in range(10):  # fewer pushes than theirs: in only as the old counts halve
        clock.t += AGE_S / 2
        for i in range(5, 45):
            push(i, 1)
    assert not any(f.verified(keys[i], hashes("x")) for i in range(5))
    assert sum(f.verified(keys[i], hashes("x")) == last[i] for i in range(5, 45)) >= 2
    assert f.entries <= 100


def _past_the_bound(f: DedupFilter, clock: Clock, steps: list[tuple[int, int, float, bool]],
                    tidy: bool = False) -> None:
    """Five partitions through a bound of 50 smaller than what they hold, read-backs answered
    from the model: never a live hash promised away, never more than the bound in memory."""
    window = 20
    keys = [(b"\0" * 16, "q", f"p{i}") for i in range(5)]
    log: dict[int, list[tuple[int, float, bytes]]] = {i: [] for i in range(5)}
    last = [0] * 5
    for step, (p, size, advance, read_back) in enumerate(steps):
        clock.t += advance
        if tidy and read_back:
            tidy_round(f)
        blob = hashes(*(f"s{step}-{j}" for j in range(size)))
        f.committed(keys[p], p, last[p] + 1, size, blob, window)
        log[p].append((last[p] + 1, clock.t, blob))
        last[p] += size
        if read_back:
            _answer(f, log, clock.t)
        assert f.entries - f.spilled <= 50
        assert f.spilled == _spilled_runs(f)
        assert f.entries == sum(part.held for part in f._parts.values())
        horizon = clock.t - window - CLOCK_MARGIN_S
        for q in range(5):
            for base, at, stored in log[q]:
                if at >= horizon:
                    for k in range(0, len(stored), 16):
                        assert f.verified(keys[q], stored[k:k + 16]) < base + k // 16
                    assert f.verified(keys[q], hashes("new", "other") + stored) < base


def _spilled_runs(f: DedupFilter) -> int:
    return sum(r.n for p in f._parts.values() for r in p.runs if r.store is not None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 30), st.floats(0, 4), st.booleans()),
                min_size=1, max_size=60))
def test_never_a_promise_over_a_live_hash_past_the_bound(
        steps: list[tuple[int, int, float, bool]]) -> None:
    # drops, refusals and partitions taken in again never promise a live hash away
    clock = Clock()
    _past_the_bound(DedupFilter(50, clock), clock, steps)


def test_a_commit_keeps_its_probe_sorted_fingerprints_only_for_the_same_blob() -> None:
    # a probe of HOT_MAX or more hashes keeps its sorted fingerprints for the commit; a
    # commit of another blob (a resubmitted remainder) makes its own
    f = DedupFilter(100_000)
    first = hashes(*(f"a{i}" for i in range(HOT_MAX)))
    f.committed(KEY, 7, 1, HOT_MAX, first, 3600)
    probed = hashes(*(f"b{i}" for i in range(HOT_MAX)))
    assert f.verified(KEY, probed) == HOT_MAX
    other = hashes(*(f"c{i}" for i in range(HOT_MAX)))
    f.committed(KEY, 7, HOT_MAX + 1, HOT_MAX, other, 3600)
    # the two runs merged (1 .. 2 * HOT_MAX): c3 is in it, b3 was never stored
    assert f.verified(KEY, hashes("c3", "x")) == 0
    assert f.verified(KEY, hashes("b3", "x")) == 2 * HOT_MAX
    again = hashes(*(f"d{i}" for i in range(HOT_MAX)))
    assert f.verified(KEY, again) == 2 * HOT_MAX
    f.committed(KEY, 7, 2 * HOT_MAX + 1, HOT_MAX, again, 3600)
    assert f.verified(KEY, hashes(*(f"d{i}" for i in range(9, 11)))) == 2 * HOT_MAX
    assert f.verified(KEY, hashes(*(f"e{i}" for i in range(HOT_MAX)))) == 3 * HOT_MAX
    assert f.verified(KEY, hashes(*(f"d{i}" for i in range(HOT_MAX)))) == 2 * HOT_MAX


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(HOT_MAX, 3 * PACK_OPEN_SEGMENT), min_size=1, max_size=24))
def test_a_cascade_of_merges_makes_the_runs_pairwise_merges_make(sizes: list[int]) -> None:
    # _add_run merges every run a new one takes in at once; the runs (first offsets, sizes,
    # fingerprints, packing) must be those of merging the newest two while the older holds
    # less than twice the newer, one pair at a time
    f = DedupFilter(10_000_000)
    rnd = random.Random(len(sizes))
    want: list[tuple[int, np.ndarray, bool]] = []  # (lo, fingerprints, packed)
    base = 1
    for n in sizes:
        blob = rnd.randbytes(16 * n)
        f.committed(KEY, 7, base, n, blob, 3600)
        new = np.sort(np.frombuffer(blob, np.dtype("=u4"))[::4])
        most = PACK_OPEN_RATIO * n if n >= PACK_OPEN_SEGMENT else 0
        want.append((base, new, False))
        while len(want) > 1 and len(want[-2][1]) < 2 * len(want[-1][1]):
            (_, newer, _), (lo, older, _) = want.pop(), want.pop()
            merged = np.sort(np.concatenate((older, newer)))
            want.append((lo, merged, PACK_OPEN_MIN <= len(merged) <= most))
        base += n
    [part] = f._parts.values()
    got = [(r.lo, r.fps(), r.packed is not None) for r in part.runs]
    assert [(lo, packed) for lo, _, packed in got] == [(lo, p) for lo, _, p in want]
    for (_, fps, _), (_, expected, _) in zip(got, want, strict=True):
        assert np.array_equal(fps, expected)


def test_past_the_bound_runs_spill_and_their_partitions_stay_known(tmp_path: Path) -> None:
    clock = Clock()
    store = SpillFile(tmp_path, 1 << 24)
    f = DedupFilter(2_000, clock, spill=store)
    keys = [(b"\0" * 16, "q", f"p{i}") for i in range(4)]
    stored: list[list[tuple[int, bytes]]] = [[] for _ in keys]
    for r in range(3):
        for i, key in enumerate(keys):
            clock.t += 0.1
            blob = hashes(*(f"{i}-{r}-{j}" for j in range(600)))
            f.committed(key, i, 1 + 600 * r, 600, blob, 3600)
            stored[i].append((1 + 600 * r, blob))
    assert f.entries == 7_200 and f.entries - f.spilled <= 2_000
    assert f.spilled == store.entries == _spilled_runs(f) > 0
    for i, key in enumerate(keys):  # nothing forgotten: a full promise, every hash found
        assert f.verified(key, hashes("fresh")) == 1_800
        assert f.verified(key, hashes(*(f"fresh{j}" for j in range(100)))) == 1_800
        for base, blob in stored[i]:
            for k in (0, 599):
                assert f.verified(key, blob[16 * k:16 * k + 16]) < base + k
            assert f.verified(key, hashes("x", *(f"y{j}" for j in range(40))) + blob) < base
    # a merge that takes in spilled runs is spilled again
    before = f.entries - f.spilled
    f.committed(keys[0], 0, 1_801, 600, hashes(*(f"0-3-{j}" for j in range(600))), 3600)
    assert f.entries - f.spilled <= max(before, 2_000)
    assert f.spilled == store.entries == _spilled_runs(f)
    assert f.verified(keys[0], hashes("0-3-7")) < 1_801 + 7
    # every run leaves the window: the file is given back
    clock.t += 3600 + CLOCK_MARGIN_S + 3600 / EPOCHS + 1
    for i, key in enumerate(keys):
        f.committed(key, i, 5_000, 1, hashes(f"late{i}"), 3600)
    assert f.entries == 4 and f.spilled == 0 and store.size == 0


def test_a_full_spill_file_drops_partitions_and_frees_their_slots(tmp_path: Path) -> None:
    clock = Clock()
    store = SpillFile(tmp_path, 4 * 4096)  # two runs of 600 or so
    f = DedupFilter(1_500, clock, spill=store)
    keys = [(b"\0" * 16, "q", f"p{i}") for i in range(6)]
    for r in range(2):
        for i, key in enumerate(keys):
            clock.t += 0.1
            f.committed(key, i, 1 + 600 * r, 600,
                        hashes(*(f"{i}-{r}-{j}" for j in range(600))), 3600)
            assert f.entries - f.spilled <= 1_500
            assert f.spilled == store.entries == _spilled_runs(f)
            assert store.size <= 4 * 4096
    assert len(f._parts) < len(keys)  # some were forgotten: their pushes probe in SQL
    assert f.verified(keys[0], hashes("fresh")) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 30), st.floats(0, 4), st.booleans()),
                min_size=1, max_size=60),
       st.sampled_from([0, 3 * 2048, 1 << 20]))
def test_never_a_promise_over_a_live_hash_past_the_bound_with_a_spill_file(
        steps: list[tuple[int, int, float, bool]], spill_bytes: int) -> None:
    # the model above with runs of 4 or more spilled to a file of no room, of a few slots or
    # of plenty, and tidy rounds sealing epochs
    import queen_mp.shards.dedupfilter as dedupfilter

    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
        mp.setattr(dedupfilter, "SPILL_MIN", 4)
        clock = Clock()
        store = SpillFile(Path(tmp), spill_bytes)
        _past_the_bound(DedupFilter(50, clock, spill=store), clock, steps, tidy=True)
        store.close()
