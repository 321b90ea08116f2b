"""What a pop hands to its caller: claims and messages built from the stored segments.

The claims of ``log_pop_v1`` (``queen_mp.db.pop_procs.Claim``, decoded there) carry their
covering segments as stored (chunks of frames). JSON answers unpack the frames of the claimed
offsets and splice each payload into ``data`` verbatim (``orjson.Fragment``: a stored payload
is already JSON text); ``QPF1`` answers (docs/api.md 3.7) forward every chunk byte for byte as
one record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from queen_mp.crypto import PayloadCipher
from queen_mp.db.pop_procs import Claim
from queen_mp.wire.frames import FLAG_ENCRYPTED, decode_chunk, iter_chunks, iter_frames
from queen_mp.wire.hashing import txn_hash_bytes
from queen_mp.wire.ids import uuid_text
from queen_mp.wire.times import iso_ms

__all__ = [
    "Claim",
    "Delivered",
    "Undeliverable",
    "encode_qpf1",
    "message_json",
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


def unpack_messages(claim: Claim, cipher: PayloadCipher | None, max_chunk: int, *,
                    decrypt: bool = True) -> Iterator[Delivered]:
    """The frames of the claimed offsets, in offset order (records may overhang the claim).

    ``decrypt=False`` keeps encrypted payloads as stored (a DLQ snapshot)."""
    for base, created, blob in claim.segments:
        offset = base
        for chunk in iter_chunks(blob):
            if offset + chunk.count <= claim.start or offset > claim.end:
                offset += chunk.count
                continue
            frames = decode_chunk(chunk.codec, chunk.data, max_size=max_chunk)
            before = max(0, claim.start - offset)
            offset += before
            for frame in iter_frames(frames, skip=before):
                if offset > claim.end:
                    break
                payload = bytes(frame.payload)
                encrypted = bool(frame.flags & FLAG_ENCRYPTED)
                if encrypted and decrypt:
                    if cipher is None:
                        raise Undeliverable(
                            f"message at offset {offset} of partition {claim.partition_id}"
                            " is encrypted and no QUEEN_ENCRYPTION_KEY is set")
                    try:
                        payload = cipher.decrypt(payload)
                    except Exception as ex:
                        raise Undeliverable(
                            f"message at offset {offset} of partition "
                            f"{claim.partition_id} does not decrypt: {ex}") from ex
                    encrypted = False
                yield Delivered(claim, offset, frame.message_id, frame.transaction_id,
                                frame.trace_id, frame.producer_sub, payload, created,
                                txn_hash_bytes(frame.transaction_id_bytes),
                                encrypted)
                offset += 1


def message_json(m: Delivered, lease_id: str | None, group: str) -> dict[str, Any]:
    claim = m.claim
    return {
        "id": uuid_text(m.message_id),
        "transactionId": m.transaction_id,
        "traceId": uuid_text(m.trace_id) if m.trace_id else None,
        "data": orjson.Fragment(m.payload) if m.payload else None,
        "producerSub": m.producer_sub,
        "createdAt": iso_ms(m.created_at),
        "queue": claim.queue,
        "partitionId": str(claim.partition_id),
        "partition": claim.partition,
        "offset": m.offset,
        "leaseId": lease_id,
        "consumerGroup": group,
        "deliveryAttempt": claim.attempt,
    }


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
