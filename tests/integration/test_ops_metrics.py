"""The two dashboard metrics that no request path sets: the DLQ depth gauge (one of the
per-queue gauges shard 0 computes, shards/queuegauges.py) and the shard restart counter (set by
the supervisor)."""

from __future__ import annotations

import os
import signal
import time

from tests.integration.test_push_json import uq


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def _wait_for(fetch, until: float):
    while True:
        value = fetch()
        if value is not None or time.monotonic() > until:
            return value
        time.sleep(0.3)


def test_dlq_depth_gauge_and_shard_restarts(make_broker, db_dsn, db):
    b = make_broker(db_dsn, QUEEN_HOUSEKEEPING_S="1", QUEEN_METRICS_QUEUE_S="1")
    q = uq("dq")
    assert b.client.post("/api/v1/push", json={"items": [
        {"queue": q, "transactionId": "p1", "payload": 1}]}).status_code == 201
    m = b.client.get(f"/api/v1/pop/queue/{q}").json()["messages"][0]
    r = b.client.post("/api/v1/ack", json={"transactionId": "p1", "partitionId": m["partitionId"],
                                            "leaseId": m["leaseId"], "status": "dlq"})
    assert r.json()[0]["dlq"] is True

    def depth() -> float | None:
        text = b.client.get("/metrics/prometheus").text
        return _sample(text, "queen_dlq_depth", queue=q)

    assert _wait_for(depth, time.monotonic() + 15) == 1.0

    victim = b.shard_pids()[0]
    os.kill(victim, signal.SIGKILL)

    def restarts() -> float | None:
        value = _sample(b.client.get("/metrics/prometheus").text, "queen_shard_restarts_total")
        return value if value else None

    assert _wait_for(restarts, time.monotonic() + 20) == 1.0
    b.wait_healthy()


def test_instance_identity_in_metrics(make_broker, db_dsn):
    b = make_broker(db_dsn, QUEEN_INSTANCE_ID="edge-7")
    text = b.client.get("/metrics/prometheus").text
    assert _sample(text, "queen_instance_info", instance_id="edge-7") == 1.0
