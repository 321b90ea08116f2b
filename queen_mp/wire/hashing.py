"""Dedup and ack identity: xxh3_128 of the transactionId (docs/api.md §1.3, life-of-a-push §3).

The broker, the SQL procedures and upstream all compare these 16 bytes, so the byte order is
part of the contract: big-endian, the canonical form xxhash's ``*_digest`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import xxhash

__all__ = ["hash_blob", "hash_hex", "hash_prefixes", "txn_hash", "txn_hash_bytes", "txn_hashes"]

_digest = xxhash.xxh3_128_digest


def txn_hash(transaction_id: str) -> bytes:
    """The 16-byte identity of a transactionId."""
    return _digest(transaction_id.encode("utf-8"))


def txn_hashes(transaction_ids: Iterable[str]) -> list[bytes]:
    """``txn_hash`` of each transactionId, in order.

    PERF(wire): map over the C encode and digest, no interpreter call per id (an ack batch
    hashes every item it forwards to the ack registry)."""
    return list(map(_digest, map(str.encode, transaction_ids)))


#: As txn_hash, for a transactionId still in its UTF-8 wire form (no decode/encode): the C
#: digest itself. PERF(wire): a pop hashes every message it delivers (the lease grant); a
#: Python function around the digest cost a call each.
txn_hash_bytes: Callable[[bytes | bytearray | memoryview], bytes] = _digest


def hash_blob(transaction_ids: Iterable[bytes | bytearray | memoryview]) -> bytes:
    """The hash blob of a segment: one 16-byte hash per frame, in frame order."""
    # PERF(wire): map over the C digest keeps the per-frame cost out of the interpreter loop.
    return b"".join(map(_digest, transaction_ids))


_PREFIX_FORMATS = {8: "Q", 4: "I"}  # prefix width in bytes -> memoryview format


def hash_prefixes(blob: bytes, width: int = 8) -> list[int]:
    """The first ``width`` (8 or 4) bytes of each 16-byte hash of a blob as ints, in native
    byte order (for comparisons inside one process), in one C-level pass: distinct prefixes
    prove distinct hashes, a shared one only says "look closer"."""
    return memoryview(blob).cast(_PREFIX_FORMATS[width])[::16 // width].tolist()


def hash_hex(digest: bytes | bytearray | memoryview) -> str:
    """A hash as 32 lowercase hex digits, for logs and admin answers."""
    return bytes(digest).hex()
