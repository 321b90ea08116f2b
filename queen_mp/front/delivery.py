"""What a pop hands to its caller: claims and messages built from the stored segments.

The claims of ``log_pop_v1`` (``queen_mp.db.pop_procs.Claim``, decoded there) carry their
covering segments as stored (chunks of frames). JSON answers render each message of the
claimed offsets straight from its frame into the JSON object docs/api.md 2.2 shows, with the
payload spliced into ``data`` verbatim (a stored payload is already JSON text); ``QPF1``
answers (docs/api.md 3.7) forward every chunk byte for byte as one record.
"""

from __future__ import annotations

import struct
from binascii import hexlify
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

import orjson

from queen_mp.crypto import PayloadCipher
from queen_mp.db.pop_procs import Claim
from queen_mp.wire.frames import (
    FLAG_ENCRYPTED,
    decode_chunk,
    frame_rows,
    iter_chunks,
    iter_frames,
)
from queen_mp.wire.hashing import txn_hash_bytes
from queen_mp.wire.times import iso_ms

__all__ = [
    "Claim",
    "Delivered",
    "Undeliverable",
    "encode_qpf1",
    "json_messages",
    "unpack_messages",
]

QPF1_MAGIC = b"QPF1"
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_CLAIM_SPAN = struct.Struct("<QQII")
_RECORD_HEAD = struct.Struct("<Qq")


class Undeliverable(Exception):
    """A stored segment cannot be decoded or decrypted: the message cannot be rendered."""


# PERF(wire): one per message; a frozen dataclass __init__ costs 6x a plain one.
@dataclass(slots=True)
class Delivered:
    """One unpacked message; ``hash`` is its xxh3_128 identity (the ack registry's key)."""

    claim: Claim
    offset: int
    message_id: bytes
    transaction_id: str
    trace_id: bytes | None
    producer_sub: str | None
    payload: bytes
    created_at: datetime
    hash: bytes
    encrypted: bool  # payload is still the stored ciphertext (unpacked with decrypt=False)


def _claimed_chunks(claim: Claim, max_chunk: int
                    ) -> Iterator[tuple[int, datetime, bytes | bytearray | memoryview, int]]:
    """Each decoded chunk that holds claimed offsets: (offset of its first frame taken, its
    segment's time, its frames, how many frames before that one to step over). The caller
    stops taking frames past ``claim.end``."""
    for base, created, blob in claim.segments:
        offset = base
        for chunk in iter_chunks(blob):
            if offset + chunk.count <= claim.start or offset > claim.end:
                offset += chunk.count
                continue
            before = max(0, claim.start - offset)
            yield (offset + before, created,
                   decode_chunk(chunk.codec, chunk.data, max_size=max_chunk), before)
            offset += chunk.count


def _plain_payload(claim: Claim, offset: int, flags: int, payload: memoryview,
                   cipher: PayloadCipher | None) -> bytes:
    """A frame's payload, decrypted when the frame (its ``flags``) is encrypted."""
    if not flags & FLAG_ENCRYPTED:
        return bytes(payload)
    if cipher is None:
        raise Undeliverable(
            f"message at offset {offset} of partition {claim.partition_id}"
            " is encrypted and this broker has no key (no QUEEN_ENCRYPTION_KEY nor key file)")
    try:
        return cipher.decrypt(bytes(payload))
    except Exception as ex:
        raise Undeliverable(
            f"message at offset {offset} of partition "
            f"{claim.partition_id} does not decrypt: {ex}") from ex


def unpack_messages(claim: Claim, cipher: PayloadCipher | None, max_chunk: int, *,
                    decrypt: bool = True) -> Iterator[Delivered]:
    """The frames of the claimed offsets, in offset order (records may overhang the claim).

    ``decrypt=False`` keeps encrypted payloads as stored (a DLQ snapshot)."""
    for offset, created, frames, before in _claimed_chunks(claim, max_chunk):
        for frame in iter_frames(frames, skip=before):
            if offset > claim.end:
                break
            encrypted = bool(frame.flags & FLAG_ENCRYPTED)
            if decrypt:
                payload = _plain_payload(claim, offset, frame.flags, frame.payload, cipher)
                encrypted = False
            else:
                payload = bytes(frame.payload)
            yield Delivered(claim, offset, frame.message_id, frame.transaction_id,
                            frame.trace_id, frame.producer_sub, payload, created,
                            txn_hash_bytes(frame.transaction_id_bytes),
                            encrypted)
            offset += 1


def _message_parts(claim: Claim, lease_id: str | None, group: str) -> list[bytes]:
    """A message object of the claim as its constant pieces, each followed by the slot of a
    variable part: the id's hex, transactionId (its JSON text without the quotes), traceId,
    data, producerSub, createdAt (JSON values) and offset; the last piece ends the object
    and holds the "," that joins it to the next. Every constant is orjson's own rendering
    of the value the dict form held."""
    dumps = orjson.dumps
    return [b'{"id":"', b"", b'","transactionId":"', b"", b'","traceId":', b"", b',"data":',
            b"", b',"producerSub":', b"", b',"createdAt":', b"",
            b"".join((b',"queue":', dumps(claim.queue), b',"partitionId":',
                      dumps(str(claim.partition_id)), b',"partition":', dumps(claim.partition),
                      b',"offset":')),
            b"",
            b"".join((b',"leaseId":', dumps(lease_id), b',"consumerGroup":', dumps(group),
                      b',"deliveryAttempt":', dumps(claim.attempt), b"},"))]


# where each of a UUID's 32 hex digits goes in its 36-character text, and the "," after it
_UUID_AT = [k + (k >= 8) + (k >= 12) + (k >= 16) + (k >= 20) for k in range(32)]


def _uuid_texts(raws: list[bytes]) -> list[bytes]:
    """Each 16-byte id's UUID text (without quotes), all in one pass of slice assignments."""
    n = len(raws)
    hexed = hexlify(b"".join(raws))
    out = bytearray(b"-" * 36 + b",") * n
    for k, at in enumerate(_UUID_AT):
        out[at::37] = hexed[k::32]
    return bytes(out[:-1]).split(b",")


def _uuid_json(raw: bytes | None) -> bytes:
    if not raw:
        return b"null"
    h = hexlify(raw)
    return b'"%s-%s-%s-%s-%s"' % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def _sub_json(sub: str | None) -> bytes:
    return b"null" if sub is None else orjson.dumps(sub)


def json_messages(claim: Claim, lease_id: str | None, group: str, cipher: PayloadCipher | None,
                  max_chunk: int, hashes: list[bytes]) -> bytes:
    """The JSON objects of the claimed messages, in offset order, joined by ",": byte for
    byte what orjson makes of each docs/api.md 2.2 message (id, transactionId, traceId, data,
    producerSub, createdAt, queue, partitionId, partition, offset, leaseId, consumerGroup,
    deliveryAttempt); appends each message's transaction hash to ``hashes`` (the lease grant).

    PERF(pop): by columns: the frames' fields gathered in C (islice over ``frame_rows``,
    ``zip``), each column rendered by whole-list operations (every id's UUID text by 32 slice
    assignments, every transactionId by one ``orjson.dumps``, the offsets by another), the
    pieces laid out by slice assignments and joined once; no message record, no dict and no
    template fill per message. The transactionIds' dumped list splits at ``","`` when it holds
    no backslash (every quote is then a string's own); otherwise each is dumped alone.
    """
    rows: list[tuple[Any, ...]] = []
    stamps: list[bytes] = []
    offsets: list[int] = []
    stamped: datetime | None = None
    stamp = b""
    for offset, created, frames, before in _claimed_chunks(claim, max_chunk):
        if created != stamped:  # PERF(pop): one rendering per distinct segment time
            stamped, stamp = created, orjson.dumps(iso_ms(created))
        had = len(rows)
        rows.extend(islice(frame_rows(frames, skip=before), max(0, claim.end - offset + 1)))
        stamps += [stamp] * (len(rows) - had)
        offsets += range(offset, offset + len(rows) - had)
    n = len(rows)
    if not n:
        return b""
    mids, traces, txns, raws, subs, flags, payloads = map(list, zip(*rows, strict=True))
    hashes.extend(map(txn_hash_bytes, raws))
    if flags.count(0) != n:
        for i, f in enumerate(flags):
            if f:
                payloads[i] = _plain_payload(claim, offsets[i], f, payloads[i], cipher)
    if min(map(len, payloads)) == 0:
        payloads = [p if len(p) else b"null" for p in payloads]
    dumped = orjson.dumps(txns)
    template = _message_parts(claim, lease_id, group)
    k = len(template)
    parts = template * n
    parts[1::k] = _uuid_texts(mids)
    parts[3::k] = (dumped[2:-2].split(b'","') if b"\\" not in dumped
                   else [orjson.dumps(t)[1:-1] for t in txns])
    parts[5::k] = ([b"null"] * n if traces.count(None) == n
                   else list(map(_uuid_json, traces)))
    parts[7::k] = payloads
    parts[9::k] = ([b"null"] * n if subs.count(None) == n
                   else list(map(_sub_json, subs)))
    parts[11::k] = stamps
    parts[13::k] = orjson.dumps(offsets)[1:-1].split(b",")
    parts[-1] = parts[-1][:-1]
    return b"".join(parts)


def _str16(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _U16.pack(len(raw)) + raw


def encode_qpf1(claims: list[Claim], *, queue: str, lease_id: str | None, group: str,
                meta: dict[str, Any]) -> bytes:
    """docs/api.md 3.7, version 1: each stored chunk is one record, forwarded untouched."""
    meta_raw = orjson.dumps(meta)
    out = [QPF1_MAGIC, b"\x01", _U32.pack(len(meta_raw)), meta_raw, _str16(queue),
           _str16(lease_id or ""), _str16(group), _U32.pack(len(claims))]
    for claim in claims:
        records: list[bytes] = []
        for base, created, blob in claim.segments:
            created_us = int(created.timestamp() * 1_000_000)
            offset = base
            for chunk in iter_chunks(blob):
                if offset + chunk.count > claim.start and offset <= claim.end:
                    records.append(_RECORD_HEAD.pack(offset, created_us) + bytes(chunk.raw))
                offset += chunk.count
        out.append(_U64.pack(claim.partition_id))
        out.append(_str16(claim.partition))
        out.append(_CLAIM_SPAN.pack(claim.start, claim.end, claim.attempt, len(records)))
        out.extend(records)
    return b"".join(out)
