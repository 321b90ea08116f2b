"""KV (api.md 2.5 "KV ops", 2.11 ``POST /api/v1/kv``; sql/050_kv.sql): every op's happy path
and failure reasons, reads of the call's own writes, expiry, ``required`` rollbacks, the
precondition race, maintenance, the purge, the error shapes.

Real broker process over HTTP on the session database, checked with SQL on ``queen.kv``;
every test uses its own namespaces. Purge counts run on a fresh database of their own.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from queen_mp.db import kv_procs

KV = "/api/v1/kv"
ZERO = uuid.UUID(int=0)
OTHER_TENANT = uuid.UUID("11111111-2222-3333-4444-555555555555")
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# ---------------------------------------------------------------------------------- helpers
def uns(prefix: str = "kv") -> str:
    """A namespace no other test (nor an earlier run on the shared database) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def call(client: httpx.Client, *ops: dict[str, Any], status: int = 200) -> dict:
    r = client.post(KV, json={"operations": list(ops)})
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def results(client: httpx.Client, *ops: dict[str, Any]) -> list[dict]:
    body = call(client, *ops)
    assert body["success"] is True, body
    out = body["results"]
    assert [r["index"] for r in out] == list(range(len(ops))), out
    assert [r["op"] for r in out] == [op["op"] for op in ops], out
    return out


def one(client: httpx.Client, op: dict[str, Any]) -> dict:
    return results(client, op)[0]


def put(ns: str, key: str, value: Any, **extra: Any) -> dict:
    if "ttlSeconds" not in extra:
        extra.setdefault("forever", True)
    return {"op": "put", "ns": ns, "key": key, "value": value, **extra}


def get(ns: str, key: str) -> dict:
    return {"op": "get", "ns": ns, "key": key}


def row(db: psycopg.Connection, ns: str, key: str, tenant: uuid.UUID = ZERO) -> dict | None:
    cur = db.execute("SELECT value, version, expires_at, created_at, updated_at FROM queen.kv "
                     "WHERE tenant = %s AND ns = %s AND key = %s", (tenant, ns, key))
    found = cur.fetchone()
    if found is None:
        return None
    names = ["value", "version", "expires_at", "created_at", "updated_at"]
    return dict(zip(names, found, strict=True))


def keys(db: psycopg.Connection, ns: str) -> list[str]:
    return [r[0] for r in db.execute("SELECT key FROM queen.kv WHERE ns = %s ORDER BY key",
                                     (ns,))]


def expire(db: psycopg.Connection, ns: str, key: str) -> None:
    db.execute("UPDATE queen.kv SET expires_at = now() - interval '1 second' "
               "WHERE ns = %s AND key = %s", (ns, key))


def failed(r: dict, reason: str, version: int | None, value: Any = None) -> None:
    assert r["applied"] is False, r
    assert (r["reason"], r["version"], r["value"]) == (reason, version, value), r


# ---------------------------------------------------------------------------------- get / put
def test_put_then_get(broker, db):
    ns = uns()
    assert one(broker.client, put(ns, "k", {"status": "paid"})) == {
        "index": 0, "op": "put", "applied": True, "version": 1}
    g = one(broker.client, get(ns, "k"))
    assert g["found"] is True and g["key"] == "k" and g["value"] == {"status": "paid"}
    assert g["version"] == 1 and g["expiresAt"] is None
    assert ISO_MS.match(g["updatedAt"]), g
    stored = row(db, ns, "k")
    assert stored is not None
    assert stored["value"] == {"status": "paid"} and stored["version"] == 1
    assert stored["expires_at"] is None


def test_get_absent(broker):
    assert one(broker.client, get(uns(), "nothing")) == {
        "index": 0, "op": "get", "found": False, "key": "nothing", "value": None,
        "version": None, "expiresAt": None, "updatedAt": None}


def test_null_and_scalar_values_round_trip(broker):
    ns = uns()
    values = [None, 0, "text", [1, 2], {"a": {"b": [True, 1.5]}}, False]
    results(broker.client, *[put(ns, f"v{i}", v) for i, v in enumerate(values)])
    got = results(broker.client, *[get(ns, f"v{i}") for i in range(len(values))])
    assert [g["value"] for g in got] == values
    assert all(g["found"] for g in got)


def test_ttl_put_sets_expires_at(broker, db):
    ns = uns()
    before = time.time()
    one(broker.client, put(ns, "k", 1, ttlSeconds=3600))
    g = one(broker.client, get(ns, "k"))
    assert ISO_MS.match(g["expiresAt"]), g
    stored = row(db, ns, "k")
    assert stored is not None
    delta = stored["expires_at"].timestamp() - before
    assert 3590 < delta < 3700, delta


def test_versions_count_writes_and_put_replaces_expiry(broker, db):
    ns = uns()
    got = results(broker.client, put(ns, "k", 1, ttlSeconds=60), put(ns, "k", 2),
                  put(ns, "k", 3, ttlSeconds=120))
    assert [r["version"] for r in got] == [1, 2, 3]
    stored = row(db, ns, "k")
    assert stored is not None and stored["version"] == 3 and stored["value"] == 3
    assert stored["expires_at"] is not None  # the last put's ttl, not inherited
    one(broker.client, put(ns, "k", 4))
    stored = row(db, ns, "k")
    assert stored is not None and stored["expires_at"] is None and stored["version"] == 4


def test_put_expect_reasons(broker, db):
    ns = uns()
    one(broker.client, put(ns, "k", "v1"))
    ok, stale, exists, absent = results(
        broker.client,
        put(ns, "k", "v2", expect=1),
        put(ns, "k", "v3", expect=1),
        put(ns, "k", "v3", expect=0),
        put(ns, "nope", "x", expect=4))
    assert ok == {"index": 0, "op": "put", "applied": True, "version": 2}
    failed(stale, "version", 2, "v2")
    failed(exists, "exists", 2, "v2")
    failed(absent, "absent", None, None)
    assert row(db, ns, "nope") is None  # an expect that matched nothing created nothing
    stored = row(db, ns, "k")
    assert stored is not None and (stored["value"], stored["version"]) == ("v2", 2)
    created = one(broker.client, put(ns, "fresh", 1, expect=0))
    assert created["applied"] is True and created["version"] == 1


def test_put_if_absent(broker, db):
    ns = uns()
    first, second = results(
        broker.client,
        {"op": "putIfAbsent", "ns": ns, "key": "k", "value": {"owner": "a"},
         "ttlSeconds": 60},
        {"op": "putIfAbsent", "ns": ns, "key": "k", "value": {"owner": "b"}, "forever": True})
    assert first["applied"] is True and first["version"] == 1
    failed(second, "exists", 1, {"owner": "a"})
    stored = row(db, ns, "k")
    assert stored is not None and stored["value"] == {"owner": "a"}


# ---------------------------------------------------------------------------------- delete
def test_delete_reasons_and_version_restart(broker, db):
    ns = uns()
    results(broker.client, put(ns, "k", 1), put(ns, "k", 2))
    absent, stale, zero, ok, again = results(
        broker.client,
        {"op": "delete", "ns": ns, "key": "other"},
        {"op": "delete", "ns": ns, "key": "k", "expect": 1},
        {"op": "delete", "ns": ns, "key": "k", "expect": 0},
        {"op": "delete", "ns": ns, "key": "k", "expect": 2},
        {"op": "delete", "ns": ns, "key": "k"})
    failed(absent, "absent", None)
    failed(stale, "version", 2, 2)
    failed(zero, "exists", 2, 2)
    assert ok == {"index": 3, "op": "delete", "applied": True}
    failed(again, "absent", None)
    assert row(db, ns, "k") is None
    assert one(broker.client, get(ns, "k"))["found"] is False
    # a new lineage starts at version 1
    assert one(broker.client, put(ns, "k", 3))["version"] == 1
    # expect 0 on an absent key: applied, nothing to delete
    assert one(broker.client, {"op": "delete", "ns": ns, "key": "gone", "expect": 0})[
        "applied"] is True


# ---------------------------------------------------------------------------------- check
def test_check_reasons_and_no_write(broker, db):
    ns = uns()
    one(broker.client, put(ns, "k", "v"))
    c = [{"op": "check", "ns": ns, "key": key, "expect": e}
         for key, e in (("k", 1), ("k", 2), ("k", 0), ("none", 0), ("none", 1))]
    ok, stale, exists, absent_ok, absent = results(broker.client, *c)
    assert ok == {"index": 0, "op": "check", "applied": True}
    failed(stale, "version", 1, "v")
    failed(exists, "exists", 1, "v")
    assert absent_ok["applied"] is True
    failed(absent, "absent", None)
    stored = row(db, ns, "k")
    assert stored is not None and stored["version"] == 1
    assert row(db, ns, "none") is None


# ---------------------------------------------------------------------------------- incr
def test_incr_creates_counts_and_keeps_expiry(broker, db):
    ns = uns()
    first = one(broker.client, {"op": "incr", "ns": ns, "key": "c", "delta": 5,
                                "ttlSeconds": 3600})
    assert first == {"index": 0, "op": "incr", "applied": True, "value": 5, "version": 1}
    created = row(db, ns, "c")
    assert created is not None and created["expires_at"] is not None
    second, third = results(
        broker.client,
        {"op": "incr", "ns": ns, "key": "c", "delta": 3, "forever": True},
        {"op": "incr", "ns": ns, "key": "c", "delta": -10, "ttlSeconds": 5})
    assert (second["value"], second["version"]) == (8, 2)
    assert (third["value"], third["version"]) == (-2, 3)
    stored = row(db, ns, "c")
    assert stored is not None and stored["value"] == -2
    # a live key keeps the expiry it was created with
    assert stored["expires_at"] == created["expires_at"]


def test_incr_bounds(broker, db):
    ns = uns()
    one(broker.client, {"op": "incr", "ns": ns, "key": "c", "delta": 9, "forever": True})
    over, under, edge, absent_over = results(
        broker.client,
        {"op": "incr", "ns": ns, "key": "c", "delta": 2, "max": 10, "forever": True},
        {"op": "incr", "ns": ns, "key": "c", "delta": -10, "min": 0, "forever": True},
        {"op": "incr", "ns": ns, "key": "c", "delta": 1, "min": 0, "max": 10,
         "forever": True},
        {"op": "incr", "ns": ns, "key": "new", "delta": 7, "max": 5, "forever": True})
    failed(over, "bounds", 1, 9)
    failed(under, "bounds", 1, 9)
    assert (edge["applied"], edge["value"], edge["version"]) == (True, 10, 2)
    failed(absent_over, "bounds", None)
    assert row(db, ns, "new") is None
    # past int64 is out of bounds too
    big = one(broker.client, {"op": "incr", "ns": ns, "key": "c",
                              "delta": (1 << 63) - 1, "forever": True})
    failed(big, "bounds", 2, 10)


def test_incr_of_a_non_number_is_refused(broker, db):
    ns = uns()
    one(broker.client, put(ns, "s", "text"))
    failed(one(broker.client, {"op": "incr", "ns": ns, "key": "s", "delta": 1,
                               "forever": True}), "type", 1, "text")
    stored = row(db, ns, "s")
    assert stored is not None and stored["value"] == "text"


# ---------------------------------------------------------------------------------- reads
def test_reads_see_earlier_writes_of_the_call(broker):
    ns = uns()
    got = results(
        broker.client,
        get(ns, "a"),
        put(ns, "a", 1),
        get(ns, "a"),
        {"op": "incr", "ns": ns, "key": "n", "delta": 2, "forever": True},
        {"op": "getMany", "ns": ns, "keys": ["a", "n", "zz"]},
        {"op": "getPrefix", "ns": ns, "prefix": ""},
        {"op": "delete", "ns": ns, "key": "a"},
        get(ns, "a"),
        put(ns, "a", 2, expect=0))
    assert got[0]["found"] is False
    assert got[2]["found"] is True and got[2]["value"] == 1
    assert [r["key"] for r in got[4]["rows"]] == ["a", "n"]
    assert got[4]["missing"] == ["zz"] and got[4]["truncated"] is False
    assert [r["key"] for r in got[5]["rows"]] == ["a", "n"]
    assert got[7]["found"] is False
    assert got[8]["applied"] is True and got[8]["version"] == 1


def test_get_many_order_duplicates_and_missing(broker):
    ns = uns()
    results(broker.client, put(ns, "b", "B"), put(ns, "a", "A"), put(ns, "c", "C"))
    r = one(broker.client, {"op": "getMany", "ns": ns, "keys": ["c", "x", "a", "c", "y"]})
    assert [(x["key"], x["value"], x["version"]) for x in r["rows"]] == [
        ("c", "C", 1), ("a", "A", 1)]
    assert all(ISO_MS.match(x["updatedAt"]) and x["expiresAt"] is None for x in r["rows"])
    assert r["missing"] == ["x", "y"] and r["truncated"] is False
    empty = one(broker.client, {"op": "getMany", "ns": ns, "keys": []})
    assert (empty["rows"], empty["missing"], empty["truncated"]) == ([], [], False)


def test_get_many_truncated_by_the_read_budget(broker, db):
    """9 values of 1 MiB: the 8 MiB read budget returns 8 rows; the cut key is neither in
    rows nor in missing, and truncated says so."""
    ns = uns()
    db.execute("INSERT INTO queen.kv (ns, key, value) SELECT %s, 'k' || i, "
               "to_jsonb(repeat('x', 1048576)) FROM generate_series(1, 9) i", (ns,))
    names = [f"k{i}" for i in range(1, 10)] + ["absent"]
    r = one(broker.client, {"op": "getMany", "ns": ns, "keys": names})
    assert r["truncated"] is True
    assert [x["key"] for x in r["rows"]] == names[:8]
    assert r["missing"] == ["absent"]


def test_get_prefix_paging(broker):
    ns = uns()
    names = [f"p/{i:02d}" for i in range(25)]
    results(broker.client, *[put(ns, n, i) for i, n in enumerate(names)],
            put(ns, "p", "exact"), put(ns, "q/1", "other"), put(ns, "o/9", "other"))
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        op = {"op": "getPrefix", "ns": ns, "prefix": "p/", "limit": 10}
        if after is not None:
            op["after"] = after
        page = one(broker.client, op)
        pages += 1
        seen += [x["key"] for x in page["rows"]]
        assert all("value" in x for x in page["rows"])
        if not page["truncated"]:
            assert page["nextAfter"] is None
            break
        assert page["nextAfter"] == page["rows"][-1]["key"]
        after = page["nextAfter"]
    assert seen == names and pages == 3
    everything = one(broker.client, {"op": "getPrefix", "ns": ns, "prefix": "p",
                                     "keysOnly": True, "limit": 5000})
    assert [x["key"] for x in everything["rows"]] == ["p", *names]
    assert everything["truncated"] is False
    assert set(everything["rows"][0]) == {"key", "version", "expiresAt", "updatedAt"}


def test_get_prefix_is_byte_ordered_and_exact(broker):
    ns = uns()
    names = ["ab", "aB", "ab\u00e9", "ab~", "ab\U0010ffff", "ac", "a", "b"]
    results(broker.client, *[put(ns, n, 1) for n in names])
    page = one(broker.client, {"op": "getPrefix", "ns": ns, "prefix": "ab"})
    assert [x["key"] for x in page["rows"]] == ["ab", "ab~", "ab\u00e9", "ab\U0010ffff"]
    tail = one(broker.client, {"op": "getPrefix", "ns": ns, "prefix": "ab\U0010ffff"})
    assert [x["key"] for x in tail["rows"]] == ["ab\U0010ffff"]


# ---------------------------------------------------------------------------------- expiry
def test_expired_keys_are_invisible_to_every_op(broker, db):
    ns = uns()
    results(broker.client, put(ns, "dead", {"old": True}, ttlSeconds=60),
            put(ns, "dead2", 1, ttlSeconds=60), put(ns, "live", 1, ttlSeconds=60))
    results(broker.client, put(ns, "dead", {"old": True}, ttlSeconds=60))  # version 2
    expire(db, ns, "dead")
    expire(db, ns, "dead2")
    g, many, prefix, cas, chk, dele = results(
        broker.client,
        get(ns, "dead"),
        {"op": "getMany", "ns": ns, "keys": ["dead", "live"]},
        {"op": "getPrefix", "ns": ns, "prefix": ""},
        put(ns, "dead2", 2, expect=1),
        {"op": "check", "ns": ns, "key": "dead", "expect": 0},
        {"op": "delete", "ns": ns, "key": "dead2"})
    assert g["found"] is False
    assert [x["key"] for x in many["rows"]] == ["live"] and many["missing"] == ["dead"]
    assert [x["key"] for x in prefix["rows"]] == ["live"]
    failed(cas, "absent", None)
    assert chk["applied"] is True
    failed(dele, "absent", None)
    # the expired row's slot is free: a new lineage at version 1
    fresh = one(broker.client, {"op": "putIfAbsent", "ns": ns, "key": "dead", "value": "new",
                                "forever": True})
    assert fresh == {"index": 0, "op": "putIfAbsent", "applied": True, "version": 1}
    stored = row(db, ns, "dead")
    assert stored is not None and stored["value"] == "new" and stored["expires_at"] is None
    counter = one(broker.client, {"op": "incr", "ns": ns, "key": "dead2", "delta": 4,
                                  "forever": True})
    assert (counter["value"], counter["version"]) == (4, 1)


def test_ttl_one_second_expires(broker):
    ns = uns()
    one(broker.client, put(ns, "k", 1, ttlSeconds=1))
    assert one(broker.client, get(ns, "k"))["found"] is True
    time.sleep(1.3)
    assert one(broker.client, get(ns, "k"))["found"] is False


def test_forever_keys_stay(broker, db):
    ns = uns()
    one(broker.client, put(ns, "k", 1))
    stored = row(db, ns, "k")
    assert stored is not None and stored["expires_at"] is None
    g = one(broker.client, get(ns, "k"))
    assert g["found"] is True and g["expiresAt"] is None


# ---------------------------------------------------------------------------------- required
def test_required_failure_rolls_back_the_call(broker, db):
    ns = uns()
    one(broker.client, put(ns, "owner", {"owner": "w-1"}))
    one(broker.client, put(ns, "owner", {"owner": "w-1"}))  # version 2
    body = call(broker.client,
                put(ns, "x", 1),
                {"op": "incr", "ns": ns, "key": "n", "delta": 1, "forever": True},
                get(ns, "owner"),
                put(ns, "owner", {"owner": "w-2"}, expect=1, required=True),
                put(ns, "after", 1))
    assert body == {
        "success": False, "reason": "kv_precondition",
        "error": "kv precondition failed at index 3", "failedIndex": 3, "kvReason": "version",
        "version": 2, "value": {"owner": "w-1"},
        "results": [
            {"index": 0, "op": "put", "applied": False},
            {"index": 1, "op": "incr", "applied": False},
            {"index": 2, "op": "get", "applied": False},
            {"index": 3, "op": "put", "applied": False, "reason": "version", "version": 2,
             "value": {"owner": "w-1"}},
            {"index": 4, "op": "put", "applied": False}]}
    assert keys(db, ns) == ["owner"]
    stored = row(db, ns, "owner")
    assert stored is not None and stored["version"] == 2


@pytest.mark.parametrize("op,reason,version,value", [
    ({"op": "putIfAbsent", "value": 0, "forever": True}, "exists", 1, "held"),
    ({"op": "check", "expect": 0}, "exists", 1, "held"),
    ({"op": "delete", "key": "absent"}, "absent", None, None),
    ({"op": "incr", "delta": 1, "forever": True}, "type", 1, "held"),
    ({"op": "incr", "key": "c", "delta": 5, "max": 3, "forever": True}, "bounds", None, None),
])
def test_required_failure_of_each_write_kind(broker, db, op, reason, version, value):
    ns = uns()
    one(broker.client, put(ns, "k", "held"))
    body = call(broker.client, put(ns, "first", 1),
                {"ns": ns, "key": "k", **op, "required": True})
    assert body["success"] is False and body["failedIndex"] == 1, body
    assert (body["kvReason"], body["version"], body["value"]) == (reason, version, value)
    assert [r["applied"] for r in body["results"]] == [False, False]
    assert keys(db, ns) == ["k"]


def test_required_success_and_unrequired_failure_commit(broker, db):
    ns = uns()
    got = results(broker.client, put(ns, "a", 1, required=True),
                  put(ns, "b", 1, expect=9), put(ns, "c", 1, expect=0, required=True))
    assert [r["applied"] for r in got] == [True, False, True]
    assert keys(db, ns) == ["a", "c"]


# ---------------------------------------------------------------------------------- race
def test_precondition_race_has_one_winner(broker, db):
    """Two concurrent calls with the same expect: exactly one applies, the loser sees the
    winner's version and value (20 rounds; odd rounds with required)."""
    ns = uns()
    clients = [httpx.Client(base_url=broker.url, timeout=60) for _ in range(2)]
    try:
        for rnd in range(20):
            key = f"race-{rnd}"
            one(broker.client, put(ns, key, "start"))
            required = rnd % 2 == 1
            barrier = threading.Barrier(2)
            out: list[Any] = [None, None]

            def run(i: int, key: str = key, required: bool = required,
                    barrier: threading.Barrier = barrier, out: list[Any] = out) -> None:
                barrier.wait()
                out[i] = call(clients[i], put(ns, key, f"writer-{i}", expect=1,
                                              required=required))

            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            if required:
                won = [b for b in out if b["success"]]
                lost = [b for b in out if not b["success"]]
                assert len(won) == 1 and len(lost) == 1, out
                winner_value = f"writer-{out.index(won[0])}"
                assert won[0]["results"][0]["version"] == 2
                assert (lost[0]["kvReason"], lost[0]["version"], lost[0]["value"]) == (
                    "version", 2, winner_value)
            else:
                res = [b["results"][0] for b in out]
                won = [r for r in res if r["applied"]]
                lost = [r for r in res if not r["applied"]]
                assert len(won) == 1 and len(lost) == 1, res
                winner_value = f"writer-{res.index(won[0])}"
                failed(lost[0], "version", 2, winner_value)
            stored = row(db, ns, key)
            assert stored is not None
            assert (stored["version"], stored["value"]) == (2, winner_value)
    finally:
        for c in clients:
            c.close()


def test_concurrent_put_if_absent_has_one_winner(broker, db):
    ns = uns()
    n = 8
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        with httpx.Client(base_url=broker.url, timeout=60) as c:
            barrier.wait()
            out[i] = call(c, {"op": "putIfAbsent", "ns": ns, "key": "gate",
                              "value": {"holder": i}, "ttlSeconds": 60})["results"][0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [i for i, r in enumerate(out) if r["applied"]]
    assert len(winners) == 1, out
    for r in out:
        if not r["applied"]:
            failed(r, "exists", 1, {"holder": winners[0]})
    stored = row(db, ns, "gate")
    assert stored is not None and stored["value"] == {"holder": winners[0]}


def _apply_sql(conn: psycopg.Connection, ops: list[dict[str, Any]]) -> list[dict]:
    return conn.execute("SELECT queen.kv_apply_v1(%s, %s::jsonb)",
                        (ZERO, orjson.dumps(ops).decode())).fetchone()[0]


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    return t, box


@pytest.mark.parametrize("first_commits", [True, False])
def test_sql_waiting_writer_decides_on_the_winners_row(db_dsn, db, first_commits):
    """Deterministic race: B waits on A's row lock (update path) and on A's uncommitted
    insert (create path), then decides on what A left: the winner's row, or none."""
    ns = uns()
    _apply_sql(db, [{"op": "put", "ns": ns, "key": "old", "value": 0, "ttlSeconds": None,
                     "expect": None, "required": False}])
    cas = {"op": "put", "ns": ns, "key": "old", "value": None, "ttlSeconds": None,
           "expect": 1, "required": False}
    gate = {"op": "putIfAbsent", "ns": ns, "key": "new", "value": None, "ttlSeconds": None,
            "required": False}
    with psycopg.connect(db_dsn) as a, psycopg.connect(db_dsn, autocommit=True) as b:
        _apply_sql(a, [{**cas, "value": "A"}, {**gate, "value": "A"}])
        t, box = _in_thread(lambda: _apply_sql(b, [{**cas, "value": "B"},
                                                   {**gate, "value": "B"}]))
        time.sleep(0.5)
        assert t.is_alive()  # B waits on A's locks
        if first_commits:
            a.commit()
        else:
            a.rollback()
        t.join(10)
    [old, new] = box[0]
    if first_commits:
        failed(old, "version", 2, "A")
        failed(new, "exists", 1, "A")
    else:
        assert (old["applied"], old["version"]) == (True, 2)
        assert (new["applied"], new["version"]) == (True, 1)
    winner = "A" if first_commits else "B"
    assert (row(db, ns, "old") or {})["value"] == winner
    assert (row(db, ns, "new") or {})["value"] == winner


# ---------------------------------------------------------------------------------- tenancy
def test_another_tenants_rows_are_invisible(broker, db):
    ns = uns()
    db.execute("INSERT INTO queen.kv (tenant, ns, key, value) VALUES (%s, %s, 'k', '1')",
               (OTHER_TENANT, ns))
    assert one(broker.client, get(ns, "k"))["found"] is False
    assert one(broker.client, {"op": "getPrefix", "ns": ns, "prefix": ""})["rows"] == []
    assert one(broker.client, put(ns, "k", 2, expect=0))["version"] == 1
    other = row(db, ns, "k", OTHER_TENANT)
    assert other is not None and other["value"] == 1


# ---------------------------------------------------------------------------------- maintenance
def test_maintenance_refuses_writes(broker, db):
    ns = uns()
    one(broker.client, put(ns, "k", "before"))
    db.execute("UPDATE queen.system_settings SET value = 'true' WHERE key = 'maintenance_mode'")
    try:
        body = call(broker.client, get(ns, "k"), put(ns, "k", "during"),
                    put(ns, "new", 1), status=503)
        assert body["error"] == "maintenance" and body["code"] == "maintenance"
        assert body["reason"] == "maintenance" and body["detail"]
        # a read-only call is still served
        assert one(broker.client, get(ns, "k"))["value"] == "before"
    finally:
        db.execute("UPDATE queen.system_settings SET value = 'false' "
                   "WHERE key = 'maintenance_mode'")
    assert keys(db, ns) == ["k"]
    stored = row(db, ns, "k")
    assert stored is not None and (stored["value"], stored["version"]) == ("before", 1)
    assert one(broker.client, put(ns, "k", "after"))["version"] == 2


# ---------------------------------------------------------------------------------- errors
def test_key_over_1024_bytes_is_413(broker, db):
    ns = uns()
    r = broker.client.post(KV, json={"operations": [get(ns, "ok"), put(ns, "k" * 1025, 1)]})
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["error"] == "name_too_long" and body["code"] == "name_too_long"
    assert body["reason"] == "kv_key_too_long" and "1025" in body["detail"]
    assert body["index"] == 1 and body["limit"] == 1024 and body["field"] == "key"
    r = broker.client.post(KV, json={"operations": [get("n" * 256, "k")]})
    assert r.status_code == 413 and r.json()["reason"] == "kv_namespace_too_long"
    assert one(broker.client, put(ns, "k" * 1024, 1))["applied"] is True
    assert keys(db, ns) == ["k" * 1024]


@pytest.mark.parametrize("content,code,reason", [
    (b"{not json", "invalid_request", "kv_bad_request"),
    (b"[]", "invalid_request", "kv_bad_request"),
    (b'{"ops": []}', "invalid_request", "kv_bad_request"),
    (b'{"operations": {}}', "invalid_request", "kv_bad_request"),
    (b'{"operations": [{"op": "put", "ns": "n", "key": "k", "value": 1}]}', "invalid_request",
     "kv_expiry_not_specified"),
    (b'{"operations": [{"op": "frob", "ns": "n", "key": "k"}]}', "invalid_request",
     "kv_unknown_op"),
    (b'{"operations": [{"op": "get", "ns": "", "key": "k"}]}', "invalid_name",
     "kv_bad_namespace"),
    (b'{"operations": [{"op": "incr", "ns": "n", "key": "k", "delta": 1.5, "forever": true}]}',
     "invalid_request", "kv_bad_delta"),
])
def test_bad_bodies_are_400_in_the_kv_shape(broker, content, code, reason):
    r = broker.client.post(KV, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert (body["error"], body["code"], body["reason"]) == (code, code, reason), body
    assert isinstance(body["detail"], str) and body["detail"]


def test_a_bad_op_applies_nothing(broker, db):
    ns = uns()
    r = broker.client.post(KV, json={"operations": [put(ns, "a", 1),
                                                    {"op": "put", "ns": ns, "key": "b"}]})
    assert r.status_code == 400 and r.json()["index"] == 1
    assert keys(db, ns) == []


def test_empty_operations(broker):
    assert call(broker.client) == {"success": True, "results": []}


def test_wrong_method_is_405(broker):
    r = broker.client.get(KV)
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


# ---------------------------------------------------------------------------------- SQL surface
def test_sql_precondition_error_shape(db):
    """QK001 with the documented MESSAGE and DETAIL: the contract of the transaction wire."""
    ns = uns()
    ops = [{"op": "put", "ns": ns, "key": "a", "value": 1, "ttlSeconds": None,
            "expect": None, "required": False},
           {"op": "putIfAbsent", "ns": ns, "key": "a", "value": 2, "ttlSeconds": 5,
            "required": True}]
    with pytest.raises(psycopg.Error) as info:
        db.execute("SELECT queen.kv_apply_v1(%s, %s::jsonb)", (ZERO, orjson.dumps(ops).decode()))
    ex = info.value
    assert ex.sqlstate == "QK001"
    assert ex.diag.message_primary == "kv precondition failed at index 1"
    assert orjson.loads(ex.diag.message_detail or "") == {
        "failedIndex": 1, "kvReason": "exists", "version": 1, "value": 1}
    assert keys(db, ns) == []
    outcome = kv_procs.precondition_failed(ex.diag.message_primary, ex.diag.message_detail)
    assert (outcome.ok, outcome.failed_index, outcome.kv_reason, outcome.version,
            outcome.value) == (False, 1, "exists", 1, 1)


def test_sql_require_writable(db):
    db.execute("SELECT queen.require_writable_v1()")
    with db.transaction():
        db.execute("UPDATE queen.system_settings SET value = 'true' "
                   "WHERE key = 'maintenance_mode'")
        with pytest.raises(psycopg.Error) as info, db.transaction():
            db.execute("SELECT queen.require_writable_v1()")
        assert info.value.sqlstate == "QM001"
        assert info.value.diag.message_primary == "maintenance"
        db.execute("UPDATE queen.system_settings SET value = 'false' "
                   "WHERE key = 'maintenance_mode'")


def test_sql_get_prefix_read_budget(db):
    """The byte budget (queen.kv_read_budget_bytes) cuts a getPrefix page: truncated, and
    nextAfter resumes after the last returned row."""
    ns = uns()
    db.execute("INSERT INTO queen.kv (ns, key, value) SELECT %s, 'k' || i, "
               "to_jsonb(repeat('x', 98)) FROM generate_series(1, 5) i", (ns,))  # 100 B each
    op = [{"op": "getPrefix", "ns": ns, "prefix": "k", "after": None, "limit": 100,
           "keysOnly": False}]
    with db.transaction():
        db.execute("SET LOCAL queen.kv_read_budget_bytes = 250")
        [page] = db.execute("SELECT queen.kv_apply_v1(%s, %s::jsonb)",
                            (ZERO, orjson.dumps(op).decode())).fetchone()[0]
    assert [r["key"] for r in page["rows"]] == ["k1", "k2", "k3"]  # k3 straddles the budget
    assert page["truncated"] is True and page["nextAfter"] == "k3"


def test_sql_prefix_end(db):
    cases = {"ab": "ac", "": None, "a\ud7ff": "a\ue000", "a\U0010ffff": "b",
             "\U0010ffff": None}
    for prefix, end in cases.items():
        got = db.execute("SELECT queen.kv_prefix_end_v1(%s)", (prefix,)).fetchone()[0]
        assert got == end, (prefix, got)


# ---------------------------------------------------------------------------------- purge
def test_purge_expired_deletes_only_expired_rows(fresh_db_dsn):
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        db.execute("""
            INSERT INTO queen.kv (tenant, ns, key, value, expires_at) VALUES
              (%(z)s, 'p', 'old1', '1', now() - interval '1 hour'),
              (%(z)s, 'p', 'old2', '1', now() - interval '2 seconds'),
              (%(o)s, 'p', 'old3', '1', now() - interval '1 minute'),
              (%(z)s, 'p', 'live', '1', now() + interval '1 hour'),
              (%(z)s, 'p', 'forever', '1', NULL)
        """, {"z": ZERO, "o": OTHER_TENANT})

    async def purge(limit: int) -> int:
        conn = await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True)
        async with conn:
            return await kv_procs.purge_expired(conn, limit)

    assert asyncio.run(purge(0)) == 0
    assert asyncio.run(purge(2)) == 2
    assert asyncio.run(purge(100)) == 1
    assert asyncio.run(purge(100)) == 0
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        left = [r[0] for r in db.execute("SELECT key FROM queen.kv ORDER BY key")]
    assert left == ["forever", "live"]


def test_purge_skips_rows_locked_by_a_kv_call(fresh_db_dsn):
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        db.execute("INSERT INTO queen.kv (ns, key, value, expires_at) VALUES "
                   "('p', 'a', '1', now() - interval '1 minute'), "
                   "('p', 'b', '1', now() - interval '1 minute')")
    with psycopg.connect(fresh_db_dsn) as holder:
        holder.execute("SELECT 1 FROM queen.kv WHERE key = 'a' FOR UPDATE")

        async def purge() -> int:
            conn = await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True)
            async with conn:
                return await kv_procs.purge_expired(conn, 10)

        assert asyncio.run(asyncio.wait_for(purge(), 10)) == 1
        holder.rollback()
    with psycopg.connect(fresh_db_dsn, autocommit=True) as db:
        assert [r[0] for r in db.execute("SELECT key FROM queen.kv")] == ["a"]
