"""Maintenance switches (api.md 5, 1.8, 2.1, 2.2): pushes buffered to the disk spool and
drained afterwards, every instance told within a second, pop maintenance, the spool routes.

Each test has a database of its own: the switches are cluster-wide, one test leaving
maintenance on must not stop the pushes of another.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import httpx
import psycopg

from tests.brokerharness import Broker
from tests.integration.test_pop import assert_204, pop, pop_ok
from tests.integration.test_push_json import PUSH, queue_footprint, stored_messages, uq

MAINT = "/api/v1/system/maintenance"
POP_MAINT = "/api/v1/system/maintenance/pop"
SPOOL = "/api/v1/system/spool"
BUFFERS = "/api/v1/status/buffers"
DRAIN = "/api/v1/system/spool/drain"
SPOOL_KEYS = {"pending", "failed", "files", "bytes", "draining", "lastDrainAt", "dbHealthy"}


# ---------------------------------------------------------------------------------- helpers
def set_maintenance(b: Broker, enabled: bool, route: str = MAINT) -> dict:
    r = b.client.post(route, json={"enabled": enabled})
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(what: str, check: Any, timeout: float = 30.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def spool_status(b: Broker) -> dict:
    r = b.client.get(SPOOL)
    assert r.status_code == 200, r.text
    return r.json()


def wait_drained(b: Broker, timeout: float = 30.0) -> dict:
    try:
        return wait_for("the spool to drain", lambda: (s := spool_status(b))["pending"] == 0
                        and not s["draining"] and s, timeout)
    except AssertionError:
        raise AssertionError(f"spool not drained: {spool_status(b)}\n{b.log()[-6000:]}"
                             ) from None


def pop_all(client: httpx.Client, queue: str, expected: int, timeout: float = 30.0
            ) -> list[dict]:
    """Every message of ``queue`` through real pops (auto-acked)."""
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        r = pop(client, queue, batch=1000, partitions=100, autoAck=True, wait=True,
                timeout=1000)
        if r.status_code == 204:
            continue
        assert r.status_code == 200, r.text
        got.extend(r.json()["messages"])
    # nothing more than expected
    assert_204(pop(client, queue, batch=1000, partitions=100, autoAck=True))
    return got


def items_for(queue: str, n: int, partitions: int = 3, prefix: str = "t") -> list[dict]:
    return [{"queue": queue, "partition": f"p{i % partitions}",
             "transactionId": f"{prefix}-{i}", "payload": {"i": i}} for i in range(n)]


# ---------------------------------------------------------------------------------- tests
def test_maintenance_buffers_pushes_and_the_drain_stores_each_once(make_broker, fresh_db_dsn):
    b = make_broker(fresh_db_dsn)
    q = uq("maint")
    assert b.client.get(MAINT).json()["maintenanceMode"] is False
    on = set_maintenance(b, True)
    assert on["maintenanceMode"] is True and on["message"]
    assert isinstance(on["bufferedMessages"], int)
    for _ in range(6):  # both workers
        assert b.client.get("/health").json()["maintenanceMode"] is True

    items = items_for(q, 30)
    items.append({"queue": q, "payload": {"no": "txn"}})            # minted transactionId
    items.append({"queue": q, "partition": "p0", "transactionId": "t-0",
                  "payload": {"repeat": True}})                    # in-body duplicate
    r = b.client.post(PUSH, json={"items": items})
    assert r.status_code == 201, r.text
    results = r.json()
    assert [x["status"] for x in results] == ["buffered"] * len(items)
    assert all(x["offset"] is None and x["partitionId"] is None for x in results)
    assert results[-1]["messageId"] == results[0]["messageId"]     # follower of its leader
    ids = {x["messageId"] for x in results}
    assert len(ids) == 31
    # a second request while maintenance is on, from the binary-free JSON path too
    r2 = b.client.post(PUSH, json={"items": items_for(q, 5, prefix="late")})
    assert [x["status"] for x in r2.json()] == ["buffered"] * 5
    ids |= {x["messageId"] for x in r2.json()}

    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        assert queue_footprint(conn, q) == (0, 0, 0, 0)            # nothing reached PostgreSQL
    status = spool_status(b)
    assert status["pending"] == 36 and status["files"] >= 1 and status["bytes"] > 0
    assert b.client.get(MAINT).json()["bufferedMessages"] == 36

    # writes that cannot be spooled are refused while maintenance is on
    r = b.client.post("/api/v1/transaction", json={"operations": [
        {"type": "push", "items": [{"queue": q, "payload": 1}]}]})
    assert r.status_code == 503 and r.json()["code"] == "maintenance", r.text
    r = b.client.post("/api/v1/kv", json={"operations": [
        {"op": "put", "ns": "maint", "key": "k", "value": 1, "forever": True}]})
    assert r.status_code == 503 and r.json()["reason"] == "maintenance", r.text
    r = b.client.post("/api/v1/kv", json={"operations": [{"op": "get", "ns": "maint",
                                                          "key": "k"}]})
    assert r.status_code == 200, r.text                             # reads are served
    r = b.client.post("/api/v1/timers", json={"operations": [
        {"op": "schedule", "queue": q, "timerKey": "k", "delayMs": 1000, "payload": "MQ=="}]})
    assert r.status_code == 503 and r.json()["code"] == "maintenance", r.text
    assert b.client.post(DRAIN, json={}).status_code == 409

    off = set_maintenance(b, False)
    assert off["maintenanceMode"] is False
    wait_drained(b)
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        stored = wait_for("every message stored", lambda: (
            m := stored_messages(conn, q)) and len(m) >= 36 and m)
    assert collections.Counter(m.message_id for m in stored) == collections.Counter(ids)
    assert len({m.transaction_id for m in stored}) == 36
    by_id = {m.message_id: m for m in stored}
    for item, res in zip(items[:30], results[:30], strict=True):
        m = by_id[res["messageId"]]
        assert (m.partition, m.transaction_id) == (item["partition"], item["transactionId"])
    popped = pop_all(b.client, q, 36)
    assert sorted(m["id"] for m in popped) == sorted(ids)
    assert {m["transactionId"] for m in popped} >= {f"t-{i}" for i in range(30)}
    status = spool_status(b)
    assert status["lastDrainAt"] is not None and status["failed"] == 0
    # pushes go straight to PostgreSQL again
    r = b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "after"}]})
    assert r.json()[0]["status"] == "queued"


def test_a_second_instance_sees_a_change_promptly(make_broker, fresh_db_dsn):
    b1 = make_broker(fresh_db_dsn)
    b2 = make_broker(fresh_db_dsn)
    q = uq("maint2")

    def seen_by(b: Broker, value: bool) -> bool:
        # a few answers, so that both front workers are asked
        return all(b.client.get("/health").json()["maintenanceMode"] is value
                   for _ in range(4))

    # NOTIFY, or the re-read about once a second (queen_mp/ipc/flags.py): 5 s leaves room for
    # a loaded machine
    set_maintenance(b1, True)
    wait_for("b2 to see maintenance on", lambda: seen_by(b2, True), timeout=5, every=0.02)
    r = b2.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "x"}]})
    assert r.json()[0]["status"] == "buffered"
    mid = r.json()[0]["messageId"]

    set_maintenance(b2, False)
    wait_for("b1 to see maintenance off", lambda: seen_by(b1, False), timeout=5, every=0.02)

    # a plain SQL change (no API call) is announced too, by the settings trigger
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE queen.system_settings SET value = 'true' "
                     "WHERE key = 'pop_maintenance_mode'")
        wait_for("b1 to see pop maintenance", lambda: b1.client.get(
            "/health").json()["popMaintenanceMode"] is True, timeout=5, every=0.02)
        conn.execute("UPDATE queen.system_settings SET value = 'false' "
                     "WHERE key = 'pop_maintenance_mode'")

    # b2 drains its own spool
    wait_drained(b2)
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        stored = wait_for("the buffered message", lambda: stored_messages(conn, q))
    assert [m.message_id for m in stored] == [mid]


def test_pop_maintenance_answers_204_and_holds_waiting_pops(make_broker, fresh_db_dsn):
    b = make_broker(fresh_db_dsn)
    q = uq("popmaint")
    r = b.client.post(PUSH, json={"items": [{"queue": q, "payload": {"a": 1}}]})
    assert r.json()[0]["status"] == "queued"
    assert b.client.get(POP_MAINT).json() == {"popMaintenanceMode": False}
    on = set_maintenance(b, True, POP_MAINT)
    assert on["popMaintenanceMode"] is True and on["message"]
    assert b.client.get(POP_MAINT).json()["popMaintenanceMode"] is True
    assert b.client.get("/health").json()["popMaintenanceMode"] is True
    body = b.client.get(MAINT).json()
    assert body["popMaintenanceMode"] is True and body["maintenanceMode"] is False

    assert_204(pop(b.client, q))
    t0 = time.monotonic()
    assert_204(pop(b.client, q, wait=True, timeout=1500))
    held = time.monotonic() - t0
    assert 1.3 <= held < 10, held  # held to its timeout, not the 30 s default
    # pushes are not affected by pop maintenance
    r = b.client.post(PUSH, json={"items": [{"queue": q, "payload": {"a": 2}}]})
    assert r.json()[0]["status"] == "queued"

    set_maintenance(b, False, POP_MAINT)
    got = pop_ok(b.client, q, batch=10)["messages"]
    assert [m["data"] for m in got] == [{"a": 1}, {"a": 2}]


def test_spool_routes_status_fields_and_409_during_maintenance(make_broker, fresh_db_dsn):
    b = make_broker(fresh_db_dsn)
    for route in (SPOOL, BUFFERS):
        body = b.client.get(route).json()
        assert set(body) == SPOOL_KEYS, body
        assert body["pending"] == 0 and body["failed"] == 0 and body["draining"] is False
        assert body["dbHealthy"] is True
    m = b.client.get(MAINT).json()
    assert set(m) == {"maintenanceMode", "popMaintenanceMode", "bufferedMessages",
                      "bufferHealthy", "spool"}
    assert set(m["spool"]) == {"pending", "failed", "bytes", "draining"}
    assert m["bufferHealthy"] in (True, False)

    for bad in ({}, {"enabled": "yes"}, {"enabled": None}, [True]):
        r = b.client.post(MAINT, json=bad)
        assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert b.client.post(MAINT, content=b"{").status_code == 400
    assert b.client.post(POP_MAINT, json={}).status_code == 400
    assert b.client.post(DRAIN, json={"retryFailed": "x"}).status_code == 400

    r = b.client.post(DRAIN)                      # no body at all is fine
    assert r.status_code == 202 and r.json() == {"draining": True, "pending": 0}
    r = b.client.post(DRAIN, json={"retryFailed": True})
    assert r.status_code == 202 and r.json()["draining"] is True

    set_maintenance(b, True)
    q = uq("st")
    b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": f"s{i}"}
                                        for i in range(3)]})
    r = b.client.post(DRAIN, json={})
    assert r.status_code == 409 and r.json()["code"] == "conflict", r.text
    assert spool_status(b)["pending"] == 3
    assert b.client.get(BUFFERS).json()["pending"] == 3
    set_maintenance(b, False)
    r = b.client.post(DRAIN, json={})
    assert r.status_code == 202 and r.json()["draining"] is True
    assert isinstance(r.json()["pending"], int)
    status = wait_drained(b)
    assert status["lastDrainAt"] is not None and status["lastDrainAt"].endswith("Z")
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        assert len(wait_for("stored", lambda: (m := stored_messages(conn, q)) and len(m) == 3
                            and m)) == 3
    # unknown methods on the new routes
    assert b.client.delete(MAINT).status_code == 405
    assert b.client.get(DRAIN).status_code == 405
