"""Ring records: exact round trips, one decode error for anything broken, and speed."""

from __future__ import annotations

import random
from array import array

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queen_mp.wire import (
    ITEM_DUPLICATE,
    ITEM_QUEUED,
    KIND_PUSH_GROUP,
    KIND_PUSH_VERDICT,
    KIND_RECORD_BATCH,
    PIECE_RAW,
    PIECE_ZSTD,
    VERDICT_ERROR,
    VERDICT_OK,
    ZERO_UUID,
    AckRequest,
    ItemVerdict,
    LeaseGrant,
    Piece,
    PushGroup,
    PushVerdict,
    RecordBatch,
    RecordDecodeError,
    hash_set,
    peek_kind,
    unpack_record,
)
from queen_mp.wire.frames import (
    CODEC_ZSTD,
    SMALL_RUN_BYTES,
    SMALL_RUN_LEVEL,
    decode_chunk,
    decompress_bounded,
    iter_chunks,
    pack_frame,
    zstd_compress,
)
from queen_mp.wire.records import (
    KIND_QUEUED_RUN,
    PACK_RAW_MIN,
    blob_from_pieces,
    pack_queued_run,
)

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def push_groups(draw: st.DrawFn) -> PushGroup:
    pieces = tuple(
        draw(
            st.lists(
                st.builds(
                    Piece,
                    st.sampled_from([PIECE_RAW, PIECE_ZSTD]),
                    st.integers(0, 20),
                    st.binary(max_size=64),
                ),
                max_size=4,
            )
        )
    )
    count = sum(piece.count for piece in pieces)
    return PushGroup(
        generation=draw(u32),
        slot=draw(u16),
        request_id=draw(u64),
        group_index=draw(u32),
        tenant=draw(st.binary(min_size=16, max_size=16)),
        queue=draw(st.text(max_size=20)),
        partition=draw(st.text(max_size=20)),
        hashes=draw(st.binary(min_size=16 * count, max_size=16 * count)),
        count=count,
        pieces=pieces,
        deadline_ms=draw(u64),
    )


_items = st.lists(
    st.one_of(
        st.builds(ItemVerdict, st.just(ITEM_QUEUED), i64, st.just(b"")),
        st.builds(
            ItemVerdict,
            st.just(ITEM_DUPLICATE),
            i64,
            st.one_of(st.just(ZERO_UUID), st.binary(min_size=16, max_size=16)),
        ),
    ),
    max_size=30,
).map(tuple)

push_verdicts = st.builds(
    PushVerdict,
    generation=u32,
    slot=u16,
    request_id=u64,
    group_index=u32,
    status=st.sampled_from([VERDICT_OK, VERDICT_ERROR]),
    partition_id=i64,
    created_at_us=i64,
    error=st.text(max_size=40),
    items=_items,
)


@settings(max_examples=150, deadline=None)
@given(group=push_groups())
def test_push_group_round_trips(group: PushGroup) -> None:
    packed = group.pack()
    assert peek_kind(packed) == KIND_PUSH_GROUP
    assert PushGroup.unpack(packed) == group
    assert unpack_record(memoryview(packed)) == group
    assert PushGroup.unpack(bytearray(packed)).pack() == packed


@settings(max_examples=150, deadline=None)
@given(verdict=push_verdicts)
def test_push_verdict_round_trips(verdict: PushVerdict) -> None:
    packed = verdict.pack()
    assert peek_kind(packed) == KIND_PUSH_VERDICT
    for unpacked in (PushVerdict.unpack(packed), unpack_record(memoryview(packed))):
        assert isinstance(unpacked, PushVerdict)
        assert unpacked.each() == verdict.each()
        # a verdict of 2+ frames all queued at consecutive offsets comes back as a run
        run = len(verdict.items) > 1 and all(
            v.status == ITEM_QUEUED and v.offset == verdict.items[0].offset + j
            for j, v in enumerate(verdict.items))
        assert (peek_kind(unpacked.pack()) == KIND_QUEUED_RUN) == (
            run and verdict.status == VERDICT_OK and not verdict.error)
        assert unpacked.pack() == packed or run
        assert unpacked == (msgspec.structs.replace(
            verdict, items=(), queued_run=(verdict.items[0].offset, len(verdict.items)))
            if run else verdict)


def _group() -> PushGroup:
    return PushGroup(
        generation=3,
        slot=1,
        request_id=99,
        group_index=2,
        tenant=bytes(16),
        queue="orders",
        partition="customer/42",
        hashes=bytes(range(32)),
        count=2,
        pieces=(Piece(PIECE_RAW, 1, b"frame-a"), Piece(PIECE_ZSTD, 1, b"zstd-b")),
        deadline_ms=1_700_000_000_000,
    )


def test_one_piece_layouts_are_cached_within_their_bound() -> None:
    """Each (queue, partition, frames) length triple has its own struct; past the bound the
    cache starts over and every group still decodes."""
    from queen_mp.wire import records

    groups = [PushGroup(**{**_fields(_group()), "queue": "q" * (1 + n % 200),
                           "partition": "p" * (1 + n // 200), "count": 1,
                           "hashes": bytes(16), "pieces": (Piece(PIECE_RAW, 1, b"f"),)})
              for n in range(records._ONE_PIECE_MAX + 10)]
    for group in groups:
        assert PushGroup.unpack(group.pack()) == group
        assert len(records._ONE_PIECE) <= records._ONE_PIECE_MAX


def test_a_one_piece_group_that_does_not_add_up_is_refused() -> None:
    # a one-piece group takes unpack's short path; what it cannot vouch for, the loop refuses
    good = PushGroup(**{**_fields(_group()), "count": 1, "hashes": bytes(16),
                        "pieces": (Piece(PIECE_RAW, 1, b"frame-a"),)})
    packed = good.pack()
    assert PushGroup.unpack(packed) == good
    piece_at = len(packed) - len(b"frame-a") - 9  # u8 kind, u32 count, u32 length
    for at, value, match in ((piece_at, 7, "unknown piece kind"),
                             (piece_at + 1, 2, "piece counts add up to 2, not 1")):
        bad = bytearray(packed)
        bad[at] = value
        with pytest.raises(RecordDecodeError, match=match):
            PushGroup.unpack(bytes(bad))
    with pytest.raises(RecordDecodeError, match="trailing"):
        PushGroup.unpack(packed + b"x")
    with pytest.raises(RecordDecodeError, match="runs past the end"):
        PushGroup.unpack(packed[:-1])
    huge = bytearray(packed)
    huge[43:47] = ((1 << 32) - 1).to_bytes(4, "little")  # a frame count no record could hold
    with pytest.raises(RecordDecodeError, match="run past the end"):
        PushGroup.unpack(bytes(huge))


def _verdict() -> PushVerdict:
    return PushVerdict(
        generation=3,
        slot=1,
        request_id=99,
        group_index=2,
        status=VERDICT_OK,
        partition_id=17,
        created_at_us=1_700_000_000_123_456,
        items=(
            ItemVerdict(ITEM_QUEUED, 42, b""),
            ItemVerdict(ITEM_DUPLICATE, 7, b"\x01" * 16),
            ItemVerdict(ITEM_DUPLICATE, -1, ZERO_UUID),
        ),
    )


def _run() -> PushVerdict:
    return msgspec.structs.replace(_verdict(), items=(), queued_run=(2**62, 3))


@pytest.mark.parametrize("record", [_group(), _verdict(), _run()],
                         ids=["group", "verdict", "run"])
def test_every_truncation_and_extension_is_a_decode_error(record: PushGroup | PushVerdict) -> None:
    packed = record.pack()
    for cut in range(len(packed)):
        with pytest.raises(RecordDecodeError) as info:
            type(record).unpack(packed[:cut])
        assert info.value.raw == packed[:cut]
    with pytest.raises(RecordDecodeError):
        type(record).unpack(packed + b"\x00")


@settings(max_examples=300, deadline=None)
@given(
    which=st.sampled_from(["group", "verdict", "run"]),
    at=st.integers(0, 10_000),
    value=st.integers(0, 255),
)
def test_corrupt_records_raise_only_decode_errors(which: str, at: int, value: int) -> None:
    packed = bytearray({"group": _group, "verdict": _verdict, "run": _run}[which]().pack())
    packed[at % len(packed)] = value
    try:
        record = unpack_record(bytes(packed))
    except RecordDecodeError as ex:
        assert ex.raw == bytes(packed)
    else:
        assert record.pack() == bytes(packed)


def test_kind_dispatch() -> None:
    assert isinstance(unpack_record(_group().pack()), PushGroup)
    assert isinstance(unpack_record(_verdict().pack()), PushVerdict)
    with pytest.raises(RecordDecodeError, match="unknown record kind"):
        unpack_record(b"\x09rest")
    with pytest.raises(RecordDecodeError, match="empty"):
        peek_kind(b"")
    with pytest.raises(RecordDecodeError, match="not a PushVerdict"):
        PushVerdict.unpack(_group().pack())
    with pytest.raises(RecordDecodeError, match="not a PushGroup"):
        PushGroup.unpack(_verdict().pack())


@settings(max_examples=100, deadline=None)
@given(groups=st.lists(push_groups(), max_size=5), verdicts=st.lists(push_verdicts, max_size=5))
def test_a_record_batch_round_trips_to_its_records(groups: list[PushGroup],
                                                   verdicts: list[PushVerdict]) -> None:
    records = [*(g.pack() for g in groups), *(v.pack() for v in verdicts)]
    packed = RecordBatch(tuple(records)).pack()
    assert peek_kind(packed) == KIND_RECORD_BATCH
    assert len(packed) == RecordBatch.packed_size(map(len, records))
    batch = RecordBatch.unpack(packed)
    assert [bytes(r) for r in batch.records] == records
    assert [unpack_record(r) for r in batch.records] == [*groups, *verdicts]
    assert unpack_record(packed) == batch
    # each group read in place at the batch's bounds (as the shard reads them): no byte of
    # its neighbours, whichever path of unpack (one piece or several) reads it
    bounds = RecordBatch.bounds(packed)
    assert len(bounds) == len(records) + 1
    for buf in (packed, bytearray(packed)):
        assert [PushGroup.unpack(buf, bounds[k], bounds[k + 1])
                for k in range(len(groups))] == groups


def test_a_batch_cuts_small_records_as_bytes_and_keeps_large_ones_as_views() -> None:
    # small records are cheaper to read as bytes; a large one stays a view of the batch, so
    # that its frames are copied once (by PushGroup.unpack), not twice
    small = _group()
    large = PushGroup(**{**_fields(small), "count": 1, "hashes": bytes(16),
                         "pieces": (Piece(PIECE_RAW, 1, b"f" * 40_000),)})
    packed = RecordBatch((small.pack(), large.pack())).pack()
    cut, kept = RecordBatch.unpack(packed).records
    assert type(cut) is bytes and isinstance(kept, memoryview)
    assert PushGroup.unpack(cut) == small
    assert PushGroup.unpack(kept) == large
    assert all(type(p.data) is bytes for p in PushGroup.unpack(kept).pieces)
    # a batch that is not bytes gives views only
    assert all(isinstance(r, memoryview)
               for r in RecordBatch.unpack(bytearray(packed)).records)


def test_pack_raw_compresses_large_raw_pieces_of_several_frames_to_the_same_chunk() -> None:
    # what a shard reads from its ring: a raw piece of more than one frame and PACK_RAW_MIN
    # bytes or more comes out a zstd piece, stored as the same chunk as it was stored when
    # compressed at the bundle's flush; smaller pieces, one frame, and client zstd pieces are
    # copied as they are; the piece's bytes are never a view of the buffer read
    frames = b"".join(pack_frame(bytes(range(16)), f"t-{i}".encode(), b'{"n": %d}' % i)
                      for i in range(200))
    small = _group()
    big = PushGroup(**{**_fields(small), "count": 200, "hashes": bytes(16 * 200),
                       "pieces": (Piece(PIECE_RAW, 200, frames),)})
    one = PushGroup(**{**_fields(small), "count": 1, "hashes": bytes(16),
                       "pieces": (Piece(PIECE_RAW, 1, b"f" * PACK_RAW_MIN),)})
    mixed = PushGroup(**{**_fields(small), "count": 201, "hashes": bytes(16 * 201),
                         "pieces": (Piece(PIECE_RAW, 200, frames), Piece(PIECE_ZSTD, 1, b"z"))})
    assert len(frames) >= PACK_RAW_MIN
    records = (small.pack(), big.pack(), one.pack(), mixed.pack())
    packed = RecordBatch(records).pack()
    bounds = RecordBatch.bounds(packed)
    for buf in (packed, memoryview(packed), bytearray(packed)):
        got = [PushGroup.unpack(buf, bounds[k], bounds[k + 1], True) for k in range(4)]
        assert got[0] == small and got[2] == one
        assert [p.kind for p in got[1].pieces] == [PIECE_ZSTD]
        assert [p.kind for p in got[3].pieces] == [PIECE_ZSTD, PIECE_ZSTD]
        assert all(type(p.data) is bytes for g in got for p in g.pieces)
        assert blob_from_pieces(got[1].pieces) == blob_from_pieces(big.pieces)
        assert decompress_bounded(got[3].pieces[0].data, 1 << 20) == frames
        assert PushGroup.unpack(bytes(records[1]), pack_raw=True) == got[1]
    assert PushGroup.unpack(packed, bounds[1], bounds[2]) == big  # without pack_raw


def test_every_truncation_and_extension_of_a_batch_is_a_decode_error() -> None:
    packed = RecordBatch((_group().pack(), b"", _verdict().pack())).pack()
    for cut in range(len(packed)):
        with pytest.raises(RecordDecodeError) as info:
            RecordBatch.unpack(packed[:cut])
        assert info.value.raw == packed[:cut]
    with pytest.raises(RecordDecodeError, match="trailing"):
        RecordBatch.unpack(packed + b"\x00")
    with pytest.raises(RecordDecodeError, match="not a RecordBatch"):
        RecordBatch.unpack(_verdict().pack())


def test_error_verdict_without_items() -> None:
    verdict = PushVerdict(3, 1, 99, 0, VERDICT_ERROR, error="statement timeout")
    assert PushVerdict.unpack(verdict.pack()) == verdict


def test_pack_refuses_inconsistent_records() -> None:
    group = _group()
    bad_groups = [
        PushGroup(**{**_fields(group), "tenant": b"short"}),
        PushGroup(**{**_fields(group), "hashes": bytes(16)}),
        PushGroup(**{**_fields(group), "count": 3, "hashes": bytes(48)}),
        PushGroup(**{**_fields(group), "slot": 2**16}),
        PushGroup(**{**_fields(group), "pieces": (Piece(7, 2, b""),)}),
    ]
    for bad in bad_groups:
        with pytest.raises(ValueError):
            bad.pack()
    verdict = _verdict()
    bad_items = [
        (ItemVerdict(2, 0, b""),),
        (ItemVerdict(ITEM_QUEUED, 0, ZERO_UUID),),
        (ItemVerdict(ITEM_DUPLICATE, 0, b""),),
        (ItemVerdict(ITEM_DUPLICATE, 0, b"\x00" * 15),),
        (ItemVerdict(ITEM_QUEUED, 2**63, b""),),
        (ItemVerdict(ITEM_QUEUED, 0, ZERO_UUID), ItemVerdict(ITEM_DUPLICATE, 0, b"")),
    ]
    for items in bad_items:
        with pytest.raises(ValueError):
            PushVerdict(**{**_fields(verdict), "items": items}).pack()
    with pytest.raises(ValueError):
        PushVerdict(**{**_fields(verdict), "partition_id": 2**63}).pack()


def _fields(record: PushGroup | PushVerdict) -> dict:
    if isinstance(record, tuple):  # a NamedTuple record (PushGroup)
        return record._asdict()
    return {name: getattr(record, name) for name in record.__struct_fields__}


def test_unpack_refuses_inconsistent_bytes() -> None:
    packed = bytearray(_verdict().pack())
    statuses_at = 48  # header size; no error text
    packed[statuses_at] = 5
    with pytest.raises(RecordDecodeError, match="status"):
        PushVerdict.unpack(bytes(packed))
    packed[statuses_at] = ITEM_DUPLICATE  # now three duplicates but two ids
    with pytest.raises(RecordDecodeError):
        PushVerdict.unpack(bytes(packed))
    group = bytearray(_group().pack())
    group[-len(b"zstd-b") - 9 + 1 : -len(b"zstd-b") - 9 + 5] = (5).to_bytes(4, "little")
    with pytest.raises(RecordDecodeError, match="piece counts"):
        PushGroup.unpack(bytes(group))


def test_a_thousand_items_pack_and_unpack() -> None:
    base = 1_000_000
    items = tuple(ItemVerdict(ITEM_QUEUED, base + k, b"") for k in range(1000))
    items = items[:-10] + tuple(ItemVerdict(ITEM_DUPLICATE, k, bytes([k]) * 16) for k in range(10))
    verdict = PushVerdict(1, 2, 3, 4, VERDICT_OK, 17, 5, "", items)
    packed = verdict.pack()
    assert len(packed) == 48 + 1000 * 9 + 10 * 16
    assert PushVerdict.unpack(packed) == verdict
    queued = PushVerdict(1, 2, 3, 4, VERDICT_OK, 17, 5, "", items[:990])
    assert PushVerdict.unpack(queued.pack()).queued_run == (base, 990)
    for n in (5, 990):  # the ends of a run, two frames between them swapped: no run
        swapped = (*items[:2], items[3], items[2], *items[4:n])
        assert PushVerdict.unpack(PushVerdict(1, 2, 3, 4, VERDICT_OK, 17, 5, "", swapped)
                                  .pack()).items == swapped
    offsets = array("q")
    offsets.frombytes(packed[48 + 1000 : 48 + 9000])
    assert offsets[0] == base and offsets[-1] == 9


@settings(max_examples=100, deadline=None)
@given(first=st.integers(0, 2**62), count=st.integers(0, 300))
def test_a_queued_run_packs_as_a_fixed_record_and_reads_back_as_its_items(first: int,
                                                                          count: int) -> None:
    items = tuple(ItemVerdict(ITEM_QUEUED, first + j, b"") for j in range(count))
    head = {**_fields(_verdict()), "items": ()}
    run = PushVerdict(**{**head, "queued_run": (first, count)})
    packed = run.pack()
    assert packed == pack_queued_run(*(head[k] for k in (
        "generation", "slot", "request_id", "group_index", "partition_id", "created_at_us")),
        first, count)
    if count > 1:  # no offset per frame: one size whatever the count
        assert peek_kind(packed) == KIND_QUEUED_RUN and len(packed) == 47
    else:
        assert packed == PushVerdict(**{**head, "items": items}).pack()
    for unpacked in (PushVerdict.unpack(packed), unpack_record(memoryview(packed))):
        assert isinstance(unpacked, PushVerdict) and unpacked.each() == items
        assert unpacked.queued_run == ((first, count) if count > 1 else None)
        assert unpacked.pack() == packed


def test_a_queued_run_of_fewer_than_two_frames_or_past_int64_is_a_decode_error() -> None:
    packed = bytearray(_run().pack())
    for count, first in ((1, 0), (0, 0), (2, 2**63 - 1)):
        packed[-12:] = first.to_bytes(8, "little") + count.to_bytes(4, "little")
        with pytest.raises(RecordDecodeError):
            unpack_record(bytes(packed))


def test_a_queued_run_refuses_items_and_overflow() -> None:
    head = _fields(_verdict())
    with pytest.raises(ValueError, match="both"):
        PushVerdict(**{**head, "queued_run": (0, 1)}).pack()
    with pytest.raises(ValueError, match="run"):
        PushVerdict(**{**head, "items": (), "queued_run": (2**63 - 1, 2)}).pack()


_hashes = st.lists(st.binary(min_size=16, max_size=16), max_size=40)


@settings(max_examples=100, deadline=None)
@given(a=_hashes, b=_hashes)
def test_hash_sets_are_equal_exactly_when_their_bytes_are(a: list[bytes],
                                                          b: list[bytes]) -> None:
    assert (hash_set(a) == hash_set(b)) == (set(a) == set(b))
    assert len(hash_set(a)) == 16 * len(set(a))


_edgy = st.sampled_from([bytes(16), b"\xff" * 16, bytes(15) + b"\x01", b"\x80" + bytes(15),
                         b"\x7f" + b"\xff" * 15, b"a" + bytes(15)]) | st.binary(min_size=16,
                                                                                 max_size=16)


@settings(max_examples=100, deadline=None)
@given(a=st.lists(_edgy, min_size=20, max_size=150), repeats=st.integers(0, 40))
def test_a_hash_set_is_its_distinct_hashes_ascending_by_bytes(a: list[bytes],
                                                              repeats: int) -> None:
    """Below and from the size where numpy sorts them (NUL and high bytes included)."""
    a = a + a[:repeats]
    assert hash_set(a) == b"".join(sorted(set(a)))
    assert hash_set(iter(a)) == hash_set(a)


@settings(max_examples=100, deadline=None)
@given(hashes=_hashes, group=st.text(max_size=20), queue=st.text(max_size=20), n=i64, u=u64)
def test_grants_and_ack_requests_round_trip(hashes: list[bytes], group: str, queue: str,
                                            n: int, u: int) -> None:
    grant = LeaseGrant(bytes(16), b"\x01" * 16, n, n, u, group, queue, hash_set(hashes))
    assert LeaseGrant.unpack(grant.pack()) == grant
    req = AckRequest(3, 1, u, 2, bytes(16), b"\x01" * 16, n, group, hash_set(hashes))
    assert AckRequest.unpack(req.pack()) == req
    for record in (grant, req):
        packed = record.pack()
        for cut in (1, 16):
            with pytest.raises(RecordDecodeError):
                type(record).unpack(packed[:-cut] if hashes else packed + b"\x00" * cut)


def test_blob_from_pieces_packs_runs_by_size_and_keeps_client_chunks() -> None:
    # small runs of text and a larger one: each run one chunk, at SMALL_RUN_LEVEL under
    # SMALL_RUN_BYTES and at level 1 above; the client chunk as sent
    rng = random.Random(7)
    text = bytes(rng.choice(b"etaoinshrdlu ") for _ in range(300))
    small = [pack_frame(bytes(range(16)), f"t-{i}".encode(), b'"%s"' % text) for i in range(3)]
    big = [pack_frame(bytes(16), f"t-{i}".encode(), b'{"pad":"%s"}' % (b"ab" * 300))
           for i in range(4)]
    client = zstd_compress(b"".join(small), 3)
    blob = blob_from_pieces([Piece(PIECE_RAW, 2, b"".join(small[:2])),
                             Piece(PIECE_RAW, 1, small[2]), Piece(PIECE_ZSTD, 3, client),
                             Piece(PIECE_RAW, 4, b"".join(big))])
    chunks = list(iter_chunks(blob))
    assert len(b"".join(small)) < SMALL_RUN_BYTES < len(b"".join(big))
    assert [(c.count, c.codec) for c in chunks] == [(3, CODEC_ZSTD)] * 2 + [(4, CODEC_ZSTD)]
    assert bytes(chunks[0].data) == zstd_compress(b"".join(small), SMALL_RUN_LEVEL)
    assert bytes(chunks[0].data) != zstd_compress(b"".join(small), 1)
    assert bytes(chunks[1].data) == client
    assert bytes(chunks[2].data) == zstd_compress(b"".join(big), 1)
    frames = [bytes(decode_chunk(c.codec, c.data, max_size=1 << 20)) for c in chunks]
    assert frames == [b"".join(small)] * 2 + [b"".join(big)]


@given(u32, u16, u64, u32, i64, i64, st.integers(-(2**40), 2**40), st.integers(1, 50))
def test_pack_queued_run_is_the_queued_run_verdict(generation: int, slot: int, request_id: int,
                                                   group_index: int, pid: int, created: int,
                                                   first: int, count: int) -> None:
    verdict = PushVerdict(generation, slot, request_id, group_index, VERDICT_OK, pid, created,
                          queued_run=(first, count))
    assert pack_queued_run(generation, slot, request_id, group_index, pid, created, first,
                           count) == verdict.pack()


def test_pack_queued_run_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError):
        pack_queued_run(2**32, 0, 1, 0, 1, 1, 1, 1)
    with pytest.raises(ValueError):
        pack_queued_run(1, 0, 1, 0, 1, 1, 2**63 - 1, 2)


def test_pack_refuses_an_inconsistent_one_piece_group() -> None:
    """A one-piece group is packed by its own short path; it refuses what the loop does."""
    one = {**_fields(_group()), "count": 1, "hashes": bytes(16),
           "pieces": (Piece(PIECE_RAW, 1, b"frame-a"),)}
    assert PushGroup.unpack(PushGroup(**one).pack()) == PushGroup(**one)
    for bad in ({"count": 2, "hashes": bytes(32)}, {"pieces": (Piece(7, 1, b""),)},
                {"slot": 2**16}, {"tenant": b"short"}, {"hashes": bytes(32)}):
        with pytest.raises(ValueError):
            PushGroup(**{**one, **bad}).pack()


def test_a_one_frame_verdict_of_its_short_size_decodes_as_the_general_path_would() -> None:
    """``PushVerdict.unpack`` reads a 1-frame queued verdict by one struct; every other
    record of that size (an error of 9 bytes, a bad item status) takes the general path."""
    one = PushVerdict(3, 1, 9, 0, VERDICT_OK, 7, 11, items=(ItemVerdict(ITEM_QUEUED, 42, b""),))
    packed = pack_queued_run(3, 1, 9, 0, 7, 11, 42, 1)
    assert packed == one.pack()
    assert PushVerdict.unpack(packed) == one
    assert PushVerdict.unpack(bytearray(packed)) == one
    assert unpack_record(memoryview(packed)) == one
    error = PushVerdict(3, 1, 9, 0, VERDICT_ERROR, error="Expired: ")
    assert len(error.pack()) == len(packed)
    assert PushVerdict.unpack(error.pack()) == error
    with pytest.raises(RecordDecodeError):
        PushVerdict.unpack(packed[:-9] + b"\x02" + packed[-8:])
    with pytest.raises(RecordDecodeError):
        PushVerdict.unpack(b"\x00" + packed[1:])


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1), st.integers(0, 2**64 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1),
       st.integers(0, 2**63 - 1))
@settings(max_examples=200, deadline=None)
def test_pack_queued_one_is_a_one_frame_queued_run(generation, slot, request_id, group_index,
                                                    pid, created, first):
    """The shard packs a 1-frame group's verdict with the struct's own pack (fusion
    ``_committed``): the same bytes as ``pack_queued_run(..., 1)``, read back as one queued
    item at ``first``."""
    from queen_mp.wire.records import (
        ITEM_QUEUED,
        KIND_PUSH_VERDICT,
        VERDICT_OK,
        pack_queued_one,
    )

    packed = pack_queued_one(KIND_PUSH_VERDICT, generation, slot, request_id, group_index,
                             VERDICT_OK, pid, created, 1, 0, 0, ITEM_QUEUED, first)
    assert packed == pack_queued_run(generation, slot, request_id, group_index, pid, created,
                                     first, 1)
    v = PushVerdict.unpack(packed)
    assert (v.request_id, v.partition_id, v.created_at_us) == (request_id, pid, created)
    assert [(i.status, i.offset) for i in v.items] == [(0, first)]


def test_pack_batch_is_record_batch_pack():
    from collections import deque

    from queen_mp.wire.records import pack_batch

    records = (b"a", b"", bytes(range(200)), b"xyz")
    assert pack_batch(deque(records)) == RecordBatch(records).pack()
    assert RecordBatch.unpack(pack_batch(records)).records == records
    assert pack_batch(()) == RecordBatch(()).pack()


def test_raw_one_head_is_pack_chunk_raw_of_one_frame():
    from queen_mp.wire.frames import iter_chunks, pack_chunk_raw, raw_one_head

    frame = bytes(range(233))
    blob = raw_one_head(len(frame)) + frame
    assert blob == pack_chunk_raw(frame, 1)
    (chunk,) = iter_chunks(blob)
    assert (chunk.count, chunk.codec, bytes(chunk.data)) == (1, 0, frame)
