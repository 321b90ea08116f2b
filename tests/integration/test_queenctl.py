"""``queenctl`` against a real broker: tables, ``--json``, error lines and exit codes.

Exit codes under test (queen_mp/processes/queenctl.py): 0 ok, 1 error answer or unhealthy, 2 usage,
3 unreachable, 4 not found. The commands run in-process through click's ``CliRunner`` (one runs
as a real subprocess, the console entry point). Every command is checked against the broker's
real routes, including the admin ones of api.md 5 (maintenance, spool, resources) and
configure (2.7); maintenance runs on a private broker and database, since its flags are shared
through PostgreSQL by every instance.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from queen_mp.processes.queenctl import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    main,
    parse_value,
    table,
)
from tests.brokerharness import free_port
from tests.pgharness import REPO_ROOT


# ---------------------------------------------------------------------------------- helpers
def uq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def ctl(url: str, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, ["--url", url, "--timeout", "30", *args], input=input,
                              catch_exceptions=False)


def ctl_json(url: str, *args: str) -> Any:
    r = ctl(url, "--json", *args)
    assert r.exit_code == EXIT_OK, (r.exit_code, r.stdout, r.stderr)
    return json.loads(r.stdout)


def push(client: httpx.Client, queue: str, n: int) -> list[dict]:
    items = [{"queue": queue, "payload": {"n": i}} for i in range(n)]
    r = client.post("/api/v1/push", json={"items": items})
    assert r.status_code == 201, r.text
    return r.json()


def pop(client: httpx.Client, queue: str, group: str | None = None, batch: int = 1) -> dict:
    params = {"batch": str(batch)}
    if group is not None:
        params["consumerGroup"] = group
    r = client.get(f"/api/v1/pop/queue/{queue}", params=params)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def ack(client: httpx.Client, m: dict, status: str, error: str | None = None) -> dict:
    r = client.post("/api/v1/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": status,
        "error": error, "leaseId": m["leaseId"], "consumerGroup": m["consumerGroup"]})
    assert r.status_code == 200, r.text
    return r.json()[0]


def assert_no_route(r: Result) -> None:
    assert r.exit_code == EXIT_NOT_FOUND, (r.exit_code, r.stdout, r.stderr)
    assert r.stderr.startswith("error: not_found: no route for "), r.stderr


# ------------------------------------------------------------------------- pure functions
@pytest.mark.parametrize(("raw", "value"), [
    ("30", 30), ("-2", -2), ("0", 0), ("true", True), ("False", False), ("yes", True),
    ("off", False), ("null", None), ("1.5", 1.5), ("orders", "orders"), ('"30"', "30"),
    ("[1, 2]", [1, 2]), ("", ""), ("1e3", 1000.0), ("0x10", "0x10")])
def test_parse_value(raw, value):
    got = parse_value(raw)
    assert got == value and type(got) is type(value)


def test_table_aligns_columns():
    text = table(["NAME", "N"], [["a", 1], ["long-name", 22], ["b", None]])
    assert text.splitlines() == ["NAME        N", "a           1", "long-name  22", "b           -"]


def test_usage_errors_exit_2():
    url = "http://127.0.0.1:9"
    for args in (["groups", "seek", "g", "q"], ["groups", "seek", "g", "q", "--end",
                                                "--beginning"],
                 ["nope"], ["dlq", "retry", "17"], ["queues", "configure", "q", "--set", "x"],
                 ["--timeout", "0", "health"]):
        r = ctl(url, *args)
        assert r.exit_code == EXIT_USAGE, (args, r.exit_code, r.output)


def test_help_everywhere():
    for args in ([], ["health"], ["maintenance"], ["maintenance", "on"], ["spool", "drain"],
                 ["queues", "configure"], ["dlq", "list"], ["dlq", "retry"],
                 ["groups", "seek"]):
        r = CliRunner().invoke(main, [*args, "--help"])
        assert r.exit_code == 0, (args, r.output)
        assert "Exit codes:" in r.output and "4  not found (404)" in r.output, args


# ---------------------------------------------------------------------------------- health
def test_health(broker):
    r = ctl(broker.url, "health")
    assert r.exit_code == EXIT_OK, r.output
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines()
                 if not line.startswith("pop "))
    assert lines["status"] == "healthy"
    assert lines["database"].startswith("connected")
    assert lines["shards"] == "2/2"
    assert lines["version"] == "0.1.0"
    body = ctl_json(broker.url, "health")
    assert body["status"] == "healthy" and body["shards"] == {"alive": 2, "total": 2}


def test_health_console_script_and_token(broker):
    """The installed entry point, a trailing slash on the URL, a token (ignored: auth off)."""
    r = subprocess.run([sys.executable, "-m", "queen_mp.processes.queenctl",
                        "--url", broker.url + "/", "--token", "abc", "health", "--wait", "5"],
                       capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    assert r.returncode == EXIT_OK, (r.stdout, r.stderr)
    assert "healthy" in r.stdout


def test_unreachable_exit_3():
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["health"], ["groups", "list"], ["dlq", "list"], ["--json", "health"]):
        r = ctl(url, *args)
        assert r.exit_code == EXIT_UNREACHABLE, (args, r.output)
        assert r.stderr.startswith(f"error: unreachable: broker unreachable at {url}"), r.stderr
        assert r.stdout == ""
    r = ctl(url, "health", "--wait", "1")
    assert r.exit_code == EXIT_UNREACHABLE


def test_unknown_route_is_exit_4_with_error_line(broker):
    """A URL pointing below the API root: every route is unknown there."""
    r = ctl(broker.url + "/nowhere", "groups", "list")
    assert_no_route(r)
    r = ctl(broker.url + "/nowhere", "--json", "groups", "list")
    assert r.exit_code == EXIT_NOT_FOUND
    assert json.loads(r.stdout)["code"] == "not_found"


# ---------------------------------------------------------------------------------- groups
def test_groups_list_show_lag_seek(broker):
    q, g = uq("ctl-g"), uq("grp")
    push(broker.client, q, 3)
    got = pop(broker.client, q, g)
    assert ack(broker.client, got["messages"][0], "completed")["success"]

    r = ctl(broker.url, "groups", "list")
    assert r.exit_code == EXIT_OK, r.output
    header, *rows = r.stdout.splitlines()
    assert header.split() == ["GROUP", "QUEUE", "STATE", "MEMBERS", "PARTITIONS", "LAGGING",
                              "TOTAL_LAG", "MAX_TIME_LAG_S", "MODE"]
    (mine,) = [line.split() for line in rows if line.startswith(g + " ")]
    assert mine[:3] == [g, q, "Stable"] and mine[6] == "2", mine
    listed = ctl_json(broker.url, "groups", "list")
    assert any(x["name"] == g and x["queueName"] == q and x["totalLag"] == 2 for x in listed)

    r = ctl(broker.url, "groups", "show", g)
    assert r.exit_code == EXIT_OK, r.output
    (row,) = [line.split() for line in r.stdout.splitlines()[1:]]
    assert row[0] == q and row[1] == "Default" and row[3:6] == ["1", "3", "2"], row
    assert ctl(broker.url, "groups", "show", uq("nogroup")).exit_code == EXIT_NOT_FOUND

    lag = ctl_json(broker.url, "groups", "lag", "--min-seconds", "0")
    (mine_lag,) = [x for x in lag if x["consumerGroup"] == g]
    assert mine_lag["queueName"] == q and mine_lag["offsetLag"] == 2
    r = ctl(broker.url, "groups", "lag", "--min-seconds", "0")
    assert r.exit_code == EXIT_OK
    assert r.stdout.splitlines()[0].split()[:5] == ["GROUP", "QUEUE", "PARTITION",
                                                     "PARTITION_ID", "OFFSET_LAG"]
    assert any(line.split()[:2] == [g, q] for line in r.stdout.splitlines())
    r = ctl(broker.url, "groups", "lag", "--min-seconds", "999999")
    assert r.exit_code == EXIT_OK
    assert g not in r.stdout

    def committed() -> int:
        (part,) = ctl_json(broker.url, "groups", "show", g)[q]["partitions"]
        return part["committedOffset"]

    r = ctl(broker.url, "groups", "seek", g, q, "--beginning")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.strip() == f"group {g} on {q}: 1 partition(s) moved to beginning"
    assert committed() == 0
    body = ctl_json(broker.url, "groups", "seek", g, q, "--end")
    assert body["success"] and body["target"] == "end" and body["partitionsUpdated"] == 1
    assert committed() == 3
    earlier = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    r = ctl(broker.url, "groups", "seek", g, q, "--timestamp", earlier)
    assert r.exit_code == EXIT_OK, r.output
    assert "moved to timestamp" in r.stdout
    assert committed() == 0

    r = ctl(broker.url, "groups", "seek", g, uq("noqueue"), "--end")
    assert r.exit_code == EXIT_NOT_FOUND
    assert r.stderr.startswith("error: not_found: queue "), r.stderr
    r = ctl(broker.url, "groups", "seek", g, q, "--timestamp", "yesterday")
    assert r.exit_code == EXIT_ERROR
    assert r.stderr.startswith("error: invalid_request: "), r.stderr
    assert "(field=timestamp)" in r.stderr


# ------------------------------------------------------------------------------------- dlq
def test_dlq_list_retry_delete(broker, db):
    q = uq("ctl-dlq")
    r = ctl(broker.url, "dlq", "list", "--queue", q)
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.strip() == "no dead-letter rows (total 0)"
    assert ctl_json(broker.url, "dlq", "list", "--queue", q)["total"] == 0

    pushed = push(broker.client, q, 2)
    db.execute("UPDATE queen.queues SET retry_limit = 0 WHERE name = %s", (q,))
    for _ in range(2):  # retry_limit 0: the first failed ack files the DLQ row
        (m,) = pop(broker.client, q)["messages"]
        item = ack(broker.client, m, "failed", "boom: bad input")
        assert item["success"] and item["dlq"], item

    r = ctl(broker.url, "dlq", "list", "--queue", q)
    assert r.exit_code == EXIT_OK, r.output
    header, *rows, footer = r.stdout.splitlines()
    assert header.split()[:7] == ["FAILED_AT", "QUEUE", "PARTITION", "PARTITION_ID", "OFFSET",
                                  "GROUP", "TRANSACTION_ID"]
    assert len(rows) == 2 and footer == "(2 of 2 rows, offset 0)"
    for row, p in zip(rows, pushed, strict=True):
        assert p["transactionId"] in row and "boom: bad input" in row and "__QUEUE_MODE__" in row
    body = ctl_json(broker.url, "dlq", "list", "--queue", q, "--limit", "1", "--offset", "1")
    assert body["total"] == 2 and body["pagination"] == {"limit": 1, "offset": 1}
    assert [m["transactionId"] for m in body["messages"]] == [pushed[1]["transactionId"]]
    assert ctl_json(broker.url, "dlq", "list", "--queue", q, "--group", "other")["total"] == 0
    assert ctl_json(broker.url, "dlq", "list", "--queue", q,
                    "--partition", "Default")["total"] == 2

    first, second = pushed
    r = ctl(broker.url, "dlq", "retry", first["partitionId"], first["transactionId"])
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.startswith("retried 1 row(s): new message ") and "at offset 3" in r.stdout
    r = ctl(broker.url, "dlq", "retry", first["partitionId"], first["transactionId"])
    assert r.exit_code == EXIT_NOT_FOUND, r.output
    assert r.stderr.startswith("error: not_found: "), r.stderr

    r = ctl(broker.url, "dlq", "delete", second["partitionId"], second["transactionId"],
            "--group", "other")
    assert r.exit_code == EXIT_NOT_FOUND, r.output
    body = ctl_json(broker.url, "dlq", "delete", second["partitionId"], second["transactionId"],
                    "--group", "__QUEUE_MODE__")
    assert body["success"] and body["deleted"] == 1
    r = ctl(broker.url, "dlq", "delete", second["partitionId"], second["transactionId"])
    assert r.exit_code == EXIT_NOT_FOUND, r.output
    assert ctl_json(broker.url, "dlq", "list", "--queue", q)["total"] == 0


# --------------------------------------------------------------- admin routes (api.md 5)
def test_maintenance_and_spool(make_broker, fresh_db_dsn):
    b = make_broker(fresh_db_dsn)
    status = ctl_json(b.url, "maintenance", "status")
    assert status["maintenanceMode"] is False and status["popMaintenanceMode"] is False
    assert status["spool"]["pending"] == 0
    r = ctl(b.url, "maintenance", "status")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.splitlines()[0].split() == ["maintenanceMode", "no"]
    assert "spool.pending" in r.stdout

    r = ctl(b.url, "maintenance", "on")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.splitlines()[0].split() == ["maintenanceMode", "yes"]
    try:
        assert ctl_json(b.url, "maintenance", "status")["maintenanceMode"] is True
        assert ctl_json(b.url, "health")["maintenanceMode"] is True
        r = ctl(b.url, "spool", "drain")  # 409 during maintenance
        assert r.exit_code == EXIT_ERROR, r.output
        assert r.stderr.startswith("error: conflict: "), r.stderr
    finally:
        off = ctl_json(b.url, "maintenance", "off")
    assert off["maintenanceMode"] is False
    assert ctl_json(b.url, "maintenance", "status")["maintenanceMode"] is False

    assert ctl_json(b.url, "maintenance", "on", "--pop")["popMaintenanceMode"] is True
    try:
        assert ctl_json(b.url, "maintenance", "status", "--pop")["popMaintenanceMode"] is True
        assert ctl_json(b.url, "maintenance", "status")["popMaintenanceMode"] is True
    finally:
        r = ctl(b.url, "maintenance", "off", "--pop")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.splitlines()[0].split() == ["popMaintenanceMode", "no"]

    body = ctl_json(b.url, "spool", "status")
    assert body["pending"] == 0 and body["failed"] == 0 and body["dbHealthy"] is True
    r = ctl(b.url, "spool", "status")
    assert r.exit_code == EXIT_OK, r.output
    assert ["pending", "0"] in [line.split() for line in r.stdout.splitlines()]
    body = ctl_json(b.url, "spool", "drain", "--retry-failed")
    assert body["draining"] is True
    r = ctl(b.url, "spool", "drain")
    assert r.exit_code == EXIT_OK, r.output
    assert ["draining", "yes"] in [line.split() for line in r.stdout.splitlines()]


def test_queues_configure(broker, db):
    q = f"{uq('ctl')}.t1.orders"
    r = ctl(broker.url, "queues", "configure", q, "--set", "leaseTime=30",
            "--set", "retryLimit=2", "--set", "deadLetterQueue=false", "--set", "frobnicate=x")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.startswith(f"created queue {q} ")
    assert ["leaseTime", "30"] in [line.split() for line in r.stdout.splitlines()]
    assert "warning: unknown options ignored: frobnicate" in r.stderr
    row = db.execute("SELECT lease_time, retry_limit, dead_letter_queue, namespace, task "
                     "FROM queen.queues WHERE name = %s", (q,)).fetchone()
    assert row == (30, 2, False, q.split(".")[0], "t1")
    body = ctl_json(broker.url, "queues", "configure", q, "--set", "retryLimit=5")
    assert body["configured"] and not body["created"]
    assert body["options"]["retryLimit"] == 5 and body["options"]["leaseTime"] == 30
    assert body["options"]["deadLetterQueue"] is False
    r = ctl(broker.url, "queues", "configure", q, "--set", "leaseTime=-1")
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.stderr.startswith("error: invalid_request: ") and "(field=leaseTime)" in r.stderr
    r = ctl(broker.url, "queues", "configure", q, "--set", "leaseTime=abc")
    assert r.exit_code == EXIT_ERROR, r.output


def test_queues_list_show_delete(broker):
    ns = uq("ctlns")
    q = f"{ns}.t1.orders"
    push(broker.client, q, 2)
    r = ctl(broker.url, "queues", "list", "--namespace", ns)
    assert r.exit_code == EXIT_OK, r.output
    header, *rows = r.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "NAMESPACE", "TASK"]
    assert [line.split()[:3] for line in rows] == [[q, ns, "t1"]]
    body = ctl_json(broker.url, "queues", "list", "--namespace", ns, "--task", "t1")
    assert [x["name"] for x in body["queues"]] == [q] and body["total"] == 1
    r = ctl(broker.url, "queues", "list", "--namespace", ns, "--task", "zz")
    assert r.exit_code == EXIT_OK and r.stdout.strip() == "no queues"

    r = ctl(broker.url, "queues", "show", q)
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.splitlines()[0].split() == ["name", q]
    assert "leaseTime" in r.stdout and "Default" in r.stdout
    shown = ctl_json(broker.url, "queues", "show", q)
    assert shown["name"] == q and [p["name"] for p in shown["partitions"]] == ["Default"]
    assert shown["partitions"][0]["lastOffset"] == 2

    r = ctl(broker.url, "queues", "delete", q, input="n\n")
    assert r.exit_code == EXIT_ERROR  # declined: aborted, nothing deleted
    assert ctl(broker.url, "queues", "show", q).exit_code == EXIT_OK
    r = ctl(broker.url, "queues", "delete", q, input="y\n")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.strip() == f"deleted queue {q}"
    r = ctl(broker.url, "queues", "show", q)
    assert r.exit_code == EXIT_NOT_FOUND
    assert r.stderr.startswith("error: not_found: "), r.stderr
    r = ctl(broker.url, "queues", "delete", q, "--yes")
    assert r.exit_code == EXIT_OK
    assert r.stdout.strip() == f"queue {q} did not exist"
