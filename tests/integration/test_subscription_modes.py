"""Issue 27 ("what was found"): every ``subscriptionMode`` spelling upstream servers accept works
on a pop with its meaning (api.md 2.2), through the published 2.6 client and raw HTTP, and an
unknown one is still ``400`` naming the accepted values. Session broker over HTTP.
"""

from __future__ import annotations

import asyncio

import pytest
from queen import Queen

from queen_mp.http.pop import SUB_MODES
from tests.integration.test_push_json import uq

META = ("SELECT m.subscription_mode FROM queen.consumer_groups_meta m JOIN queen.queues q"
        " ON q.id = m.queue_id WHERE q.name = %s AND m.consumer_group = %s")


def push(broker, queue: str, *payloads: int) -> None:
    r = broker.client.post("/api/v1/push", json={"items": [
        {"queue": queue, "payload": {"n": n}} for n in payloads]})
    assert r.status_code == 201, r.text


def first_pop(broker, queue: str, group: str, mode: str) -> list[int]:
    r = broker.client.get(f"/api/v1/pop/queue/{queue}", params={
        "consumerGroup": group, "batch": 10, "autoAck": "true", "subscriptionMode": mode})
    assert r.status_code in (200, 204), r.text
    return [] if r.status_code == 204 else [m["data"]["n"] for m in r.json()["messages"]]


ALL = ["from_beginning", "FROM_BEGINNING", "from-beginning", "frombeginning", "beginning",
       "timestamp", " All ", "all", ""]
NEW = ["new", "NEW", "new-only", "new_only", "newonly", " New-Only "]


@pytest.mark.parametrize("mode", ALL)
def test_from_the_beginning_spellings_read_the_whole_log(broker, db, mode):
    q, g = uq("sm"), uq("g")
    push(broker, q, 1, 2)
    assert first_pop(broker, q, g, mode) == [1, 2]
    assert db.execute(META, (q, g)).fetchone() == ("all",)


@pytest.mark.parametrize("mode", NEW)
def test_new_spellings_skip_what_is_there(broker, db, mode):
    q, g = uq("sm"), uq("g")
    push(broker, q, 1, 2)
    assert first_pop(broker, q, g, mode) == []
    recorded = db.execute(META, (q, g)).fetchone()
    assert recorded is not None and recorded[0] in ("new", "new-only")
    push(broker, q, 3)
    assert first_pop(broker, q, g, "all") == [3]


def test_the_table_covers_exactly_the_tested_spellings():
    assert {m.strip().lower() for m in ALL + NEW} == set(SUB_MODES)


def test_the_client_consumes_with_from_beginning(broker):
    q = uq("smc")
    push(broker, q, 1, 2, 3)

    async def scenario() -> list[int]:
        got: list[int] = []
        async with Queen(broker.url) as client:
            async def handler(messages):
                got.extend(m["data"]["n"] for m in messages)

            await (client.queue(q).group(uq("g")).subscription_mode("from_beginning")
                   .batch(10).wait(False).limit(3).consume(handler))
        return got

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == [1, 2, 3]


@pytest.mark.parametrize("mode", ["latest", "earliest", "newest", "all-new", "bogus"])
def test_unknown_modes_are_400_naming_the_accepted_ones(broker, mode):
    q = uq("smbad")
    push(broker, q, 1)
    r = broker.client.get(f"/api/v1/pop/queue/{q}", params={"subscriptionMode": mode})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_request" and body["field"] == "subscriptionMode"
    assert repr(mode) in body["error"] and "from_beginning" in body["error"]
    assert "new-only" in body["error"]
