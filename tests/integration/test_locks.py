"""Locks (docs/api.md 2.14, ``POST /api/v1/locks``; sql/functions/locks.sql) through the
published client queen-mq 2.6 (``client.lock``, ``client.semaphore``, ``client.locks``,
``.guard(lock)``), plus raw HTTP for every refusal.

The claims: one holder per permit; the token is the permit row's KV version and only rises;
renew rotates it; a guard commits a transaction only while its lease period is current (an
expired lock taken by another owner rolls the stale holder's transaction back); a semaphore
never grants more than its limit; a call sent again by its owner is the same permit; bad input
is a 4xx in the KV shape that writes nothing. Real broker process, checked with SQL on
``queen.kv``; every test uses its own lock names.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from queen import Queen

LOCKS = "/api/v1/locks"
NS = "queen-locks"
ZERO = uuid.UUID(int=0)


def uname(prefix: str = "lk") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def call(client: httpx.Client, *ops: dict[str, Any], status: int = 200) -> dict:
    r = client.post(LOCKS, json={"operations": list(ops)})
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()


def one(client: httpx.Client, op: dict[str, Any]) -> dict:
    results = call(client, op)["results"]
    assert len(results) == 1, results
    return results[0]


def permit_rows(db, name: str, tenant: uuid.UUID = ZERO) -> list[tuple]:
    return db.execute("SELECT key, version, value FROM queen.kv WHERE tenant = %s AND ns = %s "
                      "AND key LIKE %s ORDER BY key", (tenant, NS, f"{name}#%")).fetchall()


def pushed(db, queue: str) -> int:
    row = db.execute("SELECT COALESCE(sum(s.msg_count), 0) FROM queen.log_segments s "
                     "JOIN queen.log_partitions lp ON lp.id = s.partition_id "
                     "JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s",
                     (queue,)).fetchone()
    return int(row[0])


# ------------------------------------------------------------------------- the client's API
def test_one_holder_a_guarded_commit_and_a_higher_token_after_release(broker, db):
    name, queue = uname(), uname("lkq")

    async def scenario() -> None:
        async with Queen(broker.url) as client:
            a = client.lock(name, ttl_seconds=30, owner="owner-a")
            b = client.lock(name, ttl_seconds=30, owner="owner-b")
            assert await a.acquire() is True
            assert await b.acquire() is False
            token = a.token
            who = await client.locks.get(name)
            assert who and who["holders"][0]["owner"] == "owner-a"
            assert who["holders"][0]["token"] == token and who["holders"][0]["slot"] == 0
            assert who["holders"][0]["since"] and who["holders"][0]["expiresAt"]
            # the permit is a KV row, read through the KV route as any other
            row = await client.kv.get(NS, f"{name}#0")
            assert row["version"] == token and row["value"] == {"owner": "owner-a"}
            assert a.guard() == {"op": "check", "ns": NS, "key": f"{name}#0", "expect": token,
                                 "required": True}
            res = await client.transaction().guard(a).queue(queue).push(
                [{"data": {"step": 1}}]).commit()
            assert res["success"] is True, res
            # an acquire sent again by the holder is the same permit
            again = await client.locks.acquire(name, ttl_seconds=30, owner="owner-a")
            assert again["acquired"] and again["already"] and again["token"] == token
            assert await a.release() is True
            assert await b.acquire() is True
            assert b.token > token and b.slot == 0
            await b.release()

    asyncio.run(scenario())
    assert pushed(db, queue) == 1
    assert permit_rows(db, name) == []


def test_an_expired_guard_taken_over_rolls_back_and_a_live_one_commits(broker, db):
    name, queue = uname(), uname("lkq")

    async def scenario() -> tuple[dict, dict]:
        async with Queen(broker.url) as client:
            first = await client.locks.acquire(name, ttl_seconds=1, owner="slow")
            assert first["acquired"] is True
            stale = first["guard"]
            await asyncio.sleep(1.15)  # the lifetime passes; nobody tells the holder
            second = await client.locks.acquire(name, ttl_seconds=30, owner="fresh")
            assert second["acquired"] is True and second["token"] > first["token"]
            # the stale holder's step, its guard copied verbatim into the kv rider
            lost = await (client.transaction()
                          .kv.check(stale["ns"], stale["key"], expect=stale["expect"],
                                    required=True)
                          .queue(queue).push([{"data": {"by": "slow"}}]).commit())
            fresh = client.lock(name, ttl_seconds=30, owner="fresh")
            assert await fresh.acquire() is True and fresh.token == second["token"]
            won = await client.transaction().guard(fresh).queue(queue).push(
                [{"data": {"by": "fresh"}}]).commit()
            await fresh.release()
            return lost, won

    lost, won = asyncio.run(scenario())
    assert lost["success"] is False and lost["reason"] == "kv_precondition", lost
    assert lost["kvReason"] == "version" and lost["value"] == {"owner": "fresh"}, lost
    assert lost["failedIndex"] == 1  # one pushed item, then the rider's guard
    assert won["success"] is True, won
    assert pushed(db, queue) == 1  # the stale step pushed nothing


def test_a_replaced_holder_s_guard_rolls_back_through_the_client_and_it_learns_so(broker, db):
    name, queue = uname(), uname("lkq")

    async def scenario() -> tuple[dict, bool, bool]:
        async with Queen(broker.url) as client:
            a = client.lock(name, ttl_seconds=30, owner="paused")
            assert await a.acquire()
            # the operator frees the permit (or it expired), and another owner takes it
            await client.kv.delete("queen-locks", f"{name}#0")
            b = client.lock(name, ttl_seconds=30, owner="next")
            assert await b.acquire() and b.token > a.token
            res = await client.transaction().guard(a).queue(queue).push(
                [{"data": "from the paused holder"}]).commit()
            lost = a.lost.is_set()
            await b.release()
            return res, lost, a.held

    res, lost, held = asyncio.run(scenario())
    assert res["success"] is False and res["reason"] == "kv_precondition", res
    assert res["value"] == {"owner": "next"} and lost is True and held is False
    assert pushed(db, queue) == 0


def test_an_expired_guard_not_taken_over_rolls_back_too(broker):
    name = uname()
    got = one(broker.client, {"op": "acquire", "name": name, "ttlSeconds": 1})
    time.sleep(1.1)
    r = broker.client.post("/api/v1/transaction", json={
        "operations": [], "requiredLeases": [], "kv": [got["guard"]]})
    assert r.status_code == 200 and r.json()["success"] is False, r.text
    assert r.json()["kvReason"] == "absent"


def test_renew_rotates_the_token_and_a_stale_token_is_lost(broker, db):
    name, c = uname(), broker.client
    a = one(c, {"op": "acquire", "name": name, "ttlSeconds": 30, "owner": "w1"})
    r1 = one(c, {"op": "renew", "name": name, "token": a["token"], "ttlSeconds": 60})
    assert r1["renewed"] is True and r1["token"] > a["token"] and r1["slot"] == 0
    assert r1["guard"]["expect"] == r1["token"] != a["guard"]["expect"]
    assert permit_rows(db, name)[0][1] == r1["token"]
    # a stale token without an owner is lost, and told who holds it
    stale = one(c, {"op": "renew", "name": name, "token": a["token"], "ttlSeconds": 30})
    assert stale == {"index": 0, "op": "renew", "name": name, "renewed": False,
                     "reason": "lost", "slot": 0, "holders": [{"slot": 0, "owner": "w1"}]}
    # the owner's own renew landed and only its answer was lost: carried through
    r2 = one(c, {"op": "renew", "name": name, "token": a["token"], "ttlSeconds": 30,
                 "owner": "w1"})
    assert r2["renewed"] is True and r2["token"] > r1["token"]
    # another owner with a stale token: lost
    assert one(c, {"op": "renew", "name": name, "token": a["token"], "ttlSeconds": 30,
                   "owner": "w2"})["renewed"] is False
    gone = one(c, {"op": "release", "name": name, "token": r1["token"]})
    assert gone["released"] is False and gone["reason"] == "lost"
    assert one(c, {"op": "release", "name": name, "token": r2["token"]})["released"] is True
    assert permit_rows(db, name) == []
    after = one(c, {"op": "renew", "name": name, "token": r2["token"], "ttlSeconds": 30,
                    "owner": "w1"})
    assert after["renewed"] is False and after["holders"] == []


def test_the_handle_renews_in_the_background_and_its_guard_follows(broker, db):
    name, queue = uname(), uname("lkq")

    async def scenario() -> dict:
        async with Queen(broker.url) as client:
            lock = client.lock(name, ttl_seconds=3, renew_every=0.2, owner="bg")
            assert await lock.acquire()
            first = lock.token
            await asyncio.sleep(0.7)
            assert lock.held and lock.token > first
            res = await client.transaction().guard(lock).queue(queue).push(
                [{"data": 1}]).commit()
            await lock.release()
            return res

    assert asyncio.run(scenario())["success"] is True
    assert pushed(db, queue) == 1


def test_a_semaphore_never_grants_more_than_its_limit(broker, db):
    name, c = uname("sem"), broker.client

    async def run() -> tuple[list[bool], int]:
        async with Queen(broker.url) as client:
            handles = [client.semaphore(name, 3, ttl_seconds=30, owner=f"s{i}")
                       for i in range(5)]
            got = await asyncio.gather(*(h.acquire() for h in handles))
            held = [h for h in handles if h.held]
            assert sorted(h.slot for h in held) == [0, 1, 2]
            full = await client.locks.acquire(name, ttl_seconds=30, owner="late", limit=3)
            assert full["acquired"] is False and full["reason"] == "held"
            assert sorted(h["slot"] for h in full["holders"]) == [0, 1, 2]
            freed = held[0].slot
            assert freed is not None
            await held[0].release()
            late = await client.locks.acquire(name, ttl_seconds=30, owner="late", limit=3)
            assert late["acquired"] is True and late["slot"] == freed
            for h in held[1:]:
                await h.release()
            return list(got), freed

    got, freed = asyncio.run(run())
    assert sum(got) == 3
    assert [key for key, _, _ in permit_rows(db, name)] == [f"{name}#{freed}"]
    who = one(c, {"op": "get", "name": name})
    assert who["held"] is True and [h["owner"] for h in who["holders"]] == ["late"]


def test_contenders_racing_for_a_lock_get_one_winner(broker, db):
    name = uname("race")

    async def race() -> list[dict]:
        async with Queen(broker.url) as client:
            return list(await asyncio.gather(*(
                client.locks.acquire(name, ttl_seconds=30, owner=f"c{i}") for i in range(12))))

    got = asyncio.run(race())
    winners = [r for r in got if r["acquired"]]
    assert len(winners) == 1, got
    assert all(r["reason"] == "held" for r in got if not r["acquired"]), got
    assert permit_rows(db, name)[0][2] == {"owner": winners[0]["owner"]}


def test_free_slots_all_taken_under_the_caller_are_contended(broker, db_dsn):
    name, c = uname("cont"), broker.client
    assert one(c, {"op": "acquire", "name": name, "ttlSeconds": 30, "limit": 2,
                   "owner": "holder"})["acquired"]
    held_slot = one(c, {"op": "get", "name": name})["holders"][0]["slot"]
    free = 1 - held_slot
    with psycopg.connect(db_dsn) as other:
        # an expired permit in the free slot, its row locked by a call still running
        other.execute("INSERT INTO queen.kv (tenant, ns, key, value, version, expires_at) "
                      "VALUES (%s, %s, %s, '{\"owner\": \"gone\"}', 1, "
                      "now() - interval '1 second')", (ZERO, NS, f"{name}#{free}"))
        other.commit()
        other.execute("SELECT 1 FROM queen.kv WHERE ns = %s AND key = %s FOR UPDATE",
                      (NS, f"{name}#{free}"))
        got = one(c, {"op": "acquire", "name": name, "ttlSeconds": 30, "limit": 2,
                      "owner": "late"})
        other.rollback()
    assert got["acquired"] is False and got["reason"] == "contended", got
    assert got["holders"] == [{"slot": held_slot, "owner": "holder"}]
    late = one(c, {"op": "acquire", "name": name, "ttlSeconds": 30, "limit": 2,
                   "owner": "late"})
    assert late["acquired"] is True and late["slot"] == free


def test_a_call_answers_each_op_in_its_order(broker):
    a, b, c = uname("a"), uname("b"), uname("c")
    out = call(broker.client,
               {"op": "acquire", "name": c, "ttlSeconds": 30},
               {"op": "get", "name": a},
               {"op": "acquire", "name": b, "ttlSeconds": 30, "limit": 2, "owner": "o"})
    assert [r["index"] for r in out["results"]] == [0, 1, 2]
    assert [r["name"] for r in out["results"]] == [c, a, b]
    assert out["results"][0]["acquired"] and out["results"][0]["owner"] is None
    assert out["results"][1] == {"index": 1, "op": "get", "name": a, "held": False,
                                 "holders": []}
    assert call(broker.client)["results"] == []


def test_permits_are_per_tenant(broker, db):
    name = uname()
    other = uuid.UUID("11111111-2222-3333-4444-555555555555")
    db.execute("INSERT INTO queen.kv (tenant, ns, key, value, version, expires_at) VALUES "
               "(%s, %s, %s, '{\"owner\": \"theirs\"}', 7, now() + interval '1 hour')",
               (other, NS, f"{name}#0"))
    assert one(broker.client, {"op": "get", "name": name})["held"] is False
    mine = one(broker.client, {"op": "acquire", "name": name, "ttlSeconds": 30})
    assert mine["acquired"] is True
    assert permit_rows(db, name, other)[0][1] == 7  # theirs untouched


def test_maintenance_refuses_writes_and_serves_gets(broker):
    name, c = uname(), broker.client
    assert c.post("/api/v1/system/maintenance", json={"enabled": True}).status_code == 200
    try:
        r = c.post(LOCKS, json={"operations": [{"op": "acquire", "name": name,
                                                "ttlSeconds": 5}]})
        assert r.status_code == 503 and r.json()["code"] == "maintenance", r.text
        assert one(c, {"op": "get", "name": name})["held"] is False
    finally:
        assert c.post("/api/v1/system/maintenance", json={"enabled": False}).status_code == 200


# ------------------------------------------------------------------------------ refusals
BAD: list[tuple[Any, int, str]] = [
    ([{"op": "acquire", "name": "x", "ttlSeconds": 5}], 400, "locks_bad_request"),  # no dict
    ({"ops": []}, 400, "locks_bad_request"),
    ({"operations": {"op": "get"}}, 400, "locks_bad_request"),
    ({"operations": ["get"]}, 400, "locks_bad_request"),
    ({"operations": [{"name": "x"}]}, 400, "locks_unknown_op"),
    ({"operations": [{"op": "lock", "name": "x"}]}, 400, "locks_unknown_op"),
    ({"operations": [{"op": "get"}]}, 400, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": ""}]}, 400, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": "a#1"}]}, 400, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": "a\nb"}]}, 400, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": 7}]}, 400, "locks_bad_name"),
    ({"operations": [{"op": "get", "name": "x" * 257}]}, 413, "locks_name_too_long"),
    ({"operations": [{"op": "get", "name": "x", "tenant": "t"}]}, 400,
     "locks_tenant_not_an_input"),
    ({"operations": [{"op": "acquire", "name": "x"}]}, 400, "locks_ttl_required"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": 5, "forever": True}]}, 400,
     "locks_ttl_required"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": 0}]}, 400, "locks_bad_ttl"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": "5"}]}, 400,
     "locks_bad_ttl"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": 1.5}]}, 400,
     "locks_bad_ttl"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": 5, "owner": ""}]}, 400,
     "locks_bad_owner"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": 5, "owner": 3}]}, 400,
     "locks_bad_owner"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": 5, "limit": 0}]}, 400,
     "locks_bad_limit"),
    ({"operations": [{"op": "acquire", "name": "x", "ttlSeconds": 5, "limit": 1025}]}, 400,
     "locks_bad_limit"),
    ({"operations": [{"op": "renew", "name": "x", "ttlSeconds": 5}]}, 400,
     "locks_token_required"),
    ({"operations": [{"op": "release", "name": "x", "token": 0}]}, 400, "locks_bad_token"),
    ({"operations": [{"op": "release", "name": "x", "token": "7"}]}, 400, "locks_bad_token"),
    ({"operations": [{"op": "release", "name": "x", "token": 7, "slot": -1}]}, 400,
     "locks_bad_slot"),
    ({"operations": [{"op": "release", "name": "x", "token": 7, "slot": 1024}]}, 400,
     "locks_bad_slot"),
    ({"operations": [{"op": "get", "name": "x"}, {"op": "release", "name": "x",
                                                  "token": 7}]}, 400,
     "locks_duplicate_in_call"),
    ({"operations": [{"op": "get", "name": f"l{i}"} for i in range(65)]}, 400,
     "locks_too_many_ops"),
    ({"operations": [{"op": "acquire", "name": f"s{i}", "ttlSeconds": 1, "limit": 1024}
                     for i in range(5)]}, 400, "locks_too_many_keys"),
]


@pytest.mark.parametrize(("body", "status", "reason"), BAD)
def test_bad_calls_are_refused_in_the_kv_shape_and_write_nothing(broker, db, body, status,
                                                                 reason):
    before = lock_rows(db)
    r = broker.client.post(LOCKS, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["reason"] == reason, err
    assert err["error"] == err["code"] and err["detail"], err
    after, (now,) = lock_rows(db), db.execute("SELECT now()").fetchone()
    # nothing new, nothing changed; a row gone is only one whose TTL ran out meanwhile (an
    # earlier test's lock: the expiry sweep may delete it at any time)
    assert {k: before.get(k) for k in after} == after
    expired = {k for k, (_, _, expires_at) in before.items() if expires_at and expires_at <= now}
    assert set(before) - set(after) <= expired


def lock_rows(db) -> dict:
    """The namespace's rows by key: (version, updated_at, expires_at)."""
    return {key: row for key, *row in db.execute(
        "SELECT key, version, updated_at, expires_at FROM queen.kv WHERE ns = %s", (NS,))}


def test_malformed_and_oversized_bodies(broker):
    r = broker.client.post(LOCKS, content=b"{not json", headers={"content-type":
                                                                  "application/json"})
    assert r.status_code == 400 and r.json()["reason"] == "locks_bad_request", r.text
    big = b'{"operations": [], "pad": "' + b"x" * (1 << 20) + b'"}'
    r = broker.client.post(LOCKS, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "body_too_large", r.text
