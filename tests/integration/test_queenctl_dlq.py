"""``queenctl dlq retry|delete`` by filter against a real broker (docs/api.md 2.8): the listing's
filters, ``--all``, the confirmation, ``--batch`` calls repeated until no row is left,
``--once``, ``--json`` sums, and the usage errors that send nothing (exit 2).

The shared broker serves the filtered forms (unique queue names keep them apart from other
tests' rows); ``--all`` runs on a broker with JWT on, under a tenant of its own, so it can
only reach this test's rows.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from queen_mp.processes.queenctl import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from tests.integration.authkit import bearer, start_auth_broker, token
from tests.integration.test_queenctl import ctl, ctl_json, uq
from tests.integration.test_queenctl_data import as_role, fetch


def dead_letters(c: httpx.Client, queue: str, partitions: list[str]) -> list[str]:
    """One dead letter per entry of ``partitions`` (retryLimit 0: the first failed ack files
    it); their transactionIds, in the order they failed."""
    r = c.post("/api/v1/configure", json={"queue": queue, "options": {"retryLimit": 0}})
    assert r.status_code == 200, r.text
    txns = [f"{queue}-{i}" for i in range(len(partitions))]
    r = c.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": p, "transactionId": t, "payload": {"n": i}}
        for i, (p, t) in enumerate(zip(partitions, txns, strict=True))]})
    assert r.status_code == 201, r.text
    failed = []
    for _ in partitions:
        r = c.get(f"/api/v1/pop/queue/{queue}", params={"wait": "false"})
        assert r.status_code == 200, r.text
        (m,) = r.json()["messages"]
        r = c.post("/api/v1/ack", json={
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "status": "failed", "error": "poison"})
        assert r.status_code == 200 and r.json()[0]["dlq"] is True, r.text
        failed.append(m["transactionId"])
    assert sorted(failed) == sorted(txns)
    return failed


def dlq_total(c: httpx.Client, **filters: str) -> int:
    r = c.get("/api/v1/dlq", params=filters)
    assert r.status_code == 200, r.text
    return r.json()["total"]


def test_usage_errors_send_nothing():
    url = "http://127.0.0.1:9"  # nothing listens: a request would be exit 3, not 2
    for verb in ("retry", "delete"):
        for args in ([], ["17"], ["17", "t-1", "--queue", "q"], ["17", "t-1", "--all"],
                     ["17", "t-1", "--once"], ["17", "t-1", "--batch", "5"],
                     ["--queue", "q", "--batch", "1001"], ["--queue", "q", "--batch", "0"]):
            r = ctl(url, "dlq", verb, *args)
            assert r.exit_code == EXIT_USAGE, (verb, args, r.exit_code, r.output)
    r = ctl(url, "dlq", "delete")
    assert "--all for every dead-letter row" in r.stderr, r.stderr


def test_delete_by_filter_asks_first_and_keeps_other_rows(broker):
    c = broker.client
    q, other = uq("ctl-bulk-del"), uq("ctl-bulk-keep")
    dead_letters(c, q, ["a", "a", "a", "b", "b"])
    dead_letters(c, other, ["a"])
    r = ctl(broker.url, "dlq", "delete", "--queue", q, "--partition", "b", input="n\n")
    assert r.exit_code == EXIT_ERROR, r.output  # aborted
    assert f"Delete 2 dead-letter row(s) matching queue={q}, partition=b?" in r.stderr
    assert dlq_total(c, queue=q) == 5
    r = ctl(broker.url, "dlq", "delete", "--queue", q, "--partition", "b", input="y\n")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.strip() == "deleted 2 dead-letter row(s) in 1 call(s); 0 row(s) still match"
    assert (dlq_total(c, queue=q, partition="a"), dlq_total(c, queue=q, partition="b")) == (3, 0)
    # a group that has no row: nothing matches, nothing is asked, nothing deleted
    body = ctl_json(broker.url, "dlq", "delete", "--queue", q, "--group", "nobody")
    assert body == {"success": True, "calls": 1, "deleted": 0, "remaining": 0}
    assert dlq_total(c, queue=q) == 3 and dlq_total(c, queue=other) == 1


def test_retry_by_filter_loops_in_batches_until_none_is_left(broker):
    c = broker.client
    q = uq("ctl-bulk-retry")
    dead_letters(c, q, ["p1", "p2", "p1", "p2", "p1"])
    body = ctl_json(broker.url, "dlq", "retry", "--queue", q, "--batch", "2", "--yes")
    assert body == {"success": True, "calls": 3, "replayed": 5, "retried": 5, "skipped": 0,
                    "remaining": 0}
    assert dlq_total(c, queue=q) == 0
    # the five payloads are back, each at the tail of its partition
    p1, p2 = fetch(c, q, "p1"), fetch(c, q, "p2")
    assert [x["payload"]["n"] for x in p1[:3]] == [0, 2, 4]
    assert sorted(x["payload"]["n"] for x in p1[3:]) == [0, 2, 4]
    assert [x["payload"]["n"] for x in p2[:2]] == [1, 3]
    assert sorted(x["payload"]["n"] for x in p2[2:]) == [1, 3]


def test_once_stops_after_one_call_and_says_what_is_left(broker):
    c = broker.client
    q = uq("ctl-bulk-once")
    dead_letters(c, q, ["Default"] * 3)
    r = ctl(broker.url, "dlq", "retry", "--queue", q, "--batch", "1", "--once", "--yes")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.strip() == ("replayed 1 message(s), 1 dead-letter row(s), in 1 call(s); "
                                "2 row(s) still match")
    assert r.stderr.strip() == (f"note: 2 dead-letter row(s) matching queue={q} remain: run "
                                "again (without --once: until none is left)")
    assert dlq_total(c, queue=q) == 2
    r = ctl(broker.url, "dlq", "delete", "--queue", q, "--yes")
    assert r.exit_code == EXIT_OK and r.stderr == "", r.output
    assert dlq_total(c, queue=q) == 0


def test_a_from_after_to_is_the_brokers_400(broker):
    r = ctl(broker.url, "dlq", "delete", "--queue", uq("ctl-bulk-range"), "--yes",
            "--from", "2026-05-02T00:00:00Z", "--to", "2026-05-01T00:00:00Z")
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.stderr.startswith("error: invalid_request: 'from' must not be after 'to'"), r.stderr


def test_all_acts_on_every_row_of_the_tenant_only(db_dsn, tmp_path):
    b = start_auth_broker(tmp_path, db_dsn)
    mine, theirs = "ctl-all-" + uuid.uuid4().hex[:8], "ctl-all-" + uuid.uuid4().hex[:8]
    clients: dict[str, httpx.Client] = {
        t: httpx.Client(base_url=b.url, timeout=30, headers=bearer(token("read-write", tenant=t)))
        for t in (mine, theirs)}
    try:
        dead_letters(clients[mine], "orders", ["a", "b"])
        dead_letters(clients[mine], "payments", ["a"])
        dead_letters(clients[theirs], "orders", ["a"])
        r = as_role(b, "read-only", "dlq", "retry", "--all", "--yes", tenant=mine)
        assert r.exit_code == EXIT_ERROR and r.stderr.startswith("error: forbidden: "), r.output
        r = as_role(b, "read-write", "dlq", "delete", "--all", "--yes", "--json", tenant=mine)
        assert r.exit_code == EXIT_OK, r.output
        body: Any = json.loads(r.stdout)
        assert body == {"success": True, "calls": 1, "deleted": 3, "remaining": 0}
        assert dlq_total(clients[mine]) == 0
        assert dlq_total(clients[theirs]) == 1
    finally:
        for cl in clients.values():
            cl.close()
        assert b.stop() == 0, b.log()[-4000:]
