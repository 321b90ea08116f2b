"""Admission at the edge (api.md 1.4, 1.8) against a real broker: 429 under a flood of big
pushes with nothing half-done, 507 above the disk high-water mark with nothing written, and
pops, GETs and acks never held back by the write budget."""

from __future__ import annotations

import concurrent.futures as cf
import re
import threading
import time

import httpx
import orjson
import pytest

from queen_mp.http.admission import disk_used_pct
from tests.integration.test_push_json import PUSH, assert_nothing_stored, stored_messages, uq

pytestmark = pytest.mark.timeout(300)

TXN = "/api/v1/transaction"
ITEMS = 32
PAYLOAD = "x" * (256 << 10)  # 32 x 256 KiB: an 8 MiB body
PARTITIONS = 8  # 1 MiB per partition group: one group must fit a QUEEN_RING_KB ring record
CLIENTS = 40


def big_body(queue: str) -> bytes:
    items = [{"queue": queue, "partition": f"p{i % PARTITIONS}", "transactionId": f"{queue}-{i}",
              "payload": {"i": i, "pad": PAYLOAD}} for i in range(ITEMS)]
    return orjson.dumps({"items": items})


def stored_count(db, queue: str) -> int:
    row = db.execute(
        "SELECT COALESCE(sum(lp.last_offset), 0) FROM queen.log_partitions lp"
        " JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s", (queue,)).fetchone()
    return int(row[0])


def assert_overloaded(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text[:300]
    body = r.json()
    assert body["code"] == "overloaded" and isinstance(body["error"], str) and body["error"]
    assert re.fullmatch(r"[1-5]", r.headers["Retry-After"]), r.headers["Retry-After"]
    assert body["retryAfter"] == int(r.headers["Retry-After"])
    assert r.headers["Access-Control-Allow-Origin"] == "*"  # the edge still saw it


def prometheus_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_flood_of_big_pushes_gets_429_and_nothing_half_done(make_broker, db_dsn, db):
    # one front worker, no hold: whatever does not fit in the 128 MiB budget at once is 429
    b = make_broker(db_dsn, QUEEN_ADMIT_MAX_MB="128", QUEEN_ADMIT_HOLD_MS="0",
                    QUEEN_WORKERS="1")
    qpop = uq("adm-pop")
    r = b.client.post(PUSH, json={"items": [{"queue": qpop, "payload": {"n": 1}}]})
    assert r.status_code == 201, r.text
    queues = [uq("adm-flood") for _ in range(CLIENTS)]
    bodies = [big_body(q) for q in queues]
    assert all(8 << 20 <= len(x) < 9 << 20 for x in bodies)

    barrier = threading.Barrier(CLIENTS)
    started, flooding = threading.Event(), threading.Event()
    flooding.set()

    def push(i: int) -> httpx.Response:
        with httpx.Client(base_url=b.url, timeout=120) as c:
            barrier.wait()
            started.set()
            return c.post(PUSH, content=bodies[i],
                          headers={"Content-Type": "application/json"})

    side: list[tuple[str, int, bool]] = []

    def side_traffic() -> None:
        """Pops and GETs while the flood runs: none of them waits for write permits."""
        with httpx.Client(base_url=b.url, timeout=60) as c:
            while True:
                before = started.is_set() and flooding.is_set()
                r = c.get(f"/api/v1/pop/queue/{qpop}", params={"batch": "1", "wait": "false"})
                side.append(("pop", r.status_code, before and flooding.is_set()))
                r = c.get("/health")
                side.append(("health", r.status_code, before and flooding.is_set()))
                if not flooding.is_set():
                    return
                time.sleep(0.02)

    with cf.ThreadPoolExecutor(CLIENTS + 1) as ex:
        watcher = ex.submit(side_traffic)
        futures = [ex.submit(push, i) for i in range(CLIENTS)]
        answers = [f.result() for f in futures]
        flooding.clear()
        watcher.result()

    statuses = [r.status_code for r in answers]
    odd = [r.text[:200] for r in answers if r.status_code not in (201, 429)]
    assert set(statuses) <= {201, 429}, odd
    print("admission flood:", {s: statuses.count(s) for s in set(statuses)}, len(side))
    assert statuses.count(429) >= 1, statuses
    assert statuses.count(201) >= 1, statuses
    for q, r in zip(queues, answers, strict=True):
        if r.status_code == 201:
            results = r.json()
            assert len(results) == ITEMS and {x["status"] for x in results} == {"queued"}
            assert stored_count(db, q) == ITEMS, q
            stored = stored_messages(db, q)
            assert sorted(m.transaction_id for m in stored) == sorted(
                f"{q}-{i}" for i in range(ITEMS))
            assert all(len(m.payload) > len(PAYLOAD) for m in stored)
        else:
            assert_overloaded(r)
            assert_nothing_stored(db, q)

    # pops and GETs during the flood: served, never 429
    assert side and all(s in (200, 204) for _, s, _ in side), side
    assert any(during for _, _, during in side), "no side request overlapped the flood"
    assert ("pop", 200) in {(k, s) for k, s, _ in side}

    # healthy afterwards: a refused body goes through on retry, the counters saw it all
    assert b.client.get("/health").status_code == 200
    i = statuses.index(429)
    r = b.client.post(PUSH, content=bodies[i], headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text[:300]
    assert stored_count(db, queues[i]) == ITEMS
    metrics = b.client.get("/metrics/prometheus").text
    rejected = prometheus_value(metrics, "queen_admission_rejected_total", code="overloaded")
    assert rejected == statuses.count(429)
    assert prometheus_value(metrics, "queen_http_requests_total", route=PUSH,
                            status="429") == statuses.count(429)
    assert prometheus_value(metrics, "queen_admission_bytes") == 0
    log = b.log()
    assert "unhandled error on" not in log and "http/admission.py" not in log


def test_disk_above_high_water_is_507_and_nothing_is_written(make_broker, db_dsn, db, tmp_path):
    assert disk_used_pct([tmp_path]) > 1, "the test needs a filesystem more than 1% used"
    b = make_broker(db_dsn, QUEEN_DISK_HIGH_PCT="1")
    qa, qb, qc = uq("adm-full"), uq("adm-full"), uq("adm-full")

    r = b.client.post(PUSH, json={"items": [{"queue": qa, "payload": {"n": 1}}]})
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "storage_full" and "1%" in r.json()["error"]
    assert r.headers["Access-Control-Allow-Origin"] == "*"

    r = b.client.post(TXN, json={"operations": [
        {"type": "push", "items": [{"queue": qb, "transactionId": "t1", "payload": {}}]}]})
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "storage_full"

    # binary push too: refused before its body is read
    r = b.client.post(PUSH, content=b"QPB1" + b"\0" * 64,
                      headers={"Content-Type": "application/x-queen-push"})
    assert r.status_code == 507, r.text

    time.sleep(1.1)  # past the 1 s disk sample: still full
    r = b.client.post(PUSH, json={"items": [{"queue": qc, "payload": {"n": 1}}]})
    assert r.status_code == 507, r.text
    assert_nothing_stored(db, qa, qb, qc)

    # reads are not refused; neither are KV writes (api.md 1.8 names push and transaction)
    assert b.client.get("/health").status_code == 200
    r = b.client.get(f"/api/v1/pop/queue/{qa}", params={"wait": "false"})
    assert r.status_code in (204, 404), r.text
    r = b.client.post("/api/v1/kv", json={"operations": [
        {"op": "put", "ns": "adm", "key": uq("k"), "value": {"v": 1}, "ttlSeconds": 60}]})
    assert r.status_code == 200, r.text
    metrics = b.client.get("/metrics/prometheus").text
    assert prometheus_value(metrics, "queen_admission_rejected_total",
                            code="storage_full") == 4
