"""The shard's dedup knowledge: it may only promise what it wrote, inside the window."""

from __future__ import annotations

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from queen_mp.shards.dedupfilter import CHUNK_SPAN_S, CLOCK_MARGIN_S, HOT_MAX, DedupFilter

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


def test_a_gap_from_another_writer_resets() -> None:
    clock = Clock()
    f = DedupFilter(100, clock)
    f.committed(KEY, 7, 1, 1, hashes("a"), 60)
    f.committed(KEY, 7, 5, 1, hashes("e"), 60)  # 2..4 written by a transaction or a timer
    assert f.verified(KEY, hashes("x")) == 0


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
    clock.t += 10 + CLOCK_MARGIN_S + 1
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


def test_a_shared_chunk_is_forgotten_by_its_latest_entry_never_earlier() -> None:
    clock = Clock()
    f = DedupFilter(100, clock)
    f.committed(KEY, 7, 1, 1, hashes("a"), 10)
    clock.t += CHUNK_SPAN_S / 2
    f.committed(KEY, 7, 2, 1, hashes("b"), 10)  # same chunk as "a"
    clock.t += 10 + CLOCK_MARGIN_S - CHUNK_SPAN_S / 4  # "a" is out of the window, "b" is not
    f.committed(KEY, 7, 3, 1, hashes("c"), 10)
    assert f.entries == 3 and f.verified(KEY, hashes("a")) == 0  # kept: "b" still needs it
    clock.t += CHUNK_SPAN_S
    f.committed(KEY, 7, 4, 1, hashes("d"), 10)
    assert f.entries == 2 and f.verified(KEY, hashes("a")) == 4


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
    stored = [f"t{i}" for i in range(off - 1)]
    assert f.verified(KEY, hashes("new")) == off - 1
    for t in stored:
        assert f.verified(KEY, hashes("new", t)) == 0, t


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 80), st.floats(0, 30)), min_size=1, max_size=40))
def test_never_a_promise_over_a_live_hash(steps: list[tuple[int, float]]) -> None:
    # model: (time, txn) of every commit; live = inside window + margin (+ the chunk span)
    clock = Clock()
    f = DedupFilter(1_000_000, clock)
    window = 20
    log: list[tuple[float, str]] = []
    off = 1
    for step, (size, advance) in enumerate(steps):
        clock.t += advance
        txns = [f"s{step}-{j}" for j in range(size)]
        f.committed(KEY, 7, off, size, hashes(*txns), window)
        off += size
        log += [(clock.t, t) for t in txns]
        horizon = clock.t - window - CLOCK_MARGIN_S
        for at, t in log[-200:]:
            if at >= horizon:  # live: must never be promised away
                assert f.verified(KEY, hashes("fresh", t)) == 0
        assert f.verified(KEY, hashes(f"fresh-{step}")) == off - 1
        # memory: forgotten chunks leave the count, and at most a third more sits in runs
        assert f.entries <= sum(1 for at, _ in log if at >= horizon - CHUNK_SPAN_S)
