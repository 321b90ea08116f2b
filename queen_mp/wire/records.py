"""Ring records between a front worker and a shard process (design.md, style rule 10).

Every record starts with a kind byte (``peek_kind``), then a fixed little-endian header, then
variable parts whose lengths the header gives. Both ends run the same build, so there is no
version field; a record that does not decode is a bug or a corrupt ring and raises
RecordDecodeError with the raw bytes, never a half-built record.

``generation`` and ``slot`` name the sender's worker slot: a verdict for a previous generation
of a slot is dropped by the new worker (design.md: a replaced worker's requests die with it).

Layouts::

    PushGroup   u8 kind=1 | u32 generation | u16 slot | u64 request_id | u32 group_index
                | u64 deadline_ms | 16B tenant | u32 count | u16 queue_len | u16 partition_len
                | u32 piece_count | queue | partition | 16B x count hashes
                | piece_count x (u8 kind | u32 count | u32 len | len bytes)
    PushVerdict u8 kind=2 | u32 generation | u16 slot | u64 request_id | u32 group_index
                | u8 status | i64 partition_id | i64 created_at_us | u32 n | u32 dup_count
                | u32 error_len | error | n x u8 status | n x i64 offset | 16B x dup_count ids
    QueuedRun   u8 kind=7 | u32 generation | u16 slot | u64 request_id | u32 group_index
                | i64 partition_id | i64 created_at_us | i64 first | u32 count
                (a PushVerdict, status 0, of count >= 2 frames all queued at first, first + 1...)
    LeaseGrant  u8 kind=3 | 16B tenant | 16B lease | i64 partition_id | i64 batch_end
                | u64 expires_ms | u16 group_len | u16 queue_len | u32 n | group | queue
                | 16B x n hashes, ascending, distinct   (one-way: pop -> ack shard)
    AckRequest  u8 kind=4 | u32 generation | u16 slot | u64 request_id | u32 group_index
                | 16B tenant | 16B lease | i64 partition_id | u16 group_len | u32 n | group
                | 16B x n hashes, ascending, distinct   (a whole-batch `completed` ack)
    AckVerdict  u8 kind=5 | u32 generation | u16 slot | u64 request_id | u32 group_index
                | u8 status | i64 old | i64 new
    RecordBatch u8 kind=6 | u32 n | n x u32 length | the n records back to back
                                                       (what one side wrote in one loop turn)
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise, repeat
from operator import itemgetter
from typing import NamedTuple, Self

import msgspec

from queen_mp.wire.errors import RecordDecodeError
from queen_mp.wire.frames import CODEC_ZSTD, pack_chunk, pack_chunk_zstd, zstd_compress

__all__ = [
    "ACK_COMMITTED",
    "ACK_FAILED",
    "ACK_MISS",
    "ACK_REJECTED",
    "ITEM_DUPLICATE",
    "ITEM_QUEUED",
    "KIND_ACK_REQUEST",
    "KIND_ACK_VERDICT",
    "KIND_LEASE_GRANT",
    "KIND_PUSH_GROUP",
    "KIND_PUSH_VERDICT",
    "KIND_RECORD_BATCH",
    "PIECE_RAW",
    "PIECE_ZSTD",
    "RECORD_TYPES",
    "VERDICT_ERROR",
    "VERDICT_OK",
    "AckRequest",
    "AckVerdict",
    "ItemVerdict",
    "LeaseGrant",
    "Piece",
    "PushGroup",
    "PushVerdict",
    "Record",
    "RecordBatch",
    "batch_parts",
    "blob_from_pieces",
    "hash_set",
    "pack_batch",
    "pack_push_group",
    "pack_queued_one",
    "pack_queued_run",
    "peek_kind",
    "unpack_record",
]

KIND_PUSH_GROUP = 1
KIND_PUSH_VERDICT = 2
KIND_LEASE_GRANT = 3
KIND_ACK_REQUEST = 4
KIND_ACK_VERDICT = 5
KIND_RECORD_BATCH = 6
KIND_QUEUED_RUN = 7

ACK_COMMITTED = 0  # the registry matched and the cursor advance committed
ACK_MISS = 1  # no matching registry entry: take the SQL path
ACK_REJECTED = 2  # PostgreSQL refused the positional advance (stale lease): SQL path
ACK_FAILED = 3  # the flush failed (outcome unknown): SQL path, whose repeat rule settles it

PIECE_RAW = 0  # concatenated frames; the shard compresses them into its segment
PIECE_ZSTD = 1  # one client zstd frame, stored as is (docs/api.md §3.2)

VERDICT_OK = 0
VERDICT_ERROR = 1  # the whole group failed; nothing of it is stored

ITEM_QUEUED = 0
ITEM_DUPLICATE = 1

_BIG_ENDIAN_HOST = sys.byteorder == "big"

_PUSH_GROUP_HEAD = struct.Struct("<BIHQIQ16sIHHI")
_PIECE_HEAD = struct.Struct("<BII")
_PUSH_GROUP_HEAD_SIZE = _PUSH_GROUP_HEAD.size
_PUSH_VERDICT_HEAD = struct.Struct("<BIHQIBqqIII")
_LEASE_GRANT_HEAD = struct.Struct("<B16s16sqqQHHI")
_ACK_REQUEST_HEAD = struct.Struct("<BIHQI16s16sqHI")
_ACK_VERDICT = struct.Struct("<BIHQIBqq")
_BATCH_HEAD = struct.Struct("<BI")
_QUEUED_RUN = struct.Struct("<BIHQIqqqI")
_MAX_I64 = (1 << 63) - 1


def peek_kind(buf: bytes | bytearray | memoryview) -> int:
    """The kind byte of a record, to pick its class before unpacking."""
    if not len(buf):
        raise RecordDecodeError("empty record", buf)
    return buf[0]


def _decode(raw: bytes, what: str, buf: bytes | bytearray | memoryview) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordDecodeError(f"{what} is not UTF-8", buf) from None


class Piece(NamedTuple):
    """A run of ``count`` frames of a PushGroup, raw or as a zstd frame (a client's, or the
    shard's as it read the group: ``PushGroup.unpack``'s ``pack_raw``)."""

    # PERF(wire): a NamedTuple, as ItemVerdict: built in C (0.15 against 1.3 us for a frozen
    # dataclass), once per group on each side of the ring.
    kind: int
    count: int
    data: bytes


_CUT_MAX = 1 << 14  # RecordBatch records up to this size are cut as bytes
_TUPLE_NEW = tuple.__new__  # a NamedTuple from its fields, without _make's Python frame
_PIECE_COUNT = itemgetter(1)  # Piece.count


def pack_push_group(generation: int, slot: int, request_id: int, group_index: int,
                    tenant: bytes, queue: str, partition: str, hashes: bytes, count: int,
                    pieces: Sequence[Piece], deadline_ms: int) -> bytes:
    """``PushGroup(...).pack()`` of these fields, without building the record: the front
    worker packs one per group it routes (PERF(wire): a NamedTuple's ``__new__`` is a Python
    call, with keywords dearer still)."""
    queue_raw = queue.encode("utf-8")
    partition_raw = partition.encode("utf-8")
    if len(tenant) != 16:
        raise ValueError(f"tenant of {len(tenant)} bytes, not 16")
    if len(hashes) != 16 * count:
        raise ValueError(f"{len(hashes)} hash bytes for {count} frames")
    if len(pieces) == 1:
        # PERF(wire): one piece (every group of a JSON push) packed in one join, without
        # the sum of the counts and the loop (10.4k instructions a 1-item group, now 5k)
        kind, piece_count, data = pieces[0]
        if piece_count != count:
            raise ValueError(f"piece counts do not add up to {count}")
        if kind != PIECE_RAW and kind != PIECE_ZSTD:
            raise ValueError(f"unknown piece kind {kind}")
        try:
            return b"".join((
                _PUSH_GROUP_HEAD.pack(KIND_PUSH_GROUP, generation, slot, request_id,
                                      group_index, deadline_ms, tenant, count, len(queue_raw),
                                      len(partition_raw), 1),
                queue_raw, partition_raw, hashes, _PIECE_HEAD.pack(kind, count, len(data)),
                data))
        except struct.error as ex:
            raise ValueError(f"PushGroup field out of range: {ex}") from None
    if sum(map(_PIECE_COUNT, pieces)) != count:
        raise ValueError(f"piece counts do not add up to {count}")
    try:
        parts = [
            _PUSH_GROUP_HEAD.pack(KIND_PUSH_GROUP, generation, slot, request_id, group_index,
                                  deadline_ms, tenant, count, len(queue_raw),
                                  len(partition_raw), len(pieces)),
            queue_raw,
            partition_raw,
            hashes,
        ]
        for piece in pieces:
            if piece.kind not in (PIECE_RAW, PIECE_ZSTD):
                raise ValueError(f"unknown piece kind {piece.kind}")
            parts.append(_PIECE_HEAD.pack(piece.kind, piece.count, len(piece.data)))
            parts.append(piece.data)
    except struct.error as ex:
        raise ValueError(f"PushGroup field out of range: {ex}") from None
    return b"".join(parts)


# PushGroup.unpack's struct of a one-piece group's names, hashes and piece header, by
# (queue bytes, partition bytes, frames); cleared when full
_ONE_PIECE: dict[tuple[int, int, int], tuple[struct.Struct, int]] = {}  # and its size
_ONE_PIECE_MAX = 4096
#: Raw pieces of more than one frame and this many bytes or more are compressed as a shard reads
#: them (``PushGroup.unpack``'s ``pack_raw``): alone they compress about as well as joined
#: with the partition's other groups of a bundle, which smaller ones may be
PACK_RAW_MIN = 4096


def _one_piece_tail(queue_len: int, partition_len: int, count: int
                    ) -> tuple[struct.Struct, int]:
    if len(_ONE_PIECE) >= _ONE_PIECE_MAX:
        _ONE_PIECE.clear()
    tail = struct.Struct(f"<{queue_len}s{partition_len}s{16 * count}s{_PIECE_HEAD.format[1:]}")
    got = _ONE_PIECE[(queue_len, partition_len, count)] = (tail, tail.size)
    return got


def _piece(raw: bytes | bytearray | memoryview, view: bool, kind: int, count: int, lo: int, hi: int,
           pack_raw: bool) -> Piece:
    """The piece of ``count`` frames at ``raw[lo:hi]`` (``PushGroup.unpack``): sliced from
    bytes, copied out of a view, or with ``pack_raw`` a raw piece of more than one frame and
    ``PACK_RAW_MIN`` bytes or more compressed where it lies, a zstd piece."""
    if pack_raw and kind == PIECE_RAW and count > 1 and hi - lo >= PACK_RAW_MIN:
        return _TUPLE_NEW(Piece, (PIECE_ZSTD, count,
                                  zstd_compress((raw if view else memoryview(raw))[lo:hi])))
    return _TUPLE_NEW(Piece, (kind, count, bytes(raw[lo:hi]) if view else raw[lo:hi]))


class PushGroup(NamedTuple):
    """A front worker's frames for one (tenant, queue, partition), to its owning shard.

    ``hashes`` holds one xxh3_128 per frame in frame order across all pieces, so the shard
    dedups without reparsing; they are distinct (a request's repeated transactionId is not
    sent: it takes its first copy's verdict, ``front.ingest.group_items``, and the spool's
    drain likewise), which the shard relies on (``fusion.build_segment`` stores a whole group
    as it is). The shard may drop the group after ``deadline_ms`` (Unix ms), when the worker
    has answered ``503 timeout`` anyway.

    PERF(wire): a NamedTuple, built in C from its fields: the shard unpacks one per pushed
    group, and a slots dataclass took eleven descriptor calls to fill (9.4k of the 26k
    instructions of a 1-item group's unpack, callgrind).
    """

    generation: int
    slot: int
    request_id: int
    group_index: int
    tenant: bytes
    queue: str
    partition: str
    hashes: bytes
    count: int
    pieces: tuple[Piece, ...]
    deadline_ms: int

    def pack(self) -> bytes:
        return pack_push_group(*self)

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview, start: int = 0,
               stop: int = -1, pack_raw: bool = False) -> Self:
        """The group in ``buf`` (from ``start`` up to ``stop``, -1: its end); with
        ``pack_raw``, each raw piece of more than one frame and ``PACK_RAW_MIN`` bytes or
        more comes out compressed, a zstd piece (as a client's), read where it lies.

        PERF(wire): bytes are sliced as they are (a shard reads every group in place, at the
        bounds of its ``RecordBatch``); anything else through one view, its slices copied to
        bytes. Either way each piece's frames are copied once, but for ``pack_raw``'s: the
        shard reads its ring in place (``Ring.read_each``), and zstd reads them there, as it
        read them at the bundle's flush, to the same stored chunk; the copy out of the ring
        and the piece's copy out of the record were 515 of 3,808 instructions a message of
        100-item pushes, one each a byte (callgrind, bench.shardpath --items 100
        --segments 17)."""
        view = type(buf) is not bytes
        raw = memoryview(buf) if view else buf
        end = len(raw) if stop < 0 else stop
        if end - start < _PUSH_GROUP_HEAD_SIZE:
            raise RecordDecodeError(
                f"PushGroup of {end - start} bytes, shorter than its header", buf)
        (
            kind,
            generation,
            slot,
            request_id,
            group_index,
            deadline_ms,
            tenant,
            count,
            queue_len,
            partition_len,
            piece_count,
        ) = _PUSH_GROUP_HEAD.unpack_from(raw, start)
        if kind != KIND_PUSH_GROUP:
            raise RecordDecodeError(f"kind {kind}, not a PushGroup", buf)
        at = start + _PUSH_GROUP_HEAD_SIZE
        if piece_count == 1:
            # PERF(wire): one piece (every group of a JSON push): names, hashes and the piece
            # header by one struct of these lengths, not three slices and a second unpack
            # (14.7k -> 13.0k instructions a 1-item group, callgrind)
            cached = _ONE_PIECE.get((queue_len, partition_len, count))
            if cached is None:
                cached = _one_piece_tail(queue_len, partition_len, count)
            # PERF(wire): the sizes kept as ints: ``Struct.size`` is a getset descriptor,
            # which Python 3.11 reads through a type lookup and a call (three a group)
            tail, tail_size = cached
            data_at = at + tail_size
            if data_at <= end:
                (queue_raw, partition_raw, hashes, piece_kind, piece_count_,
                 length) = tail.unpack_from(raw, at)
                if (piece_kind <= PIECE_ZSTD and data_at + length == end
                        and piece_count_ == count):
                    # decoded inline, not through ``_decode``: two calls a group on the shard
                    try:
                        queue = queue_raw.decode()
                        partition = partition_raw.decode()
                    except UnicodeDecodeError:
                        raise RecordDecodeError("queue or partition is not UTF-8",
                                                buf) from None
                    return _TUPLE_NEW(cls, (generation, slot, request_id, group_index, tenant,
                                            queue, partition, hashes, count,
                                            (_piece(raw, view, piece_kind, count, data_at, end,
                                                    pack_raw),),
                                            deadline_ms))
            # not well formed: the general path below says how
        hashes_at = at + queue_len + partition_len
        stop = hashes_at + 16 * count
        if stop > end:
            raise RecordDecodeError("PushGroup names or hashes run past the end", buf)
        queue = _decode(bytes(raw[at : at + queue_len]), "queue", buf)
        partition = _decode(bytes(raw[at + queue_len : hashes_at]), "partition", buf)
        hashes = bytes(raw[hashes_at:stop])
        at = stop
        pieces = []
        total = 0
        for _ in range(piece_count):
            if at + _PIECE_HEAD.size > end:
                raise RecordDecodeError("PushGroup piece header runs past the end", buf)
            piece_kind, piece_count_, length = _PIECE_HEAD.unpack_from(raw, at)
            if piece_kind not in (PIECE_RAW, PIECE_ZSTD):
                raise RecordDecodeError(f"unknown piece kind {piece_kind}", buf)
            at += _PIECE_HEAD.size
            if at + length > end:
                raise RecordDecodeError("PushGroup piece runs past the end", buf)
            pieces.append(_piece(raw, view, piece_kind, piece_count_, at, at + length, pack_raw))
            total += piece_count_
            at += length
        if at != end:
            raise RecordDecodeError(f"{end - at} trailing byte(s) after the PushGroup", buf)
        if total != count:
            raise RecordDecodeError(f"piece counts add up to {total}, not {count}", buf)
        return _TUPLE_NEW(cls, (generation, slot, request_id, group_index, tenant, queue,
                                partition, hashes, count, tuple(pieces), deadline_ms))



class ItemVerdict(NamedTuple):
    """One frame's outcome. ``original_id`` is b"" when queued; for a duplicate the original
    message id, or the zero UUID once retention removed it (``offset`` then -1)."""

    # PERF(wire): a NamedTuple, not a frozen dataclass: a 1000-frame verdict builds and
    # transposes its items in C (zip(*items), map(_make)) about 3x faster.
    status: int
    offset: int
    original_id: bytes


_make_item = ItemVerdict._make
# status byte -> the length its original_id must have (0 queued, 16 duplicate)
_ID_SIZE = bytes([0, 16]) + bytes(254)


class PushVerdict(msgspec.Struct, frozen=True, gc=False):
    """A shard's answer for one PushGroup; ``items`` in the group's frame order.

    PERF(wire): a frozen Struct, built in C: a frozen dataclass's ``__init__`` is a Python
    call and an ``object.__setattr__`` per field (about 10k instructions), once per group on
    each side of the ring."""

    generation: int
    slot: int
    request_id: int
    group_index: int
    status: int
    partition_id: int = 0
    created_at_us: int = 0
    error: str = ""
    items: tuple[ItemVerdict, ...] = ()
    # (first offset, count): every frame queued at consecutive offsets, in place of ``items``.
    # PERF(wire): the shard's common verdict is packed without a record per frame; it
    # unpacks to the same ``items`` as the per-frame form.
    queued_run: tuple[int, int] | None = None

    def each(self) -> tuple[ItemVerdict, ...]:
        """Every frame's outcome, a queued run's too."""
        if self.queued_run is None:
            return self.items
        first, n = self.queued_run
        return tuple(map(_TUPLE_NEW, repeat(ItemVerdict),
                         zip(repeat(ITEM_QUEUED, n), range(first, first + n), repeat(b""))))

    def pack(self) -> bytes:
        error = self.error.encode("utf-8")
        items = self.items
        n = len(items)
        if self.queued_run is not None:
            if items:
                raise ValueError("PushVerdict with both items and a queued run")
            first, n = self.queued_run
            if n > 1 and self.status == VERDICT_OK and not error:
                return pack_queued_run(self.generation, self.slot, self.request_id,
                                       self.group_index, self.partition_id,
                                       self.created_at_us, first, n)
            statuses, ids, dup_count = bytes(n), b"", 0
            try:
                offsets = array("q", range(first, first + n))
            except OverflowError as ex:
                raise ValueError(f"PushVerdict queued run out of range: {ex}") from None
            if _BIG_ENDIAN_HOST:
                offsets.byteswap()
        elif items:
            # PERF(wire): transpose in C; three columns instead of n small records.
            statuses_t, offsets_t, ids_t = zip(*items, strict=True)
            try:
                statuses = bytes(statuses_t)
                offsets = array("q", offsets_t)
            except (ValueError, OverflowError, TypeError) as ex:
                raise ValueError(f"ItemVerdict status or offset out of range: {ex}") from None
            if statuses.translate(None, b"\x00\x01"):
                raise ValueError("ItemVerdict status other than 0 (queued) or 1 (duplicate)")
            try:
                id_sizes_ok = bytes(map(len, ids_t)) == statuses.translate(_ID_SIZE)
            except (ValueError, TypeError):
                id_sizes_ok = False
            if not id_sizes_ok:
                raise ValueError("original_id must be 16 bytes for a duplicate, b'' when queued")
            dup_count = len(items) - statuses.count(0)
            ids = b"".join(ids_t)
            if _BIG_ENDIAN_HOST:
                offsets.byteswap()
        else:
            statuses = ids = b""
            offsets = array("q")
            dup_count = 0
        try:
            head = _PUSH_VERDICT_HEAD.pack(
                KIND_PUSH_VERDICT,
                self.generation,
                self.slot,
                self.request_id,
                self.group_index,
                self.status,
                self.partition_id,
                self.created_at_us,
                n,
                dup_count,
                len(error),
            )
        except struct.error as ex:
            raise ValueError(f"PushVerdict field out of range: {ex}") from None
        return b"".join((head, error, statuses, offsets, ids))

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview) -> Self:
        if len(buf) == _QUEUED_ONE.size:
            # PERF(wire): a 1-item push's verdict (``pack_queued_run`` of one frame) read by
            # one struct: 24k instructions through the general path below, 7.4k this way (with
            # the caller's read of its one item)
            (kind, generation, slot, request_id, group_index, status, partition_id,
             created_at_us, n, dup_count, error_len, item, offset) = _QUEUED_ONE.unpack_from(buf)
            if kind == KIND_PUSH_VERDICT and n == 1 and not dup_count and not error_len \
                    and item == ITEM_QUEUED:
                return cls(generation, slot, request_id, group_index, status, partition_id,
                           created_at_us, "", (_TUPLE_NEW(ItemVerdict, (item, offset, b"")),))
        if buf and buf[0] == KIND_QUEUED_RUN:
            return cls._unpack_run(buf)
        view = memoryview(buf)
        end = len(view)
        if end < _PUSH_VERDICT_HEAD.size:
            raise RecordDecodeError(f"PushVerdict of {end} bytes, shorter than its header", buf)
        (
            kind,
            generation,
            slot,
            request_id,
            group_index,
            status,
            partition_id,
            created_at_us,
            n,
            dup_count,
            error_len,
        ) = _PUSH_VERDICT_HEAD.unpack_from(view, 0)
        if kind != KIND_PUSH_VERDICT:
            raise RecordDecodeError(f"kind {kind}, not a PushVerdict", buf)
        at = _PUSH_VERDICT_HEAD.size
        statuses_at = at + error_len
        offsets_at = statuses_at + n
        ids_at = offsets_at + 8 * n
        if ids_at + 16 * dup_count != end:
            raise RecordDecodeError(f"PushVerdict of {end} bytes does not match its {n} items", buf)
        error = _decode(bytes(view[at:statuses_at]), "error", buf)
        statuses = bytes(view[statuses_at:offsets_at])
        if statuses.translate(None, b"\x00\x01"):
            raise RecordDecodeError("item status other than 0 or 1", buf)
        if n - statuses.count(0) != dup_count:
            raise RecordDecodeError(f"{dup_count} ids for a different number of duplicates", buf)
        offsets = array("q")
        offsets.frombytes(view[offsets_at:ids_at])
        if _BIG_ENDIAN_HOST:
            offsets.byteswap()
        if not dup_count:
            if n > 1 and _consecutive(offsets, n):
                # PERF(wire): the shard's common verdict (every frame queued, one run) stays
                # a run: no ItemVerdict per frame for the front worker to build and then read
                # back into a run (a 100-item group: 243k instructions, now about 10k)
                return cls(generation, slot, request_id, group_index, status, partition_id,
                           created_at_us, error, (), (offsets[0], n))
            # PERF(wire): the common all-queued verdict needs no per-item branch.
            items = tuple(map(_TUPLE_NEW, repeat(ItemVerdict),
                              zip(statuses, offsets, repeat(b""))))
        else:
            ids = bytes(view[ids_at:end])
            dup_ids = iter([ids[k : k + 16] for k in range(0, len(ids), 16)])
            items = tuple(
                _make_item((s, o, next(dup_ids) if s else b""))
                for s, o in zip(statuses, offsets, strict=True)
            )
        return cls(
            generation,
            slot,
            request_id,
            group_index,
            status,
            partition_id,
            created_at_us,
            error,
            items,
        )

    @classmethod
    def _unpack_run(cls, buf: bytes | bytearray | memoryview) -> Self:
        """A QueuedRun record (``pack_queued_run``'s of 2 frames or more), of its size."""
        if len(buf) != _QUEUED_RUN.size:
            raise RecordDecodeError(f"QueuedRun of {len(buf)} bytes, not {_QUEUED_RUN.size}",
                                    buf)
        (_, generation, slot, request_id, group_index, partition_id, created_at_us, first,
         count) = _QUEUED_RUN.unpack_from(buf, 0)
        if count < 2 or first > _MAX_I64 - count + 1:
            raise RecordDecodeError(f"QueuedRun of {count} frames from {first}", buf)
        return cls(generation, slot, request_id, group_index, VERDICT_OK, partition_id,
                   created_at_us, "", (), (first, count))


_RUN_BULK = 32  # offsets from which numpy's fixed cost (some 8k instructions) pays


def _consecutive(offsets: array[int], n: int) -> bool:
    """Whether the ``n`` offsets count up by one from the first."""
    first = offsets[0]
    if offsets[-1] - first != n - 1:
        return False
    if n < _RUN_BULK:
        return offsets == array("q", range(first, first + n))
    import numpy  # NOTE(wire): only here, in a front worker; never in the supervisor

    steps = numpy.frombuffer(offsets, numpy.int64)
    return bool((numpy.diff(steps) == 1).all())


_QUEUED_ONE = struct.Struct("<BIHQIBqqIIIBq")  # a PushVerdict head, one status, one offset
#: ``pack_queued_run(generation, slot, request_id, group_index, partition_id, created_at_us,
#: first, 1)`` when called with ``(KIND_PUSH_VERDICT, generation, slot, request_id,
#: group_index, VERDICT_OK, partition_id, created_at_us, 1, 0, 0, ITEM_QUEUED, first)``: the
#: struct's own pack, so a C call. PERF(shard): the verdict of every 1-item group it stores,
#: packed where the shard reads the bundle's verdicts, without a Python frame; a value out
#: of range raises ``struct.error``
pack_queued_one = _QUEUED_ONE.pack


def pack_queued_run(generation: int, slot: int, request_id: int, group_index: int,
                    partition_id: int, created_at_us: int, first: int, count: int) -> bytes:
    """``PushVerdict(..., status=VERDICT_OK, queued_run=(first, count)).pack()``, without
    building the record: the shard's common answer, once per group it stored.

    PERF(wire): 2 frames or more as a QueuedRun record, a fixed head without an offset per
    frame: a 100-frame group's verdict took 60k instructions to pack (an ``array`` of its
    offsets) and 61k to unpack (its statuses checked, its offsets read and found
    consecutive), a 10-frame one 13k and 29k; as a QueuedRun 3.6k and 9k whatever the count
    (callgrind). One frame keeps the per-frame form."""
    try:
        if count == 1:
            return _QUEUED_ONE.pack(KIND_PUSH_VERDICT, generation, slot, request_id,
                                    group_index, VERDICT_OK, partition_id, created_at_us, 1, 0,
                                    0, ITEM_QUEUED, first)
        if count > 1:
            if first > _MAX_I64 - count + 1:
                raise OverflowError(f"offsets from {first} past int64")
            return _QUEUED_RUN.pack(KIND_QUEUED_RUN, generation, slot, request_id, group_index,
                                    partition_id, created_at_us, first, count)
        return _PUSH_VERDICT_HEAD.pack(KIND_PUSH_VERDICT, generation, slot, request_id,
                                       group_index, VERDICT_OK, partition_id, created_at_us,
                                       0, 0, 0)
    except (struct.error, OverflowError) as ex:
        raise ValueError(f"PushVerdict queued run out of range: {ex}") from None


_SET_BULK = 32  # hashes from which numpy's sort pays (its fixed cost, some 25k instructions)


def hash_set(hashes: Iterable[bytes]) -> bytes:
    """A set of 16-byte hashes as LeaseGrant and AckRequest carry it: ascending, distinct,
    back to back, so that two sets are equal exactly when their bytes are.

    PERF(ack): the ack shard compares a 100-message ack with its grant as two byte strings;
    a frozenset per record cost one object per hash on each side and in each unpack. From
    ``_SET_BULK`` hashes numpy sorts them as 16-byte strings (unsigned, byte by byte, as
    bytes compare) and drops repeats: a pop's grant and its ack each made a set and sorted
    100 bytes objects, 108k instructions, 56k so (callgrind)."""
    listed = hashes if isinstance(hashes, list) else list(hashes)
    if len(listed) < _SET_BULK:
        return b"".join(sorted(set(listed)))
    import numpy  # NOTE(wire): only here, in a front worker; never in the supervisor

    ordered = numpy.sort(numpy.frombuffer(b"".join(listed), "S16"))
    later = ordered[1:] != ordered[:-1]  # each one that differs from the one before it
    if not later.all():
        ordered = numpy.concatenate((ordered[:1], ordered[1:][later]))
    return ordered.tobytes()  # type: ignore[no-any-return]


def _hash_bytes(view: memoryview, at: int, n: int, buf: bytes | bytearray | memoryview
                ) -> bytes:
    if at + 16 * n != len(view):
        raise RecordDecodeError(f"record of {len(view)} bytes does not hold its {n} hashes", buf)
    return bytes(view[at:])


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """A leasing pop tells the partition's ack shard what it delivered (the ack registry)."""

    tenant: bytes
    lease: bytes
    partition_id: int
    batch_end: int
    expires_ms: int
    group: str
    queue: str
    hashes: bytes  # hash_set() of what the pop delivered

    def pack(self) -> bytes:
        group = self.group.encode("utf-8")
        queue = self.queue.encode("utf-8")
        head = _LEASE_GRANT_HEAD.pack(KIND_LEASE_GRANT, self.tenant, self.lease,
                                      self.partition_id, self.batch_end, self.expires_ms,
                                      len(group), len(queue), len(self.hashes) // 16)
        return b"".join((head, group, queue, self.hashes))

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview) -> Self:
        view = memoryview(buf)
        if len(view) < _LEASE_GRANT_HEAD.size:
            raise RecordDecodeError("LeaseGrant shorter than its header", buf)
        (kind, tenant, lease, pid, end, expires, glen, qlen,
         n) = _LEASE_GRANT_HEAD.unpack_from(view, 0)
        if kind != KIND_LEASE_GRANT:
            raise RecordDecodeError(f"kind {kind}, not a LeaseGrant", buf)
        at = _LEASE_GRANT_HEAD.size
        group = _decode(bytes(view[at:at + glen]), "group", buf)
        queue = _decode(bytes(view[at + glen:at + glen + qlen]), "queue", buf)
        return cls(tenant, lease, pid, end, expires, group, queue,
                   _hash_bytes(view, at + glen + qlen, n, buf))


@dataclass(frozen=True, slots=True)
class AckRequest:
    """A whole-batch ``completed`` ack of one (partition, group, lease), for the fast path."""

    generation: int
    slot: int
    request_id: int
    group_index: int
    tenant: bytes
    lease: bytes
    partition_id: int
    group: str
    hashes: bytes  # hash_set() of the acked transactionIds

    def pack(self) -> bytes:
        group = self.group.encode("utf-8")
        head = _ACK_REQUEST_HEAD.pack(KIND_ACK_REQUEST, self.generation, self.slot,
                                      self.request_id, self.group_index, self.tenant,
                                      self.lease, self.partition_id, len(group),
                                      len(self.hashes) // 16)
        return b"".join((head, group, self.hashes))

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview) -> Self:
        view = memoryview(buf)
        if len(view) < _ACK_REQUEST_HEAD.size:
            raise RecordDecodeError("AckRequest shorter than its header", buf)
        (kind, generation, slot, request_id, group_index, tenant, lease, pid, glen,
         n) = _ACK_REQUEST_HEAD.unpack_from(view, 0)
        if kind != KIND_ACK_REQUEST:
            raise RecordDecodeError(f"kind {kind}, not an AckRequest", buf)
        at = _ACK_REQUEST_HEAD.size
        group = _decode(bytes(view[at:at + glen]), "group", buf)
        return cls(generation, slot, request_id, group_index, tenant, lease, pid, group,
                   _hash_bytes(view, at + glen, n, buf))


@dataclass(frozen=True, slots=True)
class AckVerdict:
    """The ack shard's answer to an AckRequest (ACK_*); old/new cursors when committed."""

    generation: int
    slot: int
    request_id: int
    group_index: int
    status: int
    old: int = 0
    new: int = 0

    def pack(self) -> bytes:
        return _ACK_VERDICT.pack(KIND_ACK_VERDICT, self.generation, self.slot, self.request_id,
                                 self.group_index, self.status, self.old, self.new)

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview) -> Self:
        if len(buf) != _ACK_VERDICT.size:
            raise RecordDecodeError(f"AckVerdict of {len(buf)} bytes", buf)
        kind, *fields = _ACK_VERDICT.unpack_from(buf, 0)
        if kind != KIND_ACK_VERDICT:
            raise RecordDecodeError(f"kind {kind}, not an AckVerdict", buf)
        return cls(*fields)


def pack_batch(records: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """``RecordBatch(tuple(records)).pack()`` without building the record: PERF(shard): the
    frozen dataclass's ``__init__`` (a Python frame and ``object.__setattr__``) at every
    flush of a slot's verdicts."""
    return b"".join(batch_parts(records))


def batch_parts(records: Sequence[bytes | bytearray | memoryview]
                ) -> list[bytes | bytearray | memoryview]:
    """``pack_batch(records)`` as the pieces it joins: its head, then the records as they
    are (``Ring.try_write_parts`` copies them into the ring without the join)."""
    n = len(records)
    try:
        lengths = struct.pack(f"<{n}I", *map(len, records))
    except struct.error as ex:
        raise ValueError(f"RecordBatch record too large: {ex}") from None
    return [_BATCH_HEAD.pack(KIND_RECORD_BATCH, n) + lengths, *records]


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Records one side wrote in one loop turn, as one ring record.

    PERF(ipc): a ring record costs its writer and its reader a fragment each (header, index
    store, copy); a front worker's pushes of one turn, or a shard's verdicts of one flush,
    travel as one. ``unpack`` gives views into the buffer, which every record's ``unpack``
    takes as it takes bytes.
    """

    records: tuple[bytes | bytearray | memoryview, ...]

    @staticmethod
    def packed_size(sizes: Iterable[int]) -> int:
        """Bytes of the batch of records of these sizes."""
        total = _BATCH_HEAD.size
        for size in sizes:
            total += 4 + size
        return total

    def pack(self) -> bytes:
        return pack_batch(self.records)

    @classmethod
    def unpack(cls, buf: bytes | bytearray | memoryview) -> Self:
        # PERF(wire): the records of a bytes batch (what Ring.read_many returns) up to
        # _CUT_MAX bytes are cut as bytes, cheaper to read than views (PushGroup.unpack);
        # larger ones stay views, so that their frames are copied once, by their unpack.
        bounds = cls.bounds(buf)
        cut = type(buf) is bytes
        view = memoryview(buf)
        return cls(tuple(buf[at:stop] if cut and stop - at <= _CUT_MAX else view[at:stop]
                         for at, stop in pairwise(bounds)))

    @staticmethod
    def bounds(buf: bytes | bytearray | memoryview) -> list[int]:
        """Where the batch's records start, and where the last one ends: record ``k`` is
        ``buf[bounds[k]:bounds[k + 1]]``.

        PERF(wire): a shard reads the push groups of a batch in place, at these bounds
        (``PushGroup.unpack``'s ``start`` and ``stop``), not from a copy of each record; the
        bounds are summed in C."""
        end = len(buf)
        if end < _BATCH_HEAD.size:
            raise RecordDecodeError(f"RecordBatch of {end} bytes, shorter than its header", buf)
        kind, n = _BATCH_HEAD.unpack_from(buf, 0)
        if kind != KIND_RECORD_BATCH:
            raise RecordDecodeError(f"kind {kind}, not a RecordBatch", buf)
        at = _BATCH_HEAD.size + 4 * n
        if at > end:
            raise RecordDecodeError(f"RecordBatch of {end} bytes cannot list {n} records", buf)
        bounds = list(accumulate(struct.unpack_from(f"<{n}I", buf, _BATCH_HEAD.size),
                                 initial=at))
        if bounds[-1] != end:
            if bounds[-1] > end:
                raise RecordDecodeError("RecordBatch record runs past the end", buf)
            raise RecordDecodeError(f"{end - bounds[-1]} trailing byte(s) after the RecordBatch",
                                    buf)
        return bounds


Record = PushGroup | PushVerdict | LeaseGrant | AckRequest | AckVerdict | RecordBatch

RECORD_TYPES: dict[int, type[Record]] = {
    KIND_PUSH_GROUP: PushGroup,
    KIND_PUSH_VERDICT: PushVerdict,
    KIND_LEASE_GRANT: LeaseGrant,
    KIND_ACK_REQUEST: AckRequest,
    KIND_ACK_VERDICT: AckVerdict,
    KIND_RECORD_BATCH: RecordBatch,
    KIND_QUEUED_RUN: PushVerdict,
}


def unpack_record(buf: bytes | bytearray | memoryview) -> Record:
    """Any record, by its kind byte."""
    kind = peek_kind(buf)
    record_type = RECORD_TYPES.get(kind)
    if record_type is None:
        raise RecordDecodeError(f"unknown record kind {kind}", buf)
    return record_type.unpack(buf)


def blob_from_pieces(pieces: Sequence[Piece]) -> bytes:
    """Consecutive raw pieces become one zstd chunk; client chunks are kept byte for byte."""
    if len(pieces) == 1:
        # PERF(wire): a JSON push's group, one run of frames (compressed already if the shard
        # read it so): no lists to build and join
        kind, count, data = pieces[0]
        return (pack_chunk_zstd(data, count) if kind == PIECE_RAW
                else pack_chunk(CODEC_ZSTD, count, data))
    out: list[bytes] = []
    run: list[bytes] = []
    run_count = 0
    for p in pieces:
        if p.kind == 0:
            run.append(p.data)
            run_count += p.count
            continue
        if run:
            out.append(pack_chunk_zstd(b"".join(run), run_count))
            run, run_count = [], 0
        out.append(pack_chunk(CODEC_ZSTD, p.count, p.data))
    if run:
        out.append(pack_chunk_zstd(b"".join(run), run_count))
    return b"".join(out)
