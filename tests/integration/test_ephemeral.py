"""Ephemeral queues (docs/api.md "Ephemeral queues", ``/api/v1/ephemeral/*``): driven through the
published client's ``client.ephemeral`` (queen-mq 2.6) where it has a verb, raw HTTP for every
error and limit, and SQL for what only the tables show (UNLOGGED, counters).

One session broker serves most tests; a second instance over the same database (module
scoped) answers the cross-instance test, and a broker with JWT authentication the roles and
tenancy test. Every test uses its own queue names.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from queen import Queen
from queen.ephemeral import EPHEMERAL_QUEUE_NOT_FOUND
from queen.errors import EphemeralError, EphemeralQueueNotFoundError

from tests.brokerharness import Broker, start_broker
from tests.integration.authkit import bearer, start_auth_broker, token

E = "/api/v1/ephemeral"


def uq(prefix: str = "eph") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def with_client(broker: Broker, fn: Any) -> Any:
    async with Queen(broker.url) as client:
        return await fn(client.ephemeral)


def push(c: httpx.Client, queue: str, payloads: list[Any], **extra: Any) -> dict:
    r = c.post(f"{E}/push", json={"queue": queue, "messages": [{"payload": p} for p in payloads],
                                  **extra})
    assert r.status_code == 201, r.text
    return r.json()


def pop(c: httpx.Client, queue: str, **params: Any) -> list[dict]:
    q = {"queue": queue, **{k: str(v).lower() if isinstance(v, bool) else str(v)
                            for k, v in params.items()}}
    r = c.get(f"{E}/pop", params=q, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["queue"] == queue
    return body["messages"]


def ack(c: httpx.Client, queue: str, acks: list[dict], **extra: Any) -> list[str]:
    r = c.post(f"{E}/ack", json={"queue": queue, "acks": acks, **extra})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["id"] for x in results] == [a["id"] for a in acks]
    return [x["outcome"] for x in results]


def configure(c: httpx.Client, queue: str, **options: Any) -> dict:
    r = c.post(f"{E}/configure", json={"queue": queue, "options": options})
    assert r.status_code == 201, r.text
    return r.json()


def depth(c: httpx.Client, queue: str) -> dict:
    r = c.get(f"{E}/queues/{queue}/depth")
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response, status: int, code: str, field: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == code, body
    assert body["error"], body
    if field is not None:
        assert body.get("field") == field, body
    return body


@pytest.fixture(scope="module")
def other(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A second instance over the session database."""
    b = start_broker(tmp_path_factory.mktemp("eph-other"), db_dsn)
    yield b
    assert b.stop() == 0, b.log()[-4000:]


# ------------------------------------------------------------------------ the client's verbs
def test_the_published_client_configures_pushes_pops_acks_and_reads_gauges(broker):
    q = uq()

    async def go(eph: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["configure"] = await eph.configure(q, max_length=100, lease_seconds=30,
                                               retry_limit=2, policy="dropOldest")
        out["push"] = await eph.push(q, [{"n": 1}, {"n": 2}, "three"], partition="p1")
        out["push2"] = await eph.push(q, {"payload": {"n": 4}})
        out["pop"] = await eph.pop(q, batch=10, group="g")
        out["ack"] = await eph.ack(q, out["pop"]["messages"], group="g")
        out["depth"] = await eph.depth(q)
        out["queues"] = await eph.queues()
        out["reset"] = await eph.reset(q)
        out["delete"] = await eph.delete(q)
        out["delete2"] = await eph.delete(q)
        try:
            await eph.depth(q)
        except EphemeralQueueNotFoundError as ex:
            out["missing"] = ex.code
        out["empty"] = await eph.pop(q)
        return out

    out = run(with_client(broker, go))
    assert out["configure"]["options"]["maxLength"] == 100
    assert out["configure"]["options"]["policy"] == "dropOldest"
    assert out["configure"]["tier"] == "declared"
    assert out["push"] == {"pushed": 3} and out["push2"] == {"pushed": 1}
    msgs = out["pop"]["messages"]
    assert out["pop"]["queue"] == q
    # FIFO per partition; the partition-less push went to Default
    by_part: dict[str, list[Any]] = {}
    for m in msgs:
        assert set(m) == {"id", "partition", "payload", "attempts"}, m
        assert m["attempts"] == 1
        by_part.setdefault(m["partition"], []).append(m["payload"])
    assert by_part == {"p1": [{"n": 1}, {"n": 2}, "three"], "Default": [{"n": 4}]}
    assert [r["outcome"] for r in out["ack"]["results"]] == ["acked"] * 4
    # every group that popped is past every message: nothing is left
    assert out["depth"]["pending"] == 0 and out["depth"]["tier"] == "declared"
    assert out["depth"]["consumerGroups"] == [{"group": "g", "pending": 0, "inFlight": 0}]
    listed = {x["queue"]: x for x in out["queues"]["queues"]}
    assert listed[q]["options"]["retryLimit"] == 2 and listed[q]["groups"] == 1
    assert out["reset"] == {"queue": q, "dropped": 0}
    assert out["delete"] == {"queue": q, "deleted": True, "declared": True}
    assert out["delete2"] == {"queue": q, "deleted": False, "declared": False}
    assert out["missing"] == EPHEMERAL_QUEUE_NOT_FOUND
    assert out["empty"] == {"queue": q, "messages": []}


def test_payloads_come_back_verbatim_and_queues_are_created_by_a_push(broker):
    q = uq()
    body = b'{"queue":"%s","messages":[{"payload":{"z":1,"a":[1.5,"x",null],"m":{"k":true}}}]}'
    r = broker.client.post(f"{E}/push", content=body % q.encode(),
                           headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert depth(broker.client, q)["tier"] == "implicit"
    r = broker.client.get(f"{E}/pop", params={"queue": q, "autoAck": "true"})
    assert b'"payload":{"z":1,"a":[1.5,"x",null],"m":{"k":true}}' in r.content, r.text
    assert depth(broker.client, q)["pending"] == 0


def test_groups_fan_out_and_consumers_of_one_group_compete(broker):
    q = uq()
    c = broker.client
    # a group's first pop registers it: from then on messages wait for it too
    assert pop(c, q, group="tail") == []
    push(c, q, list(range(40)), partition="a")
    push(c, q, list(range(40, 60)), partition="b")

    def consume(group: str) -> list[int]:
        got: list[int] = []
        while True:
            msgs = pop(c, q, group=group, batch=7)
            if not msgs:
                return got
            got += [m["payload"] for m in msgs]
            assert set(ack(c, q, [{"id": m["id"]} for m in msgs], group=group)) == {"acked"}

    with cf.ThreadPoolExecutor(3) as ex:
        competing = list(ex.map(consume, ["workers", "workers", "workers"]))
    merged = sorted(x for part in competing for x in part)
    assert merged == list(range(60)), merged  # each message once within the group
    assert depth(c, q)["pending"] == 60  # 'tail' has not read them yet
    tail = consume("tail")  # another group sees everything
    assert sorted(tail) == list(range(60))
    assert [x for x in tail if x < 40] == list(range(40))  # FIFO in partition 'a'
    d = depth(c, q)
    assert d["pending"] == 0, d  # both groups are past everything: deleted
    assert {g["group"] for g in d["consumerGroups"]} == {"workers", "tail"}
    # a group that comes later starts at what is still stored
    push(c, q, ["late"])
    assert [m["payload"] for m in pop(c, q, group="newcomer", autoAck=True)] == ["late"]


def test_concurrent_consumers_of_two_groups_get_each_message_once_and_leave_nothing(broker):
    """Consumers of one group run side by side in PostgreSQL (no queue-wide lock): each group
    still gets every message exactly once, and a message is deleted only after both groups
    acked it, however their acks interleave."""
    q = uq()
    c = broker.client
    for group in ("g1", "g2"):  # both registered before the first push
        assert pop(c, q, group=group) == []
    expected = []
    for part in range(4):
        batch = [f"{part}-{i}" for i in range(150)]
        push(c, q, batch, partition=f"p{part}")
        expected += batch

    def consume(group: str) -> list[str]:
        got: list[str] = []
        with httpx.Client(base_url=broker.url, timeout=60) as own:
            while True:
                msgs = pop(own, q, group=group, batch=9)
                if not msgs:
                    return got
                got += [m["payload"] for m in msgs]
                assert set(ack(own, q, [{"id": m["id"]} for m in msgs], group=group)) == {
                    "acked"}

    with cf.ThreadPoolExecutor(8) as ex:
        futs = {g: [ex.submit(consume, g) for _ in range(4)] for g in ("g1", "g2")}
        per_group = {g: [x for f in fs for x in f.result()] for g, fs in futs.items()}
    for group, got in per_group.items():
        assert sorted(got) == sorted(expected), group  # once each, none lost
    d = depth(c, q)
    assert d["pending"] == 0 and d["bytes"] == 0, d
    assert {g["group"]: (g["pending"], g["inFlight"]) for g in d["consumerGroups"]} == {
        "g1": (0, 0), "g2": (0, 0)}


def test_eight_consumers_of_two_groups_on_two_instances_ack_in_and_out_of_order(broker, other):
    """The same across two broker instances, with pushes that span chunks (300 messages: 256 +
    44) and acks in the order popped (one statement per delivery) or reversed (one per id):
    each group still gets every message once, and nothing is left, chunks included."""
    q = uq()
    for group in ("g1", "g2"):
        assert pop(broker.client, q, group=group) == []
    expected = []
    for part in range(3):
        batch = [f"{part}-{i}" for i in range(300)]
        push(broker.client, q, batch, partition=f"p{part}")
        expected += batch

    def consume(url: str, group: str, reverse: bool) -> list[str]:
        got: list[str] = []
        with httpx.Client(base_url=url, timeout=60) as own:
            while msgs := pop(own, q, group=group, batch=37):
                got += [m["payload"] for m in msgs]
                acks = [{"id": m["id"]} for m in (msgs[::-1] if reverse else msgs)]
                assert set(ack(own, q, acks, group=group)) == {"acked"}
        return got

    with cf.ThreadPoolExecutor(8) as ex:
        futs = {g: [ex.submit(consume, b.url, g, i % 2 == 1)
                    for i, b in enumerate((broker, other, broker, other))] for g in ("g1", "g2")}
        per_group = {g: [x for f in fs for x in f.result()] for g, fs in futs.items()}
    for group, got in per_group.items():
        assert sorted(got) == sorted(expected), group
    d = depth(other.client, q)
    assert d["pending"] == 0 and d["bytes"] == 0, d
    assert d["partitionsPending"] == [], d


def test_auto_ack_and_queue_mode_need_no_ack(broker):
    q = uq()
    c = broker.client
    push(c, q, ["a", "b"])
    msgs = pop(c, q, batch=5, autoAck=True)
    assert [m["payload"] for m in msgs] == ["a", "b"]
    assert pop(c, q, batch=5) == []
    assert depth(c, q)["pending"] == 0
    # a later ack of an auto-acked delivery holds no lease
    assert ack(c, q, [{"id": msgs[0]["id"]}]) == ["unknown"]


def test_ack_outcomes_retry_limit_and_drops(broker):
    q = uq()
    c = broker.client
    configure(c, q, retryLimit=1)
    push(c, q, ["x", "y"])
    first = pop(c, q, batch=2, group="g")
    x, y = first
    assert ack(c, q, [{"id": x["id"], "status": "retry"}, {"id": y["id"]},
                      {"id": y["id"]}, {"id": "garbage"}], group="g") == [
        "redelivered", "acked", "unknown", "unknown"]
    again = pop(c, q, batch=2, group="g")
    assert [(m["payload"], m["attempts"]) for m in again] == [("x", 2)]
    assert again[0]["id"] != x["id"]
    assert ack(c, q, [{"id": "garbage"}], group="g") == ["unknown"]  # alone, too
    # the first delivery's id is fenced off once the message was redelivered
    assert ack(c, q, [{"id": x["id"]}], group="g") == ["unknown"]
    # retryLimit 1: a second failure drops it (settled, counted)
    assert ack(c, q, [{"id": again[0]["id"], "status": "failed",
                       "error": "boom"}], group="g") == ["acked"]
    assert pop(c, q, group="g") == []
    d = depth(c, q)
    assert d["drops"]["retry"] == 1 and d["pending"] == 0, d
    # an ack from before a reset is stale
    push(c, q, ["z"])
    z = pop(c, q, group="g")[0]
    assert c.post(f"{E}/reset", json={"queue": q}).json() == {"queue": q, "dropped": 1}
    assert ack(c, q, [{"id": z["id"]}], group="g") == ["stale"]


def test_a_deliverys_ids_acked_together_answer_each_outcome(broker):
    """The broker sends a delivery's ids as one epoch, delivery and status (eph_ack_v5 spreads
    them): every outcome is the one each id would get alone, not only 'acked'."""
    q = uq()
    c = broker.client
    push(c, q, ["a", "b", "c", "d"])
    first = pop(c, q, batch=4, group="g")
    # the same id twice, and a part of the delivery: the first occurrence acts
    assert ack(c, q, [{"id": first[1]["id"]}, {"id": first[1]["id"]}], group="g") == [
        "acked", "unknown"]
    rest = [first[0], first[2], first[3]]
    assert ack(c, q, [{"id": m["id"], "status": "failed"} for m in rest], group="g") == [
        "redelivered"] * 3
    again = pop(c, q, batch=4, group="g")
    assert [(m["payload"], m["attempts"]) for m in again] == [("a", 2), ("c", 2), ("d", 2)]
    # the older delivery's ids are fenced off, all of them
    assert ack(c, q, [{"id": m["id"]} for m in rest], group="g") == ["unknown"] * 3
    assert c.post(f"{E}/reset", json={"queue": q}).json() == {"queue": q, "dropped": 3}
    assert ack(c, q, [{"id": m["id"]} for m in again], group="g") == ["stale"] * 3


def test_an_expired_lease_redelivers_and_a_parked_pop_wakes_for_it(broker):
    q = uq()
    c = broker.client
    configure(c, q, leaseSeconds=1)
    push(c, q, ["once"])
    m = pop(c, q, group="g")[0]
    t0 = time.monotonic()
    again = pop(c, q, group="g", wait=True, timeout=30000)
    waited = time.monotonic() - t0
    assert [(x["payload"], x["attempts"]) for x in again] == [("once", 2)]
    # woken by the lease expiry hint, not at its 30 s timeout (10 s: room for a loaded machine)
    assert 0.7 < waited < 10, waited
    assert ack(c, q, [{"id": m["id"]}], group="g") == ["unknown"]
    assert ack(c, q, [{"id": again[0]["id"]}], group="g") == ["acked"]


def test_bounds_reject_refuses_whole_pushes_and_drop_oldest_keeps_the_newest(broker):
    c = broker.client
    q = uq()
    configure(c, q, maxLength=3)  # policy reject is the default
    push(c, q, [1, 2, 3])
    body = refused(c.post(f"{E}/push", json={"queue": q, "messages": [{"payload": 4}]}),
                   429, "queue_full")
    assert body["queue"] == q
    assert [m["payload"] for m in pop(c, q, batch=10, autoAck=True)] == [1, 2, 3]
    # a push larger than the queue is refused whatever the policy
    refused(c.post(f"{E}/push", json={"queue": q, "messages": [{"payload": i}
                                                                 for i in range(4)]}),
            429, "queue_full")

    q2 = uq()
    configure(c, q2, maxLength=3, policy="dropOldest")
    push(c, q2, [1, 2, 3])
    push(c, q2, [4, 5])
    d = depth(c, q2)
    assert d["pending"] == 3 and d["drops"]["bounds"] == 2, d
    assert [m["payload"] for m in pop(c, q2, batch=10, autoAck=True)] == [3, 4, 5]

    q3 = uq()
    configure(c, q3, maxBytes=10, policy="dropOldest")
    push(c, q3, ["aaa", "bbb"])  # 5 bytes each as JSON
    push(c, q3, ["ccc"])
    assert [m["payload"] for m in pop(c, q3, batch=10, autoAck=True)] == ["bbb", "ccc"]
    assert depth(c, q3)["drops"]["bounds"] == 1


def test_ttl_drops_messages_that_waited_too_long(broker):
    c = broker.client
    q = uq()
    configure(c, q, ttlSeconds=1)
    push(c, q, ["old"])
    time.sleep(1.1)
    push(c, q, ["new"])
    assert [m["payload"] for m in pop(c, q, batch=10, autoAck=True)] == ["new"]
    assert depth(c, q)["drops"]["ttl"] == 1


def test_a_long_poll_is_woken_by_a_push_and_a_window_fattens_its_batch(broker):
    c = broker.client
    q = uq()
    with cf.ThreadPoolExecutor(1) as ex, httpx.Client(base_url=broker.url, timeout=60) as c2:
        fut = ex.submit(lambda: (pop(c2, q, wait=True, timeout=30000, autoAck=True),
                                 time.monotonic()))
        time.sleep(0.3)
        assert not fut.done()
        push(c, q, ["ping"])
        t_push = time.monotonic()
        msgs, t_answer = fut.result(60)
        assert [m["payload"] for m in msgs] == ["ping"]
        assert t_answer - t_push < 10, t_answer - t_push  # a wake, not the 30 s timeout

    q2 = uq()
    configure(c, q2, windowBuffer={"ms": 1500, "count": 3})
    with cf.ThreadPoolExecutor(1) as ex, httpx.Client(base_url=broker.url, timeout=30) as c2:
        fut = ex.submit(pop, c2, q2, wait=True, timeout=10000, batch=10, autoAck=True)
        time.sleep(0.2)
        push(c, q2, [1])
        time.sleep(0.2)
        push(c, q2, [2, 3])
        assert [m["payload"] for m in fut.result(10)] == [1, 2, 3]
    # a wait with nothing to take answers an empty list at its timeout
    t0 = time.monotonic()
    assert pop(c, uq(), wait=True, timeout=300) == []
    assert 0.05 < time.monotonic() - t0 < 10  # its timeout, not the 30 s default


def test_two_instances_share_queues_push_on_one_pop_on_the_other(broker, other):
    q = uq()
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(lambda: (pop(other.client, q, wait=True, timeout=30000, group="x"),
                                 time.monotonic()))
        time.sleep(0.5)
        assert not fut.done()
        push(broker.client, q, ["across"])
        t_push = time.monotonic()
        msgs, t_answer = fut.result(60)
    assert [m["payload"] for m in msgs] == ["across"]
    assert t_answer - t_push < 10, t_answer - t_push  # a wake, not the 30 s timeout
    # acked through the first instance, gone for both
    assert ack(broker.client, q, [{"id": msgs[0]["id"]}], group="x") == ["acked"]
    assert depth(other.client, q)["pending"] == 0

    async def client_across() -> list[Any]:
        async with Queen([broker.url]) as a, Queen([other.url]) as b:
            await a.ephemeral.push(q, [{"via": "client"}])
            got = await b.ephemeral.pop(q, group="x", wait=True, timeout=2000)
            await a.ephemeral.ack(q, got["messages"], group="x")
            return [m["payload"] for m in got["messages"]]

    assert run(client_across()) == [{"via": "client"}]


def test_the_tables_are_unlogged_and_the_declaration_is_not(db):
    rows = dict(db.execute(
        "SELECT relname, relpersistence FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE nspname = 'queen' AND relname LIKE 'eph\\_%' "
        "AND relkind = 'r'").fetchall())
    assert rows == {"eph_config": "p", "eph_queues": "u", "eph_counts": "u",
                    "eph_partitions": "u", "eph_groups": "u", "eph_cursors": "u",
                    "eph_leases": "u", "eph_chunks": "u"}, rows
    kinds = dict(db.execute("SELECT relname, relpersistence FROM pg_class WHERE relkind = 'S' "
                            "AND relnamespace = 'queen'::regnamespace "
                            "AND relname LIKE 'eph\\_%'").fetchall())
    assert kinds == {"eph_seq": "u"}, kinds


# ------------------------------------------------------------------------ errors and limits
@pytest.mark.parametrize(("path", "body", "status", "code", "field"), [
    ("push", b"{nope", 400, "invalid_request", None),
    ("push", [], 400, "invalid_request", None),
    ("push", {"messages": []}, 400, "invalid_request", "queue"),
    ("push", {"queue": "a/b", "messages": []}, 400, "invalid_name", "queue"),
    ("push", {"queue": "q" * 256, "messages": []}, 413, "name_too_long", "queue"),
    ("push", {"queue": "q", "partition": 5, "messages": []}, 400, "invalid_request",
     "partition"),
    ("push", {"queue": "q", "partition": "p\x01", "messages": []}, 400, "invalid_name",
     "partition"),
    ("push", {"queue": "q"}, 400, "invalid_request", "messages"),
    ("push", {"queue": "q", "messages": [{"data": 1}]}, 400, "invalid_request", "messages"),
    ("push", {"queue": "q", "messages": [{"payload": 1, "transactionId": "t"}]}, 400,
     "invalid_request", "messages"),
    ("push", {"queue": "q", "messages": [{"payload": 1}] * 10_001}, 400, "invalid_request",
     "messages"),
    ("configure", {"queue": "q", "options": {"ttlSecond": 1}}, 400, "invalid_request",
     "options"),
    ("configure", {"queue": "q", "options": []}, 400, "invalid_request", "options"),
    ("configure", {"queue": "q", "extra": 1}, 400, "invalid_request", "extra"),
    ("configure", {"queue": "q", "options": {"policy": "drop"}}, 400, "invalid_request",
     "policy"),
    ("configure", {"queue": "q", "options": {"maxLength": -1}}, 400, "invalid_request",
     "maxLength"),
    ("configure", {"queue": "q", "options": {"maxBytes": (1 << 30) + 1}}, 400,
     "invalid_request", "maxBytes"),
    ("configure", {"queue": "q", "options": {"ttlSeconds": 1.5}}, 400, "invalid_request",
     "ttlSeconds"),
    ("configure", {"queue": "q", "options": {"leaseSeconds": True}}, 400, "invalid_request",
     "leaseSeconds"),
    ("configure", {"queue": "q", "options": {"retryLimit": 1001}}, 400, "invalid_request",
     "retryLimit"),
    ("configure", {"queue": "q", "options": {"windowBuffer": {"ms": 1, "size": 2}}}, 400,
     "invalid_request", "windowBuffer"),
    ("configure", {"queue": "q", "options": {"windowBuffer": {"ms": 60_001}}}, 400,
     "invalid_request", "windowBuffer.ms"),
    ("reset", {}, 400, "invalid_request", "queue"),
    ("ack", {"queue": "q"}, 400, "invalid_request", "acks"),
    ("ack", {"queue": "q", "acks": [{"id": ""}]}, 400, "invalid_request", "acks"),
    ("ack", {"queue": "q", "acks": [{"id": "x", "status": "done"}]}, 400, "invalid_request",
     "acks"),
    ("ack", {"queue": "q", "acks": [{"id": "x" * 65}]}, 400, "invalid_request", "acks"),
    ("ack", {"queue": "q", "group": 3, "acks": []}, 400, "invalid_request", "group"),
    ("ack", {"queue": "q", "acks": [{"id": "x"}] * 10_001}, 400, "invalid_request", "acks"),
])
def test_bad_bodies_are_refused_and_name_the_problem(broker, path, body, status, code, field):
    content = body if isinstance(body, bytes) else httpx.Request(
        "POST", "http://x", json=body).content
    r = broker.client.post(f"{E}/{path}", content=content,
                           headers={"content-type": "application/json"})
    refused(r, status, code, field)


@pytest.mark.parametrize(("params", "code", "field"), [
    ({}, "invalid_request", "queue"),
    ({"queue": "a/b"}, "invalid_name", "queue"),
    ({"queue": "q", "batch": "0"}, "invalid_request", "batch"),
    ({"queue": "q", "batch": "10001"}, "invalid_request", "batch"),
    ({"queue": "q", "batch": "many"}, "invalid_request", "batch"),
    ({"queue": "q", "timeout": "300001", "wait": "true"}, "invalid_request", "timeout"),
    ({"queue": "q", "wait": "maybe"}, "invalid_request", "wait"),
    ({"queue": "q", "autoAck": "yes"}, "invalid_request", "autoAck"),
    ({"queue": "q", "group": "g\x02"}, "invalid_name", "group"),
])
def test_bad_pop_parameters_are_refused(broker, params, code, field):
    refused(broker.client.get(f"{E}/pop", params=params), 400, code, field)


def test_limits_of_routes_bodies_and_misses(broker):
    c = broker.client
    refused(c.get(f"{E}/queues/{uq()}/depth"), 404, "ephemeral_queue_not_found")
    refused(c.get(f"{E}/nothing"), 404, "not_found")
    refused(c.get(f"{E}/queues/a%01b/depth"), 400, "invalid_name")
    refused(c.delete(f"{E}/queue/a%01b"), 400, "invalid_name")
    big = b'{"queue":"q","messages":[{"payload":"' + b"x" * (65 << 20) + b'"}]}'
    refused(c.post(f"{E}/push", content=big, headers={"content-type": "application/json"}),
            413, "body_too_large")
    assert c.post(f"{E}/ack", json={"queue": uq(), "acks": []}).json() == {"results": []}

    async def old_style(eph: Any) -> str:
        try:
            await eph._call("GET", f"{E}/nothing")
        except EphemeralError as ex:
            return str(ex.code)
        return "no error"

    # any other 404 of the family is the client's 'unsupported' verdict, as it should be
    assert run(with_client(broker, old_style)) == "ephemeral_unsupported"


def test_roles_and_tenants(db_dsn, tmp_path_factory):
    b = start_auth_broker(tmp_path_factory.mktemp("eph-auth"), db_dsn)
    try:
        q = uq()
        rw_a = bearer(token("read-write", tenant="eph-a"))
        ro_a = bearer(token("read-only", tenant="eph-a"))
        admin_a = bearer(token("admin", tenant="eph-a"))
        rw_b = bearer(token("read-write", tenant="eph-b"))
        c = b.client
        assert c.post(f"{E}/push", headers=rw_a, json={"queue": q, "messages": [
            {"payload": "mine"}]}).status_code == 201
        refused(c.post(f"{E}/push", headers=ro_a, json={"queue": q, "messages": []}),
                403, "forbidden")
        # a pop consumes: read-only may not, though it is a GET
        refused(c.get(f"{E}/pop", headers=ro_a, params={"queue": q}), 403, "forbidden")
        assert c.get(f"{E}/queues/{q}/depth", headers=ro_a).json()["pending"] == 1
        # the other tenant's queue of the same name is another queue
        refused(c.get(f"{E}/queues/{q}/depth", headers=rw_b), 404,
                "ephemeral_queue_not_found")
        assert c.get(f"{E}/pop", headers=rw_b, params={"queue": q}).json()["messages"] == []
        # that pop created b's own (empty) queue; a's still holds its message
        listed = {x["queue"]: x for x in c.get(f"{E}/queues", headers=rw_b).json()["queues"]}
        assert listed[q]["depth"] == 0
        assert c.get(f"{E}/queues/{q}/depth", headers=ro_a).json()["pending"] == 1
        # deleting a queue is admin, as for durable queues
        refused(c.delete(f"{E}/queue/{q}", headers=rw_a), 403, "forbidden")
        got = c.get(f"{E}/pop", headers=rw_a, params={"queue": q, "autoAck": "true"}).json()
        assert [m["payload"] for m in got["messages"]] == ["mine"]
        assert c.delete(f"{E}/queue/{q}", headers=admin_a).json()["deleted"] is True
        refused(c.get(f"{E}/queues", headers={}), 401, "unauthorized")
    finally:
        assert b.stop() == 0, b.log()[-4000:]


def test_the_rows_stay_together(broker, db_dsn):
    """After every test above: no chunk, lease or cursor outlives its queue row, a chunk's live
    count is what its gone set leaves, no chunk is kept empty, and the counters are the sums
    of what is stored."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        orphans = conn.execute(
            "SELECT (SELECT count(*) FROM queen.eph_chunks k WHERE NOT EXISTS "
            "  (SELECT 1 FROM queen.eph_partitions p JOIN queen.eph_queues q "
            "     ON q.tenant = p.tenant AND q.queue = p.queue WHERE p.id = k.pid))"
            " + (SELECT count(*) FROM queen.eph_leases l WHERE NOT EXISTS "
            "  (SELECT 1 FROM queen.eph_queues q WHERE q.tenant = l.tenant AND q.queue = l.queue))"
            " + (SELECT count(*) FROM queen.eph_cursors c WHERE NOT EXISTS "
            "  (SELECT 1 FROM queen.eph_queues q WHERE q.tenant = c.tenant AND q.queue = c.queue))"
        ).fetchone()
        assert orphans == (0,)
        chunks = conn.execute(
            "SELECT count(*) FILTER (WHERE live <> cardinality(offs) - 1 - queen.eph_width_v1(gone)"
            "                           OR live <= 0 OR base % 256 <> 0) "
            "FROM queen.eph_chunks").fetchone()
        assert chunks == (0,)
        # schema 015: message i of a chunk is bytes offs[i] - offs[1] .. offs[i + 1] - offs[1]
        # - 2 of its body, a separator (0x1e) between two
        offsets = conn.execute(
            "SELECT count(*) FROM queen.eph_chunks k "
            "WHERE octet_length(k.body) <> k.offs[cardinality(k.offs)] - k.offs[1] - 1 "
            "   OR EXISTS (SELECT 1 FROM generate_series(2, cardinality(k.offs) - 1) AS i "
            "               WHERE k.offs[i] <= k.offs[i - 1] "
            "                  OR get_byte(k.body, k.offs[i] - k.offs[1] - 1) <> 30)"
        ).fetchone()
        assert offsets == (0,)
        wrong = conn.execute(
            "SELECT q.queue, n.depth, n.bytes, s.depth, s.bytes FROM queen.eph_queues q "
            "CROSS JOIN LATERAL (SELECT coalesce(sum(c.depth), 0) AS depth, "
            "  coalesce(sum(c.bytes), 0) AS bytes FROM queen.eph_counts c "
            "  WHERE c.tenant = q.tenant AND c.queue = q.queue) n "
            "CROSS JOIN LATERAL (SELECT count(*) AS depth, coalesce(sum(u.o1 - u.o0 - 1), 0) "
            "  AS bytes FROM queen.eph_partitions p JOIN queen.eph_chunks k ON k.pid = p.id "
            "  CROSS JOIN LATERAL unnest(k.offs[1:cardinality(k.offs) - 1], k.offs[2:]) "
            "    WITH ORDINALITY AS u(o0, o1, i) "
            "  WHERE p.tenant = q.tenant AND p.queue = q.queue "
            "    AND NOT k.gone @> (u.i - 1)::int4) s "
            "WHERE n.depth <> s.depth OR n.bytes <> s.bytes").fetchall()
        assert wrong == []
