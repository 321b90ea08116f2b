"""unpack_messages: a claim's offsets out of stored segments, whatever their chunking."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queen_mp.crypto import PayloadCipher
from queen_mp.front.delivery import (
    Claim,
    Delivered,
    Undeliverable,
    json_messages,
    unpack_messages,
)
from queen_mp.wire import pack_chunk_raw, pack_chunk_zstd, pack_frame, uuid_text
from queen_mp.wire.times import iso_ms

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def _segment(base: int, sizes: list[int], zstd: bool) -> tuple[int, datetime, bytes]:
    """Chunks of ``sizes`` frames; the frame at offset o has transactionId ``t<o>``."""
    chunks, offset = [], base
    for n in sizes:
        frames = b"".join(pack_frame(offset.to_bytes(16, "big"), f"t{offset}".encode(),
                                     b'{"o":%d}' % offset)
                          for offset in range(offset, offset + n))
        chunks.append(pack_chunk_zstd(frames, n) if zstd else pack_chunk_raw(frames, n))
        offset += n
    return base, T0, b"".join(chunks)


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=4), min_size=1,
                         max_size=3),
       zstd=st.booleans(), data=st.data())
def test_a_claim_gets_exactly_its_offsets_in_order(segments: list[list[int]], zstd: bool,
                                                   data: st.DataObject) -> None:
    stored, base = [], 1
    for sizes in segments:
        stored.append(_segment(base, sizes, zstd))
        base += sum(sizes)
    last = base - 1
    start = data.draw(st.integers(1, last))
    end = data.draw(st.integers(start, last))
    claim = Claim("q", 7, "p", start, end, 1, None, False, stored)
    got = list(unpack_messages(claim, None, 1 << 20))
    assert [m.offset for m in got] == list(range(start, end + 1))
    assert [m.transaction_id for m in got] == [f"t{o}" for o in range(start, end + 1)]
    assert [m.payload for m in got] == [b'{"o":%d}' % o for o in range(start, end + 1)]


# ------------------------------------------------------------------ the JSON of a pop
def _message_dict(m: Delivered, lease_id: str | None, group: str) -> dict[str, Any]:
    """The docs/api.md 2.2 message as a dict: the form json_messages must render exactly."""
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


_names = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(st.tuples(_names, st.sampled_from([b"", b'{"a":1}', b'"%s%d"', b"[1,2]"]),
                                 st.booleans(), st.none() | _names, st.booleans()),
                       min_size=1, max_size=8),
       queue=_names, partition=_names, lease=st.none() | st.just("0191-lease"),
       group=_names, attempt=st.integers(1, 1 << 40), zstd=st.booleans(), data=st.data())
def test_json_messages_render_what_orjson_makes_of_the_message(
        frames: list[tuple[str, bytes, bool, str | None, bool]], queue: str, partition: str,
        lease: str | None, group: str, attempt: int, zstd: bool, data: st.DataObject) -> None:
    cipher = PayloadCipher(bytes(range(32)).hex())
    raw = b"".join(
        pack_frame(i.to_bytes(16, "big"), txn.encode(), cipher.encrypt(payload) if enc
                   else payload, trace_id=(i + 99).to_bytes(16, "big") if traced else None,
                   producer_sub=sub, encrypted=enc)
        for i, (txn, payload, traced, sub, enc) in enumerate(frames))
    blob = (pack_chunk_zstd if zstd else pack_chunk_raw)(raw, len(frames))
    start = data.draw(st.integers(5, 4 + len(frames)))
    end = data.draw(st.integers(start, 4 + len(frames)))
    claim = Claim(queue, 7, partition, start, end, attempt, None, False, [(5, T0, blob)])
    hashes: list[bytes] = []
    got = json_messages(claim, lease, group, cipher, 1 << 20, hashes)
    want = list(unpack_messages(claim, cipher, 1 << 20))
    assert got == b",".join(orjson.dumps(_message_dict(m, lease, group)) for m in want)
    assert hashes == [m.hash for m in want]


def test_an_encrypted_message_without_a_key_is_undeliverable() -> None:
    cipher = PayloadCipher(bytes(range(32)).hex())
    frame = pack_frame(bytes(16), b"t", cipher.encrypt(b"{}"), encrypted=True)
    claim = Claim("q", 7, "p", 1, 1, 1, None, True, [(1, T0, pack_chunk_raw(frame, 1))])
    with pytest.raises(Undeliverable, match="no QUEEN_ENCRYPTION_KEY"):
        json_messages(claim, None, "g", None, 1 << 20, [])
