"""Message frames and chunks (docs/api.md §3.1, §3.2): the bytes stored in segments and served
as is.

A frame is what a message *is* on disk and on the wire, so every reader checks every field
before trusting a length; a stored chunk is returned to consumers untouched, so the writers here
must produce exactly the client's layout. zstd frames always carry their content size, which
lets a reader reject an oversized frame from its header before allocating anything.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import zstandard

from queen_mp.wire.errors import BadFrame, BodyTooLarge, NameTooLong, UnsupportedFlags

__all__ = [
    "CODEC_RAW",
    "CODEC_ZSTD",
    "FLAG_ENCRYPTED",
    "FLAG_PRODUCER",
    "FLAG_TRACE",
    "FRAME_HEAD",
    "MAX_TXN_BYTES",
    "MIN_BODY_LEN",
    "Chunk",
    "Frame",
    "FrameRow",
    "PlainColumns",
    "check_transaction_id",
    "decode_chunk",
    "decompress_bounded",
    "frame_rows",
    "iter_chunks",
    "iter_frames",
    "pack_chunk",
    "pack_chunk_raw",
    "pack_chunk_zstd",
    "pack_frame",
    "pack_plain_frame",
    "plain_columns",
    "raw_one_head",
    "read_frames",
    "single_chunk",
    "zstd_compress",
]

FLAG_TRACE = 1
FLAG_PRODUCER = 2
FLAG_ENCRYPTED = 4
_KNOWN_FLAGS = FLAG_TRACE | FLAG_PRODUCER | FLAG_ENCRYPTED

CODEC_RAW = 0
CODEC_ZSTD = 1

MAX_TXN_BYTES = 1024
# flags + message id + u16 txn length + the shortest transactionId (1 byte)
MIN_BODY_LEN = 1 + 16 + 2 + 1

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
#: a frame's head (docs/api.md 3.1): body_len, flags, message id, txn length
FRAME_HEAD = struct.Struct("<IB16sH")
_HEAD_TRACE = struct.Struct("<IB16s16sH")  # ... with a trace id
_CHUNK_HEAD = struct.Struct("<IBI")  # count, codec, len

_u16_at = _U16.unpack_from
_u32_at = _U32.unpack_from


# PERF(wire): one per message; a frozen dataclass __init__ costs 6x a plain one.
@dataclass(slots=True)
class Frame:
    """One parsed message frame; ``payload`` and ``raw`` are views into the parsed buffer.

    ``raw`` is the whole frame (length prefix included) and ``offset`` its position in the
    buffer, so a caller can forward the client's bytes unchanged or point at a bad one.
    """

    message_id: bytes
    trace_id: bytes | None
    transaction_id: str
    producer_sub: str | None
    flags: int
    payload: memoryview
    raw: memoryview
    offset: int

    @property
    def transaction_id_bytes(self) -> memoryview:
        """The transactionId in its wire form, for hashing without an encode."""
        at = 4 + 1 + 16 + (16 if self.flags & FLAG_TRACE else 0)
        return self.raw[at + 2 : at + 2 + _u16_at(self.raw, at)[0]]


class Chunk(NamedTuple):
    """One chunk of a segment blob: ``data`` is the chunk body, ``raw`` the whole chunk."""

    count: int
    codec: int
    data: memoryview
    raw: memoryview


_tuple_new = tuple.__new__


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def check_transaction_id(
    txn: bytes | bytearray | memoryview, *, index: int | None = None, offset: int | None = None
) -> None:
    """transactionId is 1..1024 UTF-8 bytes (docs/api.md §1.3, §1.7); ``index`` names the item."""
    where = "" if index is None else f"item {index}: "
    if not txn:
        raise BadFrame(
            f"{where}empty transactionId", index=index, offset=offset, field="transactionId"
        )
    if len(txn) > MAX_TXN_BYTES:
        raise NameTooLong(
            f"{where}transactionId of {len(txn)} bytes, over {MAX_TXN_BYTES}",
            index=index,
            offset=offset,
            limit=MAX_TXN_BYTES,
            field="transactionId",
        )


def pack_frame(
    message_id: bytes,
    transaction_id_bytes: bytes,
    payload_bytes: bytes | bytearray | memoryview,
    trace_id: bytes | None = None,
    producer_sub: str | None = None,
    encrypted: bool = False,
) -> bytes:
    """One §3.1 frame. A transactionId over 1024 bytes is the client's NameTooLong."""
    if len(message_id) != 16:
        raise ValueError(f"message id of {len(message_id)} bytes, not 16")
    check_transaction_id(transaction_id_bytes)
    tlen = len(transaction_id_bytes)
    flags = FLAG_ENCRYPTED if encrypted else 0
    body_len = 1 + 16 + 2 + tlen + len(payload_bytes)
    sub = b""
    if producer_sub is not None:
        sub = producer_sub.encode("utf-8")
        if len(sub) > 0xFFFF:
            raise ValueError(f"producerSub of {len(sub)} bytes, over 65535")
        flags |= FLAG_PRODUCER
        body_len += 2 + len(sub)
    if trace_id is None:
        head = FRAME_HEAD.pack(body_len, flags, message_id, tlen)
    else:
        if len(trace_id) != 16:
            raise ValueError(f"trace id of {len(trace_id)} bytes, not 16")
        head = _HEAD_TRACE.pack(body_len + 16, flags | FLAG_TRACE, message_id, trace_id, tlen)
    if producer_sub is None:
        # PERF(wire): the common frame is one join: a single copy of the payload.
        return b"".join((head, transaction_id_bytes, payload_bytes))
    return b"".join((head, transaction_id_bytes, _U16.pack(len(sub)), sub, payload_bytes))


def pack_plain_frame(message_id: bytes, transaction_id_bytes: bytes,
                     payload_bytes: bytes | bytearray | memoryview) -> bytes:
    """``pack_frame`` of a frame with no flags, for a caller that minted the 16-byte id and
    bounded the transactionId (1..1024 bytes) itself.

    PERF(wire): a typed push body's items skip the checks and keyword arguments, one call each.
    """
    tlen = len(transaction_id_bytes)
    return b"".join((FRAME_HEAD.pack(19 + tlen + len(payload_bytes), 0, message_id, tlen),
                     transaction_id_bytes, payload_bytes))


def _plain_head(view: memoryview, at: int, end: int
                ) -> tuple[bytes, memoryview, str, int, int] | None:
    """The common frame (flags 0) at ``at``, read by one unpack: its message id, transactionId
    bytes and text, and where its payload starts and it ends. None: anything unusual or wrong,
    for the field-by-field reading, which also words the error."""
    if end - at < 4 + MIN_BODY_LEN:
        return None
    body_len, flags, message_id, tlen = FRAME_HEAD.unpack_from(view, at)
    stop = at + 4 + body_len
    p = at + 23 + tlen
    if flags or body_len < MIN_BODY_LEN or stop > end or not 0 < tlen <= MAX_TXN_BYTES \
            or p > stop:
        return None
    txn = view[at + 23 : p]
    try:
        return message_id, txn, str(txn, "utf-8"), p, stop
    except UnicodeDecodeError:
        return None


def _read_frame(view: memoryview, at: int, end: int, index: int) -> Frame:
    """The frame at ``at``; every length is checked against the frame and the buffer."""
    plain = _plain_head(view, at, end)
    if plain is None:
        return _read_frame_checked(view, at, end, index)
    message_id, _, transaction_id, p, stop = plain
    return Frame(message_id, None, transaction_id, None, 0, view[p:stop], view[at:stop], at)


def _read_frame_checked(view: memoryview, at: int, end: int, index: int) -> Frame:
    """Field by field, so an error names the first field that is wrong."""
    if end - at < 4:
        raise BadFrame(
            f"frame {index} truncated: {end - at} bytes left, a frame needs at least "
            f"{4 + MIN_BODY_LEN}",
            index=index,
            offset=at,
            field="body_len",
            raw=view,
        )
    body_len = _u32_at(view, at)[0]
    if body_len < MIN_BODY_LEN:
        raise BadFrame(
            f"frame {index}: body_len {body_len} below the minimum {MIN_BODY_LEN}",
            index=index,
            offset=at,
            field="body_len",
            raw=view,
        )
    stop = at + 4 + body_len
    if stop > end:
        raise BadFrame(
            f"frame {index}: body_len {body_len} runs past the end ({end - at - 4} bytes left)",
            index=index,
            offset=at,
            field="body_len",
            raw=view,
        )
    flags = view[at + 4]
    if flags & ~_KNOWN_FLAGS:
        raise UnsupportedFlags(
            f"frame {index}: flags 0x{flags:02x} has unknown bits",
            index=index,
            offset=at + 4,
            field="flags",
            raw=view,
        )
    p = at + 5
    message_id = bytes(view[p : p + 16])
    p += 16
    trace_id = None
    if flags & FLAG_TRACE:
        trace_id = bytes(view[p : p + 16])
        p += 16
    if p + 2 > stop:
        raise BadFrame(
            f"frame {index}: body_len {body_len} too short for its fields",
            index=index,
            offset=at,
            field="body_len",
            raw=view,
        )
    tlen = _u16_at(view, p)[0]
    p += 2
    if p + tlen > stop:
        raise BadFrame(
            f"frame {index}: transactionId length {tlen} runs past the frame",
            index=index,
            offset=p - 2,
            field="transactionId",
            raw=view,
        )
    txn = view[p : p + tlen]
    if not tlen:
        raise BadFrame(
            f"frame {index}: empty transactionId",
            index=index,
            offset=p - 2,
            field="transactionId",
            raw=view,
        )
    if tlen > MAX_TXN_BYTES:
        raise NameTooLong(
            f"frame {index}: transactionId of {tlen} bytes, over {MAX_TXN_BYTES}",
            index=index,
            offset=p - 2,
            limit=MAX_TXN_BYTES,
            field="transactionId",
            raw=view,
        )
    try:
        transaction_id = str(txn, "utf-8")
    except UnicodeDecodeError:
        raise BadFrame(
            f"frame {index}: transactionId is not UTF-8",
            index=index,
            offset=p,
            field="transactionId",
            raw=view,
        ) from None
    p += tlen
    producer_sub = None
    if flags & FLAG_PRODUCER:
        if p + 2 > stop:
            raise BadFrame(
                f"frame {index}: body_len {body_len} too short for producerSub",
                index=index,
                offset=at,
                field="body_len",
                raw=view,
            )
        slen = _u16_at(view, p)[0]
        p += 2
        if p + slen > stop:
            raise BadFrame(
                f"frame {index}: producerSub length {slen} runs past the frame",
                index=index,
                offset=p - 2,
                field="producerSub",
                raw=view,
            )
        try:
            producer_sub = str(view[p : p + slen], "utf-8")
        except UnicodeDecodeError:
            raise BadFrame(
                f"frame {index}: producerSub is not UTF-8",
                index=index,
                offset=p,
                field="producerSub",
                raw=view,
            ) from None
        p += slen
    return Frame(
        message_id,
        trace_id,
        transaction_id,
        producer_sub,
        flags,
        view[p:stop],
        view[at:stop],
        at,
    )


def _skip(view: memoryview, end: int, skip: int, index: int) -> tuple[int, int]:
    """Where the frame after the first ``skip`` ones starts, and its index: stepped over by
    their lengths alone (a truncated one is BadFrame)."""
    at = 0
    while skip > 0 and at < end:
        stop = at + 4 + _u32_at(view, at)[0] if end - at >= 4 else end + 1
        if stop > end:
            _read_frame_checked(view, at, end, index)  # raises: the frame is truncated
        at = stop
        index += 1
        skip -= 1
    return at, index


def iter_frames(buf: bytes | bytearray | memoryview, *, first_index: int = 0,
                skip: int = 0) -> Iterator[Frame]:
    """The frames of ``buf`` back to back up to its end; a partial last frame is BadFrame.

    ``first_index`` numbers the frames in errors (item position in a request). The first
    ``skip`` frames are stepped over by their length alone, unparsed and unchecked beyond it:
    a pop of 100 messages from a 1,000-message chunk reads the frames it delivers.
    """
    view = _view(buf)
    end = len(view)
    at, index = _skip(view, end, skip, first_index)
    while at < end:
        frame = _read_frame(view, at, end, index)
        yield frame
        at += len(frame.raw)
        index += 1


#: (message id, trace id, transactionId, its UTF-8 bytes, producerSub, flags, payload)
FrameRow = tuple[bytes, bytes | None, str, memoryview, str | None, int, memoryview]


def frame_rows(buf: bytes | bytearray | memoryview, *, skip: int = 0) -> Iterator[FrameRow]:
    """``iter_frames``' fields as tuples, checked as it checks them.

    PERF(wire): a pop renders every message it delivers from these fields alone; a Frame per
    message (its __init__, the transactionId bytes property) was a third of a 100-message
    JSON pop's instructions. A frame with flags, or one whose head does not check out, takes
    ``iter_frames``' own reading (which words the error)."""
    view = _view(buf)
    end = len(view)
    at, index = _skip(view, end, skip, 0)
    unpack = FRAME_HEAD.unpack_from
    while at < end:
        # PERF(wire): ``_plain_head`` written out here, a call less per delivered message
        if end - at >= 4 + MIN_BODY_LEN:
            body_len, flags, message_id, tlen = unpack(view, at)
            stop = at + 4 + body_len
            p = at + 23 + tlen
            if not flags and body_len >= MIN_BODY_LEN and stop <= end \
                    and 0 < tlen <= MAX_TXN_BYTES and p <= stop:
                txn = view[at + 23 : p]
                try:
                    text = str(txn, "utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    yield message_id, None, text, txn, None, 0, view[p:stop]
                    at = stop
                    index += 1
                    continue
        f = _read_frame_checked(view, at, end, index)
        yield (f.message_id, f.trace_id, f.transaction_id, f.transaction_id_bytes,
               f.producer_sub, f.flags, f.payload)
        at += len(f.raw)
        index += 1


#: (message ids, transactionIds' UTF-8 bytes, payloads) of consecutive frames, by column
PlainColumns = tuple[list[bytes], list[bytes], list[bytes]]

#: a frame's body_len, flags and transactionId length, read from its first 23 bytes
_PLAIN_KEY = struct.Struct("<IB16xH")
#: each plain frame shape seen lately (``_PLAIN_KEY``'s fields) and its struct format (its
#: message id, transactionId and payload as fields), at most ``_LAYOUTS_KEPT``
_LAYOUTS: dict[tuple[int, int, int], str] = {}
_LAYOUTS_KEPT = 4096


def _plain_layout(key: tuple[int, int, int]) -> str | None:
    """The struct format of a plain frame of this shape (``_PLAIN_KEY``'s fields), kept in
    ``_LAYOUTS``; None when it has flags or its transactionId (1..1024 bytes) does not fit
    inside its frame (so its body_len is at least MIN_BODY_LEN)."""
    body_len, flags, tlen = key
    payload = body_len - 19 - tlen
    if flags or not 0 < tlen <= MAX_TXN_BYTES or payload < 0:
        return None
    if len(_LAYOUTS) >= _LAYOUTS_KEPT:
        _LAYOUTS.clear()
    layout = _LAYOUTS[key] = f"5x16s2x{tlen}s{payload}s"
    return layout


def _walk(buf: bytes, at: int, end: int, take: int) -> str | None:
    """The struct format of up to ``take`` plain frames from ``at`` (``plain_columns``),
    read frame by frame; None when one is not plain or runs past the end."""
    head = _PLAIN_KEY.unpack_from
    known = _LAYOUTS.get
    layouts: list[str] = ["<"]
    add = layouts.append
    try:
        for _ in range(take):
            key = head(buf, at)  # struct.error at the end (a clean one when at == end)
            layout = known(key)
            if layout is None:
                layout = _plain_layout(key)
                if layout is None:
                    return None
            add(layout)
            at += key[0] + 4
    except struct.error:
        if at != end:  # fewer than 23 bytes left: a truncated frame
            return None
    if at > end:  # the last frame runs past the end
        return None
    return "".join(layouts)


#: the bytes of a frame's head that tell its shape (``_PLAIN_KEY``): body_len, flags and
#: the transactionId's length
_SHAPE_BYTES = (0, 1, 2, 3, 4, 21, 22)


def _one_size(buf: bytes, first: int, end: int, take: int) -> str | None:
    """``_walk``'s format when the frames from ``first`` are all of the first one's shape
    and end where its walk would (at ``take`` frames or at ``end``); None otherwise (the
    walk then reads them).

    PERF(wire): the shape bytes of every frame compared at once, a strided slice each, in
    place of a Python step per frame: bench.hotpath frontqpb1k (1,000 frames of one size, as
    bench.loadgen --format qpb1 sends them) 12.29M -> 10.26M instructions a request
    (callgrind, ``--rounds 20``: 245.7M -> 205.2M). Only for a push's frames (``one_size``):
    a pop's chunks, of many pushes, often are not of one size, and the failed check cost
    bench.hotpath pop100 0.8%."""
    if end - first < 4 + MIN_BODY_LEN:
        return None
    key = _PLAIN_KEY.unpack_from(buf, first)
    layout = _LAYOUTS.get(key) or _plain_layout(key)
    size = key[0] + 4
    count = min(take, (end - first) // size)
    stop = first + count * size
    if layout is None or count < 2 or (count < take and stop != end):
        return None
    for at in _SHAPE_BYTES:
        if buf[first + at:stop:size].count(buf[first + at]) != count:
            return None
    return "<" + layout * count


def plain_columns(buf: bytes, *, skip: int = 0, take: int, one_size: bool = False
                  ) -> PlainColumns | None:
    """The fields of up to ``take`` frames after the first ``skip`` ones, when every one of
    them is a plain frame (no flags) whose head checks out as ``frame_rows`` checks it and
    whose transactionId is UTF-8; None otherwise (``frame_rows`` then reads, or words the
    error).

    PERF(wire): the walk from frame to frame reads each one's lengths and flags by one
    unpack and looks its shape's struct format up (``_plain_layout``); the fields of all
    are then cut by one ``struct.unpack_from`` of the formats joined (struct keeps the
    compiled format of a run of shapes it saw lately), the columns taken by slices, the
    transactionIds decoded as one string to check them. A frame's three fields cut by
    slices in the walk were 4.9k instructions a frame, this 3.0k (callgrind, 100 frames).
    Reading frames of one shape without a walk (their places from the first one's size,
    checked by counts) gave bench.hotpath pop100s10 0.5%: its frames are not of one size.
    ``one_size``: try that first (``_one_size``), as a push's frames often are."""
    end = len(buf)
    first = _skip(buf, end, skip, 0)[0] if skip else 0
    layout = _one_size(buf, first, end, take) if one_size else None
    if layout is None:
        layout = _walk(buf, first, end, take)
        if layout is None:
            return None
    fields = list(struct.unpack_from(layout, buf, first))
    txns = fields[1::3]
    try:
        b" ".join(txns).decode("utf-8")  # " " splits no UTF-8 sequence
    except UnicodeDecodeError:
        return None
    return fields[0::3], txns, fields[2::3]


def read_frames(
    buf: bytes | bytearray | memoryview, count: int, *, first_index: int = 0
) -> list[Frame]:
    """Exactly ``count`` frames filling ``buf``: fewer, more or trailing bytes are BadFrame."""
    view = _view(buf)
    end = len(view)
    at = 0
    frames: list[Frame] = []
    append = frames.append
    for index in range(first_index, first_index + count):
        # PERF(wire): the common frame's head read here, without _read_frame's call: a QPB1
        # frames push reads every client frame through this loop
        plain = _plain_head(view, at, end)
        if plain is not None:
            message_id, _, text, p, stop = plain
            append(Frame(message_id, None, text, None, 0, view[p:stop], view[at:stop], at))
            at = stop
            continue
        if at >= end:
            raise BadFrame(
                f"{count} frames announced, {index - first_index} present",
                index=index,
                offset=at,
                raw=view,
            )
        frame = _read_frame_checked(view, at, end, index)
        append(frame)
        at += len(frame.raw)
    if at != end:
        raise BadFrame(
            f"{_plural(end - at, 'trailing byte')} after the {count} announced frames",
            offset=at,
            raw=view,
        )
    return frames


# --- zstd -----------------------------------------------------------------------------------

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # NOTE(wire): a zstandard context serves one thread at a time, so one per thread and level.
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def zstd_compress(data: bytes | bytearray | memoryview, level: int = 1) -> bytes:
    """One zstd frame with its content size in the header, as every reader here demands."""
    return _compressor(level).compress(data)


def decompress_bounded(
    data: bytes | bytearray | memoryview, max_size: int, *, expected_size: int | None = None
) -> bytes:
    """Exactly one zstd frame, decompressed only after its header proves it fits ``max_size``.

    No content size is BadFrame (nothing would bound the output); a content size over
    ``max_size`` is BodyTooLarge; a content size other than ``expected_size`` (when given) or
    bytes after the frame are BadFrame.
    """
    if len(data) < 4 or data[:4] != _ZSTD_MAGIC:
        raise BadFrame("not a zstd frame (bad magic)", offset=0, field="zstd", raw=data)
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as ex:
        raise BadFrame(f"bad zstd frame header: {ex}", offset=0, field="zstd", raw=data) from None
    if size < 0:
        raise BadFrame(
            "zstd frame without a content size in its header", offset=0, field="zstd", raw=data
        )
    if size > max_size:
        raise BodyTooLarge(
            f"zstd frame decompresses to {size} bytes, over {max_size}",
            limit=max_size,
            field="zstd",
        )
    if expected_size is not None and size != expected_size:
        raise BadFrame(
            f"zstd frame header says {size} bytes, raw_len says {expected_size}",
            offset=0,
            field="raw_len",
            raw=data,
        )
    try:
        # PERF(wire): single-shot into a buffer of exactly the announced size; libzstd refuses
        # to write past it, so a lying header cannot make this allocate more. The arguments
        # by position (max_output_size, read_across_frames, allow_extra_data): by keyword,
        # their parsing was 3k of the 31k instructions a pop spent on a 10-frame chunk.
        out = _decompressor().decompress(data, max_size, False, False)
    except zstandard.ZstdError as ex:
        raise BadFrame(f"bad zstd frame: {ex}", offset=0, field="zstd", raw=data) from None
    if len(out) != size:
        raise BadFrame(
            f"zstd frame decompressed to {len(out)} bytes, its header says {size}",
            offset=0,
            field="zstd",
            raw=data,
        )
    return out


# --- chunks ---------------------------------------------------------------------------------


def pack_chunk(codec: int, count: int, data: bytes | bytearray | memoryview) -> bytes:
    """A chunk around an already encoded body (a client zstd frame kept byte for byte)."""
    if codec not in (CODEC_RAW, CODEC_ZSTD):
        raise ValueError(f"unknown chunk codec {codec}")
    return b"".join((_CHUNK_HEAD.pack(count, codec, len(data)), data))


def pack_chunk_raw(frames_bytes: bytes | bytearray | memoryview, count: int) -> bytes:
    """``count`` frames as a raw chunk (codec 0)."""
    return b"".join((_CHUNK_HEAD.pack(count, CODEC_RAW, len(frames_bytes)), frames_bytes))


#: ``pack_chunk_raw(frame, 1)``'s head, given the frame's length: a C call (a partial of the
#: struct's pack), no Python frame; PERF(shard): one a segment of a 1-item push
raw_one_head: Callable[[int], bytes] = partial(_CHUNK_HEAD.pack, 1, CODEC_RAW)


#: Frames under this many bytes are compressed at ``SMALL_RUN_LEVEL``, not level 1.
SMALL_RUN_BYTES = 1024
#: PERF(wire): a negative level leaves literals unencoded: no Huffman table is built and
#: written per call. On a few hundred bytes that table was most of the work (a 1-frame
#: segment, 233 bytes of bench payload: 102 bytes at level 1 and at -1, 5.8 against 1.4 us;
#: zstd was a fifth of a shard's instructions under 1-item pushes, bench/shardpath.py), and
#: it buys little: a random-hex payload of 216 bytes takes 176 at level 1, 225 at -1.
SMALL_RUN_LEVEL = -1


def pack_chunk_zstd(
    frames_bytes: bytes | bytearray | memoryview, count: int, level: int | None = None
) -> bytes:
    """``count`` frames as one zstd frame with its content size (codec 1); ``level`` by
    default 1, or ``SMALL_RUN_LEVEL`` under ``SMALL_RUN_BYTES``."""
    if level is None:
        level = SMALL_RUN_LEVEL if len(frames_bytes) < SMALL_RUN_BYTES else 1
    # PERF(wire): the thread's compressor looked up here, not through zstd_compress and
    # _compressor: two calls less for every segment a shard builds
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "cctx", None)
    cctx = cache.get(level) if cache is not None else None
    compressed = (cctx or _compressor(level)).compress(frames_bytes)
    return b"".join((_CHUNK_HEAD.pack(count, CODEC_ZSTD, len(compressed)), compressed))


def iter_chunks(blob: bytes | bytearray | memoryview) -> Iterator[Chunk]:
    """The chunks of a segment payload blob, back to back to its end."""
    view = _view(blob)
    end = len(view)
    at = 0
    while at < end:
        if end - at < _CHUNK_HEAD.size:
            raise BadFrame(
                f"chunk header truncated: {end - at} bytes left", offset=at, field="chunk", raw=view
            )
        count, codec, length = _CHUNK_HEAD.unpack_from(view, at)
        if codec not in (CODEC_RAW, CODEC_ZSTD):
            raise BadFrame(f"unknown chunk codec {codec}", offset=at + 4, field="codec", raw=view)
        start = at + _CHUNK_HEAD.size
        stop = start + length
        if stop > end:
            raise BadFrame(
                f"chunk length {length} runs past the end ({end - start} bytes left)",
                offset=at + 5,
                field="chunk",
                raw=view,
            )
        # PERF(wire): tuple.__new__ in C, not the namedtuple's Python __new__ (2.5k
        # instructions a chunk; a pop of 100 messages pushed 10 at a time reads 10 chunks)
        yield _tuple_new(Chunk, (count, codec, view[start:stop], view[at:stop]))
        at = stop


_content_size = zstandard.frame_content_size


def single_chunk(blob: bytes, max_size: int) -> tuple[int, bytes] | None:
    """(its frame count, its frames) of a segment blob that is one zstd chunk and decodes
    within ``max_size`` as its header says; None for anything else (``iter_chunks`` and
    ``decode_chunk`` read it then, and word what is wrong).

    PERF(wire): a pop reads a segment per push it covers, most of them one chunk: its head,
    the zstd frame's header and the decompression in a handful of calls, without the chunk
    generator, memoryviews and the checks' calls of ``decompress_bounded``."""
    try:
        count, codec, length = _CHUNK_HEAD.unpack_from(blob)
    except struct.error:
        return None
    if codec != CODEC_ZSTD or length + 9 != len(blob) or blob[9:13] != _ZSTD_MAGIC:
        return None
    data = blob[9:]
    try:
        size = _content_size(data)
        if not 0 <= size <= max_size:
            return None
        dctx: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
        out = (dctx or _decompressor()).decompress(data, max_size, False, False)
    except zstandard.ZstdError:
        return None
    return (count, out) if len(out) == size else None


def decode_chunk(
    codec: int, data: bytes | bytearray | memoryview, *, max_size: int
) -> bytes | memoryview:
    """A chunk body as its concatenated frames (raw bodies are returned as they are)."""
    if codec == CODEC_RAW:
        if len(data) > max_size:
            raise BodyTooLarge(
                f"raw chunk of {len(data)} bytes, over {max_size}", limit=max_size, field="chunk"
            )
        return data
    if codec == CODEC_ZSTD:
        return decompress_bounded(data, max_size)
    raise BadFrame(f"unknown chunk codec {codec}", field="codec")
