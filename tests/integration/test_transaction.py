"""Issue 6: POST /api/v1/transaction, one PostgreSQL transaction for pushes, acks, required
leases, KV and timer ops (api.md 2.5, 3.6), over real HTTP against a real broker."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import uuid

from queen import Queen

from tests.integration.test_push_json import uq

TXN = "/api/v1/transaction"


def push(broker, queue: str, partition: str, txns: list[str]) -> None:
    items = [{"queue": queue, "partition": partition, "transactionId": t, "payload": {"t": t}}
             for t in txns]
    r = broker.client.post("/api/v1/push", json={"items": items})
    assert r.status_code == 201, r.text
    assert {x["status"] for x in r.json()} == {"queued"}, r.text


def pop(broker, queue: str, group: str, batch: int = 1, **params) -> dict | None:
    r = broker.client.get(f"/api/v1/pop/queue/{queue}",
                          params={"consumerGroup": group, "batch": batch, **params})
    assert r.status_code in (200, 204), r.text
    return r.json() if r.status_code == 200 else None


def ack_op(m: dict, status: str = "completed", group: str | None = None) -> dict:
    op = {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
          "leaseId": m["leaseId"], "status": status}
    if group is not None:
        op["consumerGroup"] = group
    return op


def cursor(db, queue: str, group: str) -> int:
    row = db.execute(
        "SELECT c.committed_offset FROM queen.log_consumers c"
        " JOIN queen.log_partitions lp ON lp.id = c.partition_id"
        " JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s AND c.consumer_group = %s",
        (queue, group)).fetchone()
    return row[0] if row else 0


def stored(db, queue: str) -> int:
    row = db.execute(
        "SELECT COALESCE(sum(lp.last_offset), 0) FROM queen.log_partitions lp"
        " JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s", (queue,)).fetchone()
    return int(row[0])


def test_push_and_ack_commit_together(broker, db):
    a, b, g = uq("ta"), uq("tb"), "step"
    push(broker, a, "p", ["in-1"])
    m = pop(broker, a, g)["messages"][0]
    r = broker.client.post(TXN, json={"operations": [
        ack_op(m, group=g),
        {"type": "push", "items": [{"queue": b, "partition": "p", "transactionId": "out-1",
                                    "payload": {"from": m["transactionId"]}}]}],
        "requiredLeases": [m["leaseId"]]})
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is True
    assert uuid.UUID(body["transactionId"])
    ack, pushed = body["results"]
    assert ack == {"index": 0, "type": "ack", "success": True, "transactionId": "in-1",
                   "partitionId": m["partitionId"], "leaseReleased": True, "dlq": False}
    assert pushed["index"] == 1 and pushed["type"] == "push" and pushed["status"] == "queued"
    assert pushed["offset"] == 1 and pushed["queue"] == b and pushed["transactionId"] == "out-1"
    assert cursor(db, a, g) == 1
    out = pop(broker, b, "next")["messages"][0]
    assert out["data"] == {"from": "in-1"} and out["id"] == pushed["messageId"]


def test_duplicate_push_undoes_the_ack(broker, db):
    a, b, g = uq("ta"), uq("tb"), "step"
    push(broker, a, "p", ["in-1"])
    push(broker, b, "p", ["out-dup"])
    m = pop(broker, a, g)["messages"][0]
    r = broker.client.post(TXN, json={"operations": [
        ack_op(m, group=g),
        {"type": "push", "items": [{"queue": b, "partition": "p", "transactionId": "fresh"},
                                   {"queue": b, "partition": "p",
                                    "transactionId": "out-dup"}]}]})
    body = r.json()
    assert r.status_code == 200 and body["success"] is False
    assert body["reason"] == "duplicate" and body["failedIndex"] == 2 and body["results"] == []
    assert "out-dup" in body["error"]
    assert cursor(db, a, g) == 0  # the ack was rolled back
    assert stored(db, b) == 1  # "fresh" was rolled back too
    # the lease is still live: the same step can be committed without the duplicate
    r = broker.client.post(TXN, json={"operations": [ack_op(m, group=g)]})
    assert r.json()["success"] is True and cursor(db, a, g) == 1


def test_repeated_transaction_id_inside_one_transaction(broker, db):
    b = uq("tb")
    r = broker.client.post(TXN, json={"operations": [
        {"type": "push", "queue": b, "transactionId": "x", "payload": 1},
        {"type": "push", "queue": b, "transactionId": "x", "payload": 2}]})
    body = r.json()
    assert body["success"] is False and body["reason"] == "duplicate"
    assert body["failedIndex"] == 1 and stored(db, b) == 0


def test_expired_lease_undoes_the_push(broker, db):
    a, b, g = uq("ta"), uq("tb"), "step"
    push(broker, a, "p", ["in-1"])
    db.execute("UPDATE queen.queues SET lease_time = 1 WHERE name = %s", (a,))
    m = pop(broker, a, g)["messages"][0]
    time.sleep(1.3)
    r = broker.client.post(TXN, json={"operations": [
        {"type": "push", "items": [{"queue": b, "transactionId": "out-1", "payload": 1}]},
        ack_op(m, group=g)]})
    body = r.json()
    assert body["success"] is False and body["reason"] == "rejected_ack"
    assert body["failedIndex"] == 1 and "lease_invalid" in body["error"]
    assert stored(db, b) == 0 and cursor(db, a, g) == 0


def test_required_lease_not_live_rolls_back(broker, db):
    b = uq("tb")
    r = broker.client.post(TXN, json={
        "operations": [{"type": "push", "queue": b, "payload": 1}],
        "requiredLeases": [str(uuid.uuid4())]})
    body = r.json()
    assert body["success"] is False and body["reason"] == "rejected_ack"
    assert stored(db, b) == 0


def test_ack_of_already_acked_position_rolls_back(broker, db):
    a, b, g = uq("ta"), uq("tb"), "step"
    push(broker, a, "p", ["in-1", "in-2"])
    m = pop(broker, a, g, batch=2)["messages"]
    ok = broker.client.post("/api/v1/ack/batch", json={"consumerGroup": g, "acknowledgments": [
        {"transactionId": "in-1", "partitionId": m[0]["partitionId"],
         "leaseId": m[0]["leaseId"]}]})
    assert ok.json()[0]["success"] is True
    r = broker.client.post(TXN, json={"operations": [
        {"type": "ack", "transactionId": "in-1", "partitionId": m[0]["partitionId"],
         "consumerGroup": g, "status": "completed"},
        {"type": "push", "queue": b, "payload": 1}]})
    body = r.json()
    assert body["success"] is False and body["reason"] == "rejected_ack"
    assert body["failedIndex"] == 0 and stored(db, b) == 0


def test_nack_inside_a_transaction_charges_the_retry_and_dlq(broker, db):
    a, g = uq("ta"), "step"
    push(broker, a, "p", ["poison"])
    db.execute("UPDATE queen.queues SET retry_limit = 0 WHERE name = %s", (a,))
    m = pop(broker, a, g)["messages"][0]
    r = broker.client.post(TXN, json={"operations": [
        {**ack_op(m, "failed", group=g), "error": "boom"}]})
    body = r.json()
    assert body["success"] is True, body
    assert body["results"][0]["dlq"] is True and body["results"][0]["leaseReleased"] is True
    row = db.execute(
        "SELECT d.error, d.transaction_id, convert_from(d.payload, 'UTF8') FROM queen.log_dlq d"
        " JOIN queen.queues q ON q.id = d.queue_id WHERE q.name = %s", (a,)).fetchone()
    assert row == ("boom", "poison", '{"t":"poison"}')
    assert cursor(db, a, g) == 1


def test_chained_processing_a_to_b_with_a_group(broker, db):
    a, b, g = uq("ca"), uq("cb"), "chain"
    push(broker, a, "p1", [f"a{i}" for i in range(5)])
    push(broker, a, "p2", [f"a{i}" for i in range(5, 10)])
    done = 0
    while True:
        got = pop(broker, a, g, batch=3, partitions=2)
        if got is None:
            break
        ops = [ack_op(m, group=g) for m in got["messages"]]
        ops.append({"type": "push", "items": [
            {"queue": b, "partition": m["partition"], "transactionId": "b-" + m["transactionId"],
             "payload": {"n": m["data"]["t"]}} for m in got["messages"]]})
        r = broker.client.post(TXN, json={"operations": ops})
        assert r.json()["success"] is True, r.text
        done += len(got["messages"])
    assert done == 10
    assert stored(db, b) == 10
    seen = []
    while (got := pop(broker, b, "reader", batch=10, autoAck="true")) is not None:
        seen += [m["transactionId"] for m in got["messages"]]
    assert sorted(seen) == sorted(f"b-a{i}" for i in range(10))


def test_retry_of_committed_transaction_rolls_back_as_duplicate(broker, db):
    b, c = uq("rb"), uq("rc")
    body = {"operations": [
        {"type": "push", "items": [{"queue": b, "partition": "x", "transactionId": "det-1"},
                                   {"queue": c, "partition": "y", "transactionId": "det-2"}]}]}
    first = broker.client.post(TXN, json=body).json()
    assert first["success"] is True and len(first["results"]) == 2
    again = broker.client.post(TXN, json=body).json()
    assert again["success"] is False and again["reason"] == "duplicate"
    assert stored(db, b) == 1 and stored(db, c) == 1  # the first commit stands, once


def test_several_queues_and_partitions_and_large_payload(broker, db):
    queues = [uq("mq") for _ in range(3)]
    big = "x" * (2 << 20)
    items = [{"queue": q, "partition": f"p{k}", "payload": {"k": k, "big": big if k == 0 else ""}}
             for q in queues for k in range(3)]
    r = broker.client.post(TXN, json={"operations": [{"type": "push", "items": items}]})
    body = r.json()
    assert body["success"] is True and [x["index"] for x in body["results"]] == list(range(9))
    assert all(x["offset"] == 1 for x in body["results"])
    m = pop(broker, queues[0], "g", partitions=3, batch=3)
    assert {x["data"]["k"] for x in m["messages"]} == {0, 1, 2}
    assert next(x for x in m["messages"] if x["data"]["k"] == 0)["data"]["big"] == big


def test_bad_bodies_are_400(broker):
    for body in ({}, {"operations": []}, {"operations": [{"type": "nope"}]},
                 {"operations": [{"type": "kv"}]}, {"operations": "x"},
                 {"operations": [{"type": "ack", "partitionId": "1"}]},
                 {"operations": [{"type": "push", "items": []}]},
                 {"operations": [], "kv": {"op": "get"}}):
        r = broker.client.post(TXN, json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["code"] in ("invalid_request", "invalid_status")
    r = broker.client.post(TXN, content=b"not json")
    assert r.status_code == 400
    r = broker.client.post(TXN, content=b"QTB1\x02" + struct.pack("<I", 2) + b"{}")
    assert r.status_code == 400 and r.json()["code"] == "unsupported_flags"
    r = broker.client.post(TXN, content=b"QPB1\x04" + bytes(8))
    assert r.status_code == 400 and r.json()["code"] == "bad_frame"


def test_push_in_transaction_wakes_a_parked_pop(broker):
    b = uq("wb")
    got: dict = {}

    def parked():
        t0 = time.monotonic()
        r = broker.client.get(f"/api/v1/pop/queue/{b}",
                              params={"wait": "true", "timeout": 30000})
        got["status"], got["after"] = r.status_code, time.monotonic() - t0

    t = threading.Thread(target=parked)
    t.start()
    time.sleep(0.7)
    r = broker.client.post(TXN, json={"operations": [{"type": "push", "queue": b,
                                                       "payload": {"v": 1}}]})
    assert r.json()["success"] is True
    t.join(60)
    # woken by the transaction's push, not at its 30 s timeout (room for a loaded machine)
    assert got["status"] == 200 and got["after"] < 10, got


def test_concurrent_transactions_pushes_and_acks_never_deadlock(broker, db):
    src, dst = uq("ds"), uq("dd")
    partitions = [f"p{k}" for k in range(4)]
    for p in partitions:
        push(broker, src, p, [f"{p}-{i}" for i in range(12)])
    errors: list[str] = []

    def worker(w: int) -> None:
        while True:
            got = pop(broker, src, "g", batch=2, partitions=2)
            if got is None:
                return
            ops = [ack_op(m, group="g") for m in got["messages"]]
            ops.append({"type": "push", "items": [
                {"queue": dst, "partition": p, "transactionId": f"w{w}-{m['transactionId']}-{p}"}
                for m in got["messages"] for p in reversed(partitions)]})
            r = broker.client.post(TXN, json={"operations": ops})
            if r.status_code != 200 or not r.json()["success"]:
                errors.append(r.text)

    def pusher() -> None:
        for i in range(20):
            items = [{"queue": dst, "partition": p, "transactionId": f"plain-{i}-{p}"}
                     for p in partitions]
            r = broker.client.post("/api/v1/push", json={"items": items})
            if r.status_code != 201:
                errors.append(r.text)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    threads.append(threading.Thread(target=pusher))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert stored(db, dst) == 48 * 4 + 20 * 4


def test_client_transaction_builder_json_and_binary(broker, db):
    a, b = uq("qa"), uq("qb")
    push(broker, a, "p", ["c-1", "c-2"])

    async def go(binary: bool, group: str):
        opts = {"binary_push": True, "push_compression": True} if binary else {}
        async with Queen(broker.url, **opts) as client:
            msgs = await client.queue(a).group(group).batch(2).pop()
            tx = client.transaction().ack(msgs, "completed", {"consumer_group": group})
            tx.queue(b).partition("out").push(
                [{"data": {"src": m["transactionId"], "g": group}} for m in msgs])
            return await tx.commit()

    res_json = asyncio.run(go(False, "json"))
    res_bin = asyncio.run(go(True, "bin"))
    for res in (res_json, res_bin):
        assert res["success"] is True, res
        assert [r["type"] for r in res["results"]] == ["ack", "ack", "push", "push"]
    assert cursor(db, a, "json") == 2 and cursor(db, a, "bin") == 2
    got = pop(broker, b, "check", batch=10, autoAck="true")
    assert sorted((m["data"]["g"], m["data"]["src"]) for m in got["messages"]) == [
        ("bin", "c-1"), ("bin", "c-2"), ("json", "c-1"), ("json", "c-2")]


def test_kv_rides_the_transaction_and_a_required_precondition_undoes_everything(broker, db):
    b, ns = uq("kb"), uq("ns")
    ok = broker.client.post(TXN, json={
        "operations": [{"type": "push", "queue": b, "payload": {"v": 1}}],
        "kv": [{"op": "put", "ns": ns, "key": "k", "value": {"owner": "w-1"}, "forever": True},
               {"op": "get", "ns": ns, "key": "k"}]}).json()
    assert ok["success"] is True, ok
    push_r, put_r, get_r = ok["results"]
    assert (push_r["index"], put_r["index"], get_r["index"]) == (0, 1, 2)
    assert put_r["type"] == "kv" and put_r["applied"] is True and put_r["version"] == 1
    assert get_r["found"] is True and get_r["value"] == {"owner": "w-1"}  # reads see writes
    bad = broker.client.post(TXN, json={
        "operations": [{"type": "push", "queue": b, "payload": {"v": 2}}],
        "kv": [{"op": "put", "ns": ns, "key": "k", "value": {"owner": "w-2"}, "forever": True,
                "expect": 7, "required": True}]}).json()
    assert bad["success"] is False and bad["reason"] == "kv_precondition"
    assert bad["failedIndex"] == 1 and bad["kvReason"] == "version" and bad["version"] == 1
    assert bad["value"] == {"owner": "w-1"} and bad["results"] == []
    assert stored(db, b) == 1  # the second push was rolled back


def test_kv_precondition_race_between_transactions_has_one_winner(broker, db):
    ns = uq("race")
    for rnd in range(10):
        key = f"k{rnd}"
        first = broker.client.post("/api/v1/kv", json={"operations": [
            {"op": "put", "ns": ns, "key": key, "value": 0, "forever": True}]})
        assert first.status_code == 200
        outcomes: list[bool] = []
        barrier = threading.Barrier(2)

        def contender(w: int, key: str = key, barrier: threading.Barrier = barrier,
                      outcomes: list[bool] = outcomes) -> None:
            barrier.wait()
            r = broker.client.post(TXN, json={
                "operations": [{"type": "push", "queue": uq("rq"), "payload": w}],
                "kv": [{"op": "put", "ns": ns, "key": key, "value": w, "forever": True,
                        "expect": 1, "required": True}]})
            outcomes.append(r.json()["success"])

        threads = [threading.Thread(target=contender, args=(w,)) for w in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outcomes) == [False, True]
        version = db.execute("SELECT version FROM queen.kv WHERE ns = %s AND key = %s",
                             (ns, key)).fetchone()[0]
        assert version == 2
