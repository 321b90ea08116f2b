"""The shard's dedup filter (queen_mp/shards/dedupfilter.py) driven as the shard drives it, for
its cost per pushed segment and its memory, with no server and no database.

Each case pushes segments of S random hashes to random partitions among ``--partitions``:
``verified`` then ``committed``, with a clock advancing at ``--rate`` messages a second; with
``--bundle N``, N segments a call through ``verified_all`` and ``committed_all``, as
``PushFusion`` calls them for a bundle. The first half of the segments fills the filter (runs,
epochs, merges); the second half is measured, inside one ``operator.call`` so that callgrind
can count it alone::

    .venv/bin/python -m bench.dedupfilter                        # wall clock, 4 cases
    .venv/bin/python -m bench.dedupfilter --partitions 1 --cases 100:600000
    valgrind --tool=callgrind --toggle-collect=_operator_call --callgrind-out-file=/dev/null \\
        .venv/bin/python -m bench.dedupfilter --cases 10:200000  # "Collected : N"

Divide a callgrind count by the measured segments the script prints. ``--memory`` traces the
filter's allocations (tracemalloc: slower, so its timings are not comparable).

``--pss`` measures what tracemalloc cannot (the C heap's fragmentation, pages freed but kept,
the transient copies of merges): one filter fed the cases in turn, as a broker's push cells
feed its shard, with glibc's mmap threshold fixed as the supervisor fixes it for its children;
the process's PSS, private and anonymous pages (``/proc/self/smaps_rollup``; the anonymous
figure alone does not move as other processes map or unmap this one's libraries) above the
empty filter's are
printed as the filter passes 1M, 2M, 4M and 8M entries, at the end of each case, and once
every run left the window (the clock moved past it, one 1-hash push a partition). The heap is
trimmed every ``--busy-trim-s`` seconds of the clock, as a busy shard's ``HeapTrim`` does
(``BUSY_TRIM_EVERY_S``; 0: never, as before it did)::

    .venv/bin/python -m bench.dedupfilter --pss   # cases 1:200000,10:1000000,100:8000000,...

``--past-budget`` pushes past the bound, one filter fed the cases in turn: segments to
partitions in turn (``--order cycle``, the worst case of least-recently-pushed eviction) or at
random, read-backs answered at once from a log of what was pushed, as ``log_txn_hashes_v1``
would. It prints per push what SQL would pay: the pushes that probe, the offsets they probe
(above the promise) and the read-backs with their offsets::

    .venv/bin/python -m bench.dedupfilter --past-budget --entries 300000 --cases 100:3000000

``--spill-bytes N`` gives the filter a spill file of N bytes (``QUEEN_DEDUP_SPILL_BYTES``; in
the system's temporary directory) for ``--past-budget``: runs past the bound go there instead
of their partitions being forgotten; the line then says how many entries went and what the
filter's calls cost a push in wall time, reads of the file included.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import operator
import random
import time
import tracemalloc

from queen_mp.heap import BUSY_TRIM_EVERY_S, fix_mmap_threshold
from queen_mp.shards.dedupfilter import AGE_S, CLOCK_MARGIN_S, EPOCHS, DedupFilter
from queen_mp.shards.dedupspill import SpillFile

WINDOW_S = 3600  # QUEEN_DEDUP_WINDOW's default
PSS_CASES = "1:200000,10:1000000,100:8000000,1000:4000000"  # the push cells' order
PSS_MARKS = (1_000_000, 2_000_000, 4_000_000, 8_000_000)


def run(partitions: int, size: int, total: int, rate: float, entries: int,
        seed: int = 1, bundle: int = 1) -> dict[str, float]:
    """Figures of the measured half; ``held_bytes``: what the filter holds at the end, as
    tracemalloc counts it (0 unless tracing)."""
    rnd = random.Random(seed)
    now = [1000.0]
    filt = DedupFilter(entries, lambda: now[0])
    keys = [(b"\0" * 16, "bench", f"p-{i}") for i in range(partitions)]
    last = [0] * partitions
    segments = [(rnd.randrange(partitions), rnd.randbytes(16 * size))
                for _ in range(max(2, total // size))]
    step = size / rate

    def push(lo: int, hi: int) -> None:
        if bundle == 1:
            for p, hashes in segments[lo:hi]:
                now[0] += step
                key = keys[p]
                filt.verified(key, hashes)
                filt.committed(key, 7 + p, last[p] + 1, size, hashes, WINDOW_S)
                last[p] += size
            return
        for at in range(lo, hi, bundle):  # as PushFusion calls it: one call a bundle each way
            chunk = segments[at:min(at + bundle, hi)]
            now[0] += step * len(chunk)
            filt.verified_all([keys[p] for p, _ in chunk], [h for _, h in chunk])
            stored = []
            for p, hashes in chunk:
                stored.append((keys[p], 7 + p, last[p] + 1, size, hashes, WINDOW_S))
                last[p] += size
            filt.committed_all(stored)

    half = len(segments) // 2
    base = tracemalloc.get_traced_memory()[0]
    push(0, half)
    started = time.perf_counter()
    operator.call(push, half, len(segments))
    took = time.perf_counter() - started
    measured = len(segments) - half
    return {"segments": measured, "us_per_segment": took / measured * 1e6,
            "us_per_hash": took / (measured * size) * 1e6, "entries": filt.entries,
            "held_bytes": tracemalloc.get_traced_memory()[0] - base}


def pss_kb() -> tuple[int, int, int]:
    """This process's proportional set size, its private pages and its anonymous pages
    (KiB): the private figure leaves out the shares of libraries, which move as other
    processes map them or exit; but a library page counts as private while no other process
    maps it, so only the anonymous figure (heap and mapped blocks) is what the filter holds."""
    got: dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Pss", "Private_Clean", "Private_Dirty", "Anonymous"):
                got[name] = int(rest.split()[0])
    return got["Pss"], got["Private_Clean"] + got["Private_Dirty"], got["Anonymous"]


def run_pss(partitions: int, cases: list[tuple[int, int]], rate: float, entries: int,
            mmap_threshold_kb: int, busy_trim_s: float, seed: int = 1) -> None:
    """Feed one filter every case in turn (hashes made segment by segment, so that nothing
    but the filter grows) and print its PSS above the empty filter's at each mark."""
    fix_mmap_threshold(mmap_threshold_kb)
    rnd = random.Random(seed)
    now = [1000.0]
    filt = DedupFilter(entries, lambda: now[0])
    keys = [(b"\0" * 16, "bench", f"p-{i}") for i in range(partitions)]
    last = [0] * partitions
    gc.collect()
    base = pss_kb()
    marks = list(PSS_MARKS)

    def show(what: str) -> None:
        gc.collect()
        pss, private, anon = ((kb - was) * 1024 for kb, was in zip(pss_kb(), base, strict=True))
        per = max(1, filt.entries)
        print(f"{what:>22}: {filt.entries:8d} entries, PSS +{pss / 1e6:6.2f} MB "
              f"({pss / per:5.2f} B an entry), private +{private / 1e6:6.2f} MB "
              f"({private / per:5.2f} B an entry), anonymous +{anon / 1e6:6.2f} MB "
              f"({anon / per:5.2f} B an entry)", flush=True)

    def push(p: int, size: int, hashes: bytes) -> None:
        key = keys[p]
        filt.verified(key, hashes)
        filt.committed(key, 7 + p, last[p] + 1, size, hashes, WINDOW_S)
        last[p] += size

    trim = ctypes.CDLL(None).malloc_trim
    trims, trim_cpu, trim_due = 0, 0.0, now[0] + busy_trim_s
    print(f"empty filter: PSS {base[0] / 1024:.1f} MB", flush=True)
    for size, total in cases:
        step = size / rate
        for _ in range(total // size):
            now[0] += step
            if busy_trim_s and now[0] >= trim_due:
                cpu = time.process_time()
                trim(0)
                trim_cpu += time.process_time() - cpu
                trims, trim_due = trims + 1, now[0] + busy_trim_s
            push(rnd.randrange(partitions), size, rnd.randbytes(16 * size))
            if marks and filt.entries >= marks[0]:
                show(f"{marks.pop(0) // 1_000_000}M entries")
        show(f"after segments of {size}")
    if trims:
        print(f"{trims} trims under load, {trim_cpu * 1e3:.1f} ms of CPU", flush=True)
    # The shard's heartbeats once the load ended and its epoch did: a quiet beat trims the
    # heap (``HeapTrim``); ``tidy`` closes the ended epoch, a round in calls of 512.
    trim(0)
    show("trimmed")
    now[0] += WINDOW_S / EPOCHS + AGE_S
    filt.tidy()
    while filt.tidying():
        filt.tidy()
    trim(0)
    show("epoch closed, trimmed")
    now[0] += WINDOW_S * 2 + CLOCK_MARGIN_S  # every epoch left the window: runs leave
    for p in range(partitions):
        push(p, 1, rnd.randbytes(16))
    show("after the runs left")
    trim(0)  # a quiet beat's (``HeapTrim``)
    show("runs left, trimmed")


def run_past_budget(partitions: int, cases: list[tuple[int, int]], rate: float, entries: int,
                    order: str, seed: int = 1, spill_bytes: int = 0) -> None:
    """What SQL pays a push past the bound, one filter fed every case in turn (see the
    module's docstring): a line a case."""
    rnd = random.Random(seed)
    now = [1000.0]
    filt = DedupFilter(entries, lambda: now[0], spill=SpillFile(None, spill_bytes))
    keys = [(b"\0" * 16, "bench", f"p-{i}") for i in range(partitions)]
    rows: list[list[tuple[int, float, bytes]]] = [[] for _ in range(partitions)]
    last = [0] * partitions
    n = 0
    for size, total in cases:
        pushes = total // size
        probed = probed_offsets = recalls = recalled_offsets = 0
        spent = 0.0
        step = size / rate
        for _ in range(pushes):
            now[0] += step
            p = n % partitions if order == "cycle" else rnd.randrange(partitions)
            n += 1
            key, hashes = keys[p], rnd.randbytes(16 * size)
            t0 = time.perf_counter()
            verified = filt.verified(key, hashes)
            filt.committed(key, 7 + p, last[p] + 1, size, hashes, WINDOW_S)
            spent += time.perf_counter() - t0
            if verified < last[p]:
                probed += 1
                probed_offsets += last[p] - verified
            rows[p].append((last[p] + 1, now[0], hashes))
            last[p] += size
            for ask in filt.wanted(1 << 18):
                q = ask.pid - 7
                got = [(base, now[0] - at, h) for base, at, h in rows[q]
                       if ask.lo <= base < ask.below and at >= now[0] - ask.secs]
                recalls += 1
                recalled_offsets += ask.below - ask.lo
                filt.recalled(ask, got)
        print(f"segment {size:5d}, {order}: {pushes:7d} pushes, {probed / pushes:6.1%} probed, "
              f"{probed_offsets / pushes:9.1f} offsets probed a push, {recalls / pushes:6.3f} "
              f"read-backs a push ({recalled_offsets / pushes:9.1f} offsets), "
              f"{filt.entries:8d} entries ({filt.spilled} spilled), filter "
              f"{spent / pushes * 1e6:.1f} us a push", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", help="segment size:total hashes, comma separated (default "
                    "1:40000,10:200000,100:600000,1000:1000000; with --pss " + PSS_CASES + ")")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--rate", type=float,
                    help="messages a second (default 30,000; with --pss 5,000: its 13M "
                         "messages span some six epochs, as a suite's push cells do)")
    ap.add_argument("--entries", type=int, default=8_000_000,
                    help="the filter's bound (QUEEN_DEDUP_FILTER_ENTRIES)")
    ap.add_argument("--memory", action="store_true", help="trace the filter's allocations")
    ap.add_argument("--bundle", type=int, default=1,
                    help="segments a call (verified_all/committed_all, as a shard's bundle "
                         "makes them); 1: verified/committed segment by segment")
    ap.add_argument("--pss", action="store_true",
                    help="PSS of one filter fed every case in turn (default cases: the push "
                         f"cells' {PSS_CASES})")
    ap.add_argument("--mmap-threshold-kb", type=int, default=128,
                    help="--pss: glibc's mmap threshold, as QUEEN_MALLOC_MMAP_THRESHOLD_KB")
    ap.add_argument("--busy-trim-s", type=float, default=BUSY_TRIM_EVERY_S,
                    help="--pss: the heap trimmed every this many seconds of the clock, as a "
                         "busy shard's (0: never)")
    ap.add_argument("--past-budget", action="store_true",
                    help="what SQL pays a push past the bound: probes and read-backs")
    ap.add_argument("--order", choices=("cycle", "random"), default="cycle",
                    help="--past-budget: partitions in turn or at random")
    ap.add_argument("--spill-bytes", type=int, default=0,
                    help="--past-budget: the filter's spill file bound "
                         "(QUEEN_DEDUP_SPILL_BYTES; 0: none)")
    a = ap.parse_args(argv)
    if a.past_budget:
        cases = [tuple(int(x) for x in c.split(":"))
                 for c in (a.cases or "100:3000000").split(",")]
        run_past_budget(a.partitions, cases, a.rate or 30000.0, a.entries, a.order,
                        spill_bytes=a.spill_bytes)
        return 0
    if a.pss:
        cases = [tuple(int(x) for x in c.split(":")) for c in (a.cases or PSS_CASES).split(",")]
        run_pss(a.partitions, cases, a.rate or 5000.0, a.entries, a.mmap_threshold_kb,
                a.busy_trim_s)
        return 0
    a.cases = a.cases or "1:40000,10:200000,100:600000,1000:1000000"
    a.rate = a.rate or 30000.0
    for case in a.cases.split(","):
        size, total = (int(x) for x in case.split(":"))
        if a.memory:
            tracemalloc.start()
        r = run(a.partitions, size, total, a.rate, a.entries, bundle=a.bundle)
        mem = ""
        if a.memory:
            tracemalloc.stop()
            held = r["held_bytes"]
            mem = f", {held / 1e6:.2f} MB held ({held / max(1, r['entries']):.1f} B an entry)"
        print(f"segment {size:5d}: {r['segments']:7d} measured, {r['us_per_segment']:8.2f} us "
              f"a segment, {r['us_per_hash']:6.3f} us a hash, {r['entries']:8d} entries{mem}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
