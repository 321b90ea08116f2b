"""Pop + ack consume loops (api.md 2.2, 2.3, 2.4) against the real broker process: concurrent
consumers of one group keep strict per-partition order and get every message exactly once; an
ack that releases a lease makes the partition claimable at once, also for a parked pop.

Every consumer appends what it received to a shared log BEFORE it acks, and a partition's next
batch can only be claimed after that ack committed: so the log's order per partition is the
real delivery order.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
import uuid

import httpx
import psycopg

from tests.integration.test_push_json import push, uq

POP = "/api/v1/pop"
ACK = "/api/v1/ack"
ACK_BATCH = "/api/v1/ack/batch"
RESULT_KEYS = {"index", "transactionId", "partitionId", "success", "error", "leaseReleased",
               "dlq", "noop"}


def push_partitions(client: httpx.Client, queue: str, partitions: int, per: int) -> None:
    """``per`` messages in each of ``partitions`` partitions, a few pushes per partition."""
    for p in range(partitions):
        for start in range(0, per, 10):
            n = min(10, per - start)
            res = push(client, [{"queue": queue, "partition": f"p{p}",
                                 "payload": {"p": p, "i": start + i}} for i in range(n)])
            assert all(r["status"] == "queued" for r in res), res


def ack_items(body: dict) -> list[dict]:
    return [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "status": "completed", "leaseId": m["leaseId"]} for m in body["messages"]]


def ack_batch(client: httpx.Client, group: str, body: dict) -> list[dict]:
    items = ack_items(body)
    r = client.post(ACK_BATCH, json={"consumerGroup": group, "acknowledgments": items})
    assert r.status_code == 200, r.text
    results = r.json()
    assert isinstance(results, list) and len(results) == len(items)
    for i, (res, item) in enumerate(zip(results, items, strict=True)):
        assert set(res) >= RESULT_KEYS, res
        assert res["index"] == i
        assert res["transactionId"] == item["transactionId"]
        assert str(res["partitionId"]) == item["partitionId"]
        assert res["success"] is True and res["error"] is None, res
        assert res["dlq"] is False and res["noop"] is False, res
        assert res["leaseReleased"] is True, res  # the whole batch was acked
    return results


def cursors(db: psycopg.Connection, queue: str, group: str,
            column: str = "c.lease_id") -> dict[str, tuple]:
    """partition -> (committed offset, ``column`` of its consumer row ``c``)."""
    rows = db.execute(
        f"SELECT lp.name, c.committed_offset, {column} FROM queen.log_consumers c "
        "JOIN queen.log_partitions lp ON lp.id = c.partition_id "
        "JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.name = %s AND c.consumer_group = %s", (queue, group)).fetchall()
    return {name: (committed, other) for name, committed, other in rows}


class GroupRun:
    """``consumers`` threads of one group: pop batch 5 (long poll), log, ack, repeat."""

    def __init__(self, url: str, queue: str, group: str, expected: int, consumers: int) -> None:
        self.url, self.queue, self.group = url, queue, group
        self.expected, self.consumers = expected, consumers
        self.lock = threading.Lock()
        self.log: list[tuple[str, int, int, str]] = []  # (partition, offset, attempt, lease)
        self.inflight: set[str] = set()
        self.overlaps: list[str] = []
        self.deadline = time.monotonic() + 40

    def done(self) -> bool:
        with self.lock:
            return len(self.log) >= self.expected

    def consumer(self) -> int:
        batches = 0
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.done():
                assert time.monotonic() < self.deadline, "consumers did not drain the queue"
                r = c.get(f"{POP}/queue/{self.queue}", params={
                    "consumerGroup": self.group, "batch": "5", "wait": "true",
                    "timeout": "1000"})
                if r.status_code == 204:
                    continue
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["partitionsClaimed"] == 1 and len(body["claims"]) == 1
                part = body["partition"]
                with self.lock:
                    if part in self.inflight:
                        self.overlaps.append(part)
                    self.inflight.add(part)
                    self.log.extend((m["partition"], m["offset"], m["deliveryAttempt"],
                                     m["leaseId"]) for m in body["messages"])
                    # released before the ack is sent: nobody may get it before the ack
                    self.inflight.discard(part)
                ack_batch(c, self.group, body)
                batches += 1
        return batches

    def run(self, pool: cf.Executor) -> list[cf.Future]:
        return [pool.submit(self.consumer) for _ in range(self.consumers)]

    def check(self, partitions: int, per: int) -> None:
        assert self.overlaps == []
        keys = [(p, o) for p, o, _, _ in self.log]
        assert len(keys) == len(set(keys)) == partitions * per  # exactly once
        assert {a for _, _, a, _ in self.log} == {1}  # no lease expired, nothing redelivered
        for p in range(partitions):
            seen = [o for name, o, _, _ in self.log if name == f"p{p}"]
            assert seen == list(range(1, per + 1)), (f"p{p}", seen)  # strictly increasing


def test_ten_concurrent_consumers_keep_strict_per_partition_order(broker, db):
    q, g = uq("flow"), uq("g")
    partitions, per = 6, 30
    push_partitions(broker.client, q, partitions, per)
    run = GroupRun(broker.url, q, g, partitions * per, consumers=10)
    with cf.ThreadPoolExecutor(10) as pool:
        batches = [f.result(timeout=60) for f in run.run(pool)]
    run.check(partitions, per)
    assert sum(batches) >= partitions * per // 5
    assert cursors(db, q, g) == {f"p{p}": (per, None) for p in range(partitions)}
    r = broker.client.get(f"{POP}/queue/{q}", params={"consumerGroup": g})
    assert r.status_code == 204


def test_two_groups_consuming_concurrently_each_see_every_message_once(broker, db):
    q = uq("flow")
    partitions, per = 4, 20
    push_partitions(broker.client, q, partitions, per)
    runs = [GroupRun(broker.url, q, uq(f"g{i}"), partitions * per, consumers=5)
            for i in range(2)]
    with cf.ThreadPoolExecutor(10) as pool:
        futures = [f for run in runs for f in run.run(pool)]
        for f in futures:
            f.result(timeout=60)
    for run in runs:
        run.check(partitions, per)
        assert cursors(db, q, run.group) == {f"p{p}": (per, None) for p in range(partitions)}


def test_an_ack_releasing_the_lease_wakes_a_parked_pop(broker):
    q, g = uq("flow"), uq("g")
    push(broker.client, [{"queue": q, "payload": i} for i in range(6)])
    first = broker.client.get(f"{POP}/queue/{q}", params={"consumerGroup": g, "batch": "3"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert [m["offset"] for m in body["messages"]] == [1, 2, 3]
    with cf.ThreadPoolExecutor(1) as ex, httpx.Client(base_url=broker.url, timeout=60) as c:
        fut = ex.submit(c.get, f"{POP}/queue/{q}", params={
            "consumerGroup": g, "batch": "3", "wait": "true", "timeout": "30000"})
        time.sleep(0.7)
        assert not fut.done()  # the only partition is leased
        ack_batch(broker.client, g, body)
        t_acked = time.monotonic()
        r = fut.result(timeout=60)
        t_answer = time.monotonic()
    assert r.status_code == 200, r.text
    assert [m["offset"] for m in r.json()["messages"]] == [4, 5, 6]
    assert r.json()["claims"][0]["deliveryAttempt"] == 1
    # woken by the ack, not its own re-claim just before the 30 s timeout (10 s: room for a
    # loaded machine)
    assert t_answer - t_acked < 10, t_answer - t_acked


def test_single_acks_keep_the_lease_until_the_batch_end(broker, db):
    q, g = uq("flow"), uq("g")
    push(broker.client, [{"queue": q, "payload": i} for i in range(5)])
    r = broker.client.get(f"{POP}/queue/{q}", params={"consumerGroup": g, "batch": "3"})
    assert r.status_code == 200, r.text
    body = r.json()
    lease = body["leaseId"]
    for k, item in enumerate(ack_items(body)):
        a = broker.client.post(ACK, json={**item, "consumerGroup": g})
        assert a.status_code == 200, a.text
        [res] = a.json()
        assert res["success"] is True and res["error"] is None, res
        last = k == 2
        assert res["leaseReleased"] is last, res
        if not last:  # the lease still holds the rest of the batch
            assert cursors(db, q, g)["Default"] == (k + 1, uuid.UUID(lease))
            nothing = broker.client.get(f"{POP}/queue/{q}", params={"consumerGroup": g})
            assert nothing.status_code == 204
    assert cursors(db, q, g)["Default"] == (3, None)
    r = broker.client.get(f"{POP}/queue/{q}", params={"consumerGroup": g, "batch": "10"})
    assert r.status_code == 200, r.text
    assert [m["offset"] for m in r.json()["messages"]] == [4, 5]
    assert r.json()["claims"][0]["deliveryAttempt"] == 1


def test_pops_after_a_rolled_back_call_on_their_pooled_connection(make_broker, db_dsn):
    """CI's 503 ``prepared statement "queen_log_pop_v2" does not exist`` (the claim reverted in
    c6dd937), for real: one front worker with one pooled connection pops (the claim's
    statement prepared there by hand), runs kv writes until psycopg prepares that statement
    of its own (prepare_threshold 5), then a kv call whose required op fails, so psycopg
    rolls the transaction back and sends DEALLOCATE ALL after it. The pops after it claim."""
    b = make_broker(db_dsn, QUEEN_WORKERS="1", QUEEN_PG_POOL_SIZE="1")
    q, ns = uq(), f"kv-{uuid.uuid4().hex[:12]}"
    push(b.client, [{"queue": q, "payload": {"i": i}} for i in range(3)])

    def pop_one() -> int:
        r = b.client.get(f"{POP}/queue/{q}", params={"autoAck": "true", "wait": "false"})
        assert r.status_code == 200, (r.status_code, r.text)
        (m,) = r.json()["messages"]
        return int(m["data"]["i"])

    got = [pop_one()]
    for k in range(7):
        r = b.client.post("/api/v1/kv", json={"operations": [
            {"op": "put", "ns": ns, "key": "k", "value": k, "forever": True}]})
        assert r.status_code == 200 and r.json()["success"] is True, r.text
    r = b.client.post("/api/v1/kv", json={"operations": [
        {"op": "put", "ns": ns, "key": "k", "value": -1, "forever": True, "expect": 99,
         "required": True}]})
    assert r.status_code == 200 and r.json()["success"] is False, r.text  # rolled back
    got += [pop_one(), pop_one()]
    assert got == [0, 1, 2]
