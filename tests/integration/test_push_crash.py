"""Issue 3: a shard process killed (SIGKILL) in the middle of a push load.

What the clients were told must be what PostgreSQL holds: every item answered ``queued`` is
stored exactly once at the offset it was given, no message is stored twice, offsets stay gapless
per partition, and every item answered ``buffered`` is stored exactly once after the spool
drain (api.md 1.8, 2.1).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import threading
import time

import httpx
import psycopg

from tests.integration.test_push_json import PUSH, stored_messages, uq

THREADS = 8
PARTITIONS = 20


def test_killed_shard_loses_no_queued_item_and_stores_none_twice(make_broker, db_dsn):
    b = make_broker(db_dsn, QUEEN_PUSH_TIMEOUT_MS="6000")
    q = uq("crash")
    stop = threading.Event()
    lock = threading.Lock()
    queued: list[tuple[dict, dict]] = []
    buffered: list[tuple[dict, dict]] = []
    other: list[tuple[dict, dict]] = []
    failures: collections.Counter = collections.Counter()
    answered_after_kill: collections.Counter = collections.Counter()
    killed_at: list[float] = []

    def load(w: int) -> None:
        rnd = random.Random(w)
        seq = 0
        with httpx.Client(base_url=b.url, timeout=20) as http:
            while not stop.is_set():
                items = [{"queue": q, "partition": f"p{rnd.randrange(PARTITIONS)}",
                          "transactionId": f"w{w}-s{seq}-i{i}",
                          "payload": {"w": w, "s": seq, "i": i}}
                         for i in range(rnd.randint(1, 10))]
                seq += 1
                try:
                    r = http.post(PUSH, json={"items": items})
                except httpx.HTTPError as ex:
                    with lock:
                        failures[type(ex).__name__] += 1
                    time.sleep(0.05)
                    continue
                with lock:
                    if killed_at:
                        answered_after_kill[r.status_code] += 1
                    if r.status_code != 201:
                        code = r.json().get("code") if r.content else None
                        failures[f"{r.status_code} {code}"] += 1
                        continue
                    for item, res in zip(items, r.json(), strict=True):
                        {"queued": queued, "buffered": buffered}.get(
                            res["status"], other).append((item, res))

    threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(THREADS)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    shards = b.shard_pids()
    assert len(shards) == 2
    victim = shards[0]
    with lock:
        killed_at.append(time.monotonic())
        queued_before_kill = len(queued)
    os.kill(victim, signal.SIGKILL)
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a load thread hung"

    # the broker comes back: a new shard, healthy, and pushes are queued again
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = b.shard_pids()
        if len(now) == 2 and victim not in now:
            break
        time.sleep(0.2)
    assert victim not in b.shard_pids() and len(b.shard_pids()) == 2
    health = b.wait_healthy(30)
    assert health["shards"]["alive"] == 2
    after = [{"queue": q, "partition": f"p{p}", "transactionId": f"after-{p}",
              "payload": {"after": p}} for p in range(PARTITIONS)]
    r = b.client.post(PUSH, json={"items": after})
    assert r.status_code == 201, r.text
    assert [x["status"] for x in r.json()] == ["queued"] * PARTITIONS
    queued.extend(zip(after, r.json(), strict=True))

    print(f"\nqueued {len(queued)} ({queued_before_kill} before the kill), "
          f"buffered {len(buffered)}, other {len(other)}, failures {dict(failures)}, "
          f"answers after the kill {dict(answered_after_kill)}")
    assert queued_before_kill > 0 and len(queued) > queued_before_kill + PARTITIONS
    assert not other, [res for _, res in other[:5]]
    # a failed request is a 503 (shard down / timeout) or a dropped connection, never a 500
    for key in failures:
        assert not str(key).startswith(("500", "4")), dict(failures)

    # the background drain replays what was answered buffered: wait until the spool is empty
    deadline = time.monotonic() + 60
    while b.client.get("/api/v1/system/spool").json()["pending"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b.client.get("/api/v1/system/spool").json()["pending"] == 0

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        stored = stored_messages(conn, q)
        last_offsets = dict(conn.execute(
            "SELECT lp.id, lp.last_offset FROM queen.log_partitions lp "
            "JOIN queen.queues qu ON qu.id = lp.queue_id WHERE qu.name = %s", (q,)).fetchall())

    # no message id and no transactionId stored twice (every transactionId was sent once)
    ids = collections.Counter(m.message_id for m in stored)
    assert [i for i, n in ids.items() if n > 1] == []
    txns = collections.Counter(m.transaction_id for m in stored)
    assert [t for t, n in txns.items() if n > 1] == []
    # offsets gapless per partition, up to last_offset
    by_pos: dict[tuple[int, int], object] = {}
    per_partition: dict[int, list[int]] = collections.defaultdict(list)
    for m in stored:
        assert (m.partition_id, m.offset) not in by_pos
        by_pos[(m.partition_id, m.offset)] = m
        per_partition[m.partition_id].append(m.offset)
    assert set(per_partition) == set(last_offsets)
    for pid, offs in per_partition.items():
        assert sorted(offs) == list(range(1, last_offsets[pid] + 1)), pid
    # every queued answer is exactly what is stored at its offset
    for item, res in queued:
        m = by_pos.get((int(res["partitionId"]), res["offset"]))
        assert m is not None, f"queued item missing: {res}"
        assert m.message_id == res["messageId"], res
        assert m.transaction_id == item["transactionId"] == res["transactionId"]
        assert m.partition == item["partition"]
        assert json.loads(m.payload) == item["payload"]

    # buffered items: drained, so each is stored exactly once under the id it was answered with
    by_id = {m.message_id: m for m in stored}
    for item, res in buffered:
        assert res["offset"] is None
        m = by_id.get(res["messageId"])
        assert m is not None, f"buffered item not stored after the drain: {res}"
        assert (m.partition, m.transaction_id) == (item["partition"], item["transactionId"])
        assert json.loads(m.payload) == item["payload"]
    assert b.client.get("/api/v1/system/spool").json()["failed"] == 0


def test_push_deadline_is_503_timeout_and_the_retry_is_deduplicated(make_broker, db_dsn):
    """api.md 1.8: 503 timeout does not say whether the push applied; retrying is safe."""
    b = make_broker(db_dsn, QUEEN_PUSH_TIMEOUT_MS="1500")
    q = uq("deadline")
    r = b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "warm"}]})
    assert r.status_code == 201 and r.json()[0]["status"] == "queued"
    with psycopg.connect(db_dsn) as blocker:
        # hold the partition row lock: the shard's bundle waits behind it
        blocker.execute("SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues qu "
                        "ON qu.id = lp.queue_id WHERE qu.name = %s FOR UPDATE", (q,))
        t0 = time.monotonic()
        r = b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "slow",
                                                 "payload": "first"}]})
        waited = time.monotonic() - t0
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "timeout"
        assert 1.0 < waited < 10, waited
        blocker.rollback()
    # the abandoned bundle still commits once the lock is gone
    deadline = time.monotonic() + 10
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            msgs = stored_messages(conn, q)
            if len(msgs) == 2:
                break
            time.sleep(0.1)
        assert [m.transaction_id for m in msgs] == ["warm", "slow"]
        retry = b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "slow",
                                                     "payload": "retry"}]})
        assert retry.status_code == 201, retry.text
        [res] = retry.json()
        assert res["status"] == "duplicate"
        assert (res["messageId"], res["offset"]) == (msgs[1].message_id, 2)
        assert [m.payload for m in stored_messages(conn, q)] == [b"", b'"first"']
    assert b.client.get("/health").status_code == 200
