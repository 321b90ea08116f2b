"""The spool drain (life-of-a-push "Error spooling", api.md 1.8, 2.1, 5): what the broker
answered ``buffered`` ends up stored exactly once, with its messageId, after a PostgreSQL
outage, a torn spool file, a broker restart, or a permanent rejection and ``retryFailed``.
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from pathlib import Path

import httpx
import orjson
import psycopg

from queen_mp.crypto import PayloadCipher
from queen_mp.spool import SpoolItem, SpoolWriter
from queen_mp.wire.frames import FLAG_ENCRYPTED, pack_frame
from queen_mp.wire.ids import ZERO_UUID, uuid7, uuid_text
from tests.integration.test_maintenance import (
    DRAIN,
    pop_all,
    set_maintenance,
    spool_status,
    wait_drained,
    wait_for,
)
from tests.integration.test_push_json import PUSH, queue_footprint, stored_messages, uq
from tests.pgharness import make_database

KEY = "22" * 32


def spool_logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("spool-*.log"))


def spool_record(queue: str, txn: str, payload: bytes, partition: str = "Default"
                 ) -> tuple[str, bytes]:
    mid = uuid7()
    frame = pack_frame(mid, txn.encode(), payload)
    item = SpoolItem(tenant=ZERO_UUID, queue=queue, partition=partition, message_id=mid,
                     transaction_id=txn, trace_id=None, payload=frame)
    return uuid_text(mid), item.encode()


def assert_stored_once(dsn: str, queue: str, ids: set[str], timeout: float = 30.0) -> list:
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = wait_for(f"{len(ids)} messages stored", lambda: (
            m := stored_messages(conn, queue)) and len(m) >= len(ids) and m, timeout)
    counts = collections.Counter(m.message_id for m in stored)
    assert counts == collections.Counter(ids), (len(stored), len(ids))
    return stored


# ------------------------------------------------------------------------ PostgreSQL outage
def test_postgres_outage_buffers_recovers_and_drains(make_broker, private_pg):
    dsn = make_database(private_pg.dsn)
    b = make_broker(dsn, QUEEN_PUSH_TIMEOUT_MS="4000", QUEEN_PG_STATEMENT_TIMEOUT_MS="3000")
    q = uq("outage")
    stop = threading.Event()
    lock = threading.Lock()
    answers: dict[str, list[tuple[dict, dict]]] = collections.defaultdict(list)
    failures: collections.Counter = collections.Counter()
    phase = ["before"]
    by_phase: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def load(w: int) -> None:
        rnd = random.Random(w)
        seq = 0
        with httpx.Client(base_url=b.url, timeout=30) as http:
            while not stop.is_set():
                items = [{"queue": q, "partition": f"p{rnd.randrange(8)}",
                          "transactionId": f"w{w}-s{seq}-i{i}", "payload": {"w": w, "s": seq}}
                         for i in range(rnd.randint(1, 5))]
                seq += 1
                try:
                    r = http.post(PUSH, json={"items": items})
                except httpx.HTTPError as ex:
                    with lock:
                        failures[type(ex).__name__] += 1
                    time.sleep(0.05)
                    continue
                with lock:
                    if r.status_code != 201:
                        failures[f"{r.status_code} {r.json().get('code')}"] += 1
                        by_phase[phase[0]][str(r.status_code)] += 1
                        time.sleep(0.02)
                        continue
                    for item, res in zip(items, r.json(), strict=True):
                        answers[res["status"]].append((item, res))
                        by_phase[phase[0]][res["status"]] += 1
                time.sleep(0.005)

    threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    with lock:
        phase[0] = "outage"
    private_pg.stop(mode="immediate")
    time.sleep(4.0)
    private_pg.start()
    with lock:
        phase[0] = "recovering"
    # the broker recovers by itself: healthy, and pushes are queued again
    b.wait_healthy(60)
    with lock:
        phase[0] = "after"
    wait_for("pushes queued again after the outage",
             lambda: by_phase["after"]["queued"] > 20, timeout=60)
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a load thread hung"
    print(f"\nanswers {({k: len(v) for k, v in answers.items()})}, failures {dict(failures)}, "
          f"by phase { {k: dict(v) for k, v in by_phase.items()} }")
    assert set(answers) <= {"queued", "buffered"}, set(answers)
    assert answers["buffered"], "the outage produced no buffered item"
    assert by_phase["before"]["queued"] > 0
    for key in failures:  # 503 (unavailable / timeout / outcome unknown), never 4xx or 500
        assert str(key).startswith("503"), dict(failures)

    wait_drained(b, timeout=90)
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = stored_messages(conn, q)
    ids = collections.Counter(m.message_id for m in stored)
    assert [i for i, n in ids.items() if n > 1] == []
    txns = collections.Counter(m.transaction_id for m in stored)
    assert [t for t, n in txns.items() if n > 1] == []
    by_pos = {(m.partition_id, m.offset): m for m in stored}
    by_id = {m.message_id: m for m in stored}
    for item, res in answers["queued"]:  # nothing answered queued is lost
        m = by_pos.get((int(res["partitionId"]), res["offset"]))
        assert m is not None and m.message_id == res["messageId"], res
        assert m.transaction_id == item["transactionId"]
    for item, res in answers["buffered"]:  # every buffered message present, once
        m = by_id.get(res["messageId"])
        assert m is not None, f"buffered item not stored after the drain: {res}"
        assert (m.partition, m.transaction_id) == (item["partition"], item["transactionId"])
        assert orjson.loads(m.payload) == item["payload"]
    assert spool_status(b)["failed"] == 0


def test_an_outage_spools_pushes_whose_queue_flags_postgres_cannot_tell(make_broker,
                                                                        private_pg):
    """Issue 29, fault 3: with PostgreSQL stopped, a push to a queue pushed a moment earlier,
    to a new queue and to an encrypted queue each answer 201 ``buffered`` (the encryption flag
    lookup used to answer 503 "queue flags unreadable: PoolTimeout" after 5 s); the drain
    stores each once, the encrypted queue's payload encrypted."""
    dsn = make_database(private_pg.dsn)
    b = make_broker(dsn, QUEEN_PUSH_TIMEOUT_MS="4000")
    known, new, secret = uq("known"), uq("new"), uq("secret")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, encryption_enabled) VALUES (%s, true)",
                     (secret,))
    for q in (known, secret):
        r = b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "before",
                                                  "payload": {"q": q}}]})
        assert r.status_code == 201 and r.json()[0]["status"] == "queued", r.text
    private_pg.stop(mode="immediate")
    try:
        answered = {}
        for q in (known, new, secret):
            r = b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "during",
                                                      "payload": {"q": q}}]}, timeout=30)
            assert r.status_code == 201, (q, r.status_code, r.text)
            assert r.json()[0]["status"] == "buffered", (q, r.text)
            answered[q] = r.json()[0]["messageId"]
    finally:
        private_pg.start()
    b.wait_healthy(60)
    wait_drained(b, timeout=90)
    for q, message_id in answered.items():
        stored = [m for m in stored_messages_now(dsn, q) if m.transaction_id == "during"]
        assert [m.message_id for m in stored] == [message_id], (q, stored)
        encrypted = bool(stored[0].flags & FLAG_ENCRYPTED)
        assert encrypted == (q == secret), (q, stored[0].flags)
        if not encrypted:
            assert orjson.loads(stored[0].payload) == {"q": q}
    got = pop_all(b.client, secret, 2)
    assert sorted(m["transactionId"] for m in got) == ["before", "during"]
    assert all(m["data"] == {"q": secret} for m in got)
    assert spool_status(b)["failed"] == 0


# ------------------------------------------------------------------------ torn spool file
def test_a_torn_last_record_is_skipped_without_error(make_broker, fresh_db_dsn, tmp_path):
    spool_dir = tmp_path / "spool"
    q = uq("torn")
    ids = []
    with SpoolWriter(spool_dir, "w7-424242", fsync=False) as writer:
        for i in range(5):
            mid, record = spool_record(q, f"torn-{i}", orjson.dumps({"i": i}), f"p{i % 2}")
            writer.append([record])
            ids.append(mid)
    (log,) = spool_logs(spool_dir)
    size = log.stat().st_size
    os.truncate(log, size - 7)  # the last record loses its tail

    b = make_broker(fresh_db_dsn, QUEEN_SPOOL_DIR=str(spool_dir))
    wait_drained(b)
    stored = assert_stored_once(fresh_db_dsn, q, set(ids[:4]))
    assert sorted(m.transaction_id for m in stored) == [f"torn-{i}" for i in range(4)]
    assert spool_logs(spool_dir) == []  # a sealed file drained to its end is deleted
    status = spool_status(b)
    assert status["failed"] == 0 and status["pending"] == 0
    text = b.log()
    assert "torn or corrupt tail" in text
    assert "Traceback" not in text and "rejected for good" not in text
    time.sleep(0.5)
    assert len(stored_messages_now(fresh_db_dsn, q)) == 4  # and nothing replayed twice


def stored_messages_now(dsn: str, queue: str) -> list:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return stored_messages(conn, queue)


# ------------------------------------------------------------------------ broker restart
def test_the_drain_survives_a_broker_restart(make_broker, fresh_db_dsn, tmp_path):
    spool_dir = tmp_path / "spool"
    q = uq("restart")
    b1 = make_broker(fresh_db_dsn, QUEEN_SPOOL_DIR=str(spool_dir))
    set_maintenance(b1, True)
    items = [{"queue": q, "partition": f"p{i % 4}", "transactionId": f"r-{i}",
              "payload": {"i": i}} for i in range(40)]
    r = b1.client.post(PUSH, json={"items": items})
    assert [x["status"] for x in r.json()] == ["buffered"] * 40
    ids = {x["messageId"] for x in r.json()}
    assert b1.stop() == 0
    assert spool_logs(spool_dir)

    b2 = make_broker(fresh_db_dsn, QUEEN_SPOOL_DIR=str(spool_dir))
    assert b2.client.get("/health").json()["maintenanceMode"] is True  # kept in PostgreSQL
    assert spool_status(b2)["pending"] == 40
    more = [{"queue": q, "partition": "p9", "transactionId": f"m-{i}"} for i in range(10)]
    r = b2.client.post(PUSH, json={"items": more})
    assert [x["status"] for x in r.json()] == ["buffered"] * 10
    ids |= {x["messageId"] for x in r.json()}
    time.sleep(0.6)  # drainers tick: nothing may move while maintenance is on
    assert spool_status(b2)["pending"] == 50
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        assert queue_footprint(conn, q) == (0, 0, 0, 0)

    set_maintenance(b2, False)
    wait_drained(b2)
    assert_stored_once(fresh_db_dsn, q, ids)
    popped = pop_all(b2.client, q, 50)
    assert sorted(m["id"] for m in popped) == sorted(ids)


# ------------------------------------------------------------------ failed records, retryFailed
def test_rejected_records_are_failed_and_retry_failed_requeues_them(make_broker, fresh_db_dsn,
                                                                    tmp_path):
    """An encrypted queue pushed in maintenance on a broker without the key: the drain cannot
    store its records (permanent), files them as failed; a broker with the key re-queues them
    on ``retryFailed`` and stores them encrypted, with their original ids."""
    spool_dir = tmp_path / "spool"
    secret = uq("secret")
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, encryption_enabled) VALUES (%s, true)",
                     (secret,))
    # one record that is not a spool item at all: failed for good
    with SpoolWriter(spool_dir, "w8-434343", fsync=False) as writer:
        writer.append([b"not a spool item"])

    a = make_broker(fresh_db_dsn, QUEEN_SPOOL_DIR=str(spool_dir),
                    QUEEN_ENCRYPTION_KEY_CREATE="0")  # no key: the drain refuses
    set_maintenance(a, True)
    payloads = [{"card": "4111", "n": i} for i in range(3)]
    r = a.client.post(PUSH, json={"items": [{"queue": secret, "payload": p, "transactionId":
                                             f"s-{i}"} for i, p in enumerate(payloads)]})
    assert [x["status"] for x in r.json()] == ["buffered"] * 3
    ids = [x["messageId"] for x in r.json()]
    set_maintenance(a, False)
    status = wait_for("rejected records filed", lambda: (
        s := spool_status(a))["failed"] == 4 and s["pending"] == 0 and s)
    assert status["failed"] == 4
    assert a.client.get("/api/v1/system/maintenance").json()["spool"]["failed"] == 4
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        assert stored_messages(conn, secret) == []
    assert a.stop() == 0

    b = make_broker(fresh_db_dsn, QUEEN_SPOOL_DIR=str(spool_dir), QUEEN_ENCRYPTION_KEY=KEY)
    assert spool_status(b)["failed"] == 4  # the failed state survives a restart
    r = b.client.post(DRAIN, json={"retryFailed": True})
    assert r.status_code == 202 and r.json()["draining"] is True, r.text
    stored = assert_stored_once(fresh_db_dsn, secret, set(ids))
    cipher = PayloadCipher(KEY)
    by_id = {m.message_id: m for m in stored}
    for mid, p in zip(ids, payloads, strict=True):
        m = by_id[mid]
        assert m.flags & FLAG_ENCRYPTED and b"4111" not in m.payload
        assert orjson.loads(cipher.decrypt(m.payload)) == p
    # the undecodable record was tried again and is failed again
    wait_for("the garbage record failed again", lambda: (
        s := spool_status(b))["failed"] == 1 and s["pending"] == 0)
    popped = pop_all(b.client, secret, 3)
    assert sorted((m["id"], m["data"]["n"]) for m in popped) == sorted(
        (mid, p["n"]) for mid, p in zip(ids, payloads, strict=True))
