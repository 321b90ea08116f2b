"""Issue 27 item 1: the Streams routes (``/streams/v1/queries``, ``/state/get``, ``/cycle``)
driven by the published client's Stream DSL (queen-mq 2.6, ``queen.streams``) against a real
broker, plus raw HTTP for the cycle's atomicity and repeat rules and for every refusal.

Operators covered here: map, filter, flat_map, key_by, tumbling window with aggregate (count)
and reduce, to(queue) and foreach; the cycle's repeat after a lost answer; a consumer killed
mid-stream (tests/integration/test_streams_operators.py has the other operators).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest
from queen import Queen, Stream
from queen.streams.runtime.register import StreamsConfigHashMismatch

from tests.integration.test_push_json import uq

QUERIES, STATE, CYCLE = "/streams/v1/queries", "/streams/v1/state/get", "/streams/v1/cycle"


# ---------------------------------------------------------------------------------- helpers
def push(client: httpx.Client, queue: str, partition: str, payloads: list[Any],
         txns: list[str] | None = None) -> None:
    items = [{"queue": queue, "partition": partition, "payload": p,
              **({"transactionId": txns[i]} if txns else {})} for i, p in enumerate(payloads)]
    r = client.post("/api/v1/push", json={"items": items})
    assert r.status_code == 201, r.text
    assert {x["status"] for x in r.json()} == {"queued"}, r.text


def drain(client: httpx.Client, queue: str, group: str = "check") -> list[dict]:
    """Every message of ``queue`` not yet seen by ``group`` (autoAck pops)."""
    out: list[dict] = []
    while True:
        r = client.get(f"/api/v1/pop/queue/{queue}",
                       params={"consumerGroup": group, "batch": 1000, "autoAck": "true",
                               "partitions": 100})
        assert r.status_code in (200, 204), r.text
        if r.status_code == 204 or not r.json()["messages"]:
            return out
        out.extend(r.json()["messages"])


def stored(db: psycopg.Connection, queue: str) -> int:
    row = db.execute(
        "SELECT COALESCE(sum(lp.last_offset), 0) FROM queen.log_partitions lp"
        " JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s", (queue,)).fetchone()
    return int(row[0]) if row else 0


def cursor(db: psycopg.Connection, queue: str, group: str) -> int:
    row = db.execute(
        "SELECT COALESCE(sum(c.committed_offset), 0) FROM queen.log_consumers c"
        " JOIN queen.log_partitions lp ON lp.id = c.partition_id"
        " JOIN queen.queues q ON q.id = lp.queue_id"
        " WHERE q.name = %s AND c.consumer_group = %s", (queue, group)).fetchone()
    return int(row[0]) if row else 0


def state_rows(db: psycopg.Connection, query: str) -> dict[str, Any]:
    return {k: v for k, v in db.execute(
        "SELECT s.key, s.value FROM queen.stream_state s JOIN queen.stream_queries q"
        " ON q.id = s.query_id WHERE q.name = %s", (query,))}


async def until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def run_stream(broker: Any, build: Callable[[Queen], Stream], query: str,
               done: Callable[[], bool], timeout: float = 20.0,
               client: dict[str, Any] | None = None, **opts: Any) -> dict:
    """Run the stream until ``done()``, then stop it; its metrics. ``client``: options of the
    Queen client whose queue builders the stream pops with (``framed_pop``...)."""
    async def go() -> dict:
        async with Queen(broker.url, **(client or {})) as q:
            runner = await build(q).run(query_id=query, url=broker.url,
                                        **{"max_wait_millis": 200, **opts})
            try:
                await until(f"stream {query}", done, timeout)
            finally:
                await runner.stop()
            return runner.metrics()
    return asyncio.run(go())


def register(client: httpx.Client, name: str, source: str, config_hash: str = "h1",
             **extra: Any) -> dict:
    r = client.post(QUERIES, json={"name": name, "source_queue": source,
                                   "config_hash": config_hash, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def pop(client: httpx.Client, queue: str, group: str, batch: int = 10) -> dict:
    r = client.get(f"/api/v1/pop/queue/{queue}",
                   params={"consumerGroup": group, "batch": batch})
    assert r.status_code == 200, r.text
    return r.json()


def cycle_body(query_id: str, msgs: list[dict], group: str, **extra: Any) -> dict:
    last = msgs[-1]
    return {"query_id": query_id, "partition_id": last["partitionId"], "consumer_group": group,
            "ack": {"transactionId": last["transactionId"], "leaseId": last["leaseId"],
                    "status": "completed", "count": len(msgs)}, **extra}


# ------------------------------------------------------------------- the DSL, end to end
@pytest.mark.parametrize("client", [{}, {"framed_pop": True}], ids=["json", "framed"])
def test_map_filter_to_a_sink_through_the_dsl(broker, db, client):
    src, sink, query = uq("ss"), uq("sk"), uq("q")
    push(broker.client, src, "p1", [{"n": n} for n in range(20)])
    push(broker.client, src, "p2", [{"n": n} for n in range(20, 30)])

    metrics = run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .filter(lambda m: m["data"]["n"] % 2 == 0)
        .map(lambda m: {"doubled": m["data"]["n"] * 2})
        .to(q.queue(sink)),
        query, lambda: cursor(db, src, f"streams.{query}") == 30, client=client)
    assert metrics["errorsTotal"] == 0, metrics
    out = drain(broker.client, sink)
    assert sorted(m["data"]["doubled"] for m in out) == [n * 2 for n in range(0, 30, 2)]
    # the sink keeps the source partition's name
    assert {m["partition"] for m in out} == {"p1", "p2"}
    assert stored(db, sink) == 15


def test_tumbling_window_count_counts_every_message_once(broker, db):
    src, sink, query = uq("ss"), uq("sk"), uq("q")
    push(broker.client, src, "p1", [{"n": n} for n in range(40)])

    run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .window_tumbling(seconds=1, idle_flush_ms=200)
        .aggregate({"count": lambda m: 1, "sum": lambda m: m["n"]})
        .to(q.queue(sink)),
        query,
        lambda: cursor(db, src, f"streams.{query}") == 40 and not state_rows(db, query),
        batch_size=7)
    out = drain(broker.client, sink)
    assert sum(m["data"]["count"] for m in out) == 40
    assert sum(m["data"]["sum"] for m in out) == sum(range(40))
    assert not state_rows(db, query)  # every window was emitted and deleted


def test_key_by_reduce_and_foreach(broker, db):
    src, query = uq("ss"), uq("q")
    push(broker.client, src, "p1", [{"user": f"u{n % 3}", "v": n, "ts": 1000 + n}
                                    for n in range(30)] + [{"user": "zz", "v": 0, "ts": 500_000}])
    seen: list[tuple[str, Any]] = []

    run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .flat_map(lambda m: [m["data"], m["data"]] if m["data"]["v"] % 10 == 0 else [m["data"]])
        .key_by(lambda m: m["data"]["user"])
        .window_tumbling(seconds=60, event_time=lambda m: m["data"]["ts"], idle_flush_ms=200)
        .reduce(lambda acc, v: acc + v["v"], 0)
        .foreach(lambda value, ctx: seen.append((ctx["key"], value))),
        query, lambda: cursor(db, src, f"streams.{query}") == 31 and len(seen) == 3)
    # each user's window sum (v = 0, 10, 20 counted twice by the flat_map), once
    expect = {f"u{u}": sum(n for n in range(30) if n % 3 == u) for u in range(3)}
    for n in (0, 10, 20):
        expect[f"u{n % 3}"] += n
    assert sorted(seen) == sorted(expect.items())
    # the closing event's window is still open; the watermark is kept
    assert {k.split("\x1f")[-1] for k in state_rows(db, query)} == {"zz", "__wm__"}


def test_registration_is_idempotent_and_guards_the_config_hash(broker):
    c, src, name = broker.client, uq("ss"), uq("q")
    first = register(c, name, src, "hash-a")
    assert first["success"] is True and first["fresh"] is True and first["reset"] is False
    assert uuid.UUID(first["query_id"]) and first["name"] == name
    again = register(c, name, src, "hash-a")
    assert again["query_id"] == first["query_id"] and again["fresh"] is False

    r = c.post(QUERIES, json={"name": name, "source_queue": src, "config_hash": "hash-b"})
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "conflict" and body["success"] is False
    assert "config_hash mismatch" in body["error"] and body["query_id"] == first["query_id"]

    # state written under hash-a ...
    push(c, src, "p1", [1])
    pid = pop(c, src, "g")["partitionId"]
    r = c.post(CYCLE, json={"query_id": first["query_id"], "partition_id": pid,
                            "state_ops": [{"type": "upsert", "key": "old", "value": 1}]})
    assert r.json()["success"] is True
    got = c.post(STATE, json={"query_id": first["query_id"], "partition_id": pid})
    assert [x["key"] for x in got.json()["rows"]] == ["old"]
    # ... is wiped by the reset that takes hash-b
    reset = register(c, name, src, "hash-b", reset=True)
    assert reset["reset"] is True and reset["query_id"] == first["query_id"]
    got = c.post(STATE, json={"query_id": first["query_id"], "partition_id": pid})
    assert got.json()["rows"] == []
    assert register(c, name, src, "hash-b")["reset"] is False


def test_a_changed_chain_is_refused_through_the_dsl(broker):
    src, query = uq("ss"), uq("q")
    register(broker.client, query, src, "not-the-chain-hash")

    async def go() -> None:
        async with Queen(broker.url) as q:
            await Stream.from_(q.queue(src)).map(lambda m: m).run(query_id=query,
                                                                   url=broker.url)
    with pytest.raises(StreamsConfigHashMismatch, match="reset=True"):
        asyncio.run(go())


# ------------------------------------------------------------ the cycle over raw HTTP
def test_cycle_commits_state_push_and_ack_together(broker, db):
    c, src, sink, group = broker.client, uq("ss"), uq("sk"), "streams.raw"
    qid = register(c, uq("q"), src)["query_id"]
    push(c, src, "p1", [{"n": n} for n in range(3)])
    msgs = pop(c, src, group)["messages"]
    assert len(msgs) == 3
    body = cycle_body(qid, msgs, group,
                      state_ops=[{"type": "upsert", "key": "k1", "value": {"acc": 3}},
                                 {"type": "upsert", "key": "k2", "value": 1},
                                 {"type": "delete", "key": "k2"}],
                      push_items=[{"queue": sink, "partition": "out", "payload": {"total": 3}}])
    r = c.post(CYCLE, json=body)
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["success"] is True and res["repeat"] is False
    assert res["state_ops_applied"] == 3 and res["query_id"] == qid
    assert res["ack_result"] == {"success": True, "count": 3, "lease_released": True,
                                 "dlq": False}
    [pushed] = res["push_results"]
    assert pushed["queue"] == sink and pushed["partition"] == "out" and pushed["offset"] == 1
    assert cursor(db, src, group) == 3 and stored(db, sink) == 1

    got = c.post(STATE, json={"query_id": qid, "partition_id": msgs[0]["partitionId"],
                              "keys": []}).json()
    assert got["success"] is True and [(x["key"], x["value"]) for x in got["rows"]] == [
        ("k1", {"acc": 3})]
    only = c.post(STATE, json={"query_id": qid, "partition_id": msgs[0]["partitionId"],
                               "keys": ["nope", "k1"]}).json()
    assert [x["key"] for x in only["rows"]] == ["k1"]


def test_a_repeated_cycle_answers_and_applies_nothing(broker, db):
    """The client retries a cycle whose answer it lost (503 outcome_unknown, a dropped
    connection): the repeat must not push, ack or change state a second time, even after
    another consumer moved the partition on."""
    c, src, sink, group = broker.client, uq("ss"), uq("sk"), "streams.rep"
    qid = register(c, uq("q"), src)["query_id"]
    push(c, src, "p1", [{"n": n} for n in range(4)])
    first = pop(c, src, group, batch=2)["messages"]
    body = cycle_body(qid, first, group,
                      state_ops=[{"type": "upsert", "key": "count", "value": 2}],
                      push_items=[{"queue": sink, "payload": {"seen": 2}}])
    assert c.post(CYCLE, json=body).json()["repeat"] is False
    again = c.post(CYCLE, json=body).json()
    assert again["success"] is True and again["repeat"] is True
    assert again["state_ops_applied"] == 0 and again["push_results"] == []
    assert stored(db, sink) == 1 and cursor(db, src, group) == 2

    # the next batch is committed by "another consumer"; the old cycle, sent once more,
    # still answers as the repeat it is and leaves the new state alone
    second = pop(c, src, group, batch=2)["messages"]
    assert c.post(CYCLE, json=cycle_body(qid, second, group, state_ops=[
        {"type": "upsert", "key": "count", "value": 4}])).json()["success"] is True
    late = c.post(CYCLE, json=body).json()
    assert late["repeat"] is True
    got = c.post(STATE, json={"query_id": qid, "partition_id": first[0]["partitionId"]}).json()
    assert got["rows"][0]["value"] == 4
    assert stored(db, sink) == 1 and cursor(db, src, group) == 4


def test_a_flush_cycle_repeat_is_recognised_by_its_deletes(broker, db):
    c, src, sink, group = broker.client, uq("ss"), uq("sk"), "streams.flush"
    qid = register(c, uq("q"), src)["query_id"]
    push(c, src, "p1", [{"n": 1}])
    msgs = pop(c, src, group)["messages"]
    pid = msgs[0]["partitionId"]
    c.post(CYCLE, json=cycle_body(qid, msgs, group, state_ops=[
        {"type": "upsert", "key": "w1", "value": {"acc": 1, "windowEnd": 1000}},
        {"type": "upsert", "key": "w2", "value": {"acc": 2, "windowEnd": 2000}}]))
    ripe = c.post(STATE, json={"query_id": qid, "partition_id": pid, "key_prefix": "w",
                               "ripe_at_or_before": 1500}).json()
    assert [x["key"] for x in ripe["rows"]] == ["w1"]

    flush = {"query_id": qid, "partition_id": pid, "consumer_group": group, "ack": None,
             "state_ops": [{"type": "delete", "key": "w1"}],
             "push_items": [{"queue": sink, "payload": {"acc": 1}}]}
    # right after a leased cycle a flush waits (it may have read the state before it)
    assert c.post(CYCLE, json=flush).json()["deferred"] is True and stored(db, sink) == 0
    quiet(db, qid)
    applied = c.post(CYCLE, json=flush).json()
    assert applied["repeat"] is False and "deferred" not in applied
    repeat = c.post(CYCLE, json=flush).json()
    assert repeat["success"] is True and repeat["repeat"] is True
    assert stored(db, sink) == 1
    # a flush whose keys are partly gone was raced by another flusher: refused whole
    racing = {**flush, "state_ops": [{"type": "delete", "key": "w1"},
                                     {"type": "delete", "key": "w2"}]}
    refused = c.post(CYCLE, json=racing).json()
    assert refused["success"] is False and refused["reason"] == "state_changed"
    assert stored(db, sink) == 1 and "w2" in state_rows_by_id(db, qid)


def test_a_flush_waits_while_the_partition_is_leased(broker, db):
    """Two runners of one query: one flushes a partition the other holds. The holder's cycle
    read the window and will write it; the flush is deferred until the lease is gone, so
    the window is emitted once."""
    c, src, sink, group = broker.client, uq("ss"), uq("sk"), "streams.two"
    qid = register(c, uq("q"), src)["query_id"]
    push(c, src, "p1", [{"n": 1}])
    first = pop(c, src, group)["messages"]
    pid = first[0]["partitionId"]
    c.post(CYCLE, json=cycle_body(qid, first, group, state_ops=[
        {"type": "upsert", "key": "w", "value": {"acc": 1, "windowEnd": 1000}}]))
    push(c, src, "p1", [{"n": 2}])
    held = pop(c, src, group)["messages"]  # the other runner now holds the partition
    flush = {"query_id": qid, "partition_id": pid, "consumer_group": group,
             "state_ops": [{"type": "delete", "key": "w"}],
             "push_items": [{"queue": sink, "payload": {"acc": 1}}]}
    deferred = c.post(CYCLE, json=flush).json()
    assert deferred["success"] is True and deferred["deferred"] is True
    assert deferred["state_ops_applied"] == 0 and stored(db, sink) == 0
    # the holder closes the window itself (acc 1 + its message) and releases the lease
    c.post(CYCLE, json=cycle_body(qid, held, group, state_ops=[{"type": "delete", "key": "w"}],
                                  push_items=[{"queue": sink, "payload": {"acc": 2}}]))
    quiet(db, qid)
    again = c.post(CYCLE, json=flush).json()
    assert again["repeat"] is True  # its window is gone: nothing emitted twice
    assert [m["data"] for m in drain(c, sink)] == [{"acc": 2}]


def quiet(db: psycopg.Connection, qid: str) -> None:
    """As if the query's leased cycles had committed 3 s ago: past the 2 s a flush waits."""
    db.execute("UPDATE queen.stream_cycles SET committed_at = committed_at - interval '3 s'"
               " WHERE query_id = %s", (qid,))


def state_rows_by_id(db: psycopg.Connection, qid: str) -> dict[str, Any]:
    return {k: v for k, v in db.execute(
        "SELECT key, value FROM queen.stream_state WHERE query_id = %s", (qid,))}


def test_a_lost_lease_refuses_the_whole_cycle(broker, db):
    c, src, sink, group = broker.client, uq("ss"), uq("sk"), "streams.lost"
    qid = register(c, uq("q"), src)["query_id"]
    push(c, src, "p1", [{"n": 1}, {"n": 2}])
    # no retryDelay: the expired lease's batch is claimable at once (api.md 4)
    db.execute("UPDATE queen.queues SET lease_time = 1, retry_delay = 0 WHERE name = %s",
               (src,))
    msgs = pop(c, src, group)["messages"]
    time.sleep(1.2)
    body = cycle_body(qid, msgs, group, state_ops=[{"type": "upsert", "key": "k", "value": 1}],
                      push_items=[{"queue": sink, "payload": 1}])
    res = c.post(CYCLE, json=body).json()
    assert res["success"] is False and res["reason"] == "lease_lost", res
    assert stored(db, sink) == 0 and cursor(db, src, group) == 0
    assert state_rows_by_id(db, qid) == {}
    # redelivered under a new lease, the same work commits
    again = pop(c, src, group)["messages"]
    assert [m["transactionId"] for m in again] == [m["transactionId"] for m in msgs]
    assert c.post(CYCLE, json=cycle_body(qid, again, group)).json()["success"] is True
    assert cursor(db, src, group) == 2


def test_a_partial_ack_keeps_the_lease(broker, db):
    c, src, group = broker.client, uq("ss"), "streams.part"
    qid = register(c, uq("q"), src)["query_id"]
    push(c, src, "p1", [{"n": n} for n in range(3)])
    msgs = pop(c, src, group)["messages"]
    res = c.post(CYCLE, json={**cycle_body(qid, msgs[:2], group), "release_lease": False})
    assert res.json()["ack_result"]["lease_released"] is False
    assert cursor(db, src, group) == 2
    live = db.execute(
        "SELECT count(*) FROM queen.log_consumers WHERE lease_id = %s AND lease_expires_at"
        " > now()", (msgs[0]["leaseId"],)).fetchone()
    assert live == (1,)
    # the rest of the batch under the same lease is another cycle, not a repeat
    rest = c.post(CYCLE, json=cycle_body(qid, msgs, group)).json()
    assert rest["success"] is True and rest["repeat"] is False
    assert rest["ack_result"]["lease_released"] is True and cursor(db, src, group) == 3


# ---------------------------------------------------------------- refusals (4xx) change nothing
@pytest.mark.parametrize(("path", "body", "status", "field"), [
    (QUERIES, {"source_queue": "x", "config_hash": "h"}, 400, "name"),
    (QUERIES, {"name": "n", "config_hash": "h"}, 400, "source_queue"),
    (QUERIES, {"name": "n", "source_queue": "x"}, 400, "config_hash"),
    (QUERIES, {"name": "n", "source_queue": "a/b", "config_hash": "h"}, 400, "queue"),
    (QUERIES, {"name": "n" * 256, "source_queue": "x", "config_hash": "h"}, 413, "name"),
    (QUERIES, {"name": "n", "source_queue": "x", "config_hash": "h", "reset": "yes"}, 400,
     "reset"),
    (STATE, {"partition_id": "1"}, 400, "query_id"),
    (STATE, {"query_id": "not-a-uuid", "partition_id": "1"}, 400, "query_id"),
    (STATE, {"query_id": str(uuid.uuid4())}, 400, "partition_id"),
    (STATE, {"query_id": str(uuid.uuid4()), "partition_id": "x"}, 400, "partition_id"),
    (STATE, {"query_id": str(uuid.uuid4()), "partition_id": "1", "keys": "k"}, 400, "keys"),
    (STATE, {"query_id": str(uuid.uuid4()), "partition_id": "1", "keys": ["k" * 1025]}, 413,
     "keys"),
    (STATE, {"query_id": str(uuid.uuid4()), "partition_id": "1", "keys": ["k"] * 10_001}, 400,
     "keys"),
    (STATE, {"query_id": str(uuid.uuid4()), "partition_id": "1", "ripe_at_or_before": "1"},
     400, "ripe_at_or_before"),
    (CYCLE, {"query_id": str(uuid.uuid4()), "partition_id": "1", "state_ops": {}}, 400,
     "state_ops"),
    (CYCLE, {"query_id": str(uuid.uuid4()), "partition_id": "1",
             "state_ops": [{"type": "put", "key": "k"}]}, 400, "type"),
    (CYCLE, {"query_id": str(uuid.uuid4()), "partition_id": "1",
             "state_ops": [{"type": "delete"}]}, 400, "key"),
    (CYCLE, {"query_id": str(uuid.uuid4()), "partition_id": "1",
             "push_items": [{"queue": "", "payload": 1}]}, 400, "queue"),
    (CYCLE, {"query_id": str(uuid.uuid4()), "partition_id": "1",
             "ack": {"transactionId": "t"}}, 400, "leaseId"),
    (CYCLE, {"query_id": str(uuid.uuid4()), "partition_id": "1",
             "ack": {"transactionId": "t", "leaseId": str(uuid.uuid4()), "status": "failed"}},
     400, "status"),
    (CYCLE, {"query_id": str(uuid.uuid4()), "partition_id": "1", "release_lease": 1}, 400,
     "release_lease"),
])
def test_bad_bodies_are_refused_naming_the_field(broker, path, body, status, field):
    r = broker.client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["field"] == field and err["error"] and err["code"]


@pytest.mark.parametrize("path", [QUERIES, STATE, CYCLE])
def test_malformed_json_is_a_400(broker, path):
    r = broker.client.post(path, content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    r = broker.client.post(path, json=[1])
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"


def test_unknown_queries_and_partitions_are_404(broker, db):
    c, src = broker.client, uq("ss")
    push(c, src, "p1", [1])
    pid = pop(c, src, "g")["partitionId"]
    unknown = str(uuid.uuid4())
    r = c.post(STATE, json={"query_id": unknown, "partition_id": pid})
    assert r.status_code == 404 and r.json()["field"] == "query_id"
    r = c.post(CYCLE, json={"query_id": unknown, "partition_id": pid,
                            "state_ops": [{"type": "upsert", "key": "k", "value": 1}]})
    assert r.status_code == 404 and r.json()["reason"] == "unknown_query"
    qid = register(c, uq("q"), uq("other"))["query_id"]
    r = c.post(CYCLE, json={"query_id": qid, "partition_id": pid,
                            "state_ops": [{"type": "upsert", "key": "k", "value": 1}]})
    assert r.status_code == 404 and r.json()["reason"] == "unknown_partition"
    assert state_rows_by_id(db, qid) == {}


def test_push_maintenance_refuses_cycles(broker, db):
    c, src = broker.client, uq("ss")
    qid = register(c, uq("q"), src)["query_id"]
    push(c, src, "p1", [1])
    pid = pop(c, src, "g")["partitionId"]
    assert c.post("/api/v1/system/maintenance", json={"enabled": True}).status_code == 200
    try:
        r = c.post(CYCLE, json={"query_id": qid, "partition_id": pid,
                                "state_ops": [{"type": "upsert", "key": "k", "value": 1}]})
        assert r.status_code == 503 and r.json()["code"] == "maintenance"
    finally:
        assert c.post("/api/v1/system/maintenance",
                      json={"enabled": False}).status_code == 200
    assert state_rows_by_id(db, qid) == {}



# ----------------------------------------------------- recovery: nothing twice, nothing lost
_CONSUMER = """
import asyncio, sys, time
from queen import Queen, Stream

async def main(url, src, sink, query):
    async with Queen(url) as q:
        def slow(m):
            if m["partition"] == "p1" and m["data"]["n"] == 150:
                print("stuck", flush=True)  # inside a cycle: popped, leased, not committed
                time.sleep(3600)
            return m
        await (Stream.from_(q.queue(src)).map(slow)
               .window_tumbling(seconds=1, idle_flush_ms=200)
               .aggregate({"count": lambda m: 1})
               .to(q.queue(sink))
               .run(query_id=query, url=url, batch_size=25, max_wait_millis=200))
        print("running", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


def window_count_stream(q: Queen, src: str, sink: str) -> Stream:
    return (Stream.from_(q.queue(src)).map(lambda m: m)
            .window_tumbling(seconds=1, idle_flush_ms=200)
            .aggregate({"count": lambda m: 1})
            .to(q.queue(sink)))


def test_a_consumer_killed_mid_cycle_loses_and_repeats_nothing(broker, db):
    import select
    import signal
    import subprocess
    import sys

    c, src, sink, query = broker.client, uq("ss"), uq("sk"), uq("q")
    group = f"streams.{query}"
    r = c.post("/api/v1/configure", json={"queue": src, "options": {"leaseTime": 2}})
    assert r.status_code == 200, r.text
    n = 400
    for part in ("p1", "p2"):
        push(c, src, part, [{"n": i} for i in range(n // 2)])
    proc = subprocess.Popen([sys.executable, "-c", _CONSUMER, broker.url, src, sink, query],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline() == b"running\n"
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline() == b"stuck\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done_before = cursor(db, src, group)
    assert 0 < done_before < n
    held = db.execute("SELECT count(*) FROM queen.log_consumers WHERE consumer_group = %s"
                      " AND lease_id IS NOT NULL AND lease_expires_at > now()",
                      (group,)).fetchone()
    assert held is not None and held[0] >= 1  # it died holding a batch it had not committed

    run_stream(broker, lambda q: window_count_stream(q, src, sink), query,
               lambda: cursor(db, src, group) == n and not state_rows(db, query),
               batch_size=25)
    counts = [m["data"]["count"] for m in drain(c, sink)]
    assert sum(counts) == n, (sum(counts), counts)


def test_two_runners_of_one_query_count_every_message_once(broker, db):
    """Two runners share the partitions of one query (the consumer group balances them) and
    each flushes the windows of every partition it touched: the counts stay exact."""
    c, src, sink, query = broker.client, uq("ss"), uq("sk"), uq("q")
    group = f"streams.{query}"
    for part in ("p1", "p2", "p3", "p4"):
        push(c, src, part, [{"n": i} for i in range(50)])

    async def go() -> list[dict]:
        async with Queen(broker.url) as q:
            runners = [await window_count_stream(q, src, sink).run(
                query_id=query, url=broker.url, batch_size=10, max_partitions=2,
                max_wait_millis=100) for _ in range(2)]
            try:
                await until("both runners", lambda: cursor(db, src, group) == 200
                            and not state_rows(db, query))
            finally:
                for r in runners:
                    await r.stop()
            return [r.metrics() for r in runners]

    metrics = asyncio.run(go())
    assert all(m["cyclesTotal"] > 0 for m in metrics), metrics  # both took part
    out = drain(c, sink)
    per: dict[str, int] = {}
    for m in out:
        per[m["partition"]] = per.get(m["partition"], 0) + m["data"]["count"]
    assert sum(m["data"]["count"] for m in out) == 200, (per, metrics)


def test_the_dsl_retries_a_cycle_whose_answer_was_lost(broker, db, monkeypatch):
    """Every first attempt of a cycle commits but its answer is lost (as with 503
    outcome_unknown or a dropped connection); the SDK retries, the broker answers the repeat,
    and the count stays exact."""
    c, src, sink, query = broker.client, uq("ss"), uq("sk"), uq("q")
    push(c, src, "p1", [{"n": i} for i in range(60)])
    original = httpx.AsyncClient.post
    lost: list[Any] = []  # the bodies whose first answer was lost (the SDK resends the object)
    repeats: list[bool] = []

    async def post(self: httpx.AsyncClient, url: Any, *args: Any, **kwargs: Any
                   ) -> httpx.Response:
        resp = await original(self, url, *args, **kwargs)
        if str(url).endswith(CYCLE):
            # NOTE(streams): by identity: two flushes of a window that filled up again can
            # carry equal bodies, and the second is a new cycle, not a repeat
            body = kwargs.get("json")
            if any(b is body for b in lost):
                repeats.append(resp.json().get("repeat"))
            elif resp.json().get("success") and not resp.json().get("deferred"):
                lost.append(body)  # committed: lose its answer
                raise httpx.ReadError("answer lost after the commit")
        return resp

    monkeypatch.setattr(httpx.AsyncClient, "post", post)
    run_stream(broker, lambda q: window_count_stream(q, src, sink), query,
               lambda: cursor(db, src, f"streams.{query}") == 60 and not state_rows(db, query),
               batch_size=10)
    monkeypatch.undo()
    assert lost and repeats and all(repeats), (len(lost), repeats)
    assert sum(m["data"]["count"] for m in drain(c, sink)) == 60
