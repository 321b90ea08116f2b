"""Message frames, chunks and bounded zstd; read back by the published client's pop decoder."""

from __future__ import annotations

import json
import struct

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from queen.http import pop_frames as client_pop

from queen_mp.wire import (
    CODEC_RAW,
    CODEC_ZSTD,
    FLAG_ENCRYPTED,
    FLAG_PRODUCER,
    FLAG_TRACE,
    BadFrame,
    BodyTooLarge,
    NameTooLong,
    UnsupportedFlags,
    WireError,
    decode_chunk,
    decompress_bounded,
    frame_rows,
    iter_chunks,
    iter_frames,
    pack_chunk,
    pack_chunk_raw,
    pack_chunk_zstd,
    pack_frame,
    plain_columns,
    read_frames,
    single_chunk,
    uuid7,
    uuid7_many,
    uuid_text,
    zstd_compress,
)
from queen_mp.wire import frames as frames_mod


def test_public_names_are_exported() -> None:
    import queen_mp.wire as wire
    from queen_mp.wire import binary_push, errors, frames, hashing, ids, records

    assert sorted(wire.__all__) == sorted(set(wire.__all__))
    for name in wire.__all__:
        assert hasattr(wire, name), name
    for module in (binary_push, errors, frames, hashing, ids, records):
        missing = set(module.__all__) - set(wire.__all__)
        assert not missing, (module.__name__, missing)


MID = bytes.fromhex("0196f3a2c00070008000000000000a0a")
TRACE = bytes(range(16))


def test_pack_frame_layout_matches_the_spec() -> None:
    frame = pack_frame(MID, b"order-1", b'{"a":1}')
    body_len, flags = struct.unpack_from("<IB", frame)
    assert body_len == 1 + 16 + 2 + 7 + 7 == len(frame) - 4
    assert flags == 0
    assert frame[5:21] == MID
    assert frame[21:23] == struct.pack("<H", 7) and frame[23:30] == b"order-1"
    assert frame[30:] == b'{"a":1}'


def test_pack_frame_with_every_optional_field() -> None:
    frame = pack_frame(MID, b"t", b"", trace_id=TRACE, producer_sub="svc-é", encrypted=True)
    sub = "svc-é".encode()
    assert struct.unpack_from("<I", frame)[0] == 1 + 16 + 16 + 2 + 1 + 2 + len(sub) + 0
    assert frame[4] == FLAG_TRACE | FLAG_PRODUCER | FLAG_ENCRYPTED
    (parsed,) = iter_frames(frame)
    assert parsed.trace_id == TRACE
    assert parsed.producer_sub == "svc-é"
    assert parsed.transaction_id == "t"
    assert bytes(parsed.payload) == b""
    assert bytes(parsed.transaction_id_bytes) == b"t"
    assert bytes(parsed.raw) == frame and parsed.offset == 0


def test_pack_frame_refuses_what_no_reader_accepts() -> None:
    with pytest.raises(NameTooLong) as info:
        pack_frame(MID, b"x" * 1025, b"")
    assert info.value.limit == 1024 and info.value.field == "transactionId"
    pack_frame(MID, b"x" * 1024, b"")
    with pytest.raises(BadFrame):
        pack_frame(MID, b"", b"")
    with pytest.raises(ValueError):
        pack_frame(MID[:15], b"t", b"")
    with pytest.raises(ValueError):
        pack_frame(MID, b"t", b"", trace_id=b"short")


_frame_args = st.tuples(
    st.binary(min_size=16, max_size=16),
    st.text(min_size=1, max_size=40).map(str.encode).filter(lambda b: 0 < len(b) <= 1024),
    st.binary(max_size=200),
    st.one_of(st.none(), st.binary(min_size=16, max_size=16)),
    st.one_of(st.none(), st.text(max_size=20)),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(_frame_args, max_size=8))
def test_frames_round_trip(frames: list[tuple]) -> None:
    blob = b"".join(pack_frame(*args) for args in frames)
    parsed = read_frames(blob, len(frames), first_index=5)
    assert len(parsed) == len(frames)
    for frame, (mid, txn, payload, trace, sub, encrypted) in zip(parsed, frames, strict=True):
        assert frame.message_id == mid
        assert frame.trace_id == trace
        assert frame.transaction_id == txn.decode()
        assert bytes(frame.transaction_id_bytes) == txn
        assert frame.producer_sub == sub
        assert bool(frame.flags & FLAG_ENCRYPTED) is encrypted
        assert bytes(frame.payload) == payload
    assert b"".join(bytes(f.raw) for f in parsed) == blob
    assert [f.offset for f in parsed] == [f.offset for f in iter_frames(blob)]


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(_frame_args, max_size=8), skip=st.integers(0, 10))
def test_skipped_frames_are_stepped_over_to_the_same_frames(frames: list[tuple],
                                                            skip: int) -> None:
    blob = b"".join(pack_frame(*args) for args in frames)
    whole = list(iter_frames(blob))
    rest = list(iter_frames(blob, skip=skip))
    assert [(f.offset, bytes(f.raw)) for f in rest] == [(f.offset, bytes(f.raw))
                                                        for f in whole[skip:]]


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(_frame_args, max_size=8), skip=st.integers(0, 10))
def test_frame_rows_are_the_frames_fields(frames: list[tuple], skip: int) -> None:
    blob = b"".join(pack_frame(*args) for args in frames)
    rows = [(mid, trace, txn, bytes(raw), sub, flags, bytes(payload))
            for mid, trace, txn, raw, sub, flags, payload in frame_rows(blob, skip=skip)]
    assert rows == [(f.message_id, f.trace_id, f.transaction_id, bytes(f.transaction_id_bytes),
                     f.producer_sub, f.flags, bytes(f.payload))
                    for f in iter_frames(blob, skip=skip)]


def test_a_truncated_frame_is_bad_frame_when_skipped_too() -> None:
    frame = pack_frame(MID, b"txn", b"[1]", trace_id=TRACE, producer_sub="sub")
    whole = frame + frame
    for cut in range(len(frame) + 1, len(whole)):
        with pytest.raises(BadFrame):
            list(iter_frames(whole[:cut], skip=2))
    for cut in range(1, len(frame)):
        with pytest.raises(BadFrame):
            list(iter_frames(whole[:cut], skip=1))


def test_every_truncated_frame_is_bad_frame() -> None:
    frame = pack_frame(MID, b"txn", b"[1]", trace_id=TRACE, producer_sub="sub")
    for cut in range(1, len(frame)):
        with pytest.raises(BadFrame):
            list(iter_frames(frame[:cut]))
        with pytest.raises(BadFrame):
            read_frames(frame[:cut], 1)


def _raw_frame(flags: int, *fields: bytes, body_len: int | None = None) -> bytes:
    body = bytes([flags]) + b"".join(fields)
    return struct.pack("<I", len(body) if body_len is None else body_len) + body


def _txn(text: bytes) -> bytes:
    return struct.pack("<H", len(text)) + text


@pytest.mark.parametrize(
    ("blob", "error", "field"),
    [
        (_raw_frame(0, MID, _txn(b"t"), body_len=19), BadFrame, "body_len"),
        (_raw_frame(0, MID, _txn(b"t"), b"{}", body_len=99), BadFrame, "body_len"),
        (_raw_frame(0x08, MID, _txn(b"t")), UnsupportedFlags, "flags"),
        (_raw_frame(0x80, MID, _txn(b"t")), UnsupportedFlags, "flags"),
        (_raw_frame(0, MID, _txn(b""), b"{}"), BadFrame, "transactionId"),
        (_raw_frame(0, MID, _txn(b"x" * 1025)), NameTooLong, "transactionId"),
        (_raw_frame(0, MID, struct.pack("<H", 9), b"abc"), BadFrame, "transactionId"),
        (_raw_frame(0, MID, _txn(b"\xff\xfe")), BadFrame, "transactionId"),
        (_raw_frame(FLAG_TRACE, MID, b"\x00" * 3), BadFrame, "body_len"),
        (_raw_frame(FLAG_PRODUCER, MID, _txn(b"t")), BadFrame, "body_len"),
        (
            _raw_frame(FLAG_PRODUCER, MID, _txn(b"t"), struct.pack("<H", 4), b"ab"),
            BadFrame,
            "producerSub",
        ),
        (_raw_frame(FLAG_PRODUCER, MID, _txn(b"t"), _txn(b"\xc3")), BadFrame, "producerSub"),
        (b"\x01\x00", BadFrame, "body_len"),
    ],
)
def test_frame_field_errors(blob: bytes, error: type[WireError], field: str) -> None:
    with pytest.raises(error) as info:
        list(iter_frames(blob, first_index=3))
    assert info.value.field == field
    assert info.value.index == 3
    assert info.value.raw is not None
    good = pack_frame(MID, b"t", b"{}")
    with pytest.raises(error) as info:
        list(frame_rows(good + blob))  # after a frame it reads itself
    assert info.value.field == field
    assert info.value.index == 1


def test_read_frames_wants_exactly_count_frames() -> None:
    one = pack_frame(MID, b"a", b"1")
    read_frames(one * 2, 2)
    with pytest.raises(BadFrame, match="announced"):
        read_frames(one, 2)
    with pytest.raises(BadFrame, match="trailing"):
        read_frames(one * 2, 1)
    with pytest.raises(BadFrame):
        read_frames(one + b"\x00", 1)
    assert read_frames(b"", 0) == []


def test_frames_are_views_not_copies() -> None:
    blob = bytearray(pack_frame(MID, b"a", b"payload"))
    (frame,) = iter_frames(blob)
    assert frame.payload.obj is blob


# --- zstd ---------------------------------------------------------------------------------------


def test_decompress_bounded_accepts_a_sized_frame() -> None:
    data = b"hello " * 1000
    frame = zstd_compress(data)
    assert zstandard.frame_content_size(frame) == len(data)
    assert decompress_bounded(frame, len(data)) == data
    assert decompress_bounded(memoryview(frame), len(data), expected_size=len(data)) == data
    assert decompress_bounded(zstd_compress(b""), 0) == b""


def test_decompress_bounded_checks_the_header_before_decompressing() -> None:
    data = b"x" * 10_000
    with pytest.raises(BodyTooLarge) as info:
        decompress_bounded(zstd_compress(data), 9_999)
    assert info.value.limit == 9_999 and info.value.status == 413
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    with pytest.raises(BadFrame, match="content size"):
        decompress_bounded(unsized, 1 << 30)
    with pytest.raises(BadFrame, match="raw_len"):
        decompress_bounded(zstd_compress(data), 1 << 20, expected_size=1)


def test_decompress_bounded_rejects_a_lying_header() -> None:
    data = bytes(range(256)) * 8
    frame = bytearray(zstd_compress(data))
    # Single-segment frame with a 2-byte content size field (value - 256) after the descriptor.
    assert frame[4] & 0x20 and frame[4] >> 6 == 1
    frame[5:7] = struct.pack("<H", 1000 - 256)
    assert zstandard.frame_content_size(bytes(frame)) == 1000
    with pytest.raises(BadFrame):
        decompress_bounded(bytes(frame), 1 << 20)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x28\xb5\x2f",
        b"not zstd at all",
        b"\x28\xb5\x2f\xfd",
        zstd_compress(b"abc")[:-1],
        zstd_compress(b"abc") + b"\x00",
        zstd_compress(b"abc") + zstd_compress(b"abc"),
        struct.pack("<II", 0x184D2A50, 4) + b"skip",  # a skippable frame is no content
    ],
    ids=["empty", "short", "garbage", "magic-only", "truncated", "trailing", "two", "skippable"],
)
def test_decompress_bounded_bad_frames(frame: bytes) -> None:
    with pytest.raises(BadFrame):
        decompress_bounded(frame, 1 << 20)


# --- chunks ---------------------------------------------------------------------------------------


def _frames(n: int) -> tuple[list[bytes], bytes]:
    ids = uuid7_many(n)
    frames = b"".join(
        pack_frame(mid, f"txn-{i}".encode(), json.dumps({"i": i}).encode())
        for i, mid in enumerate(ids)
    )
    return ids, frames


def test_chunks_round_trip() -> None:
    ids, frames = _frames(5)
    blob = (
        pack_chunk_raw(frames, 5)
        + pack_chunk_zstd(frames, 5)
        + pack_chunk(CODEC_ZSTD, 5, zstd_compress(frames, 3))
    )
    chunks = list(iter_chunks(blob))
    assert [(c.count, c.codec) for c in chunks] == [(5, CODEC_RAW), (5, CODEC_ZSTD), (5, 1)]
    assert b"".join(bytes(c.raw) for c in chunks) == blob
    for chunk in chunks:
        data = decode_chunk(chunk.codec, chunk.data, max_size=1 << 20)
        assert bytes(data) == frames
        assert [f.message_id for f in read_frames(data, chunk.count)] == ids
    zstd_chunk = chunks[1]
    assert zstandard.frame_content_size(bytes(zstd_chunk.data)) == len(frames)


def test_chunk_errors() -> None:
    _, frames = _frames(2)
    chunk = pack_chunk_raw(frames, 2)
    for cut in range(1, len(chunk)):
        with pytest.raises(BadFrame):
            list(iter_chunks(chunk[:cut]))
    bad_codec = chunk[:4] + b"\x07" + chunk[5:]
    with pytest.raises(BadFrame, match="codec"):
        list(iter_chunks(bad_codec))
    with pytest.raises(BadFrame):
        decode_chunk(7, frames, max_size=1 << 20)
    with pytest.raises(BodyTooLarge):
        decode_chunk(CODEC_RAW, frames, max_size=10)
    with pytest.raises(BodyTooLarge):
        decode_chunk(CODEC_ZSTD, zstd_compress(frames), max_size=10)
    with pytest.raises(ValueError):
        pack_chunk(3, 1, b"")


def _qpf1(claims: list[tuple[int, str, int, int, list[tuple[int, int, bytes]]]]) -> bytes:
    """A QPF1 pop answer (api.md §3.7) around stored chunks, for the client's own decoder."""

    def text(value: str) -> bytes:
        raw = value.encode()
        return struct.pack("<H", len(raw)) + raw

    out = bytearray(b"QPF1\x01") + struct.pack("<I", 2) + b"{}"
    out += text("orders") + text("") + text("__QUEUE_MODE__") + struct.pack("<I", len(claims))
    for partition_id, partition, start, end, records in claims:
        out += struct.pack("<Q", partition_id) + text(partition)
        out += struct.pack("<QQII", start, end, 1, len(records))
        for base, created_us, chunk in records:
            out += struct.pack("<Qq", base, created_us) + chunk
    return bytes(out)


def test_the_client_pop_decoder_reads_our_chunks() -> None:
    ids, frames = _frames(4)
    traced = pack_frame(uuid7(), b"t-traced", b'"x"', trace_id=TRACE, producer_sub="alice")
    answer = _qpf1(
        [
            (17, "p/1", 2, 9, [(1, 1_700_000_000_123_456, pack_chunk_zstd(frames, 4))]),
            (18, "Default", 1, 1, [(1, 0, pack_chunk_raw(traced, 1))]),
        ]
    )
    decoded = client_pop.decode_pop_frames(answer)
    messages = decoded["messages"]
    # Offsets 1..4 in the first record; the claim keeps 2..9, so the first message is skipped.
    assert [m["id"] for m in messages[:3]] == [uuid_text(mid) for mid in ids[1:]]
    assert [m["offset"] for m in messages[:3]] == [2, 3, 4]
    assert messages[0]["data"] == {"i": 1} and messages[0]["transactionId"] == "txn-1"
    assert messages[0]["createdAt"] == "2023-11-14T22:13:20.123Z"
    assert messages[3]["traceId"] == uuid_text(TRACE)
    assert messages[3]["producerSub"] == "alice"
    assert messages[3]["partitionId"] == "18"
    assert decoded["partitionsClaimed"] == 2


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(_frame_args, min_size=1, max_size=8), skip=st.integers(0, 10),
       take=st.integers(0, 10))
def test_plain_columns_are_frame_rows_fields_or_none(frames: list[tuple], skip: int,
                                                     take: int) -> None:
    blob = b"".join(pack_frame(*args) for args in frames)
    rows = list(frame_rows(blob, skip=skip))[:take]
    got = plain_columns(blob, skip=skip, take=take)
    if got is None:  # a frame with flags: frame_rows reads it
        assert any(flags for *_, flags, _ in rows)
        return
    assert all(not flags for *_, flags, _ in rows)
    assert got == ([r[0] for r in rows], [bytes(r[3]) for r in rows],
                   [bytes(r[6]) for r in rows])


def test_plain_columns_leave_bad_or_unusual_frames_to_frame_rows() -> None:
    good = pack_frame(MID, b"txn", b"[1]")
    assert plain_columns(good * 2, take=2) == ([MID, MID], [b"txn"] * 2, [b"[1]"] * 2)
    assert plain_columns(good * 2, skip=1, take=5) == ([MID], [b"txn"], [b"[1]"])
    assert plain_columns(good + good[:-1], take=1) == ([MID], [b"txn"], [b"[1]"])
    for cut in range(1, len(good)):  # truncated: frame_rows words the BadFrame
        assert plain_columns(good + good[:cut], take=2) is None
    assert plain_columns(good + pack_frame(MID, b"t", b"{}", trace_id=TRACE), take=2) is None
    assert plain_columns(pack_frame(MID, b"t", b"{}", producer_sub="s"), take=1) is None
    bad_utf8 = _raw_frame(0, MID, struct.pack("<H", 2), b"\xc3\x28", b"{}")
    assert plain_columns(good + bad_utf8, take=2) is None
    with pytest.raises(BadFrame):
        list(frame_rows(good + bad_utf8))


@pytest.mark.parametrize("bad", [
    _raw_frame(0, MID, struct.pack("<H", 0), b"{}"),  # an empty transactionId
    _raw_frame(0, MID, _txn(b"t" * 1025), b"{}"),  # over 1,024 bytes
    _raw_frame(0, MID, struct.pack("<H", 9), b"txn{}"),  # runs past its frame
    _raw_frame(0, MID, _txn(b"txn"), b"{}", body_len=40),  # its frame runs past the end
    _raw_frame(8, MID, _txn(b"txn"), b"{}"),  # an unknown flag
])
@pytest.mark.parametrize("one_size", [False, True])
def test_plain_columns_refuse_what_frame_rows_refuses(bad: bytes, one_size: bool) -> None:
    good = pack_frame(MID, b"txn", b"[1]")
    for blob in (bad, good + bad, good + bad + good, good * 3 + bad, bad * 3):
        assert plain_columns(blob, take=len(blob), one_size=one_size) is None
        with pytest.raises(WireError):
            list(frame_rows(blob))
    assert plain_columns(good + bad, take=1, one_size=one_size) == ([MID], [b"txn"], [b"[1]"])


# frames of a few shapes, two of them one size with another transactionId length, one with
# a trace id (flags): runs of one size and their breaks
_SHAPES = [pack_frame(MID, b"txn-1", b'{"a":1}'), pack_frame(MID, b"txn-10", b'{"a":1'),
           pack_frame(MID, b"txn-2", b'{"a":2}'), pack_frame(MID, b"t", b"[]", trace_id=TRACE),
           _raw_frame(0, MID, _txn(b"tx\xc3"), b'{"a":1}')]  # bad UTF-8, the first's size


@settings(max_examples=300, deadline=None)
@given(picks=st.lists(st.sampled_from([0, 0, 0, 2, 2, 1, 3, 4]), min_size=1, max_size=12),
       cut=st.integers(-30, 30), skip=st.integers(0, 3), take=st.integers(0, 14))
def test_plain_columns_of_one_size_are_the_walks(picks: list[int], cut: int, skip: int,
                                                 take: int) -> None:
    """Frames of one size read at once (``one_size``) give what the walk gives, whatever
    breaks the run: another shape, a frame with flags, bad UTF-8, a cut or extra bytes."""
    blob = b"".join(_SHAPES[i] for i in picks)
    blob = blob[:cut] if cut < 0 else blob + _SHAPES[0][:cut]

    def read(one_size: bool) -> object:
        try:
            return plain_columns(blob, skip=skip, take=take, one_size=one_size)
        except WireError as ex:  # a frame skipped is truncated
            return ex.to_dict()

    assert read(True) == read(False)


def test_plain_columns_read_alike_past_their_kept_layouts(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    # each frame shape's struct format is kept, at most _LAYOUTS_KEPT of them: past it the
    # table starts again
    monkeypatch.setattr(frames_mod, "_LAYOUTS_KEPT", 3)
    monkeypatch.setattr(frames_mod, "_LAYOUTS", {})
    frames = [pack_frame(MID, b"t" * (1 + i % 5), b"[%d]" % i) for i in range(12)]
    for _ in range(2):
        assert plain_columns(b"".join(frames), take=12) == (
            [MID] * 12, [b"t" * (1 + i % 5) for i in range(12)],
            [b"[%d]" % i for i in range(12)])
        assert len(frames_mod._LAYOUTS) <= 3


def test_single_chunk_reads_one_zstd_chunk_or_leaves_it_to_the_chunk_readers() -> None:
    frames = b"".join(pack_frame(MID, b"t%d" % i, b"[%d]" % i) for i in range(5))
    one = pack_chunk_zstd(frames, 5)
    assert single_chunk(one, 1 << 20) == (5, frames)
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(frames)
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 0)
    for blob in (
        pack_chunk_raw(frames, 5),  # raw: read as it is
        one + one,  # two chunks
        one[:-1], one + b"\x00", one[:8],  # cut, trailing, a truncated head
        pack_chunk(CODEC_ZSTD, 5, no_size),  # no content size
        pack_chunk(CODEC_ZSTD, 0, skippable),  # not a zstd frame
        one[:20] + bytes(len(one) - 20),  # corrupt
    ):
        assert single_chunk(blob, 1 << 20) is None
    assert single_chunk(one, len(frames) - 1) is None  # over the bound: BodyTooLarge there
    with pytest.raises(BodyTooLarge):
        decode_chunk(CODEC_ZSTD, one[9:], max_size=len(frames) - 1)
