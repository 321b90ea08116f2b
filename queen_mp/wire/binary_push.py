"""The ``QPB1`` push body (docs/api.md §3.4 plain, §3.5 frames) and the name rules of §1.7.

Invariant 7 (bad input gets a 4xx and changes nothing) starts here: the whole body is parsed and
every rule checked before the handler sees a single item, so a rejection never follows a partial
store. Every error's ``offset`` is a byte position in the body as sent; an error inside a zstd
frame points at that frame and names the decompressed position in its message.

Nothing is copied per item: payloads and the client's zstd frames are memoryview slices of the
body (or of the one decompressed buffer), kept alive by the records that hold them.
"""

from __future__ import annotations

import re
import struct
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import orjson
import zstandard

from queen_mp.wire.errors import (
    BadFrame,
    BodyTooLarge,
    InvalidName,
    InvalidPayload,
    InvalidRequest,
    NameTooLong,
    UnsupportedFlags,
    WireError,
)
from queen_mp.wire.frames import (
    FLAG_ENCRYPTED,
    FLAG_PRODUCER,
    MAX_TXN_BYTES,
    Frame,
    check_transaction_id,
    decompress_bounded,
    plain_columns,
    read_frames,
)

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_PARTITION",
    "MAX_NAME_BYTES",
    "QPB1_FLAG_COUNTS",
    "QPB1_FLAG_FRAMES",
    "QPB1_FLAG_TXN",
    "QPB1_FLAG_ZSTD",
    "QPB1_MAGIC",
    "BinaryPush",
    "FrameColumns",
    "FramesGroup",
    "PlainGroup",
    "PlainItem",
    "check_name",
    "check_partition_name",
    "check_payload",
    "check_queue_name",
    "decoded_size",
    "frame_columns",
    "groups_growth",
    "parse_binary_push",
    "read_frame_groups",
]

QPB1_MAGIC = b"QPB1"
QPB1_FLAG_ZSTD = 1
QPB1_FLAG_COUNTS = 2
QPB1_FLAG_TXN = 4
QPB1_FLAG_FRAMES = 8

MAX_NAME_BYTES = 255
DEFAULT_MAX_ITEMS = 100_000
DEFAULT_MAX_DECOMPRESSED = 256 * 1024 * 1024
DEFAULT_PARTITION = "Default"

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_u16_at = _U16.unpack_from
_u32_at = _U32.unpack_from
_TWO_U32 = struct.Struct("<II")

# NOTE(wire): UTF-8 never puts a byte below 0x80 inside a multi-byte sequence, so these byte
# patterns find exactly the forbidden code points without decoding first.
_CONTROL_BYTES = re.compile(rb"[\x00-\x1f\x7f]")
_CONTROL_OR_SLASH_BYTES = re.compile(rb"[\x00-\x1f\x7f/]")
# Text names may also hold lone surrogates (from a lenient JSON parser); they have no UTF-8 form.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
_CONTROL_OR_SLASH = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff/]")

_JSONDecodeError = orjson.JSONDecodeError
_loads = orjson.loads


# PERF(wire): one per message; a frozen dataclass __init__ costs 6x a plain one.
@dataclass(slots=True)
class PlainItem:
    """One §3.4 item; ``transaction_id`` None means the broker mints it (absent or "")."""

    transaction_id: str | None
    payload: memoryview


@dataclass(frozen=True, slots=True)
class PlainGroup:
    """A §3.4 group; ``first_index`` is the wire position of its first item."""

    queue: str
    partition: str
    items: tuple[PlainItem, ...]
    first_index: int

    @property
    def count(self) -> int:
        return len(self.items)


class FrameColumns(NamedTuple):
    """A §3.5 group's frames, every one plain (no flags) and checked, as columns."""

    raw: bytes                  # the decompressed frames, back to back
    message_ids: list[bytes]
    transaction_ids: list[bytes]  # UTF-8 (checked)


@dataclass(frozen=True, slots=True)
class FramesGroup:
    """A §3.5 group: the client's zstd frame exactly as sent, and its checked frames (or,
    read by columns, ``columns`` and no frames)."""

    queue: str
    partition: str
    count: int
    chunk: memoryview
    frames: tuple[Frame, ...]
    first_index: int
    columns: FrameColumns | None = None


@dataclass(frozen=True, slots=True)
class BinaryPush:
    """A whole QPB1 body, groups in wire order; results follow the same order."""

    counts_only: bool
    frames_mode: bool
    groups: tuple[PlainGroup, ...] | tuple[FramesGroup, ...]
    item_count: int


_E = TypeVar("_E", bound=WireError)


def _within(ex: _E, where: str, offset: int) -> _E:
    """The same error re-anchored at ``offset`` of the body, its inner position in the text."""
    inner = f" (byte {ex.offset} of {where})" if ex.offset is not None else f" ({where})"
    moved = type(ex)(
        ex.message + inner, index=ex.index, offset=offset, limit=ex.limit, field=ex.field
    )
    moved.raw = ex.raw
    return moved


# --- names and payloads -----------------------------------------------------------------------


def check_name(name: str, field: str, *, slash_ok: bool = False, index: int | None = None) -> None:
    """§1.7 for a name given as text: 1..255 UTF-8 bytes, no control character, '/' only if
    ``slash_ok`` (partitions)."""
    if not name:
        raise InvalidName(f"empty {field} name", field=field, index=index)
    # PERF(wire): 63 characters are at most 252 bytes; only longer names pay for an encode.
    if len(name) > MAX_NAME_BYTES // 4:
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > MAX_NAME_BYTES:
            raise NameTooLong(
                f"{field} name of {size} bytes, over {MAX_NAME_BYTES}",
                field=field,
                limit=MAX_NAME_BYTES,
                index=index,
            )
    if (_CONTROL if slash_ok else _CONTROL_OR_SLASH).search(name) is not None:
        what = "a control character" if slash_ok else "a control character or '/'"
        raise InvalidName(
            f"{field} name contains {what} (or a lone surrogate)", field=field, index=index
        )


def check_queue_name(name: str, *, index: int | None = None) -> None:
    """A queue name (also the rule for consumer groups): no '/'."""
    check_name(name, "queue", index=index)


def check_partition_name(name: str, *, index: int | None = None) -> None:
    """A partition name: may contain '/', the pop route takes the rest of the path."""
    check_name(name, "partition", slash_ok=True, index=index)


def check_payload(payload: bytes | bytearray | memoryview, *, index: int | None = None) -> None:
    """§3.3: a payload is empty (null) or JSON text, because JSON pops splice it verbatim."""
    if payload:
        try:
            _loads(payload)
        except _JSONDecodeError as ex:
            what = "payload" if index is None else f"payload of item {index}"
            raise InvalidPayload(
                f"{what} is not JSON text: {ex}", index=index, field="payload"
            ) from None


def _read_name(view: memoryview, at: int, end: int, field: str, group: int) -> tuple[str, int]:
    """A u16+str name at ``at``; partitions may hold '/' and "" means Default."""
    if at + 2 > end:
        raise BadFrame(
            f"group {group}: truncated before the {field} name",
            offset=at,
            field=field,
            raw=view,
        )
    size = _u16_at(view, at)[0]
    start = at + 2
    stop = start + size
    if stop > end:
        raise BadFrame(
            f"group {group}: {field} name length {size} runs past the end",
            offset=at,
            field=field,
            raw=view,
        )
    raw = view[start:stop]
    is_partition = field == "partition"
    if size == 0:
        if is_partition:
            return DEFAULT_PARTITION, stop
        raise InvalidName(f"group {group}: empty queue name", offset=at, field=field)
    if size > MAX_NAME_BYTES:
        raise NameTooLong(
            f"group {group}: {field} name of {size} bytes, over {MAX_NAME_BYTES}",
            offset=at,
            field=field,
            limit=MAX_NAME_BYTES,
        )
    pattern = _CONTROL_BYTES if is_partition else _CONTROL_OR_SLASH_BYTES
    if pattern.search(raw) is not None:
        what = "a control character" if is_partition else "a control character or '/'"
        raise InvalidName(
            f"group {group}: {field} name contains {what}", offset=start, field=field, raw=view
        )
    try:
        return str(raw, "utf-8"), stop
    except UnicodeDecodeError:
        raise BadFrame(
            f"group {group}: {field} name is not UTF-8", offset=start, field=field, raw=view
        ) from None


def _count_items(n: int, total: int, max_items: int, at: int, group: int) -> int:
    total += n
    if total > max_items:
        raise InvalidRequest(
            f"group {group}: more than {max_items} items in one push",
            offset=at,
            field="items",
            limit=max_items,
        )
    return total


def _truncated(what: str, at: int, view: memoryview, index: int | None = None) -> BadFrame:
    return BadFrame(f"body truncated in {what}", offset=at, index=index, raw=view)


def _trailing(n: int, at: int, view: memoryview) -> BadFrame:
    noun = "trailing byte" if n == 1 else "trailing bytes"
    return BadFrame(f"{n} {noun} after the last group", offset=at, raw=view)


# --- §3.4 plain -------------------------------------------------------------------------------


def _read_plain_groups(
    view: memoryview, at: int, with_txn: bool, max_items: int
) -> tuple[tuple[PlainGroup, ...], int]:
    end = len(view)
    if at + 4 > end:
        raise _truncated("group_count", at, view)
    group_count = _u32_at(view, at)[0]
    if group_count > max_items:
        raise InvalidRequest(
            f"{group_count} groups, more than the {max_items} items allowed in one push",
            offset=at,
            field="groups",
            limit=max_items,
        )
    at += 4
    groups: list[PlainGroup] = []
    total = 0
    for g in range(group_count):
        queue, at = _read_name(view, at, end, "queue", g)
        partition, at = _read_name(view, at, end, "partition", g)
        if at + 4 > end:
            raise _truncated(f"group {g} item count", at, view)
        n = _u32_at(view, at)[0]
        first = total
        total = _count_items(n, total, max_items, at, g)
        at += 4
        items: list[PlainItem] = []
        append = items.append
        for index in range(first, first + n):
            txn: str | None = None
            if with_txn:
                if at + 2 > end:
                    raise _truncated(f"item {index} transactionId length", at, view, index)
                tlen = _u16_at(view, at)[0]
                at += 2
                if tlen:
                    if at + tlen > end:
                        raise _truncated(f"item {index} transactionId", at - 2, view, index)
                    if tlen > MAX_TXN_BYTES:
                        check_transaction_id(view[at : at + tlen], index=index, offset=at - 2)
                    try:
                        txn = str(view[at : at + tlen], "utf-8")
                    except UnicodeDecodeError:
                        raise BadFrame(
                            f"item {index}: transactionId is not UTF-8",
                            index=index,
                            offset=at,
                            field="transactionId",
                            raw=view,
                        ) from None
                    at += tlen
            if at + 4 > end:
                raise _truncated(f"item {index} payload length", at, view, index)
            plen = _u32_at(view, at)[0]
            at += 4
            stop = at + plen
            if stop > end:
                raise _truncated(f"item {index} payload", at - 4, view, index)
            payload = view[at:stop]
            if plen:
                # PERF(wire): inline check_payload; this loop runs once per pushed message.
                try:
                    _loads(payload)
                except _JSONDecodeError as ex:
                    raise InvalidPayload(
                        f"payload of item {index} is not JSON text: {ex}",
                        index=index,
                        offset=at,
                        field="payload",
                    ) from None
            append(PlainItem(txn, payload))
            at = stop
        groups.append(PlainGroup(queue, partition, tuple(items), first))
    if at != end:
        raise _trailing(end - at, at, view)
    return tuple(groups), total


# --- §3.5 frames ------------------------------------------------------------------------------


def read_frame_groups(
    body: bytes | bytearray | memoryview,
    at: int,
    *,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    max_total_decompressed: int | None = None,
    first_index: int = 0,
    columns: bool = False,
) -> tuple[tuple[FramesGroup, ...], int]:
    """``u32 group_count`` and §3.5 groups from ``at`` to the end of ``body`` (QPB1 flag 8 and
    the tail of QTB1). Returns the groups and their item count.

    ``max_total_decompressed`` (default ``max_decompressed``) bounds the sum over all zstd
    frames, so many groups cannot add up to more memory than one allowed frame. ``columns``:
    a group of plain frames (the common one) is read as ``FrameColumns`` (``frame_columns``),
    with no Frame per frame; any other is read frame by frame.
    """
    view = body if isinstance(body, memoryview) else memoryview(body)
    end = len(view)
    total_limit = max_decompressed if max_total_decompressed is None else max_total_decompressed
    budget = total_limit
    if at + 4 > end:
        raise _truncated("group_count", at, view)
    group_count = _u32_at(view, at)[0]
    if group_count > max_items:
        raise InvalidRequest(
            f"{group_count} groups, more than the {max_items} items allowed in one push",
            offset=at,
            field="groups",
            limit=max_items,
        )
    at += 4
    groups: list[FramesGroup] = []
    total = 0
    for g in range(group_count):
        queue, at = _read_name(view, at, end, "queue", g)
        partition, at = _read_name(view, at, end, "partition", g)
        if at + 8 > end:
            raise _truncated(f"group {g} n and z_len", at, view)
        n, z_len = _TWO_U32.unpack_from(view, at)
        first = first_index + total
        total = _count_items(n, total, max_items, at, g)
        z_at = at + 8
        at = z_at + z_len
        if at > end:
            raise BadFrame(
                f"group {g}: z_len {z_len} runs past the end ({end - z_at} bytes left)",
                offset=z_at - 4,
                field="z_len",
                raw=view,
            )
        chunk = view[z_at:at]
        try:
            raw = decompress_bounded(chunk, min(max_decompressed, budget))
        except BodyTooLarge as ex:
            if budget >= max_decompressed:
                raise _within(ex, f"group {g}'s zstd frame", z_at) from None
            raise BodyTooLarge(
                f"group {g}: the zstd frames of this body decompress to more than "
                f"{total_limit} bytes in all",
                offset=z_at,
                field="zstd",
                limit=total_limit,
            ) from None
        except WireError as ex:
            raise _within(ex, f"group {g}'s zstd frame", z_at) from None
        budget -= len(raw)
        cols = frame_columns(raw, n) if columns else None
        if cols is not None:
            groups.append(FramesGroup(queue, partition, n, chunk, (), first, cols))
            continue
        try:
            frames = read_frames(raw, n, first_index=first)
            _check_frames(frames, first, raw)
        except WireError as ex:
            raise _within(ex, f"group {g}'s decompressed frames", z_at) from None
        groups.append(FramesGroup(queue, partition, n, chunk, tuple(frames), first))
    if at != end:
        raise _trailing(end - at, at, view)
    return tuple(groups), total


_VERSION_7 = bytes(range(0x70, 0x80))  # a UUIDv7's byte 6: version 7 in its high nibble
_VARIANT_10 = bytes(range(0x80, 0xC0))  # its byte 8: variant 0b10 in its two high bits
_consume = deque(maxlen=0).extend


def frame_columns(raw: bytes, count: int) -> FrameColumns | None:
    """``raw``'s frames as columns, when it is exactly ``count`` (at least 2) plain frames
    (no flags) that pass ``_check_frames``; None otherwise, and then ``read_frames`` and
    ``_check_frames`` read them (and word the error of a bad one).

    PERF(wire): a QPB1 frames push's frames cut by ``plain_columns`` (one struct unpack of
    them all), their ids' version and variant checked by two byte translations, their
    payloads by orjson through ``map``: no Frame per frame nor a Python step per frame but
    the walk from one to the next (read_frames and _check_frames were three quarters of the
    front worker's instructions for a 1,000-item push). With the push's ``PushBatch``
    (http.push.parse_binary), bench.hotpath frontqpb1k 26.6M -> 12.3M instructions a
    request (callgrind, ``--rounds 20``: 532.4M -> 245.7M)."""
    if count < 2:
        return None
    got = plain_columns(raw, take=count + 1, one_size=True)  # one too many shows as one more
    if got is None or len(got[0]) != count:
        return None
    ids, txns, payloads = got
    joined = b"".join(ids)
    if joined[6::16].translate(None, _VERSION_7) or joined[8::16].translate(None, _VARIANT_10):
        return None
    try:
        _consume(map(_loads, filter(None, payloads)))
    except _JSONDecodeError:
        return None
    return FrameColumns(raw, ids, txns)


def _check_frames(frames: list[Frame], first: int, raw: bytes) -> None:
    """The §3.5 rules on client frames: flags 0 or 1, a UUIDv7 (ids.is_uuid7), §3.3 payloads."""
    for index, frame in enumerate(frames, first):
        if frame.flags & (FLAG_PRODUCER | FLAG_ENCRYPTED):
            raise BadFrame(
                f"frame {index}: flags 0x{frame.flags:02x} set by a client "
                "(producerSub and encryption are server-owned)",
                index=index,
                offset=frame.offset + 4,
                field="flags",
                raw=raw,
            )
        message_id = frame.message_id
        # PERF(wire): is_uuid7 inlined (version 7, variant 10); ids are 16 bytes by parsing.
        if message_id[6] >> 4 != 7 or message_id[8] >> 6 != 0b10:
            raise BadFrame(
                f"frame {index}: message id {frame.message_id.hex()} is not a UUIDv7",
                index=index,
                offset=frame.offset + 5,
                field="messageId",
                raw=raw,
            )
        payload = frame.payload
        if payload:
            try:
                _loads(payload)
            except _JSONDecodeError as ex:
                raise InvalidPayload(
                    f"payload of item {index} is not JSON text: {ex}",
                    index=index,
                    offset=frame.offset,
                    field="payload",
                ) from None


# --- the body ---------------------------------------------------------------------------------


def decoded_size(body: bytes | bytearray | memoryview) -> int:
    """How many bytes a QPB1 body holds once its zstd frames are decompressed, read from the
    frame headers without decompressing (they must carry a content size, §3.5).

    A body that does not walk cleanly counts as its length: parsing it says what is wrong.
    """
    view = body if isinstance(body, memoryview) else memoryview(body)
    end = len(view)
    if end < 9 or view[:4] != QPB1_MAGIC:
        return end
    flags = view[4]
    if flags & QPB1_FLAG_FRAMES:
        return end + groups_growth(view, 5)
    # never less than the body itself, whatever size a corrupted head declares
    return max(end, end - 9 + _u32_at(view, 5)[0]) if flags & QPB1_FLAG_ZSTD else end


def groups_growth(body: bytes | bytearray | memoryview, at: int) -> int:
    """How many bytes the §3.5 groups from ``at`` (``u32 group_count`` first) add to the body
    once their zstd frames are decompressed; what walks no further counts nothing (QPB1 flag 8
    and the tail of QTB1)."""
    view = body if isinstance(body, memoryview) else memoryview(body)
    end, grown = len(view), 0
    try:
        count = _u32_at(view, at)[0]
        at += 4
        for _ in range(count):
            at += 2 + _u16_at(view, at)[0]  # queue
            at += 2 + _u16_at(view, at)[0]  # partition
            z_len = _TWO_U32.unpack_from(view, at)[1]
            at += 8
            if at + z_len > end:
                return grown
            content = zstandard.frame_content_size(view[at:at + z_len])
            grown += max(0, content - z_len)
            at += z_len
    except (struct.error, zstandard.ZstdError):
        pass
    return grown


def parse_binary_push(
    body: bytes | bytearray | memoryview,
    *,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    max_total_decompressed: int | None = None,
    columns: bool = False,
) -> BinaryPush:
    """A whole QPB1 body, every rule of §3.4/§3.5 checked, or the first WireError;
    ``columns``: frames groups read as ``read_frame_groups`` reads them so."""
    view = body if isinstance(body, memoryview) else memoryview(body)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    end = len(view)
    if end < 5:
        raise BadFrame(f"body of {end} bytes, shorter than the QPB1 header", offset=0, raw=view)
    if view[:4] != QPB1_MAGIC:
        raise BadFrame("not a QPB1 body (bad magic)", offset=0, field="magic", raw=view)
    flags = view[4]
    if flags & ~(QPB1_FLAG_ZSTD | QPB1_FLAG_COUNTS | QPB1_FLAG_TXN | QPB1_FLAG_FRAMES):
        raise UnsupportedFlags(
            f"QPB1 flags 0x{flags:02x} has unknown bits", offset=4, field="flags"
        )
    counts_only = bool(flags & QPB1_FLAG_COUNTS)
    if flags & QPB1_FLAG_FRAMES:
        if flags & (QPB1_FLAG_ZSTD | QPB1_FLAG_TXN):
            raise UnsupportedFlags(
                f"QPB1 flags 0x{flags:02x}: frames mode (8) combines only with 2",
                offset=4,
                field="flags",
            )
        frame_groups, count = read_frame_groups(
            view,
            5,
            max_items=max_items,
            max_decompressed=max_decompressed,
            max_total_decompressed=max_total_decompressed,
            columns=columns,
        )
        return BinaryPush(counts_only, True, frame_groups, count)
    with_txn = bool(flags & QPB1_FLAG_TXN)
    if not flags & QPB1_FLAG_ZSTD:
        groups, count = _read_plain_groups(view, 5, with_txn, max_items)
        return BinaryPush(counts_only, False, groups, count)
    if end < 9:
        raise _truncated("raw_len", 5, view)
    raw_len = _u32_at(view, 5)[0]
    limit = max_decompressed
    if max_total_decompressed is not None:
        limit = min(limit, max_total_decompressed)
    try:
        inner = decompress_bounded(view[9:], limit, expected_size=raw_len)
    except WireError as ex:
        raise _within(ex, "the body's zstd frame", 9) from None
    try:
        groups, count = _read_plain_groups(memoryview(inner), 0, with_txn, max_items)
    except WireError as ex:
        raise _within(ex, "the decompressed body", 9) from None
    return BinaryPush(counts_only, False, groups, count)
