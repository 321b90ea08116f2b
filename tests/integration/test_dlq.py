"""Dead-letter queue (api.md 2.4, 2.8, 4; ack-internals "Filing the DLQ row"): retry budget and
DLQ hand-off through real acks, the listing with its filters and paging, replay at the tail of
the partition, delete, snapshots that outlive their segment, encrypted snapshots, tenancy.

Real broker process over HTTP on the session database. Queue options are set with SQL on
``queen.queues`` after the first push created the queue (there is no configure route yet);
every test uses its own queue names.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import time
import uuid
from typing import Any

import httpx
import orjson
import psycopg

from queen_mp.crypto import PayloadCipher
from queen_mp.wire.frames import FLAG_ENCRYPTED, FLAG_TRACE
from tests.integration.test_pop_ack_flow import cursors
from tests.integration.test_push_json import stored_messages, uq
from tests.pgharness import set_statement_timeout

DLQ = "/api/v1/dlq"
ACK = "/api/v1/ack"
ACK_BATCH = "/api/v1/ack/batch"
QUEUE_MODE = "__QUEUE_MODE__"
ROW_KEYS = {"id", "transactionId", "partitionId", "queue", "partition", "offset",
            "consumerGroup", "errorMessage", "retryCount", "data", "producerSub", "createdAt",
            "failedAt"}
KEY = "22" * 32
OTHER_TENANT = uuid.UUID("11111111-2222-3333-4444-555555555555")


# ---------------------------------------------------------------------------------- helpers
def push(client: httpx.Client, queue: str, payloads: list[Any], partition: str = "Default",
         **extra: Any) -> list[dict]:
    items = [{"queue": queue, "partition": partition, "payload": p, **extra} for p in payloads]
    r = client.post("/api/v1/push", json={"items": items})
    assert r.status_code == 201, r.text
    out = r.json()
    assert [x["status"] for x in out] == ["queued"] * len(payloads), out
    return out


def pop(client: httpx.Client, queue: str, group: str | None = None, *, batch: int = 1,
        partition: str | None = None, **params: Any) -> dict | None:
    url = f"/api/v1/pop/queue/{queue}" + (f"/partition/{partition}" if partition else "")
    query = {"batch": str(batch), **{k: str(v) for k, v in params.items()}}
    if group is not None:
        query["consumerGroup"] = group
    r = client.get(url, params=query)
    if r.status_code == 204:
        return None
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def ack(client: httpx.Client, message: dict, status: str, error: str | None = None) -> dict:
    body = {"transactionId": message["transactionId"], "partitionId": message["partitionId"],
            "status": status, "error": error, "leaseId": message["leaseId"],
            "consumerGroup": message["consumerGroup"]}
    r = client.post(ACK, json=body)
    assert r.status_code == 200, r.text
    (item,) = r.json()
    return item


def dead_letter(client: httpx.Client, queue: str, group: str | None = None, *,
                partition: str | None = None, error: str = "poison") -> dict:
    """Pop one message for ``group`` and ack it ``dlq``: one DLQ row filed."""
    got = pop(client, queue, group, partition=partition)
    assert got is not None, "nothing to pop"
    (m,) = got["messages"]
    item = ack(client, m, "dlq", error)
    assert item["success"] and item["dlq"] and item["leaseReleased"], item
    return m


def dlq(client: httpx.Client, **params: Any) -> dict:
    r = client.get(DLQ, params={k: str(v) for k, v in params.items()})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"messages", "total", "pagination"}, body
    for row in body["messages"]:
        assert set(row) == ROW_KEYS, row
    return body


def set_options(db: psycopg.Connection, queue: str, **options: Any) -> None:
    sets = ", ".join(f"{k} = %({k})s" for k in options)
    db.execute(f"UPDATE queen.queues SET {sets} WHERE name = %(q)s", {**options, "q": queue})


def cursor(db: psycopg.Connection, queue: str, group: str = QUEUE_MODE) -> int:
    row = db.execute(
        "SELECT c.committed_offset FROM queen.log_consumers c "
        "JOIN queen.log_partitions lp ON lp.id = c.partition_id "
        "JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.name = %s AND c.consumer_group = %s", (queue, group)).fetchone()
    return row[0]


def log_state(db: psycopg.Connection, queue: str) -> tuple:
    """(last_offset per partition, segments, txns rows, cursors) of a queue."""
    return db.execute(
        "SELECT (SELECT array_agg(lp.last_offset ORDER BY lp.id) FROM queen.log_partitions lp "
        "        JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %(q)s), "
        " (SELECT count(*) FROM queen.log_segments s JOIN queen.log_partitions lp "
        "    ON lp.id = s.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
        "    WHERE q.name = %(q)s), "
        " (SELECT count(*) FROM queen.log_txns t JOIN queen.log_partitions lp "
        "    ON lp.id = t.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
        "    WHERE q.name = %(q)s), "
        " (SELECT array_agg(c.committed_offset ORDER BY c.partition_id, c.consumer_group) "
        "    FROM queen.log_consumers c JOIN queen.log_partitions lp "
        "    ON lp.id = c.partition_id JOIN queen.queues q ON q.id = lp.queue_id "
        "    WHERE q.name = %(q)s)", {"q": queue}).fetchone()


def assert_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == code, body
    return body


def retry_url(m: dict) -> str:
    return f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}/retry"


def message_url(m: dict) -> str:
    return f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}"


# ---------------------------------------------------------------------------- the ack side
def test_retry_limit_then_dlq_row(broker, db):
    q, g = uq("dlq-rl"), "workers"
    payloads = [{"n": 1, "text": "first"}, {"n": 2}, {"n": 3}]
    pushed = push(broker.client, q, payloads)
    set_options(db, q, retry_limit=2, dead_letter_queue=True, dlq_after_max_retries=True,
                retry_delay=0)
    for attempt in (1, 2, 3):
        got = pop(broker.client, q, g, batch=3)
        assert got is not None
        assert [m["offset"] for m in got["messages"]] == [1, 2, 3]
        assert all(m["deliveryAttempt"] == attempt for m in got["messages"]), got
        item = ack(broker.client, got["messages"][0], "failed", f"boom {attempt}")
        assert item["success"] and item["leaseReleased"], item
        if attempt < 3:
            assert not item["dlq"], item
        else:
            assert item["dlq"], item
    assert cursor(db, q, g) == 1
    body = dlq(broker.client, queue=q)
    assert body["total"] == 1 and body["pagination"] == {"limit": 100, "offset": 0}
    (row,) = body["messages"]
    assert row["errorMessage"] == "boom 3"
    assert row["retryCount"] == 2
    assert row["data"] == payloads[0]
    assert row["id"] == pushed[0]["messageId"]
    assert row["transactionId"] == pushed[0]["transactionId"]
    assert row["partitionId"] == pushed[0]["partitionId"]
    assert row["offset"] == 1 and row["queue"] == q and row["partition"] == "Default"
    assert row["consumerGroup"] == g and row["producerSub"] is None
    assert row["createdAt"] == pushed[0]["createdAt"]
    assert row["failedAt"].endswith("Z") and row["failedAt"] >= row["createdAt"]
    # the next pop starts after the poison, with a fresh budget
    got = pop(broker.client, q, g, batch=3)
    assert [m["offset"] for m in got["messages"]] == [2, 3]
    assert all(m["deliveryAttempt"] == 1 for m in got["messages"])


def test_exhausted_poison_dropped_when_dlq_disabled(broker, db):
    q, g = uq("dlq-off"), "workers"
    push(broker.client, q, [{"n": 1}, {"n": 2}])
    set_options(db, q, retry_limit=1, dead_letter_queue=False, dlq_after_max_retries=False,
                retry_delay=0)
    first = pop(broker.client, q, g)["messages"][0]
    item = ack(broker.client, first, "failed", "boom 1")
    assert item["success"] and not item["dlq"] and item["leaseReleased"]
    again = pop(broker.client, q, g)["messages"][0]
    assert again["offset"] == 1 and again["deliveryAttempt"] == 2
    item = ack(broker.client, again, "failed", "boom 2")
    assert item["success"] and not item["dlq"] and item["leaseReleased"], item
    assert cursor(db, q, g) == 1  # dropped: the cursor moved past it
    assert dlq(broker.client, queue=q)["total"] == 0
    n = db.execute("SELECT count(*) FROM queen.log_dlq d JOIN queen.queues q "
                   "ON q.id = d.queue_id WHERE q.name = %s", (q,)).fetchone()[0]
    assert n == 0
    nxt = pop(broker.client, q, g)["messages"][0]
    assert nxt["offset"] == 2 and nxt["data"] == {"n": 2}


def test_status_dlq_files_at_once(broker, db):
    q = uq("dlq-now")
    push(broker.client, q, [{"n": 1}, {"n": 2}])  # retry_limit stays the default 3
    m = pop(broker.client, q)["messages"][0]
    item = ack(broker.client, m, "dlq", "unparseable")
    assert item == {"index": 0, "transactionId": m["transactionId"],
                    "partitionId": m["partitionId"], "success": True, "error": None,
                    "leaseReleased": True, "dlq": True, "noop": False}
    (row,) = dlq(broker.client, queue=q)["messages"]
    assert row["retryCount"] == 0 and row["errorMessage"] == "unparseable"
    assert row["consumerGroup"] == QUEUE_MODE and row["data"] == {"n": 1}
    assert cursor(db, q) == 1
    assert pop(broker.client, q)["messages"][0]["offset"] == 2


def test_a_dlq_filing_that_fails_applies_nothing_and_the_retry_files_it(
        make_broker, fresh_db_dsn, pg_server_dsn):
    """A nack and the DLQ row it files commit together: a filing that times out (log_dlq held
    in SHARE mode by another session) leaves the consumer row exactly as it was, even the
    advance of the batch's completed items, and answers 503 with every item failed; the retry
    files the row once."""
    set_statement_timeout(pg_server_dsn, fresh_db_dsn, 1000)
    b = make_broker(fresh_db_dsn)
    q = uq("dlq-tx")
    push(b.client, q, [{"n": 1}, {"n": 2}, {"n": 3}])
    msgs = pop(b.client, q, "g", batch=3)["messages"]
    body = {"consumerGroup": "g", "acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": m["leaseId"], "status": status, "error": "poison"}
        for m, status in zip(msgs, ("completed", "completed", "dlq"), strict=True)]}
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        before = cursors(db, q, "g", "row_to_json(c)::text")
        with psycopg.connect(fresh_db_dsn) as blocker:
            blocker.execute("SET statement_timeout = 0")
            blocker.execute("LOCK TABLE queen.log_dlq IN SHARE MODE")
            r = b.client.post(ACK_BATCH, json=body)
            blocker.rollback()
        assert r.status_code == 503, r.text
        doc = r.json()
        assert doc["code"] == "timeout", doc
        assert [(x["success"], x["error"], x["dlq"]) for x in doc["results"]] == \
            [(False, "timeout", False)] * 3
        # the two completed items' cursor advance did not commit without the DLQ row
        assert cursors(db, q, "g", "row_to_json(c)::text") == before
        assert dlq(b.client, queue=q)["messages"] == []
        r = b.client.post(ACK_BATCH, json=body)
        assert r.status_code == 200, r.text
        assert [(x["success"], x["dlq"], x["leaseReleased"]) for x in r.json()] == \
            [(True, False, True), (True, False, True), (True, True, True)]
        (row,) = dlq(b.client, queue=q)["messages"]
        assert row["transactionId"] == msgs[2]["transactionId"]
        assert cursors(db, q, "g")["Default"] == (3, None)


# ---------------------------------------------------------------------------------- replay
def test_replay_pushes_to_the_tail_with_a_fresh_identity(broker, db):
    q, g = uq("dlq-replay"), "billing"
    trace = str(uuid.uuid4())
    pushed = push(broker.client, q, [{"total": 30}, {"total": 31}], traceId=trace)
    m = dead_letter(broker.client, q, g, error="card declined")
    assert m["offset"] == 1
    # a consumer parked on the queue (starting after its current end)...
    with cf.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        parked = pool.submit(lambda: httpx.get(
            f"{broker.url}/api/v1/pop/queue/{q}",
            params={"consumerGroup": "other", "subscriptionMode": "new", "wait": "true",
                    "timeout": "20000"}, timeout=60))
        time.sleep(0.8)
        r = broker.client.post(retry_url(m))
        assert r.status_code == 200, r.text
        body = r.json()
        # ...is woken by the replay, long before its deadline
        woken = parked.result(30)
        assert woken.status_code == 200, woken.text
        assert time.monotonic() - started < 10
    assert set(body) == {"success", "partitionId", "transactionId", "retried", "messageId",
                         "newTransactionId", "offset"}
    assert body["success"] is True and body["retried"] == 1
    assert body["partitionId"] == m["partitionId"] and body["transactionId"] == m["transactionId"]
    assert body["offset"] == 3
    assert body["newTransactionId"] == body["messageId"]
    assert body["messageId"] not in (pushed[0]["messageId"], pushed[1]["messageId"])
    uuid.UUID(body["messageId"])
    assert body["messageId"][14] == "7"  # a UUIDv7
    (w,) = woken.json()["messages"]
    assert w["offset"] == 3 and w["id"] == body["messageId"]
    # the same group gets it after the message it had not consumed yet
    got = pop(broker.client, q, g, batch=10)
    assert [x["offset"] for x in got["messages"]] == [2, 3]
    replayed = got["messages"][1]
    assert replayed["id"] == body["messageId"]
    assert replayed["transactionId"] == body["newTransactionId"]
    assert replayed["data"] == {"total": 30} and replayed["traceId"] == trace
    assert replayed["deliveryAttempt"] == 1
    assert cursor(db, q, g) == 1  # the original offset stays committed
    # stored: one new one-frame segment, trace id kept
    stored = stored_messages(db, q)
    assert [s.offset for s in stored] == [1, 2, 3]
    assert stored[2].transaction_id == body["newTransactionId"]
    assert stored[2].flags == FLAG_TRACE and orjson.loads(stored[2].payload) == {"total": 30}
    # the row is gone: a second retry is 404, the listing is empty
    assert_error(broker.client.post(retry_url(m)), 404, "not_found")
    assert dlq(broker.client, queue=q)["total"] == 0


def test_replay_narrowed_to_one_group(broker, db):
    q = uq("dlq-groups")
    push(broker.client, q, [{"k": "v"}])
    ma = dead_letter(broker.client, q, "ga")
    dead_letter(broker.client, q, "gb")
    assert dlq(broker.client, queue=q)["total"] == 2
    r = broker.client.post(retry_url(ma), params={"consumerGroup": "ga"})
    assert r.status_code == 200 and r.json()["retried"] == 1 and r.json()["offset"] == 2
    (left,) = dlq(broker.client, queue=q)["messages"]
    assert left["consumerGroup"] == "gb"
    assert_error(broker.client.post(retry_url(ma), params={"consumerGroup": "ga"}), 404,
                 "not_found")
    # both groups see the replay
    for g in ("ga", "gb"):
        got = pop(broker.client, q, g)
        assert got["messages"][0]["offset"] == 2 and got["messages"][0]["data"] == {"k": "v"}


def test_retry_and_delete_bad_addresses(broker):
    assert_error(broker.client.post("/api/v1/messages/abc/x/retry"), 400, "invalid_request")
    assert_error(broker.client.post("/api/v1/messages/0/x/retry"), 400, "invalid_request")
    assert_error(broker.client.delete("/api/v1/messages/-4/x"), 400, "invalid_request")
    assert_error(broker.client.post(f"/api/v1/messages/1/{'t' * 1025}/retry"), 413,
                 "name_too_long")
    assert_error(broker.client.post("/api/v1/messages/9223372036854775000/nope/retry"), 404,
                 "not_found")
    assert_error(broker.client.delete("/api/v1/messages/9223372036854775000/nope"), 404,
                 "not_found")
    r = broker.client.get("/api/v1/messages/1/x/retry")
    assert_error(r, 405, "method_not_allowed")


# ---------------------------------------------------------------------------------- delete
def test_delete_removes_the_row_only(broker, db):
    q, g = uq("dlq-del"), "workers"
    push(broker.client, q, [{"n": 1}, {"n": 2}])
    m = dead_letter(broker.client, q, g)
    before = log_state(db, q)
    r = broker.client.delete(message_url(m))
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True, "partitionId": m["partitionId"],
                        "transactionId": m["transactionId"], "deleted": 1}
    assert log_state(db, q) == before
    assert dlq(broker.client, queue=q)["total"] == 0
    assert_error(broker.client.delete(message_url(m)), 404, "not_found")
    assert_error(broker.client.post(retry_url(m)), 404, "not_found")
    assert pop(broker.client, q, g)["messages"][0]["offset"] == 2


def test_delete_narrowed_to_one_group(broker):
    q = uq("dlq-delg")
    push(broker.client, q, [{"n": 1}])
    m = dead_letter(broker.client, q, "ga")
    dead_letter(broker.client, q, "gb")
    assert_error(broker.client.delete(message_url(m), params={"consumerGroup": "gc"}), 404,
                 "not_found")
    r = broker.client.delete(message_url(m), params={"consumerGroup": "gb"})
    assert r.status_code == 200 and r.json()["deleted"] == 1
    assert [x["consumerGroup"] for x in dlq(broker.client, queue=q)["messages"]] == ["ga"]


# ----------------------------------------------------------------------------------- listing
def test_listing_pages_and_filters(broker, db):
    q, q2 = uq("dlq-page"), uq("dlq-page2")
    push(broker.client, q, [{"p": "a", "i": i} for i in range(3)], partition="pa")
    push(broker.client, q, [{"p": "b", "i": i} for i in range(2)], partition="pb")
    push(broker.client, q2, [{"other": True}])
    filed = [dead_letter(broker.client, q, "ga", partition="pa") for _ in range(3)]
    filed += [dead_letter(broker.client, q, "ga", partition="pb") for _ in range(2)]
    dead_letter(broker.client, q, "gb", partition="pa")
    dead_letter(broker.client, q2, "ga")

    all_rows = dlq(broker.client, queue=q, consumerGroup="ga")
    assert all_rows["total"] == 5
    assert [(r["partition"], r["offset"]) for r in all_rows["messages"]] == [
        ("pa", 1), ("pa", 2), ("pa", 3), ("pb", 1), ("pb", 2)]
    assert [r["transactionId"] for r in all_rows["messages"]] == [
        m["transactionId"] for m in filed]
    failed = [r["failedAt"] for r in all_rows["messages"]]
    assert failed == sorted(failed)

    page = dlq(broker.client, queue=q, consumerGroup="ga", limit=2, offset=2)
    assert page["total"] == 5 and page["pagination"] == {"limit": 2, "offset": 2}
    assert page["messages"] == all_rows["messages"][2:4]
    tail = dlq(broker.client, queue=q, consumerGroup="ga", limit=2, offset=4)
    assert tail["messages"] == all_rows["messages"][4:]
    past = dlq(broker.client, queue=q, consumerGroup="ga", limit=2, offset=50)
    assert past["messages"] == [] and past["total"] == 5

    assert dlq(broker.client, queue=q)["total"] == 6
    assert dlq(broker.client, queue=q2)["total"] == 1
    assert dlq(broker.client)["total"] >= 7
    assert dlq(broker.client, consumerGroup="gb", queue=q)["total"] == 1
    by_partition = dlq(broker.client, queue=q, partition="pb")
    assert [(r["partition"], r["offset"]) for r in by_partition["messages"]] == [
        ("pb", 1), ("pb", 2)]
    assert dlq(broker.client, queue=q, partition="nope")["total"] == 0
    assert dlq(broker.client, queue=uq("dlq-none"))["total"] == 0

    # from/to on failedAt, both inclusive; exact times (microseconds, offset form) from SQL
    times = [t for (t,) in db.execute(
        "SELECT d.created_at FROM queen.log_dlq d JOIN queen.queues q ON q.id = d.queue_id "
        "WHERE q.name = %s AND d.consumer_group = 'ga' "
        "ORDER BY d.created_at, d.partition_id, d.\"offset\"", (q,)).fetchall()]
    window = dlq(broker.client, queue=q, consumerGroup="ga", **{
        "from": times[2].isoformat(), "to": times[3].isoformat()})
    assert window["messages"] == all_rows["messages"][2:4] and window["total"] == 2
    since = dlq(broker.client, queue=q, consumerGroup="ga", **{"from": times[4].isoformat()})
    assert since["messages"] == all_rows["messages"][4:]
    until = dlq(broker.client, queue=q, consumerGroup="ga", to=times[0].isoformat())
    assert until["messages"] == all_rows["messages"][:1]
    assert dlq(broker.client, queue=q, **{"from": "2000-01-01T00:00:00Z",
                                          "to": "2000-01-02T00:00:00Z"})["total"] == 0

    # limits: above 1000 clamps, below 1 and non-integers are 400
    clamped = dlq(broker.client, queue=q, limit=5000)
    assert clamped["pagination"] == {"limit": 1000, "offset": 0} and clamped["total"] == 6
    for params in ({"limit": "0"}, {"limit": "-1"}, {"limit": "ten"}, {"offset": "-1"},
                   {"offset": "1.5"}, {"from": "yesterday"}, {"to": "2026-13-01T00:00:00Z"},
                   {"from": "2026-01-01T00:00:00"}):
        assert_error(broker.client.get(DLQ, params={"queue": q, **params}), 400,
                     "invalid_request")
    assert_error(broker.client.get(DLQ, params={"queue": "a/b"}), 400, "invalid_name")


# ------------------------------------------------------------------------- snapshot survives
def test_row_outlives_its_segment(broker, db):
    q, g = uq("dlq-gone"), "workers"
    (pushed,) = push(broker.client, q, [{"keep": "me"}])
    m = dead_letter(broker.client, q, g)
    pid = int(m["partitionId"])
    db.execute("DELETE FROM queen.log_segments WHERE partition_id = %s", (pid,))
    assert stored_messages(db, q) == []
    (row,) = dlq(broker.client, queue=q)["messages"]
    assert row["data"] == {"keep": "me"} and row["id"] == pushed["messageId"]
    r = broker.client.post(retry_url(m))
    assert r.status_code == 200, r.text
    assert r.json()["offset"] == 2
    got = pop(broker.client, q, g)
    (x,) = got["messages"]
    assert x["offset"] == 2 and x["data"] == {"keep": "me"}
    assert x["transactionId"] == r.json()["newTransactionId"]


def test_replay_of_a_null_payload(broker):
    q = uq("dlq-null")
    push(broker.client, q, [None])
    m = dead_letter(broker.client, q)
    (row,) = dlq(broker.client, queue=q)["messages"]
    assert row["data"] is None
    assert broker.client.post(retry_url(m)).status_code == 200
    (x,) = pop(broker.client, q)["messages"]
    assert x["offset"] == 2 and x["data"] is None


# ------------------------------------------------------------------------------- encryption
def test_encrypted_snapshot(make_broker, db_dsn):
    b = make_broker(db_dsn, QUEEN_ENCRYPTION_KEY=KEY)
    q, g = uq("dlq-enc"), "secret"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, encryption_enabled) VALUES (%s, true)",
                     (q,))
    payload = {"card": "4111-1111", "cvv": 123}
    push(b.client, q, [payload, {"n": 2}])
    m = dead_letter(b.client, q, g)
    cipher = PayloadCipher(KEY)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        encrypted, stored = conn.execute(
            "SELECT d.encrypted, d.payload FROM queen.log_dlq d JOIN queen.queues q "
            "ON q.id = d.queue_id WHERE q.name = %s", (q,)).fetchone()
        assert encrypted is True
        assert b"4111" not in bytes(stored)
        assert orjson.loads(cipher.decrypt(bytes(stored))) == payload
        (row,) = dlq(b.client, queue=q)["messages"]
        assert row["data"] == payload
        # the replay keeps the stored ciphertext, flag 4, and pops decrypted
        r = b.client.post(retry_url(m))
        assert r.status_code == 200, r.text
        replayed = stored_messages(conn, q)[-1]
        assert replayed.offset == 3 and replayed.flags & FLAG_ENCRYPTED
        assert replayed.payload == bytes(stored)
    got = pop(b.client, q, g, batch=5)
    assert [x["offset"] for x in got["messages"]] == [2, 3]
    assert got["messages"][1]["data"] == payload


# ------------------------------------------------------------------------------ by filter
#: the by-filter routes (method -> path, answer keys besides success and remaining)
BULK = {"POST": (f"{DLQ}/retry", {"replayed", "retried", "skipped"}),
        "DELETE": (DLQ, {"deleted"})}


def bulk(client: httpx.Client, method: str, **params: Any) -> dict:
    path, keys = BULK[method]
    r = client.request(method, path, params={k: str(v) for k, v in params.items()})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"success", "remaining"} | keys, body
    return body


def bulk_retry(client: httpx.Client, **params: Any) -> dict:
    return bulk(client, "POST", **params)


def bulk_delete(client: httpx.Client, **params: Any) -> dict:
    return bulk(client, "DELETE", **params)


def test_retry_by_filter_replays_the_matches_in_list_order_a_batch_at_a_time(broker, db):
    q, other = uq("dlq-bulk"), uq("dlq-bulk-other")
    push(broker.client, q, [{"a": i} for i in range(1, 6)], partition="A")
    push(broker.client, q, [{"b": 1}], partition="B")
    push(broker.client, other, [{"o": 1}])
    for _ in range(5):
        dead_letter(broker.client, q, "g", partition="A")
    dead_letter(broker.client, q, "g", partition="B")
    dead_letter(broker.client, other, "g")
    first = [r["offset"] for r in dlq(broker.client, queue=q, partition="A")["messages"]]
    assert first == [1, 2, 3, 4, 5]
    body = bulk_retry(broker.client, queue=q, partition="A", limit=2)
    assert body == {"success": True, "replayed": 2, "retried": 2, "skipped": 0, "remaining": 3}
    assert [r["offset"] for r in dlq(broker.client, queue=q, partition="A")["messages"]] == [
        3, 4, 5]
    body = bulk_retry(broker.client, queue=q, partition="A")
    assert body == {"success": True, "replayed": 3, "retried": 3, "skipped": 0, "remaining": 0}
    # replayed at the tail of A, in the listing's order; B and the other queue untouched
    got = pop(broker.client, q, "g", partition="A", batch=10)
    assert [m["offset"] for m in got["messages"]] == [6, 7, 8, 9, 10]
    assert [m["data"] for m in got["messages"]] == [{"a": i} for i in range(1, 6)]
    assert dlq(broker.client, queue=q)["total"] == 1
    assert dlq(broker.client, queue=other)["total"] == 1
    # nothing left to match: a call does nothing
    assert bulk_retry(broker.client, queue=q, partition="A")["replayed"] == 0


def test_retry_by_filter_one_replay_per_offset_or_one_group(broker, db):
    q = uq("dlq-bulk-groups")
    push(broker.client, q, [{"k": 1}, {"k": 2}])
    for g in ("ga", "gb"):
        dead_letter(broker.client, q, g)
        dead_letter(broker.client, q, g)
    assert dlq(broker.client, queue=q)["total"] == 4
    # one group: its two rows, two replays; gb's rows stay
    assert bulk_retry(broker.client, queue=q, consumerGroup="ga") == {
        "success": True, "replayed": 2, "retried": 2, "skipped": 0, "remaining": 0}
    assert {r["consumerGroup"] for r in dlq(broker.client, queue=q)["messages"]} == {"gb"}
    # a row of another group at the same offset goes with its replay when no group is given
    dead_letter(broker.client, q, "gc")  # offset 1 for gc
    assert bulk_retry(broker.client, queue=q, limit=1) == {
        "success": True, "replayed": 1, "retried": 2, "skipped": 0, "remaining": 1}
    (left,) = dlq(broker.client, queue=q)["messages"]
    assert (left["consumerGroup"], left["offset"]) == ("gb", 2)
    assert [s.offset for s in stored_messages(db, q)] == [1, 2, 3, 4, 5]


def test_delete_by_filter_deletes_the_rows_only(broker, db):
    q, other = uq("dlq-bulk-del"), uq("dlq-bulk-del-other")
    push(broker.client, q, [1, 2, 3])
    push(broker.client, other, [1])
    for _ in range(3):
        dead_letter(broker.client, q, "g")
    dead_letter(broker.client, other, "g")
    before = log_state(db, q)
    rows = dlq(broker.client, queue=q)["messages"]
    assert bulk_delete(broker.client, queue=q, limit=2) == {
        "success": True, "deleted": 2, "remaining": 1}
    assert dlq(broker.client, queue=q)["messages"] == rows[2:]  # the first two in list order
    # a failedAt range: only what it holds
    t = dt.datetime.fromisoformat(rows[2]["failedAt"])  # milliseconds, truncated
    assert bulk_delete(broker.client, queue=q, to="2000-01-01T00:00:00Z")["deleted"] == 0
    assert bulk_delete(broker.client, queue=q, **{
        "from": t.isoformat(), "to": (t + dt.timedelta(milliseconds=1)).isoformat()}) == {
        "success": True, "deleted": 1, "remaining": 0}
    assert log_state(db, q) == before  # the log and the cursors are not edited
    assert dlq(broker.client, queue=other)["total"] == 1
    # all=true with a filter is the filter
    assert bulk_delete(broker.client, queue=other, all="true")["deleted"] == 1


def test_by_filter_bad_filters_are_400_and_change_nothing(broker):
    q = uq("dlq-bulk-bad")
    push(broker.client, q, [1])
    dead_letter(broker.client, q)
    for call in (lambda p: broker.client.request("DELETE", DLQ, params=p),
                 lambda p: broker.client.request("POST", f"{DLQ}/retry", params=p)):
        body = assert_error(call({}), 400, "invalid_request")
        assert body["field"] == "all", body
        assert_error(call({"all": "false"}), 400, "invalid_request")
        assert_error(call({"queue": ""}), 400, "invalid_request")  # empty is no filter
        assert_error(call({"all": "yes"}), 400, "invalid_request")
        for params in ({"queue": q, "limit": "0"}, {"queue": q, "limit": "x"},
                       {"queue": q, "from": "yesterday"},
                       {"queue": q, "from": "2026-01-02T00:00:00Z",
                        "to": "2026-01-01T00:00:00Z"}):
            assert_error(call(params), 400, "invalid_request")
        assert_error(call({"queue": "a/b"}), 400, "invalid_name")
        assert_error(call({"consumerGroup": "g" * 256}), 413, "name_too_long")
    assert dlq(broker.client, queue=q)["total"] == 1
    # above 1000 is clamped, not refused
    assert bulk_delete(broker.client, queue=q, limit=5000)["deleted"] == 1


def test_by_filter_encrypted_queue_without_its_key_is_skipped(make_broker, db_dsn):
    """A plain snapshot on a queue encrypted since, on a broker without a key: the replay
    cannot encrypt it; it is skipped and counted, its row kept."""
    b = make_broker(db_dsn)
    q = uq("dlq-bulk-enc")
    push(b.client, q, [{"n": 1}, {"n": 2}])
    dead_letter(b.client, q)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE queen.queues SET encryption_enabled = true WHERE name = %s", (q,))
    assert bulk_retry(b.client, queue=q) == {
        "success": True, "replayed": 0, "retried": 0, "skipped": 1, "remaining": 1}


# ----------------------------------------------------------------------------------- tenancy
def test_other_tenant_sees_nothing(broker, db):
    q = uq("dlq-tenant")
    push(broker.client, q, [{"n": 1}])
    m = dead_letter(broker.client, q)
    pid, txn = int(m["partitionId"]), m["transactionId"]
    rows = db.execute("SELECT total, id FROM queen.dlq_list_v1(%s, %s, NULL, NULL, NULL, NULL, "
                      "10, 0)", (OTHER_TENANT, q)).fetchall()
    assert rows == [(0, None)]
    assert db.execute("SELECT count(*) FROM queen.dlq_find_v1(%s, %s, %s, NULL)",
                      (OTHER_TENANT, pid, txn)).fetchone()[0] == 0
    res = db.execute("SELECT queen.dlq_retry_v1(%s, %s, %s, 1, NULL, %s, %s)",
                     (OTHER_TENANT, pid, txn, b"x", b"0" * 16)).fetchone()[0]
    assert res["ok"] is False and res["error"] == "not_found" and res["queue"] is None
    assert db.execute("SELECT queen.dlq_delete_v1(%s, %s, %s, NULL)",
                      (OTHER_TENANT, pid, txn)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM queen.dlq_match_v1(%s, NULL, NULL, NULL, NULL, "
                      "NULL, 1000)", (OTHER_TENANT,)).fetchone()[0] == 0
    assert db.execute("SELECT queen.dlq_delete_matching_v1(%s, NULL, NULL, NULL, NULL, NULL, "
                      "1000)", (OTHER_TENANT,)).fetchone()[0] == 0
    assert dlq(broker.client, queue=q)["total"] == 1
    last = db.execute("SELECT last_offset FROM queen.log_partitions WHERE id = %s",
                      (pid,)).fetchone()[0]
    assert last == 1
