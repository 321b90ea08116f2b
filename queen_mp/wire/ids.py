"""UUIDv7 message ids (RFC 9562), minted in the front workers.

Ids must sort in mint order inside one process, even for thousands per millisecond or when the
wall clock steps back, so the 74 bits of rand_a and rand_b form one counter (RFC 9562 §6.2,
method 1 with a random seed): a new millisecond reseeds it at random with its top bit clear, a
repeated (or earlier) millisecond adds one to it. Across processes uniqueness rests on the 73
random seed bits; every forked child reseeds before its first id.

NOTE(wire): ids minted in one millisecond differ by one, so they are guessable from each other:
never use them as secrets (lease ids, tokens); those want os.urandom / uuid4.
"""

from __future__ import annotations

import functools
import os
import random
import struct
import threading
from time import time_ns
from typing import Any

from queen_mp.wire.errors import InvalidRequest

__all__ = [
    "ZERO_UUID",
    "ZERO_UUID_TEXT",
    "is_uuid7",
    "uuid7",
    "uuid7_many",
    "uuid7_unix_ms",
    "uuid_from_text",
    "uuid_text",
    "uuid_texts",
]

ZERO_UUID = bytes(16)
ZERO_UUID_TEXT = "00000000-0000-0000-0000-000000000000"

_RAND_B_BITS = 62
_RAND_B_MASK = (1 << _RAND_B_BITS) - 1
_COUNTER_MAX = (1 << 74) - 1
_SEED_BITS = 73  # NOTE(wire): top counter bit clear, so a seed never starts near overflow.
_VERSION_VARIANT = (0x7 << 76) | (0b10 << 62)

_rng = random.Random()
_lock = threading.Lock()
_last_ms = -1
_last = 0  # the last id minted, as an int


def _compose(ms: int, counter: int) -> int:
    return (
        (ms << 80) | _VERSION_VARIANT | ((counter >> _RAND_B_BITS) << 64) | (counter & _RAND_B_MASK)
    )


def _seeded(ms: int) -> int:
    return _compose(ms, _rng.getrandbits(_SEED_BITS))


def _after(value: int) -> int:
    """The id after ``value`` when rand_b is exhausted: carry into rand_a, or into the next ms."""
    counter = (((value >> 64) & 0xFFF) << _RAND_B_BITS) | (value & _RAND_B_MASK)
    if counter < _COUNTER_MAX:
        return _compose(value >> 80, counter + 1)
    # NOTE(wire): 2**73 ids in one millisecond cannot happen; borrow the next one anyway.
    return _seeded((value >> 80) + 1)


def _reset_after_fork() -> None:
    """A child must not continue its parent's sequence: reseed and drop any held lock."""
    global _lock, _last_ms, _last
    _lock = threading.Lock()
    _last_ms = -1
    _last = 0
    _rng.seed(os.urandom(32))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def uuid7() -> bytes:
    """One new UUIDv7, 16 bytes, greater than every id this process minted before."""
    global _last_ms, _last
    ms = time_ns() // 1_000_000
    with _lock:
        if ms > _last_ms:
            value = _seeded(ms)
        else:
            # PERF(wire): the common same-millisecond case is one add; carry only on wrap.
            value = _last + 1
            if not value & _RAND_B_MASK:
                value = _after(_last)
        _last = value
        _last_ms = value >> 80
    return value.to_bytes(16, "big")


def uuid7_many(n: int) -> list[bytes]:
    """``n`` new ascending UUIDv7s under one clock read and one lock (a whole push body)."""
    global _last_ms, _last
    if n <= 0:
        return []
    ms = time_ns() // 1_000_000
    with _lock:
        if ms > _last_ms:
            first = _seeded(ms)
        else:
            first = _last + 1
            if not first & _RAND_B_MASK:
                first = _after(_last)
        if n == 1:
            # PERF(wire): one id (a 1-item push) without a range of big ints to walk: a
            # comprehension over ``range(first, first + 1)`` cost 5.5k instructions, this 1.2k
            _last = first
            _last_ms = first >> 80
            return [first.to_bytes(16, "big")]
        if (first & _RAND_B_MASK) + n - 1 <= _RAND_B_MASK:
            # PERF(wire): no carry inside the block, so the ids are consecutive integers.
            values: range | list[int] = range(first, first + n)
            _last = first + n - 1
        else:
            values = []
            value = first
            for _ in range(n):
                values.append(value)
                nxt = value + 1
                value = nxt if nxt & _RAND_B_MASK else _after(value)
            _last = values[-1]
        _last_ms = _last >> 80
    if n >= _UUID_BULK and isinstance(values, range):
        return _consecutive_ids(first, n)
    return [value.to_bytes(16, "big") for value in values]


_U64 = (1 << 64) - 1


def _consecutive_ids(first: int, n: int) -> list[bytes]:
    """The ids ``first`` .. ``first + n - 1`` (no carry out of their low 64 bits).

    PERF(wire): numpy writes the two big-endian halves of every id and cuts them into bytes:
    ``int.to_bytes`` was 1.5k instructions an id (a 100-item push: 155k), this about 0.2k."""
    np = _numpy_text()[0]
    out = np.empty(n, _id_halves())
    out["hi"] = first >> 64
    out["lo"] = np.arange(first & _U64, (first & _U64) + n, dtype=np.uint64)
    return out.view("V16").tolist()  # type: ignore[no-any-return]


def is_uuid7(raw: bytes | bytearray | memoryview) -> bool:
    """Whether ``raw`` is 16 bytes with the version 7 and variant 10 marks."""
    return len(raw) == 16 and raw[6] >> 4 == 7 and raw[8] >> 6 == 0b10


def uuid7_unix_ms(raw: bytes | bytearray | memoryview) -> int:
    """The mint time of a UUIDv7 in Unix milliseconds."""
    return int.from_bytes(raw[:6], "big")


def uuid_text(raw: bytes | bytearray | memoryview) -> str:
    """16 bytes as lowercase hyphenated text (docs/api.md §1.3)."""
    # PERF(wire): hex + slices is about 5x faster than str(uuid.UUID(bytes=raw)).
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid_from_text(text: str, *, field: str = "id") -> bytes:
    """Hyphenated UUID text (any case) as 16 bytes; anything else is ``400 invalid_request``."""
    if len(text) != 36 or text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
        raise InvalidRequest(f"{field} is not a UUID", field=field)
    try:
        raw = bytes.fromhex(text[:8] + text[9:13] + text[14:18] + text[19:23] + text[24:])
    except ValueError:
        raise InvalidRequest(f"{field} is not a UUID", field=field) from None
    if len(raw) != 16:  # fromhex skips whitespace between pairs
        raise InvalidRequest(f"{field} is not a UUID", field=field)
    return raw


_UUID_GROUPS = struct.Struct("8s4s4s4s12s")  # an id's 32 hex digits as the text's groups
_UUID_BULK = 32  # ids from which numpy's fixed cost (about 60k instructions) pays


@functools.cache
def _numpy_text() -> tuple[Any, Any, Any]:
    """numpy, and the dtypes of an id's 32 hex digits and of its text as the same five
    groups (the text's between its hyphens), imported on first use: the supervisor must not
    load numpy before the preload sets OPENBLAS_NUM_THREADS (processes/preload.py)."""
    import numpy

    def groups(offsets: list[int], size: int) -> Any:
        return numpy.dtype({"names": ["a", "b", "c", "d", "e"],
                            "formats": ["S8", "S4", "S4", "S4", "S12"],
                            "offsets": offsets, "itemsize": size})

    return numpy, groups([0, 8, 12, 16, 20], 32), groups([0, 9, 14, 19, 24], 36)


@functools.cache
def _id_halves() -> Any:
    """numpy's dtype of an id as its two big-endian u64 halves."""
    return _numpy_text()[0].dtype([("hi", ">u8"), ("lo", ">u8")])


def uuid_texts(ids: bytes) -> list[bytes]:
    """Each 16 bytes of ``ids`` as uuid_text's text, ASCII-encoded.

    PERF(wire): C loops for a body's ids: hex digits of all at once, cut into the text's
    groups (struct) and joined; from _UUID_BULK ids numpy places the digits between the
    hyphens instead (callgrind, per id: 2.3k instructions cut and joined, 0.5-1k by numpy
    at 100-1,000 ids, 2.5k by uuid_text and encode, 8.3k formatting each group with %x)."""
    digits = ids.hex().encode()
    count = len(ids) // 16
    if count < _UUID_BULK:
        return list(map(b"-".join, _UUID_GROUPS.iter_unpack(digits)))
    np, hexes, texts = _numpy_text()
    text = bytearray(_HYPHENS * count)
    # PERF(wire): one structured copy moves every group of every id (98k -> 84k for 100)
    np.frombuffer(text, texts)[...] = np.frombuffer(digits, hexes)
    return np.frombuffer(text, "S36").tolist()  # type: ignore[no-any-return]


_HYPHENS = b"-" * 36
