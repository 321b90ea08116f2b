"""``queenctl push``, ``messages browse|peek``, ``queues purge`` and ``top`` against a real broker,
with their ``--json`` output, error lines and exit codes (0 ok, 1 error answer, 2 usage or bad
input, 3 unreachable, 4 not found), and the roles they need under JWT auth.

``peek`` must not consume: after it a pop still gets the first message and no consumer group
appears. ``top`` runs with ``--once`` / ``--iterations`` (CliRunner's output is no terminal, so
frames follow one another without the escape codes that redraw a terminal).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pty
import re
import subprocess
import sys
import time
from collections.abc import Iterator
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
)
from queen_mp.processes.queenctl.top import CLEAR
from tests.brokerharness import Broker, free_port
from tests.integration.authkit import start_auth_broker, token
from tests.integration.test_queenctl import ack, ctl, ctl_json, pop, push, uq
from tests.pgharness import REPO_ROOT


def fetch(client: httpx.Client, queue: str, partition: str = "Default") -> list[dict]:
    r = client.post("/api/v1/fetch", json={"entries": [{"queue": queue, "partition": partition,
                                                        "offset": 0}]})
    assert r.status_code == 200, r.text
    return r.json()["entries"][0]["records"]


def rows_of(r: Result) -> list[list[str]]:
    return [line.split() for line in r.stdout.splitlines()]


# -------------------------------------------------------------------------------------- push
def test_push_arguments_files_and_stdin(broker, tmp_path):
    q = uq("ctl-push")
    r = ctl(broker.url, "push", q, '{"id": 1}')
    assert r.exit_code == EXIT_OK, (r.stdout, r.stderr)
    header, row, footer = r.stdout.splitlines()
    assert header.split()[:3] == ["STATUS", "PARTITION_ID", "OFFSET"]
    assert row.split()[0] == "queued" and row.split()[2] == "1"
    assert footer == "(1 queued)"

    got = ctl_json(broker.url, "push", q, '"text"', "42", "null", "--partition", "eu")
    assert [x["status"] for x in got] == ["queued"] * 3 and [x["offset"] for x in got] == [1, 2, 3]
    assert [m["payload"] for m in fetch(broker.client, q, "eu")] == ["text", 42, None]

    lines = tmp_path / "batch.jsonl"
    lines.write_text('{"n": 1}\n\n{"n": 2}\n[3]\n')
    got = ctl_json(broker.url, "push", q, "--file", str(lines), "--lines")
    assert [x["offset"] for x in got] == [2, 3, 4]
    whole = tmp_path / "batch.json"
    whole.write_text(json.dumps([{"n": 4}, {"n": 5}]))
    got = ctl_json(broker.url, "push", q, "--file", str(whole), "--each")
    assert [x["offset"] for x in got] == [5, 6]
    got = ctl_json(broker.url, "push", q, "--file", str(whole))  # the array is one message
    assert len(got) == 1
    r = CliRunner().invoke(main, ["--url", broker.url, "--json", "push", q, "-f", "-",
                                  "--lines"], input='{"n": 6}\n{"n": 7}\n')
    assert r.exit_code == EXIT_OK, r.output
    assert [m["payload"] for m in fetch(broker.client, q)] == [
        {"id": 1}, {"n": 1}, {"n": 2}, [3], {"n": 4}, {"n": 5}, [{"n": 4}, {"n": 5}],
        {"n": 6}, {"n": 7}]

    first = ctl_json(broker.url, "push", q, "{}", "--transaction-id", "order-1")
    again = ctl_json(broker.url, "push", q, "{}", "--transaction-id", "order-1")
    assert first[0]["status"] == "queued" and again[0]["status"] == "duplicate"
    assert again[0]["messageId"] == first[0]["messageId"]

    many = tmp_path / "many.jsonl"
    many.write_text("".join(f"{i}\n" for i in range(2500)))  # three request bodies
    r = ctl(broker.url, "push", uq("ctl-many"), "--file", str(many), "--lines")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.strip() == "pushed 2500 message(s): 2500 queued"


def test_push_refuses_bad_input_and_reports_broker_errors(broker, tmp_path):
    q = uq("ctl-bad")
    r = ctl(broker.url, "push", q, "{oops")
    assert r.exit_code == EXIT_USAGE and r.stdout == ""
    assert r.stderr.startswith("error: invalid_json: PAYLOAD argument 1 is not JSON"), r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"n": 1}\n{"n": 2,}\n')
    r = ctl(broker.url, "push", q, "--file", str(bad), "--lines")
    assert r.exit_code == EXIT_USAGE
    assert r.stderr.startswith(f"error: invalid_json: {bad} line 2: "), r.stderr
    r = ctl(broker.url, "push", q, "--file", str(bad))
    assert r.exit_code == EXIT_USAGE and "invalid_json" in r.stderr
    obj = tmp_path / "obj.json"
    obj.write_text('{"a": 1}')
    r = ctl(broker.url, "push", q, "--file", str(obj), "--each")
    assert r.exit_code == EXIT_USAGE and "--each needs a JSON array" in r.stderr
    r = ctl(broker.url, "push", q, "--file", str(tmp_path / "missing.json"))
    assert r.exit_code == EXIT_USAGE and "cannot read" in r.stderr
    for args in ([], ["1", "2", "--transaction-id", "t"], ["1", "--lines"],
                 ["--file", str(obj), "--lines", "--each"]):
        r = ctl(broker.url, "push", q, *args)
        assert r.exit_code == EXIT_USAGE, (args, r.output)
    # nothing above reached the broker: the queue was never created
    assert ctl(broker.url, "queues", "show", q).exit_code == EXIT_NOT_FOUND

    r = ctl(broker.url, "push", q, "1", "--trace-id", "not-a-uuid")
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.stderr.startswith("error: invalid_request: "), r.stderr
    r = ctl(broker.url, "--json", "push", "q" * 300, "1")
    assert r.exit_code == EXIT_ERROR
    assert json.loads(r.stdout)["code"] == "name_too_long"
    assert ctl(broker.url, "queues", "show", q).exit_code == EXIT_NOT_FOUND


# ----------------------------------------------------------------------------------- browse
def test_messages_browse(broker):
    q, g = uq("ctl-browse"), uq("grp")
    pushed = push(broker.client, q, 3)
    m = pop(broker.client, q, g)["messages"][0]
    assert ack(broker.client, m, "completed")["success"]

    r = ctl(broker.url, "messages", "browse", q)
    assert r.exit_code == EXIT_OK, r.output
    header, *rows, footer = r.stdout.splitlines()
    assert header.split() == ["CREATED_AT", "PARTITION", "PARTITION_ID", "OFFSET",
                              "TRANSACTION_ID", "STATUS", "LEASE_EXPIRES_AT"]
    assert [row.split()[3:6] for row in rows] == [
        [str(i + 1), p["transactionId"], "pending"] for i, p in enumerate(pushed)]
    assert footer == "(3 of 3 messages, offset 0)"

    body = ctl_json(broker.url, "messages", "browse", q, "--group", g)
    assert [x["status"] for x in body["messages"]] == ["completed", "pending", "pending"]
    body = ctl_json(broker.url, "messages", "browse", q, "--group", g, "--status", "pending",
                    "--limit", "1", "--offset", "1")
    assert body["total"] == 2 and [x["offset"] for x in body["messages"]] == [3]
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).isoformat()
    r = ctl(broker.url, "messages", "browse", q, "--from", later, "--to", later)
    assert r.exit_code == EXIT_OK and r.stdout.strip() == "no messages (total 0)"
    assert ctl_json(broker.url, "messages", "browse", q, "--partition", "nope")["total"] == 0

    r = ctl(broker.url, "messages", "browse", uq("noqueue"))
    assert r.exit_code == EXIT_NOT_FOUND and r.stderr.startswith("error: not_found: ")
    r = ctl(broker.url, "messages", "browse", q, "--from", "yesterday")
    assert r.exit_code == EXIT_ERROR
    assert r.stderr.startswith("error: invalid_request: ") and "(field=from)" in r.stderr
    r = ctl(broker.url, "messages", "browse", q, "--status", "gone")
    assert r.exit_code == EXIT_USAGE


# -------------------------------------------------------------------------------------- peek
def test_messages_peek_reads_without_consuming(broker):
    q = uq("ctl-peek")
    push(broker.client, q, 5)
    r = ctl(broker.url, "messages", "peek", q)
    assert r.exit_code == EXIT_OK, r.output
    head, header, *rows = r.stdout.splitlines()
    assert head == f"queue {q} partition Default: log offsets 1..5"
    assert header.split() == ["OFFSET", "CREATED_AT", "TRANSACTION_ID", "PAYLOAD"]
    assert [(row.split()[0], row.split()[-1]) for row in rows] == [
        (str(i + 1), f'{{"n":{i}}}') for i in range(5)]

    r = ctl(broker.url, "messages", "peek", q, "--offset", "3", "--limit", "2")
    assert r.exit_code == EXIT_OK, r.output
    *_, last = r.stdout.splitlines()
    assert last == "(more from offset 5)"
    assert [row[0] for row in rows_of(r)[2:-1]] == ["3", "4"]
    body = ctl_json(broker.url, "messages", "peek", q, "--offset", "4")
    assert [x["payload"] for x in body["records"]] == [{"n": 3}, {"n": 4}]
    assert body["highWatermark"] == 6 and body["logStartOffset"] == 1 and not body["more"]

    created = ctl_json(broker.url, "messages", "browse", q)["messages"][2]["createdAt"]
    body = ctl_json(broker.url, "messages", "peek", q, "--from", created)
    assert body["records"][0]["offset"] <= 3 and body["records"][-1]["offset"] == 5
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).isoformat()
    r = ctl(broker.url, "messages", "peek", q, "--from", later)
    assert r.exit_code == EXIT_OK and r.stdout.splitlines()[-1] == "no messages there"

    # nothing was consumed or leased: no group appeared, and the first pop starts at offset 1
    assert not [x for x in ctl_json(broker.url, "groups", "list") if x["queueName"] == q]
    assert [m["data"] for m in pop(broker.client, q, batch=5)["messages"]] == [
        {"n": i} for i in range(5)]

    r = ctl(broker.url, "messages", "peek", uq("noqueue"))
    assert r.exit_code == EXIT_NOT_FOUND
    assert r.stderr.startswith("error: not_found: queue "), r.stderr
    r = ctl(broker.url, "messages", "peek", q, "--offset", "99")
    assert r.exit_code == EXIT_ERROR
    assert r.stderr.startswith("error: offset_out_of_range: offset 99 is outside"), r.stderr
    r = ctl(broker.url, "--json", "messages", "peek", q, "--offset", "99")
    assert json.loads(r.stdout)["entries"][0]["error"] == "OFFSET_OUT_OF_RANGE"
    r = ctl(broker.url, "messages", "peek", q, "--offset", "1", "--from", later)
    assert r.exit_code == EXIT_USAGE


# --------------------------------------------------------------------------------------- top
def test_top_once_and_iterations(broker):
    q, g = uq("ctl-top"), uq("grp")
    push(broker.client, q, 4)
    pop(broker.client, q, g)

    r = ctl(broker.url, "top", "--once", "--top", "1000")
    assert r.exit_code == EXIT_OK, r.output
    assert CLEAR not in r.stdout  # not a terminal: no redraw codes
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"queenctl top  {broker.url}  ") and "healthy" in lines[0]
    assert lines[1].startswith("shards 2/2  uptime ")
    assert lines[2].startswith("rates (since start): push ")
    (qrow,) = [row for row in rows_of(r) if row[:1] == [q]]
    assert qrow[1:5] == ["4", "1", "0", "4"] and qrow[5] == "-"
    (grow,) = [row for row in rows_of(r) if row[:2] == [g, q]]
    assert grow[4] == "4"  # the leased message is not acked yet

    r = ctl(broker.url, "top", "--iterations", "2", "--interval", "0.3", "--json",
            "--top", "1000")
    assert r.exit_code == EXIT_OK, r.output
    first, second = (json.loads(line) for line in r.stdout.splitlines())
    assert first["windowSeconds"] is None and second["windowSeconds"] >= 0.3
    assert set(second["rates"]) == {"pushedPerSec", "poppedPerSec", "ackedPerSec",
                                    "requestsPerSec"}
    (mine,) = [x for x in second["queues"] if x["queue"] == q]
    assert mine["pending"] == 4 and mine["inPerSec"] == 0
    assert any(x["group"] == g and x["lag"] == 4 for x in second["groups"])
    assert second["broker"]["status"] == "healthy" and second["totals"]["pending"] >= 4

    r = ctl(broker.url, "top", "--once", "--iterations", "2")
    assert r.exit_code == EXIT_USAGE
    r = ctl(f"http://127.0.0.1:{free_port()}", "top", "--once")
    assert r.exit_code == EXIT_UNREACHABLE and r.stderr.startswith("error: unreachable: ")


def test_top_redraws_in_place_on_a_terminal(broker):
    """On a TTY every frame starts with the home-and-clear codes; the process is the console
    entry point's, its stdout a pseudo-terminal."""
    main_fd, tty_fd = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "queen_mp.processes.queenctl", "--url", broker.url, "top",
             "--iterations", "2", "--interval", "0.2"],
            stdout=tty_fd, stderr=subprocess.PIPE, cwd=REPO_ROOT)
        os.close(tty_fd)
        out = b""
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=60) == EXIT_OK, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(main_fd)
    text = out.decode()
    assert text.count(CLEAR) == 2, text[:500]
    assert text.startswith(CLEAR + "queenctl top  ")
    # the second frame's window is the time between its two samples: 0.2 s asked, longer on a
    # loaded machine (the reads of a frame take their time)
    assert "rates (since start)" in text and re.search(r"rates \(last \d+\.\ds\)", text), text


def test_top_counts_a_push_between_frames(broker):
    """The second frame's rates are the difference of the counters, not averages."""
    from queen_mp.processes.queenctl.base import Client
    from queen_mp.processes.queenctl.top import _poll, build_frame

    client = Client(broker.url, None, 30, True)
    q = uq("ctl-rate")
    before = _poll(client)
    push(broker.client, q, 50)
    time.sleep(0.2)
    after = _poll(client)
    frame = build_frame(after, before, 1000)
    window = after.at - before.at
    assert frame.rates["pushedPerSec"] == pytest.approx(50 / window, rel=0.05)
    (mine,) = [x for x in frame.queues if x["queue"] == q]
    assert mine["inPerSec"] is None  # the queue was not in the first frame


# ------------------------------------------------------------------------------------- purge
def test_queues_purge_keeps_the_queue_groups_and_leases(broker):
    q, g = uq("ctl-purge"), uq("grp")
    pushed = push(broker.client, q, 3)
    r = broker.client.post("/api/v1/push", json={"items": [
        {"queue": q, "partition": "eu", "payload": i} for i in range(2)]})
    assert r.status_code == 201, r.text
    m = pop(broker.client, q, g)["messages"][0]
    assert ack(broker.client, m, "completed")["success"]
    r = broker.client.get(f"/api/v1/pop/queue/{q}/partition/eu", params={"batch": "1"})
    assert r.status_code == 200 and len(r.json()["messages"]) == 1  # a live lease on eu

    r = ctl(broker.url, "queues", "purge", q, input="n\n")
    assert r.exit_code == EXIT_ERROR  # declined: nothing purged
    assert ctl_json(broker.url, "queues", "show", q)["totals"]["messages"]["total"] == 5

    r = ctl(broker.url, "queues", "purge", q, input="y\n")
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout.splitlines() == [
        f"purged queue {q}: 3 message(s) removed from 2 partition(s)",
        "2 message(s) kept: inside a live lease or after one in its partition; purge again "
        "once they are acknowledged"]
    shown = ctl_json(broker.url, "queues", "show", q)
    parts = {p["name"]: p for p in shown["partitions"]}
    assert (parts["Default"]["logStartOffset"], parts["Default"]["lastOffset"]) == (4, 3)
    assert parts["Default"]["messages"]["total"] == 0
    assert (parts["eu"]["logStartOffset"], parts["eu"]["messages"]["total"]) == (1, 2)
    # the group stays; its Default cursor moved to the new log start, eu kept its 2 messages
    cursors = {p["partition"]: p for p in ctl_json(broker.url, "groups", "show", g)[q]
               ["partitions"]}
    assert (cursors["Default"]["committedOffset"], cursors["Default"]["offsetLag"]) == (3, 0)
    assert cursors["eu"]["offsetLag"] == 2

    again = ctl_json(broker.url, "push", q, "{}", "--transaction-id",
                     pushed[0]["transactionId"])
    assert again[0]["status"] == "duplicate"  # the sidecar stays: deduplication too
    assert ctl_json(broker.url, "push", q, '{"after": true}')[0]["offset"] == 4
    r = broker.client.get(f"/api/v1/pop/queue/{q}/partition/Default",
                          params={"batch": "10", "consumerGroup": g})
    assert r.status_code == 200, r.text
    assert [x["data"] for x in r.json()["messages"]] == [{"after": True}]
    assert ack(broker.client, r.json()["messages"][0], "completed")["success"]
    r = ctl(broker.url, "messages", "peek", q)
    assert r.exit_code == EXIT_OK, (r.stdout, r.stderr)
    assert r.stdout.splitlines()[0] == f"queue {q} partition Default: log offsets 4..4"

    body = ctl_json(broker.url, "queues", "purge", q, "--yes")
    assert body == {"queue": q, "partitions": 2, "purged": 1, "kept": 2}
    r = ctl(broker.url, "queues", "purge", uq("noqueue"), "--yes")
    assert r.exit_code == EXIT_NOT_FOUND
    assert r.stderr.startswith("error: not_found: queue "), r.stderr


# ------------------------------------------------------------------------------------ roles
@pytest.fixture(scope="module")
def auth_broker(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_auth_broker(tmp_path_factory.mktemp("ctlauth"), db_dsn)
    yield b
    assert b.stop() == 0, b.log()[-4000:]


def as_role(b: Broker, role: str | None, *args: str, tenant: str = "ctl") -> Result:
    tok = [] if role is None else ["--token", token(role, tenant=tenant)]
    return CliRunner().invoke(main, ["--url", b.url, *tok, *args], catch_exceptions=False)


def test_roles_under_jwt(auth_broker):
    b = auth_broker
    q = uq("ctl-auth")
    r = as_role(b, "read-write", "push", q, '{"a": 1}', "--json")
    assert r.exit_code == EXIT_OK, r.output

    forbidden: list[Any] = [["push", q, "1"], ["messages", "peek", q],
                            ["queues", "purge", q, "--yes"]]
    for args in forbidden:
        r = as_role(b, "read-only", *args)
        assert r.exit_code == EXIT_ERROR, (args, r.output)
        assert r.stderr.startswith("error: forbidden: "), (args, r.stderr)
    r = as_role(b, "read-write", "queues", "purge", q, "--yes")
    assert r.exit_code == EXIT_ERROR and r.stderr.startswith("error: forbidden: ")

    r = as_role(b, "read-only", "messages", "browse", q)
    assert r.exit_code == EXIT_OK, r.output
    assert len(r.stdout.splitlines()) == 3
    r = as_role(b, "read-only", "top", "--once", "--json")
    assert r.exit_code == EXIT_OK, r.output
    frame = json.loads(r.stdout)
    assert [x["queue"] for x in frame["queues"]] == [q]  # the tenant's queues only
    r = as_role(b, None, "messages", "browse", q)
    assert r.exit_code == EXIT_ERROR and r.stderr.startswith("error: unauthorized: ")
    for args in (["queues", "purge", q, "--yes"], ["messages", "browse", q],
                 ["messages", "peek", q]):  # another tenant's queue is an unknown one
        r = as_role(b, "admin", *args, tenant="ctl-other")
        assert r.exit_code == EXIT_NOT_FOUND, (args, r.output)
    r = as_role(b, "admin", "queues", "purge", q, "--yes", "--json")
    assert r.exit_code == EXIT_OK, r.output
    assert json.loads(r.stdout)["purged"] == 1


def test_help_of_new_commands():
    for args in (["push"], ["messages"], ["messages", "browse"], ["messages", "peek"],
                 ["top"], ["queues", "purge"]):
        r = CliRunner().invoke(main, [*args, "--help"])
        assert r.exit_code == 0, (args, r.output)
        assert "Exit codes:" in r.output or args == ["messages"], args
        assert "--json" in r.output or args == ["messages"], args
