"""The upstream JavaScript client (queen-mq/queen, clients/client-js/client-v2/) against
queen-mp, over raw HTTP (issue 27, "how it is checked").

Each case sends the request body or query string the JS client builds for a route, field for
field, and asserts that the answer has what that client then dereferences (names and types).
The comment above each case names the JS file and function it follows; no JS code is copied.
The JS client of that tree calls neither ``POST /api/v1/fetch`` nor
``POST /api/v1/partitions/changed`` (the published Python client does: tests/integration/
test_fetch.py, test_partitions_changed.py), so they have no case here.

Real broker process (the session broker), one queue per test.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.brokerharness import Broker
from tests.integration.test_push_json import uq

#: QUEUE_DEFAULTS of utils/defaults.js: what QueueBuilder.create() sends when .config() was
#: not called (and what .config() merges the caller's options over)
QUEUE_DEFAULTS = {"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0,
                  "windowBuffer": 0, "maxSize": 0, "retentionSeconds": 0,
                  "completedRetentionSeconds": 0, "encryptionEnabled": False}


# ---------------------------------------------------------------------------------- helpers
def ok_json(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()


def js_push(c: httpx.Client, queue: str, payloads: list[Any], partition: str = "Default",
            txns: list[str] | None = None) -> list[dict]:
    """QueueBuilder.js QueueBuilder.push + PushBuilder #execute (immediate push): every item
    is {queue, partition, payload, transactionId}; the answer must be an array read by index,
    each item's `status` one of queued | duplicate | failed (and `error` on failed)."""
    ids = txns or [str(uuid.uuid4()) for _ in payloads]
    items = [{"queue": queue, "partition": partition, "payload": p, "transactionId": t}
             for p, t in zip(payloads, ids, strict=True)]
    body = ok_json(c.post("/api/v1/push", json={"items": items}), 201)
    assert isinstance(body, list) and len(body) == len(items)
    for item in body:
        assert item["status"] in ("queued", "duplicate", "failed"), item
        if item["status"] == "failed":
            assert isinstance(item["error"], str)
    return body


def js_pop(c: httpx.Client, path: str, **params: str) -> list[dict]:
    """QueueBuilder.js QueueBuilder.pop: `batch`, `wait`, `timeout` always, then the optional
    ones; an empty answer may be a bodiless 204 (read as null -> [])."""
    r = c.get(path, params=params)
    if r.status_code == 204:
        return []
    body = ok_json(r)
    assert isinstance(body["messages"], list)
    return [m for m in body["messages"] if m is not None]


def assert_consumable(m: dict, group: str | None = None) -> None:
    """What ConsumerManager.js (#processMessage, #enhanceMessagesWithTrace, Queen.ack) and
    streams/runtime/Runner.js (_groupByPartition, _processPartitionCycleInner) read from a
    popped message."""
    for key in ("transactionId", "partitionId", "leaseId", "partition", "createdAt", "id"):
        assert isinstance(m[key], str) and m[key], (key, m)
    assert "data" in m
    if group is not None:
        assert m["consumerGroup"] == group


def js_ack_item(m: dict, status: str = "completed") -> dict:
    """Queen.js Queen.ack, one acknowledgment of a batch: {transactionId, partitionId,
    status, error, leaseId?} (`error` is always sent, null unless the caller gave one)."""
    return {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "status": status, "error": None, "leaseId": m["leaseId"]}


def assert_ack_results(body: Any, n: int) -> list[dict]:
    """Queen.js parseAckResults / normalizeAckItem: a top-level array of exactly n objects;
    `success` a boolean, `error` a string or null."""
    assert isinstance(body, list) and len(body) == n, body
    for item in body:
        assert isinstance(item, dict) and isinstance(item["success"], bool), item
        assert item.get("error") is None or isinstance(item["error"], str), item
    return body


# ---------------------------------------------------------------------- queue and messages
def test_configure_with_the_js_defaults_and_a_refused_option(broker: Broker):
    c, q = broker.client, uq("js-cfg")
    # QueueBuilder.js QueueBuilder.create (no .config()): {queue, namespace, task, options}
    # with null namespace/task and QUEUE_DEFAULTS; OperationBuilder #execute fails on `error`
    body = ok_json(c.post("/api/v1/configure", json={
        "queue": q, "namespace": None, "task": None, "options": QUEUE_DEFAULTS}))
    assert "error" not in body and body["configured"] is True
    # QueueBuilder.js QueueBuilder.config({...}).create(): the caller's keys over the defaults
    body = ok_json(c.post("/api/v1/configure", json={
        "queue": q, "namespace": None, "task": None,
        "options": {**QUEUE_DEFAULTS, "leaseTime": 30, "retryLimit": 5}}))
    assert body["options"]["leaseTime"] == 30 and body["options"]["retryLimit"] == 5
    # a value this broker cannot honour: HttpClient throws on the status, and the body's
    # `error` names the option (issue 27: refused, never silently kept)
    r = c.post("/api/v1/configure", json={"queue": q, "namespace": None, "task": None,
                                          "options": {**QUEUE_DEFAULTS, "maxSize": 10}})
    assert r.status_code == 400 and "maxSize" in r.json()["error"]
    # QueueBuilder.js QueueBuilder.delete: DELETE, the answer must not carry `error`
    body = ok_json(c.delete(f"/api/v1/resources/queues/{q}"))
    assert "error" not in body


def test_push_duplicate_pop_and_single_ack(broker: Broker):
    c, q = broker.client, uq("js-push")
    txn = str(uuid.uuid4())
    first = js_push(c, q, [{"n": 1}], txns=[txn])
    assert first[0]["status"] == "queued"
    # PushBuilder #execute sorts a repeat into onDuplicate by `status`
    assert js_push(c, q, [{"n": 1}], txns=[txn])[0]["status"] == "duplicate"
    # QueueBuilder.js QueueBuilder.pop without group: batch, wait, timeout
    (m,) = js_pop(c, f"/api/v1/pop/queue/{q}", batch="1", wait="false", timeout="30000")
    assert_consumable(m)
    assert m["transactionId"] == txn and m["data"] == {"n": 1}
    # Queen.js Queen.ack (single): consumerGroup and error always present, null here
    body = ok_json(c.post("/api/v1/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
        "status": "completed", "error": None, "consumerGroup": None,
        "leaseId": m["leaseId"]}))
    (item,) = assert_ack_results(body, 1)
    assert item["success"] is True and item["error"] is None
    # the same ack again (its lease is released): still the array shape
    again = ok_json(c.post("/api/v1/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
        "status": "completed", "error": None, "consumerGroup": None,
        "leaseId": m["leaseId"]}))
    assert_ack_results(again, 1)
    # an empty queue: QueueBuilder.pop maps 204 / no messages to []
    assert js_pop(c, f"/api/v1/pop/queue/{q}", batch="1", wait="false", timeout="30000") == []


def test_consume_params_batch_ack_and_a_rejected_item(broker: Broker):
    c, q, g = broker.client, uq("js-consume"), "js-workers"
    js_push(c, q, [{"n": i} for i in range(3)])
    # ConsumerManager.js #buildParams with autopilot on and nothing pinned: autopilot=true,
    # no batch, wait, timeout, consumerGroup (utils/autopilot.js popSizing)
    r = c.get(f"/api/v1/pop/queue/{q}",
              params={"autopilot": "true", "wait": "true", "timeout": "2000",
                      "consumerGroup": g})
    body = ok_json(r)
    messages = body["messages"]
    assert [m["data"]["n"] for m in messages] == [0, 1, 2]
    for m in messages:
        assert_consumable(m, g)
    # utils/autopilot.js parseAutopilotDecision: optional; numbers when present
    decision = body.get("autopilot")
    if decision is not None:
        assert all(isinstance(decision.get(k, 0), int) for k in ("partitions", "batch",
                                                                  "waitMs"))
    # Queen.js Queen.ack (array): {acknowledgments, consumerGroup}
    acks = [js_ack_item(m) for m in messages]
    results = assert_ack_results(ok_json(c.post("/api/v1/ack/batch", json={
        "acknowledgments": acks, "consumerGroup": g})), 3)
    assert all(x["success"] for x in results)
    # the same acks under a released lease: each item says so (success false + error), HTTP
    # 200, which parseAckResults reads per item
    js_push(c, q, [{"n": 3}])
    (m,) = js_pop(c, f"/api/v1/pop/queue/{q}", batch="1", wait="false", timeout="30000",
                  consumerGroup=g)
    stale = dict(js_ack_item(m), leaseId=str(uuid.uuid4()))
    (item,) = assert_ack_results(ok_json(c.post("/api/v1/ack/batch", json={
        "acknowledgments": [stale], "consumerGroup": g})), 1)
    assert item["success"] is False and isinstance(item["error"], str) and item["error"]


def test_partition_and_namespace_pops(broker: Broker):
    c, q = broker.client, uq("js-ns")
    ns = uq("jsns")
    ok_json(c.post("/api/v1/configure", json={"queue": q, "namespace": ns, "task": None,
                                              "options": QUEUE_DEFAULTS}))
    js_push(c, q, [{"p": "a"}], partition="pa")
    js_push(c, q, [{"p": "b"}], partition="pb")
    # QueueBuilder.js #buildPopPath with a partition other than Default
    (m,) = js_pop(c, f"/api/v1/pop/queue/{q}/partition/pb", batch="5", wait="false",
                  timeout="30000", autoAck="true")
    assert m["partition"] == "pb" and m["data"] == {"p": "b"}
    # QueueBuilder.js #buildPopPath with only a namespace: /api/v1/pop?namespace=
    (m,) = js_pop(c, "/api/v1/pop", batch="5", wait="false", timeout="30000",
                  namespace=ns, autoAck="true")
    assert m["partition"] == "pa" and m["data"] == {"p": "a"}


def test_lease_renew_reads_lease_id_and_new_expiry(broker: Broker):
    c, q = broker.client, uq("js-renew")
    js_push(c, q, [{"n": 1}])
    (m,) = js_pop(c, f"/api/v1/pop/queue/{q}", batch="1", wait="false", timeout="30000")
    # Queen.js Queen.renew: POST with an empty object; reads leaseId, then newExpiresAt
    body = ok_json(c.post(f"/api/v1/lease/{m['leaseId']}/extend", json={}))
    assert body["leaseId"] == m["leaseId"]
    assert isinstance(body["newExpiresAt"], str) and body["newExpiresAt"].endswith("Z")


def test_transaction_ack_and_push(broker: Broker):
    c, src, dst = broker.client, uq("js-tx-src"), uq("js-tx-dst")
    js_push(c, src, [{"n": 1}])
    (m,) = js_pop(c, f"/api/v1/pop/queue/{src}", batch="1", wait="false", timeout="30000")
    # TransactionBuilder.js ack + queue(...).partition(...).push + commit:
    # {operations, requiredLeases}; commit throws unless `success` is true
    body = ok_json(c.post("/api/v1/transaction", json={
        "operations": [
            {"type": "ack", "transactionId": m["transactionId"],
             "partitionId": m["partitionId"], "status": "completed"},
            {"type": "push", "items": [{"queue": dst, "payload": {"next": 1},
                                        "transactionId": str(uuid.uuid4()),
                                        "partition": "p1"}]}],
        "requiredLeases": [m["leaseId"]]}))
    assert body["success"] is True
    (out,) = js_pop(c, f"/api/v1/pop/queue/{dst}", batch="1", wait="false", timeout="30000")
    assert out["data"] == {"next": 1} and out["partition"] == "p1"
    # a lease that is gone: success false with an `error` the builder throws
    body = ok_json(c.post("/api/v1/transaction", json={
        "operations": [{"type": "push", "items": [{"queue": dst, "payload": {"x": 1},
                                                   "transactionId": str(uuid.uuid4())}]}],
        "requiredLeases": [m["leaseId"]]}))
    assert body["success"] is False and isinstance(body["error"], str)


def test_dlq_listing(broker: Broker):
    c, q, g = broker.client, uq("js-dlq"), "js-dlq-g"
    js_push(c, q, [{"bad": True}])
    (m,) = js_pop(c, f"/api/v1/pop/queue/{q}", batch="1", wait="false", timeout="30000",
                  consumerGroup=g)
    body = ok_json(c.post("/api/v1/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
        "status": "dlq", "error": "poison", "consumerGroup": g, "leaseId": m["leaseId"]}))
    assert_ack_results(body, 1)
    # QueueBuilder.js DLQBuilder.get: queue, limit, offset, then consumerGroup; reads
    # `total` and `messages`
    body = ok_json(c.get("/api/v1/dlq", params={"queue": q, "limit": "100", "offset": "0",
                                                "consumerGroup": g}))
    assert body["total"] == 1 and isinstance(body["messages"], list)
    assert body["messages"][0]["transactionId"] == m["transactionId"]


# ------------------------------------------------------------------------------ traces
def test_traces_record_and_read(broker: Broker):
    c, q = broker.client, uq("js-trace")
    name = uq("jstn")
    js_push(c, q, [{"n": 1}])
    (m,) = js_pop(c, f"/api/v1/pop/queue/{q}", batch="1", wait="false", timeout="30000")
    # ConsumerManager.js #enhanceMessagesWithTrace (message.trace): consumerGroup is
    # '__QUEUE_MODE__' without a group; traceNames an array or null; the answer is spread
    # into {success: true, ...}, so it must be a JSON object
    for names in ([name], None):
        body = ok_json(c.post("/api/v1/traces", json={
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "consumerGroup": "__QUEUE_MODE__", "traceNames": names, "eventType": "info",
            "data": {"text": "step"}}), 201)
        assert isinstance(body, dict)
    # admin/Admin.js getTracesForMessage, getTracesByName (limit as a query string),
    # getTraceNames: JSON objects handed to the caller
    body = ok_json(c.get(f"/api/v1/traces/{m['partitionId']}/{m['transactionId']}"))
    assert isinstance(body, dict) and len(body["traces"]) == 2
    body = ok_json(c.get(f"/api/v1/traces/by-name/{name}", params={"limit": "10"}))
    assert isinstance(body, dict) and body["total"] == 1
    body = ok_json(c.get("/api/v1/traces/names", params={"limit": "1000"}))
    assert isinstance(body, dict)
    assert name in [x["traceName"] for x in body["traceNames"]]


# ------------------------------------------------------------------------------- locks
def test_locks_acquire_renew_get_release(broker: Broker):
    c = broker.client
    name, owner = uq("js-lock"), f"host:1:{uuid.uuid4().hex[:12]}"

    def one(op: dict[str, Any]) -> dict:
        # locks/Locks.js Locks.batch: {"operations": [...]}; the answer {"results": [...]}
        # with one result per operation
        body = ok_json(c.post("/api/v1/locks", json={"operations": [op]}))
        assert isinstance(body["results"], list) and len(body["results"]) == 1
        return body["results"][0]

    # Locks.js Locks.acquire: {op, name, ttlSeconds, owner}; Lock.acquire reads `acquired`,
    # then slot, token, guard (#take)
    got = one({"op": "acquire", "name": name, "ttlSeconds": 30, "owner": owner})
    assert got["acquired"] is True and isinstance(got["slot"], int)
    assert isinstance(got["token"], int) and got["token"] > 0
    assert isinstance(got["guard"], dict)
    # another owner: acquired false, with a reason and the holders
    other = one({"op": "acquire", "name": name, "ttlSeconds": 30, "owner": "someone-else"})
    assert other["acquired"] is False and other["reason"] in ("held", "contended")
    assert isinstance(other["holders"], list)
    # Locks.js Locks.renew: {op, name, token, ttlSeconds, slot?, owner}; a NEW token
    renewed = one({"op": "renew", "name": name, "token": got["token"], "ttlSeconds": 30,
                   "slot": got["slot"], "owner": owner})
    assert renewed["renewed"] is True and renewed["token"] > got["token"]
    assert isinstance(renewed["guard"], dict)
    # Locks.js Locks.get: {held, holders: [{slot, owner, token, since, expiresAt, renewedAt}]}
    held = one({"op": "get", "name": name})
    assert held["held"] is True
    (holder,) = held["holders"]
    assert holder["owner"] == owner and holder["token"] == renewed["token"]
    assert {"slot", "since", "expiresAt", "renewedAt"} <= set(holder)
    # Locks.js Locks.release with the old token: released false, reason lost
    lost = one({"op": "release", "name": name, "token": got["token"]})
    assert lost["released"] is False and lost["reason"] == "lost"
    # ... and with the current one
    assert one({"op": "release", "name": name, "token": renewed["token"],
                "slot": renewed["slot"]})["released"] is True
    # a semaphore: Locks.acquire with limit
    sem = one({"op": "acquire", "name": uq("js-sem"), "ttlSeconds": 30, "owner": owner,
               "limit": 3})
    assert sem["acquired"] is True


def test_a_lock_taken_without_an_owner(broker: Broker):
    """Locks.js Locks.acquire sends ``owner`` only when the caller gave one (the Lock handle
    always mints one; the raw call need not): the permit is granted with a null owner, a
    second owner-less acquire is another caller (``held``), and the token releases it."""
    c, name = broker.client, uq("js-lock-anon")

    def one(op: dict[str, Any]) -> dict:
        body = ok_json(c.post("/api/v1/locks", json={"operations": [op]}))
        assert len(body["results"]) == 1
        return body["results"][0]

    got = one({"op": "acquire", "name": name, "ttlSeconds": 30})
    assert got["acquired"] is True and got["owner"] is None and got["token"] > 0
    again = one({"op": "acquire", "name": name, "ttlSeconds": 30})
    assert again["acquired"] is False and again["reason"] == "held"
    assert [h["owner"] for h in again["holders"]] == [None]
    # Locks.js Locks.release without slot (absent = 0)
    assert one({"op": "release", "name": name, "token": got["token"]})["released"] is True
    assert one({"op": "get", "name": name})["held"] is False


# ----------------------------------------------------------------------------- streams
def test_streams_register_cycle_and_state(broker: Broker):
    c, src, sink = broker.client, uq("js-st-src"), uq("js-st-sink")
    query = uq("js-query")
    group = f"streams.{query}"
    # streams/runtime/register.js registerQuery: snake_case; reads query_id, name, fresh,
    # reset; a `success: false` body is a failure
    reg = {"name": query, "source_queue": src, "config_hash": "sha256:aa", "reset": False,
           "sink_queue": sink}
    body = ok_json(c.post("/streams/v1/queries", json=reg))
    assert body.get("success", True) is not False
    assert isinstance(body["query_id"], str) and body["name"] == query
    assert body["fresh"] is True and body["reset"] is False
    qid = body["query_id"]
    again = ok_json(c.post("/streams/v1/queries", json=reg))
    assert again["query_id"] == qid and again["fresh"] is False
    # another config hash without reset: 409 with an `error` body (register.js reads
    # err.body.error)
    r = c.post("/streams/v1/queries", json={**reg, "config_hash": "sha256:bb"})
    assert r.status_code == 409 and isinstance(r.json()["error"], str)

    js_push(c, src, [{"v": 1}, {"v": 2}], partition="k1")
    # Runner.js _popMessages: QueueBuilder.pop with batch, wait, timeout, consumerGroup
    messages = js_pop(c, f"/api/v1/pop/queue/{src}", batch="200", wait="true",
                      timeout="1000", consumerGroup=group)
    assert len(messages) == 2
    for m in messages:
        assert_consumable(m, group)
    last = messages[-1]
    # streams/runtime/cycle.js commitCycle with the ack Runner.js
    # _processPartitionCycleInner builds ({transactionId, leaseId, status, count}); a body
    # without `success: true` throws
    body = ok_json(c.post("/streams/v1/cycle", json={
        "query_id": qid, "partition_id": last["partitionId"], "consumer_group": group,
        "state_ops": [{"type": "upsert", "key": "win:1", "value": {"sum": 3}}],
        "push_items": [{"queue": sink, "partition": "k1", "payload": {"sum": 3}}],
        "ack": {"transactionId": last["transactionId"], "leaseId": last["leaseId"],
                "status": "completed", "count": len(messages)},
        "release_lease": True}))
    assert body["success"] is True
    # the idle-flush cycle of Runner.js: no ack (null), state delete + sink push
    body = ok_json(c.post("/streams/v1/cycle", json={
        "query_id": qid, "partition_id": last["partitionId"], "consumer_group": group,
        "state_ops": [{"type": "delete", "key": "win:0"}], "push_items": [], "ack": None,
        "release_lease": True}))
    assert body["success"] is True
    # Runner.js _processGateCycle -> getState with keys [] (every row of the partition);
    # server/API.md: {rows: [{key, value}]}
    body = ok_json(c.post("/streams/v1/state/get", json={
        "query_id": qid, "partition_id": last["partitionId"], "keys": []}))
    assert body["rows"] == [{"key": "win:1", "value": {"sum": 3},
                             "updated_at": body["rows"][0]["updated_at"]}]
    (out,) = js_pop(c, f"/api/v1/pop/queue/{sink}", batch="10", wait="false",
                    timeout="30000")
    assert out["data"] == {"sum": 3}
    assert js_pop(c, f"/api/v1/pop/queue/{src}", batch="200", wait="false",
                  timeout="1000", consumerGroup=group) == []


# --------------------------------------------------------------------------- ephemeral
def test_ephemeral_verbs(broker: Broker):
    c, q = broker.client, uq("js-eph")
    # ephemeral/Ephemeral.js Ephemeral.configure: {queue, options} with the known keys only
    r = c.post("/api/v1/ephemeral/configure", json={
        "queue": q, "options": {"maxLength": 100, "policy": "reject", "ttlSeconds": 60,
                                "leaseSeconds": 30, "retryLimit": 2}})
    assert r.status_code in (200, 201), r.text  # HttpClient takes any 2xx
    assert r.json()["options"]["maxLength"] == 100
    # Ephemeral.push: {queue, partition?, messages: [{payload}]}; resolves to {pushed}
    body = ok_json(c.post("/api/v1/ephemeral/push", json={
        "queue": q, "partition": "p1", "messages": [{"payload": {"n": 1}},
                                                    {"payload": "two"}]}), 201)
    assert body["pushed"] == 2
    # Ephemeral.pop: queue, partition, batch, group as a query string; reads `queue` and
    # `messages` [{id, partition, payload, attempts}]
    body = ok_json(c.get("/api/v1/ephemeral/pop", params={"queue": q, "partition": "p1",
                                                          "batch": "10", "group": "g"}))
    assert body["queue"] == q
    messages = body["messages"]
    assert [m["payload"] for m in messages] == [{"n": 1}, "two"]
    for m in messages:
        assert isinstance(m["id"], str) and m["partition"] == "p1"
        assert isinstance(m["attempts"], int)
    # Ephemeral.ack: {queue, group?, acks: [{id, status?}]} -> {results: [{id, outcome}]}
    body = ok_json(c.post("/api/v1/ephemeral/ack", json={
        "queue": q, "group": "g",
        "acks": [{"id": messages[0]["id"], "status": "completed"},
                 {"id": messages[1]["id"], "status": "retry"}]}))
    assert [(x["id"], x["outcome"]) for x in body["results"]] == [
        (messages[0]["id"], "acked"), (messages[1]["id"], "redelivered")]
    # an empty pop: `messages` an array (Ephemeral.pop filters it), never null
    body = ok_json(c.get("/api/v1/ephemeral/pop", params={"queue": q, "group": "h",
                                                          "autoAck": "true"}))
    assert isinstance(body["messages"], list)
    # Ephemeral.queues, Ephemeral.depth: JSON handed to the caller
    assert isinstance(ok_json(c.get("/api/v1/ephemeral/queues")), dict)
    assert isinstance(ok_json(c.get(f"/api/v1/ephemeral/queues/{q}/depth")), dict)
    # Ephemeral.reset -> {dropped}; Ephemeral.delete
    assert isinstance(ok_json(c.post("/api/v1/ephemeral/reset", json={"queue": q}))["dropped"],
                      int)
    assert isinstance(ok_json(c.delete(f"/api/v1/ephemeral/queue/{q}")), dict)


def test_ephemeral_optional_fields(broker: Broker):
    """What Ephemeral.js sends only when given, or leaves out: configure with all seven
    options (``windowBuffer`` as {ms, count}); a push without ``partition`` (the broker picks)
    and a ``{payload: null}`` message; a long-poll pop (``wait`` + ``timeout``) without a
    group; an ack without ``group`` whose entries carry ``status``/``error`` or neither."""
    c, q = broker.client, uq("js-eph-opt")
    options = {"maxBytes": 1 << 20, "maxLength": 50, "policy": "dropOldest", "ttlSeconds": 60,
               "leaseSeconds": 30, "retryLimit": 2, "windowBuffer": {"ms": 20, "count": 2}}
    r = c.post("/api/v1/ephemeral/configure", json={"queue": q, "options": options})
    assert r.status_code in (200, 201), r.text
    assert r.json()["options"] == options
    body = ok_json(c.post("/api/v1/ephemeral/push", json={
        "queue": q, "messages": [{"payload": None}, {"payload": [1, "two"]}]}), 201)
    assert body["pushed"] == 2
    body = ok_json(c.get("/api/v1/ephemeral/pop", params={"queue": q, "batch": "10",
                                                          "wait": "true", "timeout": "2000"}))
    first, second = body["messages"]
    assert (first["payload"], second["payload"]) == (None, [1, "two"])
    assert first["partition"] == second["partition"] and first["attempts"] == 1
    # Ephemeral.ack: `false` becomes status failed; `error` travels only when given
    body = ok_json(c.post("/api/v1/ephemeral/ack", json={"queue": q, "acks": [
        {"id": first["id"], "status": "failed", "error": "boom"}, {"id": second["id"]}]}))
    assert [x["outcome"] for x in body["results"]] == ["redelivered", "acked"]
    body = ok_json(c.get("/api/v1/ephemeral/pop", params={"queue": q, "wait": "true",
                                                          "timeout": "2000"}))
    (again,) = body["messages"]
    assert again["payload"] is None and again["attempts"] == 2


def test_ephemeral_depth_of_an_unknown_queue_is_the_contracts_404(broker: Broker):
    """A KNOWN DIFFERENCE, pinned here so that it is a decision: this broker answers the
    depth of an unknown queue ``404 ephemeral_queue_not_found``, as the Python client's
    contract asks (../shared/client-contract.md, ephemeral). Ephemeral.js mapUnsupported maps
    EVERY 404 of the family to ``ephemeral_unsupported``, so the JS client's
    ``Ephemeral.depth`` of an unknown queue reports "broker does not support ephemeral
    queues" instead; every other verb answers an unknown queue with a normal body."""
    q = f"nope-{uuid.uuid4().hex[:8]}"
    r = broker.client.get(f"/api/v1/ephemeral/queues/{q}/depth")
    assert r.status_code == 404 and r.json()["code"] == "ephemeral_queue_not_found", r.text
    # the other verbs on an unknown queue: bodies, never a 404
    assert ok_json(broker.client.post("/api/v1/ephemeral/reset",
                                      json={"queue": q}))["dropped"] == 0
    assert broker.client.delete(f"/api/v1/ephemeral/queue/{q}").status_code == 200
    r = broker.client.post("/api/v1/ephemeral/ack", json={"queue": q, "acks": [
        {"id": "x"}]})
    assert r.status_code != 404, r.text
