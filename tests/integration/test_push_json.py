"""Issue 3, push path: ``POST /api/v1/push`` with JSON bodies, against the real broker process.

api.md 1.3, 1.4, 1.7, 2.1; life-of-a-push 1-6. Every result is checked against what is really in
PostgreSQL: the segments are decoded (chunks of api.md 3.2, frames of 3.1) and compared message
by message. The helpers at the top are shared with the other ``test_push_*`` files.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import gzip
import json
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
import xxhash
import zstandard

from queen_mp.wire.frames import FLAG_TRACE, decode_chunk, iter_chunks, iter_frames
from queen_mp.wire.ids import uuid_text

PUSH = "/api/v1/push"
ISO_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
UUID_TEXT = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ZERO_UUID_TEXT = "00000000-0000-0000-0000-000000000000"
RESULT_KEYS = {
    "index", "status", "messageId", "transactionId", "queue", "partition", "partitionId",
    "offset", "createdAt", "traceId", "error", "message_id", "transaction_id", "partition_id",
    "trace_id", "queueName",
}


# ---------------------------------------------------------------------------------- helpers
def uq(prefix: str = "pj") -> str:
    """A queue name no other test (nor an earlier run on the shared broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class StoredMessage:
    partition: str
    partition_id: int
    offset: int
    message_id: str
    transaction_id: str
    trace_id: str | None
    flags: int
    payload: bytes
    created_at: dt.datetime


def segment_rows(conn: psycopg.Connection, queue: str) -> list[tuple]:
    """(partition name, partition id, base_offset, msg_count, created_at, payload) of a queue."""
    return conn.execute(
        "SELECT lp.name, lp.id, s.base_offset, s.msg_count, s.created_at, s.payload "
        "FROM queen.log_segments s "
        "JOIN queen.log_partitions lp ON lp.id = s.partition_id "
        "JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.name = %s ORDER BY lp.id, s.base_offset", (queue,)).fetchall()


def decode_blob(blob: bytes) -> list[tuple[int, int, bytes, list]]:
    """The chunks of a payload blob as (count, codec, chunk data, frames)."""
    out = []
    for chunk in iter_chunks(bytes(blob)):
        raw = decode_chunk(chunk.codec, chunk.data, max_size=1 << 30)
        frames = list(iter_frames(bytes(raw)))
        assert len(frames) == chunk.count, (len(frames), chunk.count)
        out.append((chunk.count, chunk.codec, bytes(chunk.data), frames))
    return out


def stored_messages(conn: psycopg.Connection, queue: str) -> list[StoredMessage]:
    """Every message of ``queue`` as stored, in (partition id, offset) order."""
    out: list[StoredMessage] = []
    for name, pid, base, count, created, blob in segment_rows(conn, queue):
        k = 0
        for _, _, _, frames in decode_blob(blob):
            for f in frames:
                out.append(StoredMessage(
                    name, pid, base + k, uuid_text(f.message_id), f.transaction_id,
                    uuid_text(f.trace_id) if f.trace_id else None, f.flags, bytes(f.payload),
                    created))
                k += 1
        assert k == count, f"segment {pid}/{base}: msg_count {count}, {k} frames"
    return out


def queue_footprint(conn: psycopg.Connection, queue: str) -> tuple[int, int, int, int]:
    """Rows of (queues, log_partitions, log_segments, log_txns) belonging to ``queue``."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM queen.queues WHERE name = %(q)s), "
        " (SELECT count(*) FROM queen.log_partitions lp JOIN queen.queues q "
        "    ON q.id = lp.queue_id WHERE q.name = %(q)s), "
        " (SELECT count(*) FROM queen.log_segments s JOIN queen.log_partitions lp "
        "    ON lp.id = s.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
        "    WHERE q.name = %(q)s), "
        " (SELECT count(*) FROM queen.log_txns t JOIN queen.log_partitions lp "
        "    ON lp.id = t.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
        "    WHERE q.name = %(q)s)", {"q": queue}).fetchone()


def assert_nothing_stored(conn: psycopg.Connection, *queues: str) -> None:
    for q in queues:
        assert queue_footprint(conn, q) == (0, 0, 0, 0), f"queue {q!r} has rows after a 4xx"


def partition_state(conn: psycopg.Connection, queue: str, partition: str) -> tuple[int, int]:
    """(partition id, last_offset)."""
    row = conn.execute(
        "SELECT lp.id, lp.last_offset FROM queen.log_partitions lp "
        "JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s AND lp.name = %s",
        (queue, partition)).fetchone()
    assert row is not None, (queue, partition)
    return row


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def is_uuid7(text: str) -> bool:
    u = uuid.UUID(text)
    return u.version == 7 and u.variant == uuid.RFC_4122


def push(client: httpx.Client, items: list[dict]) -> list[dict]:
    r = client.post(PUSH, json={"items": items})
    assert r.status_code == 201, r.text
    body = r.json()
    assert isinstance(body, list) and len(body) == len(items)
    return body


# ---------------------------------------------------------------------------- happy paths
def test_single_item_answer_has_every_field_of_api_2_1(broker, db):
    q = uq()
    trace = str(uuid.uuid4())
    before = dt.datetime.now(dt.UTC)
    r = broker.client.post(PUSH, json={"items": [
        {"queue": q, "partition": "customer-42", "transactionId": "order-1001",
         "payload": {"total": 30}, "traceId": trace}]})
    after = dt.datetime.now(dt.UTC)
    assert r.status_code == 201, r.text
    assert r.headers["content-type"].startswith("application/json")
    [res] = r.json()
    assert set(res) == RESULT_KEYS
    assert res["index"] == 0
    assert res["status"] == "queued"
    assert res["error"] is None
    assert UUID_TEXT.match(res["messageId"]) and is_uuid7(res["messageId"])
    assert res["message_id"] == res["messageId"]
    assert res["transactionId"] == res["transaction_id"] == "order-1001"
    assert res["queue"] == res["queueName"] == q
    assert res["partition"] == "customer-42"
    assert isinstance(res["partitionId"], str) and res["partitionId"].isdecimal()
    assert res["partition_id"] == res["partitionId"]
    assert type(res["offset"]) is int and res["offset"] == 1
    assert res["traceId"] == res["trace_id"] == trace
    assert ISO_MS_Z.match(res["createdAt"]), res["createdAt"]
    created = dt.datetime.strptime(res["createdAt"], "%Y-%m-%dT%H:%M:%S.%f%z")
    assert before - dt.timedelta(seconds=2) <= created <= after + dt.timedelta(seconds=2)

    pid, last = partition_state(db, q, "customer-42")
    assert str(pid) == res["partitionId"] and last == 1
    [m] = stored_messages(db, q)
    assert m.offset == 1 and m.message_id == res["messageId"]
    assert m.transaction_id == "order-1001"
    assert m.flags == FLAG_TRACE and m.trace_id == trace
    assert m.payload == b'{"total":30}'
    # createdAt is the segment's commit time, rendered to the millisecond
    assert abs((m.created_at - created).total_seconds()) < 0.001
    [(hashes,)] = db.execute("SELECT hashes FROM queen.log_txns WHERE partition_id = %s",
                             (pid,)).fetchall()
    assert bytes(hashes) == xxhash.xxh3_128_digest(b"order-1001")
    # api.md 3.2: a segment of one JSON frame stores it raw (codec 0), the frame as framed
    [(_, _, base, count, _, blob)] = segment_rows(db, q)
    assert (base, count) == (1, 1)
    [(n, codec, data, frames)] = decode_blob(blob)
    assert (n, codec) == (1, 0)
    assert bytes(data) == bytes(frames[0].raw)


def test_empty_items_is_201_empty_array(broker):
    r = broker.client.post(PUSH, json={"items": []})
    assert r.status_code == 201
    assert r.json() == []


def test_default_partition_and_data_when_payload_absent(broker, db):
    q = uq()
    res = push(broker.client, [
        {"queue": q, "data": {"from": "data"}},
        {"queue": q, "partition": None, "payload": {"from": "payload"}, "data": "ignored"},
        {"queue": q, "payload": None, "data": "ignored too"},
        {"queue": q},
    ])
    assert [r["status"] for r in res] == ["queued"] * 4
    assert {r["partition"] for r in res} == {"Default"}
    assert [r["offset"] for r in res] == [1, 2, 3, 4]
    # no transactionId: the message id text is the transactionId
    assert all(r["transactionId"] == r["messageId"] for r in res)
    assert all(r["traceId"] is None and r["trace_id"] is None for r in res)
    msgs = stored_messages(db, q)
    assert [m.partition for m in msgs] == ["Default"] * 4
    assert [m.payload for m in msgs] == [b'{"from":"data"}', b'{"from":"payload"}', b"", b""]
    assert [m.flags for m in msgs] == [0, 0, 0, 0]
    assert [m.transaction_id for m in msgs] == [r["messageId"] for r in res]


def test_payload_is_stored_as_compact_json_byte_exact(broker, db):
    q = uq()
    values = [
        {"b": 1, "a": [1, 2.5, "é", None, True, False], "nested": {"k": {"x": "日本"}}},
        "a string with \"quotes\" and \\ backslash and /slash",
        0, -17, 3.25, [], {}, True, "line\nbreak\ttab",
    ]
    res = push(broker.client, [{"queue": q, "payload": v} for v in values])
    assert all(r["status"] == "queued" for r in res)
    msgs = stored_messages(db, q)
    assert [m.payload for m in msgs] == [compact(v) for v in values]
    assert [json.loads(m.payload) for m in msgs] == values
    # the request's whitespace does not survive; the order of keys does
    raw = '{"items":[{"queue":"' + q + '","payload": { "z" : 1 ,\n "a" : [ 1 , 2 ] } }]}'
    r = broker.client.post(PUSH, content=raw.encode(),
                           headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert stored_messages(db, q)[-1].payload == b'{"z":1,"a":[1,2]}'


def test_empty_transaction_id_means_the_message_id(broker, db):
    q = uq()
    res = push(broker.client, [{"queue": q, "transactionId": "", "payload": 1},
                               {"queue": q, "transactionId": "", "payload": 2}])
    # two "" are not repeats of each other: each gets its own id as transactionId
    assert [r["status"] for r in res] == ["queued", "queued"]
    assert [r["transactionId"] for r in res] == [r["messageId"] for r in res]
    assert [m.transaction_id for m in stored_messages(db, q)] == [r["messageId"] for r in res]


def test_payload_big_integers_are_not_rounded(broker, db):
    q = uq()
    raw = '{"items":[{"queue":"' + q + '","payload":{"big":123456789012345678901234567890}}]}'
    r = broker.client.post(PUSH, content=raw.encode(),
                           headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    [m] = stored_messages(db, q)
    assert m.payload == b'{"big":123456789012345678901234567890}'


def test_more_than_100000_items_is_400_and_stores_nothing(broker, db):
    q = uq()
    body = json.dumps({"items": [{"queue": q}] * 100_001}).encode()
    r = broker.client.post(PUSH, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["code"] == "invalid_request"
    assert_nothing_stored(db, q)


def test_trace_id_is_stored_with_frame_flag_1_and_echoed(broker, db):
    q = uq()
    traces = [str(uuid.uuid4()), None, str(uuid.uuid4())]
    items = [{"queue": q, "payload": i} for i in range(3)]
    for it, t in zip(items, traces, strict=True):
        if t:
            it["traceId"] = t
    res = push(broker.client, items)
    assert [r["traceId"] for r in res] == traces
    assert [r["trace_id"] for r in res] == traces
    msgs = stored_messages(db, q)
    assert [m.trace_id for m in msgs] == traces
    assert [m.flags & FLAG_TRACE for m in msgs] == [1, 0, 1]


def test_message_ids_are_uuidv7_and_increase_in_body_order(broker, db):
    q = uq()
    now_ms = time.time() * 1000
    res = push(broker.client, [{"queue": q, "payload": i} for i in range(200)])
    ids = [r["messageId"] for r in res]
    assert all(UUID_TEXT.match(i) and is_uuid7(i) for i in ids)
    raw = [uuid.UUID(i).bytes for i in ids]
    assert raw == sorted(raw) and len(set(raw)) == len(raw)
    for b in raw:  # 48-bit big-endian Unix ms
        assert abs(int.from_bytes(b[:6], "big") - now_ms) < 10_000
    assert [r["offset"] for r in res] == list(range(1, 201))
    assert [m.message_id for m in stored_messages(db, q)] == ids
    # a second request keeps increasing (same or later millisecond)
    more = push(broker.client, [{"queue": q, "payload": "x"}])
    assert more[0]["offset"] == 201


def test_several_queues_and_partitions_in_one_body(broker, db):
    q1, q2 = uq(), uq()
    items = [{"queue": q1, "partition": "a", "payload": 1},
             {"queue": q2, "partition": "a", "payload": 2},
             {"queue": q1, "partition": "b/with/slash", "payload": 3},
             {"queue": q1, "partition": "a", "payload": 4}]
    res = push(broker.client, items)
    assert [r["index"] for r in res] == [0, 1, 2, 3]
    assert [(r["queue"], r["partition"], r["offset"]) for r in res] == [
        (q1, "a", 1), (q2, "a", 1), (q1, "b/with/slash", 1), (q1, "a", 2)]
    assert res[0]["partitionId"] == res[3]["partitionId"] != res[2]["partitionId"]
    assert len({res[0]["partitionId"], res[1]["partitionId"], res[2]["partitionId"]}) == 3
    by_id = {m.message_id: m for m in stored_messages(db, q1) + stored_messages(db, q2)}
    for it, r in zip(items, res, strict=True):
        m = by_id[r["messageId"]]
        assert (m.partition, m.offset, json.loads(m.payload)) == (
            it["partition"], r["offset"], it["payload"])
        assert str(m.partition_id) == r["partitionId"]


def test_name_limits_are_bytes_not_characters(broker, db):
    q = uuid.uuid4().hex[:12] + "é" * 121 + "x"  # 255 bytes, 134 characters
    p = "ü" * 127 + "y"  # 255 bytes
    txn = "日" * 341 + "x"  # 1024 bytes
    assert len(q.encode()) == len(p.encode()) == 255 and len(txn.encode()) == 1024
    res = push(broker.client, [{"queue": q, "partition": p, "transactionId": txn, "payload": 1}])
    assert res[0]["status"] == "queued"
    [m] = stored_messages(db, q)
    assert m.partition == p and m.transaction_id == txn


# ---------------------------------------------------------------------------- 4xx, nothing stored
def _bad_cases(q: str, other: str) -> list[tuple[str, Any, int, str]]:
    ok = {"queue": q, "payload": {"ok": True}}
    return [
        ("malformed json", ('{"items":[{"queue":"' + q + '","payload":1}').encode(), 400,
         "invalid_request"),
        ("not json at all", b"hello", 400, "invalid_request"),
        ("empty body", b"", 400, "invalid_request"),
        ("body is an array", [ok], 400, "invalid_request"),
        ("items missing", {"item": [ok]}, 400, "invalid_request"),
        ("items not a list", {"items": ok}, 400, "invalid_request"),
        ("items null", {"items": None}, 400, "invalid_request"),
        ("item not an object", {"items": [ok, 5]}, 400, "invalid_request"),
        ("item is a list", {"items": [ok, [q]]}, 400, "invalid_request"),
        ("missing queue", {"items": [ok, {"payload": 1}]}, 400, "invalid_request"),
        ("queue not a string", {"items": [ok, {"queue": 7}]}, 400, "invalid_request"),
        ("queue null", {"items": [ok, {"queue": None}]}, 400, "invalid_request"),
        ("empty queue", {"items": [ok, {"queue": ""}]}, 400, "invalid_name"),
        ("control char in queue", {"items": [ok, {"queue": other + "\x01"}]}, 400,
         "invalid_name"),
        ("nul in queue", {"items": [ok, {"queue": other + "\x00x"}]}, 400, "invalid_name"),
        ("DEL in queue", {"items": [ok, {"queue": other + "\x7f"}]}, 400, "invalid_name"),
        ("slash in queue", {"items": [ok, {"queue": other + "/x"}]}, 400, "invalid_name"),
        ("control char in partition",
         {"items": [ok, {"queue": other, "partition": "a\nb"}]}, 400, "invalid_name"),
        ("partition not a string",
         {"items": [ok, {"queue": other, "partition": 3}]}, 400, "invalid_request"),
        ("non-UUID traceId", {"items": [ok, {"queue": other, "traceId": "not-a-uuid"}]},
         400, "invalid_request"),
        ("traceId almost a UUID",
         {"items": [ok, {"queue": other, "traceId": str(uuid.uuid4())[:-1] + "g"}]},
         400, "invalid_request"),
        ("traceId a number", {"items": [ok, {"queue": other, "traceId": 12}]}, 400,
         "invalid_request"),
        ("transactionId a number",
         {"items": [ok, {"queue": other, "transactionId": 5}]}, 400, "invalid_request"),
        ("transactionId an object",
         {"items": [ok, {"queue": other, "transactionId": {"a": 1}}]}, 400, "invalid_request"),
        ("256-byte queue name", {"items": [ok, {"queue": "q" * 256}]}, 413, "name_too_long"),
        ("256-byte queue name, 2-byte chars", {"items": [ok, {"queue": "é" * 128}]}, 413,
         "name_too_long"),
        ("256-byte partition name",
         {"items": [ok, {"queue": other, "partition": "p" * 256}]}, 413, "name_too_long"),
        ("1025-byte transactionId",
         {"items": [ok, {"queue": other, "transactionId": "t" * 1025}]}, 413, "name_too_long"),
        ("1025-byte transactionId, 3-byte chars",
         {"items": [ok, {"queue": other, "transactionId": "日" * 341 + "xy"}]}, 413,
         "name_too_long"),
    ]


_CASE_NAMES = [c[0] for c in _bad_cases("q", "o")]


@pytest.mark.parametrize("case", _CASE_NAMES)
def test_bad_request_is_4xx_with_code_and_stores_nothing(broker, db, case):
    q, other = uq(), uq()
    [(_, body, status, code)] = [c for c in _bad_cases(q, other) if c[0] == case]
    if isinstance(body, bytes):
        r = broker.client.post(PUSH, content=body, headers={"content-type": "application/json"})
    else:
        r = broker.client.post(PUSH, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["code"] == code
    assert isinstance(err["error"], str) and err["error"]
    assert r.headers["access-control-allow-origin"] == "*"
    assert_nothing_stored(db, q, other)


def test_content_encoding_gzip_and_zstd_are_decoded(broker, db):
    q = uq()
    body = json.dumps({"items": [{"queue": q, "payload": {"enc": "gzip", "pad": "x" * 300_000}},
                                 {"queue": q, "payload": {"enc": "gzip", "i": 2}}]}).encode()
    r = broker.client.post(PUSH, content=gzip.compress(body),
                           headers={"content-type": "application/json",
                                    "content-encoding": "gzip"})
    assert r.status_code == 201, r.text
    assert [x["offset"] for x in r.json()] == [1, 2]
    body = json.dumps({"items": [{"queue": q, "payload": {"enc": "zstd", "pad": "y" * 300_000}}]}
                      ).encode()
    r = broker.client.post(PUSH, content=zstandard.ZstdCompressor().compress(body),
                           headers={"content-type": "application/json",
                                    "content-encoding": "zstd"})
    assert r.status_code == 201, r.text
    assert r.json()[0]["offset"] == 3
    body = json.dumps({"items": [{"queue": q, "payload": "identity"}]}).encode()
    r = broker.client.post(PUSH, content=body, headers={"content-type": "application/json",
                                                        "content-encoding": "identity"})
    assert r.status_code == 201, r.text
    msgs = stored_messages(db, q)
    assert [json.loads(m.payload).get("enc") if m.offset < 4 else json.loads(m.payload)
            for m in msgs] == ["gzip", "gzip", "zstd", "identity"]
    assert json.loads(msgs[0].payload)["pad"] == "x" * 300_000


def test_gzip_body_of_several_members_is_decoded_whole(broker, db):
    q = uq()
    body = json.dumps({"items": [{"queue": q, "payload": "two members"}]}).encode()
    r = broker.client.post(PUSH, content=gzip.compress(body[:20]) + gzip.compress(body[20:]),
                           headers={"content-type": "application/json",
                                    "content-encoding": "gzip"})
    assert r.status_code == 201, r.text
    assert [m.payload for m in stored_messages(db, q)] == [b'"two members"']


@pytest.mark.parametrize("encoding", ["br", "deflate", "compress", "gzip, br"])
def test_other_content_encoding_is_415_and_stores_nothing(broker, db, encoding):
    q = uq()
    body = json.dumps({"items": [{"queue": q, "payload": 1}]}).encode()
    r = broker.client.post(PUSH, content=body, headers={"content-type": "application/json",
                                                        "content-encoding": encoding})
    assert r.status_code == 415, r.text
    assert r.json()["code"] == "unsupported_encoding"
    assert_nothing_stored(db, q)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_undecodable_encoded_body_is_400_and_stores_nothing(broker, db, encoding):
    q = uq()
    body = json.dumps({"items": [{"queue": q, "payload": 1}]}).encode()
    enc = gzip.compress(body) if encoding == "gzip" else zstandard.ZstdCompressor().compress(body)
    r = broker.client.post(PUSH, content=enc[: len(enc) // 2] + b"\xff" * 7,
                           headers={"content-encoding": encoding})
    assert r.status_code == 400, r.text
    assert r.json()["code"] in ("invalid_request", "bad_frame")
    assert_nothing_stored(db, q)


def test_body_limit_is_413_before_and_after_content_encoding(make_broker, db_dsn):
    b = make_broker(db_dsn, QUEEN_MAX_BODY_MB="1")
    q_big, q_chunked, q_gz, q_ok = uq(), uq(), uq(), uq()

    def body(q: str, size: int) -> bytes:
        return json.dumps({"items": [{"queue": q, "payload": "z" * size}]}).encode()

    two_mib = 2 << 20
    r = b.client.post(PUSH, content=body(q_big, two_mib),
                      headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "body_too_large"

    def stream():  # no Content-Length: the limit must hold while reading
        data = body(q_chunked, two_mib)
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    r = b.client.post(PUSH, content=stream(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "body_too_large"

    # 2 MiB of JSON gzips to a few KiB: the decoded size counts against the limit
    r = b.client.post(PUSH, content=gzip.compress(body(q_gz, two_mib)),
                      headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "body_too_large"

    r = b.client.post(PUSH, content=body(q_ok, 900_000),
                      headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()[0]["status"] == "queued"
    assert b.client.get("/health").status_code == 200
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert_nothing_stored(conn, q_big, q_chunked, q_gz)
        [m] = stored_messages(conn, q_ok)
        assert len(m.payload) == 900_002


def test_json_answer_content_type_has_charset(broker):
    r = broker.client.post(PUSH, json={"items": []})
    assert r.headers["content-type"].replace(" ", "").lower() == \
        "application/json;charset=utf-8"


# ---------------------------------------------------------------------------- concurrency
def _decoded_offsets(conn: psycopg.Connection, queue: str) -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    for m in stored_messages(conn, queue):
        assert m.offset not in out.setdefault(m.partition, {}), (m.partition, m.offset)
        out[m.partition][m.offset] = m.message_id
    return out


def test_50_concurrent_clients_on_one_partition_get_gapless_offsets(broker, db):
    q = uq("conc")
    clients, requests = 50, 20
    start = threading.Barrier(clients)

    def run(c: int) -> list[tuple[dict, dict]]:
        rnd = random.Random(c)
        out = []
        with httpx.Client(base_url=broker.url, timeout=60) as http:
            start.wait()
            for r in range(requests):
                items = [{"queue": q, "partition": "one", "transactionId": f"c{c}-r{r}-i{i}",
                          "payload": {"c": c, "r": r, "i": i}}
                         for i in range(rnd.randint(1, 5))]
                res = http.post(PUSH, json={"items": items})
                assert res.status_code == 201, res.text
                out.extend(zip(items, res.json(), strict=True))
        return out

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(clients) as ex:
        pairs = [p for part in ex.map(run, range(clients)) for p in part]
    elapsed = time.monotonic() - t0
    n = len(pairs)
    assert all(res["status"] == "queued" for _, res in pairs), \
        {res["status"] for _, res in pairs}
    offsets = sorted(res["offset"] for _, res in pairs)
    assert offsets == list(range(1, n + 1)), "gap or repeat in the answered offsets"

    pid, last = partition_state(db, q, "one")
    assert last == n
    assert {res["partitionId"] for _, res in pairs} == {str(pid)}
    (count_sum,) = db.execute("SELECT sum(msg_count) FROM queen.log_segments "
                              "WHERE partition_id = %s", (pid,)).fetchone()
    assert count_sum == n
    segs = db.execute("SELECT base_offset, msg_count, created_at FROM queen.log_segments "
                      "WHERE partition_id = %s ORDER BY base_offset", (pid,)).fetchall()
    expect = 1
    for base, count, _ in segs:
        assert base == expect
        expect += count
    created = [c for _, _, c in segs]
    assert created == sorted(created), "segment created_at goes backwards in offset order"
    (txn_rows,) = db.execute("SELECT count(*) FROM queen.log_txns WHERE partition_id = %s",
                             (pid,)).fetchone()
    assert txn_rows == len(segs)
    stored = _decoded_offsets(db, q)["one"]
    for _, res in pairs:
        assert stored[res["offset"]] == res["messageId"]
    by_offset = {m.offset: m for m in stored_messages(db, q)}
    for item, res in pairs:
        m = by_offset[res["offset"]]
        assert m.transaction_id == item["transactionId"]
        assert json.loads(m.payload) == item["payload"]
    print(f"\n{n} items in {clients * requests} requests, {len(segs)} segments, "
          f"{elapsed:.2f}s")


def test_concurrent_pushes_over_many_partitions_are_bundled(broker, db):
    q = uq("spread")
    clients, requests, partitions = 64, 15, 200
    before = broker.client.get("/metrics").json()["fusion"]
    start = threading.Barrier(clients)

    def run(c: int) -> int:
        rnd = random.Random(1000 + c)
        pushed = 0
        with httpx.Client(base_url=broker.url, timeout=60) as http:
            start.wait()
            for _ in range(requests):
                items = [{"queue": q, "partition": f"p{rnd.randrange(partitions)}",
                          "payload": pushed + i} for i in range(rnd.randint(1, 4))]
                res = http.post(PUSH, json={"items": items})
                assert res.status_code == 201, res.text
                assert all(x["status"] == "queued" for x in res.json())
                pushed += len(items)
        return pushed

    with cf.ThreadPoolExecutor(clients) as ex:
        total = sum(ex.map(run, range(clients)))
    after = broker.client.get("/metrics").json()["fusion"]
    commits = after["commits"] - before["commits"]
    segments = after["segments"] - before["segments"]
    (db_segments, db_msgs) = db.execute(
        "SELECT count(*), sum(s.msg_count) FROM queen.log_segments s "
        "JOIN queen.log_partitions lp ON lp.id = s.partition_id "
        "JOIN queen.queues qu ON qu.id = lp.queue_id WHERE qu.name = %s", (q,)).fetchone()
    print(f"\n{total} items, {clients * requests} requests, {db_segments} segments in the db; "
          f"metrics delta: {commits} commits, {segments} segments, "
          f"{segments / max(commits, 1):.2f} segments/commit")
    assert db_msgs == total
    assert segments == db_segments  # nothing else pushed meanwhile on the session broker
    # every partition's offsets are gapless
    for part, offs in _decoded_offsets(db, q).items():
        assert sorted(offs) == list(range(1, len(offs) + 1)), part
    # fusion bundles: fewer commits than segments, by a real margin
    assert commits < segments
    assert segments / commits >= 1.2
