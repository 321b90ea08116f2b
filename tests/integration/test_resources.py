"""Admin and ops routes (api.md 5): resources overview / queues / queue detail / depth /
namespaces / tasks / partitions, queue delete, status, status queues, analytics and stats
refresh, against the real broker process on the session database.

State is made over HTTP (pushes, pops, acks) where the broker can make it, and with SQL where
a test needs exact times (segment created_at) or a lock held on purpose. Counts of the whole
tenant (overview) are checked as differences around the test's own changes: the session
database is shared with the other tests, which do not run concurrently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import datetime as dt
import re
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from queen import Queen

from tests.integration.test_configure import configure
from tests.integration.test_dlq import ack, pop
from tests.integration.test_dlq import push as push_payloads
from tests.integration.test_push_json import uq

R = "/api/v1/resources"
ISO_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
QUEUE_MODE = "__QUEUE_MODE__"


# ---------------------------------------------------------------------------------- helpers
def get(client: httpx.Client, path: str, **params: Any) -> dict:
    r = client.get(path, params={k: str(v) for k, v in params.items()})
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


def assert_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    return body


def iso(t: dt.datetime) -> str:
    t = t.astimezone(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def pid_of(db: psycopg.Connection, queue: str, partition: str) -> int:
    row = db.execute("SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues q"
                     " ON q.id = lp.queue_id WHERE q.name = %s AND lp.name = %s",
                     (queue, partition)).fetchone()
    assert row is not None
    return row[0]


def db_now(db: psycopg.Connection) -> dt.datetime:
    row = db.execute("SELECT date_trunc('minute', now())").fetchone()
    assert row is not None
    return row[0]


def one_per_push(client: httpx.Client, queue: str, partition: str, n: int) -> None:
    """n one-message segments (each push answered before the next: one segment each)."""
    for i in range(n):
        push_payloads(client, queue, [{"i": i}], partition=partition)


@pytest.fixture
def busy(broker, db):
    """Queue ``<ns>.jobs.<x>``: partition A (3 messages, one segment each), B (2 messages).
    Group g1 holds a live lease on A's offsets 1..2 (cursor 0); group g2 dead-lettered B's
    offset 1 (cursor 1). Queue mode never popped. Each group's first pop gave it a cursor on
    both partitions at the log start (the ready index, schema/002): g1 at 0 on B, g2 at 0 on
    A, so B's lowest cursor is g1's 0."""
    ns = uq("rns")
    q = f"{ns}.jobs.x"
    one_per_push(broker.client, q, "A", 3)
    one_per_push(broker.client, q, "B", 2)
    leased = pop(broker.client, q, "g1", partition="A", batch=2)
    assert leased is not None and [m["offset"] for m in leased["messages"]] == [1, 2]
    dead = pop(broker.client, q, "g2", partition="B")
    assert dead is not None
    item = ack(broker.client, dead["messages"][0], "dlq", "poison pill")
    assert item["dlq"] is True, item
    return {"queue": q, "namespace": ns, "leased": leased}


# ---------------------------------------------------------------------------- resources
def test_overview_counts(make_broker, fresh_db_dsn):
    """On a database of its own: the overview counts the whole database, and in the session
    database other modules' queues may change between the two reads (their retention and
    timers run in the session broker's background); a serial run saw the total 1 short."""
    broker = make_broker(fresh_db_dsn)
    before = get(broker.client, f"{R}/overview")
    assert set(before) == {"queues", "partitions", "namespaces", "tasks", "consumerGroups",
                           "messages", "timestamp"}
    assert set(before["messages"]) == {"total", "pending", "processing", "deadLetter"}
    assert ISO_MS_Z.match(before["timestamp"])
    ns = uq("ovn")
    q1, q2 = f"{ns}.t1.a", f"{ns}.t2.b"
    push_payloads(broker.client, q1, [1, 2, 3], partition="p1")
    push_payloads(broker.client, q1, [4], partition="p2")
    configure(broker.client, q2)  # a queue without partitions
    g = uq("ovg")
    got = pop(broker.client, q1, g, partition="p1")
    assert got is not None
    item = ack(broker.client, got["messages"][0], "dlq", "bad")  # cursor 1, DLQ row
    assert item["dlq"] and item["leaseReleased"], item
    after = get(broker.client, f"{R}/overview")
    delta = {k: after[k] - before[k] for k in ("queues", "partitions", "namespaces", "tasks",
                                               "consumerGroups")}
    assert delta == {"queues": 2, "partitions": 2, "namespaces": 1, "tasks": 2,
                     "consumerGroups": 1}
    mdelta = {k: after["messages"][k] - before["messages"][k] for k in before["messages"]}
    # p1: cursor 1 of 3 -> 2 pending; p2: no cursor -> 1 pending
    assert mdelta == {"total": 4, "pending": 3, "processing": 0, "deadLetter": 1}


def test_queue_list_filters_and_paging(broker, db, busy):
    q, ns = busy["queue"], busy["namespace"]
    other = f"{ns}.other"
    configure(broker.client, other, {"priority": 5})
    body = get(broker.client, f"{R}/queues", namespace=ns)
    assert body["total"] == 2
    assert [x["name"] for x in body["queues"]] == sorted([q, other])
    row = next(x for x in body["queues"] if x["name"] == q)
    assert set(row) == {"id", "name", "namespace", "task", "priority", "createdAt",
                        "partitions", "messages"}
    assert isinstance(row["id"], str) and row["id"].isdigit()
    assert (row["namespace"], row["task"], row["partitions"]) == (ns, "jobs", 2)
    # A: lowest cursor 0 -> 3; B: lowest cursor (g1) 0 -> 2. Processing: g1's 2 leased.
    assert row["messages"] == {"total": 5, "pending": 5, "processing": 2, "deadLetter": 1}
    o = next(x for x in body["queues"] if x["name"] == other)
    assert (o["task"], o["priority"], o["partitions"]) == ("other", 5, 0)
    assert o["messages"] == {"total": 0, "pending": 0, "processing": 0, "deadLetter": 0}

    assert [x["name"] for x in get(broker.client, f"{R}/queues", namespace=ns,
                                   task="jobs")["queues"]] == [q]
    page = get(broker.client, f"{R}/queues", namespace=ns, limit=1, offset=1)
    assert page["total"] == 2 and [x["name"] for x in page["queues"]] == sorted([q, other])[1:]
    past = get(broker.client, f"{R}/queues", namespace=ns, offset=5)
    assert past == {"queues": [], "total": 2}
    assert get(broker.client, f"{R}/queues", namespace=uq("none")) == {"queues": [],
                                                                       "total": 0}
    assert_error(broker.client.get(f"{R}/queues", params={"limit": "0"}), 400,
                 "invalid_request")
    assert_error(broker.client.get(f"{R}/queues", params={"offset": "x"}), 400,
                 "invalid_request")


def test_queue_detail(broker, db, busy):
    q = busy["queue"]
    d = get(broker.client, f"{R}/queues/{q}")
    assert set(d) == {"id", "name", "namespace", "task", "priority", "createdAt", "updatedAt",
                      "options", "partitions", "totals", "consumerGroups"}
    assert d["name"] == q and d["task"] == "jobs"
    assert d["options"]["leaseTime"] == 300 and len(d["options"]) == 16
    parts = {p["name"]: p for p in d["partitions"]}
    assert list(parts) == ["A", "B"]
    a, b = parts["A"], parts["B"]
    assert set(a) == {"id", "name", "createdAt", "lastOffset", "logStartOffset", "lastWriteAt",
                      "messages"}
    assert a["id"] == str(pid_of(db, q, "A"))
    assert (a["lastOffset"], a["logStartOffset"], b["lastOffset"], b["logStartOffset"]) == (
        3, 1, 2, 1)
    assert ISO_MS_Z.match(a["createdAt"]) and ISO_MS_Z.match(a["lastWriteAt"])
    assert a["messages"] == {"total": 3, "pending": 3, "processing": 2}
    assert b["messages"] == {"total": 2, "pending": 2, "processing": 0}
    assert d["totals"] == {"partitions": 2, "messages": {"total": 5, "pending": 5,
                                                         "processing": 2, "deadLetter": 1},
                           "evicted": 0}
    groups = {g["name"]: g for g in d["consumerGroups"]}
    assert list(groups) == ["g1", "g2"]
    # g1: A behind cursor 0 -> 3; B: cursor at the log start (its first start) -> 2
    assert groups["g1"]["partitions"] == 2
    assert (groups["g1"]["pending"], groups["g1"]["processing"], groups["g1"]["members"]) == (
        5, 2, 1)
    # g2: B behind cursor 1 -> 1; A: cursor at the log start -> 3
    assert (groups["g2"]["pending"], groups["g2"]["processing"]) == (4, 0)
    assert groups["g2"]["totalConsumed"] == 1
    assert groups["g2"]["subscriptionMode"] is not None

    # the status variant adds every group's cursors
    s = get(broker.client, f"/api/v1/status/queues/{q}")
    sg = {g["name"]: g for g in s["consumerGroups"]}
    c1, c1b = sg["g1"]["cursors"]
    assert (c1["partition"], c1["committedOffset"], c1["lastOffset"], c1["pending"]) == (
        "A", 0, 3, 3)
    assert (c1b["partition"], c1b["committedOffset"], c1b["pending"]) == ("B", 0, 2)
    assert c1["leaseActive"] is True and (c1["batchStart"], c1["batchEnd"]) == (1, 2)
    assert ISO_MS_Z.match(c1["leaseExpiresAt"])
    c2a, c2 = sg["g2"]["cursors"]
    assert (c2a["partition"], c2a["committedOffset"], c2a["leaseActive"]) == ("A", 0, False)
    assert (c2["partition"], c2["committedOffset"], c2["leaseActive"]) == ("B", 1, False)

    for path in (f"{R}/queues/{uq('nope')}", f"/api/v1/status/queues/{uq('nope')}",
                 f"{R}/queues/{uq('nope')}/depth"):
        assert_error(broker.client.get(path), 404, "not_found")
    assert_error(broker.client.get(f"{R}/queues/bad%01name"), 400, "invalid_name")


def test_depth_with_and_without_group(broker, db, busy):
    q = busy["queue"]
    keys = {"queue", "group", "pending", "partitionsPending", "conflation", "effectivePending",
            "partitions"}
    d = get(broker.client, f"{R}/queues/{q}/depth")
    assert set(d) == keys
    assert d == {"queue": q, "group": None, "pending": 5, "partitionsPending": 2,
                 "conflation": False, "effectivePending": 5,
                 "partitions": [{"partition": "A", "pending": 3},
                                {"partition": "B", "pending": 2}]}
    g2 = get(broker.client, f"{R}/queues/{q}/depth", group="g2")
    assert (g2["group"], g2["pending"], g2["effectivePending"]) == ("g2", 4, 4)
    assert g2["partitions"] == [{"partition": "A", "pending": 3},
                                {"partition": "B", "pending": 1}]
    # an unknown group would start at the log start everywhere
    fresh = get(broker.client, f"{R}/queues/{q}/depth", group="never")
    assert (fresh["pending"], fresh["partitionsPending"]) == (5, 2)

    # g1 completes its batch: A's g1 cursor moves to 2, g2's stays at 0 (A's lowest)
    for m in busy["leased"]["messages"]:
        ack(broker.client, m, "completed")
    d = get(broker.client, f"{R}/queues/{q}/depth")
    assert d["partitions"] == [{"partition": "A", "pending": 3},
                               {"partition": "B", "pending": 2}]
    # a group whose subscription record starts after every message has nothing pending
    db.execute("INSERT INTO queen.consumer_groups_meta (queue_id, consumer_group,"
               " subscription_mode, subscription_from) SELECT id, 'late', 'timestamp',"
               " now() + interval '1 hour' FROM queen.queues WHERE name = %s", (q,))
    late = get(broker.client, f"{R}/queues/{q}/depth", group="late")
    assert (late["pending"], late["partitionsPending"]) == (0, 0)
    # a cursor below the log start counts from the log start (where it resumes)
    db.execute("UPDATE queen.log_partitions SET log_start_offset = 3 WHERE id = %s",
               (pid_of(db, q, "B"),))
    d = get(broker.client, f"{R}/queues/{q}/depth")
    assert d["partitions"][1] == {"partition": "B", "pending": 0}
    never = get(broker.client, f"{R}/queues/{q}/depth", group="never")
    assert never["partitions"] == [{"partition": "A", "pending": 3},
                                   {"partition": "B", "pending": 0}]
    # a queue without partitions
    empty = uq("empty")
    configure(broker.client, empty)
    assert get(broker.client, f"{R}/queues/{empty}/depth")["partitions"] == []


def test_namespaces_and_tasks(broker, db):
    ns = uq("nst")
    push_payloads(broker.client, f"{ns}.alpha.q1", [1, 2])
    push_payloads(broker.client, f"{ns}.alpha.q2", [3])
    push_payloads(broker.client, ns, [4, 5, 6])  # no task
    configure(broker.client, uq("elsewhere"), namespace=ns, task="beta")
    body = get(broker.client, f"{R}/namespaces")
    (row,) = [x for x in body["namespaces"] if x["namespace"] == ns]
    assert row == {"namespace": ns, "queues": 4, "partitions": 3,
                   "messages": {"total": 6, "pending": 6}}
    tasks = [x for x in get(broker.client, f"{R}/tasks")["tasks"] if x["namespace"] == ns]
    assert tasks == [
        {"task": "alpha", "namespace": ns, "queues": 2, "partitions": 2,
         "messages": {"total": 3, "pending": 3}},
        {"task": "beta", "namespace": ns, "queues": 1, "partitions": 0,
         "messages": {"total": 0, "pending": 0}}]


def test_partitions_paging(broker, db):
    q = uq("parts")
    for name in ("e", "a", "d", "b", "c"):
        push_payloads(broker.client, q, [name], partition=name)
    body = get(broker.client, f"{R}/partitions", queue=q, limit=2)
    assert body["total"] == 5
    assert [p["name"] for p in body["partitions"]] == ["a", "b"]
    p = body["partitions"][0]
    assert set(p) == {"id", "queue", "name", "createdAt", "lastOffset", "logStartOffset",
                      "lastWriteAt"}
    assert (p["id"], p["queue"], p["lastOffset"], p["logStartOffset"]) == (
        str(pid_of(db, q, "a")), q, 1, 1)
    assert [p["name"] for p in get(broker.client, f"{R}/partitions", queue=q, limit=2,
                                   offset=4)["partitions"]] == ["e"]
    assert get(broker.client, f"{R}/partitions", queue=q, offset=9) == {"partitions": [],
                                                                       "total": 5}
    assert get(broker.client, f"{R}/partitions", queue=uq("none")) == {"partitions": [],
                                                                      "total": 0}
    everything = get(broker.client, f"{R}/partitions", limit=1000)
    assert everything["total"] >= 5
    assert_error(broker.client.get(f"{R}/partitions", params={"limit": "0"}), 400,
                 "invalid_request")
    assert_error(broker.client.get(f"{R}/partitions", params={"offset": "-1"}), 400,
                 "invalid_request")


# ------------------------------------------------------------------------------ queue delete
def _footprint(db: psycopg.Connection, queue: str, pids: list[int], qid: int) -> dict:
    row = db.execute(
        "SELECT (SELECT count(*) FROM queen.queues WHERE name = %(q)s),"
        " (SELECT count(*) FROM queen.log_partitions WHERE queue_id = %(qid)s),"
        " (SELECT count(*) FROM queen.log_segments WHERE partition_id = ANY(%(p)s)),"
        " (SELECT count(*) FROM queen.log_txns WHERE partition_id = ANY(%(p)s)),"
        " (SELECT count(*) FROM queen.log_consumers WHERE partition_id = ANY(%(p)s)),"
        " (SELECT count(*) FROM queen.consumer_groups_meta WHERE queue_id = %(qid)s),"
        " (SELECT count(*) FROM queen.log_dlq WHERE queue_id = %(qid)s),"
        " (SELECT count(*) FROM queen.timers WHERE queue_id = %(qid)s)",
        {"q": queue, "qid": qid, "p": pids}).fetchone()
    return dict(zip(("queues", "partitions", "segments", "txns", "cursors", "meta", "dlq",
                     "timers"), row, strict=True))


def test_queue_delete_removes_everything_under_it(broker, db, busy):
    q = busy["queue"]
    qid = int(get(broker.client, f"{R}/queues/{q}")["id"])
    pids = [pid_of(db, q, "A"), pid_of(db, q, "B")]
    db.execute("INSERT INTO queen.timers (queue_id, timer_key, fire_at, transaction_id,"
               " message_id) VALUES (%s, 'k1', now() + interval '1 hour', 't', %s)",
               (qid, uuid.uuid4()))
    before = _footprint(db, q, pids, qid)
    assert before == {"queues": 1, "partitions": 2, "segments": 5, "txns": 5, "cursors": 4,
                      "meta": 2, "dlq": 1, "timers": 1}
    r = broker.client.delete(f"{R}/queues/{q}")
    assert r.status_code == 200, r.text
    assert r.json() == {"deleted": True, "queue": q, "existed": True}
    assert set(_footprint(db, q, pids, qid).values()) == {0}
    r = broker.client.delete(f"{R}/queues/{q}")
    assert r.status_code == 200, r.text
    assert r.json() == {"deleted": True, "queue": q, "existed": False}
    assert_error(broker.client.get(f"{R}/queues/{q}"), 404, "not_found")
    # the name is free again: a push recreates it from scratch
    push_payloads(broker.client, q, [1], partition="A")
    assert get(broker.client, f"{R}/queues/{q}")["partitions"][0]["lastOffset"] == 1


def test_queue_delete_waits_for_a_partition_lock(broker, db, db_dsn):
    """The delete takes the partition rows' locks (as an in-flight push holds them)."""
    q = uq("dlock")
    push_payloads(broker.client, q, [1], partition="P")
    pid = pid_of(db, q, "P")
    with psycopg.connect(db_dsn) as holder, cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=30) as c:
        holder.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s FOR UPDATE", (pid,))
        fut = ex.submit(c.delete, f"{R}/queues/{q}")
        time.sleep(0.8)
        assert not fut.done()
        holder.commit()
        r = fut.result(timeout=20)
    assert r.status_code == 200 and r.json()["existed"] is True, r.text
    assert db.execute("SELECT count(*) FROM queen.log_partitions WHERE id = %s",
                      (pid,)).fetchone()[0] == 0


def test_queue_purge_keeps_the_queue_and_what_live_leases_cover(broker, db, busy):
    """A's messages are under g1's live lease from offset 1: all kept. B's go; its cursors move
    to the new log start; the DLQ row, the sidecar, cursors and groups stay."""
    q = busy["queue"]
    qid = int(get(broker.client, f"{R}/queues/{q}")["id"])
    pids = [pid_of(db, q, "A"), pid_of(db, q, "B")]
    r = broker.client.post(f"{R}/queues/{q}/purge")
    assert r.status_code == 200, r.text
    assert r.json() == {"queue": q, "partitions": 2, "purged": 2, "kept": 3}
    assert _footprint(db, q, pids, qid) == {"queues": 1, "partitions": 2, "segments": 3,
                                            "txns": 5, "cursors": 4, "meta": 2, "dlq": 1,
                                            "timers": 0}
    cursors = dict(db.execute("SELECT consumer_group, committed_offset FROM queen.log_consumers"
                              " WHERE partition_id = %s", (pids[1],)).fetchall())
    assert cursors == {"g1": 2, "g2": 2}
    assert get(broker.client, f"{R}/queues/{q}/depth", group="g2")["pending"] == 3

    for m in busy["leased"]["messages"]:  # the lease holder acks as if nothing happened
        assert ack(broker.client, m, "completed")["success"]
    r = broker.client.post(f"{R}/queues/{q}/purge")
    assert r.status_code == 200, r.text
    assert r.json() == {"queue": q, "partitions": 2, "purged": 3, "kept": 0}
    detail = get(broker.client, f"{R}/queues/{q}")
    assert [(p["name"], p["logStartOffset"], p["lastOffset"], p["messages"]["total"])
            for p in detail["partitions"]] == [("A", 4, 3, 0), ("B", 3, 2, 0)]
    assert get(broker.client, f"{R}/queues/{q}/depth", group="g2")["pending"] == 0
    assert_error(broker.client.post(f"{R}/queues/{uq('nope')}/purge"), 404, "not_found")


def test_queue_purge_waits_for_a_partition_lock(broker, db, db_dsn):
    """The purge takes the partition rows' locks, so an in-flight push commits first."""
    q = uq("plock")
    push_payloads(broker.client, q, [1, 2], partition="P")
    pid = pid_of(db, q, "P")
    with psycopg.connect(db_dsn) as holder, cf.ThreadPoolExecutor(1) as ex, \
            httpx.Client(base_url=broker.url, timeout=30) as c:
        holder.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s FOR UPDATE", (pid,))
        fut = ex.submit(c.post, f"{R}/queues/{q}/purge")
        time.sleep(0.8)
        assert not fut.done()
        holder.commit()
        r = fut.result(timeout=20)
    assert r.status_code == 200 and r.json()["purged"] == 2, r.text


def test_parked_pop_on_a_deleted_queue_answers_204_at_its_deadline(broker, db):
    q = uq("park")
    configure(broker.client, q)
    with cf.ThreadPoolExecutor(1) as ex, httpx.Client(base_url=broker.url, timeout=30) as c:
        started = time.monotonic()
        fut = ex.submit(c.get, f"/api/v1/pop/queue/{q}", params={
            "wait": "true", "timeout": "2500", "consumerGroup": "parked"})
        time.sleep(0.5)
        r = broker.client.delete(f"{R}/queues/{q}")
        assert r.status_code == 200 and r.json()["existed"] is True
        answer = fut.result(timeout=20)
        elapsed = time.monotonic() - started
    assert answer.status_code == 204, answer.text
    assert elapsed >= 2.0, elapsed


# ------------------------------------------------------------------------------------ status
def test_admin_segment_from_binary_search(broker, db):
    q = uq("bs")
    one_per_push(broker.client, q, "P", 13)
    pid = pid_of(db, q, "P")
    base = db_now(db) - dt.timedelta(hours=2)
    db.execute("UPDATE queen.log_segments SET created_at = %s + base_offset * interval"
               " '1 minute' WHERE partition_id = %s", (base, pid))

    def first(t: dt.datetime | None) -> int | None:
        return db.execute("SELECT queen.admin_segment_from_v1(%s, %s)", (pid, t)).fetchone()[0]

    for k in range(1, 14):
        assert first(base + dt.timedelta(minutes=k)) == k
        assert first(base + dt.timedelta(minutes=k, seconds=-30)) == k
    assert first(base) == 1
    assert first(base + dt.timedelta(minutes=13, seconds=1)) is None


def test_status_shape_and_exact_ingested(broker, db, busy):
    q = busy["queue"]
    one_per_push(broker.client, q, "C", 4)
    pid = pid_of(db, q, "C")
    start = db_now(db) - dt.timedelta(hours=2)
    # C's segments at start+2m, +4m, +6m, +8m (30 s past each minute)
    db.execute("UPDATE queen.log_segments SET created_at = %s + interval '30 seconds'"
               " + base_offset * interval '2 minutes' WHERE partition_id = %s", (start, pid))
    s = get(broker.client, "/api/v1/status", queue=q, **{"from": iso(start),
                                                         "to": iso(start + dt.timedelta(
                                                             minutes=10))})
    assert set(s) == {"timeRange", "bucketMinutes", "throughput", "queues", "messages",
                      "leases", "deadLetterQueue"}
    assert s["timeRange"] == {"from": iso(start),
                              "to": iso(start + dt.timedelta(minutes=10))}
    assert s["bucketMinutes"] == 1
    assert len(s["throughput"]) == 10
    assert [p["timestamp"] for p in s["throughput"]] == [
        iso(start + dt.timedelta(minutes=k)) for k in range(10)]
    assert [p["ingested"] for p in s["throughput"]] == [0, 0, 1, 0, 1, 0, 1, 0, 1, 0]
    assert all(p["processed"] is None for p in s["throughput"])
    (row,) = s["queues"]
    assert row["name"] == q and row["partitions"] == 3
    assert s["messages"] == row["messages"] == {"total": 9, "pending": 9, "processing": 2,
                                                "deadLetter": 1}
    assert s["leases"] == {"active": 1, "partitionsWithLeases": 1}
    # the DLQ row was filed just now: outside [start, start + 10 min)
    assert s["deadLetterQueue"] == {"totalMessages": 0, "affectedPartitions": 0,
                                    "topErrors": []}

    now = get(broker.client, "/api/v1/status", namespace=busy["namespace"])
    assert now["bucketMinutes"] == 1 and len(now["throughput"]) in (60, 61)
    # A and B were pushed within the last hour; C was moved two hours back
    assert sum(p["ingested"] for p in now["throughput"]) == 5
    assert now["deadLetterQueue"] == {"totalMessages": 1, "affectedPartitions": 1,
                                      "topErrors": [{"error": "poison pill", "count": 1}]}
    week = get(broker.client, "/api/v1/status", queue=q,
               **{"from": iso(start - dt.timedelta(days=7))})
    assert week["bucketMinutes"] == 30
    assert sum(p["ingested"] for p in week["throughput"]) == 9

    for params, field in (({"from": iso(start), "to": iso(start)}, "from"),
                          ({"from": "yesterday"}, "from"),
                          ({"to": "2026-01-01T00:00:00"}, "to")):
        body = assert_error(broker.client.get("/api/v1/status", params=params), 400,
                            "invalid_request")
        assert body["field"] == field


def test_status_queues_and_analytics(broker, db, busy):
    q, ns = busy["queue"], busy["namespace"]
    body = get(broker.client, "/api/v1/status/queues", namespace=ns, limit=5)
    assert body["total"] == 1 and body["pagination"] == {"limit": 5, "offset": 0}
    assert body["queues"][0]["name"] == q
    assert body["queues"][0]["messages"]["pending"] == 5

    a = get(broker.client, "/api/v1/status/analytics", queue=q, interval="minute")
    assert set(a) == {"dataPoints", "interval", "from", "to"}
    assert a["interval"] == "minute" and ISO_MS_Z.match(a["from"]) and ISO_MS_Z.match(a["to"])
    assert sum(p["ingested"] for p in a["dataPoints"]) == 5
    assert all(set(p) == {"timestamp", "ingested", "processed"} and p["processed"] is None
               for p in a["dataPoints"])
    h = get(broker.client, "/api/v1/status/analytics", queue=q, interval="hour",
            **{"from": iso(dt.datetime.now(dt.UTC) - dt.timedelta(hours=3))})
    assert len(h["dataPoints"]) in (3, 4)
    assert all(p["timestamp"].endswith(":00:00.000Z") for p in h["dataPoints"])
    assert sum(p["ingested"] for p in h["dataPoints"]) == 5
    d = get(broker.client, "/api/v1/status/analytics", queue=q, interval="day")
    assert d["dataPoints"][0]["timestamp"].endswith("T00:00:00.000Z")
    everything = get(broker.client, "/api/v1/status/analytics")
    assert sum(p["ingested"] for p in everything["dataPoints"]) >= 5

    assert_error(broker.client.get("/api/v1/status/analytics", params={"interval": "week"}),
                 400, "invalid_request")
    too_many = {"interval": "minute", "from": "2000-01-01T00:00:00Z"}
    assert assert_error(broker.client.get("/api/v1/status/analytics", params=too_many), 400,
                        "invalid_request")["field"] == "interval"


def test_status_over_more_than_100000_days_is_a_400_not_a_503(broker):
    # found by schemathesis (tests/integration/test_openapi_schemathesis.py): the largest
    # bucket is a day and admin_throughput_v1 computes at most 100000 buckets; beyond, its
    # refusal used to come back as 503 unavailable
    for since, until in (("1970-01-02T00:00:00Z", "9998-01-01T00:00:00Z"),
                         ("2000-01-01T00:00:00Z", "2300-01-01T00:00:00Z")):
        r = broker.client.get("/api/v1/status", params={"from": since, "to": until})
        assert assert_error(r, 400, "invalid_request")["field"] == "from"
    # 100000 days exactly is still served, in day buckets
    start = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    body = get(broker.client, "/api/v1/status", **{
        "from": iso(start), "to": iso(start + dt.timedelta(days=100_000))})
    assert body["bucketMinutes"] == 1440


def test_stats_refresh(broker):
    for kwargs in ({"json": {}}, {"content": b""}, {}):
        r = broker.client.post("/api/v1/stats/refresh", **kwargs)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["success"] is True and ISO_MS_Z.match(body["refreshedAt"])
    assert_error(broker.client.post("/api/v1/stats/refresh", content=b"[1]"), 400,
                 "invalid_request")


def test_the_26_client_admin_calls(broker, db, busy):
    q = busy["queue"]

    async def go() -> dict[str, Any]:
        async with Queen(broker.url) as client:
            admin = client.admin
            return {
                "overview": await admin.get_overview(),
                "namespaces": await admin.get_namespaces(),
                "tasks": await admin.get_tasks(),
                "queues": await admin.list_queues(namespace=busy["namespace"], limit=10),
                "queue": await admin.get_queue(q),
                "depth": await admin.get_queue_depth(q),
                "depth_g": await admin.get_queue_depth(q, "g1"),
                "partitions": await admin.get_partitions(queue=q),
                "status": await admin.get_status(queue=q),
                "stats": await admin.get_queue_stats(namespace=busy["namespace"]),
                "detail": await admin.get_queue_detail(q),
                "analytics": await admin.get_analytics(interval="hour"),
                "refresh": await admin.refresh_consumer_stats(),
            }

    out = asyncio.run(go())
    assert out["queues"]["total"] == 1 and out["queues"]["queues"][0]["name"] == q
    assert out["queue"]["name"] == q and len(out["queue"]["partitions"]) == 2
    assert out["depth"]["pending"] == 5 and out["depth_g"]["pending"] == 5
    assert out["partitions"]["total"] == 2
    assert out["status"]["queues"][0]["name"] == q
    assert out["stats"]["total"] == 1
    assert out["detail"]["consumerGroups"][0]["cursors"]
    assert out["analytics"]["interval"] == "hour"
    assert out["refresh"]["success"] is True
    assert out["overview"]["queues"] >= 1
    assert any(t["task"] == "jobs" for t in out["tasks"]["tasks"])


def test_status_system_names_the_processes_and_the_server(broker):
    body = get(broker.client, "/api/v1/status/system")
    workers = {w["pid"]: w for w in body["frontWorkers"]}
    assert set(workers) == set(broker.front_worker_pids())
    assert all(w["alive"] and w["restarts"] == w["generation"] - 1 for w in workers.values())
    assert body["answeredBy"]["pid"] in workers
    assert body["supervisorPid"] == broker.proc.pid
    assert sorted(s["pid"] for s in body["shards"]) == sorted(broker.shard_pids())
    assert all(s["alive"] and s["boots"] >= 1 and s["lastBeatMsAgo"] < 3000
               for s in body["shards"])
    pg = body["postgres"]
    assert pg["versionNum"] >= 140000 and pg["version"].split(".")[0] == str(
        pg["versionNum"] // 10000)
    assert pg["inRecovery"] is False and pg["databaseBytes"] > 0
    assert 1 <= pg["connections"]["queenMp"] <= pg["connections"]["total"] <= pg["maxConnections"]
    assert pg["replication"] == []
