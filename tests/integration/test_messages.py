"""The message browser (api.md 2.9; 5 for /status/queues/{queue}/messages): listing with every
filter and status, exact paging across segment boundaries, the default time window, the single
message (decrypted data, every group's status, newest occurrence of a repeated transactionId,
hash collisions and misaligned sidecar hits, the fallback below a purged sidecar), and the
queen-mq 2.6 client's message calls.

Real broker process over HTTP on the session database; cursors, leases and DLQ rows are made
through the real pop/ack routes; queue options through ``UPDATE queen.queues``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from queen import Queen

from queen_mp.crypto import PayloadCipher
from queen_mp.http import messages
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import ZERO_UUID
from tests.integration.test_dlq import ack, assert_error, pop, push, set_options
from tests.integration.test_push_json import stored_messages, uq

MESSAGES = "/api/v1/messages"
QUEUE_MODE = "__QUEUE_MODE__"
LIST_KEYS = {"id", "transactionId", "partitionId", "queue", "partition", "namespace", "task",
             "offset", "status", "traceId", "producerSub", "createdAt", "leaseExpiresAt"}
ONE_KEYS = LIST_KEYS | {"data", "encrypted", "errorMessage", "retryCount", "consumerGroups"}
KEY = "33" * 32
OTHER_TENANT = uuid.UUID("11111111-2222-3333-4444-555555555555")


# ---------------------------------------------------------------------------------- helpers
def listing(client: httpx.Client, path: str = MESSAGES, **params: Any) -> dict:
    r = client.get(path, params={k: str(v) for k, v in params.items()})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"messages", "total", "pagination"}, body
    for m in body["messages"]:
        assert set(m) == LIST_KEYS, m
    return body


def one(client: httpx.Client, pid: str, txn: str, **params: Any) -> dict:
    r = client.get(f"{MESSAGES}/{pid}/{txn}", params={k: str(v) for k, v in params.items()})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == ONE_KEYS, body
    return body


def keys(body: dict) -> list[tuple[str, int]]:
    return [(m["partition"], m["offset"]) for m in body["messages"]]


def expected_order(db: psycopg.Connection, queue: str) -> list[tuple[str, int]]:
    """(partition, offset) of every message of ``queue`` in list order, from the segments."""
    return [(p, o) for p, o in db.execute(
        "SELECT lp.name, s.base_offset + k FROM queen.log_segments s "
        "JOIN queen.log_partitions lp ON lp.id = s.partition_id "
        "JOIN queen.queues q ON q.id = lp.queue_id "
        "CROSS JOIN LATERAL generate_series(0, s.msg_count - 1) k "
        "WHERE q.name = %s ORDER BY s.created_at, s.partition_id, s.base_offset + k",
        (queue,)).fetchall()]


def segment_sizes(db: psycopg.Connection, queue: str) -> list[int]:
    return [n for (n,) in db.execute(
        "SELECT s.msg_count FROM queen.log_segments s "
        "JOIN queen.log_partitions lp ON lp.id = s.partition_id "
        "JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s "
        "ORDER BY s.created_at, s.partition_id, s.base_offset", (queue,)).fetchall()]


def backdate(db: psycopg.Connection, queue: str, partition: str, by: dt.timedelta) -> None:
    """Move a whole partition's segments back in time (keeps created_at monotone)."""
    db.execute(
        "WITH p AS (SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues q "
        "ON q.id = lp.queue_id WHERE q.name = %(q)s AND lp.name = %(p)s) "
        "UPDATE queen.log_segments s SET created_at = s.created_at - %(by)s "
        "FROM p WHERE s.partition_id = p.id", {"q": queue, "p": partition, "by": by})
    db.execute(
        "UPDATE queen.log_partitions lp SET last_created_at = lp.last_created_at - %(by)s "
        "FROM queen.queues q WHERE q.id = lp.queue_id AND q.name = %(q)s AND lp.name = %(p)s",
        {"q": queue, "p": partition, "by": by})


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat()


def statuses(body: dict) -> dict[int, str]:
    return {m["offset"]: m["status"] for m in body["messages"]}


@pytest.fixture
def staged(broker, db):
    """Queue ``<ns>.work.x``, partition P: offsets 1..10 in segments of 3+3+4 messages.
    Group g: 1..3 completed, 4 dead-lettered (nack with retry_limit 0), 5..6 in a live
    lease, 7..10 pending. Group h dead-lettered offset 1 (its own row only)."""
    ns = uq("mns")
    q = f"{ns}.work.x"
    pushed = push(broker.client, q, [{"n": i} for i in range(1, 4)], partition="P")
    pushed += push(broker.client, q, [{"n": i} for i in range(4, 7)], partition="P")
    pushed += push(broker.client, q, [{"n": i} for i in range(7, 11)], partition="P")
    assert [p["offset"] for p in pushed] == list(range(1, 11))
    set_options(db, q, retry_limit=0)
    got = pop(broker.client, q, "g", batch=3)
    assert [m["offset"] for m in got["messages"]] == [1, 2, 3]
    for m in got["messages"]:
        assert ack(broker.client, m, "completed")["success"]
    got = pop(broker.client, q, "g", batch=1)
    (poison,) = got["messages"]
    assert poison["offset"] == 4
    item = ack(broker.client, poison, "failed", "boom")
    assert item["success"] and item["dlq"], item
    leased = pop(broker.client, q, "g", batch=2)
    assert [m["offset"] for m in leased["messages"]] == [5, 6]
    h = pop(broker.client, q, "h")
    assert ack(broker.client, h["messages"][0], "dlq", "h says no")["dlq"]
    return {"queue": q, "namespace": ns, "pushed": pushed, "leased": leased,
            "pid": pushed[0]["partitionId"]}


# ----------------------------------------------------------------------------------- listing
def test_list_shape_order_and_fields(broker, db):
    ns = uq("mshape")
    q = f"{ns}.tsk.q"
    trace = str(uuid.uuid4())
    a = push(broker.client, q, [{"a": 1}, {"a": 2}], partition="A", traceId=trace)
    b = push(broker.client, q, [{"b": 1}], partition="B")
    a += push(broker.client, q, [{"a": 3}], partition="A")
    body = listing(broker.client, queue=q)
    assert body["total"] == 4 and body["pagination"] == {"limit": 200, "offset": 0}
    assert keys(body) == expected_order(db, q)
    by_txn = {m["transactionId"]: m for m in body["messages"]}
    for p in a + b:
        m = by_txn[p["transactionId"]]
        assert m["id"] == p["messageId"] and m["partitionId"] == p["partitionId"]
        assert m["offset"] == p["offset"] and m["createdAt"] == p["createdAt"]
        assert m["queue"] == q and m["namespace"] == ns and m["task"] == "tsk"
        assert m["status"] == "pending" and m["leaseExpiresAt"] is None
        assert m["producerSub"] is None
    assert by_txn[a[0]["transactionId"]]["traceId"] == trace
    assert by_txn[b[0]["transactionId"]]["traceId"] is None
    assert "data" not in body["messages"][0]
    created = [m["createdAt"] for m in body["messages"]]
    assert created == sorted(created)
    # a queue without task: task null
    q2 = uq("mnotask")
    push(broker.client, q2, [1])
    (m,) = listing(broker.client, queue=q2)["messages"]
    assert m["task"] is None and m["namespace"] == q2


def test_filters(broker, db):
    ns = uq("mflt")
    q1, q2, q3 = f"{ns}.t1.a", f"{ns}.t2.b", f"{uq('mother')}.t1.c"
    push(broker.client, q1, [1, 2], partition="P1")
    push(broker.client, q1, [3], partition="P2/with/slash")
    push(broker.client, q2, [4, 5, 6])
    push(broker.client, q3, [7])
    assert listing(broker.client, queue=q1)["total"] == 3
    assert keys(listing(broker.client, queue=q1, partition="P2/with/slash")) == [
        ("P2/with/slash", 1)]
    assert listing(broker.client, queue=q1, partition="nope")["total"] == 0
    assert listing(broker.client, partition="P1", queue=q1)["total"] == 2
    assert listing(broker.client, namespace=ns)["total"] == 6
    assert {m["queue"] for m in listing(broker.client, namespace=ns)["messages"]} == {q1, q2}
    assert listing(broker.client, namespace=ns, task="t2")["total"] == 3
    assert listing(broker.client, namespace=ns, task="t1")["total"] == 3
    t1_all = listing(broker.client, task="t1", limit=1000)
    assert {q1, q3} <= {m["queue"] for m in t1_all["messages"]}
    assert listing(broker.client, queue=uq("mnone"))["total"] == 0
    # no filter at all: every queue of the tenant in the window
    assert listing(broker.client)["total"] >= 7
    # the group only changes statuses, never the set
    assert listing(broker.client, queue=q1, consumerGroup="whoever")["total"] == 3


def test_statuses_per_group(broker, db, staged):
    q = staged["queue"]
    body = listing(broker.client, queue=q, consumerGroup="g")
    assert body["total"] == 10
    assert statuses(body) == {1: "completed", 2: "completed", 3: "completed",
                              4: "dead_letter", 5: "processing", 6: "processing",
                              7: "pending", 8: "pending", 9: "pending", 10: "pending"}
    expiry = staged["leased"]["leaseExpiresAt"]
    for m in body["messages"]:
        assert m["leaseExpiresAt"] == (expiry if m["status"] == "processing" else None), m
    # queue mode (the default group) never popped: all pending
    assert set(statuses(listing(broker.client, queue=q)).values()) == {"pending"}
    assert listing(broker.client, queue=q, consumerGroup=QUEUE_MODE) == listing(
        broker.client, queue=q)
    # group h: offset 1 dead-lettered, nothing else consumed
    assert statuses(listing(broker.client, queue=q, consumerGroup="h")) == {
        1: "dead_letter", **{o: "pending" for o in range(2, 11)}}
    # each status filter: exact set and total
    for status, offsets in (("completed", [1, 2, 3]), ("dead_letter", [4]),
                            ("processing", [5, 6]), ("pending", [7, 8, 9, 10])):
        got = listing(broker.client, queue=q, consumerGroup="g", status=status)
        assert got["total"] == len(offsets), (status, got)
        assert [m["offset"] for m in got["messages"]] == offsets
        assert {m["status"] for m in got["messages"]} == {status}
    assert listing(broker.client, queue=q, consumerGroup="h", status="dead_letter")[
        "total"] == 1
    assert listing(broker.client, queue=q, status="completed")["total"] == 0
    # an expired lease is no longer processing
    db.execute("UPDATE queen.log_consumers c SET lease_expires_at = now() - interval '1 s' "
               "WHERE c.partition_id = %s AND c.consumer_group = 'g'",
               (int(staged["pid"]),))
    st = statuses(listing(broker.client, queue=q, consumerGroup="g"))
    assert st[5] == st[6] == "pending" and st[4] == "dead_letter" and st[3] == "completed"
    assert listing(broker.client, queue=q, consumerGroup="g", status="pending")["total"] == 6


def test_status_filter_pages_exactly(broker, db, staged):
    """Paging inside a status filter whose matches skip offsets across segments."""
    q = staged["queue"]
    # a DLQ row above the cursor (a seek back would leave one): excluded from pending
    pid = int(staged["pid"])
    db.execute("INSERT INTO queen.log_dlq (queue_id, partition_id, partition_name, "
               "consumer_group, \"offset\", message_id, transaction_id) "
               "SELECT q.id, %s, 'P', 'g', 8, gen_random_uuid(), 'x' FROM queen.queues q "
               "WHERE q.name = %s", (pid, q))
    full = listing(broker.client, queue=q, consumerGroup="g", status="pending")
    assert [m["offset"] for m in full["messages"]] == [7, 9, 10] and full["total"] == 3
    assert [m["offset"] for m in listing(broker.client, queue=q, consumerGroup="g",
                                         status="dead_letter")["messages"]] == [4, 8]
    everything = listing(broker.client, queue=q, consumerGroup="g")
    for status in ("pending", "dead_letter", "completed", "processing", None):
        params: dict[str, Any] = {"queue": q, "consumerGroup": "g"}
        if status:
            params["status"] = status
        whole = [m for m in everything["messages"] if status in (None, m["status"])]
        for offset in range(len(whole) + 1):
            for limit in (1, 2, 3):
                page = listing(broker.client, **params, limit=limit, offset=offset)
                assert page["total"] == len(whole)
                assert page["messages"] == whole[offset:offset + limit], (status, offset, limit)


def test_exact_paging_across_segment_boundaries(broker, db):
    q = uq("mpage")
    pushed = []
    for k in range(4):  # interleaved multi-message bodies over two partitions
        pushed += push(broker.client, q, [{"k": k, "i": i} for i in range(3)], partition="A")
        pushed += push(broker.client, q, [{"k": k, "j": j} for j in range(2)], partition="B")
    sizes = segment_sizes(db, q)
    assert len(sizes) >= 2 and max(sizes) > 1 and sum(sizes) == 20, sizes
    whole = listing(broker.client, queue=q, limit=1000)
    assert whole["total"] == 20 and keys(whole) == expected_order(db, q)
    page = listing(broker.client, queue=q, limit=3, offset=4)
    assert page["messages"] == whole["messages"][4:7]  # messages 5..7 of the order
    assert page["total"] == 20 and page["pagination"] == {"limit": 3, "offset": 4}
    for offset in range(0, 22):
        for limit in (1, 2, 3, 5, 7):
            got = listing(broker.client, queue=q, limit=limit, offset=offset)
            assert got["messages"] == whole["messages"][offset:offset + limit], (offset, limit)
            assert got["total"] == 20
    past = listing(broker.client, queue=q, limit=5, offset=500)
    assert past["messages"] == [] and past["total"] == 20


def test_time_window(broker, db):
    q = uq("mwin")
    push(broker.client, q, [1, 2], partition="old")
    push(broker.client, q, [3], partition="old")
    push(broker.client, q, [4], partition="new")
    backdate(db, q, "old", dt.timedelta(hours=2))
    # default: the last hour
    assert keys(listing(broker.client, queue=q)) == [("new", 1)]
    now = dt.datetime.now(dt.UTC)
    both = listing(broker.client, queue=q, **{"from": iso(now - dt.timedelta(hours=3))})
    assert keys(both) == [("old", 1), ("old", 2), ("old", 3), ("new", 1)]
    # only `to`: the hour before it
    old = listing(broker.client, queue=q, to=iso(now - dt.timedelta(minutes=90)))
    assert keys(old) == [("old", 1), ("old", 2), ("old", 3)]
    # both bounds are inclusive, to the microsecond
    (first,) = db.execute(
        "SELECT min(s.created_at) FROM queen.log_segments s JOIN queen.log_partitions lp "
        "ON lp.id = s.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.name = %s AND lp.name = 'old'", (q,)).fetchone()
    exact = listing(broker.client, queue=q, **{"from": iso(first), "to": iso(first)})
    assert keys(exact) == [("old", 1), ("old", 2)]
    after = listing(broker.client, queue=q, **{"from": iso(first + dt.timedelta(
        microseconds=1)), "to": iso(now - dt.timedelta(minutes=30))})
    assert keys(after) == [("old", 3)]
    assert listing(broker.client, queue=q, **{"from": "2000-01-01T00:00:00Z",
                                              "to": "2000-01-02T00:00:00Z"})["total"] == 0


def test_from_offset_browses_a_partition_exactly(broker, db, staged):
    """fromOffset cuts inside segments (3+3+4 messages): totals, statuses and pages are those
    of the whole list with the offsets below it removed, for every status filter."""
    q, params = staged["queue"], {"consumerGroup": "g", "partition": "P"}
    everything = listing(broker.client, queue=q, **params)["messages"]
    assert [m["offset"] for m in everything] == list(range(1, 11))
    for start in range(1, 12):
        for status in ("pending", "dead_letter", "completed", "processing", None):
            extra = {"status": status} if status else {}
            whole = [m for m in everything
                     if m["offset"] >= start and status in (None, m["status"])]
            got = listing(broker.client, queue=q, **params, **extra, fromOffset=start)
            assert got["messages"] == whole and got["total"] == len(whole), (start, status)
            for offset in range(len(whole) + 1):
                page = listing(broker.client, queue=q, **params, **extra, fromOffset=start,
                               limit=2, offset=offset)
                assert page["messages"] == whole[offset:offset + 2], (start, status, offset)
    # the queue route takes it too
    assert keys(listing(broker.client, f"/api/v1/status/queues/{q}/messages", **params,
                        fromOffset=9)) == [("P", 9), ("P", 10)]


def test_from_offset_has_no_default_time_window(broker, db):
    q = uq("moff")
    push(broker.client, q, [1, 2, 3], partition="old")
    push(broker.client, q, [4], partition="old")
    backdate(db, q, "old", dt.timedelta(days=3))
    assert listing(broker.client, queue=q, partition="old")["total"] == 0  # the last hour
    assert keys(listing(broker.client, queue=q, partition="old", fromOffset=2)) == [
        ("old", 2), ("old", 3), ("old", 4)]
    # with a time bound as well, both apply
    now = dt.datetime.now(dt.UTC)
    assert listing(broker.client, queue=q, partition="old", fromOffset=2,
                   **{"from": iso(now - dt.timedelta(days=1))})["total"] == 0
    # past the end: nothing, not an error
    assert listing(broker.client, queue=q, partition="old", fromOffset=99)["total"] == 0


def test_bad_parameters(broker):
    for params in ({"limit": "0"}, {"limit": "-1"}, {"limit": "ten"}, {"offset": "-1"},
                   {"offset": "1.5"}, {"status": "done"}, {"status": "DLQ"},
                   {"from": "yesterday"}, {"to": "2026-13-01T00:00:00Z"},
                   {"from": "2026-01-01T00:00:00"},
                   {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
                   {"fromOffset": "3"}, {"fromOffset": "0", "partition": "P"},
                   {"fromOffset": "x", "partition": "P"},
                   {"fromOffset": "", "partition": "P"}):
        assert_error(broker.client.get(MESSAGES, params=params), 400, "invalid_request")
    assert_error(broker.client.get(MESSAGES, params={"queue": "a/b"}), 400, "invalid_name")
    assert_error(broker.client.get(MESSAGES, params={"consumerGroup": "a/b"}), 400,
                 "invalid_name")
    assert_error(broker.client.get(MESSAGES, params={"queue": "q" * 256}), 413,
                 "name_too_long")
    clamped = listing(broker.client, queue=uq("mnone"), limit=5000)
    assert clamped["pagination"] == {"limit": 1000, "offset": 0} and clamped["total"] == 0
    assert listing(broker.client, queue=uq("mnone"), status="")["total"] == 0


def test_status_queue_messages_route(broker, db, staged):
    q = staged["queue"]
    path = f"/api/v1/status/queues/{q}/messages"
    assert listing(broker.client, path, consumerGroup="g") == listing(
        broker.client, queue=q, consumerGroup="g")
    assert listing(broker.client, path, consumerGroup="g", status="processing", limit=1,
                   offset=1)["messages"] == listing(
        broker.client, queue=q, consumerGroup="g", status="processing")["messages"][1:]
    # the path names the queue: a query `queue` does not widen it
    other = uq("mother")
    push(broker.client, other, [1])
    assert listing(broker.client, path, queue=other)["total"] == 10
    assert_error(broker.client.get(f"/api/v1/status/queues/{uq('mnone')}/messages"), 404,
                 "not_found")
    assert listing(broker.client, queue=uq("mnone"))["total"] == 0


# ---------------------------------------------------------------------------- one message
def test_single_message_with_group_views(broker, db, staged):
    q, pushed = staged["queue"], staged["pushed"]

    def get(offset: int, **params: Any) -> dict:
        p = pushed[offset - 1]
        return one(broker.client, p["partitionId"], p["transactionId"], **params)

    m = get(5, consumerGroup="g")
    p = pushed[4]
    assert m["id"] == p["messageId"] and m["transactionId"] == p["transactionId"]
    assert m["partitionId"] == p["partitionId"] and m["offset"] == 5
    assert m["queue"] == q and m["partition"] == "P" and m["namespace"] == staged["namespace"]
    assert m["task"] == "work" and m["createdAt"] == p["createdAt"]
    assert m["data"] == {"n": 5} and m["encrypted"] is False
    assert m["status"] == "processing"
    assert m["leaseExpiresAt"] == staged["leased"]["leaseExpiresAt"]
    assert m["errorMessage"] is None and m["retryCount"] == 0
    assert m["consumerGroups"] == [
        {"name": "g", "status": "processing", "leaseExpiresAt": m["leaseExpiresAt"]},
        {"name": "h", "status": "pending", "leaseExpiresAt": None}]
    # the list fields agree with the listing
    (listed,) = [x for x in listing(broker.client, queue=q, consumerGroup="g")["messages"]
                 if x["offset"] == 5]
    assert {k: m[k] for k in LIST_KEYS} == listed
    # default group: queue mode, no cursor there
    assert get(5)["status"] == "pending" and get(5)["leaseExpiresAt"] is None
    dead = get(4, consumerGroup="g")
    assert dead["status"] == "dead_letter" and dead["errorMessage"] == "boom"
    assert dead["retryCount"] == 0 and dead["data"] == {"n": 4}
    assert get(1, consumerGroup="g")["status"] == "completed"
    first = get(1, consumerGroup="h")
    assert first["status"] == "dead_letter" and first["errorMessage"] == "h says no"
    assert first["consumerGroups"] == [
        {"name": "g", "status": "completed", "leaseExpiresAt": None},
        {"name": "h", "status": "dead_letter", "leaseExpiresAt": None}]
    assert get(9, consumerGroup="g")["status"] == "pending"


def test_single_message_retry_count_of_the_head(broker, db):
    q = uq("mhead")
    (p,) = push(broker.client, q, [{"x": 1}])
    set_options(db, q, retry_limit=5)
    m = pop(broker.client, q, "w")["messages"][0]
    item = ack(broker.client, m, "failed", "try again")
    assert item["success"] and not item["dlq"], item
    got = one(broker.client, p["partitionId"], p["transactionId"], consumerGroup="w")
    assert got["status"] == "pending" and got["retryCount"] == 1
    assert got["errorMessage"] is None


def test_single_message_not_found_and_bad_addresses(broker, db):
    q = uq("m404")
    (p,) = push(broker.client, q, [1])
    pid, txn = p["partitionId"], p["transactionId"]
    assert_error(broker.client.get(f"{MESSAGES}/{pid}/nope"), 404, "not_found")
    assert_error(broker.client.get(f"{MESSAGES}/9223372036854775000/{txn}"), 404, "not_found")
    assert_error(broker.client.get(f"{MESSAGES}/abc/{txn}"), 400, "invalid_request")
    assert_error(broker.client.get(f"{MESSAGES}/0/{txn}"), 400, "invalid_request")
    assert_error(broker.client.get(f"{MESSAGES}/{pid}/{'t' * 1025}"), 413, "name_too_long")
    assert_error(broker.client.get(f"{MESSAGES}/{pid}/{txn}",
                                   params={"consumerGroup": "a/b"}), 400, "invalid_name")
    # retained away: 404 (the sidecar row alone does not make a message)
    db.execute("DELETE FROM queen.log_segments WHERE partition_id = %s", (int(pid),))
    db.execute("UPDATE queen.log_partitions SET log_start_offset = 2 WHERE id = %s", (int(pid),))
    assert_error(broker.client.get(f"{MESSAGES}/{pid}/{txn}"), 404, "not_found")
    # the DELETE of the same template is still the DLQ delete; retry is still POST only
    assert_error(broker.client.delete(f"{MESSAGES}/{pid}/{txn}"), 404, "not_found")
    assert_error(broker.client.get(f"{MESSAGES}/{pid}/{txn}/retry"), 405, "method_not_allowed")


def test_repeated_transaction_id_answers_the_newest(broker, db):
    q = uq("mdup")
    (first,) = push(broker.client, q, [{"v": 1}], transactionId="order-1")
    set_options(db, q, dedup_window=0)
    push(broker.client, q, [{"v": "between"}])
    (second,) = push(broker.client, q, [{"v": 2}], transactionId="order-1")
    assert (first["offset"], second["offset"]) == (1, 3)
    got = one(broker.client, first["partitionId"], "order-1")
    assert got["offset"] == 3 and got["id"] == second["messageId"] and got["data"] == {"v": 2}
    # two aligned occurrences in one sidecar row (one body drops in-body duplicates, so the
    # earlier slot is made to carry the later one's hash): the later slot wins
    x, y = push(broker.client, q, [{"v": 4}, {"v": 5}])
    _overlay(db, int(x["partitionId"]), x["offset"], 1, txn_hash(y["transactionId"]))
    got = one(broker.client, y["partitionId"], y["transactionId"])
    assert got["offset"] == y["offset"] == 5 and got["data"] == {"v": 5}


def _overlay(db: psycopg.Connection, pid: int, base: int, at: int, digest: bytes) -> None:
    db.execute("UPDATE queen.log_txns SET hashes = overlay(hashes placing %s from %s for 16) "
               "WHERE partition_id = %s AND base_offset = %s", (digest, at, pid, base))


def test_hash_collision_and_misaligned_hit(broker, db):
    q = uq("mcoll")
    (target,) = push(broker.client, q, [{"t": 1}], transactionId="target")
    set_options(db, q, dedup_window=0)
    decoys = push(broker.client, q, [{"d": 1}, {"d": 2}, {"d": 3}])
    pid, base = int(target["partitionId"]), decoys[0]["offset"]
    digest = txn_hash("target")
    # offset 3 of the newer row now carries target's hash (a collision): its frame says
    # otherwise, so the lookup goes on to the older occurrence
    _overlay(db, pid, base, 16 + 1, digest)
    got = one(broker.client, target["partitionId"], "target")
    assert got["offset"] == 1 and got["data"] == {"t": 1}
    # the hash straddling two entries (from byte 9 of the row): not an occurrence
    _overlay(db, pid, base, 16 + 1, txn_hash(decoys[1]["transactionId"]))
    _overlay(db, pid, base, 8 + 1, digest)
    got = one(broker.client, target["partitionId"], "target")
    assert got["offset"] == 1
    # a misaligned copy first, the real (aligned) one later in the same row: the aligned one
    r = broker.client.post("/api/v1/push", json={"items": [
        {"queue": q, "payload": {"e": 0}}, {"queue": q, "payload": {"e": 1}},
        {"queue": q, "payload": {"t": 2}, "transactionId": "target"}]})
    assert r.status_code == 201 and [x["offset"] for x in r.json()] == [5, 6, 7], r.text
    _overlay(db, pid, 5, 8 + 1, digest)
    got = one(broker.client, target["partitionId"], "target")
    assert got["offset"] == 7 and got["data"] == {"t": 2}


def test_fallback_below_a_purged_sidecar(broker, db):
    q = uq("mpurged")
    (a,) = push(broker.client, q, [{"v": "a"}], transactionId="again")
    set_options(db, q, dedup_window=0)
    push(broker.client, q, [{"v": "x"}, {"v": "y"}])
    (b,) = push(broker.client, q, [{"v": "b"}], transactionId="again")
    pid = int(a["partitionId"])
    # the sidecar purged up to the tail (as housekeeping would after its life)
    db.execute("DELETE FROM queen.log_txns WHERE partition_id = %s", (pid,))
    db.execute("UPDATE queen.log_partitions SET txns_start = last_offset + 1 WHERE id = %s",
               (pid,))
    got = one(broker.client, a["partitionId"], "again")
    assert got["offset"] == b["offset"] == 4 and got["data"] == {"v": "b"}
    x = push(broker.client, q, [{"v": "z"}])[0]  # covered by the sidecar again
    assert one(broker.client, a["partitionId"], x["transactionId"])["offset"] == 5
    assert_error(broker.client.get(f"{MESSAGES}/{pid}/absent"), 404, "not_found")


def test_fallback_is_bounded(db_dsn, broker, db, monkeypatch):
    """The decode-newest-first fallback stops after its bound (here 2 segments): 404."""
    q = uq("mbound")
    (needle,) = push(broker.client, q, [{"v": "needle"}], transactionId="needle")
    for i in range(3):
        push(broker.client, q, [{"v": i}])
    pid = int(needle["partitionId"])
    db.execute("DELETE FROM queen.log_txns WHERE partition_id = %s", (pid,))
    db.execute("UPDATE queen.log_partitions SET txns_start = last_offset + 1 WHERE id = %s",
               (pid,))

    async def lookup() -> Any:
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            return await messages._lookup(conn, ZERO_UUID, pid, "needle", 1 << 20)

    monkeypatch.setattr(messages, "FALLBACK_PAGE", 1)
    monkeypatch.setattr(messages, "FALLBACK_MAX_SEGMENTS", 3)
    assert asyncio.run(lookup()) is None  # the needle is the 4th segment down
    monkeypatch.setattr(messages, "FALLBACK_MAX_SEGMENTS", 4)
    hit = asyncio.run(lookup())
    assert hit is not None and hit.message.offset == 1
    monkeypatch.setattr(messages, "FALLBACK_MAX_MESSAGES", 2)
    assert asyncio.run(lookup()) is None
    # the broker (default bounds) finds it
    assert one(broker.client, str(pid), "needle")["data"] == {"v": "needle"}


def test_encrypted_message(make_broker, db_dsn, broker):
    b = make_broker(db_dsn, QUEEN_ENCRYPTION_KEY=KEY)
    q = uq("menc")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, encryption_enabled) VALUES (%s, true)",
                     (q,))
    secret = {"card": "4111-1111", "cvv": 123}
    (p, p2) = push(b.client, q, [secret, None])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        stored = stored_messages(conn, q)
    assert all(b"4111" not in s.payload for s in stored)
    assert PayloadCipher(KEY).decrypt(stored[0].payload) == b'{"card":"4111-1111","cvv":123}'
    got = one(b.client, p["partitionId"], p["transactionId"])
    assert got["data"] == secret and got["encrypted"] is True
    assert one(b.client, p2["partitionId"], p2["transactionId"])["data"] is None
    # the listing carries no payload: the same on any broker
    assert keys(listing(b.client, queue=q)) == [("Default", 1), ("Default", 2)]
    assert listing(broker.client, queue=q) == listing(b.client, queue=q)
    # a broker without the key: still found, data null, encrypted true
    plain = one(broker.client, p["partitionId"], p["transactionId"])
    assert plain["data"] is None and plain["encrypted"] is True and plain["offset"] == 1


# ---------------------------------------------------------------------------------- tenancy
def test_other_tenant_sees_nothing(broker, db, staged):
    q, pid = staged["queue"], int(staged["pid"])
    rows = db.execute("SELECT * FROM queen.msg_list_v1(%s, %s, NULL, NULL, NULL, 'g', NULL, "
                      "NULL, NULL, 10, 0)", (OTHER_TENANT, q)).fetchall()
    assert rows == []
    (total, skip) = db.execute(
        "SELECT total, skip FROM queen.msg_list_v1(%s, NULL, NULL, %s, NULL, 'g', NULL, "
        "NULL, NULL, 10, 0)", (OTHER_TENANT, staged["namespace"])).fetchone()
    assert (total, skip) == (0, None)
    digest = txn_hash(staged["pushed"][0]["transactionId"])
    assert db.execute("SELECT count(*) FROM queen.msg_find_v1(%s, %s, %s, NULL)",
                      (OTHER_TENANT, pid, digest)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM queen.msg_groups_v1(%s, %s, 1)",
                      (OTHER_TENANT, pid)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM queen.msg_segments_below_v1(%s, %s, 100, 10)",
                      (OTHER_TENANT, pid)).fetchone()[0] == 0
    # the default tenant finds it
    assert db.execute("SELECT found_offset FROM queen.msg_find_v1(%s, %s, %s, NULL)",
                      (uuid.UUID(int=0), pid, digest)).fetchone()[0] == 1


# ------------------------------------------------------------------------------- the client
def test_the_26_client_message_calls(broker, db, staged):
    q, p = staged["queue"], staged["pushed"][6]

    async def go() -> dict[str, Any]:
        async with Queen(broker.url) as client:
            admin = client.admin
            return {
                "list": await admin.list_messages(queue=q, consumerGroup="g", status="pending",
                                                  limit=2, offset=1),
                "one": await admin.get_message(p["partitionId"], p["transactionId"]),
            }

    out = asyncio.run(go())
    assert out["list"]["total"] == 4 and out["list"]["pagination"] == {"limit": 2, "offset": 1}
    assert [m["offset"] for m in out["list"]["messages"]] == [8, 9]
    assert out["one"]["offset"] == 7 and out["one"]["data"] == {"n": 7}
    assert out["one"]["status"] == "pending"
