"""Encrypted payloads and roles (docs/api.md 1.5, 2.8, 2.9, 2.11): a ``read-only`` token
browses the messages, dead letters and timers of an encrypted queue without their payloads,
``read-write`` and ``admin`` see them, and a plain queue answers every role the same.

One broker with JWT on and a payload key; one tenant of its own, holding an encrypted queue
and a plain one, each with one message dead-lettered (so it is both in the log and in the DLQ)
and one timer pending an hour ahead (its payload stored plain until it fires).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from queen_mp.http.openapi import document
from tests.brokerharness import Broker
from tests.integration.authkit import bearer, start_auth_broker, token

KEY = "44" * 32
TENANT = "payload-roles-" + uuid.uuid4().hex[:8]
SECRET = {"card": "4111-1111-1111-1111", "cvv": 123}
OPEN = {"note": "nothing to hide"}
ROLES = ("read-only", "read-write", "admin")
TIMER = "renewal"
TIMED = {"roles.secret": SECRET, "roles.open": OPEN}


def b64(doc: Any) -> str:
    return base64.b64encode(orjson.dumps(doc)).decode()


def client(b: Broker, role: str) -> httpx.Client:
    return httpx.Client(base_url=b.url, timeout=30,
                        headers=bearer(token(role, tenant=TENANT, sub=f"{role}-user")))


def dead_letter(c: httpx.Client, queue: str, payload: Any, encrypted: bool) -> dict[str, str]:
    """Configure ``queue`` (retryLimit 0), push one message, pop it and fail it: the message
    stays in the log (dead_letter) and one DLQ row holds its snapshot."""
    r = c.post("/api/v1/configure", json={"queue": queue, "options": {
        "retryLimit": 0, "encryptionEnabled": encrypted}})
    assert r.status_code == 200, r.text
    r = c.post("/api/v1/push", json={"items": [
        {"queue": queue, "transactionId": f"{queue}-1", "payload": payload}]})
    assert r.status_code == 201 and r.json()[0]["status"] == "queued", r.text
    r = c.get(f"/api/v1/pop/queue/{queue}", params={"wait": "false"})
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    assert m["data"] == payload  # a pop (read-write) decrypts
    r = c.post("/api/v1/ack", json={"transactionId": m["transactionId"],
                                    "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                                    "status": "failed", "error": "declined"})
    assert r.status_code == 200 and r.json()[0]["dlq"] is True, r.text
    return {"queue": queue, "partitionId": str(m["partitionId"]),
            "transactionId": m["transactionId"]}


@pytest.fixture(scope="module")
def staged(db_dsn: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Broker, dict[str, dict[str, str]]]]:
    b = start_auth_broker(tmp_path_factory.mktemp("payload-roles"), db_dsn,
                          QUEEN_ENCRYPTION_KEY=KEY)
    try:
        with client(b, "read-write") as c:
            rows = {"secret": dead_letter(c, "roles.secret", SECRET, True),
                    "open": dead_letter(c, "roles.open", OPEN, False)}
            r = c.post("/api/v1/timers", json={"operations": [
                {"op": "schedule", "queue": q, "timerKey": TIMER, "payload": b64(payload),
                 "delayMs": 3_600_000} for q, payload in TIMED.items()]})
            assert r.status_code == 200, r.text
            assert [x["status"] for x in r.json()["results"]] == ["scheduled"] * 2, r.text
        yield b, rows
    finally:
        assert b.stop() == 0, b.log()[-4000:]


def read(b: Broker, role: str, path: str, rows: bool = False, **params: str) -> httpx.Response:
    """A ``200`` GET as ``role``; ``rows``: a listing that must hold exactly one row."""
    with client(b, role) as c:
        r = c.get(path, params=params)
    assert r.status_code == 200, (role, r.text)
    assert not rows or r.json()["total"] == 1, r.text
    return r


def message(b: Broker, role: str, row: dict[str, str]) -> httpx.Response:
    return read(b, role, f"/api/v1/messages/{row['partitionId']}/{row['transactionId']}")


def dlq_page(b: Broker, role: str, queue: str) -> httpx.Response:
    return read(b, role, "/api/v1/dlq", rows=True, queue=queue)


def timer_list(b: Broker, role: str, queue: str) -> httpx.Response:
    return read(b, role, f"/api/v1/timers/{queue}", rows=True)


def timer_peek(b: Broker, role: str, queue: str) -> httpx.Response:
    return read(b, role, f"/api/v1/timers/{queue}/{TIMER}")


def test_a_read_only_token_gets_an_encrypted_message_without_its_payload(staged):
    b, rows = staged
    row = rows["secret"]
    seen = message(b, "read-only", row)
    assert b"4111" not in seen.content
    got = seen.json()
    assert got["data"] is None and got["encrypted"] is True and got["dataWithheld"] is True
    assert (got["transactionId"], got["status"]) == (row["transactionId"], "dead_letter")
    for role in ("read-write", "admin"):
        full = message(b, role, row).json()
        assert full["data"] == SECRET and full["encrypted"] is True, role
        assert "dataWithheld" not in full, role
        # everything but the payload is the same for every role
        assert {k: v for k, v in full.items() if k != "data"} == \
            {k: v for k, v in got.items() if k not in ("data", "dataWithheld")}


def test_a_plain_message_answers_every_role_the_same(staged):
    b, rows = staged
    answers = {role: message(b, role, rows["open"]).json() for role in ROLES}
    assert answers["read-only"]["data"] == OPEN and answers["read-only"]["encrypted"] is False
    assert "dataWithheld" not in answers["read-only"]
    assert answers["read-only"] == answers["read-write"] == answers["admin"]


def test_a_read_only_token_gets_an_encrypted_dead_letter_without_its_snapshot(staged):
    b, rows = staged
    seen = dlq_page(b, "read-only", "roles.secret")
    assert b"4111" not in seen.content
    (got,) = seen.json()["messages"]
    assert got["data"] is None and got["encrypted"] is True and got["dataWithheld"] is True
    assert (got["transactionId"], got["errorMessage"]) == (rows["secret"]["transactionId"],
                                                           "declined")
    for role in ("read-write", "admin"):
        (full,) = dlq_page(b, role, "roles.secret").json()["messages"]
        assert full["data"] == SECRET, role
        assert "encrypted" not in full and "dataWithheld" not in full, role
        assert {k: v for k, v in full.items() if k != "data"} == \
            {k: v for k, v in got.items() if k not in ("data", "encrypted", "dataWithheld")}


def test_a_plain_dead_letter_answers_every_role_the_same(staged):
    b, _ = staged
    pages = {role: dlq_page(b, role, "roles.open").json() for role in ROLES}
    (row,) = pages["read-only"]["messages"]
    assert row["data"] == OPEN and "encrypted" not in row and "dataWithheld" not in row
    assert pages["read-only"] == pages["read-write"] == pages["admin"]


def test_one_listing_of_both_queues_withholds_only_the_encrypted_row(staged):
    b, rows = staged
    with client(b, "read-only") as c:
        r = c.get("/api/v1/dlq")
    assert r.status_code == 200, r.text
    by_queue = {m["queue"]: m for m in r.json()["messages"]}
    assert set(by_queue) == {"roles.secret", "roles.open"}  # the tenant's rows only
    assert by_queue["roles.secret"]["transactionId"] == rows["secret"]["transactionId"]
    assert by_queue["roles.secret"]["dataWithheld"] is True
    assert by_queue["roles.open"]["data"] == OPEN and "dataWithheld" not in by_queue["roles.open"]


def test_a_read_only_token_lists_an_encrypted_queues_timers_without_their_payloads(staged):
    b, _ = staged
    seen = timer_list(b, "read-only", "roles.secret")
    assert b"4111" not in seen.content and b64(SECRET).encode() not in seen.content
    (got,) = seen.json()["timers"]
    assert got["payload"] is None and got["encrypted"] is True and got["dataWithheld"] is True
    assert (got["timerKey"], got["state"]) == (TIMER, "pending")
    for role in ("read-write", "admin"):
        (full,) = timer_list(b, role, "roles.secret").json()["timers"]
        assert full["payload"] == b64(SECRET), role  # stored plain until it fires
        assert "encrypted" not in full and "dataWithheld" not in full, role
        assert {k: v for k, v in full.items() if k != "payload"} == \
            {k: v for k, v in got.items() if k not in ("payload", "encrypted", "dataWithheld")}


def test_a_read_only_token_peeks_an_encrypted_queues_timer_without_its_payload(staged):
    b, _ = staged
    seen = timer_peek(b, "read-only", "roles.secret")
    assert b"4111" not in seen.content and b64(SECRET).encode() not in seen.content
    got = seen.json()
    assert got["payload"] is None and got["data"] is None
    assert got["encrypted"] is True and got["dataWithheld"] is True
    for role in ("read-write", "admin"):
        full = timer_peek(b, role, "roles.secret").json()
        assert full["payload"] == b64(SECRET) and full["data"] == SECRET, role
        assert "encrypted" not in full and "dataWithheld" not in full, role
        assert {k: v for k, v in full.items() if k not in ("payload", "data")} == \
            {k: v for k, v in got.items()
             if k not in ("payload", "data", "encrypted", "dataWithheld")}


def test_a_plain_queues_timers_answer_every_role_the_same(staged):
    b, _ = staged
    lists = {role: timer_list(b, role, "roles.open").content for role in ROLES}
    peeks = {role: timer_peek(b, role, "roles.open").content for role in ROLES}
    (row,) = orjson.loads(lists["read-only"])["timers"]
    assert row["payload"] == b64(OPEN) and "dataWithheld" not in row
    assert orjson.loads(peeks["read-only"])["data"] == OPEN
    # byte for byte: a plain queue gives read-only what it always gave
    assert lists["read-only"] == lists["read-write"] == lists["admin"]
    assert peeks["read-only"] == peeks["read-write"] == peeks["admin"]


def test_the_withheld_answers_conform_to_the_openapi_document(staged):
    jsonschema = pytest.importorskip("jsonschema")
    b, rows = staged
    doc = document()

    def check(name: str, body: Any) -> None:
        schema = {**doc, "$ref": f"#/components/schemas/{name}"}
        jsonschema.Draft202012Validator(schema).validate(body)

    check("MessageDetail", message(b, "read-only", rows["secret"]).json())
    check("DlqPage", dlq_page(b, "read-only", "roles.secret").json())
    check("MessageDetail", message(b, "read-write", rows["secret"]).json())
    check("DlqPage", dlq_page(b, "read-write", "roles.secret").json())
    listing = doc["paths"]["/api/v1/timers/{queue}"]["get"]["responses"]["200"]
    page = {**doc, **listing["content"]["application/json"]["schema"]}
    for role in ("read-only", "read-write"):
        jsonschema.Draft202012Validator(page).validate(
            timer_list(b, role, "roles.secret").json())
        check("TimerPeek", timer_peek(b, role, "roles.secret").json())
