"""What a pop hands to its caller: claims and messages built from the stored segments.

The claims of ``log_pop_v3`` (``queen_mp.db.pop_procs.Claim``, decoded there) carry their
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
    plain_columns,
    single_chunk,
)
from queen_mp.wire.hashing import txn_hash_bytes
from queen_mp.wire.ids import uuid_texts
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
#: the bytes orjson writes escaped inside a JSON string
_JSON_ESCAPED = bytes(range(32)) + b'"\\'


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


#: a decoded chunk that holds claimed offsets: the offset of its first frame taken, its
#: segment's time, its frames, how many frames before that one to step over, and how many
#: frames its head counts from that one on
_Taken = tuple[int, datetime, bytes | bytearray | memoryview, int, int]


def _claimed_chunks(claim: Claim, max_chunk: int) -> list[_Taken]:
    """Each decoded chunk that holds claimed offsets (``_Taken``). The caller stops taking
    frames past ``claim.end``.

    PERF(pop): a segment of one zstd chunk (most: one per push a pop covers) is read by
    ``single_chunk``, the others chunk by chunk."""
    taken: list[_Taken] = []
    for base, created, blob in claim.segments:
        one = single_chunk(blob, max_chunk) if isinstance(blob, bytes) else None
        if one is not None:
            count = one[0]
            if base + count > claim.start and base <= claim.end:
                before = claim.start - base if claim.start > base else 0
                taken.append((base + before, created, one[1], before, count - before))
            continue
        offset = base
        for chunk in iter_chunks(blob):
            if offset + chunk.count <= claim.start or offset > claim.end:
                offset += chunk.count
                continue
            before = max(0, claim.start - offset)
            taken.append((offset + before, created,
                          decode_chunk(chunk.codec, chunk.data, max_size=max_chunk), before,
                          chunk.count - before))
            offset += chunk.count
    return taken


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
    for offset, created, frames, before, _ in _claimed_chunks(claim, max_chunk):
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


def _layout(pieces: list[bytes | list[bytes]], n: int) -> bytes:
    """``n`` objects laid out from ``pieces`` and joined once: a constant (bytes) is the same
    in every object, a column (a list of ``n``) gives each object its own; the last constant
    holds the "," that joins an object to the next. PERF(pop): adjacent constants are
    merged, so a column that is one value for all (traceId and producerSub null, one
    segment's createdAt), passed as a constant, costs no slot per object."""
    consts = [b""]
    columns: list[list[bytes]] = []
    for piece in pieces:
        if isinstance(piece, bytes):
            consts[-1] += piece
        else:
            columns.append(piece)
            consts.append(b"")
    template = [b""] * (2 * len(consts) - 1)
    template[::2] = consts
    k = len(template)
    parts = template * n
    for at, column in enumerate(columns):
        parts[2 * at + 1 :: k] = column
    parts[-1] = parts[-1][:-1]
    return b"".join(parts)


def _uuid_json(raw: bytes | None) -> bytes:
    if not raw:
        return b"null"
    h = hexlify(raw)
    return b'"%s-%s-%s-%s-%s"' % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def _sub_json(sub: str | None) -> bytes:
    return b"null" if sub is None else orjson.dumps(sub)


def _plain_run(claim: Claim, taken: list[_Taken]
               ) -> tuple[list[bytes], list[bytes], list[bytes], list[bytes]] | None:
    """The message ids, transactionIds, payloads and createdAt texts of ``taken`` (two chunks
    or more), when its chunks hold consecutive offsets, every frame is plain and every chunk
    but the last holds as many frames as its head counts; None otherwise (``json_messages``
    then reads chunk by chunk).

    PERF(pop): two ``plain_columns`` calls, over every chunk but the last joined and over the
    last (which the claim's end may cut), for a claim's chunks: a 100-message pop of
    1,000-item pushes over 100 partitions reads 10 chunks of 10, and a call per chunk, with
    its columns and their texts added chunk by chunk, cost bench.hotpath pop100s10 1.71M
    instructions against 1.64M (callgrind)."""
    expect = taken[0][0]
    for i, (offset, _, _, before, count) in enumerate(taken):
        if offset != expect or (i and before):
            return None
        expect = offset + count
    *head, last = taken
    counted = sum(t[4] for t in head)
    # one frame more than the heads count: a chunk holding more than its head says shows as
    # one too many, one holding fewer as one too few
    got = plain_columns(b"".join([t[2] for t in head]), skip=head[0][3], take=counted + 1)
    if got is None or len(got[0]) != counted:
        return None
    end = plain_columns(last[2] if isinstance(last[2], bytes) else bytes(last[2]),
                        skip=last[3], take=max(0, claim.end - last[0] + 1))
    if end is None:
        return None
    stamps: list[bytes] = []
    stamped: datetime | None = None
    stamp = b""
    for i, (_, created, _, _, count) in enumerate(taken):
        if created is not stamped and created != stamped:
            # PERF(pop): one rendering per distinct segment time
            stamped, stamp = created, orjson.dumps(iso_ms(created))
        stamps += [stamp] * (count if i < len(head) else len(end[0]))
    return got[0] + end[0], got[1] + end[1], got[2] + end[2], stamps


def json_messages(claim: Claim, lease_id: str | None, group: str, cipher: PayloadCipher | None,
                  max_chunk: int, hashes: list[bytes], ids: list[bytes] | None = None) -> bytes:
    """The JSON objects of the claimed messages, in offset order, joined by ",": byte for
    byte what orjson makes of each docs/api.md 2.2 message (id, transactionId, traceId, data,
    producerSub, createdAt, queue, partitionId, partition, offset, leaseId, consumerGroup,
    deliveryAttempt); appends each message's transaction hash to ``hashes`` (the lease grant)
    and, when ``ids`` is given, its transactionId's UTF-8 bytes to ``ids`` (``Acker.granted``).

    PERF(pop): by columns: a chunk of plain frames gives its fields as columns
    (``plain_columns``), any other chunk by ``frame_rows`` transposed in C; each column is
    rendered by whole-list operations (every id's UUID text by ``uuid_texts``, the
    offsets by one ``orjson.dumps``), the pieces laid out by slice assignments and joined
    once; no message record, no dict and no template fill per message. A transactionId goes
    into the answer as its stored UTF-8 bytes when none holds a byte JSON escapes (orjson
    escapes only ``"``, ``\\`` and controls); otherwise each is dumped by orjson.
    """
    mids: list[bytes] = []
    raws: list[bytes | memoryview] = []
    payloads: list[bytes | memoryview] = []
    # NOTE(pop): per message only from the first chunk ``frame_rows`` reads (before it, every
    # message had none: no trace, no producer, no flag)
    traces: list[bytes | None] | None = None
    subs: list[str | None] = []
    flags: list[int] = []
    stamps: list[bytes] = []
    offsets: list[int] = []
    taken = _claimed_chunks(claim, max_chunk)
    run = _plain_run(claim, taken) if len(taken) > 1 else None  # one: read below alike
    if run is not None:  # every chunk read at once: none left to read one by one
        mids, raws, payloads, stamps = run  # type: ignore[assignment]  # (lists of bytes)
        offsets += range(taken[0][0], taken[0][0] + len(mids))
        taken = []
    stamped: datetime | None = None
    stamp = b""
    for offset, created, frames, before, _ in taken:
        if created is not stamped and created != stamped:
            # PERF(pop): one rendering per distinct segment time
            stamped, stamp = created, orjson.dumps(iso_ms(created))
        take = max(0, claim.end - offset + 1)
        plain = plain_columns(frames if isinstance(frames, bytes) else bytes(frames),
                              skip=before, take=take)
        if plain is not None:
            k = len(plain[0])
            mids += plain[0]
            raws += plain[1]
            payloads += plain[2]
            if traces is not None:
                traces += [None] * k
                subs += [None] * k
                flags += [0] * k
        else:
            rows = list(islice(frame_rows(frames, skip=before), take))
            k = len(rows)
            if not k:
                continue
            if traces is None:
                had = len(offsets)
                traces, subs, flags = [None] * had, [None] * had, [0] * had
            m, t, _, r, u, f, p = zip(*rows, strict=True)
            mids += m
            traces += t
            raws += r
            subs += u
            flags += f
            payloads += p
        stamps += [stamp] * k
        offsets += range(offset, offset + k)
    n = len(offsets)
    if not n:
        return b""
    hashes.extend(map(txn_hash_bytes, raws))
    if ids is not None:
        ids += raws
    if traces is None:
        traces_json: bytes | list[bytes] = b"null"
        subs_json: bytes | list[bytes] = b"null"
    else:
        if flags.count(0) != n:
            for i, f in enumerate(flags):
                if f:
                    payloads[i] = _plain_payload(claim, offsets[i], f, payloads[i], cipher)
        traces_json = (b"null" if traces.count(None) == n else list(map(_uuid_json, traces)))
        subs_json = b"null" if subs.count(None) == n else list(map(_sub_json, subs))
    if b"" in payloads:
        payloads = [p if len(p) else b"null" for p in payloads]
    dumps = orjson.dumps
    return _layout([
        b'{"id":"', uuid_texts(b"".join(mids)), b'","transactionId":"',
        raws if len(b"".join(raws).translate(None, _JSON_ESCAPED)) == sum(map(len, raws))
        else [dumps(str(r, "utf-8"))[1:-1] for r in raws],
        b'","traceId":', traces_json, b',"data":', payloads, b',"producerSub":', subs_json,
        b',"createdAt":', stamps[0] if stamps.count(stamps[0]) == n else stamps,
        b',"queue":', dumps(claim.queue), b',"partitionId":', dumps(str(claim.partition_id)),
        b',"partition":', dumps(claim.partition), b',"offset":',
        dumps(offsets)[1:-1].split(b","),
        b',"leaseId":', dumps(lease_id), b',"consumerGroup":', dumps(group),
        b',"deliveryAttempt":', dumps(claim.attempt), b"},"], n)


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
