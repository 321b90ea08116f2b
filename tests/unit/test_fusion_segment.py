"""The payload blob ``build_segment`` stores (shards/fusion.py): a segment of one raw frame
is stored as a raw chunk (codec 0: zstd's call cost more than the bytes it saved); more
frames, or a client's zstd chunk, as before; every one reads back as the frames sent."""

from __future__ import annotations

from queen_mp.shards.fusion import Entry, build_segment
from queen_mp.wire.frames import (
    CODEC_RAW,
    CODEC_ZSTD,
    decode_chunk,
    iter_chunks,
    pack_frame,
    zstd_compress,
)
from queen_mp.wire.hashing import hash_blob
from queen_mp.wire.ids import uuid7
from queen_mp.wire.records import PIECE_RAW, PIECE_ZSTD, Piece, PushGroup

KEY = (bytes(16), "q", "p")


def frames(n: int) -> bytes:
    return b"".join(pack_frame(uuid7(), b"t%d" % i, b'{"n":%d}' % i) for i in range(n))


def group(n: int, pieces: tuple[Piece, ...]) -> PushGroup:
    return PushGroup(1, 0, 1, 0, KEY[0], KEY[1], KEY[2],
                     hash_blob(b"t%d" % i for i in range(n)), n, pieces, 0)


def stored(blob: bytes) -> list[tuple[int, int, bytes]]:
    return [(c.count, c.codec, bytes(decode_chunk(c.codec, c.data, max_size=1 << 20)))
            for c in iter_chunks(blob)]


def test_one_raw_frame_is_stored_raw() -> None:
    raw = frames(1)
    seg = build_segment(KEY, [Entry(0, group(1, (Piece(PIECE_RAW, 1, raw),)), 1)])
    assert stored(seg.blob) == [(1, CODEC_RAW, raw)]
    assert seg.count == 1 and seg.refs is None


def test_two_raw_frames_are_compressed() -> None:
    raw = frames(2)
    seg = build_segment(KEY, [Entry(0, group(2, (Piece(PIECE_RAW, 2, raw),)), 2)])
    assert stored(seg.blob) == [(2, CODEC_ZSTD, raw)]


def test_a_client_chunk_of_one_frame_is_kept() -> None:
    raw = frames(1)
    z = zstd_compress(raw)
    seg = build_segment(KEY, [Entry(0, group(1, (Piece(PIECE_ZSTD, 1, z),)), 1)])
    assert [c.codec for c in iter_chunks(seg.blob)] == [CODEC_ZSTD]
    assert bytes(next(iter_chunks(seg.blob)).data) == z
    assert stored(seg.blob) == [(1, CODEC_ZSTD, raw)]


def test_the_field_orders_the_fusion_unpacks_by_position() -> None:
    """``PushFusion`` reads these NamedTuples by position (PERF(fusion): a field read by name
    costs a descriptor call on 3.11): a field moved or added must fail here, not shift what
    ``_flush`` and ``_committed`` read."""
    from queen_mp.db.calls import SegmentVerdict
    from queen_mp.shards import fusion
    from queen_mp.shards.fusion import Segment

    assert PushGroup._fields[fusion._GROUP_COUNT] == "count"
    assert PushGroup._fields[7:] == ("hashes", "count", "pieces", "deadline_ms")
    assert PushGroup._fields[:4] == ("generation", "slot", "request_id", "group_index")
    assert Segment._fields == ("key", "entries", "hashes", "blob", "count", "refs",
                               "followers")
    assert fusion._COUNT(Segment(*range(7))) == 4
    assert SegmentVerdict._fields[:5] == ("partition_id", "created_at_us", "queued",
                                          "base_offset", "window")
    assert len(SegmentVerdict._fields) == 6
