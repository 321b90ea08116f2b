"""Durable timers (api.md 1.9, 2.5 "Timer ops", 2.11, section 6 timer routes), end to end.

Real broker processes over HTTP on real PostgreSQL: timers are scheduled through
``POST /api/v1/timers``, fired by the shards' firers (queen_mp/shards/timerfire.py) and checked
both by popping them and by decoding what is stored in ``queen.log_segments``. Most tests use the
session broker with their own queue names; restart and two-broker tests get a private database.
"""

from __future__ import annotations

import base64
import datetime as dt
import time
from typing import Any

import httpx
import psycopg
import zstandard

from tests.integration.test_push_json import stored_messages, uq

TIMERS = "/api/v1/timers"
RESULT_KEYS = {"index", "ok", "status", "queue", "timerKey", "txn", "messageId", "deliverAt"}


# ---------------------------------------------------------------------------------- helpers
def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sched(queue: str, key: str, payload: bytes = b'{"n":1}', delay_ms: int = 0,
          op: str = "schedule", **kw: Any) -> dict[str, Any]:
    return {"op": op, "queue": queue, "timerKey": key, "payload": b64(payload),
            "delayMs": delay_ms, **kw}


def cancel(queue: str, key: str) -> dict[str, Any]:
    return {"op": "cancel", "queue": queue, "timerKey": key}


def post_ops(client: httpx.Client, ops: list[dict[str, Any]], status: int = 200) -> Any:
    r = client.post(TIMERS, json={"operations": ops})
    assert r.status_code == status, r.text
    body = r.json()
    if status == 200:
        results = body["results"]
        assert [x["index"] for x in results] == list(range(len(ops)))
        for x in results:
            assert set(x) == RESULT_KEYS, x
        return results
    return body


def one(client: httpx.Client, op: dict[str, Any]) -> dict[str, Any]:
    (res,) = post_ops(client, [op])
    return res


def pop(client: httpx.Client, queue: str, *, batch: int = 10, wait_ms: int = 0) -> dict | None:
    params = {"batch": str(batch), "autoAck": "true"}
    if wait_ms:
        params.update(wait="true", timeout=str(wait_ms))
    r = client.get(f"/api/v1/pop/queue/{queue}", params=params)
    if r.status_code == 204:
        return None
    assert r.status_code == 200, r.text
    return r.json()


def timer_row(db: psycopg.Connection, queue: str, key: str) -> tuple | None:
    return db.execute(
        "SELECT t.state, t.attempts, t.fire_at, t.fired_at FROM queen.timers t "
        "JOIN queen.queues q ON q.id = t.queue_id WHERE q.name = %s AND t.timer_key = %s",
        (queue, key)).fetchone()


def wait_for(predicate: Any, timeout: float = 10.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(every)


def wait_fired(db: psycopg.Connection, queue: str, key: str, timeout: float = 10.0) -> tuple:
    return wait_for(lambda: (r := timer_row(db, queue, key)) and r[0] == "fired" and r,
                    timeout)


def parse_ms(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def shaped(r: httpx.Response, status: int, code: str, reason: str | None = None) -> dict:
    """api.md 2.11: {"error": code, "code": code, "reason", "detail"}."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code and body["code"] == code, body
    assert isinstance(body["detail"], str) and body["detail"], body
    if reason is not None:
        assert body["reason"] == reason, body
    return body


# ---------------------------------------------------------------------------------- firing
def test_timer_fires_once_after_its_delay(broker, db):
    q = uq("tm")
    t0 = time.monotonic()
    res = one(broker.client, sched(q, "order-1", b'{"total": 30}', 1000, txn="rem-1"))
    assert res["ok"] is True and res["status"] == "scheduled"
    assert (res["queue"], res["timerKey"], res["txn"]) == (q, "order-1", "rem-1")
    # nothing before its time
    assert pop(broker.client, q) is None
    # a parked pop is woken by the firing
    got = pop(broker.client, q, wait_ms=30000)
    elapsed = time.monotonic() - t0
    # at the firing, not the pop's 30 s timeout (10 s: room for a loaded machine)
    assert got is not None and 0.9 <= elapsed < 10, elapsed
    (m,) = got["messages"]
    assert m["id"] == res["messageId"] and m["transactionId"] == "rem-1"
    assert m["data"] == {"total": 30} and m["partition"] == "Default"
    (stored,) = stored_messages(db, q)
    assert stored.message_id == res["messageId"] and stored.payload == b'{"total": 30}'
    assert stored.created_at >= parse_ms(res["deliverAt"])
    state, attempts, _, fired_at = timer_row(db, q, "order-1")
    assert (state, attempts) == ("fired", 1) and fired_at is not None
    # once: later rounds add nothing
    time.sleep(0.5)
    assert len(stored_messages(db, q)) == 1
    assert pop(broker.client, q) is None


def test_minted_txn_and_partition(broker, db):
    q = uq("tm")
    res = one(broker.client, sched(q, "k", b"[1,2]", partition="p/7"))
    assert res["txn"] == res["messageId"]
    wait_fired(db, q, "k")
    (m,) = stored_messages(db, q)
    assert (m.partition, m.transaction_id, m.message_id) == ("p/7", res["messageId"],
                                                             res["messageId"])
    assert m.payload == b"[1,2]"


def test_zstd_payload_is_delivered_as_json(broker, db):
    q = uq("tm")
    raw = b'{"items":' + b"[" + b",".join(b"%d" % i for i in range(300)) + b"]}"
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    res = one(broker.client, {**sched(q, "z"), "payload": b64(frame), "payloadZstd": True})
    got = pop(broker.client, q, wait_ms=8000)
    (m,) = got["messages"]
    assert m["id"] == res["messageId"] and m["data"] == {"items": list(range(300))}
    assert stored_messages(db, q)[0].payload == raw


def test_empty_payload_is_a_null_message(broker, db):
    q = uq("tm")
    one(broker.client, {**sched(q, "e"), "payload": ""})
    (m,) = pop(broker.client, q, wait_ms=8000)["messages"]
    assert m["data"] is None


def test_reschedule_moves_the_firing_and_replaces_the_message(broker, db):
    q = uq("tm")
    first = one(broker.client, sched(q, "k", b'{"v":1}', 800))
    # schedule over a pending timer replaces it and says so
    again = one(broker.client, sched(q, "k", b'{"v":2}', 900))
    assert again["status"] == "rescheduled" and again["ok"] is True
    later = one(broker.client, sched(q, "k", b'{"v":3}', 2500, op="reschedule", txn="r-3"))
    assert later["status"] == "rescheduled" and later["ok"] is True
    assert len({first["messageId"], again["messageId"], later["messageId"]}) == 3
    assert parse_ms(later["deliverAt"]) > parse_ms(first["deliverAt"])
    time.sleep(1.5)
    assert stored_messages(db, q) == [] and timer_row(db, q, "k")[0] == "pending"
    wait_fired(db, q, "k")
    (m,) = stored_messages(db, q)
    assert (m.message_id, m.transaction_id, m.payload) == (later["messageId"], "r-3",
                                                            b'{"v":3}')
    assert m.created_at >= parse_ms(later["deliverAt"])
    time.sleep(0.4)
    assert len(stored_messages(db, q)) == 1


def test_cancel_means_never_delivered(broker, db):
    q = uq("tm")
    s = one(broker.client, sched(q, "k", delay_ms=700))
    c = one(broker.client, cancel(q, "k"))
    assert c["ok"] is True and c["status"] == "cancelled"
    assert (c["messageId"], c["txn"], c["deliverAt"]) == (s["messageId"], s["txn"],
                                                          s["deliverAt"])
    time.sleep(1.5)
    assert stored_messages(db, q) == []
    assert timer_row(db, q, "k")[0] == "cancelled"
    # nothing pending any more
    for res in post_ops(broker.client, [cancel(q, "k"), sched(q, "k", op="reschedule")]):
        assert res["ok"] is False and res["status"] == "absent"
        assert res["messageId"] is None and res["deliverAt"] is None
    # a new schedule of the key starts afresh
    assert one(broker.client, sched(q, "k", delay_ms=60_000))["status"] == "scheduled"
    one(broker.client, cancel(q, "k"))


def test_too_late_after_firing(broker, db):
    q = uq("tm")
    s = one(broker.client, sched(q, "k", txn="late-1"))
    wait_fired(db, q, "k")
    c, r = post_ops(broker.client, [cancel(q, "k"), sched(q, "k", op="reschedule")])
    for res in (c, r):
        assert res["ok"] is False and res["status"] == "too_late", res
        assert res["messageId"] == s["messageId"] and res["txn"] == "late-1"
    assert len(stored_messages(db, q)) == 1
    # schedule after firing is a new timer (and a new message)
    s2 = one(broker.client, sched(q, "k", txn="late-2"))
    assert s2["status"] == "scheduled" and s2["messageId"] != s["messageId"]
    wait_fired(db, q, "k")
    assert [m.transaction_id for m in stored_messages(db, q)] == ["late-1", "late-2"]


def test_absent_keys_and_queues(broker, db):
    q = uq("tm")
    one(broker.client, sched(q, "other", delay_ms=60_000))
    ghost = uq("ghost")
    results = post_ops(broker.client, [cancel(q, "nope"), sched(q, "nope", op="reschedule"),
                                       cancel(ghost, "k"), sched(ghost, "k", op="reschedule")])
    assert [(r["ok"], r["status"]) for r in results] == [(False, "absent")] * 4
    # only scheduling creates queues
    assert db.execute("SELECT count(*) FROM queen.queues WHERE name = %s",
                      (ghost,)).fetchone()[0] == 0
    one(broker.client, cancel(q, "other"))


def test_scheduling_creates_the_queue(broker, db):
    ns = uq("tm")
    q = f"{ns}.task"
    assert db.execute("SELECT count(*) FROM queen.queues WHERE name = %s", (q,)).fetchone()[0] == 0
    one(broker.client, sched(q, "k", delay_ms=60_000))
    row = db.execute("SELECT namespace, task, dedup_window FROM queen.queues WHERE name = %s",
                     (q,)).fetchone()
    assert row == (ns, "task", 3600)
    one(broker.client, cancel(q, "k"))


def test_ops_apply_in_order_in_one_request(broker, db):
    q = uq("tm")
    results = post_ops(broker.client, [
        sched(q, "a", delay_ms=60_000), sched(q, "b", delay_ms=60_000), cancel(q, "a"),
        sched(q, "a", delay_ms=60_000, op="reschedule"), sched(q, "b", op="reschedule",
                                                               delay_ms=120_000)])
    assert [r["status"] for r in results] == ["scheduled", "scheduled", "cancelled", "absent",
                                              "rescheduled"]
    one(broker.client, cancel(q, "b"))


def test_fired_duplicate_txn_is_not_delivered_twice(broker, db):
    """Dedup on txn: a timer whose transactionId is already stored is marked fired anyway;
    the other timers of its segment are still delivered."""
    q = uq("tm")
    r = broker.client.post("/api/v1/push", json={"items": [
        {"queue": q, "transactionId": "dup-1", "payload": {"pushed": True}}]})
    assert r.status_code == 201 and r.json()[0]["status"] == "queued"
    results = post_ops(broker.client, [sched(q, "a", b'{"timer":1}', 300, txn="dup-1"),
                                       sched(q, "b", b'{"timer":2}', 300, txn="new-1"),
                                       sched(q, "c", b'{"timer":3}', 300, txn="new-1")])
    for key in ("a", "b", "c"):
        wait_fired(db, q, key)
    msgs = stored_messages(db, q)
    assert [(m.transaction_id, m.payload) for m in msgs] == [
        ("dup-1", b'{"pushed":true}'), ("new-1", b'{"timer":2}')]
    assert msgs[1].message_id == results[1]["messageId"]


# ---------------------------------------------------------------------------------- routes
def test_list_peek_and_cancel_routes(broker, db):
    q = uq("tm")
    key = "orders/1001/reminder"
    s1 = one(broker.client, sched(q, key, b'{"a":1}', 60_000, partition="p"))
    s2 = one(broker.client, sched(q, "x", b'{"b":2}', 30_000))
    one(broker.client, sched(q, "y", delay_ms=90_000))

    r = broker.client.get(f"{TIMERS}/{q}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 3 and body["queue"] == q
    assert [t["timerKey"] for t in body["timers"]] == ["x", key, "y"]  # deliverAt order
    assert body["pagination"] == {"limit": 100, "offset": 0}
    page = broker.client.get(f"{TIMERS}/{q}", params={"limit": "1", "offset": "1"}).json()
    assert [t["timerKey"] for t in page["timers"]] == [key] and page["total"] == 3

    r = broker.client.get(f"{TIMERS}/{q}/{key}")
    assert r.status_code == 200, r.text
    peek = r.json()
    assert peek["timerKey"] == key and peek["state"] == "pending" and peek["partition"] == "p"
    assert peek["messageId"] == s1["messageId"] and peek["deliverAt"] == s1["deliverAt"]
    assert peek["txn"] == s1["txn"] and peek["payloadZstd"] is False
    assert base64.b64decode(peek["payload"]) == b'{"a":1}' and peek["data"] == {"a": 1}

    r = broker.client.delete(f"{TIMERS}/{q}/{key}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled" and r.json()["messageId"] == s1["messageId"]
    # still remembered as cancelled, no longer listed
    assert broker.client.get(f"{TIMERS}/{q}/{key}").json()["state"] == "cancelled"
    body = broker.client.get(f"{TIMERS}/{q}").json()
    assert [t["timerKey"] for t in body["timers"]] == ["x", "y"]
    again = broker.client.delete(f"{TIMERS}/{q}/{key}")
    assert again.status_code == 200 and again.json()["status"] == "absent"

    shaped(broker.client.get(f"{TIMERS}/{q}/nope"), 404, "not_found", "absent")
    shaped(broker.client.get(f"{TIMERS}/{q}", params={"limit": "0"}), 400, "invalid_request")
    shaped(broker.client.get(f"{TIMERS}/{q}/{'k' * 1025}"), 413, "name_too_long")
    # an unknown queue lists nothing
    assert broker.client.get(f"{TIMERS}/{uq('none')}").json()["total"] == 0
    for k in ("x", "y"):
        assert broker.client.delete(f"{TIMERS}/{q}/{k}").json()["status"] == "cancelled"
    assert s2["status"] == "scheduled"


def test_server_owned_and_malformed_are_400(broker, db):
    q = uq("tm")
    body = post_ops(broker.client, [sched(q, "a"), {**sched(q, "b"), "messageId": "x"}], 400)
    assert body["error"] == "invalid_request" and body["reason"] == "server_owned_field"
    assert body["index"] == 1 and body["field"] == "messageId"
    body = post_ops(broker.client, [{**sched(q, "a"), "producerSub": "me"}], 400)
    assert body["reason"] == "server_owned_field" and body["field"] == "producerSub"
    # nothing of a rejected body is applied
    assert db.execute("SELECT count(*) FROM queen.queues WHERE name = %s", (q,)).fetchone()[0] == 0
    shaped(broker.client.post(TIMERS, content=b"{not json"), 400, "invalid_request",
           "malformed_json")
    shaped(broker.client.post(TIMERS, json={"ops": []}), 400, "invalid_request")
    shaped(broker.client.post(TIMERS, json={"operations": [{**sched(q, "a"), "payload": "@@"}]}),
           400, "invalid_request", "invalid_base64")
    shaped(broker.client.post(TIMERS, json={"operations": [sched(q, "k" * 1025)]}), 413,
           "name_too_long", "key_too_long")
    assert post_ops(broker.client, []) == []


def test_maintenance_refuses_timer_writes(broker, db):
    q = uq("tm")
    one(broker.client, sched(q, "keep", delay_ms=60_000))
    db.execute("UPDATE queen.system_settings SET value = 'true' WHERE key = 'maintenance_mode'")
    try:
        body = shaped(broker.client.post(TIMERS, json={"operations": [sched(q, "k")]}), 503,
                      "maintenance", "maintenance")
        assert "maintenance" in body["detail"]
        shaped(broker.client.delete(f"{TIMERS}/{q}/keep"), 503, "maintenance")
        # reads still work
        assert broker.client.get(f"{TIMERS}/{q}").json()["total"] == 1
    finally:
        db.execute("UPDATE queen.system_settings SET value = 'false' "
                   "WHERE key = 'maintenance_mode'")
    assert timer_row(db, q, "k") is None and timer_row(db, q, "keep")[0] == "pending"
    one(broker.client, cancel(q, "keep"))


# ---------------------------------------------------------------------------------- durability
def test_timer_survives_a_broker_restart(fresh_db_dsn, make_broker):
    q = uq("tm")
    first = make_broker(fresh_db_dsn)
    res = one(first.client, sched(q, "k", b'{"restart":true}', 3000, txn="rs-1"))
    assert first.stop() == 0
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        state, _, fire_at, _ = timer_row(db, q, "k")
        assert state == "pending", "fired before the broker stopped: make the delay longer"
        second = make_broker(fresh_db_dsn)
        got = pop(second.client, q, wait_ms=15_000)
        (m,) = got["messages"]
        assert (m["id"], m["transactionId"], m["data"]) == (res["messageId"], "rs-1",
                                                            {"restart": True})
        (stored,) = stored_messages(db, q)
        assert stored.created_at >= fire_at


def test_two_brokers_fire_each_timer_exactly_once(fresh_db_dsn, make_broker):
    q = uq("tm")
    a = make_broker(fresh_db_dsn)
    b = make_broker(fresh_db_dsn)
    ops = [sched(q, f"t-{i}", b'{"i":%d}' % i, 1500, partition=f"p{i % 5}", txn=f"x-{i}")
           for i in range(50)]
    results = post_ops(a.client, ops)
    ids = {r["messageId"] for r in results}
    assert len(ids) == 50
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        wait_for(lambda: db.execute(
            "SELECT count(*) FROM queen.timers WHERE state = 'fired'").fetchone()[0] == 50,
            timeout=20)
        time.sleep(0.5)  # any double firing would have landed by now
        msgs = stored_messages(db, q)
        assert len(msgs) == 50
        assert {m.message_id for m in msgs} == ids
        assert sorted(m.transaction_id for m in msgs) == sorted(f"x-{i}" for i in range(50))
        assert db.execute("SELECT array_agg(DISTINCT attempts) FROM queen.timers"
                          ).fetchone()[0] == [1]
    for broker in (a, b):
        assert "timer round failed" not in broker.log(), broker.log()[-3000:]


# ---------------------------------------------------------------------------------- SQL level
# A private database with no broker: nothing fires behind the test's back.
TENANT = "00000000-0000-0000-0000-000000000000"


def apply_sql(conn: psycopg.Connection, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from queen_mp.models import timers

    minted = timers.mint(timers.parse_timer_ops(ops))
    conn.execute("SELECT queen.timer_provision_v1(%s, %s)",
                 (TENANT, timers.queues_to_provision(minted)))
    return conn.execute("SELECT queen.timer_apply_v1(%s, %s::jsonb)",
                        (TENANT, orjson_dumps(minted))).fetchone()[0]


def orjson_dumps(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


def claim(conn: psycopg.Connection, limit: int = 200) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT timer_key FROM queen.timer_claim_due_v1(%s)", (limit,)).fetchall()]


def test_claim_skips_held_timers_and_locks_partitions_first(fresh_db_dsn):
    import threading

    q = uq("tm")
    with psycopg.connect(fresh_db_dsn, autocommit=True) as setup:
        apply_sql(setup, [sched(q, "a", partition="p1"), sched(q, "b", partition="p1"),
                          sched(q, "c", partition="p2")])
        assert setup.execute("SELECT queen.timer_due_v2()").fetchone()[0] is True
        setup.execute("INSERT INTO queen.log_partitions (queue_id, name) SELECT q.id, p.name "
                      "FROM queen.queues q, (VALUES ('p1'), ('p2')) AS p(name) "
                      "WHERE q.name = %s", (q,))
    holder = psycopg.connect(fresh_db_dsn)
    firer = psycopg.connect(fresh_db_dsn)
    probe = psycopg.connect(fresh_db_dsn)
    try:
        # a transaction holding timer "a" (an apply in flight): the claim skips it
        holder.execute("SELECT 1 FROM queen.timers WHERE timer_key = 'a' FOR UPDATE")
        assert sorted(claim(firer)) == ["b", "c"]
        firer.rollback()
        holder.rollback()

        # a transaction holding partition p1 (a push in flight): the claim waits for it
        # WITHOUT holding any timer row meanwhile (lock order: partitions, then timers)
        holder.execute("SELECT 1 FROM queen.log_partitions WHERE name = 'p1' FOR UPDATE")
        got: list[str] = []
        worker = threading.Thread(target=lambda: got.extend(claim(firer)))
        worker.start()
        with psycopg.connect(fresh_db_dsn, autocommit=True) as watch:
            wait_for(lambda: watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%timer_claim_due_v1%'").fetchone()[0] == 1)
        rows = probe.execute("SELECT timer_key FROM queen.timers FOR UPDATE NOWAIT").fetchall()
        assert len(rows) == 3  # none of them is held by the waiting firer
        probe.rollback()
        holder.rollback()
        worker.join(10)
        assert sorted(got) == ["a", "b", "c"]
        firer.rollback()
    finally:
        for conn in (holder, firer, probe):
            conn.close()


def test_retention_decides_too_late_versus_absent(fresh_db_dsn):
    q = uq("tm")
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        apply_sql(db, [sched(q, "old"), sched(q, "new"), sched(q, "gone")])
        with db.transaction():
            keys = claim(db)
            qid = db.execute("SELECT id FROM queen.queues WHERE name = %s", (q,)).fetchone()[0]
            assert db.execute("SELECT queen.timer_mark_fired_v1(%s, %s)",
                              ([qid] * len(keys), keys)).fetchone()[0] == 3
        assert db.execute("SELECT queen.timer_due_v2()").fetchone()[0] is False
        assert db.execute("SELECT queen.timer_purge_v1(600)").fetchone()[0] == 0
        assert db.execute("SELECT queen.timer_retention_s()").fetchone()[0] == 600
        db.execute("UPDATE queen.timers SET fired_at = now() - interval '700 seconds', "
                   "updated_at = now() - interval '700 seconds' "
                   "WHERE timer_key IN ('old', 'gone')")
        # past the retention but not purged yet: already absent
        res = apply_sql(db, [cancel(q, "old"), cancel(q, "new")])
        assert [r["status"] for r in res] == ["absent", "too_late"]
        assert db.execute("SELECT queen.timer_get_v1(%s, %s, 'old')", (TENANT, q)).fetchone()[0] \
            is None
        assert db.execute("SELECT queen.timer_purge_v1(600)").fetchone()[0] == 2
        assert [r[0] for r in db.execute("SELECT timer_key FROM queen.timers").fetchall()] == \
            ["new"]
        # maintenance: nothing is due, nothing is claimed
        apply_sql(db, [sched(q, "m")])
        db.execute("UPDATE queen.system_settings SET value = 'true' "
                   "WHERE key = 'maintenance_mode'")
        assert db.execute("SELECT queen.timer_due_v2()").fetchone()[0] is False
        assert claim(db) == []


def test_firer_rounds_budget_dedup_and_wake(fresh_db_dsn):
    """TimerFirer.fire_once on its own (no broker): the frame budget splits a round, repeats
    of one txn in a partition give one message, a damaged payload is dropped, and the queues
    that got messages are woken once the round committed."""
    import asyncio

    from queen_mp.shards.timerfire import TimerFirer

    q = uq("tm")
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        apply_sql(db, [sched(q, "a", b'{"a":1}', txn="t-a"), sched(q, "b", b'{"b":1}', txn="t-b"),
                       sched(q, "c", b'{"c":1}', txn="t-a"), sched(q, "d", b'{"d":1}', txn="t-d"),
                       sched(q, "e", b'{"e":1}', txn="t-e")])
        db.execute("UPDATE queen.timers SET payload = '\\x28b52ffd00'::bytea, payload_zstd = true "
                   "WHERE timer_key = 'd'")
        woken: list[set] = []
        firer = TimerFirer(fresh_db_dsn, woken.append, name="test firer", max_round_bytes=1)

        async def rounds() -> list[bool]:
            out = []
            try:
                for _ in range(10):
                    more = await firer.fire_once()
                    out.append(more)
                    if not more:
                        break
            finally:
                await firer._drop_connection()
            return out

        fulls = asyncio.run(rounds())
        assert fulls[0] is True and fulls[-1] is False
        states = dict(db.execute("SELECT timer_key, state FROM queen.timers").fetchall())
        assert set(states.values()) == {"fired"}, states
        msgs = stored_messages(db, q)
        # fire_at order is a, b, c, d, e: c repeats t-a, d is unreadable
        assert [(m.transaction_id, m.payload) for m in msgs] == [
            ("t-a", b'{"a":1}'), ("t-b", b'{"b":1}'), ("t-e", b'{"e":1}')]
        assert woken and all(w == {(bytes(16), q)} for w in woken)
        assert firer.fired_total == 5
