"""The allocator policy: a fixed mmap threshold keeps large blocks out of the heap even after
larger ones were freed (glibc's adaptive threshold would have risen past them), and the heap's
free pages go back once a burst of work is over."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import types

import pytest

from queen_mp import heap
from queen_mp.heap import HeapTrim, bounded_caches, fix_mmap_threshold

# Frees a 4 MiB block (glibc's adaptive threshold then rises to 4 MiB), allocates 512 KiB and
# prints how many blocks malloc has mapped on their own (mallinfo2().hblks).
_PROBE = textwrap.dedent("""
    import sys
    from queen_mp.heap import fix_mmap_threshold, glibc_heap
    print(fix_mmap_threshold(int(sys.argv[1])))
    big = bytearray(4 << 20)
    del big
    before = glibc_heap().hblks
    block = bytearray(512 << 10)
    print(glibc_heap().hblks - before)
""")


def _probe(kb: int) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(kb)], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], int(out[1])


def _glibc() -> bool:
    return heap.glibc_heap() is not None


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc only (mallopt, mallinfo2)")
def test_a_fixed_threshold_maps_a_large_block_after_a_larger_one_was_freed() -> None:
    assert _probe(128) == ("True", 1)


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc only (mallopt, mallinfo2)")
def test_without_it_glibc_puts_that_block_in_the_heap() -> None:
    # the control: what the setting changes (0 leaves glibc's adaptive threshold)
    assert _probe(0) == ("False", 0)


def test_zero_leaves_the_allocator_alone() -> None:
    assert fix_mmap_threshold(0) is False


def test_freezing_the_startup_objects_raises_only_the_young_generations_threshold() -> None:
    probe = ("import gc; from queen_mp.heap import freeze_startup_objects; "
             "before = gc.get_threshold(); freeze_startup_objects(); "
             "print(*before, *gc.get_threshold(), gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "700" and out[3] == "20000"  # CPython's default, then ours
    assert out[1:3] == out[4:6]  # the older generations keep theirs
    assert out[6] == "True"


_SEAL_PROBE = textwrap.dedent("""
    from queen_mp import heap
    keep = [bytes(128 - heap._BYTES_HEAD) for _ in range(20_000)]  # 128-byte blocks
    del keep[::2]  # every other one free again, in pools still used
    before = heap._free_blocks()[128]
    filled = heap.seal_free_blocks()
    print(before, heap._free_blocks()[128], filled)
""")


@pytest.mark.skipif(not heap._free_blocks(), reason="CPython's pymalloc only")
def test_sealing_fills_the_free_blocks_of_the_used_pools() -> None:
    out = subprocess.run([sys.executable, "-c", _SEAL_PROBE], capture_output=True, text=True,
                         check=True).stdout.split()
    before, after, filled = (int(x) for x in out)
    assert before >= 9_000
    assert after < before // 20
    assert filled >= before


_CHUNK_PROBE = textwrap.dedent("""
    import ctypes
    from queen_mp import heap
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(1000) for _ in range(2_000)]  # 1,008-byte chunks
    for b in blocks[::2]:
        libc.free(b)  # every other one free again, between live ones
    def small() -> int:
        return sum(n for size, n in heap._glibc_free_chunks() if size < 4096)
    before = small()
    filled = heap.seal_free_chunks()
    print(before, small(), filled)
""")


@pytest.mark.skipif(not heap._glibc_free_chunks(), reason="glibc's malloc_info only")
def test_sealing_takes_the_small_free_chunks_of_the_c_heap() -> None:
    out = subprocess.run([sys.executable, "-c", _CHUNK_PROBE], capture_output=True, text=True,
                         check=True).stdout.split()
    before, after, filled = (int(x) for x in out)
    assert before >= 900  # the freed ones but glibc's per-thread cache's 7
    assert after < 20
    assert filled >= before


def _ticks(monkeypatch: pytest.MonkeyPatch, cpu_per_tick: list[float]) -> list[bool]:
    """What ``HeapTrim.tick`` does over ticks that each saw that much CPU (a fake clock)."""
    clock = [0.0]
    monkeypatch.setattr(heap.time, "process_time", lambda: clock[0])
    trims: list[int] = []
    trim = HeapTrim(0.02, trims.append)
    out = []
    for cpu in cpu_per_tick:
        clock[0] += cpu
        did = trim.tick()
        assert did == (len(trims) > sum(out))  # True exactly when it called malloc_trim
        out.append(did)
    assert set(trims) <= {0}
    return out


def test_the_heap_is_trimmed_once_at_the_first_quiet_tick_after_work(monkeypatch) -> None:
    assert _ticks(monkeypatch, [0.5, 0.3, 0.001, 0.001, 0.4, 0.019, 0.0]) == [
        False, False, True, False, False, True, False]


def test_a_process_that_never_worked_is_never_trimmed(monkeypatch) -> None:
    assert _ticks(monkeypatch, [0.001, 0.0, 0.01]) == [False, False, False]


def test_a_collecting_quiet_trim_collects_the_oldest_generation_after_the_caches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = [0.0]
    monkeypatch.setattr(heap.time, "process_time", lambda: cpu[0])
    calls: list[str] = []

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            calls.append(f"collect {info['generation']}")

    trims = [HeapTrim(0.02, lambda pad: calls.append("trim") or 1,
                      clear=[lambda: calls.append("clear")], collect=collect)
             for collect in (True, False)]
    gc.callbacks.append(collected)
    try:
        for trim in trims:
            for busy_cpu in (0.5, 0.0):
                cpu[0] += busy_cpu
                trim.tick()
    finally:
        gc.callbacks.remove(collected)
    # with collect (the front workers) a full collection; without (the shard) none
    assert [c for c in calls if c != "collect 0"] == [
        "clear", "collect 2", "trim", "clear", "trim"]


def test_under_load_it_trims_at_most_every_busy_every_s_without_clearing(monkeypatch) -> None:
    cpu, wall = [0.0], [100.0]
    monkeypatch.setattr(heap.time, "process_time", lambda: cpu[0])
    monkeypatch.setattr(heap.time, "monotonic", lambda: wall[0])
    calls: list[str] = []
    trim = HeapTrim(0.02, lambda pad: calls.append("trim") or 1,
                    clear=[lambda: calls.append("clear")], busy_every_s=2.0)
    out = []
    for busy_cpu in (0.5, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0):  # a tick a second
        cpu[0] += busy_cpu
        wall[0] += 1.0
        out.append(trim.tick())
    # busy: at 2 s and 4 s after the start (no caches cleared); then the quiet trim as before
    assert out == [False, True, False, True, False, True, False]
    assert calls == ["trim", "trim", "clear", "trim"]


def test_without_busy_every_s_a_load_is_never_trimmed(monkeypatch) -> None:
    assert _ticks(monkeypatch, [0.5] * 20) == [False] * 20


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc only (malloc_trim)")
def test_glibcs_malloc_trim_is_what_it_calls() -> None:
    trim = HeapTrim(quiet_cpu_s=1e9)  # every tick is quiet
    trim._worked = True
    assert trim.tick() is True


def test_bounded_caches_are_the_modules_own_lru_caches_with_a_bound(monkeypatch) -> None:
    mod = types.ModuleType("fakepkg.mod")
    exec("import functools\n"
         "@functools.lru_cache(maxsize=8)\ndef bounded(x): return x\n"
         "@functools.cache\ndef once(): return 1\n"
         "from functools import lru_cache as _l\n", mod.__dict__)
    other = types.ModuleType("fakepkg.other")
    other.borrowed = mod.bounded  # another module's cache, named here: cleared once, there
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(sys.modules, other.__name__, other)
    monkeypatch.setitem(sys.modules, "fakepkg.gone", None)
    assert bounded_caches("fakepkg.") == [mod.bounded.cache_clear]


def test_the_caches_are_cleared_before_the_trim_and_only_then(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(heap.time, "process_time", lambda: clock[0])
    calls: list[str] = []
    trim = HeapTrim(0.02, lambda pad: calls.append("trim") or 1,
                    clear=[lambda: calls.append("a"), lambda: calls.append("b")])
    for cpu in (0.5, 0.3, 0.0, 0.0):
        clock[0] += cpu
        trim.tick()
    assert calls == ["a", "b", "trim"]
