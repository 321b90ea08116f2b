"""Issue 27 item 5: ``POST /api/v1/partitions/changed``, partition discovery (api.md 2.15),
through the published 2.6 client's ``queue(q).changed_since`` and raw HTTP: creation order,
``since``, paging with ``next``, ``safeTime`` against a write in flight, tenancy, limits and bad
input. Real broker (the session one) over HTTP on the session database.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import psycopg
import pytest
import queen.reads.offset_reads as offset_reads
from queen import Queen

from tests.integration.test_fetch import assert_refused
from tests.integration.test_push_json import uq

CHANGED = "/api/v1/partitions/changed"
ZERO = uuid.UUID(int=0)
SQL = "SELECT queen.log_partitions_changed_v1(%s, %s, %s, %s, %s, %s, %s, %s)"


def push(broker, queue: str, *partitions: str) -> None:
    r = broker.client.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": p, "payload": {"p": p}} for p in partitions]})
    assert r.status_code == 201 and {x["status"] for x in r.json()} == {"queued"}, r.text


def changed(broker, *entries: dict[str, Any], status: int = 200) -> dict:
    r = broker.client.post(CHANGED, json={"entries": list(entries)})
    assert r.status_code == status, r.text
    return r.json()


def age(db: psycopg.Connection, queue: str, *partitions: str) -> None:
    """Make these partitions' last writes an hour old."""
    db.execute("UPDATE queen.log_partitions lp SET last_created_at = now() - interval '1 hour'"
               " FROM queen.queues q WHERE q.id = lp.queue_id AND q.name = %s"
               " AND lp.name = ANY(%s)", (queue, list(partitions)))


def parse(ts: str) -> dt.datetime:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


# ------------------------------------------------------------------------ through the client
def test_client_lists_every_partition_then_only_the_changed_ones(broker, db, monkeypatch):
    q = uq("pc")
    push(broker, q, "c", "a", "b")  # created in this order: c, a, b
    push(broker, q, "a")
    monkeypatch.setattr(offset_reads, "CHANGED_PAGE", 2)  # the client follows `next`

    async def listing(since: Any = None) -> dict:
        async with Queen(broker.url) as client:
            return await client.queue(q).changed_since(since)

    every = asyncio.run(listing())
    names = [p["name"] for p in every["partitions"]]
    assert sorted(names) == ["a", "b", "c"]
    ids = [int(p["id"]) for p in every["partitions"]]
    assert ids == sorted(ids)  # creation order
    by = {p["name"]: p for p in every["partitions"]}
    assert (by["a"]["lastOffset"], by["a"]["logStart"]) == (2, 1)
    assert (by["b"]["lastOffset"], by["c"]["lastOffset"]) == (1, 1)
    safe = parse(every["safeTime"])
    assert safe <= dt.datetime.now(dt.UTC) - dt.timedelta(seconds=4)
    assert all(parse(p["lastWriteAt"]) > safe for p in every["partitions"])

    age(db, q, "a", "b", "c")
    push(broker, q, "b")
    since = asyncio.run(listing(safe))
    assert [p["name"] for p in since["partitions"]] == ["b"]
    assert since["partitions"][0]["lastOffset"] == 2
    assert asyncio.run(listing(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)))[
        "partitions"] == []


def test_absent_queue_and_queue_without_partitions(broker):
    empty = uq("pcempty")
    r = broker.client.post("/api/v1/configure", json={"queue": empty})
    assert r.status_code == 200, r.text
    got = changed(broker, {"queue": empty}, {"queue": uq("pcnone")})
    assert [e["error"] for e in got["entries"]] == ["UNKNOWN_TOPIC_OR_PARTITION"] * 2
    assert all(e["partitions"] == [] and e["next"] is None for e in got["entries"])

    async def listing() -> dict:
        async with Queen(broker.url) as client:
            return await client.queue(empty).changed_since()

    assert asyncio.run(listing())["partitions"] == []


# ------------------------------------------------------------------------ paging, raw HTTP
def test_pages_follow_next_in_creation_order(broker):
    q = uq("pcpage")
    push(broker, q, *[f"p{i}" for i in range(5)])
    seen: list[str] = []
    ids: list[int] = []
    after = None
    pages = 0
    while True:
        e: dict[str, Any] = {"queue": q, "limit": 2}
        if after is not None:
            e["after"] = after
        got = changed(broker, e)
        entry = got["entries"][0]
        assert "error" not in entry and entry["queue"] == q
        seen += [p["name"] for p in entry["partitions"]]
        ids += [int(p["id"]) for p in entry["partitions"]]
        pages += 1
        after = entry["next"]
        if after is None:
            break
        assert isinstance(after, str) and len(entry["partitions"]) == 2
    assert sorted(seen) == [f"p{i}" for i in range(5)] and pages == 3
    assert ids == sorted(ids) and len(set(ids)) == 5  # creation order, each once
    # limit above 1000 is clamped, not refused
    assert len(changed(broker, {"queue": q, "limit": 5000})["entries"][0]["partitions"]) == 5


def test_a_short_page_at_the_scan_bound_carries_a_cursor(broker, db):
    q = uq("pcscan")
    push(broker, q, "a", "b", "c", "d")
    by_id = [r[0] for r in db.execute(
        "SELECT lp.name FROM queen.log_partitions lp JOIN queen.queues qq ON qq.id = lp.queue_id"
        " WHERE qq.name = %s ORDER BY lp.id", (q,)).fetchall()]
    age(db, q, *by_id[:3])  # only the newest partition was written in the last hour
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    page = db.execute(SQL, (ZERO, q, since, None, 10, 2, 5, 60)).fetchone()[0]
    assert page["known"] is True and page["partitions"] == [] and page["next"] is not None
    page = db.execute(SQL, (ZERO, q, since, page["next"], 10, 2, 5, 60)).fetchone()[0]
    assert [p["name"] for p in page["partitions"]] == by_id[3:] and page["next"] is not None
    page = db.execute(SQL, (ZERO, q, since, page["next"], 10, 2, 5, 60)).fetchone()[0]
    assert page["partitions"] == [] and page["next"] is None


# ------------------------------------------------------------------------ safeTime
def test_safe_time_holds_back_for_a_write_in_flight(broker, db, db_dsn):
    """A write stamped before the page but committed after it is found by since=safeTime
    (with the 5 s guard at 0, so that only the in-flight rule can make it pass)."""
    q = uq("pcsafe")
    push(broker, q, "w")
    age(db, q, "w")
    with psycopg.connect(db_dsn) as writer:
        stamped = writer.execute(
            "UPDATE queen.log_partitions lp SET last_created_at = clock_timestamp()"
            " FROM queen.queues qq WHERE qq.id = lp.queue_id AND qq.name = %s"
            " RETURNING lp.last_created_at", (q,)).fetchone()[0]
        page = db.execute(SQL, (ZERO, q, None, None, 10, 10, 0, 60)).fetchone()[0]
        safe = dt.datetime.fromisoformat(page["safeTime"])
        assert page["degraded"] is False
        assert safe <= stamped  # the open transaction holds it back
        seen = dt.datetime.fromisoformat(page["partitions"][0]["lastWriteAt"])
        assert seen < stamped  # the page's snapshot does not see the write yet
        writer.commit()
    later = db.execute(SQL, (ZERO, q, safe, None, 10, 10, 0, 60)).fetchone()[0]
    assert [p["name"] for p in later["partitions"]] == ["w"]


def test_empty_call_still_answers_a_safe_time(broker):
    got = changed(broker)
    assert got["entries"] == [] and got["safeTimeDegraded"] is False
    lag = dt.datetime.now(dt.UTC) - parse(got["safeTime"])
    # the 5 s guard, and no session of an idle broker holds it back for long (measured 5.0 s)
    assert dt.timedelta(seconds=4) <= lag < dt.timedelta(seconds=120)
    r = broker.client.post(CHANGED, json={})
    assert r.status_code == 200 and r.json()["entries"] == []


def test_another_tenants_queue_is_unknown(broker, db):
    q = uq("pcten")
    push(broker, q, "p")
    other = db.execute(SQL, (uuid.UUID(int=9), q, None, None, 10, 10, 5, 60)).fetchone()[0]
    assert other["known"] is False and other["partitions"] == []
    mine = db.execute(SQL, (ZERO, q, None, None, 10, 10, 5, 60)).fetchone()[0]
    assert mine["known"] is True and [p["name"] for p in mine["partitions"]] == ["p"]


# ------------------------------------------------------------------------ limits, bad input
def test_more_than_64_entries_is_refused(broker):
    q = uq("pclim")
    assert len(changed(broker, *[{"queue": q}] * 64)["entries"]) == 64
    err = changed(broker, *[{"queue": q}] * 65, status=400)
    assert err["code"] == "invalid_request" and err["limit"] == 64


@pytest.mark.parametrize(("body", "code", "status", "field"), [
    (b"{", "invalid_request", 400, None),
    (b"[1]", "invalid_request", 400, None),
    (b'{"entries": "q"}', "invalid_request", 400, "entries"),
    (b'{"entries": [null]}', "invalid_request", 400, "entries"),
    (b'{"entries": [{}]}', "invalid_request", 400, "queue"),
    (b'{"entries": [{"queue": 5}]}', "invalid_request", 400, "queue"),
    (b'{"entries": [{"queue": "q", "limit": 0}]}', "invalid_request", 400, "limit"),
    (b'{"entries": [{"queue": "q", "limit": "10"}]}', "invalid_request", 400, "limit"),
    (b'{"entries": [{"queue": "q", "since": "yesterday"}]}', "invalid_request", 400, "since"),
    (b'{"entries": [{"queue": "q", "since": "2026-01-01T00:00:00"}]}', "invalid_request", 400,
     "since"),
    (b'{"entries": [{"queue": "q", "since": 17}]}', "invalid_request", 400, "since"),
    (b'{"entries": [{"queue": "q", "after": "n|x"}]}', "invalid_request", 400, "after"),
    (b'{"entries": [{"queue": "q", "after": 12}]}', "invalid_request", 400, "after"),
    (b'{"entries": [{"queue": "a/b"}]}', "invalid_name", 400, "queue"),
    (b'{"entries": [{"queue": "' + b"q" * 256 + b'"}]}', "name_too_long", 413, "queue"),
])
def test_bad_bodies_are_refused_naming_the_problem(broker, body, code, status, field):
    assert_refused(broker.client, CHANGED, body, code, status, field)


def test_only_post(broker):
    r = broker.client.get(CHANGED)
    assert r.status_code == 405 and "POST" in r.headers["allow"]
