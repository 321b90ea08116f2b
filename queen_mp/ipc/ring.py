"""Single-producer/single-consumer byte ring in one POSIX shared-memory segment.

Segment layout (all offsets in bytes; one 64-byte cache line per owner so the writer and the
reader never write to the same line)::

    0    config line   magic u64, version u64, capacity u64        (written once by create)
    64   writer line   write index u64                             (stored only by the writer)
    128  reader line   read index u64                              (stored only by the reader)
    192  data          capacity bytes

The indices are monotonically increasing byte counters (never wrapped), so ``write - read`` is
the number of published unread bytes and full/empty are unambiguous. A position in the data area
is ``index % capacity``.

Each record travels as one or more fragments. A fragment is a 16-byte header followed by its
payload, padded to a multiple of 16 bytes::

    u32 length   payload bytes in this fragment
    u32 epoch    the writer's epoch (for the request ring: the worker slot generation)
    u32 flags    FIRST (1): starts a record; MORE (2): more fragments of this record follow
    u32 total    length of the whole record

Wrap-around is a split copy, not a padding marker: capacity and every fragment size are
multiples of 16, so a header never straddles the end of the data area; only a payload may, and
it is copied in two slices. No space is wasted, and any record of up to ``capacity - 16`` bytes
is written as one fragment. Larger records are chunked.

Publication: a fragment exists for the reader only once the writer advanced the write index
past it, after writing its bytes; the reader advances the read index only after it copied the
fragment out, or was done with it in place (``read_each``). A writer killed mid-fragment
publishes nothing; a reader killed before its commit leaves the fragment to the next reader. A
writer killed mid chunked record leaves a published
prefix: the reader drops it when the next FIRST fragment (or a fragment of another epoch)
arrives, so bytes of two records are never glued together. A reader killed mid chunked record
has already released the fragments it consumed (it must, or a record larger than the ring could
never pass): the next reader drops the orphan tail, so that one record is lost.
"""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Callable, Sequence

import posix_ipc

__all__ = ["SCRATCH_MAX", "PendingWrite", "Ring", "RingCorrupt", "RingFull"]

_MAGIC = 0x31474E4952504D51  # b"QMPRING1" read as a little-endian u64
_VERSION = 1

_WRITE_OFF = 64
_READ_OFF = 128
_DATA_OFF = 192
_ALIGN = 16

# NOTE(ipc): memory ordering. The writer stores the fragment bytes, then the write index, as
# separate stores; the reader loads the write index, then the bytes, then stores the read
# index. On x86-64 (TSO: stores are not reordered with stores, loads not with loads, stores
# not with earlier loads) that is sufficient. On aarch64 it is not formally guaranteed: we rely
# on the hundreds of instructions of interpreter work between the two stores; if we ever ship
# on ARM under load, move the index stores into a C helper with release/acquire semantics.
# The indices are read and written through a memoryview cast to "Q": CPython moves each item
# with one fixed-size 8-byte memcpy, which compilers emit as a single aligned 8-byte load or
# store (never torn; the offsets are 8-byte aligned in a page-aligned mmap). NOT
# struct.pack_into: it zero-fills the target before writing the value, so a concurrent reader
# can see a transient 0 (a stress test caught exactly that).
_WRITE_IDX = _WRITE_OFF // 8
_READ_IDX = _READ_OFF // 8
_CONFIG = struct.Struct("<QQQ")
_FRAG = struct.Struct("<IIII")
#: The largest wrapped record ``read_each`` puts together in its scratch buffer, which keeps
#: the size of the largest one (NOTE(memory): up to 256 KiB a reader; a front worker's batches
#: stay within it, ``ipc/shardlink.py``).
SCRATCH_MAX = 256 << 10
_FRAG_SIZE = _FRAG.size

FLAG_FIRST = 1
FLAG_MORE = 2

_MAX_TOTAL = 0xFFFFFFFF
_MAX_EPOCH = 0xFFFFFFFF
_BACKOFF_START = 50e-6
_BACKOFF_MAX = 2e-3


class RingFull(TimeoutError):
    """The reader did not free enough space before the write timeout."""


class RingCorrupt(RuntimeError):
    """The ring's bytes contradict its invariants; the supervisor should reset it."""


def _framed(length: int) -> int:
    return _FRAG_SIZE + ((length + _ALIGN - 1) & -_ALIGN)


def _as_bytes_view(record: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(record)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return view


class Ring:
    """One SPSC ring. A process uses an instance either as the writer or as the reader.

    Create segments with :meth:`create` (supervisor) and open them with :meth:`attach`
    (workers and shards); the constructor is private.
    """

    def __init__(self, name: str, shm: posix_ipc.SharedMemory, *, epoch: int = 0) -> None:
        self.name = name
        size = shm.size
        self._mm = mmap.mmap(shm.fd, size)
        shm.close_fd()
        self._idx = memoryview(self._mm)[:_DATA_OFF].cast("Q")
        magic, version, capacity = _CONFIG.unpack_from(self._mm, 0)
        if magic != _MAGIC or version != _VERSION:
            self.close()
            raise RingCorrupt(f"{name}: not a version {_VERSION} ring segment")
        if size < _DATA_OFF + capacity:
            self.close()
            raise RingCorrupt(f"{name}: segment smaller than its capacity {capacity}")
        self._capacity: int = capacity
        self._max_payload: int = capacity - _FRAG_SIZE
        self._min_chunk: int = max(_ALIGN, (capacity // 4) & -_ALIGN)
        self.epoch = epoch
        self._pending: PendingWrite | None = None
        # Reader-side reassembly of a chunked record (process-local, never in shared memory).
        self._parts: list[bytes] | None = None
        self._parts_epoch = 0
        self._parts_total = 0
        self._parts_len = 0
        #: Records (or orphan fragments) the reader dropped because their writer vanished.
        self.discarded = 0
        # Reader-side: where ``read_each`` puts a record together that wraps the data area.
        self._scratch = bytearray()

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, capacity: int, *, epoch: int = 0, replace: bool = False) -> Ring:
        """Create the segment; the supervisor calls this before it forks anyone."""
        if capacity < 4 * _ALIGN or capacity % _ALIGN:
            raise ValueError(f"capacity must be a multiple of {_ALIGN} and >= {4 * _ALIGN}")
        if replace:
            cls.unlink_name(name)
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=_DATA_OFF + capacity)
        try:
            with mmap.mmap(shm.fd, shm.size) as mm:
                _CONFIG.pack_into(mm, 0, _MAGIC, _VERSION, capacity)
            return cls(name, shm, epoch=epoch)
        except BaseException:
            cls.unlink_name(name)  # never leave a half-made segment behind
            raise

    @classmethod
    def attach(cls, name: str, *, epoch: int = 0) -> Ring:
        """Open an existing segment; ``epoch`` stamps every fragment this process writes."""
        return cls(name, posix_ipc.SharedMemory(name), epoch=epoch)

    def close(self) -> None:
        if not self._mm.closed:
            self._idx.release()
            self._mm.close()

    def unlink(self) -> None:
        self.unlink_name(self.name)

    @staticmethod
    def unlink_name(name: str) -> bool:
        """Remove a segment by name; False if it did not exist."""
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            return False
        return True

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def reset(self) -> None:
        """Drop all unread bytes. Only safe when neither writer nor reader is alive.

        The read index jumps to the write index rather than both going to zero, so the
        counters stay monotonic even for an observer that cached one.
        """
        self._idx[_READ_IDX] = self._idx[_WRITE_IDX]
        self._parts = None
        if self._pending is not None:
            self._pending.abandon()

    # -- introspection -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_record(self) -> int:
        """Largest record that travels as one fragment (and so can go through try_write)."""
        return self._max_payload

    @property
    def used(self) -> int:
        """Published bytes (headers included) that the reader has not consumed yet."""
        idx = self._idx
        return idx[_WRITE_IDX] - idx[_READ_IDX]

    # -- writer --------------------------------------------------------------------------

    def try_write(self, record: bytes | bytearray | memoryview) -> bool:
        """Publish a whole record now, or nothing; False when the ring lacks space.

        Records above :attr:`max_record` cannot be published at once: use :meth:`write` or
        :meth:`begin_write`.
        """
        if self._pending is not None:
            raise RuntimeError("a chunked write is in progress on this ring")
        if isinstance(record, bytes | bytearray):
            n = len(record)
        else:
            record = _as_bytes_view(record)
            n = record.nbytes
        if n > self._max_payload:
            raise ValueError(
                f"record of {n} bytes exceeds max_record {self._max_payload}; use write()"
            )
        idx = self._idx
        w = idx[_WRITE_IDX]
        if self._capacity - (w - idx[_READ_IDX]) < _framed(n):
            return False
        self._put(w, record, n, FLAG_FIRST, n, self.epoch)
        return True

    def try_write_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> bool:
        """``try_write(b"".join(parts))`` without the join: each part is copied to its place
        in the ring, and the record is published whole, or nothing (False: no space). A
        memoryview part is of bytes (its ``len`` is its size).

        PERF(ipc): a front worker's turn of 100-item pushes made a batch of some 25 KB a
        request; joined, a turn of six or more was a block over glibc's mmap threshold
        (``QUEEN_MALLOC_MMAP_THRESHOLD_KB``), mapped, faulted in page by page as the join
        wrote it, copied once more into the ring and unmapped: about 5% of the worker's CPU
        under the suite's 100-item pushes (perf).

        PERF(ipc): its checks and wrap copy repeat ``try_write``'s and ``_put``'s rather than
        ``_put`` writing parts for both: that loop over one part and a shared room check cost
        a push 3.4k instructions (bench.hotpath push1, 200 rounds: 48.69M -> 49.37M)."""
        if self._pending is not None:
            raise RuntimeError("a chunked write is in progress on this ring")
        n = sum(map(len, parts))
        if n > self._max_payload:
            raise ValueError(
                f"record of {n} bytes exceeds max_record {self._max_payload}; use write()"
            )
        idx = self._idx
        w = idx[_WRITE_IDX]
        cap = self._capacity
        if cap - (w - idx[_READ_IDX]) < _framed(n):
            return False
        mm = self._mm
        pos = w % cap
        _FRAG.pack_into(mm, _DATA_OFF + pos, n, self.epoch, FLAG_FIRST, n)
        at = pos + _FRAG_SIZE
        for part in parts:
            if at >= cap:  # the header or the last part ended on the data area's end
                at -= cap
            end = at + len(part)
            if end <= cap:
                mm[_DATA_OFF + at : _DATA_OFF + end] = part
            else:
                first = cap - at
                view = memoryview(part)
                mm[_DATA_OFF + at : _DATA_OFF + cap] = view[:first]
                mm[_DATA_OFF : _DATA_OFF + end - cap] = view[first:]
            at = end
        # Publish: the index store comes after the data stores (see the ordering NOTE).
        idx[_WRITE_IDX] = w + _framed(n)
        return True

    def write(
        self,
        record: bytes | bytearray | memoryview,
        timeout: float | None = None,
        wait: Callable[[float], None] | None = None,
    ) -> None:
        """Publish a record, waiting for space; records of any size (chunked when oversized).

        ``timeout`` bounds each stall: RingFull is raised when no space freed up for that long
        (so a large record through a slowly draining ring does not time out while it moves).
        ``wait(seconds)`` is called between attempts (default: time.sleep with backoff); pass
        a doorbell wait to be woken by the reader instead. On RingFull, a chunked record may
        have been partially published; the reader drops that prefix.
        """
        if _as_bytes_view(record).nbytes <= self._max_payload and self.try_write(record):
            return
        sleep = wait if wait is not None else time.sleep
        pending = self.begin_write(record)
        delay = _BACKOFF_START
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                before = pending.written
                if pending.pump():
                    return
                now = time.monotonic()
                if pending.written != before:
                    delay = _BACKOFF_START
                    deadline = None if timeout is None else now + timeout
                elif deadline is not None and now >= deadline:
                    raise RingFull(
                        f"{self.name}: no space for {timeout}s "
                        f"({pending.written}/{pending.total} bytes of the record written)"
                    )
                sleep(delay if deadline is None else min(delay, max(deadline - now, 0.0)))
                delay = min(delay * 2, _BACKOFF_MAX)
        finally:
            if not pending.done:
                pending.abandon()

    def begin_write(self, record: bytes | bytearray | memoryview) -> PendingWrite:
        """Start a write that the caller advances with ``pump()`` without ever blocking.

        For an event loop that must not block while a record larger than the ring drains.
        Until it is done or abandoned, no other write may start on this ring.
        """
        if self._pending is not None:
            raise RuntimeError("a chunked write is in progress on this ring")
        pending = PendingWrite(self, record)
        self._pending = pending
        return pending

    def _put(
        self,
        w: int,
        payload: bytes | bytearray | memoryview,
        n: int,
        flags: int,
        total: int,
        epoch: int,
    ) -> None:
        """Write one fragment at write index ``w`` and publish it; caller checked space."""
        mm = self._mm
        cap = self._capacity
        pos = w % cap
        _FRAG.pack_into(mm, _DATA_OFF + pos, n, epoch, flags, total)
        start = pos + _FRAG_SIZE
        if start == cap:
            start = 0
        end = start + n
        if end <= cap:
            mm[_DATA_OFF + start : _DATA_OFF + end] = payload
        else:
            view = _as_bytes_view(payload)
            first = cap - start
            mm[_DATA_OFF + start : _DATA_OFF + cap] = view[:first]
            mm[_DATA_OFF : _DATA_OFF + n - first] = view[first:]
        # Publish: the index store comes after the data stores (see the ordering NOTE).
        self._idx[_WRITE_IDX] = w + _framed(n)

    # -- reader --------------------------------------------------------------------------

    def read(self) -> bytes | None:
        """One complete record, or None when none is complete yet (never blocks)."""
        got = self.read_with_epoch()
        return None if got is None else got[0]

    def read_many(self, max_records: int) -> list[bytes]:
        """Up to ``max_records`` complete records, in order (never blocks)."""
        out: list[bytes] = []
        idx = self._idx
        # PERF(ipc): an empty ring is seen here, without a read_with_epoch call: a shard reads
        # every slot's ring at each doorbell, most of them idle, and each read ends on one
        while len(out) < max_records and idx[_WRITE_IDX] != idx[_READ_IDX]:
            got = self.read_with_epoch()
            if got is None:
                break
            out.append(got[0])
        return out

    def read_each(self, max_records: int, use: Callable[[bytes | memoryview], object]) -> int:
        """``use(record)`` for up to ``max_records`` complete records, in order (never blocks);
        how many.

        A record in one fragment that does not wrap is handed over in place, a read-only view
        of the ring's memory, given back to the writer (and the view released) once ``use``
        returned or raised: ``use`` copies whatever it keeps. One that wraps, of up to
        ``SCRATCH_MAX`` bytes, is put together in the reader's scratch buffer and handed over
        as a read-only view of it, on the same terms. Any other record goes as
        ``read_with_epoch`` copies it out.

        PERF(ipc): a shard's push groups of many frames are read in place (their frames
        compressed where they lie: ``PushGroup.unpack``'s ``pack_raw``), not copied out first:
        the copy was 260 of 3,808 instructions a message of 100-item pushes (callgrind,
        bench.shardpath --items 100 --segments 17)."""
        mm = self._mm
        idx = self._idx
        cap = self._capacity
        done = 0
        while done < max_records:
            r = idx[_READ_IDX]
            avail = idx[_WRITE_IDX] - r
            if avail == 0:
                break
            pos = r % cap
            length, _, flags, total = _FRAG.unpack_from(mm, _DATA_OFF + pos)
            start = pos + _FRAG_SIZE
            if start == cap:
                start = 0
            framed = _framed(length)
            whole_record = (flags == FLAG_FIRST and length == total and self._parts is None
                            and length <= self._max_payload and framed <= avail <= cap)
            if whole_record and start + length <= cap:
                with memoryview(mm) as whole, whole[_DATA_OFF + start:_DATA_OFF + start + length
                                                    ].toreadonly() as view:
                    try:
                        use(view)
                    finally:
                        self._commit_read(r + framed)
            elif whole_record and length <= SCRATCH_MAX:
                # PERF(ipc): a wrapped record joined into a fresh block over glibc's mmap
                # threshold (a front worker's batch of 100-item pushes) was mapped, faulted in
                # page by page and unmapped: with the chunked records put together below, some
                # 12% of a shard's CPU under the suite's 100-item pushes (perf). The scratch
                # stays mapped, and warm.
                scratch = self._scratch
                if len(scratch) < length:
                    scratch = self._scratch = bytearray(length)
                first = cap - start
                with memoryview(mm) as whole, memoryview(scratch) as into:
                    into[:first] = whole[_DATA_OFF + start:_DATA_OFF + cap]
                    into[first:length] = whole[_DATA_OFF:_DATA_OFF + length - first]
                    # committed once used, as in place: a reader killed meanwhile leaves
                    # the record to the next one
                    with into[:length].toreadonly() as view:
                        try:
                            use(view)
                        finally:
                            self._commit_read(r + framed)
            else:
                got = self.read_with_epoch()  # checks what the test above did not take
                if got is None:
                    break
                use(got[0])
            done += 1
        return done

    def read_with_epoch(self) -> tuple[bytes, int] | None:
        """Like read(), plus the writer epoch, so a worker can drop replies meant for its
        dead predecessor when the shard stamps them with the request's generation."""
        mm = self._mm
        idx = self._idx
        cap = self._capacity
        while True:
            r = idx[_READ_IDX]
            avail = idx[_WRITE_IDX] - r
            if avail == 0:
                return None
            pos = r % cap
            length, epoch, flags, total = _FRAG.unpack_from(mm, _DATA_OFF + pos)
            framed = _framed(length)
            if length > self._max_payload or framed > avail or avail > cap:
                raise RingCorrupt(
                    f"{self.name}: fragment of {length} bytes at {r} with {avail} published"
                )
            start = pos + _FRAG_SIZE
            if start == cap:
                start = 0
            end = start + length
            if end <= cap:
                payload = mm[_DATA_OFF + start : _DATA_OFF + end]
            else:
                # PERF(ipc): the two pieces joined from views: one copy, not a copy of each
                # and a third to concatenate them (a shard's 100-item push batches wrap a
                # 1 MiB ring every few records: 55 instructions a message, bench.shardpath)
                with memoryview(mm) as whole:
                    payload = b"".join((whole[_DATA_OFF + start : _DATA_OFF + cap],
                                        whole[_DATA_OFF : _DATA_OFF + end - cap]))
            self._commit_read(r + framed)

            if flags & FLAG_FIRST:
                if self._parts is not None:
                    self._drop_partial()
                if not flags & FLAG_MORE:
                    if length != total:
                        self.discarded += 1
                        continue
                    return payload, epoch
                self._parts = [payload]
                self._parts_epoch = epoch
                self._parts_total = total
                self._parts_len = length
                continue
            if self._parts is None or epoch != self._parts_epoch:
                # Orphan continuation: its FIRST fragment went to a dead reader, or its
                # writer died and a new one (new epoch) took over.
                if self._parts is not None:
                    self._drop_partial()
                self.discarded += 1
                continue
            self._parts.append(payload)
            self._parts_len += length
            if flags & FLAG_MORE:
                if self._parts_len >= self._parts_total:
                    self._drop_partial()
                continue
            parts = self._parts
            self._parts = None
            if self._parts_len != self._parts_total:
                self.discarded += 1
                continue
            return b"".join(parts), epoch

    def _commit_read(self, new_read: int) -> None:
        """Release consumed bytes to the writer; a seam the crash tests interpose on."""
        self._idx[_READ_IDX] = new_read

    def _drop_partial(self) -> None:
        self._parts = None
        self.discarded += 1


class PendingWrite:
    """A record being published fragment by fragment as the reader frees space."""

    def __init__(self, ring: Ring, record: bytes | bytearray | memoryview) -> None:
        self._ring = ring
        self._view = _as_bytes_view(record)
        self.total: int = self._view.nbytes
        if self.total > _MAX_TOTAL:
            raise ValueError(f"record of {self.total} bytes exceeds {_MAX_TOTAL}")
        if not 0 <= ring.epoch <= _MAX_EPOCH:
            raise ValueError(f"epoch {ring.epoch} does not fit in u32")
        self._epoch = ring.epoch
        #: Bytes of the record published so far.
        self.written = 0
        self.done = False
        self._started = False
        self._abandoned = False

    def pump(self) -> bool:
        """Publish as many fragments as fit now; True once the whole record is published."""
        if self.done:
            return True
        if self._abandoned:
            raise RuntimeError("this write was abandoned")
        ring = self._ring
        idx = ring._idx
        total = self.total
        # A record that fits travels whole; a larger one in chunks of at least _min_chunk
        # (or its tail), so a slow reader does not turn it into a stream of tiny fragments.
        min_first = total if total <= ring._max_payload else ring._min_chunk
        while not self.done:
            w = idx[_WRITE_IDX]
            free = ring._capacity - (w - idx[_READ_IDX])
            room = (free - _FRAG_SIZE) & -_ALIGN if free > _FRAG_SIZE else 0
            remaining = total - self.written
            n = min(remaining, ring._max_payload, room)
            if n < min(remaining, min_first) or _framed(n) > free:
                return False
            flags = 0 if self._started else FLAG_FIRST
            if self.written + n < total:
                flags |= FLAG_MORE
            start = self.written
            ring._put(w, self._view[start : start + n], n, flags, total, self._epoch)
            self._started = True
            self.written += n
            if self.written == total:
                self.done = True
                ring._pending = None
        return True

    def abandon(self) -> None:
        """Give up; a published prefix is dropped by the reader when the next record starts."""
        if self._ring._pending is self:
            self._ring._pending = None
        self._abandoned = True
