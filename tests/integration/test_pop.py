"""Pop path (api.md 1.1-1.4, 2.2, 2.6, 3.7, 4): claiming, leases, long polls, subscription
starts, autoAck, delayed / windowed queues, namespace pops, QPF1 frames and validation, against
the real broker process on the session database.

Queue options are set with SQL on ``queen.queues`` after the first push created the queue (there
is no configure endpoint yet); every test uses its own queue and group names.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import json
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
import zstandard

from tests.integration.test_push_json import (
    ISO_MS_Z,
    UUID_TEXT,
    compact,
    push,
    stored_messages,
    uq,
)

POP = "/api/v1/pop"
TOP_KEYS = {"success", "queue", "partition", "partitionId", "leaseId", "leaseExpiresAt",
            "consumerGroup", "partitionsClaimed", "claims", "messages"}
MESSAGE_KEYS = {"id", "transactionId", "traceId", "data", "producerSub", "createdAt", "queue",
                "partitionId", "partition", "offset", "leaseId", "consumerGroup",
                "deliveryAttempt"}
CLAIM_KEYS = {"partitionId", "partition", "start", "end", "deliveryAttempt"}
QUEUE_MODE = "__QUEUE_MODE__"


# ---------------------------------------------------------------------------------- helpers
def pop_url(queue: str, partition: str | None = None) -> str:
    url = f"{POP}/queue/{queue}"
    return url if partition is None else f"{url}/partition/{partition}"


def pop(client: httpx.Client, queue: str, partition: str | None = None,
        **params: Any) -> httpx.Response:
    return client.get(pop_url(queue, partition), params=_params(params))


def _params(params: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in params.items():
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def pop_ok(client: httpx.Client, queue: str, partition: str | None = None,
           **params: Any) -> dict:
    r = pop(client, queue, partition, **params)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def assert_204(r: httpx.Response) -> None:
    assert r.status_code == 204, (r.status_code, r.text)
    assert r.content == b""


def assert_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"], body
    return body


def parse_time(text: str) -> dt.datetime:
    assert ISO_MS_Z.match(text), text
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    t = t.astimezone(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def configure(db: psycopg.Connection, queue: str, **options: int) -> None:
    """Set queue options (columns of queen.queues) directly; the queue must exist."""
    sets = ", ".join(f"{k} = %({k})s" for k in options)
    cur = db.execute(f"UPDATE queen.queues SET {sets} WHERE name = %(name)s",
                     {**options, "name": queue})
    assert cur.rowcount == 1, queue


def push_n(client: httpx.Client, queue: str, partition: str, n: int, start: int = 0,
           **extra: Any) -> list[dict]:
    """n messages in one request (one segment): payloads {"i": start..start+n-1}."""
    res = push(client, [{"queue": queue, "partition": partition, "payload": {"i": start + i},
                         **extra} for i in range(n)])
    assert all(r["status"] == "queued" for r in res), res
    return res


def offsets(answer: dict) -> list[int]:
    return [m["offset"] for m in answer["messages"]]


def seen_keys(answer: dict) -> list[tuple[str, int]]:
    return [(m["partition"], m["offset"]) for m in answer["messages"]]


def drain(client: httpx.Client, queue: str, group: str | None, batch: int = 10,
          **params: Any) -> list[dict]:
    """autoAck pops of ``group`` until 204; the messages in delivery order."""
    out: list[dict] = []
    extra = {} if group is None else {"consumerGroup": group}
    for _ in range(200):
        r = pop(client, queue, batch=batch, autoAck=True, **extra, **params)
        if r.status_code == 204:
            return out
        assert r.status_code == 200, r.text
        out.extend(r.json()["messages"])
    raise AssertionError("queue never drained")


def ack_all(client: httpx.Client, group: str, answer: dict) -> None:
    """Every message of a pop answer acked ``completed`` in one /ack/batch call."""
    r = client.post("/api/v1/ack/batch", json={"consumerGroup": group, "acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": answer["leaseId"], "status": "completed"} for m in answer["messages"]]})
    assert r.status_code == 200 and all(x["success"] for x in r.json()), r.text


def cursor(db: psycopg.Connection, queue: str, partition: str, group: str) -> tuple:
    """(committed_offset, lease_id, lease_expires_at) of one (partition, group)."""
    return db.execute(
        "SELECT c.committed_offset, c.lease_id, c.lease_expires_at "
        "FROM queen.log_consumers c JOIN queen.log_partitions lp ON lp.id = c.partition_id "
        "JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.name = %s AND lp.name = %s AND c.consumer_group = %s",
        (queue, partition, group)).fetchone()


#: The long poll of the wake-up tests. Woken, a parked pop answers within milliseconds of its
#: event; not woken, it claims again only 250 ms before this deadline (queen_mp/front/popper.py).
#: WOKEN_S tells the two apart with room for a loaded machine: the wake-up is the point, never
#: the speed.
LONG_POLL_MS = 30_000
WOKEN_S = 10.0


def timed_pop(client: httpx.Client, queue: str, **params: Any
              ) -> tuple[httpx.Response, float, float]:
    """(answer, monotonic send time, monotonic answer time)."""
    t0 = time.monotonic()
    r = pop(client, queue, **params)
    return r, t0, time.monotonic()


# ------------------------------------------------------------------------ QPF1 (api.md 3.7)
class Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        assert self.pos + n <= len(self.data), f"short read at {self.pos} (+{n})"
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        s = struct.Struct("<" + fmt)
        values = s.unpack(self.take(s.size))
        return values[0] if len(values) == 1 else values

    def str16(self) -> str:
        return self.take(self.unpack("H")).decode("utf-8")

    def done(self) -> bool:
        return self.pos == len(self.data)


@dataclass
class FrameMsg:
    offset: int
    flags: int
    message_id: str
    trace_id: str | None
    transaction_id: str
    producer_sub: str | None
    payload: bytes
    created_us: int


def parse_frames(raw: bytes, base: int, created_us: int) -> list[FrameMsg]:
    """api.md 3.1 message frames, back to back."""
    r = Reader(raw)
    out = []
    while not r.done():
        body_len = r.unpack("I")
        body = Reader(r.take(body_len))
        flags = body.unpack("B")
        mid = str(uuid.UUID(bytes=body.take(16)))
        trace = str(uuid.UUID(bytes=body.take(16))) if flags & 1 else None
        txn = body.str16()
        sub = body.str16() if flags & 2 else None
        payload = body.take(len(body.data) - body.pos)
        out.append(FrameMsg(base + len(out), flags, mid, trace, txn, sub, payload, created_us))
    return out


def parse_qpf1(data: bytes) -> dict:
    r = Reader(data)
    assert r.take(4) == b"QPF1"
    assert r.unpack("B") == 1
    meta = json.loads(r.take(r.unpack("I")) or b"{}")
    answer = {"meta": meta, "queue": r.str16(), "leaseId": r.str16(),
              "consumerGroup": r.str16(), "claims": []}
    for _ in range(r.unpack("I")):
        pid = r.unpack("Q")
        name = r.str16()
        start, end, attempt, nrec = r.unpack("QQII")
        messages: list[FrameMsg] = []
        for _ in range(nrec):
            base, created_us = r.unpack("Qq")
            count, codec, length = r.unpack("IBI")
            blob = r.take(length)
            assert codec in (0, 1), codec
            if codec == 1:
                assert zstandard.frame_content_size(blob) > 0
                blob = zstandard.ZstdDecompressor().decompress(blob)
            frames = parse_frames(blob, base, created_us)
            assert len(frames) == count, (len(frames), count)
            # records may overhang the claim: keep start..end only
            messages.extend(f for f in frames if start <= f.offset <= end)
        answer["claims"].append({"partitionId": pid, "partition": name, "start": start,
                                 "end": end, "deliveryAttempt": attempt,
                                 "messages": messages})
    assert r.done(), f"{len(data) - r.pos} trailing bytes"
    return answer


# ----------------------------------------------------------------------------- answer shape
def test_answer_has_every_field_of_api_2_2_and_data_is_the_pushed_payload(broker, db):
    q, g = uq("pop"), uq("g")
    trace = str(uuid.uuid4())
    values = [{"a": 1, "nested": {"b": [1, 2.5, {"c": None}], "s": "é✓"}}, "a string", 42,
              -3.25, None, True, [1, "x", {}], {}, "line\nbreak \"q\""]
    items = [{"queue": q, "partition": "p-1", "payload": v} for v in values]
    items[0]["traceId"] = trace
    items[1]["transactionId"] = "order-1001"
    items.append({"queue": q, "partition": "p-1"})  # no payload at all: null
    res = push(broker.client, items)
    before = now_utc()
    body = pop_ok(broker.client, q, consumerGroup=g, batch=100)
    after = now_utc()

    assert set(body) == TOP_KEYS  # no "autopilot" unless requested
    assert body["success"] is True
    assert body["queue"] == q
    assert body["partition"] == "p-1"
    pid = res[0]["partitionId"]
    assert isinstance(body["partitionId"], str) and body["partitionId"] == pid
    assert pid.isdecimal()
    assert UUID_TEXT.match(body["leaseId"])
    assert body["consumerGroup"] == g
    assert body["partitionsClaimed"] == 1 and type(body["partitionsClaimed"]) is int
    expires = parse_time(body["leaseExpiresAt"])  # default leaseTime 300 s
    assert before + dt.timedelta(seconds=299) <= expires <= after + dt.timedelta(seconds=301)
    assert body["claims"] == [{"partitionId": pid, "partition": "p-1", "start": 1, "end": 10,
                               "deliveryAttempt": 1}]
    assert set(body["claims"][0]) == CLAIM_KEYS

    msgs = body["messages"]
    assert len(msgs) == 10
    stored = stored_messages(db, q)
    for i, (m, r, s) in enumerate(zip(msgs, res, stored, strict=True)):
        assert set(m) == MESSAGE_KEYS
        assert m["id"] == r["messageId"] == s.message_id
        assert m["transactionId"] == r["transactionId"]
        assert m["traceId"] == (trace if i == 0 else None)
        assert m["producerSub"] is None
        assert m["data"] == (values[i] if i < len(values) else None)
        assert type(m["offset"]) is int and m["offset"] == r["offset"] == i + 1
        assert m["queue"] == q and m["partition"] == "p-1" and m["partitionId"] == pid
        assert m["leaseId"] == body["leaseId"]
        assert m["consumerGroup"] == g
        assert m["deliveryAttempt"] == 1 and type(m["deliveryAttempt"]) is int
        assert ISO_MS_Z.match(m["createdAt"])
        assert m["createdAt"] == iso(s.created_at) == r["createdAt"]
    assert msgs[1]["transactionId"] == "order-1001"
    assert msgs[0]["transactionId"] == msgs[0]["id"]  # none pushed: the message id text
    # data is the stored payload (compact JSON; null is stored as 0 bytes) spliced in
    assert [b"" if m["data"] is None else compact(m["data"]) for m in msgs] == [
        s.payload for s in stored]


def test_autopilot_is_echoed_only_when_requested(broker):
    q = uq("pop")
    push_n(broker.client, q, "Default", 3)
    body = pop_ok(broker.client, q, autopilot=True, consumerGroup=uq("g"))
    assert body["autopilot"] == {"partitions": 1, "batch": 200, "waitMs": 100}
    assert offsets(body) == [1, 2, 3]  # batch 200 without an explicit batch


def test_nothing_claimable_is_204_and_unknown_queue_creates_nothing(broker, db):
    q = uq("pop")
    push_n(broker.client, q, "Default", 1)
    g = uq("g")
    pop_ok(broker.client, q, consumerGroup=g)
    assert_204(pop(broker.client, q, consumerGroup=g))  # the only partition is leased
    assert_204(pop(broker.client, q, "nope", consumerGroup=g))  # unknown partition

    unknown = uq("pop-unknown")
    assert_204(pop(broker.client, unknown))
    r, t0, t1 = timed_pop(broker.client, unknown, wait=True, timeout=400, consumerGroup=g)
    assert_204(r)
    assert 0.35 <= t1 - t0 < WOKEN_S, t1 - t0  # held to its deadline, never the 30 s default
    assert db.execute("SELECT count(*) FROM queen.queues WHERE name = %s",
                      (unknown,)).fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM queen.consumer_groups_meta m "
                      "JOIN queen.queues q ON q.id = m.queue_id WHERE q.name = %s",
                      (unknown,)).fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM queen.log_partitions lp JOIN queen.queues q "
                      "ON q.id = lp.queue_id WHERE q.name = %s AND lp.name = 'nope'",
                      (q,)).fetchone() == (0,)


# ------------------------------------------------------------------- batch, partitions, route
def test_batch_caps_the_messages(broker):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 10)
    body = pop_ok(broker.client, q, consumerGroup=g, batch=3)
    assert offsets(body) == [1, 2, 3]
    assert [m["data"] for m in body["messages"]] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert body["claims"][0]["start"] == 1 and body["claims"][0]["end"] == 3
    # default batch is 1
    body = pop_ok(broker.client, q, consumerGroup=uq("g"))
    assert offsets(body) == [1]
    # batch larger than the limit is clamped, not refused
    body = pop_ok(broker.client, q, consumerGroup=uq("g"), batch=999999)
    assert offsets(body) == list(range(1, 11))


def test_partitions_claims_several_under_one_lease_and_batch_caps_the_total(broker, db):
    q, g = uq("pop"), uq("g")
    pids = {}
    for p in ("p0", "p1", "p2"):  # separate requests: p0 holds the oldest data
        pids[p] = push_n(broker.client, q, p, 4)[0]["partitionId"]
    body = pop_ok(broker.client, q, consumerGroup=g, partitions=3, batch=10)
    assert body["partitionsClaimed"] == 3
    assert [(c["partition"], c["partitionId"], c["start"], c["end"], c["deliveryAttempt"])
            for c in body["claims"]] == [("p0", pids["p0"], 1, 4, 1), ("p1", pids["p1"], 1, 4, 1),
                                         ("p2", pids["p2"], 1, 2, 1)]
    assert body["partition"] == "p0" and body["partitionId"] == pids["p0"]
    assert seen_keys(body) == [("p0", 1), ("p0", 2), ("p0", 3), ("p0", 4), ("p1", 1),
                               ("p1", 2), ("p1", 3), ("p1", 4), ("p2", 1), ("p2", 2)]
    assert {m["leaseId"] for m in body["messages"]} == {body["leaseId"]}
    assert {m["partitionId"] for m in body["messages"]} == set(pids.values())
    lease = uuid.UUID(body["leaseId"])
    for p in ("p0", "p1", "p2"):
        assert cursor(db, q, p, g)[1] == lease

    # batch smaller than the partitions' data: the claims stop when batch is used up
    body = pop_ok(broker.client, q, consumerGroup=uq("g"), partitions=3, batch=5)
    assert body["partitionsClaimed"] == 2
    assert [(c["partition"], c["start"], c["end"]) for c in body["claims"]] == [
        ("p0", 1, 4), ("p1", 1, 1)]
    assert len(body["messages"]) == 5


@pytest.mark.parametrize("parts", [5, 10])
def test_partitions_claims_as_many_partitions_as_asked(broker, parts):
    """The walk stops at `partitions` claims, counted in the claims array's numbers per claim
    (pgcons11's log_pop_v2 stopped 5 numbers a claim at 4 * partitions: 8 of 10 claimed, the
    rest left to the next pop, e2e's p99 up)."""
    q = uq("pop")
    for p in range(parts + 2):
        push_n(broker.client, q, f"p{p:02d}", 2)
    body = pop_ok(broker.client, q, consumerGroup=uq("g"), partitions=parts, batch=100)
    assert body["partitionsClaimed"] == parts
    assert len(body["messages"]) == 2 * parts


def test_a_one_claim_answer_is_its_segments_whichever_statement_reads_them(broker, db):
    """log_pop_v3 answers a lone claim that ended its walk (every partitions=1 pop that claims)
    with its claim's row (the walk's values) and a statement of its segments alone, without the
    claim's columns; a walk that went on past its claim answers through the statement for
    several claims (the claim's columns on each row): both give the covering segments in
    offset order, and a claim whose segments are gone is one row without them."""
    q = uq("pop")
    push_n(broker.client, q, "a", 3)
    push_n(broker.client, q, "a", 2, start=3)  # segments at 1 and 4
    push_n(broker.client, q, "b", 1)
    sql = ("SELECT queue_name, partition_name, start_off, end_off, encrypted, base_offset"
           " FROM queen.log_pop_v3(%s, %s, %s, NULL, NULL, %s, %s, %s, %s, 'all', NULL, %s,"
           " 5000)")
    tenant = uuid.UUID(int=0)

    def sql_pop(group: str, batch: int, parts: int, partition: str | None = None,
                auto_ack: bool = False) -> list[tuple]:
        return db.execute(sql, (tenant, q, partition, group, batch, parts, auto_ack,
                                uuid.uuid4())).fetchall()

    segment = (None,) * 5
    assert sql_pop(uq("g"), 10, 1) == [(q, "a", 1, 5, False, None), (*segment, 1),
                                       (*segment, 4)]
    assert sql_pop(uq("g"), 4, 1) == [(q, "a", 1, 4, False, None), (*segment, 1),
                                      (*segment, 4)]
    # b listed but caught up, after a: the walk claims a, then meets b and settles it
    g = uq("g")
    assert sql_pop(g, 10, 1, "b", auto_ack=True) == [(q, "b", 1, 1, False, None),
                                                     (*segment, 1)]
    db.execute("UPDATE queen.log_consumers c SET ready_at = now() FROM queen.log_partitions lp"
               " WHERE lp.id = c.partition_id AND lp.name = 'b' AND c.consumer_group = %s"
               " AND c.queue_id = lp.queue_id", (g,))
    assert sql_pop(g, 10, 2) == [(q, "a", 1, 5, False, 1), (q, "a", 1, 5, False, 4)]
    assert db.execute("SELECT c.ready_at FROM queen.log_consumers c JOIN queen.log_partitions"
                      " lp ON lp.id = c.partition_id WHERE lp.name = 'b'"
                      " AND c.consumer_group = %s AND c.queue_id = lp.queue_id",
                      (g,)).fetchone() == (None,)
    # the segments went between the claim's read of the partition and its answer (as a
    # retention run may): one row, the claim without segment columns
    db.execute("DELETE FROM queen.log_segments s USING queen.log_partitions lp"
               " WHERE lp.id = s.partition_id AND lp.name = 'a' AND lp.queue_id ="
               " (SELECT id FROM queen.queues WHERE name = %s)", (q,))
    assert sql_pop(uq("g"), 10, 1, "a") == [(q, "a", 1, 5, False, None)]


def test_a_claim_starts_at_the_segment_its_claim_record_names_or_at_the_one_it_probes(
        broker, db):
    """schema/019_claim_record_base.sql: a claim records the base of the segment holding the
    offset after it (the next segment's, end + 1, when it reached the end); the next claim
    starting there begins its answer at that segment without a probe. A cursor moved otherwise
    (here: back inside the first segment) probes for the segment holding its start."""
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "a", 3)
    push_n(broker.client, q, "a", 2, start=3)
    push_n(broker.client, q, "a", 3, start=5)  # segments at 1, 4 and 6
    tenant = uuid.UUID(int=0)
    sql = ("SELECT partition_id, start_off, end_off, base_offset"
           " FROM queen.log_pop_v3(%s, %s, NULL, NULL, NULL, %s, %s, 1, false, 'all', NULL,"
           " %s, 5000)")
    record = ("SELECT c.next_offset, c.next_base_offset FROM queen.log_consumers c"
              " JOIN queen.log_partitions lp ON lp.id = c.partition_id"
              " WHERE lp.name = 'a' AND c.consumer_group = %s AND c.queue_id = lp.queue_id")

    def claim(batch: int) -> tuple[uuid.UUID, list[tuple]]:
        lease = uuid.uuid4()
        return lease, db.execute(sql, (tenant, q, g, batch, lease)).fetchall()

    def ack(lease: uuid.UUID, pid: int, end: int) -> None:
        got = db.execute("SELECT queen.log_ack_multi_v3(%s::uuid, %s::int8[], %s::text[],"
                         " %s::uuid[], %s::int8[], %s::int4[])",
                         (tenant, [pid], [g], [lease], [end], [1])).fetchone()[0]
        assert got[0] == 0, got

    lease, rows = claim(4)  # 1..4: the record names 5's segment, at 4
    pid = rows[0][0]
    assert [r[1:] for r in rows] == [(1, 4, None), (None, None, 1), (None, None, 4)]
    assert db.execute(record, (g,)).fetchone() == (5, 4)
    ack(lease, pid, 4)
    lease, rows = claim(10)  # 5..8 from the record's segment 4; the end: the next base is 9
    assert [r[1:] for r in rows] == [(5, 8, None), (None, None, 4), (None, None, 6)]
    assert db.execute(record, (g,)).fetchone() == (9, 9)
    push_n(broker.client, q, "a", 2, start=8)  # a segment at 9
    ack(lease, pid, 8)
    lease, rows = claim(10)
    assert [r[1:] for r in rows] == [(9, 10, None), (None, None, 9)]
    # the cursor moved back inside the first segment: 3 is no claim's next offset
    db.execute("UPDATE queen.log_consumers c SET committed_offset = 2, lease_id = NULL,"
               " lease_expires_at = NULL, ready_at = now() FROM queen.log_partitions lp"
               " WHERE lp.id = c.partition_id AND lp.name = 'a' AND c.consumer_group = %s"
               " AND c.queue_id = lp.queue_id", (g,))
    lease, rows = claim(3)
    assert [r[1:] for r in rows] == [(3, 5, None), (None, None, 1), (None, None, 4)]


def test_partition_route_claims_only_that_partition(broker):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "older", 2)
    push_n(broker.client, q, "a/b/c", 3)
    push_n(broker.client, q, "other", 2)
    body = pop_ok(broker.client, q, "a/b/c", consumerGroup=g, batch=10, partitions=3)
    assert body["partitionsClaimed"] == 1
    assert body["partition"] == "a/b/c"
    assert seen_keys(body) == [("a/b/c", 1), ("a/b/c", 2), ("a/b/c", 3)]
    # percent-encoded slashes name the same partition
    body = pop_ok(broker.client, q, "a%2Fb%2Fc", consumerGroup=uq("g"), batch=10)
    assert seen_keys(body) == [("a/b/c", 1), ("a/b/c", 2), ("a/b/c", 3)]
    body = pop_ok(broker.client, q, "other", consumerGroup=g, batch=10)
    assert seen_keys(body) == [("other", 1), ("other", 2)]
    assert_204(pop(broker.client, q, "a/b/c", consumerGroup=g))  # leased by this group
    # the queue route still finds the remaining one
    body = pop_ok(broker.client, q, consumerGroup=g, batch=10)
    assert seen_keys(body) == [("older", 1), ("older", 2)]


# --------------------------------------------------------------------------- groups, queue mode
def test_two_groups_each_receive_every_message_once(broker):
    q = uq("pop")
    push_n(broker.client, q, "a", 4)
    push_n(broker.client, q, "b", 3)
    expected = sorted([("a", i) for i in range(1, 5)] + [("b", i) for i in range(1, 4)])
    for g in (uq("g1"), uq("g2")):
        got = drain(broker.client, q, g, batch=2)
        keys = [(m["partition"], m["offset"]) for m in got]
        assert sorted(keys) == expected and len(set(keys)) == len(keys)
        assert {m["consumerGroup"] for m in got} == {g}
        assert {m["leaseId"] for m in got} == {None}


def test_queue_mode_and_an_explicit_group_are_independent(broker, db):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 3)
    got = drain(broker.client, q, None, batch=2)
    assert [m["offset"] for m in got] == [1, 2, 3]
    assert {m["consumerGroup"] for m in got} == {QUEUE_MODE}
    assert cursor(db, q, "Default", QUEUE_MODE)[0] == 3
    assert cursor(db, q, "Default", g) is None
    body = pop_ok(broker.client, q, consumerGroup=g, batch=5)
    assert body["consumerGroup"] == g and offsets(body) == [1, 2, 3]
    # consumerGroup=null / empty is queue mode too
    assert_204(pop(broker.client, q, consumerGroup="", autoAck=True))
    assert_204(pop(broker.client, q, consumerGroup="null", autoAck=True))
    assert cursor(db, q, "Default", QUEUE_MODE)[0] == 3


def pop_counting_reads(db, queue: str | None, group: str, table: str,
                       namespace: str | None = None) -> tuple[list, int]:
    """One log_pop_v3 call (rolled back) and the rows it read of ``table`` (counted, not
    timed: seq_tup_read + idx_tup_fetch of the transaction)."""
    fetched_sql = ("SELECT seq_tup_read + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
                   " WHERE schemaname = 'queen' AND relname = %s")
    with db.transaction(force_rollback=True):
        before = db.execute(fetched_sql, (table,)).fetchone()[0]
        rows = db.execute(
            "SELECT partition_name, start_off, end_off FROM queen.log_pop_v3(%s, %s, NULL, %s,"
            " NULL, %s, 10, 1, false, 'all', NULL, gen_random_uuid(), 5000)"
            " WHERE partition_id IS NOT NULL",
            (uuid.UUID(int=0), queue, namespace, group)).fetchall()
        return rows, db.execute(fetched_sql, (table,)).fetchone()[0] - before


def test_a_pop_reads_the_cursors_of_its_own_queue_only(broker, db):
    """sql/120_pop_by_queue.sql: a group that also consumes a 40-partition queue does not make
    a pop of a 1-partition queue read those 40 cursors (the rows fetched are counted, not
    timed)."""
    small, big, g = uq("pop"), uq("pop"), uq("g")
    push_n(broker.client, small, "a", 2)
    for p in range(40):
        push_n(broker.client, big, f"p{p}", 1)
    pop_ok(broker.client, big, consumerGroup=g, batch=1, autoAck=True)  # its 40 cursors
    assert db.execute("SELECT count(*) FROM queen.log_consumers WHERE consumer_group = %s",
                      (g,)).fetchone()[0] == 40
    rows, fetched = pop_counting_reads(db, small, g, "log_consumers")
    assert {(r[0], r[1], r[2]) for r in rows} == {("a", 1, 2)}
    assert fetched < 10, fetched  # a handful of lookups of the one partition's cursor


def test_a_pop_reads_its_own_queues_partitions_by_index_after_analyze(broker, db):
    """sql/125_pop_partitions_by_queue.sql: once VACUUM ANALYZE has seen one queue with many
    partitions, a pop of a small queue still reads only that queue's partition rows (counted,
    not timed); before it, two statements of the pop read every partition of the database
    (a sequential scan, or a full index scan where sequential scans are off)."""
    small, big, g = uq("pop"), uq("pop"), uq("g")
    push(broker.client, [{"queue": big, "partition": f"p{p}", "payload": {"i": p}}
                         for p in range(300)])
    push_n(broker.client, small, "a", 2)
    db.execute("VACUUM ANALYZE queen.log_partitions")
    total = db.execute("SELECT count(*) FROM queen.log_partitions").fetchone()[0]
    assert total >= 301
    rows, fetched = pop_counting_reads(db, small, g, "log_partitions")
    assert {(r[0], r[1], r[2]) for r in rows} == {("a", 1, 2)}
    assert fetched < 20, (fetched, total)  # a few lookups of the one partition, not `total`


def test_a_pop_reads_only_the_queue_rows_of_its_scope(broker, db):
    """log_pop_v3 runs cached generic plans (issue 26): its scope is found by one key lookup
    per kind of scope, so a queue pop and a namespace pop of a tenant with 150 more queues
    read a handful of queue rows (counted, not timed); one statement with every filter
    optional would read every queue of the tenant in its generic plan."""
    ns, other = f"ns{uuid.uuid4().hex[:10]}", f"ns{uuid.uuid4().hex[:10]}"
    push(broker.client, [{"queue": f"{other}.q{i}", "partition": "p", "payload": {"i": i}}
                         for i in range(150)])
    push_n(broker.client, f"{ns}.a", "p", 2)
    g = uq("g")
    for queue, namespace in ((f"{ns}.a", None), (None, ns)):
        for _ in range(7):  # past the plan cache's first five (custom) executions
            pop_counting_reads(db, queue, g, "queues", namespace=namespace)
        rows, fetched = pop_counting_reads(db, queue, g, "queues", namespace=namespace)
        assert {(r[0], r[1], r[2]) for r in rows} == {("p", 1, 2)}, (queue, namespace)
        assert fetched < 10, (queue, namespace, fetched)


def test_a_pop_orders_claimed_partitions_without_reading_their_segments(broker, db):
    """sql/130_pop_candidate_order.sql: once each of 40 partitions had a claim that was
    consumed, a pop finds the oldest pending message of each in its cursor row; it reads the
    segments of the partition it claims only (counted, not timed), where it read one segment
    per candidate partition before."""
    q, g = uq("pop"), uq("g")
    for i in range(2):  # two segments per partition: offset 1, then offset 2
        push(broker.client, [{"queue": q, "partition": f"p{p:02d}", "payload": {"i": i}}
                             for p in range(40)])
    firsts = {seen_keys(pop_ok(broker.client, q, consumerGroup=g, batch=1, autoAck=True))[0]
              for _ in range(40)}
    assert firsts == {(f"p{p:02d}", 1) for p in range(40)}  # offset 1 is older everywhere
    rows, fetched = pop_counting_reads(db, q, g, "log_segments")
    assert len(rows) == 1 and (rows[0][1], rows[0][2]) == (2, 2), rows
    assert fetched < 10, fetched


def test_oldest_pending_first_after_an_ack_and_after_a_lease_expiry(broker, db):
    """The candidate order of sql/130 stays api.md 2.2's "oldest pending data first": after an
    acked claim the next message's time comes from the cursor row, after an expired lease the
    partition is ordered by its unconsumed message again."""
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "a", 1)  # a:1, oldest
    push_n(broker.client, q, "b", 1)  # b:1
    push_n(broker.client, q, "a", 1, start=1)  # a:2, newest
    configure(db, q, lease_time=1, retry_delay=0)  # redelivered at expiry
    first = pop_ok(broker.client, q, consumerGroup=g, batch=1)
    assert seen_keys(first) == [("a", 1)]
    time.sleep(1.3)  # the lease expires unacked: a:1 is pending again, and still the oldest
    again = pop_ok(broker.client, q, consumerGroup=g, batch=1)
    assert seen_keys(again) == [("a", 1)] and again["claims"][0]["deliveryAttempt"] == 2
    ack_all(broker.client, g, again)
    order = [seen_keys(pop_ok(broker.client, q, consumerGroup=g, batch=1, autoAck=True))[0]
             for _ in range(2)]
    assert order == [("b", 1), ("a", 2)]  # a:2 is newer than b:1
    assert_204(pop(broker.client, q, consumerGroup=g, batch=1, autoAck=True))


# ------------------------------------------------------------------------------------- leases
def test_lease_blocks_the_group_not_other_groups_and_expiry_redelivers(broker, db):
    q, g, other = uq("pop"), uq("g"), uq("g-other")
    res = push_n(broker.client, q, "Default", 5)
    configure(db, q, lease_time=1, retry_delay=0)  # redelivered at expiry
    first = pop_ok(broker.client, q, consumerGroup=g, batch=3)
    assert offsets(first) == [1, 2, 3]
    assert first["claims"][0]["deliveryAttempt"] == 1
    lease_exp = parse_time(first["leaseExpiresAt"])
    assert_204(pop(broker.client, q, consumerGroup=g, batch=3))
    body = pop_ok(broker.client, q, consumerGroup=other, batch=10)
    assert offsets(body) == [1, 2, 3, 4, 5]

    time.sleep(max(0.0, (lease_exp - now_utc()).total_seconds()) + 0.15)
    # an expired lease cannot be extended
    r = broker.client.post(f"/api/v1/lease/{first['leaseId']}/extend")
    assert r.status_code == 200 and r.json()["error"] == "lease_not_found", r.text
    with httpx.Client(base_url=broker.url, timeout=30) as another:
        again = pop_ok(another, q, consumerGroup=g, batch=3)
    assert again["claims"] == [{"partitionId": res[0]["partitionId"], "partition": "Default",
                                "start": 1, "end": 3, "deliveryAttempt": 2}]
    assert offsets(again) == [1, 2, 3]
    assert [m["id"] for m in again["messages"]] == [m["id"] for m in first["messages"]]
    assert {m["deliveryAttempt"] for m in again["messages"]} == {2}
    assert again["leaseId"] != first["leaseId"]
    assert {m["leaseId"] for m in again["messages"]} == {again["leaseId"]}


def test_lease_extend(broker, db):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "a", 2)
    push_n(broker.client, q, "b", 2)
    push_n(broker.client, q, "c", 2)
    configure(db, q, lease_time=30)
    body = pop_ok(broker.client, q, consumerGroup=g, partitions=2, batch=10)
    assert body["partitionsClaimed"] == 2
    lease = body["leaseId"]
    before = parse_time(body["leaseExpiresAt"])
    url = f"/api/v1/lease/{lease}/extend"

    time.sleep(0.05)
    r = broker.client.post(url)  # no body: each lease by its queue's leaseTime
    assert r.status_code == 200, r.text
    ext = r.json()
    assert ext["success"] is True and ext["leaseId"] == lease and ext["renewed"] == 2
    assert ext["newExpiresAt"] == ext["expiresAt"]
    renewed = parse_time(ext["newExpiresAt"])
    assert renewed > before
    assert renewed - now_utc() <= dt.timedelta(seconds=30.5)
    db_exp = [cursor(db, q, p, g)[2] for p in ("a", "b")]
    assert iso(min(db_exp)) == ext["newExpiresAt"]

    # fewer seconds than are left: never shortened
    r = broker.client.post(url, json={"seconds": 5})
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert r.json()["renewed"] == 2 and r.json()["newExpiresAt"] == ext["newExpiresAt"]
    assert [cursor(db, q, p, g)[2] for p in ("a", "b")] == db_exp

    # more seconds: later; "{}" is accepted like no body
    r = broker.client.post(url, json={"seconds": 100})
    assert r.status_code == 200 and r.json()["renewed"] == 2, r.text
    longer = parse_time(r.json()["newExpiresAt"])
    assert longer - now_utc() > dt.timedelta(seconds=95)
    r = broker.client.post(url, content=b"{}")
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert r.json()["newExpiresAt"] == iso(longer)

    for bad in (str(uuid.uuid4()), "not-a-uuid"):
        r = broker.client.post(f"/api/v1/lease/{bad}/extend")
        assert r.status_code == 200, r.text
        assert r.json() == {"success": False, "leaseId": bad, "renewed": 0,
                            "newExpiresAt": None, "expiresAt": None,
                            "error": "lease_not_found"}
    for raw in (b"{", b"[1]", b'{"seconds": 0}', b'{"seconds": "5"}', b'{"seconds": 86401}'):
        assert_error(broker.client.post(url, content=raw), 400, "invalid_request")
    # the partition outside the pop was never leased
    assert cursor(db, q, "c", g) is None or cursor(db, q, "c", g)[1] is None


@pytest.mark.parametrize(("queue", "batch", "parts", "mode", "message"), [
    ("q", 0, 1, "all", "batch and max_partitions must be >= 1"),
    ("q", 1, None, "all", "batch and max_partitions must be >= 1"),
    ("q", 1, 1, "later", "unknown subscription mode later"),
    (None, 1, 1, "all", "a queue, a namespace or a task is required"),
])
def test_log_pop_refuses_bad_arguments_each_with_its_reason(db, queue, batch, parts, mode,
                                                            message):
    """log_pop_v3 tests its arguments in one expression on the good path; a bad one still gets
    its own message (22023)."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        db.execute("SELECT * FROM queen.log_pop_v3(%s, %s, NULL, NULL, NULL, 'g', %s, %s,"
                   " false, %s, NULL, %s, 5000)",
                   (uuid.UUID(int=0), queue, batch, parts, mode, uuid.uuid4()))


def test_a_leasing_pop_lists_its_lease_and_renewal_follows_what_is_still_held(broker, db):
    """A leasing pop writes its lease's row (group, claimed partitions: what renewal and
    requiredLeases read, schema/014_lease_table.sql); an autoAck pop writes none. Once one of
    the two partitions is acked, the lease renews the other alone."""
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "a", 2)
    push_n(broker.client, q, "b", 2)
    body = pop_ok(broker.client, q, consumerGroup=g, partitions=2, batch=10)
    lease = body["leaseId"]
    pids = {c["partitionId"] for c in body["claims"]}
    assert len(pids) == 2
    row = db.execute("SELECT consumer_group, partition_ids FROM queen.log_leases"
                     " WHERE lease_id = %s", (uuid.UUID(lease),)).fetchone()
    assert row is not None and row[0] == g and {str(p) for p in row[1]} == pids

    first = body["claims"][0]["partitionId"]
    ack_all(broker.client, g, {"leaseId": lease, "messages": [
        m for m in body["messages"] if m["partitionId"] == first]})
    r = broker.client.post(f"/api/v1/lease/{lease}/extend")
    assert r.status_code == 200 and r.json()["renewed"] == 1, r.text

    auto = uq("g")
    assert pop_ok(broker.client, q, consumerGroup=auto, autoAck=True)["leaseId"] is None
    assert db.execute("SELECT count(*) FROM queen.log_leases WHERE consumer_group = %s",
                      (auto,)).fetchone() == (0,)


# ---------------------------------------------------------------------------------- long poll
def test_parked_pop_is_answered_by_a_later_push(broker):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 1)  # the queue exists; drain it
    assert offsets(pop_ok(broker.client, q, consumerGroup=g, autoAck=True)) == [1]
    with cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=60) as c:
        fut = ex.submit(timed_pop, c, q, consumerGroup=g, wait=True, timeout=LONG_POLL_MS,
                        autoAck=True)
        time.sleep(0.7)
        assert not fut.done()
        t_push = time.monotonic()
        push_n(broker.client, q, "Default", 1, start=7)
        t_pushed = time.monotonic()
        r, _, t_answer = fut.result(timeout=60)
    assert r.status_code == 200, r.text
    assert [m["data"] for m in r.json()["messages"]] == [{"i": 7}]
    assert t_answer >= t_push
    assert t_answer - t_pushed < WOKEN_S, t_answer - t_pushed


def test_parked_pop_on_a_queue_created_later_is_answered(broker):
    q, g = uq("pop"), uq("g")
    with cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=60) as c:
        fut = ex.submit(timed_pop, c, q, consumerGroup=g, wait=True, timeout=LONG_POLL_MS)
        time.sleep(0.5)
        assert not fut.done()
        push_n(broker.client, q, "Default", 2)
        t_pushed = time.monotonic()
        r, _, t_answer = fut.result(timeout=60)
    assert r.status_code == 200, r.text
    assert offsets(r.json()) == [1]
    assert t_answer - t_pushed < WOKEN_S, t_answer - t_pushed


def test_parked_namespace_pop_is_answered_by_a_push(broker):
    ns, g = f"ns{uuid.uuid4().hex[:10]}", uq("g")
    q = f"{ns}.jobs"
    push_n(broker.client, q, "Default", 1)
    assert offsets(pop_ok(broker.client, q, consumerGroup=g, autoAck=True)) == [1]
    with cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=60) as c:
        fut = ex.submit(lambda: c.get(POP, params={"namespace": ns, "consumerGroup": g,
                                                   "wait": "true",
                                                   "timeout": str(LONG_POLL_MS)}))
        time.sleep(0.5)
        assert not fut.done()
        push_n(broker.client, q, "Default", 1, start=1)
        t_pushed = time.monotonic()
        r = fut.result(timeout=60)
        t_answer = time.monotonic()
    assert r.status_code == 200, r.text
    assert r.json()["queue"] == q and offsets(r.json()) == [2]
    assert t_answer - t_pushed < WOKEN_S, t_answer - t_pushed


def test_every_parked_pop_of_a_group_is_served_when_one_push_fills_several_partitions(broker):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "warm", 1)
    assert offsets(pop_ok(broker.client, q, consumerGroup=g, autoAck=True)) == [1]
    n = 3
    with cf.ThreadPoolExecutor(n) as ex:
        clients = [httpx.Client(base_url=broker.url, timeout=60) for _ in range(n)]
        try:
            futs = [ex.submit(timed_pop, c, q, consumerGroup=g, wait=True,
                              timeout=LONG_POLL_MS, batch=10) for c in clients]
            time.sleep(0.7)
            assert not any(f.done() for f in futs)
            push(broker.client, [{"queue": q, "partition": f"p{i}", "payload": i}
                                 for i in range(n)])
            t_pushed = time.monotonic()
            results = [f.result(timeout=60) for f in futs]
        finally:
            for c in clients:
                c.close()
    for r, _, t_answer in results:
        assert r.status_code == 200, r.status_code
        assert t_answer - t_pushed < WOKEN_S, t_answer - t_pushed
    parts = sorted(k for r, _, _ in results for k in seen_keys(r.json()))
    assert parts == [(f"p{i}", 1) for i in range(n)]


def test_a_parked_pop_does_not_poll_the_database(broker, db):
    """With nothing known to free up, a parked pop waits for a wake-up: it claims once at the
    start and once before its deadline, not every few milliseconds (a NULL wake hint used to
    come back as 0 ms from log_pop_v3, so parked pops re-ran it ~40 times a second).

    Claims are counted live from pg_stat_activity (each statement's (pid, query_start));
    pg_stat_database counters are flushed up to 10 s late and would count other tests."""
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 1)
    pop_ok(broker.client, q, consumerGroup=g, autoAck=True)
    with cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=30) as c:
        fut = ex.submit(pop, c, q, consumerGroup=g, wait=True, timeout=2500)
        claims: set[tuple[int, dt.datetime]] = set()
        while not fut.done():
            claims.update(db.execute(
                "SELECT pid, query_start FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND query LIKE %s", ("%queen.log_pop_v3(%",)).fetchall())
            time.sleep(0.005)
        assert_204(fut.result())
    # the tail before the deadline re-claims a few times (a quarter of the time left each)
    assert 1 <= len(claims) <= 12, len(claims)


def test_waiting_pop_with_nothing_answers_204_at_its_timeout(broker):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 1)
    pop_ok(broker.client, q, consumerGroup=g, autoAck=True)
    r, t0, t1 = timed_pop(broker.client, q, consumerGroup=g, wait=True, timeout=1500)
    assert_204(r)
    assert 1.45 <= t1 - t0 < WOKEN_S, t1 - t0
    # timeout=0 acts as wait=false; wait=false answers at once
    for params in ({"wait": True, "timeout": 0}, {"wait": False}, {}):
        r, t0, t1 = timed_pop(broker.client, q, consumerGroup=g, **params)
        assert_204(r)
        assert t1 - t0 < WOKEN_S, (params, t1 - t0)  # not held to the 30 s default


def test_timeout_zero_still_claims_like_wait_false(broker):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 2)
    r, t0, t1 = timed_pop(broker.client, q, consumerGroup=g, wait=True, timeout=0, batch=5)
    assert r.status_code == 200, r.status_code
    assert offsets(r.json()) == [1, 2]
    assert t1 - t0 < WOKEN_S, t1 - t0  # not held to the 30 s default


def test_parked_pop_is_woken_by_a_lease_expiry(broker, db):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 2)
    configure(db, q, lease_time=1, retry_delay=0)  # woken at the expiry itself
    first = pop_ok(broker.client, q, consumerGroup=g, batch=2)
    expires = parse_time(first["leaseExpiresAt"])
    r, t0, t1 = timed_pop(broker.client, q, consumerGroup=g, wait=True, timeout=LONG_POLL_MS,
                          batch=2)
    answered = now_utc()
    assert r.status_code == 200, r.text
    body = r.json()
    assert offsets(body) == [1, 2]
    assert body["claims"][0]["deliveryAttempt"] == 2
    assert answered >= expires
    assert t1 - t0 < WOKEN_S, t1 - t0


def test_parked_pop_is_woken_when_an_ack_releases_a_partition_with_more_messages(broker):
    """An ack that releases a lease wakes the pops parked on the queue: the one parked behind
    the lease (300 s by default, far past its 10 s long poll) is answered with the next message."""
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 2)
    first = pop_ok(broker.client, q, consumerGroup=g, batch=1)
    assert offsets(first) == [1]
    with cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=60) as c:
        fut = ex.submit(timed_pop, c, q, consumerGroup=g, wait=True, timeout=LONG_POLL_MS)
        time.sleep(0.7)
        assert not fut.done()
        ack_all(broker.client, g, first)
        t_acked = time.monotonic()
        woken, _, t_answer = fut.result(timeout=60)
    assert woken.status_code == 200, woken.text
    assert t_answer - t_acked < WOKEN_S, t_answer - t_acked  # not its own late re-claim
    assert offsets(woken.json()) == [2]


def test_a_leased_partition_never_blocks_another(broker, db):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "slow", 3)  # oldest data: claimed first
    push_n(broker.client, q, "fast", 5)
    held = pop_ok(broker.client, q, consumerGroup=g, batch=1)
    assert seen_keys(held) == [("slow", 1)]
    got = []
    for _ in range(5):
        body = pop_ok(broker.client, q, consumerGroup=g, batch=1, autoAck=True)
        got.extend(seen_keys(body))
    assert got == [("fast", i) for i in range(1, 6)]
    assert_204(pop(broker.client, q, consumerGroup=g, batch=1, autoAck=True))
    assert cursor(db, q, "slow", g)[:2] == (0, uuid.UUID(held["leaseId"]))


# ------------------------------------------------------------------------ subscription modes
@pytest.mark.parametrize("params", [{"subscriptionMode": "new"},
                                    {"subscriptionMode": "new-only"},
                                    {"subscriptionFrom": "now"},
                                    {"subscriptionMode": "all", "subscriptionFrom": "now"}])
def test_new_group_skips_existing_messages_and_the_start_is_recorded_once(broker, db, params):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "old", 3)
    assert_204(pop(broker.client, q, consumerGroup=g, batch=10, **params))
    assert cursor(db, q, "old", g)[0] == 3
    meta_sql = ("SELECT m.subscription_mode, m.subscription_from FROM queen.consumer_groups_meta m "
                "JOIN queen.queues q ON q.id = m.queue_id "
                "WHERE q.name = %s AND m.consumer_group = %s")
    recorded = db.execute(meta_sql, (q, g)).fetchall()
    assert len(recorded) == 1 and recorded[0][0] != "all" and recorded[0][1] is not None
    time.sleep(0.01)
    push_n(broker.client, q, "old", 2, start=3)
    # a later pop with mode all does not rewind to the log start
    body = pop_ok(broker.client, q, consumerGroup=g, batch=10, autoAck=True,
                  subscriptionMode="all")
    assert seen_keys(body) == [("old", 4), ("old", 5)]
    # a partition created after the group's first pop: consumed from its first message
    push_n(broker.client, q, "later", 2)
    body = pop_ok(broker.client, q, consumerGroup=g, batch=10, autoAck=True,
                  subscriptionFrom="beginning")
    assert seen_keys(body) == [("later", 1), ("later", 2)]
    assert_204(pop(broker.client, q, consumerGroup=g, batch=10))
    assert db.execute(meta_sql, (q, g)).fetchall() == recorded
    # an all-mode group of the same queue sees everything
    assert len(drain(broker.client, q, uq("g-all"))) == 7


def test_subscription_from_a_time_starts_at_the_first_message_at_or_after_it(broker):
    q = uq("pop")
    a = push_n(broker.client, q, "Default", 2)
    time.sleep(0.05)
    b = push_n(broker.client, q, "Default", 2, start=2)
    ta, tb = parse_time(a[0]["createdAt"]), parse_time(b[0]["createdAt"])
    assert tb - ta >= dt.timedelta(milliseconds=40)
    between = iso(ta + dt.timedelta(milliseconds=1))
    got = drain(broker.client, q, uq("g"), subscriptionFrom=between)
    assert [m["offset"] for m in got] == [3, 4]
    # exactly b's creation time is "at or after"
    got = drain(broker.client, q, uq("g"), subscriptionFrom=b[0]["createdAt"])
    assert [m["offset"] for m in got] == [3, 4]
    # an offset form of the same instant
    plus2 = (ta + dt.timedelta(milliseconds=1)).astimezone(
        dt.timezone(dt.timedelta(hours=2))).isoformat(timespec="milliseconds")
    got = drain(broker.client, q, uq("g"), subscriptionFrom=plus2)
    assert [m["offset"] for m in got] == [3, 4]
    got = drain(broker.client, q, uq("g"), subscriptionFrom="beginning")
    assert [m["offset"] for m in got] == [1, 2, 3, 4]
    got = drain(broker.client, q, uq("g"), subscriptionFrom="beginning",
                subscriptionMode="new")
    assert [m["offset"] for m in got] == [1, 2, 3, 4]
    # a time after every message: only later messages
    g = uq("g")
    assert drain(broker.client, q, g, subscriptionFrom=iso(now_utc() + dt.timedelta(
        seconds=0.2))) == []
    time.sleep(0.3)
    push_n(broker.client, q, "Default", 1, start=4)
    assert [m["offset"] for m in drain(broker.client, q, g)] == [5]


# ------------------------------------------------------------------------------------ autoAck
def test_auto_ack_advances_the_cursor(broker, db):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 5)
    body = pop_ok(broker.client, q, consumerGroup=g, batch=2, autoAck=True)
    assert body["leaseId"] is None and body["leaseExpiresAt"] is None
    assert {m["leaseId"] for m in body["messages"]} == {None}
    assert offsets(body) == [1, 2]
    assert cursor(db, q, "Default", g) == (2, None, None)
    body = pop_ok(broker.client, q, consumerGroup=g, batch=2, autoAck=True)
    assert offsets(body) == [3, 4]
    assert body["claims"][0]["deliveryAttempt"] == 1
    assert cursor(db, q, "Default", g)[0] == 4
    body = pop_ok(broker.client, q, consumerGroup=g, batch=2)  # leasing pop: cursor stays
    assert offsets(body) == [5]
    assert cursor(db, q, "Default", g)[0] == 4
    [(consumed,)] = db.execute(
        "SELECT c.total_consumed FROM queen.log_consumers c JOIN queen.log_partitions lp "
        "ON lp.id = c.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.name = %s AND c.consumer_group = %s", (q, g)).fetchall()
    assert consumed == 4


# ------------------------------------------------------------------- delayed and window buffer
def test_delayed_processing(broker, db):
    q, g = uq("pop"), uq("g")
    res = push_n(broker.client, q, "Default", 2)
    configure(db, q, delayed_processing=2)
    created = parse_time(res[0]["createdAt"])
    assert_204(pop(broker.client, q, consumerGroup=g, batch=5))
    r = pop(broker.client, q, consumerGroup=g, batch=5, wait=True, timeout=LONG_POLL_MS)
    answered = now_utc()
    assert r.status_code == 200, r.text
    assert offsets(r.json()) == [1, 2]
    assert answered >= created + dt.timedelta(seconds=2)
    assert answered <= created + dt.timedelta(seconds=2 + WOKEN_S)  # at maturity


def test_parked_pop_wakes_when_a_delayed_message_matures_after_a_locked_claim(broker, db):
    q, g = uq("pop"), uq("g")
    res = push_n(broker.client, q, "Default", 1)
    configure(db, q, delayed_processing=2)
    created = parse_time(res[0]["createdAt"])
    assert_204(pop(broker.client, q, consumerGroup=g))  # creates the group's cursor row
    with cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=30) as c:
        # a concurrent pop / ack / seek holds the cursor row for a moment while this pop
        # makes its first claim (what a second pop walking the delayed candidates does)
        with db.transaction():
            db.execute("SELECT 1 FROM queen.log_consumers c JOIN queen.log_partitions lp "
                       "ON lp.id = c.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
                       "WHERE q.name = %s AND c.consumer_group = %s FOR UPDATE", (q, g))
            fut = ex.submit(timed_pop, c, q, consumerGroup=g, wait=True, timeout=LONG_POLL_MS)
            time.sleep(0.4)
        r, _, _ = fut.result(timeout=60)
    answered = now_utc()
    assert r.status_code == 200, r.status_code
    # matured at createdAt + 2 s: answered then, not at the pop's deadline (30 s on)
    assert answered - created < dt.timedelta(seconds=2 + WOKEN_S), answered - created


def test_window_buffer(broker, db):
    q, g = uq("pop"), uq("g")
    push_n(broker.client, q, "Default", 1)
    configure(db, q, window_buffer=2)
    time.sleep(1.0)
    last = push_n(broker.client, q, "Default", 1, start=1)
    last_write = parse_time(last[0]["createdAt"])
    assert_204(pop(broker.client, q, consumerGroup=g, batch=5))
    time.sleep(max(0.0, (last_write + dt.timedelta(seconds=1.5) - now_utc()).total_seconds()))
    # the first message is 2.5 s old, but the partition's last write only 1.5 s
    assert_204(pop(broker.client, q, consumerGroup=g, batch=5))
    r = pop(broker.client, q, consumerGroup=g, batch=5, wait=True, timeout=5000)
    answered = now_utc()
    assert r.status_code == 200, r.text
    assert offsets(r.json()) == [1, 2]
    assert answered >= last_write + dt.timedelta(seconds=2)
    assert answered <= last_write + dt.timedelta(seconds=3.5)


# ---------------------------------------------------------------------------- namespace / task
def test_namespace_pop_serves_one_queue_per_answer_higher_priority_first(broker, db):
    ns = f"ns{uuid.uuid4().hex[:10]}"
    low, high = f"{ns}.low", f"{ns}.high"
    push_n(broker.client, low, "Default", 2)  # older data, lower priority
    push_n(broker.client, high, "Default", 2)
    push_n(broker.client, high, "second", 1)
    configure(db, high, priority=5)
    g = uq("g")
    r = broker.client.get(POP, params=_params({"namespace": ns, "consumerGroup": g,
                                               "batch": 10, "partitions": 5,
                                               "autoAck": True}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["queue"] == high
    assert {m["queue"] for m in body["messages"]} == {high}
    assert sorted(seen_keys(body)) == [("Default", 1), ("Default", 2), ("second", 1)]
    r = broker.client.get(POP, params=_params({"namespace": ns, "consumerGroup": g,
                                               "batch": 10, "partitions": 5}))
    assert r.status_code == 200, r.text
    assert r.json()["queue"] == low and offsets(r.json()) == [1, 2]
    r = broker.client.get(POP, params=_params({"namespace": ns, "consumerGroup": g}))
    assert_204(r)


def test_task_pop_and_namespace_task_filters(broker, db):
    ns, task = f"ns{uuid.uuid4().hex[:10]}", f"t{uuid.uuid4().hex[:10]}"
    a, b, other = f"{ns}.{task}.a", f"{ns}.{task}.b", f"{ns}.other"
    push_n(broker.client, a, "Default", 1)
    push_n(broker.client, other, "Default", 1)
    push_n(broker.client, b, "Default", 1)
    g = uq("g")
    seen = []
    for _ in range(2):
        r = broker.client.get(POP, params=_params({"task": task, "consumerGroup": g,
                                                   "autoAck": True, "partitions": 5}))
        assert r.status_code == 200, r.text
        seen.append(r.json()["queue"])
    assert seen == [a, b]  # same priority: oldest data first
    assert_204(broker.client.get(POP, params={"task": task, "consumerGroup": g}))
    r = broker.client.get(POP, params={"namespace": ns, "task": task, "consumerGroup": uq("g"),
                                       "batch": "10"})
    assert r.status_code == 200 and r.json()["queue"] == a
    body = assert_error(broker.client.get(POP), 400, "invalid_request")
    assert body.get("field") == "namespace"
    assert_error(broker.client.get(POP, params={"consumerGroup": g}), 400, "invalid_request")


# -------------------------------------------------------------------------------- QPF1 frames
def test_frames_pop_matches_a_json_pop_of_the_same_messages(broker, db):
    q = uq("pop")
    trace = str(uuid.uuid4())
    push(broker.client, [{"queue": q, "partition": "fa", "payload": {"i": 0}, "traceId": trace},
                         {"queue": q, "partition": "fa", "payload": "s"},
                         {"queue": q, "partition": "fa"}])
    push_n(broker.client, q, "fa", 2, start=3)
    push_n(broker.client, q, "fb", 4)
    # a first pop leaves the frames group's cursor mid-segment: records overhang the claim
    gf, gj = uq("gf"), uq("gj")
    for grp in (gf, gj):
        assert offsets(pop_ok(broker.client, q, consumerGroup=grp, batch=1,
                              autoAck=True)) == [1]
    r = pop(broker.client, q, consumerGroup=gf, frames=True, partitions=2, batch=5)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-queen-pop"
    assert r.content.startswith(b"QPF1\x01")
    framed = parse_qpf1(r.content)
    js = pop_ok(broker.client, q, consumerGroup=gj, partitions=2, batch=5)

    assert framed["queue"] == q and framed["consumerGroup"] == gf
    assert UUID_TEXT.match(framed["leaseId"]) and framed["leaseId"] != js["leaseId"]
    meta = framed["meta"]
    assert meta["success"] is True and "frames" not in meta
    assert ISO_MS_Z.match(meta["leaseExpiresAt"])
    assert [(str(c["partitionId"]), c["partition"], c["start"], c["end"], c["deliveryAttempt"])
            for c in framed["claims"]] == [
        (c["partitionId"], c["partition"], c["start"], c["end"], c["deliveryAttempt"])
        for c in js["claims"]]
    assert [(c["partition"], c["start"], c["end"]) for c in js["claims"]] == [
        ("fa", 2, 5), ("fb", 1, 1)]
    flat = [(c["partitionId"], f) for c in framed["claims"] for f in c["messages"]]
    assert len(flat) == len(js["messages"]) == 5
    stored = {(s.partition_id, s.offset): s for s in stored_messages(db, q)}
    for (pid, f), m in zip(flat, js["messages"], strict=True):
        assert str(pid) == m["partitionId"] and f.offset == m["offset"]
        assert f.message_id == m["id"] and f.transaction_id == m["transactionId"]
        assert f.trace_id == m["traceId"]
        assert f.producer_sub is None and f.flags & ~1 == 0
        assert f.payload == stored[(pid, f.offset)].payload
        assert (json.loads(f.payload) if f.payload else None) == m["data"]
        created = dt.datetime.fromtimestamp(f.created_us / 1e6, dt.UTC)
        assert iso(created) == m["createdAt"]
    assert [f.payload for _, f in flat[:2]] == [b'"s"', b""]

    # autoAck: empty leaseId; nothing left: a bodiless 204
    r = pop(broker.client, q, consumerGroup=uq("gf"), frames=True, autoAck=True, batch=100,
            partitions=5)
    assert r.status_code == 200
    auto = parse_qpf1(r.content)
    assert auto["leaseId"] == ""
    assert sum(len(c["messages"]) for c in auto["claims"]) == 9
    assert_204(pop(broker.client, q, consumerGroup=gf, frames=True, partitions=5))


# --------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(("params", "code"), [
    ({"batch": "0"}, "invalid_request"),
    ({"batch": "abc"}, "invalid_request"),
    ({"batch": "-3"}, "invalid_request"),
    ({"partitions": "0"}, "invalid_request"),
    ({"wait": "maybe"}, "invalid_request"),
    ({"autoAck": "yes"}, "invalid_request"),
    ({"frames": "2"}, "invalid_request"),
    ({"timeout": "-1"}, "invalid_request"),
    ({"timeout": "1.5"}, "invalid_request"),
    ({"subscriptionMode": "bogus"}, "invalid_request"),
    ({"subscriptionFrom": "not-a-time"}, "invalid_request"),
    ({"conflation": "true"}, "unsupported"),
    ({"consumerGroup": "bad\x01group"}, "invalid_name"),
    ({"consumerGroup": "bad/group"}, "invalid_name"),
])
def test_bad_parameters_are_400(broker, db, params, code):
    q = uq("pop")
    push_n(broker.client, q, "Default", 1)
    assert_error(pop(broker.client, q, **params), 400, code)
    # nothing was claimed by the refused pop
    assert db.execute("SELECT count(*) FROM queen.log_consumers c JOIN queen.log_partitions lp "
                      "ON lp.id = c.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
                      "WHERE q.name = %s", (q,)).fetchone() == (0,)


def test_query_string_rules_cors_and_methods(broker):
    q = uq("pop")
    push_n(broker.client, q, "Default", 4)
    g = uq("g")
    # '+' is a space, percent-escapes decode, a repeated key keeps its FIRST value
    r = broker.client.get(f"{pop_url(q)}?consumerGroup={g}+x%C3%A9&batch=2&batch=4")
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == "*"
    body = r.json()
    assert body["consumerGroup"] == f"{g} xé" and offsets(body) == [1, 2]
    assert {m["consumerGroup"] for m in body["messages"]} == {f"{g} xé"}
    r = broker.client.get(f"{pop_url(q)}?consumerGroup={g}+x%C3%A9&wait=0&autoAck=1")
    assert_204(r)  # the group's only partition is leased
    assert r.headers["access-control-allow-origin"] == "*"
    r = broker.client.options(pop_url(q))
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "*"
    r = broker.client.post(pop_url(q))
    assert_error(r, 405, "method_not_allowed")
    assert "GET" in r.headers["allow"]
    r = broker.client.get(pop_url(q), params={"batch": "0"})
    assert r.headers["access-control-allow-origin"] == "*"


def test_limits_clamp_and_names_too_long(broker):
    q = uq("pop")
    push_n(broker.client, q, "Default", 2)
    body = pop_ok(broker.client, q, consumerGroup=uq("g"), batch=999999, timeout=999999999)
    assert offsets(body) == [1, 2]
    body = pop_ok(broker.client, q, consumerGroup=uq("g"), partitions=999999999,
                  conflation=False, batch=1)
    assert offsets(body) == [1]
    long_name = "q" * 300
    body = assert_error(broker.client.get(pop_url(long_name)), 413, "name_too_long")
    assert body.get("limit") == 255
    assert_error(pop(broker.client, q, "p" * 300), 413, "name_too_long")
    assert_error(pop(broker.client, q, consumerGroup="g" * 300), 413, "name_too_long")
    assert_error(broker.client.get(POP, params={"namespace": "n" * 300}), 413, "name_too_long")
    assert_error(broker.client.get(pop_url("bad%01name")), 400, "invalid_name")


# -------------------------------------------------------------------------------- concurrency
def test_concurrent_pops_never_share_a_message_or_a_partition(broker):
    q, g = uq("pop"), uq("g")
    for p in range(5):
        push_n(broker.client, q, f"p{p}", 20)
    barrier = threading.Barrier(20)

    def one(_: int) -> httpx.Response:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            barrier.wait(timeout=10)
            return pop(c, q, consumerGroup=g, batch=10)

    with cf.ThreadPoolExecutor(20) as ex:
        answers = list(ex.map(one, range(20)))
    assert {r.status_code for r in answers} <= {200, 204}
    ok = [r.json() for r in answers if r.status_code == 200]
    assert len(ok) == 5  # every partition is claimed by exactly one pop
    keys = [k for body in ok for k in seen_keys(body)]
    assert len(keys) == len(set(keys)) == 50
    parts = [c["partition"] for body in ok for c in body["claims"]]
    assert sorted(parts) == [f"p{p}" for p in range(5)]
    assert len({body["leaseId"] for body in ok}) == 5
    for body in ok:
        assert offsets(body) == list(range(1, 11))


def test_concurrent_auto_ack_consumers_get_every_message_exactly_once(broker):
    q, g = uq("pop"), uq("g")
    for p in range(5):
        push_n(broker.client, q, f"p{p}", 20)
    lock = threading.Lock()
    batches: list[list[tuple[str, int]]] = []

    def consumer(_: int) -> None:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            empty = 0
            while empty < 3:
                r = pop(c, q, consumerGroup=g, batch=3, autoAck=True)
                if r.status_code == 204:
                    empty += 1
                    time.sleep(0.02)
                    continue
                assert r.status_code == 200, r.text
                with lock:
                    batches.append(seen_keys(r.json()))

    with cf.ThreadPoolExecutor(10) as ex:
        for f in [ex.submit(consumer, i) for i in range(10)]:
            f.result(timeout=60)
    seen = [k for b in batches for k in b]
    assert len(seen) == len(set(seen)) == 100
    # answers are not ordered among threads (autoAck commits at delivery, before the client
    # reads the answer), but each answer is one contiguous run of one partition, and the runs
    # of a partition tile 1..20
    for b in batches:
        assert len({name for name, _ in b}) == 1 and 1 <= len(b) <= 3
        assert [o for _, o in b] == list(range(b[0][1], b[0][1] + len(b)))
    for p in range(5):
        mine = sorted(o for name, o in seen if name == f"p{p}")
        assert mine == list(range(1, 21))
