"""Observability with nothing blank (issue 28): a fresh broker's first scrape carries every
metric the Grafana dashboard and the alert rules query; the per-queue gauges (depth, oldest
unconsumed age, lag per group, DLQ depth) are exact, bounded by QUEEN_METRICS_QUEUE_CAP with an
"(other)" bucket, and never name another tenant's queue; the pool gauges add up over the front
workers; statement timeouts, cancels and quarantines are reported by the db layer."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from queen_mp.db import errors as dberrors
from queen_mp.db.connect import Dedicated
from queen_mp.metrics import OTHER_QUEUES_LABEL, OTHER_TENANTS_LABEL
from tests.integration.test_push_json import uq
from tests.unit.test_ops_files import expressions, load_dashboard

ALERTS = Path(__file__).resolve().parents[2] / "ops" / "prometheus" / "alerts.yml"
_NAME = re.compile(r"\b(queen_[a-zA-Z0-9_]+)\b")


def scrape(client) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value}."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    text = client.get("/metrics/prometheus").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def queried_names() -> set[str]:
    names = {n for _, expr, _ in expressions(load_dashboard()) for n in _NAME.findall(expr)}
    rules = [line.split(":", 1)[1] for line in ALERTS.read_text().splitlines()
             if line.strip().startswith("expr:")]
    assert rules, "no alert expressions found"
    return names | {n for expr in rules for n in _NAME.findall(expr)}


def test_a_fresh_broker_exports_every_queried_metric_from_the_first_scrape(
        make_broker, fresh_db_dsn):
    b = make_broker(fresh_db_dsn)
    got = scrape(b.client)  # the first scrape: no push, no pop, no housekeeping round yet
    names = queried_names()
    missing = sorted(n for n in names if n not in got)
    assert not missing, f"blank on a fresh broker: {missing}"
    # the four the issue named, at zero for their known label values
    assert got["queen_ack_registry_lookups_total"][(("result", "hit"),)] == 0
    assert got["queen_ack_registry_lookups_total"][(("result", "miss"),)] == 0
    assert got["queen_dedup_read_backs_total"][(("result", "failed"),)] == 0
    assert got["queen_dedup_sql_probes_total"][()] == 0
    assert got["queen_fusion_bundle_errors_total"][(("reason", "StatementTimeout"),)] == 0
    assert got["queen_dlq_depth"][(("queue", OTHER_QUEUES_LABEL),)] == 0
    assert got["queen_consumer_lag_seconds"][
        (("group", OTHER_QUEUES_LABEL), ("queue", OTHER_QUEUES_LABEL))] == 0
    for kind in ("push", "pop"):
        assert got["queen_maintenance_mode"][(("kind", kind),)] == 0
    # the pool gauges add up over both front workers (QUEEN_PG_POOL_SIZE 8 each)
    assert got["queen_pg_pool_max"][()] == 16
    assert got["queen_pg_pool_waiting"][()] == 0
    assert (("state", "in_use"),) in got["queen_pg_pool_connections"]
    assert got["queen_pg_statement_timeouts_total"][()] == 0
    assert 0 < got["queen_disk_used_percent"][()] <= 100
    assert got["queen_disk_high_percent"][()] == 85


def _wait_snapshot(client, after: float, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        got = scrape(client)
        if got["queen_queue_gauges_timestamp_seconds"][()] > after:
            return got
        assert time.monotonic() < deadline, "no per-queue snapshot after the changes"
        time.sleep(0.3)


def _push(client, q: str, n: int) -> None:
    r = client.post("/api/v1/push", json={"items": [
        {"queue": q, "payload": {"i": i}, "transactionId": f"{q}-{i}"} for i in range(n)]})
    assert r.status_code == 201, r.text


def test_per_queue_gauges_are_exact_capped_and_tenant_blind(make_broker, fresh_db_dsn):
    b = make_broker(fresh_db_dsn, QUEEN_METRICS_QUEUE_S="1", QUEEN_METRICS_QUEUE_CAP="2")
    c = b.client
    big, lagged, dead, small, secret = (uq("obs-big"), uq("obs-lag"), uq("obs-dlq"),
                                        uq("obs-small"), uq("obs-secret"))
    _push(c, big, 5)
    _push(c, lagged, 3)
    _push(c, dead, 1)
    _push(c, small, 1)
    _push(c, secret, 4)
    # lagged: group g1 consumed one of three
    m = c.get(f"/api/v1/pop/queue/{lagged}", params={"consumerGroup": "g1", "batch": 1}
              ).json()["messages"][0]
    r = c.post("/api/v1/ack", json={"transactionId": m["transactionId"],
                                     "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                                     "status": "completed", "consumerGroup": "g1"})
    assert r.status_code == 200, r.text
    # dead: its only message goes to the DLQ
    m = c.get(f"/api/v1/pop/queue/{dead}").json()["messages"][0]
    r = c.post("/api/v1/ack", json={"transactionId": m["transactionId"],
                                     "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                                     "status": "dlq"})
    assert r.json()[0]["dlq"] is True
    # secret: a queue of another tenant (made so directly: this broker runs without auth)
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE queen.queues SET tenant = %s WHERE name = %s",
                     (uuid.uuid4(), secret))
        rows = conn.execute("SELECT * FROM queen.queue_gauges_v1(2)").fetchall()
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT * FROM queen.queue_gauges_v1(0)")
    by = {(g, q, grp): v for g, q, grp, v in rows}
    assert all(secret not in (q, grp) for _, q, grp in by)
    # depth: big 5, secret 4 (other tenants), lagged 2, small 1, dead 0 -> cap 2 keeps big and
    # lagged; small and dead fold into (other)
    assert by[("queen_queue_depth", big, None)] == 5
    assert by[("queen_queue_depth", lagged, None)] == 2
    assert by[("queen_queue_depth", OTHER_QUEUES_LABEL, None)] == 1
    assert by[("queen_queue_depth", OTHER_TENANTS_LABEL, None)] == 4
    assert len([k for k in by if k[0] == "queen_queue_depth"]) == 4
    assert by[("queen_consumer_lag_messages", lagged, "g1")] == 2
    assert by[("queen_dlq_depth", dead, None)] == 1
    assert not any(k[0] == "queen_dlq_depth" and k[1] == big for k in by)

    time.sleep(1.2)  # the oldest unconsumed messages are now more than a second old
    got = _wait_snapshot(c, time.time())
    depth = got["queen_queue_depth"]
    assert depth[(("queue", big),)] == 5
    assert depth[(("queue", OTHER_QUEUES_LABEL),)] == 1
    assert depth[(("queue", OTHER_TENANTS_LABEL),)] == 4
    assert got["queen_dlq_depth"][(("queue", dead),)] == 1
    assert got["queen_consumer_lag_messages"][(("group", "g1"), ("queue", lagged))] == 2
    assert got["queen_consumer_lag_seconds"][(("group", "g1"), ("queue", lagged))] >= 1
    ages = got["queen_queue_oldest_unconsumed_age_seconds"]
    assert ages[(("queue", big),)] >= 1
    text = c.get("/metrics/prometheus").text
    assert secret not in text

    # the lag clears: g1 consumes the rest; the series stays, at zero
    body = c.get(f"/api/v1/pop/queue/{lagged}",
                 params={"consumerGroup": "g1", "batch": 10}).json()
    r = c.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": x["transactionId"], "partitionId": x["partitionId"],
         "leaseId": x["leaseId"], "status": "completed", "consumerGroup": "g1"}
        for x in body["messages"]]})
    assert r.status_code == 200, r.text
    got = _wait_snapshot(c, time.time())
    assert got["queen_consumer_lag_messages"][(("group", "g1"), ("queue", lagged))] == 0
    assert got["queen_consumer_lag_seconds"][(("group", "g1"), ("queue", lagged))] == 0


def test_statement_timeouts_cancels_and_quarantines_are_reported(db_dsn):
    events: list[str] = []
    dberrors.on_event(events.append)
    try:
        async def overrun() -> None:
            db = Dedicated(db_dsn, application_name="queen-mp test overrun",
                           statement_timeout_ms=300)
            try:
                with pytest.raises(dberrors.StatementTimeout):
                    await db.run(lambda conn: conn.execute("SELECT pg_sleep(5)"))
            finally:
                await db.drop()

        asyncio.run(overrun())
        assert events == ["quarantine", "cancel_sent", "statement_timeout"]
        events.clear()
        # the server's own statement_timeout (SQLSTATE 57014), met on any connection
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("SET statement_timeout = 100")
            try:
                conn.execute("SELECT pg_sleep(2)")
            except psycopg.Error as ex:
                assert isinstance(dberrors.translate(ex), dberrors.StatementTimeout)
        assert events == ["statement_timeout"]
    finally:
        dberrors.on_event(None)
