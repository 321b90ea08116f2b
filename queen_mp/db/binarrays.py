"""Array parameters built in PostgreSQL's binary form (``array_recv``), for the shard's
statements that send a few arrays a call (the push bundle, fused acks).

PERF(queen): psycopg's list dumpers run Python per array (a dimension scan, the element
dumper's lookup) and per element; built here with a few ``struct`` calls an array, the push
bundle's seven arrays of 18 segments cost 26k instructions a message less (callgrind). A
connection sends them once ``register_arrays`` ran on it; the statement casts each
placeholder (``%b::text[]``), which types the parameter.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = ["Array", "bytea_array", "bytea_data", "int4_array", "int4_data", "int8_array",
           "int8_data", "int8_values", "register_arrays", "text_array", "text_data", "uuid_array",
           "uuid_data"]

# array_recv's form: ndim, has-nulls flag, element type, then (size, lower bound) per dimension;
# each element is its length and its bytes (big-endian integers, UTF-8 text, uuid's 16 bytes).
_HEAD = struct.Struct(">iiIii")
_LEN = struct.Struct(">i")
_INT4, _INT8, _TEXT, _BYTEA, _UUID = 23, 20, 25, 17, 2950  # element type oids
def _length_words(size: int) -> array[int]:
    """An element of ``size`` bytes as 4-byte words: its length word (big-endian), then 0s."""
    words = array("i")
    words.frombytes(_LEN.pack(size) + bytes(size))
    return words


_LENGTH_WORDS = {4: _length_words(4), 8: _length_words(8)}
_VALUES: dict[tuple[str, int], struct.Struct] = {}  # (element code, length) -> its layout
_CACHED_SIZES = 256
_INT8_ELEMENTS: dict[int, struct.Struct] = {}  # element count -> layout (int8_values)
_TUPLE_NEW = tuple.__new__


class Array(NamedTuple):
    """One array parameter already in its binary form, sent as is.

    PERF(queen): a NamedTuple made in C (``_array``): seven of them a push bundle, and a
    class with an ``__init__`` ran a Python frame for each."""

    data: bytes


def _array(data: bytes) -> Array:
    return _TUPLE_NEW(Array, (data,))  # type: ignore[no-any-return]


class _ArrayDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Array) -> bytes:
        return obj.data


def _varlen(oid: int, items: Sequence[bytes]) -> bytes:
    parts = [_HEAD.pack(1, 0, oid, len(items), 1)]
    pack = _LEN.pack
    for item in items:
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def _fixed(oid: int, code: str, size: int, values: Sequence[int]) -> bytes:
    """A one-dimensional array of ``size``-byte integers (``code``: struct's "i" or "q").

    PERF(queen): the values packed big-endian by one ``struct`` call, set between their
    length words (a pattern repeated) as 4-byte words by extended slices: a fixed number of C
    calls an array. Packed with their length words by one format (two arguments an element,
    chained), 101 int4 took 94k instructions and 101 int8 100k; so 26k and 44k, and 10 of
    either 17k against 10k and 14k (callgrind)."""
    n = len(values)
    st = _VALUES.get((code, n))
    if st is None:
        st = struct.Struct(f">{n}{code}")
        if n <= _CACHED_SIZES:
            _VALUES[(code, n)] = st
    words = array("i")
    words.frombytes(st.pack(*values))
    out = _LENGTH_WORDS[size] * n
    if size == 4:
        out[1::2] = words
    else:  # each value two words
        out[1::3] = words[::2]
        out[2::3] = words[1::2]
    return b"".join((_HEAD.pack(1, 0, oid, n, 1), out))


def text_data(items: Sequence[str]) -> bytes:
    return _varlen(_TEXT, [t.encode() for t in items])


# PERF(queen): the push bundle sends the bytes as they are (queen_mp/db/prepared.py), without
# an ``Array`` around each: partials of the builders, no Python frame of their own
bytea_data: Callable[[Sequence[bytes]], bytes] = partial(_varlen, _BYTEA)
uuid_data: Callable[[Sequence[bytes]], bytes] = partial(_varlen, _UUID)  # 16 bytes each
int4_data: Callable[[Sequence[int]], bytes] = partial(_fixed, _INT4, "i", 4)
int8_data: Callable[[Sequence[int]], bytes] = partial(_fixed, _INT8, "q", 8)


def text_array(items: Sequence[str]) -> Array:
    return _array(text_data(items))


def bytea_array(items: Sequence[bytes]) -> Array:
    return _array(bytea_data(items))


def uuid_array(items: Sequence[bytes]) -> Array:
    """Each element a uuid's 16 bytes."""
    return _array(uuid_data(items))


def int4_array(values: Sequence[int]) -> Array:
    return _array(int4_data(values))


def int8_array(values: Sequence[int]) -> Array:
    return _array(int8_data(values))


def int8_values(data: bytes) -> tuple[int, ...]:
    """The elements of a one-dimensional int8[] without NULLs, in ``array_send``'s form (a
    result asked in binary); ``()`` for an empty array. Raises ValueError on anything else."""
    if len(data) < 12:
        raise ValueError(f"not an int8[]: {data!r}")
    ndim, _, oid = struct.unpack_from(">iiI", data)
    if ndim == 0 and oid == _INT8:
        return ()
    if ndim != 1 or oid != _INT8:
        raise ValueError(f"not a one-dimensional int8[] (ndim {ndim}, element oid {oid})")
    n = struct.unpack_from(">i", data, 12)[0]
    st = _INT8_ELEMENTS.get(n)
    if st is None:
        # PERF(queen): the length words are skipped (``4x``), not made into ints, and checked
        # as byte strings: a third of the instructions of unpacking both
        st = struct.Struct(">" + "4xq" * n)
        if n <= _CACHED_SIZES:
            _INT8_ELEMENTS[n] = st
    # a NULL element (length -1, no bytes) or another length than 8 fails one of these
    if (len(data) != 20 + st.size or data[20::12] != data[21::12] or data[21::12] != data[22::12]
            or data[22::12] != bytes(n) or data[23::12] != b"\x08" * n):
        raise ValueError(f"not an int8[] of {n} elements without NULLs ({len(data)} bytes)")
    return st.unpack_from(data, 20)


def register_arrays(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Let ``conn`` send ``Array`` parameters."""
    conn.adapters.register_dumper(Array, _ArrayDumper)
