"""Message traces (docs/api.md 2.13; sql/functions/traces.sql) through the published client
queen-mq 2.6: a consumer's handler calls ``await msg["trace"]({...})`` and the admin reads
(``get_traces_for_message``, ``get_traces_by_name``, ``get_trace_names``) return the events in
the order they were recorded; plus raw HTTP for every refusal and limit, the unknown message,
another tenant's partition and traces, and the purge with the queue's retention and deletion.

Real broker process over HTTP on the session database, checked with SQL on
``queen.message_traces``; every test uses its own queues and trace names.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from queen import Queen

TRACES = "/api/v1/traces"
OTHER_TENANT = uuid.UUID("11111111-2222-3333-4444-555555555555")


def uq(prefix: str = "trq") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def push(client: httpx.Client, queue: str, txns: list[str], partition: str = "p1") -> str:
    r = client.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "transactionId": t, "payload": {"t": t}}
        for t in txns]})
    assert r.status_code == 201, r.text
    return r.json()[0]["partitionId"]


def trace_rows(db, queue: str) -> int:
    return db.execute("SELECT count(*) FROM queen.message_traces t JOIN queen.queues q "
                      "ON q.id = t.queue_id WHERE q.name = %s", (queue,)).fetchone()[0]


def event(pid: str, txn: str, **extra: Any) -> dict[str, Any]:
    return {"transactionId": txn, "partitionId": pid, "consumerGroup": None,
            "traceNames": None, "eventType": "info", "data": {"k": 1}, **extra}


# ------------------------------------------------------------------------ through the client
@pytest.mark.parametrize("mode", [{}, {"framed_pop": True}], ids=["json", "framed"])
@pytest.mark.parametrize("group", [None, "trace-group"])
def test_a_handler_traces_and_the_reads_answer_in_order(broker, db, group, mode):
    queue, tag = uq(), uq("flow")
    txns = [f"order-{i}" for i in range(3)]
    pid = push(broker.client, queue, txns)
    answers: list[dict] = []
    # NOTE(traces): batch 1: queen-mq 2.6 binds every message's trace() of one batch to the
    # batch's LAST message (a closure over its loop variable), a client bug

    async def handler(messages: Any) -> None:
        for m in messages if isinstance(messages, list) else [messages]:
            for step in ("received", "done"):
                answers.append(await m["trace"]({
                    "traceName": [tag, "all-orders"] if step == "done" else tag,
                    "eventType": step, "data": {"step": step, "txn": m["transactionId"]}}))

    async def scenario() -> tuple[dict, dict, dict]:
        async with Queen(broker.url, **mode) as client:
            builder = client.queue(queue)
            if group is not None:
                builder = builder.group(group)
            await asyncio.wait_for(
                builder.batch(1).limit(len(txns)).idle_millis(2000).consume(handler), 60)
            one = await client.admin.get_traces_for_message(pid, "order-1")
            named = await client.admin.get_traces_by_name(tag, limit=4)
            names = await client.admin.get_trace_names(limit=1000)
            return one, named, names

    one, named, names = asyncio.run(scenario())
    assert len(answers) == 6 and all(a["success"] is True and a["traceId"] for a in answers)
    mode = group or "__QUEUE_MODE__"
    assert [(t["eventType"], t["data"]["step"]) for t in one["traces"]] == [
        ("received", "received"), ("done", "done")]
    first = one["traces"][0]
    assert first["transactionId"] == "order-1" and first["partitionId"] == pid
    assert first["consumerGroup"] == mode and first["traceNames"] == [tag]
    assert sorted(one["traces"][1]["traceNames"]) == sorted([tag, "all-orders"])
    assert first["createdAt"] <= one["traces"][1]["createdAt"]
    assert one["count"] == 2 and one["truncated"] is False
    # by name: every traced event, in recording order, paged
    assert named["total"] == 6 and named["limit"] == 4 and len(named["traces"]) == 4
    assert [t["transactionId"] for t in named["traces"]][:2] == ["order-0", "order-0"]
    assert {t["queue"] for t in named["traces"]} == {queue}
    assert {t["partition"] for t in named["traces"]} == {"p1"}
    mine = {n["traceName"]: n for n in names["traceNames"]}
    assert mine[tag]["traceCount"] == 6 and mine[tag]["messageCount"] == 3
    assert mine[tag]["lastSeen"]
    assert trace_rows(db, queue) == 6


def test_paging_and_limits_of_the_reads(broker):
    c, queue, tag = broker.client, uq(), uq("page")
    pid = push(c, queue, ["m"])
    for i in range(5):
        r = c.post(TRACES, json=event(pid, "m", traceNames=[tag], data={"i": i}))
        assert r.status_code == 201, r.text
    page = c.get(f"{TRACES}/by-name/{tag}", params={"limit": 2, "offset": 2}).json()
    assert [t["data"]["i"] for t in page["traces"]] == [2, 3] and page["total"] == 5
    capped = c.get(f"{TRACES}/{pid}/m", params={"limit": 3}).json()
    assert [t["data"]["i"] for t in capped["traces"]] == [0, 1, 2]
    assert capped["truncated"] is True
    huge = c.get(f"{TRACES}/by-name/{tag}", params={"limit": 10**9}).json()
    assert huge["limit"] == 1000 and len(huge["traces"]) == 5  # clamped
    for path, params in ((f"{TRACES}/by-name/{tag}", {"limit": 0}),
                         (f"{TRACES}/by-name/{tag}", {"offset": -1}),
                         (f"{TRACES}/names", {"limit": "x"}),
                         (f"{TRACES}/{pid}/m", {"limit": 0})):
        r = c.get(path, params=params)
        assert r.status_code == 400 and r.json()["code"] == "invalid_request", (path, r.text)
    # a name with a '/' is reachable (the client leaves '/' unquoted)
    slash = f"{tag}/sub"
    assert c.post(TRACES, json=event(pid, "m", traceNames=slash)).status_code == 201
    assert c.get(f"{TRACES}/by-name/{slash}").json()["total"] == 1
    # and so is a transactionId with one
    push(c, queue, ["order/7"])
    assert c.post(TRACES, json=event(pid, "order/7")).status_code == 201
    assert len(c.get(f"{TRACES}/{pid}/order/7").json()["traces"]) == 1


def test_an_unknown_message_is_404_and_records_nothing(broker, db):
    c, queue = broker.client, uq()
    pid = push(c, queue, ["known"])
    for pid_, txn in ((pid, "never-pushed"), ("999999999999", "known")):
        r = c.post(TRACES, json=event(pid_, txn))
        assert r.status_code == 404, r.text
        body = r.json()
        assert body["code"] == "not_found" and body["success"] is False, body
    assert trace_rows(db, queue) == 0
    empty = c.get(f"{TRACES}/{pid}/never-pushed").json()
    assert empty["traces"] == [] and empty["count"] == 0


BAD: list[tuple[Any, int, str, str | None]] = [
    ([], 400, "invalid_request", None),
    ({"partitionId": "1", "data": {}}, 400, "invalid_request", "transactionId"),
    ({"transactionId": "", "partitionId": "1", "data": {}}, 400, "invalid_request",
     "transactionId"),
    ({"transactionId": 5, "partitionId": "1", "data": {}}, 400, "invalid_request",
     "transactionId"),
    ({"transactionId": "t" * 1025, "partitionId": "1", "data": {}}, 413, "name_too_long",
     "transactionId"),
    ({"transactionId": "t", "data": {}}, 400, "invalid_request", "partitionId"),
    ({"transactionId": "t", "partitionId": "abc", "data": {}}, 400, "invalid_request",
     "partitionId"),
    ({"transactionId": "t", "partitionId": True, "data": {}}, 400, "invalid_request",
     "partitionId"),
    ({"transactionId": "t", "partitionId": "1"}, 400, "invalid_request", "data"),
    ({"transactionId": "t", "partitionId": "1", "data": [1]}, 400, "invalid_request", "data"),
    ({"transactionId": "t", "partitionId": "1", "data": {"s": "a\u0000b"}}, 400,
     "invalid_request", "data"),
    # schemathesis found this one a 503: PostgreSQL text cannot hold NUL
    ({"transactionId": "a\u0000b", "partitionId": "1", "data": {}}, 400,
     "invalid_request", "transactionId"),
    ({"transactionId": "t", "partitionId": "1", "data": {"x": "y" * 70000}}, 413,
     "body_too_large", "data"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "consumerGroup": 3}, 400,
     "invalid_request", "consumerGroup"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "consumerGroup": "a/b"}, 400,
     "invalid_name", "consumerGroup"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "traceNames": 7}, 400,
     "invalid_request", "traceNames"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "traceNames": [1]}, 400,
     "invalid_request", "traceNames"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "traceNames": [""]}, 400,
     "invalid_name", "traceNames"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "traceNames": ["n" * 256]}, 413,
     "name_too_long", "traceNames"),
    ({"transactionId": "t", "partitionId": "1", "data": {},
      "traceNames": [f"n{i}" for i in range(33)]}, 400, "invalid_request", "traceNames"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "eventType": 1}, 400,
     "invalid_request", "eventType"),
    ({"transactionId": "t", "partitionId": "1", "data": {}, "eventType": "e" * 65}, 413,
     "name_too_long", "eventType"),
]


@pytest.mark.parametrize(("body", "status", "code", "field"), BAD)
def test_bad_bodies_name_the_problem_and_record_nothing(broker, db, body, status, code,
                                                        field):
    before = db.execute("SELECT count(*) FROM queen.message_traces").fetchone()
    r = broker.client.post(TRACES, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["code"] == code and err["error"], err
    assert err.get("field") == field, err
    assert db.execute("SELECT count(*) FROM queen.message_traces").fetchone() == before


def test_malformed_and_oversized_bodies_and_bad_paths(broker):
    c = broker.client
    r = c.post(TRACES, content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    big = b'{"data": {}, "pad": "' + b"x" * (200 << 10) + b'"}'
    r = c.post(TRACES, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "body_too_large"
    assert c.get(f"{TRACES}/abc/t").status_code == 400
    assert c.get(f"{TRACES}/1/{'t' * 1025}").status_code == 413
    nul = c.get(f"{TRACES}/1/a%00b")
    assert nul.status_code == 400 and nul.json()["field"] == "transactionId", nul.text
    assert c.get(f"{TRACES}/by-name/{'n' * 256}").status_code == 413


def test_another_tenants_partition_and_traces_are_absent(broker, db):
    c, tag = broker.client, uq("foreign")
    qid = db.execute("INSERT INTO queen.queues (tenant, name) VALUES (%s, %s) RETURNING id",
                     (OTHER_TENANT, uq())).fetchone()[0]
    pid = db.execute("INSERT INTO queen.log_partitions (queue_id, name) VALUES (%s, 'p') "
                     "RETURNING id", (qid,)).fetchone()[0]
    seq = db.execute("INSERT INTO queen.message_traces (id, tenant, queue_id, partition_id, "
                     "\"offset\", transaction_id, consumer_group, event_type, data, names) "
                     "VALUES (gen_random_uuid(), %s, %s, %s, 1, 'secret', 'g', 'info', "
                     "'{\"pii\": 1}', ARRAY[%s]) RETURNING seq",
                     (OTHER_TENANT, qid, pid, tag)).fetchone()[0]
    db.execute("INSERT INTO queen.message_trace_names (trace_seq, name, tenant) "
               "VALUES (%s, %s, %s)", (seq, tag, OTHER_TENANT))
    r = c.post(TRACES, json=event(str(pid), "secret"))
    assert r.status_code == 404 and r.json()["success"] is False
    assert c.get(f"{TRACES}/{pid}/secret").json()["traces"] == []
    assert c.get(f"{TRACES}/by-name/{tag}").json()["total"] == 0
    names = c.get(f"{TRACES}/names", params={"limit": 1000}).json()["traceNames"]
    assert tag not in {n["traceName"] for n in names}
    db.execute("DELETE FROM queen.queues WHERE id = %s", (qid,))


def test_traces_go_with_the_queues_retention_and_deletion(broker, db):
    c, queue, gone = broker.client, uq(), uq()
    pid = push(c, queue, ["old", "new"])
    for txn in ("old", "new"):
        assert c.post(TRACES, json=event(pid, txn)).status_code == 201
    # one push is one segment: "old" and "new" leave together, "newer" (its own) stays
    pid2 = push(c, queue, ["newer"])
    assert pid2 == pid
    assert c.post(TRACES, json=event(pid, "newer")).status_code == 201
    first_segment = db.execute("SELECT min(base_offset) FROM queen.log_segments WHERE "
                               "partition_id = %s", (int(pid),)).fetchone()[0]
    db.execute("UPDATE queen.queues SET retention_enabled = true, retention_seconds = 60"
               " WHERE name = %s", (queue,))
    db.execute("UPDATE queen.log_segments SET created_at = now() - interval '1 hour' "
               "WHERE partition_id = %s AND base_offset = %s", (int(pid), first_segment))
    done = db.execute("SELECT queen.retention_partition_v2(%s, 100)", (int(pid),)).fetchone()[0]
    assert done["segments"] == 1, done
    assert c.get(f"{TRACES}/{pid}/old").json()["traces"] == []
    assert c.get(f"{TRACES}/{pid}/new").json()["traces"] == []
    assert len(c.get(f"{TRACES}/{pid}/newer").json()["traces"]) == 1
    assert trace_rows(db, queue) == 1
    # deleting the queue deletes its traces, and their names
    pid3 = push(c, gone, ["x"])
    tag = uq("del")
    assert c.post(TRACES, json=event(pid3, "x", traceNames=[tag])).status_code == 201
    assert c.delete(f"/api/v1/resources/queues/{gone}").status_code == 200
    assert db.execute("SELECT count(*) FROM queen.message_traces WHERE partition_id = %s",
                      (int(pid3),)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM queen.message_trace_names WHERE name = %s",
                      (tag,)).fetchone()[0] == 0


def test_below_the_sidecar_a_trace_is_kept_at_the_highest_offset_it_can_have(broker, db):
    c, queue = broker.client, uq()
    pid = int(push(c, queue, ["a", "b"]))
    push(c, queue, ["c"])
    # the sidecar's clock ran out before the segments' (api.md 4): it no longer covers 1..2
    db.execute("DELETE FROM queen.log_txns WHERE partition_id = %s AND base_offset = 1", (pid,))
    db.execute("UPDATE queen.log_partitions SET txns_start = 3 WHERE id = %s", (pid,))
    r = c.post(TRACES, json=event(str(pid), "a"))
    assert r.status_code == 201, r.text
    assert db.execute("SELECT \"offset\" FROM queen.message_traces WHERE partition_id = %s "
                      "AND transaction_id = 'a'", (pid,)).fetchone()[0] == 2
    assert c.post(TRACES, json=event(str(pid), "c")).status_code == 201
