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


# ------------------------------------------------ the JSON of a pop over many segments
_txns = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=10) | \
    st.sampled_from(['a"b', "back\\slash", "tab\there", "nul\x00", "ünïcødé", "😀", "\x7f"])
_payloads = st.sampled_from([b"", b'{"a":{"b":[1,{"c":null}]}}', b'"\\u00e9\\n"', b"[1,2]",
                             '{"k":"ünï😀"}'.encode(), b"3.5", b"true"])


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(st.lists(st.lists(st.tuples(
           _txns, _payloads, st.booleans(), st.none() | _names, st.booleans()),
           min_size=1, max_size=5), min_size=1, max_size=3), min_size=1, max_size=3),
       plain_only=st.booleans(), zstd=st.booleans(), lease=st.none() | st.just("0191-lease"),
       gap=st.booleans(), data=st.data())
def test_json_messages_of_mixed_chunks_equal_the_dict_form(
        segments: list[list[list[tuple[str, bytes, bool, str | None, bool]]]],
        plain_only: bool, zstd: bool, lease: str | None, gap: bool,
        data: st.DataObject) -> None:
    """Chunks of plain frames (read by ``plain_columns``) next to chunks with traced,
    producer or encrypted frames (read by ``frame_rows``), over segments of their own times,
    one segment possibly retained away: the answer is byte for byte, and parsed, the dict
    form of each message."""
    cipher = PayloadCipher(bytes(range(32)).hex())
    stored, base, offset = [], 10, 10
    for s, chunks in enumerate(segments):
        blob = []
        for chunk in chunks:
            frames = b"".join(
                pack_frame((offset + i).to_bytes(16, "big"), txn.encode(),
                           cipher.encrypt(payload) if enc and not plain_only else payload,
                           trace_id=(offset + i).to_bytes(16, "little")
                           if traced and not plain_only else None,
                           producer_sub=None if plain_only else sub,
                           encrypted=enc and not plain_only)
                for i, (txn, payload, traced, sub, enc) in enumerate(chunk))
            blob.append((pack_chunk_zstd if zstd else pack_chunk_raw)(frames, len(chunk)))
            offset += len(chunk)
        if not (gap and s == 1):
            stored.append((base, datetime(2026, 11, 30, 12, s, tzinfo=UTC), b"".join(blob)))
        base = offset
    start = data.draw(st.integers(10, offset - 1))
    end = data.draw(st.integers(start, offset - 1))
    claim = Claim("q\u00e9", 7, "p/1", start, end, 3, None, False, stored)
    hashes: list[bytes] = []
    got = json_messages(claim, lease, "g", cipher, 1 << 20, hashes)
    want = list(unpack_messages(claim, cipher, 1 << 20))
    dicts = [_message_dict(m, lease, "g") for m in want]
    assert got == b",".join(map(orjson.dumps, dicts))
    assert orjson.loads(b"[%s]" % got) == orjson.loads(orjson.dumps(dicts))
    assert hashes == [m.hash for m in want]


@pytest.mark.parametrize("counted", [2, 4])
def test_a_chunk_holding_other_than_its_head_counts_is_read_chunk_by_chunk(counted: int
                                                                          ) -> None:
    """A claim's plain chunks are read as one run only while each (but the last) holds what
    its head counts: one holding more or fewer frames answers what reading each chunk alone
    does (its offsets counted from its head), as ``unpack_messages`` reads them."""
    def frames(offsets: range) -> bytes:
        return b"".join(pack_frame(o.to_bytes(16, "big"), f"t{o}".encode(), b"%d" % o)
                        for o in offsets)
    blob = pack_chunk_raw(frames(range(1, 4)), counted) + pack_chunk_raw(frames(range(4, 6)), 2)
    claim = Claim("q", 7, "p", 1, counted + 2, 1, None, False, [(1, T0, blob)])
    hashes: list[bytes] = []
    got = json_messages(claim, None, "g", None, 1 << 20, hashes)
    want = list(unpack_messages(claim, None, 1 << 20))
    assert got == b",".join(orjson.dumps(_message_dict(m, None, "g")) for m in want)
    assert hashes == [m.hash for m in want]
