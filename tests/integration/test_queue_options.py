"""Issue 27 ("what was found"): the upstream queue options ``maxWaitTimeSeconds``, ``ttl``,
``retryDelay``, ``maxSize`` and ``retentionEnabled`` (api.md 4). A message that waited longer
than ``maxWaitTimeSeconds`` is not delivered, even before housekeeping evicts it, and is counted
as evicted (the queue's ``totals.evicted``, ``queen_messages_evicted_total``,
``messages.evicted`` of ``GET /metrics``), whatever ``retentionEnabled`` says; consumed and
leased messages are not counted or kept. The two retention seconds act only with
``retentionEnabled``. A batch nacked or whose lease expired is redelivered ``retryDelay`` ms
later, not before. ``ttl`` other than its default and ``maxSize`` other than 0 are refused with
a 400 naming what acts instead.

The session broker (housekeeping every 5 s, so an eviction shows 2..7 s after the push); the
queues are configured through the published 2.6 client.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import psycopg
import pytest
from queen import Queen

from tests.brokerharness import Broker
from tests.integration.test_push_json import uq

WAIT_S = 2


@pytest.fixture
def hk(broker: Broker) -> Broker:
    return broker


def push(b: Broker, queue: str, n: int, partition: str = "p") -> None:
    r = b.client.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "payload": {"n": i}} for i in range(n)]})
    assert r.status_code == 201 and {x["status"] for x in r.json()} == {"queued"}, r.text


def pop(b: Broker, queue: str, **params: Any) -> list[dict]:
    r = b.client.get(f"/api/v1/pop/queue/{queue}", params={"batch": 10, **params})
    assert r.status_code in (200, 204), r.text
    return [] if r.status_code == 204 else r.json()["messages"]


def detail(b: Broker, queue: str) -> dict:
    r = b.client.get(f"/api/v1/resources/queues/{queue}")
    assert r.status_code == 200, r.text
    return r.json()


def log_start(b: Broker, queue: str) -> int:
    r = b.client.post("/api/v1/fetch", json={"entries": [
        {"queue": queue, "partition": "p", "offset": 0}]})
    assert r.status_code == 200, r.text
    return r.json()["entries"][0]["logStartOffset"]


def prometheus_evicted(b: Broker) -> float:
    text = b.client.get("/metrics/prometheus").text
    lines = [ln for ln in text.splitlines() if ln.startswith("queen_messages_evicted_total")]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_messages_that_waited_too_long_are_evicted_and_counted(hk):
    waiting, consumed, leased = uq("mw"), uq("mwc"), uq("mwl")

    async def configure() -> None:
        async with Queen(hk.url) as client:
            for q in (waiting, consumed, leased):
                await client.queue(q).config({"max_wait_time_seconds": WAIT_S,
                                              "lease_time": 60}).create()

    asyncio.run(configure())
    options = detail(hk, waiting)["options"]
    # retentionEnabled off: the eviction is not retention and does not read it (as upstream)
    assert (options["maxWaitTimeSeconds"], options["retentionEnabled"]) == (WAIT_S, False)
    before = prometheus_evicted(hk)
    push(hk, waiting, 3)
    push(hk, consumed, 2)
    push(hk, leased, 1)
    assert len(pop(hk, consumed, consumerGroup="g", autoAck="true")) == 2
    held = pop(hk, leased)  # leased for 60 s: delivered in time, kept
    assert len(held) == 1
    deadline = time.monotonic() + WAIT_S + 12
    while detail(hk, waiting)["totals"]["evicted"] < 3:
        assert time.monotonic() < deadline, hk.log()[-3000:]
        time.sleep(0.3)
    assert pop(hk, waiting) == []  # never delivered
    assert pop(hk, waiting, consumerGroup="late") == []
    assert log_start(hk, waiting) == 4
    # the consumed queue lost its old segments too, but nothing it had not delivered
    while log_start(hk, consumed) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert detail(hk, consumed)["totals"]["evicted"] == 0
    assert log_start(hk, leased) == 1 and detail(hk, leased)["totals"]["evicted"] == 0
    assert prometheus_evicted(hk) - before >= 3
    assert hk.client.get("/metrics").json()["messages"]["evicted"] >= 3
    # what arrives after the eviction is delivered as usual
    push(hk, waiting, 1)
    fresh = pop(hk, waiting)
    assert [(m["offset"], m["data"]) for m in fresh] == [(4, {"n": 0})]


def test_zero_waits_forever_and_a_step_counts_what_it_evicts(hk, db):
    """Segments an hour old, one retention step each (housekeeping may run it first: the
    queue's count is the sum either way): 0 keeps them, 60 s evicts them."""
    zero, sixty = uq("mw0"), uq("mw60")
    for q, wait in ((zero, 0), (sixty, 60)):
        r = hk.client.post("/api/v1/configure", json={"queue": q, "options": {
            "maxWaitTimeSeconds": wait}})
        assert r.status_code == 200, r.text
        push(hk, q, 2)
        pid = db.execute("SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues qq"
                         " ON qq.id = lp.queue_id WHERE qq.name = %s", (q,)).fetchone()[0]
        db.execute("UPDATE queen.log_segments SET created_at = now() - interval '1 hour'"
                   " WHERE partition_id = %s", (pid,))
        db.execute("SELECT queen.retention_partition_v2(%s, 100)", (pid,))
    assert [m["data"] for m in pop(hk, zero)] == [{"n": 0}, {"n": 1}]
    assert detail(hk, zero)["totals"]["evicted"] == 0
    assert pop(hk, sixty) == [] and detail(hk, sixty)["totals"]["evicted"] == 2


def test_retention_seconds_act_only_with_retention_enabled(hk, db):
    """As upstream, retentionSeconds and completedRetentionSeconds delete nothing unless
    retentionEnabled is true. Two queues configured with the same seconds, one with the switch
    and one without it (what a client that sets only the seconds sends), their segments an hour
    old and consumed by a group: the session broker's housekeeping trims the first; the second
    keeps every message (a step on it deletes nothing either, so a round that has not reached
    its shard yet hides nothing)."""
    on, off = uq("reton"), uq("retoff")
    configure(hk, on, retentionSeconds=60, completedRetentionSeconds=60, retentionEnabled=True)
    configure(hk, off, retentionSeconds=60, completedRetentionSeconds=60)
    assert detail(hk, off)["options"]["retentionEnabled"] is False
    pids = {}
    for q in (on, off):
        push(hk, q, 2)
        assert len(pop(hk, q, consumerGroup="g", autoAck="true")) == 2
        pids[q] = db.execute("SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues qq"
                             " ON qq.id = lp.queue_id WHERE qq.name = %s", (q,)).fetchone()[0]
        db.execute("UPDATE queen.log_segments SET created_at = now() - interval '1 hour'"
                   " WHERE partition_id = %s", (pids[q],))
    deadline = time.monotonic() + 15
    while log_start(hk, on) < 3:
        assert time.monotonic() < deadline, hk.log()[-3000:]
        time.sleep(0.3)
    step = db.execute("SELECT queen.retention_partition_v2(%s, 100)", (pids[off],)).fetchone()
    assert step[0]["segments"] == 0
    assert log_start(hk, off) == 1
    assert [m["data"] for m in pop(hk, off)] == [{"n": 0}, {"n": 1}]
    assert detail(hk, on)["totals"]["evicted"] == detail(hk, off)["totals"]["evicted"] == 0


def test_ttl_other_than_its_default_is_refused(hk):
    q = uq("ttl")
    r = hk.client.post("/api/v1/configure", json={"queue": q, "options": {"ttl": 60}})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_request" and body["field"] == "ttl"
    assert "maxWaitTimeSeconds" in body["error"] and "retentionSeconds" in body["error"]
    assert hk.client.get(f"/api/v1/resources/queues/{q}").status_code == 404  # nothing made
    ok = hk.client.post("/api/v1/configure", json={"queue": q, "options": {"ttl": 3600}})
    assert ok.status_code == 200 and ok.json()["options"]["ttl"] == 3600

    async def through_the_client() -> None:
        async with Queen(hk.url) as client:
            await client.queue(q).config({"ttl": 5}).create()

    with pytest.raises(Exception, match="ttl") as refused:
        asyncio.run(through_the_client())
    assert not isinstance(refused.value, httpx.TimeoutException)


def test_max_size_other_than_zero_is_refused(hk):
    q = uq("maxsize")
    r = hk.client.post("/api/v1/configure", json={"queue": q, "options": {"maxSize": 10}})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_request" and body["field"] == "maxSize"
    assert "retentionSeconds" in body["error"] and "maxWaitTimeSeconds" in body["error"]
    # what upstream does with it (q2.evict_v1 of its eviction service), not "nothing"
    assert "oldest segments" in body["error"]
    assert hk.client.get(f"/api/v1/resources/queues/{q}").status_code == 404  # nothing made

    async def through_the_client(options: dict[str, Any]) -> None:
        async with Queen(hk.url) as client:
            await client.queue(q).config(options).create()

    asyncio.run(through_the_client({"retryLimit": 2}))  # the client's defaults send maxSize 0
    assert detail(hk, q)["options"]["maxSize"] == 0
    with pytest.raises(Exception, match="maxSize") as refused:
        asyncio.run(through_the_client({"max_size": 5}))
    assert not isinstance(refused.value, httpx.TimeoutException)
    assert detail(hk, q)["options"]["maxSize"] == 0


# ------------------------------------------------------------------------------ retryDelay
def configure(b: Broker, queue: str, **options: Any) -> None:
    r = b.client.post("/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text


def ack(b: Broker, m: dict, status: str, group: str | None = None) -> dict:
    body = {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "status": status}
    if group is not None:
        body["consumerGroup"] = group
    r = b.client.post("/api/v1/ack", json=body)
    assert r.status_code == 200, r.text
    (item,) = r.json()
    return item


def timed_pop(b: Broker, queue: str, **params: Any) -> tuple[list[dict], float]:
    """A long-poll pop and how long it took to answer."""
    t0 = time.monotonic()
    got = pop(b, queue, wait="true", **params)
    return got, time.monotonic() - t0


def test_a_nacked_batch_is_redelivered_retry_delay_later(hk):
    q = uq("rdelay")
    configure(hk, q, retryDelay=1500, retryLimit=5)
    push(hk, q, 2)
    (m,) = pop(hk, q, batch=1)
    assert ack(hk, m, "failed")["leaseReleased"] is True
    assert pop(hk, q) == []  # not at once
    got, took = timed_pop(hk, q, timeout=30000, batch=1)
    # the parked pop wakes when the delay ends (the pop's own wake-up time), not at its 30 s
    # timeout (10 s: room for a loaded machine)
    assert [(x["offset"], x["deliveryAttempt"]) for x in got] == [(1, 2)], got
    assert 0.9 <= took < 10, took
    # a completed batch holds nothing back: the next message comes at once
    assert ack(hk, got[0], "completed")["leaseReleased"] is True
    assert [x["offset"] for x in pop(hk, q, batch=1)] == [2]


def test_an_expired_lease_is_redelivered_retry_delay_after_it_expired(hk):
    q, g = uq("rdexp"), "workers"
    configure(hk, q, retryDelay=2000, leaseTime=1)
    push(hk, q, 1)
    (m,) = pop(hk, q, consumerGroup=g)
    t_pop = time.monotonic()
    time.sleep(1.3)  # the lease expired; the delay has not run out
    assert pop(hk, q, consumerGroup=g) == []
    got = pop(hk, q, consumerGroup=g, wait="true", timeout=30000)
    waited = time.monotonic() - t_pop
    assert [(x["offset"], x["deliveryAttempt"]) for x in got] == [(1, 2)], got
    assert got[0]["leaseId"] != m["leaseId"]
    # leaseTime 1 s + retryDelay 2 s, not the pop's 30 s timeout (room for a loaded machine)
    assert 2.7 <= waited < 12, waited


def test_a_retry_ack_hands_back_at_once(hk):
    """`retry` is how the clients give back what they will not process: no delay."""
    q = uq("rdback")
    configure(hk, q, retryDelay=60_000)
    push(hk, q, 1)
    (m,) = pop(hk, q)
    assert ack(hk, m, "retry")["leaseReleased"] is True
    assert [(x["offset"], x["deliveryAttempt"]) for x in pop(hk, q)] == [(1, 2)]


def test_retry_delay_zero_redelivers_at_once(hk):
    q = uq("rd0")
    configure(hk, q, retryDelay=0)
    push(hk, q, 1)
    (m,) = pop(hk, q)
    ack(hk, m, "failed")
    assert [(x["offset"], x["deliveryAttempt"]) for x in pop(hk, q)] == [(1, 2)]


# ------------------------------------------------------------- maxWaitTimeSeconds, strict
def test_an_overdue_message_is_not_delivered_before_housekeeping_evicts_it(make_broker,
                                                                            fresh_db_dsn):
    """Housekeeping off: only the pop stands between an overdue message and a consumer. A
    database of its own: the session broker's housekeeping (every 5 s) evicted the messages
    when this test ran slower than that on a loaded machine."""
    db_dsn = fresh_db_dsn
    b = make_broker(db_dsn, QUEEN_HOUSEKEEPING_S="3600")
    q = uq("mwstrict")
    configure(b, q, maxWaitTimeSeconds=60, retryDelay=0)
    push(b, q, 2)
    with psycopg.connect(db_dsn, autocommit=True) as db:
        pid = db.execute("SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues qq"
                         " ON qq.id = lp.queue_id WHERE qq.name = %s", (q,)).fetchone()[0]
        db.execute("UPDATE queen.log_segments SET created_at = now() - interval '61 seconds'"
                   " WHERE partition_id = %s", (pid,))
        assert pop(b, q) == [] and pop(b, q, consumerGroup="g") == []
        assert detail(b, q)["totals"]["evicted"] == 0  # not evicted yet: only withheld
        push(b, q, 1)  # a fresh message behind the overdue ones waits for the eviction
        assert pop(b, q) == []
        db.execute("SELECT queen.retention_partition_v2(%s, 100)", (pid,))
    assert detail(b, q)["totals"]["evicted"] == 2
    assert [(m["offset"], m["data"]) for m in pop(b, q)] == [(3, {"n": 0})]
    assert [m["offset"] for m in pop(b, q, consumerGroup="g")] == [3]
