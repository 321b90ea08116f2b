"""Item-level request fields shared by several routes (docs/api.md 1.3, 2.1, 2.3): push items,
ack items, consumer groups, and the JSON codec that keeps big integers exact.

Kept apart from the resources so that the transaction plan (``queen_mp.models.transactions``)
reuses them, and free of HTTP so that the front worker's services do too. Refusals are
``queen_mp.models.errors`` (names and frames: ``queen_mp.wire.errors``)."""

from __future__ import annotations

import functools
import json
import math
import re
import reprlib
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import attrgetter
from typing import Annotated, Any, Literal

import msgspec
import orjson

from queen_mp.db.ack_procs import STATUSES, AckBatch, AckItem
from queen_mp.models.errors import InvalidRequest, InvalidStatus, NameTooLong, RequestError
from queen_mp.wire.binary_push import check_name, check_partition_name, check_queue_name
from queen_mp.wire.frames import (
    FLAG_ENCRYPTED,
    FRAME_HEAD,
    MAX_TXN_BYTES,
    Frame,
    pack_frame,
    pack_plain_frame,
)
from queen_mp.wire.ids import uuid7, uuid_from_text, uuid_text

__all__ = [
    "DEFAULT_PARTITION",
    "MAX_ITEMS",
    "QUEUE_MODE",
    "ClientChunk",
    "PushBatch",
    "PushItem",
    "decode_ack_batch",
    "decode_push_items",
    "dumps_json",
    "frame_items",
    "frame_sizes",
    "json_item",
    "loads_json",
    "parse_ack_item",
    "parse_group",
    "parse_json_item",
    "parse_partition_id",
    "path_partition_id",
    "path_transaction_id",
    "stamped_item",
]

MAX_ITEMS = 100_000
DEFAULT_PARTITION = "Default"
QUEUE_MODE = "__QUEUE_MODE__"


class PushItem(msgspec.Struct, gc=False):
    """One item of a push body, in wire order.

    PERF(http): a msgspec Struct, built in C (1.1k instructions against a slots dataclass's
    Python ``__init__``, 2.7k: one per pushed item); ``gc=False``, since nothing it holds can
    refer back to it, so a 1,000-item body adds no objects for the collector to walk."""

    queue: str
    partition: str
    transaction_id: str
    message_id: bytes
    frame: bytes | memoryview          # the stored frame of docs/api.md 3.1
    trace_id: bytes | None = None
    chunk: int = -1                    # index into the request's client chunks, -1 if none
    producer_sub: str | None = None    # the token's sub (docs/api.md 1.5), stamped in the frame


@dataclass(frozen=True, eq=False)
class PushBatch(Sequence[PushItem]):
    """The items of a regular push body of one queue and one partition (distinct
    transactionIds, no traceId, no producerSub), as columns and their frames joined: a JSON
    body's (``decode_push_items``), or a QPB1 frames body's of one group, with the client's
    zstd frame (``http.push.parse_binary``).

    PERF(http): what a producer batching one partition sends goes to the shard and into the
    answer with no PushItem, frame or name per item (``Ingest`` packs ``frames`` whole,
    ``render_items`` joins the columns); the items are made (``items``) only on a push's
    rare paths: the spool, encryption, a result per item. Told by ``type(x) is PushBatch``:
    an ``isinstance`` against a Sequence subclass is an ABC check (some 5k instructions a
    1-item push's three, callgrind)."""

    queue: str
    partition: str
    transaction_ids: list[str]
    message_ids: list[bytes]
    frames: bytes       # every item's frame, in body order
    #: each frame's length field (its bytes after the field's own four); None: read from
    #: ``frames`` when needed (``items``)
    sizes: list[int] | None
    #: each transactionId's UTF-8 when it is also its JSON string's inside (no quote,
    #: backslash or control character: the body held no backslash), else None.
    #: PERF(http): the answer quotes them as they are (``render_items``).
    plain_ids: list[bytes] | None = None
    #: the client's zstd frame of ``frames`` (a QPB1 frames group), which the shard gets and
    #: stores as it came; None: the shard compresses ``frames``
    chunk: bytes | memoryview | None = None

    @functools.cached_property
    def items(self) -> list[PushItem]:
        """The batch as PushItems, each frame cut from ``frames`` (of no client chunk: the
        rare paths that need them re-frame or spool them)."""
        sizes = self.sizes
        if sizes is None:
            sizes = frame_sizes(self.frames, len(self.message_ids))
        return frame_items(self.queue, self.partition, self.transaction_ids, self.message_ids,
                           self.frames, sizes)

    def __len__(self) -> int:
        return len(self.message_ids)

    def __getitem__(self, index: int) -> PushItem:  # type: ignore[override]
        return self.items[index]

    def __iter__(self) -> Iterator[PushItem]:
        return iter(self.items)


_FIELD_PLUS = (4).__add__  # a frame's bytes from its length field (FRAME_HEAD's "<I")


def frame_sizes(frames: bytes, count: int) -> list[int]:
    """The length fields of the ``count`` frames back to back in ``frames``."""
    sizes: list[int] = []
    at = 0
    for _ in range(count):
        size = _frame_len(frames, at)[0]
        sizes.append(size)
        at += 4 + size
    return sizes


_frame_len = FRAME_HEAD.unpack_from  # its first field, the length field


def frame_items(queue: str, partition: str, transaction_ids: list[str],
                message_ids: list[bytes], frames: bytes, sizes: list[int], chunk: int = -1
                ) -> list[PushItem]:
    """PushItems of one queue and partition whose frames, of lengths fields ``sizes``, lie
    back to back in ``frames``; ``chunk``: the client chunk that holds them all, if any.

    PERF(http): made by ``map`` (C loops), no Python step per item."""
    ends = list(accumulate(map(_FIELD_PLUS, sizes)))
    cut = map(frames.__getitem__, map(slice, [0, *ends[:-1]], ends))
    n = len(ends)
    return list(map(PushItem, repeat(queue, n), repeat(partition, n), transaction_ids,
                    message_ids, cut, repeat(None, n), repeat(chunk, n)))


@dataclass(frozen=True, slots=True)
class ClientChunk:
    """A client's zstd frames group (QPB1 frames mode), stored byte for byte when intact."""

    data: bytes | memoryview
    first_item: int
    count: int


def json_item(queue: str, partition: str, transaction_id: str | None, payload: bytes,
              trace_id: bytes | None, message_id: bytes, producer_sub: str | None = None
              ) -> PushItem:
    """Frame a JSON (or plain QPB1) item; its transactionId defaults to its id text.

    ``producer_sub`` is the caller's token subject (flag 2), never a value from the body.
    """
    txn = transaction_id or uuid_text(message_id)
    frame = pack_frame(message_id, txn.encode(), payload, trace_id=trace_id,
                       producer_sub=producer_sub)
    return PushItem(queue, partition, txn, message_id, frame, trace_id,
                    producer_sub=producer_sub)


def stamped_item(queue: str, partition: str, f: Frame, producer_sub: str) -> PushItem:
    """A client frame (QPB1/QTB1 frames mode) re-framed with the caller's producerSub.

    The item belongs to no client chunk: the chunk's content changes, so the shard packs the
    new frames into a chunk of its own (docs/api.md 3.2). A client frame never carries flag 2
    (the parsers refuse it), so the stamp cannot be forged, only added.
    """
    frame = pack_frame(f.message_id, bytes(f.transaction_id_bytes), f.payload,
                       trace_id=f.trace_id, producer_sub=producer_sub,
                       encrypted=bool(f.flags & FLAG_ENCRYPTED))
    return PushItem(queue, partition, f.transaction_id, f.message_id, frame, f.trace_id,
                    producer_sub=producer_sub)


# PERF(http): 19 ASCII digits in a row, found by mapping every digit to "0" and one substring
# search (both in C): 10x cheaper than re.search(rb"\d{19}"), which was a sixth of a 100-item
# push's CPU.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19


def _may_hold_long_int(body: bytes) -> bool:
    return body.translate(_DIGITS_TO_ZERO).find(_LONG_RUN) >= 0


def loads_json(body: bytes) -> Any:
    """orjson, except for bodies with integers that may not fit 64 bits: orjson would turn
    them into floats, and a payload must be stored as the client meant it.

    The stdlib path refuses (ValueError) what orjson refuses: lone surrogates, infinite
    numbers, and nesting too deep to read."""
    if not _may_hold_long_int(body):
        return orjson.loads(body)
    try:
        doc = json.loads(body, parse_constant=_reject_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    _reject_lone_surrogates(doc)
    return doc


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is infinite as a double")
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_lone_surrogates(doc: Any) -> None:
    todo = [doc]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v) is not None:
                raise ValueError("a string holds a lone surrogate (not Unicode text)")
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)


def dumps_json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits from the stdlib path, or over 254 levels
        pass
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()
    except (RecursionError, ValueError):
        raise InvalidRequest("a JSON value nested too deeply to store") from None


def parse_json_item(it: Any, i: int, producer_sub: str | None = None,
                    message_id: bytes | None = None) -> PushItem:
    """One docs/api.md 2.1 item (also a transaction's push item); ``i`` names it in errors.

    ``producer_sub`` is the caller's token subject; a ``producerSub`` key of the item is
    ignored like any unknown key (docs/api.md 1.5: clients cannot set it). ``message_id``: one
    the caller minted with the rest of its body's (``uuid7_many``), else a new one."""
    if not isinstance(it, dict):
        raise InvalidRequest(f"item {i} is not an object", index=i)
    queue = it.get("queue")
    if not isinstance(queue, str):
        raise InvalidRequest(f"item {i}: 'queue' must be a string", index=i, field="queue")
    check_queue_name(queue, index=i)
    partition = it.get("partition")
    if partition is None or partition == "":
        partition = DEFAULT_PARTITION
    elif not isinstance(partition, str):
        raise InvalidRequest(f"item {i}: 'partition' must be a string", index=i,
                             field="partition")
    else:
        check_partition_name(partition, index=i)
    txn = it.get("transactionId")
    if txn is not None and not isinstance(txn, str):
        raise InvalidRequest(f"item {i}: 'transactionId' must be a string", index=i,
                             field="transactionId")
    if txn and len(txn.encode()) > MAX_TXN_BYTES:
        raise NameTooLong(f"item {i}: transactionId over {MAX_TXN_BYTES} bytes", index=i,
                          field="transactionId", limit=MAX_TXN_BYTES)
    trace = it.get("traceId")
    trace_id = None
    if trace is not None:
        if not isinstance(trace, str):
            raise InvalidRequest(f"item {i}: 'traceId' must be a UUID string", index=i,
                                 field="traceId")
        trace_id = uuid_from_text(trace, field="traceId")
    value = it["payload"] if "payload" in it else it.get("data")
    payload = b"" if value is None else dumps_json(value)
    return json_item(queue, partition, txn, payload, trace_id, message_id or uuid7(),
                     producer_sub)


class _TypedItem(msgspec.Struct, gc=False):
    """A push item as ``decode_push_items`` reads it: the payload stays the client's JSON text.

    PERF(http): ``gc=False`` (strings, None and Raw cannot make a cycle): 21k instructions
    less a 100-item body's decode, callgrind."""

    queue: str
    partition: str | None = None
    transactionId: str | None = None
    traceId: str | None = None
    payload: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _TypedBody(msgspec.Struct, gc=False):
    items: list[_TypedItem]


_PUSH_BODY = msgspec.json.Decoder(_TypedBody)
_NULL = msgspec.Raw(b"null")
# Digits to "0", "e", "E" and "+" to "e", every other byte to "x": a number whose exponent
# has three digits or more (it may overflow a double) shows as "e000" ("e+308": "ee000"), a run
# of 19 digits as _LONG_RUN. Other text can show so too (a string "+1234"), and then only
# takes the exact path.
_NUMBER_SHAPES = bytes(48 if 48 <= b <= 57 else 101 if b in (43, 69, 101) else 120
                       for b in range(256))
_BIG_EXPONENT = b"e000"
# PERF(http): searched for as ints: ``b"\\" in body`` first tries the needle as an int,
# and the TypeError it raises and clears cost 2.3k instructions a search (CPython 3.11's
# bytes_contains; ``bytes.find`` takes a bytes needle directly, an int needle is a memchr)
_BACKSLASH, _SPACE, _LF, _TAB, _CR, _QUOTE = b"\\ \n\t\r\""
_SCAN_BULK = 1 << 12  # bytes from which numpy scans a body (_no_long_number_bulk)
_ZERO, _TEN, _LOWER, _E, _PLUS = 48, 10, 32, 101, 43  # "0", 10 digits, a case bit, "e", "+"
_THREE_17 = b"\x01" * 17  # in a mask of where 3 digits start in a row: 19 digits
_EIGHT_DIGITS = 0x0101010101010101  # 8 digits in a row, as a word of the digits' bool mask
_MAX_DEPTH = 1024  # orjson's
_UNSET = msgspec.UNSET


def _orjson_reads_alike(body: bytes, known: Callable[[], bytes] | None = None) -> bool:
    """Whether nothing in ``body`` is what msgspec reads (or skips, or keeps raw) but orjson
    refuses: invalid UTF-8, a number that may not fit a double (a run of 19 digits, an
    exponent of 3 digits). Nesting is the caller's: msgspec's limit is Python's recursion
    limit, orjson's is _MAX_DEPTH. ``known``: the decoded text of some of the body's strings,
    joined by NULs (see ``_no_long_number_bulk``)."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return False
    if _BACKSLASH in body:  # escaped quotes: the strings are not told by their quotes
        return _no_long_number(body)
    # PERF(ack): text shows so too: a leaseId's hex ("...-e123-...") made a tenth of the
    # consume benchmark's ack batches take the exact path, 300 us dearer a 100-item body.
    # Numbers lie outside the strings: in a body msgspec reads (valid JSON) with no backslash,
    # every quote opens or closes a string, so every other piece between quotes is outside
    # them (30 us for 100 acks).
    if len(body) >= _SCAN_BULK:
        return _no_long_number_bulk(body, strings=False, known=known)
    return _no_long_number(body) or _no_long_number(b"".join(body.split(b'"')[::2]))


def _no_long_number(text: bytes) -> bool:
    """Whether ``text`` shows no run of 19 digits and no exponent of 3 digits or more (an
    "e", "E" or "+" before 3 digits), as ``_NUMBER_SHAPES`` tells them."""
    if len(text) >= _SCAN_BULK:
        return _no_long_number_bulk(text)
    shapes = text.translate(_NUMBER_SHAPES)
    return shapes.find(_LONG_RUN) < 0 and shapes.find(_BIG_EXPONENT) < 0


def _no_long_number_bulk(text: bytes, strings: bool = True,
                         known: Callable[[], bytes] | None = None) -> bool:
    """``_no_long_number`` by numpy, on masks of the bytes; with ``strings`` False, of the
    bytes outside JSON strings only (a body with no backslash: every quote opens or closes
    one, so a byte after an odd count of quotes is inside one).

    PERF(http): ``bytes.translate`` maps a byte in a dozen instructions, a 100-item push body
    (27 KB) in 330k with its two searches; numpy's vector compares take about 110k, most of it
    the fixed cost of its calls, which a body under _SCAN_BULK bytes does not repay. A run of
    19 digits is 17 places of 3 in a row, found by one bytes search in the mask of those
    places (in place of 5 numpy calls: 10k instructions less a 100-item body).

    PERF(http): without ``strings``, a shape found is looked up among the quotes (an odd
    count of quotes before it: inside a string), in the same pass, where the strings were cut
    out and the body scanned again (``split`` on quotes and ``join``, an object a piece,
    bounded to 256 KB bodies, past which the exact path took the body): a body whose strings
    hold hex such as UUIDs ("...e123...": most bodies of UUID transactionIds) is read by the
    typed path whatever its size. ``parse_json_push`` of a body of UUID transactionIds and
    the suite's 200-byte payloads (callgrind): 2.21M -> 1.84M instructions at 100 items,
    33.7M -> 17.5M at 1,000 (the typed path now); bench.hotpath front100 and ack100, whose
    strings show no shape, unchanged (88.09M/88.16M, 63.31M/63.33M).

    PERF(http): ``known`` (the caller's decoded transactionIds, NUL-joined: text of the
    body's strings) settles the usual case before the quotes are looked up: a shape holds no
    quote, no NUL and no escape, so it lies whole inside one string or outside all of them, and
    shapes never overlap; when the body shows no 19-digit run and no more exponent shapes than
    the known strings hold, every one is in a string. A fifth of UUID transactionIds show one
    ("...-e123-..."): bench.hotpath front100u 2.001M -> 1.861M instructions a request (callgrind, 50
    rounds: 100.07M -> 93.03M; front100 unchanged, 82.64M)."""
    import numpy  # NOTE(http): only here, in a front worker; never in the supervisor

    raw = numpy.frombuffer(text, numpy.uint8)
    digit = numpy.less(raw - _ZERO, _TEN)
    three = digit[:-2] & digit[1:-1] & digit[2:]  # digits at i, i+1 and i+2
    if not three.any():
        return True
    sign = ((raw | _LOWER) == _E) | (raw == _PLUS)
    exponents = sign[:-3] & three[1:]
    # PERF(http): 19 digits in a row hold 8 at a multiple of 8: one compare of the digits' mask
    # as words, and the mask's copy and search only then. bench.hotpath front100 (callgrind,
    # 50 rounds, PYTHONHASHSEED=0) 1.653M -> 1.633M instructions a request
    run, mask = -1, b""
    if (digit[:len(digit) & -8].view(numpy.uint64) == _EIGHT_DIGITS).any():
        mask = three.tobytes()
        run = mask.find(_THREE_17)
    if run < 0 and not exponents.any():
        return True
    if strings:
        return False
    if run < 0 and known is not None:
        in_known = known().translate(_NUMBER_SHAPES).count(_BIG_EXPONENT)
        if numpy.count_nonzero(exponents) == in_known:
            return True
    # a shape's bytes hold no quote, so its first byte tells whether it is inside a string
    quotes = numpy.flatnonzero(raw == _QUOTE)
    at = numpy.flatnonzero(exponents)
    if at.size and not (quotes.searchsorted(at) & 1).all():
        return False
    while run >= 0:
        if not quotes.searchsorted(run) & 1:
            return False
        end = mask.find(b"\0", run)  # past this run of digits (all in one string)
        run = mask.find(_THREE_17, end) if end >= 0 else -1
    return True


def _brackets(raw: msgspec.Raw | bytes) -> int:
    text = bytes(raw)
    return text.count(b"[") + text.count(b"{")


def _deeper_than_orjson(body: bytes, own: int) -> bool:
    """Whether ``body`` may nest deeper than orjson reads while msgspec reads it: msgspec
    refuses only past Python's recursion limit (1,000 unless raised, as a test harness can),
    so where that limit is above orjson's, a body holding more than _MAX_DEPTH brackets
    besides its ``own`` (those of the body's own structure) takes the exact path."""
    return sys.getrecursionlimit() > _MAX_DEPTH and _brackets(body) - own > _MAX_DEPTH


def _txn_text(raw_items: list[_TypedItem], made: list[bytes]) -> bytes:
    """The items' transactionIds, NUL-joined, in UTF-8 (``_no_long_number_bulk``'s known),
    also left in ``made``: ``_regular_items`` splits that text rather than join them again."""
    text = _NUL.join(filter(None, map(_TXN_OF, raw_items))).encode()
    made.append(text)
    return text


def decode_push_items(body: bytes, producer_sub: str | None,
                      message_ids: Callable[[int], list[bytes]]
                      ) -> Sequence[PushItem] | None:
    """The items of a docs/api.md 2.1 push body, or None when the exact path
    (``loads_json`` + ``parse_json_item``) must decide: anything it would refuse or write
    otherwise takes that path, which words the error.

    PERF(http): a typed decode keeps each payload as JSON text (no dict built and dumped again
    per item), and a name is checked once per body, not once per item: the exact path was a
    third of a 100-item push's in-process instructions. The body is first made compact (no
    insignificant whitespace), so a payload is stored as compact JSON as docs/api.md 3.1 says;
    a number keeps the client's spelling (``2.50`` stays so, the exact path writes ``2.5``).
    Left to the exact path: what msgspec accepts but orjson refuses (invalid UTF-8, a number
    that may not fit a double: a run of 19 digits, an exponent of 3 digits) and the escapes
    orjson writes out (``\\u``, ``\\/``), so stored strings are what the exact path stores."""
    if not body:
        return None
    # PERF(http): one-byte searches are memchr; most bodies have no escape at all (told once:
    # compacting the body below keeps its strings, escapes included, as they are)
    escaped = _BACKSLASH in body
    if escaped and (body.find(b"\\u") >= 0 or body.find(b"\\/") >= 0):
        return None
    try:
        if _SPACE in body or _LF in body or _TAB in body or _CR in body:
            body = msgspec.json.format(body, indent=-1)
        raw_items = _PUSH_BODY.decode(body).items
    except (msgspec.DecodeError, RecursionError):
        return None
    # after the decode: its transactionIds tell the number scan where shapes are text
    txn_text: list[bytes] = []
    if not _orjson_reads_alike(body, functools.partial(_txn_text, raw_items, txn_text)):
        return None
    n = len(raw_items)
    if n > MAX_ITEMS:
        return None
    # the body's own brackets: one per item and two around them
    deep = _deeper_than_orjson(body, n + 2)
    ids = message_ids(n)
    try:
        if n >= _COLUMNS_FROM and producer_sub is None and not deep:
            regular = _regular_items(raw_items, n, ids, not escaped,
                                     txn_text[0] if txn_text else None)
            if regular is not None:
                return regular
        # checked names, one str each (a partition may hold "/", a queue may not)
        queues: dict[str, str] = {}
        partitions: dict[str, str] = {}
        items: list[PushItem] = []
        append = items.append
        unstamped = producer_sub is None
        for it, message_id in zip(raw_items, ids, strict=True):
            plain = unstamped
            queue = queues.get(it.queue)
            if queue is None:
                queue = queues[it.queue] = _queue_name(it.queue)
            partition = it.partition or DEFAULT_PARTITION
            known = partitions.get(partition)
            if known is None:
                known = partitions[partition] = _partition_name(partition)
            txn = it.transactionId
            if txn and len(txn) > MAX_TXN_BYTES // 4 and len(txn.encode()) > MAX_TXN_BYTES:
                return None
            trace_id = None
            if it.traceId is not None:
                trace_id = uuid_from_text(it.traceId)
                plain = False
            value = it.payload if it.payload is not _UNSET else it.data
            payload = b"" if value is _UNSET or value == _NULL else value
            if deep and payload and _brackets(payload) > _MAX_DEPTH:
                return None
            txn = txn or uuid_text(message_id)
            frame = (pack_plain_frame(message_id, txn.encode(), payload) if plain else
                     pack_frame(message_id, txn.encode(), payload, trace_id=trace_id,
                                producer_sub=producer_sub))
            append(PushItem(queue, known, txn, message_id, frame, trace_id, -1, producer_sub))
    except (RequestError, ValueError):  # wire.errors are ValueErrors
        return None
    return items


_TXN_OF = attrgetter("transactionId")
_COLUMNS_FROM = 24  # items from which a body is first tried by columns (_regular_items)
_astuple = msgspec.structs.astuple
_FIXED = 1 + 16 + 2  # a plain frame body's bytes besides its txn and payload
_NUL, _NUL_RAW = "\0", b"\0"
_plain_head = FRAME_HEAD.pack  # as pack_plain_frame packs it


def _regular_items(raw_items: list[_TypedItem], n: int, ids: list[bytes], plain: bool,
                   txn_text: bytes | None = None) -> Sequence[PushItem] | None:
    """``decode_push_items``' items of a regular body (what a producer batching sends: every
    item with its own transactionId and a payload, no traceId, no data), by columns: a
    ``PushBatch`` when they share one queue and one partition and no transactionId repeats;
    None when the body is not regular (read item by item then), or RequestError, ValueError
    (the exact path's). ``plain``: the body held no backslash. ``txn_text``: the
    transactionIds NUL-joined in UTF-8 when the number scan made it (``_txn_text``).

    PERF(http): each field of every item as one column (made in C), a name checked once per
    distinct value, frames packed and joined and PushItems made by ``map``: no Python step
    per item. Its fixed cost (a dozen lists, maps and zips) pays from about 20 items. A
    batch's frames are one join of heads, transactionIds and payloads laid out by slice
    assignment, with no frame nor PushItem per item.

    PERF(http): the transactionIds are encoded by one join, encode and split (a decoded text
    holds no NUL: JSON escapes it, and a body of ``\\u`` escapes takes the exact path), the
    frames' sizes by one comprehension, a null payload found by one ``in`` (no column of
    payload lengths); with ``PushBatch.plain_ids`` quoted in the answer, bench.hotpath
    front100 1.764M -> 1.657M instructions a request (callgrind)."""
    queues, partitions, txns, traces, payloads, datas = zip(
        *map(_astuple, raw_items), strict=True)
    if traces.count(None) != n or datas.count(_UNSET) != n or not all(payloads) \
            or not all(txns) or _NULL in payloads:
        return None
    # every transactionId is a non-empty str here, so ``_txn_text``'s filter dropped none
    txn_raw = (_NUL.join(txns).encode() if txn_text is None else txn_text).split(_NUL_RAW)
    tlens = list(map(len, txn_raw))
    if max(tlens) > MAX_TXN_BYTES:
        return None
    # PERF(http): a column of one name (a body of one queue, of one partition) is told by a
    # count, comparing being cheaper than hashing
    one_queue = queues.count(queues[0]) == n
    one_partition = partitions.count(partitions[0]) == n
    sizes = [_FIXED + t + len(p) for t, p in zip(tlens, payloads, strict=True)]
    if one_queue and one_partition and len(set(txns)) == n:
        parts: list[Any] = [b""] * (3 * n)
        parts[::3] = map(_plain_head, sizes, repeat(0), ids, tlens)
        parts[1::3] = txn_raw
        parts[2::3] = payloads
        return PushBatch(_queue_name(queues[0]), _partition_or_default(partitions[0]), list(txns),
                         ids, b"".join(parts), sizes, txn_raw if plain else None)
    heads = map(_plain_head, sizes, repeat(0), ids, tlens)
    frames = map(b"".join, zip(heads, txn_raw, payloads, strict=True))
    return list(map(PushItem, _names(queues, one_queue, _queue_name),
                    _names(partitions, one_partition, _partition_or_default), txns, ids, frames))


def _names(names: tuple[str, ...], one: bool, check: Callable[[str], str]) -> Iterable[str]:
    """The column ``names`` checked (``check`` raises), one str per distinct name; ``one``:
    every name is the first one."""
    if one:
        return repeat(check(names[0]), len(names))
    return map({name: check(name) for name in set(names)}.__getitem__, names)


def _partition_or_default(name: str | None) -> str:
    """A partition name checked; absent, null or empty is ``DEFAULT_PARTITION``."""
    return _partition_name(name or DEFAULT_PARTITION)


@functools.lru_cache(maxsize=1024)
def _queue_name(name: str) -> str:
    """``name`` once ``check_queue_name`` let it pass (it raises otherwise).

    PERF(http): cached, since a producer pushes to a few names over and over (the check, two
    Python calls and a regex search, was 3.7k instructions, the cache 1k); NOTE(memory): one
    str per name the worker saw lately, not one per request."""
    check_queue_name(name)
    return name


@functools.lru_cache(maxsize=1024)
def _partition_name(name: str) -> str:
    """``name`` once ``check_partition_name`` let it pass; cached as ``_queue_name``."""
    check_partition_name(name)
    return name


@functools.lru_cache(maxsize=1024)
def _lease_uuid(lease: str) -> uuid.UUID:
    """PERF(queen): cached, since a batch's acks share one lease (uuid.UUID costs 1.5 us)."""
    try:
        return uuid.UUID(lease)
    except ValueError:
        # NOTE(queen): a lease id that is no UUID is simply not a live lease
        return uuid.UUID(int=0)


@functools.lru_cache(maxsize=1024)
def parse_group(raw: str | None) -> str:
    """``consumerGroup``: absent, empty or ``null`` is queue mode (docs/api.md 1.3)."""
    if raw is None or raw == "" or raw == "null":
        return QUEUE_MODE
    check_name(raw, "consumerGroup")
    return raw


def parse_partition_id(raw: Any, index: int | None) -> int:
    if isinstance(raw, bool):
        raise InvalidRequest("partitionId must be a decimal string or an integer",
                             field="partitionId", index=index)
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and raw.isascii() and raw.isdigit():
        # NOTE(queen): int() refuses over 4300 digits; over 19 is out of range anyway
        value = int(raw) if len(raw.lstrip("0")) <= 19 else 1 << 63
    else:
        raise InvalidRequest("partitionId must be a decimal string or an integer",
                             field="partitionId", index=index)
    if not 0 < value < 1 << 63:
        raise InvalidRequest("partitionId out of range", field="partitionId", index=index)
    return value


def parse_ack_item(doc: Any, index: int, default_group: str | None) -> AckItem:
    """One acknowledgment object; its own consumerGroup wins over the body's."""
    if not isinstance(doc, dict):
        raise InvalidRequest("an acknowledgment must be an object", index=index)
    txn = doc.get("transactionId")
    if not isinstance(txn, str) or not txn:
        raise InvalidRequest("transactionId is required (a non-empty string)",
                             field="transactionId", index=index)
    if len(txn) > MAX_TXN_BYTES // 4 and len(txn.encode("utf-8")) > MAX_TXN_BYTES:
        raise NameTooLong(f"transactionId over {MAX_TXN_BYTES} bytes", field="transactionId",
                          limit=MAX_TXN_BYTES, index=index)
    if "partitionId" not in doc or doc["partitionId"] is None:
        raise InvalidRequest("partitionId is required", field="partitionId", index=index)
    partition_id = parse_partition_id(doc["partitionId"], index)
    status = doc.get("status", "completed")
    if status == "success":
        status = "completed"
    if status not in STATUSES:
        raise InvalidStatus(f"status {reprlib.repr(status)} is not completed, success, failed, "
                            "retry or dlq", field="status", index=index)
    group = doc.get("consumerGroup", default_group)
    if group is not None and not isinstance(group, str):
        raise InvalidRequest("consumerGroup must be a string or null", field="consumerGroup",
                             index=index)
    lease = doc.get("leaseId")
    lease_id: uuid.UUID | None = None
    if lease is not None and not isinstance(lease, str):
        raise InvalidRequest("leaseId must be a string or null", field="leaseId", index=index)
    if lease:
        lease_id = _lease_uuid(lease)
    error = doc.get("error")
    if error is not None and not isinstance(error, str):
        error = dumps_json(error).decode()
    if error is not None and "\x00" in error:  # PostgreSQL text cannot hold it
        raise InvalidRequest("error contains a NUL character", field="error", index=index)
    return AckItem(index, txn, partition_id, status, parse_group(group), lease_id, error)


#: PERF(ack): checked by msgspec in C as it decodes: non-empty, and at most MAX_TXN_BYTES // 4
#: characters, so at most MAX_TXN_BYTES UTF-8 bytes (a longer one takes the exact path, which
#: counts its bytes); a scan of the decoded ids was 47k instructions of a 100-item batch.
_AckTxn = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TXN_BYTES // 4)]
#: PERF(ack): a status msgspec checks and hands out as the one literal string (a batch's
#: statuses then count by identity); any other takes the exact path, which words the refusal.
_AckStatus = Literal["completed", "success", "failed", "retry", "dlq"]


class _TypedAck(msgspec.Struct, gc=False):
    """An acknowledgment as ``decode_ack_batch`` reads it (its columns in this order).

    PERF(ack): ``gc=False``: one per acknowledgment, and nothing it holds (strings, ints,
    None) can make a cycle; untracked, a batch's do not bring the collector round sooner."""

    transactionId: _AckTxn
    partitionId: str | int
    status: _AckStatus = "completed"
    consumerGroup: str | msgspec.UnsetType | None = msgspec.UNSET
    leaseId: str | None = None
    error: str | None = None


class _TypedAckBatch(msgspec.Struct):
    acknowledgments: list[_TypedAck]
    consumerGroup: str | None = None


class _StrictAck(_TypedAck, forbid_unknown_fields=True):
    """An acknowledgment of the fields docs/api.md 2.4 names, and no other."""


class _StrictAckBatch(msgspec.Struct, forbid_unknown_fields=True):
    acknowledgments: list[_StrictAck]
    consumerGroup: str | None = None


_ACK_BATCH = msgspec.json.Decoder(_TypedAckBatch)
_ACK_ONE = msgspec.json.Decoder(_TypedAck)
_STRICT_BATCH = msgspec.json.Decoder(_StrictAckBatch)
_STRICT_ONE = msgspec.json.Decoder(_StrictAck)
_STATUS_OF = {s: s for s in STATUSES} | {"success": "completed"}


def _column(values: list[Any], read: Callable[[Any], Any]) -> list[Any]:
    """``values`` each replaced by what ``read`` makes of it, ``read`` called once per
    distinct value (a batch repeats its partition id, status, group and lease)."""
    first = values[0]
    if values.count(first) == len(values):  # PERF(ack): comparing is cheaper than hashing
        return [read(first)] * len(values)
    return list(map({v: read(v) for v in set(values)}.__getitem__, values))


def _lease(raw: str | None) -> uuid.UUID | None:
    return _lease_uuid(raw) if raw else None


def _error(raw: str | None) -> str | None:
    if raw is not None and "\x00" in raw:
        raise ValueError("NUL")
    return raw




def _typed_acks(body: bytes, batch: bool) -> tuple[Sequence[_TypedAck], str | None] | None:
    """The decoded acknowledgments and the body's consumerGroup, or None (the exact path's).

    PERF(ack): an ASCII body of the named fields alone holds nothing orjson refuses that
    msgspec reads (no number but a partitionId, which parse_partition_id bounds; no nesting
    beyond its own), so it needs no scan of its bytes: ``_orjson_reads_alike`` was a seventh
    of a 100-item batch's instructions (a leaseId's hex often looks like an exponent)."""
    if not body:
        return None
    if body.isascii():
        try:
            if batch:
                strict = _STRICT_BATCH.decode(body)
                return strict.acknowledgments, strict.consumerGroup
            return [_STRICT_ONE.decode(body)], None
        except msgspec.DecodeError:
            pass  # another field: the scanned reading below decides
    if not _orjson_reads_alike(body) or _deeper_than_orjson(body, 0):
        return None
    try:
        if batch:
            doc = _ACK_BATCH.decode(body)
            return doc.acknowledgments, doc.consumerGroup
        return [_ACK_ONE.decode(body)], None
    except (msgspec.DecodeError, RecursionError):
        return None


class _TxnAck(msgspec.Struct, gc=False):
    """An acknowledgment's transactionId alone (its other fields skipped, unchecked)."""

    transactionId: _AckTxn


class _TxnAckBatch(msgspec.Struct):
    acknowledgments: list[_TxnAck]


_TXN_BATCH = msgspec.json.Decoder(_TxnAckBatch)
_TXN_OF = attrgetter("transactionId")
#: how every acknowledgment of a regular batch body (``_regular_acks``) opens, and how each
#: after the first one does
_ACK_OPEN = b'{"transactionId":"'
_ACK_NEXT = b"," + _ACK_OPEN


def _regular_acks(body: bytes) -> tuple[list[str], Sequence[_TypedAck], str | None] | None:
    """The transactionIds of a batch body whose acknowledgments differ in their
    transactionId alone, each written first, with the typed reading of its first one and
    the body's consumerGroup; None otherwise (``_typed_acks`` reads it).

    PERF(ack): a client acks a pop's messages as one lease of one partition: its body is the
    first acknowledgment's text again and again with another transactionId. msgspec reads
    the transactionIds alone (the other fields skipped, no value made of them); the body is
    then that text laid out again (one join, one compare), and the typed reading of the body
    with its first acknowledgment alone checks that one's fields and the body's shape: no
    struct, tuple nor column value per acknowledgment (a 100-ack body 480k -> 335k
    instructions, callgrind). An ASCII body without a backslash reads so exactly as orjson
    reads it: every acknowledgment is the first one's object with its own transactionId
    (which msgspec read as JSON text, escape-free), in the array the first one's reading
    finds (the body's last ``acknowledgments``: the text after the items names none).
    Splitting the body by the text between two transactionIds cost more than msgspec:
    bytes.split prepares its needle again for every piece."""
    if 92 in body or not body.isascii():  # 92: a backslash
        return None
    at = body.find(_ACK_OPEN)
    if at < 1 or body[at - 1] != 91:  # 91: the "[" that opens the items
        return None
    start = at + len(_ACK_OPEN)
    end = body.find(b'"', start)  # the first transactionId's end (no escape in the body)
    close = body.find(b"}", end)
    if end < 0 or close < 0:
        return None
    rest = body[end : close + 1]
    if b'"transactionId"' in rest:
        return None
    try:
        texts = list(map(_TXN_OF, _TXN_BATCH.decode(body).acknowledgments))
    except (msgspec.DecodeError, RecursionError):
        return None
    if not texts:
        return None
    laid = (rest + _ACK_NEXT).decode().join(texts).encode()
    if not body.startswith(laid, start) or not body.startswith(rest, start + len(laid)):
        return None
    tail = body[start + len(laid) + len(rest):]
    if tail[:1] != b"]" or b'"acknowledgments"' in tail:
        return None
    try:
        first = _STRICT_BATCH.decode(body[: close + 1] + tail)
    except msgspec.DecodeError:
        return None
    acks = first.acknowledgments
    if len(acks) != 1 or acks[0].transactionId != texts[0]:
        return None
    return texts, acks, first.consumerGroup


def decode_ack_batch(body: bytes, batch: bool, max_acks: int) -> AckBatch | None:
    """The items of an ack body (docs/api.md 2.3 one object, 2.4 ``batch``), or None when the
    exact path (orjson + ``parse_ack_item``) must decide; it words every refusal.

    PERF(ack): a typed decode read by columns (attribute lists made in C, each distinct value
    checked once a body): ``parse_ack_item`` was two thirds of a 100-item ack batch's
    in-process instructions, a Python loop over the decoded items half of what remained. A
    regular batch body (``_regular_acks``) decodes its first acknowledgment alone, and its
    columns repeat that one's fields."""
    regular = _regular_acks(body) if batch else None
    if regular is not None:
        texts, acks, default_group = regular
        if len(texts) > max_acks:
            return None
        one = _ack_columns(acks, default_group)
        if one is None:
            return None
        n = len(texts)
        return AckBatch(texts, one.partition_ids * n, one.statuses * n, one.groups * n,
                        one.lease_ids * n, one.errors * n)
    typed = _typed_acks(body, batch)
    if typed is None:
        return None
    acks, default_group = typed
    if len(acks) > max_acks:
        return None
    if not acks:
        return AckBatch([], [], [], [], [], [])
    return _ack_columns(acks, default_group)


def _ack_columns(acks: Sequence[_TypedAck], default_group: str | None) -> AckBatch | None:
    """The checked columns of decoded acknowledgments (at least one); None when a value is
    one the exact path must word."""
    # PERF(ack): the columns by one tuple per item (in _TypedAck's field order) transposed
    # in C; an attribute read per field and item cost a fifth of the decode
    txns, pids, statuses, groups, leases, errors = map(
        list, zip(*map(msgspec.structs.astuple, acks), strict=True))

    def group_of(raw: str | msgspec.UnsetType | None) -> str:
        return parse_group(default_group if raw is msgspec.UNSET else raw)

    try:
        # NOTE(ack): "7" != 7 as keys, so a str never stands for an int; no bool gets here
        return AckBatch(txns, _column(pids, _partition_id),
                        _column(statuses, _STATUS_OF.__getitem__), _column(groups, group_of),
                        _column(leases, _lease), _column(errors, _error))
    except (RequestError, ValueError):  # wire.errors are ValueErrors
        return None


def _partition_id(raw: str | int) -> int:
    return parse_partition_id(raw, None)


def path_partition_id(raw: str) -> int:
    """A partitionId path segment: a positive decimal int64."""
    # NOTE(queen): the length first: int() refuses over 4300 digits (a 500)
    if not (raw.isascii() and raw.isdigit()) or len(raw.lstrip("0")) > 19 \
            or not 0 < int(raw) < 1 << 63:
        raise InvalidRequest(f"partitionId {raw[:40]!r} is not a positive decimal int64",
                             field="partitionId")
    return int(raw)


def path_transaction_id(raw: str) -> str:
    """A transactionId of a path segment or a trace body: 1..1024 UTF-8 bytes, no NUL."""
    if not raw:
        raise InvalidRequest("empty transactionId", field="transactionId")
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_TXN_BYTES:
        raise NameTooLong(f"transactionId of {size} bytes, over {MAX_TXN_BYTES}",
                          field="transactionId", limit=MAX_TXN_BYTES)
    # NOTE(queen): lookups and traces pass it to PostgreSQL as text, which cannot hold the NUL
    # a pushed frame may: a 400 here rather than a failure in the driver
    if "\x00" in raw:
        raise InvalidRequest("transactionId holds a NUL character (\\u0000), which a lookup "
                             "or a trace cannot use", field="transactionId")
    return raw
