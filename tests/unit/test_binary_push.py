"""QPB1 bodies: the published client's own bytes, every rule as a data case, and corruption."""

from __future__ import annotations

import json
import re
import struct
import tomllib
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from queen.http import push_binary as client

from queen_mp.models.transactions import qtb1_decoded_size
from queen_mp.wire import (
    BadFrame,
    BinaryPush,
    FramesGroup,
    InvalidName,
    InvalidPayload,
    NameTooLong,
    PlainGroup,
    WireError,
    check_name,
    check_partition_name,
    check_payload,
    check_queue_name,
    decoded_size,
    groups_growth,
    is_uuid7,
    pack_frame,
    parse_binary_push,
    read_frame_groups,
    uuid_text,
)

CASES = Path(__file__).parent / "wire_cases" / "qpb1.toml"

_ID7 = bytes.fromhex("0196f3a2c00070008000000000000a0a")
_ID4 = bytes.fromhex("0196f3a2c00040008000000000000a0a")

_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")(?:\*(?P<rep>\d+))?'
    r"|(?P<open>[a-z_0-9]+)\{|(?P<close>\})|(?P<word>[^\s{}\"]+))"
)


def build(spec: str) -> bytes:
    """The bytes of a wire_cases body (token language in qpb1.toml's header)."""
    tokens = [m for m in _TOKEN.finditer(spec) if m.group(0).strip()]
    out, at = _build(tokens, 0)
    assert at == len(tokens), f"unbalanced braces in {spec!r}"
    return out


def _build(tokens: list[re.Match[str]], at: int) -> tuple[bytes, int]:
    out = bytearray()
    while at < len(tokens):
        tok = tokens[at]
        at += 1
        if tok["close"]:
            return bytes(out), at
        if tok["str"]:
            out += json.loads(tok["str"]).encode("utf-8") * int(tok["rep"] or 1)
        elif tok["open"]:
            inner, at = _build(tokens, at)
            out += _block(tok["open"], inner)
        else:
            out += _word(tok["word"])
    return bytes(out), at


def _block(kind: str, inner: bytes) -> bytes:
    if kind == "len16":
        return struct.pack("<H", len(inner)) + inner
    if kind == "len32":
        return struct.pack("<I", len(inner)) + inner
    if kind == "zstd":
        return zstandard.ZstdCompressor(level=1, write_content_size=True).compress(inner)
    if kind == "zstd_nosize":
        return zstandard.ZstdCompressor(level=1, write_content_size=False).compress(inner)
    if kind == "raw_zstd":
        return struct.pack("<I", len(inner)) + _block("zstd", inner)
    raise AssertionError(f"unknown block {kind}")


def _word(word: str) -> bytes:
    if word == "id7":
        return _ID7
    if word == "id4":
        return _ID4
    kind, _, value = word.partition(":")
    if kind == "x":
        return bytes.fromhex(value)
    fmt = {"u8": "<B", "u16": "<H", "u32": "<I"}[kind]
    return struct.pack(fmt, int(value, 0))


def _cases() -> list[dict]:
    return tomllib.loads(CASES.read_text("utf-8"))["case"]


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("case", _cases(), ids=lambda case: case["name"])
def test_wire_case(case: dict, columns: bool) -> None:
    """Every case, its frames read one by one or by columns (the same outcome)."""
    body = build(case["body"])
    limits = {
        k: case[k] for k in ("max_items", "max_decompressed", "max_total_decompressed") if k in case
    }
    if case["code"] == "ok":
        push = parse_binary_push(body, **limits, columns=columns)
        assert push.item_count == case["items"]
        assert sum(group.count for group in push.groups) == case["items"]
        return
    with pytest.raises(WireError) as info:
        parse_binary_push(body, **limits, columns=columns)
    with pytest.raises(WireError) as one_by_one:
        parse_binary_push(body, **limits)
    assert info.value.to_dict() == one_by_one.value.to_dict()
    err = info.value
    assert err.code == case["code"], repr(err)
    for key in ("index", "field"):
        if key in case:
            assert getattr(err, key) == case[key], repr(err)
    assert err.offset is None or 0 <= err.offset <= len(body), repr(err)
    assert err.to_dict()["code"] == case["code"]


# --- the published client's bytes -----------------------------------------------------------


def _items(n: int, queue: str = "orders") -> list[dict]:
    return [
        {
            "queue": queue if i % 7 else f"{queue}.other",
            "partition": "Default" if i % 3 else f"customer/{i // 10}",
            "payload": {"i": i, "text": "héllo ✓", "list": [1, 2.5, None, True]},
            "transactionId": "" if i % 5 == 0 else f"order-{i}",
        }
        for i in range(n)
    ]


def _expected(items: list[dict]) -> list[tuple[str, str, str | None, object]]:
    return [
        (item["queue"], item["partition"], item["transactionId"] or None, item["payload"])
        for item in items
    ]


def _flatten(push: BinaryPush) -> list[tuple[str, str, str | None, object]]:
    out = []
    for group in push.groups:
        if isinstance(group, PlainGroup):
            for item in group.items:
                data = json.loads(bytes(item.payload)) if item.payload else None
                out.append((group.queue, group.partition, item.transaction_id, data))
        else:
            for frame in group.frames:
                data = json.loads(bytes(frame.payload)) if frame.payload else None
                txn = (
                    None
                    if frame.transaction_id == uuid_text(frame.message_id)
                    else (frame.transaction_id)
                )
                out.append((group.queue, group.partition, txn, data))
    return out


def test_client_plain_body_is_read_in_wire_order() -> None:
    items = _items(50)
    body = client.binary_push_body(items, False)
    assert body[4] == 0x04  # the 2.6 client always sends flag 4
    push = parse_binary_push(body)
    assert not push.frames_mode and not push.counts_only
    assert push.item_count == 50
    assert _flatten(push) == _expected(items)
    firsts = [group.first_index for group in push.groups]
    assert firsts == sorted(firsts) and firsts[0] == 0


def test_client_frames_body_keeps_its_zstd_frames_and_ids() -> None:
    items = _items(50)
    body = client.binary_push_body(items, True)
    assert body[4] == 0x08
    push = parse_binary_push(body)
    assert push.frames_mode
    assert _flatten(push) == _expected(items)
    for group in push.groups:
        assert isinstance(group, FramesGroup)
        assert bytes(group.chunk) in body  # the client's zstd frame, byte for byte
        assert zstandard.frame_content_size(bytes(group.chunk)) > 0
        for frame in group.frames:
            assert is_uuid7(frame.message_id)
            assert frame.flags == 0 and frame.trace_id is None and frame.producer_sub is None


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("counts", [False, True])
def test_client_encode_push_binary_flags(compress: bool, counts: bool) -> None:
    batches = [
        client.PushBatch("q1", "", [b'{"a":1}', b"2"], ["t1", ""]),
        client.PushBatch("q2", "p/x", [b"null"], None),
    ]
    body = client.encode_push_binary(batches, compress=compress, counts=counts)
    push = parse_binary_push(body)
    assert push.counts_only is counts
    assert [(g.queue, g.partition, g.count) for g in push.groups] == [
        ("q1", "Default", 2),
        ("q2", "p/x", 1),
    ]
    txns = [item.transaction_id for g in push.groups for item in g.items]
    assert txns == ["t1", None, None]


def test_client_encode_push_binary_without_transaction_ids() -> None:
    body = client.encode_push_binary([client.PushBatch("q", "p", [b"1", b"[]"])])
    assert body[4] == 0
    push = parse_binary_push(body)
    assert [bytes(item.payload) for item in push.groups[0].items] == [b"1", b"[]"]


@pytest.mark.parametrize("counts", [False, True])
def test_client_encode_push_frames_counts(counts: bool) -> None:
    body = client.encode_push_frames(
        [client.PushBatch("q", "Default", [b"1", b"2"], ["a", ""])], counts=counts
    )
    push = parse_binary_push(body)
    assert push.frames_mode and push.counts_only is counts
    frames = push.groups[0].frames
    assert frames[0].transaction_id == "a"
    assert frames[1].transaction_id == uuid_text(frames[1].message_id)


def test_pack_frame_reproduces_the_client_frames_byte_for_byte() -> None:
    body = client.binary_push_body(_items(30), True)
    push = parse_binary_push(body)
    for group in push.groups:
        frames_bytes = zstandard.ZstdDecompressor().decompress(bytes(group.chunk))
        repacked = b"".join(
            pack_frame(f.message_id, bytes(f.transaction_id_bytes), bytes(f.payload))
            for f in group.frames
        )
        assert repacked == frames_bytes


def test_client_transaction_body_groups_are_read_by_read_frame_groups() -> None:
    body = client.encode_transaction_frames(
        b'{"operations":[]}', [client.PushBatch("q", "p", [b"1", b"2"], ["x", "y"])]
    )
    assert body[:4] == b"QTB1"
    head_len = struct.unpack_from("<I", body, 5)[0]
    groups, count = read_frame_groups(body, 9 + head_len)
    assert count == 2
    assert [f.transaction_id for f in groups[0].frames] == ["x", "y"]


def test_payload_views_share_the_body() -> None:
    body = client.binary_push_body(_items(3), False)
    item = parse_binary_push(body).groups[0].items[0]
    assert isinstance(item.payload, memoryview)
    assert item.payload.obj is body  # sliced, not copied


# --- truncation and corruption ----------------------------------------------------------------


def _valid_bodies() -> list[bytes]:
    batches = [client.PushBatch("q", "p", [b'{"k":[1,2]}', b"3"], ["t1", ""])]
    return [
        client.binary_push_body(_items(4), False),
        client.binary_push_body(_items(4), True),
        client.encode_push_binary(batches, compress=True),
        client.encode_push_binary(batches, counts=True),
    ]


@pytest.mark.parametrize("body", _valid_bodies(), ids=["plain", "frames", "zstd", "counts"])
def test_every_truncation_is_bad_frame(body: bytes) -> None:
    parse_binary_push(body)
    for cut in range(len(body)):
        with pytest.raises(BadFrame):
            parse_binary_push(body[:cut])


@pytest.mark.parametrize("body", _valid_bodies(), ids=["plain", "frames", "zstd", "counts"])
def test_every_extra_trailing_byte_is_bad_frame(body: bytes) -> None:
    for extra in (b"\x00", b"QPB1", body):
        with pytest.raises(BadFrame):
            parse_binary_push(body + extra)


_corruption = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 8)),
    st.tuples(st.just("set"), st.integers(0, 10_000), st.sampled_from([0, 0xFF, 0x7F, 0x80])),
)


def _corrupt(body: bytes, edits: list[tuple]) -> bytes:
    data = bytearray(body)
    for kind, at, arg in edits:
        if not data:
            break
        at %= len(data)
        if kind == "flip":
            data[at] ^= arg
        elif kind == "set":
            data[at] = arg
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = arg
        else:
            del data[at : at + arg]
    return bytes(data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, 3),
    edits=st.lists(_corruption, min_size=1, max_size=4),
)
def test_corrupted_bodies_raise_only_wire_errors(which: int, edits: list[tuple]) -> None:
    body = _corrupt(_valid_bodies()[which], edits)
    try:
        by_columns: object = parse_binary_push(body, columns=True).item_count
    except WireError as ex:
        by_columns = ex.to_dict()
    try:
        push = parse_binary_push(body)
    except WireError as ex:
        assert by_columns == ex.to_dict()
        assert ex.code in {
            "bad_frame",
            "invalid_payload",
            "unsupported_flags",
            "body_too_large",
            "name_too_long",
            "invalid_request",
            "invalid_name",
        }
        assert isinstance(ex.to_dict(), dict)
    else:
        assert push.item_count == sum(group.count for group in push.groups) == by_columns


def test_decoded_size_reads_the_zstd_headers() -> None:
    plain, _frames, zstd, counts = _valid_bodies()
    assert decoded_size(plain) == len(plain) and decoded_size(counts) == len(counts)
    big = client.binary_push_body(_items(300), True)
    groups = parse_binary_push(big).groups
    assert len(groups) > 1
    grown = sum(max(0, len(zstandard.ZstdDecompressor().decompress(bytes(g.chunk))) - len(g.chunk))
                for g in groups if isinstance(g, FramesGroup))  # a frame never counts less
    assert grown > 0 and decoded_size(big) == len(big) + grown
    inner = zstandard.ZstdDecompressor().decompress(zstd[9:])
    assert decoded_size(zstd) == len(zstd) - 9 + len(inner)
    assert decoded_size(b"QPB1") == 4 and decoded_size(b'{"items":[]}') == 12


def test_qtb1_decoded_size_counts_what_the_push_groups_decode_to() -> None:
    items = [{"queue": "q", "partition": f"p{i // 100}", "transactionId": f"t{i}",
              "payload": {"seq": i, "pad": "x" * 200}} for i in range(300)]
    request = {"operations": [{"type": "ack", "transactionId": "t", "partitionId": "1"},
                              {"type": "push", "items": items}]}
    framed = client.transaction_frames(request)
    assert framed is not None
    body = framed[0]
    assert body[:4] == b"QTB1"
    groups, count = read_frame_groups(body, 9 + struct.unpack_from("<I", body, 5)[0])
    assert count == 300 and len(groups) == 3
    grown = sum(len(zstandard.ZstdDecompressor().decompress(bytes(g.chunk))) - len(g.chunk)
                for g in groups)
    assert grown > 60_000  # 300 padded payloads squeeze well
    assert qtb1_decoded_size(body) == len(body) + grown
    # The same groups behind a QPB1 head grow by the same bytes.
    assert groups_growth(body, 9 + struct.unpack_from("<I", body, 5)[0]) == grown
    # What does not walk counts as its length, never less and never an error.
    assert qtb1_decoded_size(body[:12]) == 12
    assert qtb1_decoded_size(b"QTB1\x00" + struct.pack("<I", 1 << 30)) == 9
    assert qtb1_decoded_size(b'{"operations":[]}') == 17


@settings(max_examples=400, deadline=None)
@given(which=st.integers(0, 3), edits=st.lists(_corruption, min_size=1, max_size=4))
# found by hypothesis: an 11-byte zstd body declaring 3 decoded bytes counted as 5
@example(which=0, edits=[("cut", 3763, 0), ("cut", 235, 0), ("flip", 389, 1)])
def test_decoded_size_of_a_corrupted_body_is_a_size_never_an_error(
    which: int, edits: list[tuple]
) -> None:
    body = _corrupt(_valid_bodies()[which], edits)
    assert decoded_size(body) >= min(len(body), 9)


_name = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f/").filter(
        lambda c: ord(c) >= 0x20
    ),
    min_size=1,
    max_size=20,
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(
        st.fixed_dictionaries(
            {
                "queue": _name,
                "partition": _name,
                "payload": _json,
                "transactionId": st.text(max_size=12),
            }
        ),
        min_size=1,
        max_size=12,
    ),
    frames=st.booleans(),
)
def test_any_client_body_round_trips(items: list[dict], frames: bool) -> None:
    body = client.binary_push_body(items, frames)
    assert body is not None
    assert _flatten(parse_binary_push(body)) == _expected(items)


# --- name and payload helpers (JSON push shares them) -----------------------------------------


def test_name_rules_for_text_names() -> None:
    check_queue_name("orders.eu")
    check_queue_name("q" * 255)
    check_queue_name("é" * 127)  # 254 bytes
    check_partition_name("a/b")
    with pytest.raises(NameTooLong) as info:
        check_queue_name("é" * 128)
    assert info.value.limit == 255 and info.value.status == 413
    with pytest.raises(InvalidName):
        check_queue_name("")
    with pytest.raises(InvalidName):
        check_queue_name("a/b")
    with pytest.raises(InvalidName):
        check_partition_name("a\x00b")
    with pytest.raises(InvalidName):
        check_name("g\x7f", "consumerGroup")
    with pytest.raises(InvalidName) as name_info:
        check_queue_name("\t", index=4)
    assert name_info.value.index == 4 and name_info.value.field == "queue"


def test_check_payload() -> None:
    check_payload(b"")
    check_payload(b'{"a":1}')
    check_payload(memoryview(b" [1] "))
    with pytest.raises(InvalidPayload) as info:
        check_payload(b"{", index=9)
    assert info.value.index == 9 and info.value.code == "invalid_payload"
