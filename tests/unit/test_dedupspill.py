"""The dedup filter's spill file: slots written, read back, reused and given back."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from queen_mp.shards.dedupspill import MIN_SLOT, SpillFile


def fps(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    out.sort()
    return out


def test_a_slot_reads_back_what_was_put(tmp_path: Path) -> None:
    f = SpillFile(tmp_path / "dedup", 1 << 20)
    a, b = fps(700, 1), fps(3000, 2)
    at_a, at_b = f.put(a), f.put(b)
    assert at_a != at_b and at_a >= 0 and at_b >= 0
    assert np.array_equal(np.frombuffer(f.get(at_b, 3000), np.uint32), b)
    assert np.array_equal(np.frombuffer(f.get(at_a, 700), np.uint32), a)
    assert f.entries == 3700
    assert f.size == 4096 + 16384  # 2,800 and 12,000 bytes: power-of-two slots
    f.close()


def test_the_file_is_unlinked_and_opened_only_when_needed(tmp_path: Path) -> None:
    d = tmp_path / "dedup"
    f = SpillFile(d, 1 << 20)
    assert not d.exists()  # nothing spilled, nothing made
    assert f.put(fps(600, 3)) >= 0
    assert d.is_dir() and list(d.iterdir()) == []  # a crash leaves nothing behind
    f.close()


def test_freed_slots_are_reused_and_an_empty_file_is_cut_back(tmp_path: Path) -> None:
    f = SpillFile(tmp_path, 1 << 20)
    first = f.put(fps(1000, 4))
    second = f.put(fps(1000, 5))
    f.free(first, 1000)
    assert f.size == 2 * 4096 and f.used == 4096
    again = f.put(fps(900, 6))  # the same size of slot: the freed one
    assert again == first and f.size == 2 * 4096
    f.free(again, 900)
    f.free(second, 1000)
    assert (f.size, f.used, f.entries) == (0, 0, 0)
    assert os.fstat(f._fd).st_size == 0  # the disk is given back
    assert f.put(fps(512, 7)) == 0
    f.close()


def test_past_its_bound_a_put_is_refused(tmp_path: Path) -> None:
    f = SpillFile(tmp_path, 2 * MIN_SLOT + 1024)
    assert f.put(fps(512, 8)) >= 0
    assert f.put(fps(1024, 9)) == -1  # 4 KiB more than 5 KiB allow
    assert f.put(fps(100, 10)) >= 0  # a slot of MIN_SLOT at least
    assert f.put(fps(512, 11)) == -1
    assert f.entries == 612
    f.close()


def test_a_bound_of_zero_never_makes_a_file(tmp_path: Path) -> None:
    f = SpillFile(tmp_path / "x", 0)
    assert f.put(fps(4000, 13)) == -1
    assert not (tmp_path / "x").exists() and f.entries == 0


def test_a_failed_write_is_refused_and_leaves_the_file_as_it_was(
        tmp_path: Path, monkeypatch) -> None:
    import errno

    import queen_mp.shards.dedupspill as dedupspill

    f = SpillFile(tmp_path, 1 << 20)
    kept = f.put(fps(600, 14))

    def full(fd: int, data: object, at: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dedupspill.os, "pwrite", full)
    assert f.put(fps(600, 15)) == -1  # the run stays in memory: the filter goes on
    monkeypatch.setattr(dedupspill.os, "pwrite", lambda fd, data, at: 100)  # a short write
    assert f.put(fps(600, 16)) == -1
    monkeypatch.undo()
    assert (f.entries, f.size, f.used) == (600, 4096, 4096)
    assert np.array_equal(np.frombuffer(f.get(kept, 600), np.uint32), fps(600, 14))
    assert f.put(fps(600, 17)) == 4096
    f.close()
