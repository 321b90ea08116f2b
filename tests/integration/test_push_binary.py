"""Issue 3, binary push bodies on ``POST /api/v1/push`` (api.md 3.1-3.5), real broker process.

Bodies come from the 2.6 client's own encoders (``queen.http.push_binary``) where it has one,
otherwise they are built here field by field. In frames mode the client's zstd frame must be
stored byte for byte and the client's message ids returned; every malformed body is a 4xx with
the right code and stores nothing.
"""

from __future__ import annotations

import json
import struct
import time
import uuid

import httpx
import psycopg
import pytest
import zstandard
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from queen.http.push_binary import PushBatch, encode_push_binary, encode_push_frames

from queen_mp.wire.frames import iter_frames
from tests.integration.test_push_json import (
    PUSH,
    RESULT_KEYS,
    assert_nothing_stored,
    decode_blob,
    is_uuid7,
    segment_rows,
    stored_messages,
    uq,
)

CT = {"content-type": "application/x-queen-push"}
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")


# ---------------------------------------------------------------------------------- builders
def post(client: httpx.Client, body: bytes) -> httpx.Response:
    return client.post(PUSH, content=body, headers=CT)


def s16(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return U16.pack(len(raw)) + raw


def plain_body(groups: list[tuple[str, str, list[tuple[str | None, bytes]]]], *,
               flags: int = 4, zstd: bool = False, content_size: bool = True,
               raw_len_delta: int = 0) -> bytes:
    """A QPB1 plain body built by hand (api.md 3.4). Items are (transactionId, payload)."""
    body = bytearray(U32.pack(len(groups)))
    for queue, partition, items in groups:
        body += s16(queue) + s16(partition) + U32.pack(len(items))
        for txn, payload in items:
            if flags & 4:
                body += s16(txn or "")
            body += U32.pack(len(payload)) + payload
    if not zstd:
        return b"QPB1" + bytes([flags]) + bytes(body)
    z = zstandard.ZstdCompressor(write_content_size=content_size).compress(bytes(body))
    return b"QPB1" + bytes([flags | 1]) + U32.pack(len(body) + raw_len_delta) + z


def frame(mid: bytes, txn: str | bytes, payload: bytes, *, trace: bytes | None = None,
          flags: int = 0, body_len_delta: int = 0) -> bytes:
    """One message frame (api.md 3.1)."""
    t = txn.encode() if isinstance(txn, str) else txn
    if trace is not None:
        flags |= 1
    body = bytes([flags]) + mid + (trace or b"") + s16(t) + payload
    return U32.pack(len(body) + body_len_delta) + body


def uuid7() -> bytes:
    b = bytearray(uuid.uuid4().bytes)
    b[:6] = (time.time_ns() // 1_000_000).to_bytes(6, "big")
    b[6] = 0x70 | (b[6] & 0x0F)
    b[8] = 0x80 | (b[8] & 0x3F)
    return bytes(b)


def frames_body(groups: list[tuple[str, str, int, bytes]], *, flags: int = 8) -> bytes:
    """A QPB1 frames body (api.md 3.5) from (queue, partition, n, zstd frame) groups."""
    out = bytearray(b"QPB1" + bytes([flags]) + U32.pack(len(groups)))
    for queue, partition, n, z in groups:
        out += s16(queue) + s16(partition) + U32.pack(n) + U32.pack(len(z)) + z
    return bytes(out)


def z(data: bytes, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=content_size).compress(data)


def parse_frames_body(body: bytes) -> list[tuple[str, str, int, bytes, list]]:
    """The groups of a frames body as the client built it: (queue, partition, n, z, frames)."""
    assert body[:4] == b"QPB1" and body[4] & 8
    (count,) = U32.unpack_from(body, 5)
    at = 9
    out = []
    for _ in range(count):
        (ql,) = U16.unpack_from(body, at)
        queue = body[at + 2:at + 2 + ql].decode()
        at += 2 + ql
        (pl,) = U16.unpack_from(body, at)
        partition = body[at + 2:at + 2 + pl].decode()
        at += 2 + pl
        n, zl = struct.unpack_from("<II", body, at)
        at += 8
        zz = body[at:at + zl]
        at += zl
        frames = list(iter_frames(zstandard.ZstdDecompressor().decompress(zz)))
        assert len(frames) == n
        out.append((queue, partition, n, zz, frames))
    assert at == len(body)
    return out


def stored_chunks(db, queue: str) -> list[tuple[str, int, int, bytes, bytes]]:
    """(partition, count, codec, chunk data, whole blob) of every stored chunk of ``queue``."""
    out = []
    for name, _pid, _base, _count, _created, blob in segment_rows(db, queue):
        for count, codec, data, _frames in decode_blob(blob):
            out.append((name, count, codec, data, bytes(blob)))
    return out


# ------------------------------------------------------------------------------ plain QPB1
def test_plain_flag_4_from_the_client_encoder(broker, db):
    q = uq("bin")
    body = encode_push_binary([
        PushBatch(q, "p1", [b'{"a":1}', b'"s"', b"", b'{ "spaced" : [1, 2] }'],
                  ["t1", "", "t3", "t4"]),
        PushBatch(q, "", [b"[1,2]"], ["t5"]),
    ])
    assert body[4] == 0x04
    r = post(broker.client, body)
    assert r.status_code == 201, r.text
    res = r.json()
    assert len(res) == 5 and all(set(x) == RESULT_KEYS for x in res)
    assert [x["index"] for x in res] == [0, 1, 2, 3, 4]
    assert [x["status"] for x in res] == ["queued"] * 5
    assert [x["partition"] for x in res] == ["p1"] * 4 + ["Default"]
    assert [x["offset"] for x in res] == [1, 2, 3, 4, 1]
    assert [x["transactionId"] for x in res] == ["t1", res[1]["messageId"], "t3", "t4", "t5"]
    assert all(is_uuid7(x["messageId"]) and x["traceId"] is None for x in res)
    by_id = {m.message_id: m for m in stored_messages(db, q)}
    # payloads are stored verbatim (JSON pops splice them as they are)
    assert [by_id[x["messageId"]].payload for x in res] == [
        b'{"a":1}', b'"s"', b"", b'{ "spaced" : [1, 2] }', b"[1,2]"]
    assert [by_id[x["messageId"]].transaction_id for x in res] == [
        x["transactionId"] for x in res]
    assert {by_id[x["messageId"]].partition for x in res} == {"p1", "Default"}


def test_plain_without_transaction_ids_flag_0(broker, db):
    q = uq("bin")
    body = encode_push_binary([PushBatch(q, "p", [b"1", b"2", b"3"])])
    assert body[4] == 0
    r = post(broker.client, body)
    assert r.status_code == 201, r.text
    res = r.json()
    assert [x["offset"] for x in res] == [1, 2, 3]
    assert all(x["transactionId"] == x["messageId"] for x in res)
    assert [m.payload for m in stored_messages(db, q)] == [b"1", b"2", b"3"]


def test_plain_zstd_flag_1(broker, db):
    q = uq("bin")
    body = encode_push_binary([PushBatch(q, "z", [b'{"n":%d}' % i for i in range(50)],
                                         [f"z{i}" for i in range(50)])], compress=True)
    assert body[4] == 0x05
    r = post(broker.client, body)
    assert r.status_code == 201, r.text
    assert [x["offset"] for x in r.json()] == list(range(1, 51))
    hand = plain_body([(q, "z", [(None, b'"hand"'), (None, b"null")])], flags=0, zstd=True)
    assert hand[4] == 0x01
    r = post(broker.client, hand)
    assert r.status_code == 201, r.text
    assert [x["offset"] for x in r.json()] == [51, 52]
    msgs = stored_messages(db, q)
    assert [m.payload for m in msgs[-3:]] == [b'{"n":49}', b'"hand"', b"null"]


def test_counts_only_flag_2(broker, db):
    q = uq("bin")
    batches = [PushBatch(q, "c", [b"1", b"2", b"3"], ["a", "b", "c"])]
    r = post(broker.client, encode_push_binary(batches, counts=True))
    assert r.status_code == 201, r.text
    assert r.json() == {"count": 3, "queued": 3, "duplicate": 0, "buffered": 0, "failed": 0,
                        "error": 0}
    batches = [PushBatch(q, "c", [b"1", b"4", b"1"], ["a", "d", "a"])]
    r = post(broker.client, encode_push_binary(batches, counts=True, compress=True))
    assert r.status_code == 201, r.text
    assert r.json() == {"count": 3, "queued": 1, "duplicate": 2, "buffered": 0, "failed": 0,
                        "error": 0}
    assert [m.transaction_id for m in stored_messages(db, q)] == ["a", "b", "c", "d"]


def test_invalid_payload_index_is_the_wire_position(broker, db):
    q = uq("bin")
    body = encode_push_binary([PushBatch(q, "a", [b"1", b"2"], ["x", "y"]),
                               PushBatch(q, "b", [b"3", b"{nope", b"5"], ["z", "w", "v"])])
    r = post(broker.client, body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_payload"
    assert r.json()["index"] == 3
    assert_nothing_stored(db, q)


# ------------------------------------------------------------------------------ frames mode
def test_frames_mode_stores_the_clients_zstd_frame_byte_for_byte(broker, db):
    q = uq("frm")
    batches = [PushBatch(q, "f1", [b'{"i":%d}' % i for i in range(20)],
                         [f"f1-{i}" if i % 3 else "" for i in range(20)]),
               PushBatch(q, "f2", [b'"x"', b"[]"], ["f2-0", "f2-1"]),
               PushBatch(q, "f1", [b'"tail"'], ["f1-tail"])]
    body = encode_push_frames(batches)
    assert body[4] == 0x08
    groups = parse_frames_body(body)
    r = post(broker.client, body)
    assert r.status_code == 201, r.text
    res = r.json()
    client_ids = [str(uuid.UUID(bytes=f.message_id)) for g in groups for f in g[4]]
    client_txns = [f.transaction_id for g in groups for f in g[4]]
    assert [x["messageId"] for x in res] == client_ids
    assert [x["transactionId"] for x in res] == client_txns
    assert all(x["status"] == "queued" for x in res)
    assert [x["partition"] for x in res] == ["f1"] * 20 + ["f2"] * 2 + ["f1"]
    assert [x["offset"] for x in res] == [*range(1, 21), 1, 2, 21]
    chunks = stored_chunks(db, q)
    for _queue, partition, n, zz, _frames in groups:
        matching = [c for c in chunks if c[0] == partition and c[3] == zz]
        assert matching, f"client zstd frame of {partition} not stored as a chunk"
        assert matching[0][1] == n and matching[0][2] == 1  # count n, codec zstd
        assert zz in matching[0][4]
    stored = {m.message_id: m for m in stored_messages(db, q)}
    for x in res:
        m = stored[x["messageId"]]
        assert (m.partition, m.offset, m.transaction_id) == (
            x["partition"], x["offset"], x["transactionId"])


def test_frames_mode_counts_only_0x0a(broker, db):
    q = uq("frm")
    body = encode_push_frames([PushBatch(q, "c", [b"1", b"2"], ["a", "b"])], counts=True)
    assert body[4] == 0x0A
    r = post(broker.client, body)
    assert r.status_code == 201, r.text
    assert r.json() == {"count": 2, "queued": 2, "duplicate": 0, "buffered": 0, "failed": 0,
                        "error": 0}
    r = post(broker.client, encode_push_frames([PushBatch(q, "c", [b"3"], ["a"])], counts=True))
    assert r.json()["duplicate"] == 1 and r.json()["queued"] == 0
    [(_, _, _, zz, _)] = parse_frames_body(body)
    assert any(c[3] == zz for c in stored_chunks(db, q))
    assert len(stored_messages(db, q)) == 2


def test_frames_mode_duplicates_report_the_original_ids(broker, db):
    q = uq("frm")
    first = encode_push_frames([PushBatch(q, "d", [b"1", b"2"], ["a", "b"])])
    r1 = post(broker.client, first).json()
    # a stored duplicate: the original (first client's) id, not the one minted for the repeat
    second = encode_push_frames([PushBatch(q, "d", [b"9", b"3", b"9"], ["b", "c", "c"])])
    ids2 = [str(uuid.UUID(bytes=f.message_id)) for f in parse_frames_body(second)[0][4]]
    r2 = post(broker.client, second)
    assert r2.status_code == 201, r2.text
    r2 = r2.json()
    assert [x["status"] for x in r2] == ["duplicate", "queued", "duplicate"]
    assert (r2[0]["messageId"], r2[0]["offset"]) == (r1[1]["messageId"], 2)
    assert (r2[1]["messageId"], r2[1]["offset"]) == (ids2[1], 3)
    assert (r2[2]["messageId"], r2[2]["offset"]) == (ids2[1], 3)
    msgs = stored_messages(db, q)
    assert [(m.message_id, m.payload) for m in msgs] == [
        (r1[0]["messageId"], b"1"), (r1[1]["messageId"], b"2"), (ids2[1], b"3")]


def test_frames_mode_trace_flag_is_kept_and_echoed(broker, db):
    q = uq("frm")
    trace = uuid.uuid4()
    mids = [uuid7(), uuid7()]
    raw = frame(mids[0], "tr-1", b'{"t":1}', trace=trace.bytes) + frame(mids[1], "tr-2", b"")
    zz = z(raw)
    r = post(broker.client, frames_body([(q, "", 2, zz)]))
    assert r.status_code == 201, r.text
    res = r.json()
    assert [x["messageId"] for x in res] == [str(uuid.UUID(bytes=m)) for m in mids]
    assert [x["traceId"] for x in res] == [str(trace), None]
    assert [x["partition"] for x in res] == ["Default", "Default"]
    msgs = stored_messages(db, q)
    assert [(m.trace_id, m.flags, m.payload) for m in msgs] == [
        (str(trace), 1, b'{"t":1}'), (None, 0, b"")]
    assert any(c[3] == zz for c in stored_chunks(db, q))


def test_decompressed_limit_is_413(make_broker, db_dsn):
    b = make_broker(db_dsn, QUEEN_MAX_DECOMPRESSED_MB="1")
    q1, q2, q3 = uq("big"), uq("big"), uq("big")
    big = b'"' + b"x" * (2 << 20) + b'"'
    r = post(b.client, frames_body([(q1, "p", 1, z(frame(uuid7(), "t", big)))]))
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "body_too_large"
    r = post(b.client, plain_body([(q2, "p", [("t", big)])], zstd=True))
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "body_too_large"
    small = b'"' + b"x" * 500_000 + b'"'
    r = post(b.client, frames_body([(q3, "p", 1, z(frame(uuid7(), "t", small)))]))
    assert r.status_code == 201, r.text
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert_nothing_stored(conn, q1, q2)
        assert len(stored_messages(conn, q3)) == 1


# ------------------------------------------------------------------------------ malformed
def _ok_items() -> list[tuple[str, bytes]]:
    return [("t1", b'{"x":1}'), ("t2", b"2")]


def _frames(q: str, frames: list[bytes], n: int | None = None, *, flags: int = 8,
            content_size: bool = True) -> bytes:
    return frames_body([(q, "p", len(frames) if n is None else n,
                         z(b"".join(frames), content_size))], flags=flags)


def _malformed(q: str) -> dict[str, tuple[bytes, str | tuple[str, ...]]]:
    ok = plain_body([(q, "p", _ok_items())])
    okz = plain_body([(q, "p", _ok_items())], zstd=True)
    f_ok = [frame(uuid7(), "a", b"1"), frame(uuid7(), "b", b'{"k":2}')]
    zz = z(b"".join(f_ok))
    two_groups = bytearray(ok)
    two_groups[5:9] = U32.pack(2)
    long_payload = bytearray(ok)
    # first item: u16 txn len (2) + "t1" then u32 payload length
    at = 9 + 2 + len(q.encode()) + 2 + 1 + 4 + 2 + 2
    assert U32.unpack_from(long_payload, at)[0] == 7
    long_payload[at:at + 4] = U32.pack(7000)
    more_items = bytearray(ok)
    n_at = 9 + 2 + len(q.encode()) + 2 + 1
    more_items[n_at:n_at + 4] = U32.pack(3)
    bad_zstd = bytearray(okz)
    bad_zstd[9:13] = b"\x00\x01\x02\x03"
    z_magic = bytearray(zz)
    z_magic[0] ^= 0xFF
    v4 = bytearray(uuid.uuid4().bytes)
    return {
        "plain truncated": (ok[:-3], "bad_frame"),
        "plain truncated in header": (ok[:7], "bad_frame"),
        "magic only": (b"QPB1", "bad_frame"),
        "magic and flags only": (b"QPB1\x04", "bad_frame"),
        "group count larger than groups": (bytes(two_groups), "bad_frame"),
        "payload length runs past the end": (bytes(long_payload), "bad_frame"),
        "item count larger than items": (bytes(more_items), "bad_frame"),
        "plain trailing bytes": (ok + b"\x00", "bad_frame"),
        "unknown flag 0x10": (b"QPB1\x14" + ok[5:], "unsupported_flags"),
        "unknown flag 0x80": (b"QPB1\x84" + ok[5:], "unsupported_flags"),
        "frames combined with txn flag": (b"QPB1\x0c" + _frames(q, f_ok)[5:],
                                          "unsupported_flags"),
        "frames combined with zstd flag": (b"QPB1\x09" + _frames(q, f_ok)[5:],
                                           "unsupported_flags"),
        "non-JSON payload": (plain_body([(q, "p", [("t1", b"1"), ("t2", b"not json")])]),
                             "invalid_payload"),
        "payload not UTF-8": (plain_body([(q, "p", [("t1", b'"\xff\xfe"')])]),
                              "invalid_payload"),
        "two JSON documents": (plain_body([(q, "p", [("t1", b"1 2")])]), "invalid_payload"),
        "empty queue name": (plain_body([("", "p", _ok_items())]), "invalid_name"),
        "slash in queue name": (plain_body([(q + "/x", "p", _ok_items())]), "invalid_name"),
        "control char in partition": (plain_body([(q, "a\x02", _ok_items())]),
                                      "invalid_name"),
        "256-byte queue name": (plain_body([("q" * 256, "p", _ok_items())]), "name_too_long"),
        "256-byte partition": (plain_body([(q, "p" * 256, _ok_items())]), "name_too_long"),
        "1025-byte transactionId": (plain_body([(q, "p", [("t" * 1025, b"1")])]),
                                    "name_too_long"),
        "transactionId not UTF-8": (plain_body([(q, "p", [(b"\xff\xfe", b"1")])]),
                                    "bad_frame"),
        "zstd body corrupt": (bytes(bad_zstd), "bad_frame"),
        "zstd body without content size":
            (plain_body([(q, "p", _ok_items())], zstd=True, content_size=False), "bad_frame"),
        "zstd raw_len mismatch":
            (plain_body([(q, "p", _ok_items())], zstd=True, raw_len_delta=1), "bad_frame"),
        "zstd body with trailing bytes": (okz + b"\x01\x02", "bad_frame"),
        "zstd body truncated": (okz[:-2], "bad_frame"),
        "QTB1 magic on /push": (b"QTB1\x00" + U32.pack(2) + b"{}" + U32.pack(0), "bad_frame"),
        "frames truncated": (_frames(q, f_ok)[:-1], "bad_frame"),
        "frames bad zstd magic": (frames_body([(q, "p", 2, bytes(z_magic))]), "bad_frame"),
        "frames zstd without content size": (_frames(q, f_ok, content_size=False),
                                             "bad_frame"),
        "frames n larger than frames": (_frames(q, f_ok, 3), "bad_frame"),
        "frames n smaller than frames": (_frames(q, f_ok, 1), "bad_frame"),
        "frames z_len past the end": (frames_body([(q, "p", 2, zz)])[:-5], "bad_frame"),
        "frames trailing bytes": (_frames(q, f_ok) + b"\x00", "bad_frame"),
        "frame flag 2 (producerSub) from a client":
            (_frames(q, [f_ok[0], frame(uuid7(), "c", b"1", flags=2)]), "bad_frame"),
        "frame flag 4 (encrypted) from a client":
            (_frames(q, [frame(uuid7(), "c", b"1", flags=4)]), "bad_frame"),
        "frame unknown flag bit":
            (_frames(q, [frame(uuid7(), "c", b"1", flags=0x10)]),
             ("bad_frame", "unsupported_flags")),
        "frame id not a UUIDv7": (_frames(q, [frame(bytes(v4), "c", b"1")]), "bad_frame"),
        "frame empty transactionId": (_frames(q, [frame(uuid7(), "", b"1")]), "bad_frame"),
        "frame 1025-byte transactionId":
            (_frames(q, [frame(uuid7(), "t" * 1025, b"1")]), ("name_too_long", "bad_frame")),
        "frame body_len past the chunk":
            (_frames(q, [frame(uuid7(), "c", b"1", body_len_delta=4)]), "bad_frame"),
        "frame body_len too short":
            (_frames(q, [frame(uuid7(), "c", b"1", body_len_delta=-4)]), "bad_frame"),
        "frame non-JSON payload":
            (_frames(q, [f_ok[0], frame(uuid7(), "c", b"{oops")]), "invalid_payload"),
        "frames empty queue name": (frames_body([("", "p", 2, zz)]), "invalid_name"),
    }


_MALFORMED = sorted(_malformed("q"))


@pytest.mark.parametrize("case", _MALFORMED)
def test_malformed_binary_body_is_400_and_stores_nothing(broker, db, case):
    q = uq("mal")
    body, code = _malformed(q)[case]
    r = post(broker.client, body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()
    codes = code if isinstance(code, tuple) else (code,)
    assert err["code"] in codes, err
    expected_status = 413 if err["code"] in ("name_too_long", "body_too_large") else 400
    assert r.status_code == expected_status
    assert isinstance(err["error"], str) and err["error"]
    assert_nothing_stored(db, q, q + "/x")


def test_invalid_payload_and_bad_frame_carry_position_details(broker, db):
    q = uq("mal")
    f_ok = [frame(uuid7(), "a", b"1"), frame(uuid7(), "b", b"{bad")]
    r = post(broker.client, _frames(q, f_ok))
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_payload" and r.json()["index"] == 1
    r = post(broker.client, plain_body([(q, "p", _ok_items())]) + b"\x00\x00")
    assert r.status_code == 400 and r.json()["code"] == "bad_frame"
    assert isinstance(r.json().get("offset"), int)
    assert_nothing_stored(db, q)


# ------------------------------------------------------------------------------ property
def _valid_bodies(q: str) -> list[bytes]:
    payloads = [b'{"a":1}', b'"two words of text"', b"", b"[3]", b'{"k":"vvvvvvvvvvvvvv"}']
    txns = ["k1", "", "k3", "k4", "k5"]
    return [
        encode_push_binary([PushBatch(q, "p", payloads, txns)]),
        encode_push_binary([PushBatch(q, "p", payloads, txns), PushBatch(q, "", [b"5"])],
                           compress=True),
        encode_push_frames([PushBatch(q, "p", payloads, txns)]),
        encode_push_binary([PushBatch(q, "p", payloads)], counts=True),
    ]


# positions as a fraction of the body, so corruptions spread over the whole body
_where = st.integers(0, 255)
_mutation = st.one_of(
    st.tuples(st.just("flip"), _where, st.integers(1, 255)),
    st.tuples(st.just("truncate"), _where, st.just(0)),
    st.tuples(st.just("insert"), _where, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), _where, st.integers(1, 8)),
)


def _mutate(body: bytes, mutations: list[tuple]) -> bytes:
    b = bytearray(body)
    for kind, where, arg in mutations:
        if not b:
            break
        i = (where * len(b)) >> 8
        if kind == "flip":
            b[i] ^= arg
        elif kind == "truncate":
            del b[i:]
        elif kind == "insert":
            b[i:i] = arg
        else:
            del b[i:i + arg]
    return bytes(b)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.integers(0, 3), mutations=st.lists(_mutation, min_size=1, max_size=3))
def test_corrupted_bodies_get_201_or_4xx_never_5xx(broker, db_dsn, which, mutations):
    q = uq("fz")
    body = _mutate(_valid_bodies(q)[which], mutations)
    try:
        r = post(broker.client, body)
    except httpx.HTTPError as ex:  # pragma: no cover - the failure we look for
        pytest.fail(f"connection error on a corrupted body: {ex!r}")
    assert r.status_code == 201 or 400 <= r.status_code < 500, (r.status_code, r.text)
    answer = r.json()
    event(f"{r.status_code} {answer.get('code') if isinstance(answer, dict) else 'list'}")
    if r.status_code == 201:
        if isinstance(answer, list):
            assert all(x["status"] in ("queued", "duplicate") for x in answer), answer
        else:
            assert answer["failed"] == 0 and answer["buffered"] == 0, answer
    else:
        assert isinstance(answer.get("code"), str), answer
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            assert_nothing_stored(conn, q)
    assert broker.client.get("/health").status_code == 200


def test_broker_is_healthy_after_the_corruption_run(broker):
    r = broker.client.get("/health")
    assert r.status_code == 200 and r.json()["shards"]["alive"] == r.json()["shards"]["total"]
    ok = encode_push_binary([PushBatch(uq("fz"), "p", [b"1"], ["x"])])
    assert post(broker.client, ok).status_code == 201


def test_json_body_still_parses_when_it_is_not_qpb1(broker, db):
    q = uq("bin")
    r = broker.client.post(PUSH, content=json.dumps({"items": [{"queue": q, "payload": 1}]}),
                           headers=CT)  # dispatch is on the first bytes, not Content-Type
    assert r.status_code == 201, r.text
    assert len(stored_messages(db, q)) == 1
