"""Memory policy of the long-lived processes (front workers and shards): the garbage
collector's, and the C allocator's."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

__all__ = ["BUSY_TRIM_EVERY_S", "HeapTrim", "MallInfo2", "before_fork", "bounded_caches",
           "fix_mmap_threshold", "freeze_startup_objects", "glibc_heap", "request_caches",
           "seal_free_blocks", "seal_free_chunks"]

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
# PERF(queen): a 1,000-item push allocates some 5,000 tracked objects (frames, items, results)
# that live until it is answered; at CPython's default of 700 that was seven young collections
# a request, each walking what the request still held: 8% of a front worker's samples under
# QPB1 1,000-item pushes (py-spy). A request's objects die by reference count; a higher
# threshold only keeps cyclic garbage a little longer.
_GEN0_THRESHOLD = 20_000
#: a busy shard's heap is trimmed this often (``HeapTrim``'s busy_every_s: 0.5 ms a trim at 8M
#: dedup filter entries)
BUSY_TRIM_EVERY_S = 2.0


def fix_mmap_threshold(kb: int) -> bool:
    """Set glibc malloc's mmap threshold to ``kb`` KiB (0: leave glibc's adaptive one); True
    if it was set. Call it in the supervisor before it forks: the children inherit it.

    PERF(memory): glibc starts at 128 KiB but raises the threshold to the size of each mapped
    block freed, up to 32 MiB, so after a few large request bodies every later one comes from
    the heap, whose freed middle is not given back: a burst of 1,000-item pushes left each
    front worker some 10 MB larger for good. A fixed threshold keeps large blocks mapped and
    returns them at free. Another C library (no ``mallopt``) is left as it is.
    """
    if kb <= 0:
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, kb * 1024))


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h): its heap's bytes in use and free, and those of
    the blocks it mapped on their own."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def glibc_heap() -> MallInfo2 | None:
    """glibc's figures of this process's C heap now (None under another C library): what the
    memory benchmarks and tests read beside pymalloc's arenas."""
    fn = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = MallInfo2
    return fn()  # type: ignore[no-any-return]


def freeze_startup_objects() -> None:
    """Move everything alive once a process is up (modules, routes, pools, prepared
    statements) out of the collector's reach: those objects live as long as the process.

    PERF(queen): a full collection otherwise walks some 55,000 startup objects, a pause of
    about 25 ms that landed in the end-to-end latency tail; frozen, it walks only what the
    requests since allocated. The young generation is collected less often from then on
    (``_GEN0_THRESHOLD``).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GEN0_THRESHOLD, *gc.get_threshold()[1:])


#: what ``seal_free_blocks`` allocated: kept for the process's life
_SEALS: list[tuple[bytes, ...]] = []
#: a bytes object's allocation is this many bytes plus its length (CPython's PyBytesObject)
_BYTES_HEAD = sys.getsizeof(b"")


def _free_blocks() -> dict[int, int]:
    """pymalloc's free blocks in its used pools by block size, from CPython's
    ``sys._debugmallocstats`` (written to fd 2, lent to a file for the call); empty when the
    interpreter has no such report."""
    stats = getattr(sys, "_debugmallocstats", None)
    if stats is None:
        return {}
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        err = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            stats()
        finally:
            os.dup2(err, 2)
            os.close(err)
        out.seek(0)
        text = out.read().decode("ascii", "replace")
    free: dict[int, int] = {}
    for line in text.splitlines():
        cols = line.split()  # class, size, pools, blocks in use, available blocks
        if len(cols) == 5 and all(c.isdigit() for c in cols):
            free[int(cols[1])] = int(cols[4])
    return free


def seal_free_blocks() -> int:
    """Fill the free blocks of pymalloc's used pools with bytes objects kept for good; call
    it just before a fork. The number of blocks filled.

    PERF(memory): a child's allocations of a size go first to the used pools of that size it
    inherited, with a few free blocks each, so its first requests write into hundreds of pools
    of the parent's live objects (the pool's header and the block), a private copy of each
    such page in every child, while the parent keeps its own. Filled, those pools are full:
    the child allocates in pools of its own (a front worker at rest: pages of inherited pools
    it allocated into 0.87 -> 0.14 MB, bench/README.md). The blocks cost nothing more: their
    pages are resident already.
    """
    seals: list[bytes] = []
    for size, count in sorted(_free_blocks().items()):
        length = size - _BYTES_HEAD
        if length < 2:  # b"" and single bytes are shared objects: nothing to allocate
            continue
        seals.extend(bytes(length) for _ in range(count))
    _SEALS.append(tuple(seals))
    return len(seals)


#: the C heap's free chunks ``seal_free_chunks`` allocated (addresses): kept for the process's life
_CHUNK_SEALS: list[int] = []
#: glibc chunks smaller than this are sealed: a bigger one fills pages of its own anyway
_SEAL_CHUNK_BELOW = 4096
_SIZE_LINE = re.compile(rb'<size from="(\d+)" to="(\d+)" total="\d+" count="(\d+)"/>')


def _glibc_free_chunks() -> list[tuple[int, int]]:
    """(chunk size, count) of the main heap's free chunks in glibc's bins, from its
    ``malloc_info`` (an XML report written to a memory stream); empty under another C library
    or a report not understood."""
    libc = ctypes.CDLL(None)
    if not all(hasattr(libc, f) for f in ("malloc_info", "open_memstream", "fclose", "free")):
        return []
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    libc.open_memstream.restype = ctypes.c_void_p
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return []
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    text = ctypes.string_at(buf.value, size.value) if buf.value else b""
    libc.free(buf)
    main = text.split(b"</heap>", 1)[0]  # heap 0: the one arena of a process without threads
    # from = the chunk's size field, its in-use bit of the previous chunk included
    return [(int(lo) & ~7, int(n)) for lo, hi, n in _SIZE_LINE.findall(main) if lo == hi]


def seal_free_chunks(rounds: int = 4) -> int:
    """Allocate the small free chunks of glibc's heap and keep them for good; call it just
    before a fork. The number of chunks allocated.

    PERF(memory): what ``seal_free_blocks`` does for pymalloc's pools, for the C heap (numpy,
    libpq, uvloop, Python objects over 512 bytes): a child's first mallocs take the best
    fitting free chunk, and the supervisor's heap holds a thousand small ones scattered
    between live blocks (0.76 MB in 1,112 chunks after the preload), so each such malloc in
    a child copied a 4 KiB page of the supervisor's for a few dozen bytes. Sealed, a child's
    small blocks come from the top of its heap, packed into pages of its own. A chunk taken
    from a bin moves others of its size to glibc's per-thread cache (not in the report):
    a few rounds take those too. bench.parkmem --parked 10 --rounds 0 --load 1000 --load-s 40,
    3 runs each alternated: Pss_Anon at rest, supervisor 17.4 -> 17.0 MB and shard 18.7 ->
    18.4 MB in every run, the tree's 80.5/78.1/78.1 -> 77.0/77.0/79.3 MB (the workers' spread
    is larger than the gain); 1,215 chunks in 4 ms."""
    libc = ctypes.CDLL(None)
    malloc = getattr(libc, "malloc", None)
    if malloc is None:
        return 0
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    sealed = 0
    for _ in range(rounds):
        chunks = [(size, n) for size, n in _glibc_free_chunks() if size < _SEAL_CHUNK_BELOW]
        if not chunks:
            break
        for size, n in chunks:
            # a request of size - 8 bytes is served by a chunk of exactly ``size``
            _CHUNK_SEALS.extend(malloc(size - 8) for _ in range(n))
            sealed += n
    return sealed


def before_fork() -> None:
    """What the supervisor does to its heap just before it forks a child (a shard,
    ``ForkedChild.start``; a front worker, ``FrontArbiter.spawn_worker``): what it made since the
    preload is frozen (``freeze_startup_objects``), its pymalloc pools' free blocks filled
    (``seal_free_blocks``) and its C heap's small free chunks taken (``seal_free_chunks``), so
    that the child copies fewer of the pages it inherits."""
    freeze_startup_objects()
    seal_free_blocks()
    seal_free_chunks()


#: The request caches' ``cache_clear`` (``bounded_caches``), found by the supervisor's preload
#: before it forks (queen_mp/processes/preload.py): the front workers' ``HeapTrim`` clears them.
request_caches: list[Callable[[], None]] = []


def bounded_caches(prefix: str) -> list[Callable[[], None]]:
    """The ``cache_clear`` of every bounded ``functools.lru_cache`` defined at module level in
    the loaded modules named ``prefix...``: caches of request values (answer templates, names,
    timestamps), where an unbounded one (``functools.cache``) is a value made once.

    PERF(memory): call it before a fork, not in a child: it reads every global of those
    modules, and each read writes the object's reference count, copying the page it is on
    (a front worker that looked at startup was 2-3 MB larger at rest)."""
    found = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or module is None:
            continue
        for value in vars(module).values():
            params = getattr(value, "cache_parameters", None)
            if params is not None and getattr(value, "__module__", None) == name \
                    and params()["maxsize"] is not None:
                found.append(value.cache_clear)
    return found


class HeapTrim:
    """Gives the C heap's free pages back to the kernel (glibc's ``malloc_trim``) at the first
    quiet tick after the process worked.

    PERF(memory): what a burst of requests freed stays in glibc's heap, between blocks still
    in use, so it is never returned on its own (glibc trims only the heap's top): after 4 s of
    1,000-item JSON pushes each front worker kept 6 MB more than before (37.4 -> 31.1 MB of
    PSS once trimmed), and carried them into every later load. A trim walks the free lists
    (about 1 ms in a front worker), so it runs only once a tick saw less than ``quiet_cpu_s``
    of the process's CPU, once per quiet spell: never under load, where the pages would be
    used again at once. Without glibc's ``malloc_trim`` (another C library) it does nothing.

    PERF(memory): ``clear`` runs first (``bounded_caches``): the entries a cache holds after a
    burst are the burst's last ones, made in whatever pymalloc arena the burst was using, and
    CPython frees an arena only once all of it is free, so a few hundred KB of entries held
    arenas of MBs. Cleared at the quiet tick and made again by the next requests: a front
    worker's live pymalloc blocks after the push loads of bench/parkmem.py 26.9-27.3 ->
    25.8-26.2 MB, 31 -> 30 arenas; its PSS after them 31.0 -> 29.6 MB, with 1,000 pops
    parked 35.6 -> 34.0 (means of 4 workers, 2 runs each). A request pays a cache's miss
    again (a template 25k instructions) only once per quiet spell.

    PERF(memory): with ``collect`` (the front workers), then a full collection, for CPython's
    free lists rather than garbage (it found none in a front worker): a collection of the
    oldest generation empties the tuple, list, dict, float and context free lists, whose
    blocks a burst leaves spread over its arenas. bench/parkmem.py ``--parked 10 --rounds 0
    --load 1,10,100,1000 --load-s 20``, base and head alternated, two runs each: the workers
    after the 1,000-item load 30.8/31.2, 30.8/30.8 -> 29.6/29.4, 29.5/29.4 MB, the tree's peak
    pushing 1,000 155.4, 154.0 -> 153.5, 152.2 MB. Startup objects are frozen (``gc.freeze``),
    so a collection took 0.5-2.6 ms in a worker; in the shard it took up to 10.6 ms, on the
    push path's loop, and left its memory as it was (56.5, 56.5 -> 56.4, 56.1 MB after the
    loads), so the shard does not collect.

    PERF(memory): with ``busy_every_s`` it also trims under load, at most that often (no
    caches cleared: they are in use), for a process whose load itself leaves free pages behind
    faster than it reuses them: the shard's dedup filter merges and drops runs of a few KB
    all through a push load (``DedupFilter``), and its heap held 11 MB free after the push
    cells' 1,000-item case (bench.dedupfilter --pss --rate 150000, the suite's push rate):
    anonymous pages +45.5 -> +38.4 MB with a trim every 2 s, for 43 trims of 0.5 ms and
    8,400 more page faults over the 88 s of the cells (some 0.03% of a core).
    """

    __slots__ = ("_busy_every", "_clear", "_collect", "_cpu", "_last", "_quiet", "_trim",
                 "_worked")

    def __init__(self, quiet_cpu_s: float = 0.02,
                 trim: Callable[[int], int] | None = None,
                 clear: Sequence[Callable[[], None]] = (),
                 busy_every_s: float = 0.0, collect: bool = False) -> None:
        self._trim = trim if trim is not None else getattr(ctypes.CDLL(None), "malloc_trim",
                                                             None)
        self._clear = tuple(clear)
        self._quiet = quiet_cpu_s
        self._busy_every = busy_every_s
        self._collect = collect
        self._cpu = time.process_time()
        self._last = time.monotonic()
        self._worked = False

    def tick(self) -> bool:
        """Call it every second or so; True if it trimmed."""
        cpu = time.process_time()
        busy, self._cpu = cpu - self._cpu >= self._quiet, cpu
        if busy:
            self._worked = True
            if (not self._busy_every or self._trim is None
                    or time.monotonic() - self._last < self._busy_every):
                return False
        elif not self._worked or self._trim is None:
            return False
        else:
            self._worked = False
            for clear in self._clear:
                clear()
            if self._collect:
                gc.collect()
        self._trim(0)
        self._last = time.monotonic()
        self._cpu = time.process_time()  # the trim's own CPU is not work
        return True
