"""Issue 9, tenancy (api.md 1.5, design.md invariant 8): two tenants on same-named queues see
and touch nothing of each other, through every route; a foreign lease id answers exactly as an
unknown one; producerSub comes from the token's ``sub`` and never from the body.

One broker with JWT authentication on (HS256) for the module; tenant A is named by a string
(uuid5 of it), tenant B by a UUID; every test makes its own queue names.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest

from queen_mp.auth import tenant_from_claim
from queen_mp.db.retention_procs import OTHER_TENANTS_LABEL
from queen_mp.wire.frames import FLAG_PRODUCER, iter_chunks
from tests.brokerharness import Broker
from tests.integration.authkit import bearer, start_auth_broker, token
from tests.integration.test_push_binary import frame, frames_body, plain_body, uuid7, z
from tests.integration.test_push_json import decode_blob, uq

U32 = struct.Struct("<I")


@dataclass
class Tenant:
    claim: str | None
    rw: dict[str, str]
    admin: dict[str, str]
    ro: dict[str, str]

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=tenant_from_claim(self.claim))


def make_tenant(claim: str | None, sub: str | None) -> Tenant:
    return Tenant(claim, bearer(token("read-write", tenant=claim, sub=sub)),
                  bearer(token("admin", tenant=claim, sub=sub)),
                  bearer(token("read-only", tenant=claim, sub=sub)))


@pytest.fixture(scope="module")
def tb(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_auth_broker(tmp_path_factory.mktemp("tenancy"), db_dsn, QUEEN_HOUSEKEEPING_S="1",
                          QUEEN_METRICS_QUEUE_S="1")
    yield b
    assert b.stop() == 0, b.log()[-4000:]


@pytest.fixture
def two() -> tuple[Tenant, Tenant]:
    a = make_tenant("alpha-" + uuid.uuid4().hex[:8], "alice")
    b = make_tenant(str(uuid.uuid4()), "bob")
    return a, b


# ---------------------------------------------------------------------------------- helpers
def push(c: httpx.Client, t: Tenant, queue: str, payloads: list[Any], **item: Any) -> list[dict]:
    r = c.post("/api/v1/push", headers=t.rw, json={"items": [
        {"queue": queue, "payload": p, **item} for p in payloads]})
    assert r.status_code == 201, r.text
    assert {x["status"] for x in r.json()} == {"queued"}, r.text
    return r.json()


def pop(c: httpx.Client, t: Tenant, queue: str, *, group: str | None = None, batch: int = 100,
        **params: Any) -> dict | None:
    query = {"batch": str(batch), **{k: str(v) for k, v in params.items()}}
    if group:
        query["consumerGroup"] = group
    r = c.get(f"/api/v1/pop/queue/{queue}", params=query, headers=t.rw)
    if r.status_code == 204:
        return None
    assert r.status_code == 200, r.text
    return r.json()


def ack(c: httpx.Client, t: Tenant, m: dict, status: str = "completed", **extra: Any) -> dict:
    body = {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m.get("leaseId"), "status": status, **extra}
    r = c.post("/api/v1/ack", headers=t.rw, json=body)
    assert r.status_code == 200, r.text
    return r.json()[0]


def without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def queue_tenants(db: psycopg.Connection, queue: str) -> set[uuid.UUID]:
    return {r[0] for r in db.execute("SELECT tenant FROM queen.queues WHERE name = %s",
                                     (queue,)).fetchall()}


# ---------------------------------------------------------------------------------- core
def test_same_named_queue_push_pop_is_disjoint(tb, two, db):
    a, b = two
    q = uq("ten")
    push(tb.client, a, q, [{"who": "a", "n": i} for i in range(3)])
    push(tb.client, b, q, [{"who": "b", "n": i} for i in range(2)])
    # one transactionId in both tenants: dedup is per tenant, both are stored
    push(tb.client, a, q, ["dup"], transactionId="same-txn")
    push(tb.client, b, q, ["dup"], transactionId="same-txn")
    assert queue_tenants(db, q) == {a.uuid, b.uuid}
    got_a = pop(tb.client, a, q)
    got_b = pop(tb.client, b, q)
    assert [m["data"] for m in got_a["messages"]] == [
        {"who": "a", "n": 0}, {"who": "a", "n": 1}, {"who": "a", "n": 2}, "dup"]
    assert [m["data"] for m in got_b["messages"]] == [{"who": "b", "n": 0},
                                                      {"who": "b", "n": 1}, "dup"]
    assert got_a["partitionId"] != got_b["partitionId"]
    # the default tenant (a token without a tenant claim) has no such queue
    dflt = make_tenant(None, None)
    assert pop(tb.client, dflt, q) is None
    assert tb.client.get(f"/api/v1/resources/queues/{q}", headers=dflt.ro).status_code == 404


def test_foreign_ack_answers_as_an_unknown_partition(tb, two):
    a, b = two
    q = uq("tenack")
    push(tb.client, a, q, ["a1", "a2"])
    got = pop(tb.client, a, q)
    m = got["messages"][0]
    unknown = {**m, "partitionId": str(2**62 + 12345), "leaseId": str(uuid.uuid4())}
    for status in ("completed", "failed", "dlq"):
        foreign = ack(tb.client, b, m, status)
        absent = ack(tb.client, b, unknown, status)
        assert without(foreign, "partitionId") == without(absent, "partitionId")
        assert foreign["success"] is False
    # B's acks changed nothing: A's batch is still leased, A's ack works
    assert pop(tb.client, a, q) is None
    for m in got["messages"]:
        assert ack(tb.client, a, m)["success"] is True


def test_foreign_lease_extend_answers_as_an_unknown_lease(tb, two, db):
    a, b = two
    q = uq("tenlease")
    push(tb.client, a, q, ["x"])
    got = pop(tb.client, a, q)
    lease = got["leaseId"]

    def expiry() -> Any:
        return db.execute("SELECT lease_expires_at FROM queen.log_consumers WHERE lease_id = %s",
                          (lease,)).fetchone()[0]

    before = expiry()
    other = str(uuid.uuid4())
    r1 = tb.client.post(f"/api/v1/lease/{lease}/extend", headers=b.rw, json={"seconds": 3600})
    r2 = tb.client.post(f"/api/v1/lease/{other}/extend", headers=b.rw, json={"seconds": 3600})
    assert r1.status_code == r2.status_code == 200
    assert without(r1.json(), "leaseId") == without(r2.json(), "leaseId") == {
        "success": False, "renewed": 0, "newExpiresAt": None, "expiresAt": None,
        "error": "lease_not_found"}
    assert expiry() == before
    mine = tb.client.post(f"/api/v1/lease/{lease}/extend", headers=a.rw, json={"seconds": 3600})
    assert mine.json()["success"] is True and mine.json()["renewed"] == 1
    assert expiry() > before


def test_dlq_messages_and_resources_are_per_tenant(tb, two):
    a, b = two
    c = tb.client
    q = uq("tendlq")
    push(c, a, q, ["poison"], transactionId="p-1")
    push(c, b, q, ["fine"], transactionId="p-1")
    m = pop(c, a, q, group="g1")["messages"][0]
    assert ack(c, a, m, "dlq", consumerGroup="g1", error="boom")["dlq"] is True
    rows_a = c.get("/api/v1/dlq", params={"queue": q}, headers=a.ro).json()
    rows_b = c.get("/api/v1/dlq", params={"queue": q}, headers=b.ro).json()
    assert rows_a["total"] == 1 and rows_a["messages"][0]["producerSub"] == "alice"
    assert rows_b == {"messages": [], "total": 0, "pagination": {"limit": 100, "offset": 0}}
    assert c.get("/api/v1/dlq", headers=b.ro).json()["total"] == 0
    pid = m["partitionId"]
    # retry and delete of A's row by B: exactly the 404 of a row that does not exist
    for method, path in (("POST", f"/api/v1/messages/{pid}/p-1/retry"),
                         ("DELETE", f"/api/v1/messages/{pid}/p-1")):
        foreign = c.request(method, path, headers=b.rw)
        absent = c.request(method, path.replace(f"/{pid}/", f"/{2**62 + 7}/"), headers=b.rw)
        assert foreign.status_code == absent.status_code == 404
        assert foreign.json()["code"] == absent.json()["code"] == "not_found"
    assert c.get("/api/v1/dlq", params={"queue": q}, headers=a.ro).json()["total"] == 1
    # resources: B sees its own queue only, A's partitions and groups stay invisible
    qa = uq("tenonly")
    push(c, a, qa, [1])
    for path in (f"/api/v1/resources/queues/{qa}", f"/api/v1/resources/queues/{qa}/depth",
                 f"/api/v1/status/queues/{qa}"):
        assert c.get(path, headers=b.ro).status_code == 404, path
        assert c.get(path, headers=a.ro).status_code == 200, path
    names_b = {x["name"] for x in c.get("/api/v1/resources/queues", params={"limit": 1000},
                                         headers=b.ro).json()["queues"]}
    assert names_b == {q}
    parts_b = c.get("/api/v1/resources/partitions", params={"queue": qa}, headers=b.ro).json()
    assert parts_b["partitions"] == [] and parts_b["total"] == 0
    detail = c.get(f"/api/v1/resources/queues/{q}", headers=b.ro).json()
    assert [p["id"] for p in detail["partitions"]] != [pid]
    overview_b = c.get("/api/v1/resources/overview", headers=b.ro).json()
    assert overview_b["queues"] == 1 and overview_b["messages"]["deadLetter"] == 0
    status_b = c.get("/api/v1/status", headers=b.ro).json()
    assert status_b["deadLetterQueue"]["totalMessages"] == 0
    ns_b = {x["namespace"] for x in c.get("/api/v1/resources/namespaces",
                                          headers=b.ro).json()["namespaces"]}
    assert ns_b == {q}


def test_consumer_groups_are_per_tenant(tb, two):
    a, b = two
    c = tb.client
    q = uq("tengrp")
    group = "grp-" + uuid.uuid4().hex[:6]
    push(c, a, q, [1, 2])
    push(c, b, q, [3])
    pop(c, a, q, group=group, batch=1)
    listed_b = c.get("/api/v1/consumer-groups", headers=b.ro).json()
    assert listed_b == []
    assert c.get(f"/api/v1/consumer-groups/{group}", headers=b.ro).status_code == 404
    assert c.get("/api/v1/consumer-groups/lagging", params={"minLagSeconds": 0},
                 headers=b.ro).json() == []
    assert group in {x["name"] for x in c.get("/api/v1/consumer-groups", headers=a.ro).json()}
    # B deletes, seeks and moves "its" group of that name: nothing of A's moves
    r = c.delete(f"/api/v1/consumer-groups/{group}", headers=b.admin)
    assert r.status_code == 200 and r.json()["deletedPartitions"] == 0
    r = c.post(f"/api/v1/consumer-groups/{group}/queues/{q}/seek", headers=b.rw,
               json={"toBeginning": True})
    assert r.status_code == 200  # B's own queue q: its own cursor
    qa = uq("tengrpa")
    push(c, a, qa, [9])
    r = c.post(f"/api/v1/consumer-groups/{group}/queues/{qa}/seek", headers=b.rw,
               json={"toEnd": True})
    assert r.status_code == 404
    detail = c.get(f"/api/v1/consumer-groups/{group}", headers=a.ro).json()
    assert detail[q]["partitions"][0]["leaseActive"] is True
    # A's group goes on where it was: the second message next
    assert c.get(f"/api/v1/consumer-groups/{group}", headers=a.ro).status_code == 200


def test_kv_is_per_tenant(tb, two):
    a, b = two
    c = tb.client
    ns = "ns-" + uuid.uuid4().hex[:6]

    def kv(t: Tenant, *ops: dict) -> list[dict]:
        r = c.post("/api/v1/kv", headers=t.rw, json={"operations": list(ops)})
        assert r.status_code == 200, r.text
        return r.json()["results"]

    assert kv(a, {"op": "put", "ns": ns, "key": "k", "value": "A", "forever": True})[0][
        "version"] == 1
    got = kv(b, {"op": "get", "ns": ns, "key": "k"})[0]
    assert got["found"] is False
    assert kv(b, {"op": "getPrefix", "ns": ns, "prefix": ""})[0]["rows"] == []
    assert kv(b, {"op": "put", "ns": ns, "key": "k", "value": "B", "forever": True,
                  "expect": 0})[0]["applied"] is True
    assert kv(a, {"op": "get", "ns": ns, "key": "k"})[0]["value"] == "A"
    assert kv(b, {"op": "get", "ns": ns, "key": "k"})[0]["value"] == "B"


def test_timers_are_per_tenant_and_carry_the_scheduler_sub(tb, two):
    a, b = two
    c = tb.client
    q = uq("tentimer")
    payload = base64.b64encode(b'{"t":1}').decode()

    def timers(t: Tenant, *ops: dict) -> list[dict]:
        r = c.post("/api/v1/timers", headers=t.rw, json={"operations": list(ops)})
        assert r.status_code == 200, r.text
        return r.json()["results"]

    sched = {"op": "schedule", "queue": q, "timerKey": "k/1", "payload": payload,
             "delayMs": 3_600_000}
    assert timers(a, sched)[0]["status"] == "scheduled"
    assert c.get(f"/api/v1/timers/{q}/k/1", headers=b.ro).status_code == 404
    assert c.get(f"/api/v1/timers/{q}", headers=b.ro).json().get("timers", []) == []
    r = c.delete(f"/api/v1/timers/{q}/k/1", headers=b.rw)
    assert r.status_code == 200 and r.json()["status"] == "absent"
    assert timers(b, sched)[0]["status"] == "scheduled"  # not 'rescheduled': its own timer
    assert c.get(f"/api/v1/timers/{q}/k/1", headers=a.ro).json()["state"] == "pending"
    # a client cannot set producerSub; a fired timer's message carries the scheduler's sub
    bad = c.post("/api/v1/timers", headers=a.rw, json={"operations": [
        {**sched, "producerSub": "mallory"}]})
    assert bad.status_code == 400, bad.text
    assert timers(a, {**sched, "timerKey": "now", "delayMs": 0})[0]["ok"] is True
    deadline = time.monotonic() + 20
    got = None
    while got is None and time.monotonic() < deadline:
        got = pop(c, a, q)
        if got is None:
            time.sleep(0.3)
    assert got is not None
    assert [(m["data"], m["producerSub"]) for m in got["messages"]] == [({"t": 1}, "alice")]
    assert pop(c, b, q) is None


def test_transactions_cannot_reach_another_tenant(tb, two):
    a, b = two
    c = tb.client
    q = uq("tentx")
    push(c, a, q, ["a"])
    m = pop(c, a, q)["messages"][0]
    r = c.post("/api/v1/transaction", headers=b.rw, json={"operations": [
        {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": m["leaseId"]},
        {"type": "push", "items": [{"queue": q, "payload": "from-b"}]}]})
    assert r.status_code == 200 and r.json()["success"] is False
    assert r.json()["reason"] == "rejected_ack"
    r = c.post("/api/v1/transaction", headers=b.rw, json={
        "operations": [{"type": "push", "items": [{"queue": q, "payload": "b"}]}],
        "requiredLeases": [m["leaseId"]]})
    assert r.json()["success"] is False and r.json()["reason"] == "rejected_ack"
    r = c.post("/api/v1/transaction", headers=b.rw, json={
        "operations": [{"type": "push", "items": [{"queue": q, "payload": "b",
                                                    "producerSub": "mallory"}]}],
        "kv": [{"op": "put", "ns": "tx", "key": "k", "value": 1, "forever": True}]})
    assert r.json()["success"] is True, r.text
    got_b = pop(c, b, q)
    assert [(x["data"], x["producerSub"]) for x in got_b["messages"]] == [("b", "bob")]
    assert pop(c, a, q) is None  # A's only message is still leased to A
    r = c.post("/api/v1/transaction", headers=a.rw, json={"operations": [
        {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": m["leaseId"]}]})
    assert r.json()["success"] is True


def test_a_push_wakes_only_its_own_tenant(tb, two):
    a, b = two
    c = tb.client
    q = uq("tenwake")
    # the queue exists for both (a parked pop on an unknown queue waits as well)
    push(c, a, q, ["seed"])
    pop(c, a, q)
    with cf.ThreadPoolExecutor(1) as ex, httpx.Client(base_url=tb.url, timeout=60) as c2:
        started = time.monotonic()
        fut = ex.submit(c2.get, f"/api/v1/pop/queue/{q}",
                        params={"wait": "true", "timeout": "30000"}, headers=b.rw)
        time.sleep(0.5)
        push(c, a, q, ["for-a"])
        time.sleep(0.5)
        assert not fut.done()
        push(c, b, q, ["for-b"])
        r = fut.result()
        assert r.status_code == 200, r.text
        assert [m["data"] for m in r.json()["messages"]] == ["for-b"]
        # woken by b's push, not at its 30 s timeout (12 s: room for a loaded machine)
        assert time.monotonic() - started < 12


# ---------------------------------------------------------------------------------- producerSub
def _stored(db: psycopg.Connection, tenant: uuid.UUID, queue: str) -> list[tuple[int, bytes]]:
    return db.execute(
        "SELECT s.msg_count, s.payload FROM queen.log_segments s "
        "JOIN queen.log_partitions lp ON lp.id = s.partition_id "
        "JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.name = %s AND q.tenant = %s ORDER BY lp.id, s.base_offset",
        (queue, tenant)).fetchall()


def test_producer_sub_on_every_push_format(tb, two, db):
    a, _ = two
    c = tb.client
    q = uq("tensub")
    push(c, a, q, [1], producerSub="mallory")
    r = c.post("/api/v1/push", headers={**a.rw, "content-type": "application/x-queen-push"},
               content=plain_body([(q, "", [("plain-1", b"2")])]))
    assert r.status_code == 201, r.text
    zf = z(frame(uuid7(), "frames-1", b"3") + frame(uuid7(), "frames-2", b"4"))
    r = c.post("/api/v1/push", headers={**a.rw, "content-type": "application/x-queen-push"},
               content=frames_body([(q, "", 2, zf)]))
    assert r.status_code == 201, r.text
    # QTB1: a JSON head then the same frame groups
    head = b'{"operations":[]}'
    groups = frames_body([(q, "", 1, z(frame(uuid7(), "qtb1-1", b"5")))])[5:]
    r = c.post("/api/v1/transaction", headers=a.rw,
               content=b"QTB1\x00" + U32.pack(len(head)) + head + groups)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    got = pop(c, a, q)
    assert [(m["data"], m["producerSub"]) for m in got["messages"]] == [
        (1, "alice"), (2, "alice"), (3, "alice"), (4, "alice"), (5, "alice")]
    # stored with flag 2; the client's zstd frame was rebuilt, not kept, since it changed
    blobs = _stored(db, a.uuid, q)
    frames = [f for _, blob in blobs for *_, fs in decode_blob(blob) for f in fs]
    assert [f.producer_sub for f in frames] == ["alice"] * 5
    assert all(f.flags & FLAG_PRODUCER for f in frames)
    for _, blob in blobs:
        assert all(bytes(ch.data) != zf for ch in iter_chunks(bytes(blob)))
    # framed pop (QPF1) serves the stamped frames
    push(c, a, q, [6])
    r = c.get(f"/api/v1/pop/queue/{q}", headers=a.rw,
              params={"frames": "true", "batch": "10", "consumerGroup": "framed"})
    assert r.status_code == 200 and r.content[:4] == b"QPF1"
    assert b"alice" in r.content


def test_producer_sub_cannot_be_forged_and_is_absent_without_sub(tb, db):
    c = tb.client
    q = uq("tenforge")
    nosub = make_tenant("forge-" + uuid.uuid4().hex[:6], None)
    # a client frame with flag 2 (producerSub) is refused, in QPB1 and in QTB1
    forged = b"\x02" + uuid7() + struct.pack("<H", 3) + b"t-1" + struct.pack("<H", 7) + \
        b"mallory" + b"1"
    forged = U32.pack(len(forged)) + forged
    r = c.post("/api/v1/push", headers={**nosub.rw, "content-type": "application/x-queen-push"},
               content=frames_body([(q, "", 1, z(forged))]))
    assert r.status_code == 400 and r.json()["code"] == "bad_frame", r.text
    head = b"{}"
    r = c.post("/api/v1/transaction", headers=nosub.rw,
               content=b"QTB1\x00" + U32.pack(len(head)) + head
               + frames_body([(q, "", 1, z(forged))])[5:])
    assert r.status_code == 400 and r.json()["code"] == "bad_frame", r.text
    # no sub in the token: no producerSub, even when the body names one
    push(c, nosub, q, ["x"], producerSub="mallory")
    zf = z(frame(uuid7(), "kept-1", b"2"))
    r = c.post("/api/v1/push", headers={**nosub.rw, "content-type": "application/x-queen-push"},
               content=frames_body([(q, "", 1, zf)]))
    assert r.status_code == 201
    got = pop(c, nosub, q)
    assert [m["producerSub"] for m in got["messages"]] == [None, None]
    # without a sub the client's zstd frame is stored byte for byte (api.md 3.2)
    chunks = [bytes(ch.data) for _, blob in _stored(db, nosub.uuid, q)
              for ch in iter_chunks(bytes(blob))]
    assert zf in chunks
    frames = [f for _, blob in _stored(db, nosub.uuid, q) for *_, fs in decode_blob(blob)
              for f in fs]
    assert all(f.producer_sub is None for f in frames)


# ---------------------------------------------------------------------------------- metrics
def test_metrics_never_name_another_tenants_queue(tb, two):
    a, _ = two
    c = tb.client
    secret_q = uq("tenmetric-secret")
    public_q = uq("tenmetric-default")
    dflt = make_tenant(None, None)
    for t, q in ((a, secret_q), (dflt, public_q)):
        push(c, t, q, ["p"])
        m = pop(c, t, q)["messages"][0]
        assert ack(c, t, m, "dlq")["dlq"] is True
    deadline = time.monotonic() + 20
    text = ""
    while time.monotonic() < deadline:
        text = c.get("/metrics/prometheus").text
        if f'queue="{public_q}"' in text and f'queue="{OTHER_TENANTS_LABEL}"' in text:
            break
        time.sleep(0.3)
    assert f'queue="{public_q}"' in text
    assert f'queue="{OTHER_TENANTS_LABEL}"' in text
    assert secret_q not in text
    assert secret_q not in c.get("/metrics").text
    # and the other tenant's name never shows in the route labels either
    c.get(f"/api/v1/resources/queues/{secret_q}", headers=a.ro)
    assert secret_q not in c.get("/metrics/prometheus").text


def test_traces_and_locks_are_per_tenant(tb, two):
    a, b = two
    c = tb.client
    q, tag, name = uq(), "tr-" + uuid.uuid4().hex[:8], "lk-" + uuid.uuid4().hex[:8]
    pid = push(c, a, q, [1], transactionId="m-1")[0]["partitionId"]
    trace = {"transactionId": "m-1", "partitionId": pid, "traceNames": [tag], "data": {"a": 1}}
    # B may not trace A's message, nor read A's traces by any road
    r = c.post("/api/v1/traces", headers=b.rw, json=trace)
    assert r.status_code == 404 and r.json()["success"] is False, r.text
    assert c.post("/api/v1/traces", headers=a.rw, json=trace).status_code == 201
    assert c.get(f"/api/v1/traces/{pid}/m-1", headers=b.ro).json()["traces"] == []
    assert c.get(f"/api/v1/traces/by-name/{tag}", headers=b.ro).json()["total"] == 0
    assert tag not in {n["traceName"] for n in c.get(
        "/api/v1/traces/names", headers=b.ro, params={"limit": 1000}).json()["traceNames"]}
    assert len(c.get(f"/api/v1/traces/{pid}/m-1", headers=a.ro).json()["traces"]) == 1
    assert c.get(f"/api/v1/traces/by-name/{tag}", headers=a.ro).json()["total"] == 1
    # a lock of one name is another lock in each tenant
    acquire = {"op": "acquire", "name": name, "ttlSeconds": 30, "owner": "x"}
    for t in (a, b):
        r = c.post("/api/v1/locks", headers=t.rw, json={"operations": [acquire]})
        assert r.status_code == 200 and r.json()["results"][0]["acquired"] is True, r.text
        assert "already" not in r.json()["results"][0]
    r = c.post("/api/v1/locks", headers=b.ro, json={"operations": [{"op": "get", "name": name}]})
    assert r.status_code == 403 and r.json()["reason"] == "forbidden", r.text


# ---------------------------------------------------------------------------------- offset reads
def test_offset_reads_and_partition_discovery_are_per_tenant(tb, two):
    """api.md 2.15: another tenant's same-named queue reads exactly as an absent one; a
    read-only token may not call them (POST, read-write, as pops)."""
    a, b = two
    c = tb.client
    q = uq("tenread")
    push(c, a, q, ["a1", "a2"], partition="pa")

    def fetch(t: Tenant) -> dict:
        r = c.post("/api/v1/fetch", headers=t.rw, json={"entries": [
            {"queue": q, "partition": "pa", "offset": 0}]})
        assert r.status_code == 200, r.text
        return r.json()["entries"][0]

    def changed(t: Tenant) -> dict:
        r = c.post("/api/v1/partitions/changed", headers=t.rw, json={"entries": [{"queue": q}]})
        assert r.status_code == 200, r.text
        return r.json()["entries"][0]

    assert [r["payload"] for r in fetch(a)["records"]] == ["a1", "a2"]
    assert [p["name"] for p in changed(a)["partitions"]] == ["pa"]
    absent = uq("tenread-none")
    r = c.post("/api/v1/fetch", headers=b.rw, json={"entries": [
        {"queue": absent, "partition": "pa", "offset": 0}]})
    assert without(fetch(b), "queue") == without(r.json()["entries"][0], "queue")
    assert fetch(b)["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert changed(b) == {"queue": q, "error": "UNKNOWN_TOPIC_OR_PARTITION", "partitions": [],
                          "next": None}
    for path in ("/api/v1/fetch", "/api/v1/partitions/changed"):
        assert c.post(path, headers=a.ro, json={"entries": []}).status_code == 403
        assert c.post(path, json={"entries": []}).status_code == 401


# ---------------------------------------------------------------------------------- streams
def test_streams_are_per_tenant(tb, two, db):
    """A query name, its id, its state and the partitions a cycle names are the caller's
    tenant's; another tenant's answer as unknown ones (404), a read-only token is 403, and
    the published client's Stream DSL runs with a token."""
    import asyncio

    from queen import Queen, Stream

    a, b = two
    c, src, sink, name = tb.client, uq("tenstream"), uq("tenstream-out"), uq("tq")
    reg = {"name": name, "source_queue": src, "config_hash": "h-a"}
    qa = c.post("/streams/v1/queries", headers=a.rw, json=reg).json()
    qb = c.post("/streams/v1/queries", headers=b.rw, json={**reg, "config_hash": "h-b"})
    assert qb.status_code == 200 and qb.json()["fresh"] is True  # not a's name: no conflict
    assert qb.json()["query_id"] != qa["query_id"]
    for path in ("/streams/v1/queries", "/streams/v1/state/get", "/streams/v1/cycle"):
        r = c.post(path, headers=a.ro, json={})
        assert r.status_code == 403 and r.json()["code"] == "forbidden", (path, r.text)

    push(c, a, src, [{"n": 1}])
    m = pop(c, a, src, group="g")["messages"][0]
    pid = m["partitionId"]
    r = c.post("/streams/v1/state/get", headers=b.rw,
               json={"query_id": qa["query_id"], "partition_id": pid})
    assert r.status_code == 404
    r = c.post("/streams/v1/cycle", headers=b.rw, json={
        "query_id": qa["query_id"], "partition_id": pid, "consumer_group": "g",
        "state_ops": [{"type": "upsert", "key": "k", "value": 1}],
        "ack": {"transactionId": m["transactionId"], "leaseId": m["leaseId"]}})
    assert r.status_code == 404 and r.json()["reason"] == "unknown_query"
    # b's own query cannot name a's partition either
    r = c.post("/streams/v1/cycle", headers=b.rw, json={
        "query_id": qb.json()["query_id"], "partition_id": pid, "consumer_group": "g",
        "state_ops": [{"type": "upsert", "key": "k", "value": 1}]})
    assert r.status_code == 404 and r.json()["reason"] == "unknown_partition"
    assert db.execute("SELECT count(*) FROM queen.stream_state WHERE query_id IN (%s, %s)",
                      (qa["query_id"], qb.json()["query_id"])).fetchone() == (0,)

    tok = a.rw["Authorization"].split(" ", 1)[1]

    async def go() -> None:
        async with Queen(tb.url, bearer_token=tok) as q:
            runner = await (Stream.from_(q.queue(src)).map(lambda m: m["data"])
                            .to(q.queue(sink))
                            .run(query_id=uq("tq-dsl"), url=tb.url, bearer_token=tok,
                                 max_wait_millis=100))
            try:
                deadline = time.monotonic() + 20
                while pop(c, a, sink, group="check") is None:
                    assert time.monotonic() < deadline, runner.metrics()
                    await asyncio.sleep(0.05)
            finally:
                await runner.stop()
    asyncio.run(go())
    assert queue_tenants(db, sink) == {a.uuid}
