"""Issue 27 item 5: ``POST /api/v1/fetch``, reads by offset (api.md 2.15), through the published
2.6 client's ``queue(q).fetch`` (JSON and binary pushes, an encrypted queue) and raw HTTP for the
offsets' edges, retention's log start, the byte bounds, every limit and bad input.

One broker for the module (with an encryption key), on the session database.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from queen import Queen

from tests.brokerharness import Broker, start_broker
from tests.integration.test_push_json import uq

FETCH = "/api/v1/fetch"
KEY = "22" * 32
ZERO = uuid.UUID(int=0)


@pytest.fixture(scope="module")
def rb(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(Path(tmp_path_factory.mktemp("fetch")), db_dsn, QUEEN_ENCRYPTION_KEY=KEY)
    yield b
    assert b.stop() == 0, b.log()[-4000:]


def push(b: Broker, queue: str, partition: str, payloads: list[Any], first: int = 1) -> None:
    r = b.client.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": partition, "transactionId": f"{partition}-{i}",
         "payload": p} for i, p in enumerate(payloads, first)]})
    assert r.status_code == 201 and {x["status"] for x in r.json()} == {"queued"}, r.text


def fetch(b: Broker, *entries: dict[str, Any], status: int = 200, **top: Any) -> Any:
    r = b.client.post(FETCH, json={"entries": list(entries), **top})
    assert r.status_code == status, r.text
    return r.json()


def entry(queue: str, partition: str, offset: int, **extra: Any) -> dict[str, Any]:
    return {"queue": queue, "partition": partition, "offset": offset, **extra}


# ------------------------------------------------------------------------ through the client
def test_client_reads_every_record_and_changes_nothing(rb, db):
    q = uq("fx")

    async def scenario() -> tuple[dict, dict, dict]:
        async with Queen(rb.url) as client:
            await client.queue(q).partition("p1").push(
                [{"data": {"n": i}, "transactionId": f"a{i}"} for i in range(1, 6)])
            await client.queue(q).partition("p2").push([{"data": "only"}])
            read = await client.queue(q).fetch(["p1", "p2", "never"])
            later = await client.queue(q).fetch("p1", offsets={"p1": 4})
            # binary pushes (client frames, zstd) read back the same
            async with Queen(rb.url, binary_push=True, push_compression=True) as bin_client:
                await bin_client.queue(q).partition("p3").push(
                    [{"data": {"b": i}, "transactionId": f"b{i}"} for i in range(3)])
            binary = await client.queue(q).fetch("p3")
            return read, later, binary

    read, later, binary = asyncio.run(scenario())
    p1 = read["p1"]
    assert [r["offset"] for r in p1["records"]] == [1, 2, 3, 4, 5]
    assert [r["payload"] for r in p1["records"]] == [{"n": i} for i in range(1, 6)]
    assert [r["transactionId"] for r in p1["records"]] == [f"a{i}" for i in range(1, 6)]
    assert all(r["ts"].endswith("Z") for r in p1["records"])
    assert (p1["highWatermark"], p1["logStartOffset"], p1["nextOffset"]) == (6, 1, 6)
    assert [r["payload"] for r in read["p2"]["records"]] == ["only"]
    assert read["never"]["records"] == [] and read["never"]["highWatermark"] == 1
    assert [r["offset"] for r in later["p1"]["records"]] == [4, 5]
    assert [r["payload"] for r in binary["p3"]["records"]] == [{"b": i} for i in range(3)]
    assert [r["transactionId"] for r in binary["p3"]["records"]] == ["b0", "b1", "b2"]
    # no cursor, lease or group was made: a pop still starts at offset 1
    assert db.execute("SELECT count(*) FROM queen.log_consumers c JOIN queen.log_partitions lp"
                      " ON lp.id = c.partition_id JOIN queen.queues qq ON qq.id = lp.queue_id"
                      " WHERE qq.name = %s", (q,)).fetchone() == (0,)
    popped = rb.client.get(f"/api/v1/pop/queue/{q}/partition/p1", params={"batch": 1})
    assert popped.status_code == 200 and popped.json()["messages"][0]["offset"] == 1


def test_encrypted_payloads_come_back_decrypted(rb, db):
    q = uq("fxenc")
    r = rb.client.post("/api/v1/configure", json={"queue": q,
                                                  "options": {"encryptionEnabled": True}})
    assert r.status_code == 200, r.text
    push(rb, q, "p", [{"secret": 1}, {"secret": 2}])
    stored = db.execute("SELECT s.payload FROM queen.log_segments s JOIN queen.log_partitions lp"
                        " ON lp.id = s.partition_id JOIN queen.queues qq ON qq.id = lp.queue_id"
                        " WHERE qq.name = %s", (q,)).fetchone()
    assert stored is not None and b"secret" not in bytes(stored[0])

    async def read() -> dict:
        async with Queen(rb.url) as client:
            return await client.queue(q).fetch("p")

    got = asyncio.run(read())["p"]
    assert [r["payload"] for r in got["records"]] == [{"secret": 1}, {"secret": 2}]


def test_client_restarts_at_the_log_start_after_retention(rb, db):
    q = uq("fxret")
    push(rb, q, "p", [1, 2, 3])
    push(rb, q, "p", [4, 5], first=4)  # a second segment: offsets 4..5
    pid = db.execute("SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues qq"
                     " ON qq.id = lp.queue_id WHERE qq.name = %s", (q,)).fetchone()[0]
    db.execute("UPDATE queen.queues SET retention_enabled = true, retention_seconds = 60"
               " WHERE name = %s", (q,))
    db.execute("UPDATE queen.log_segments SET created_at = now() - interval '1 hour'"
               " WHERE partition_id = %s AND base_offset = 1", (pid,))
    db.execute("SELECT queen.retention_partition_v2(%s, 100)", (pid,))
    got = fetch(rb, entry(q, "p", 1))["entries"][0]
    assert got["error"] == "OFFSET_OUT_OF_RANGE" and got["records"] == []
    assert (got["logStartOffset"], got["highWatermark"]) == (4, 6)

    async def read() -> dict:
        async with Queen(rb.url) as client:
            return await client.queue(q).fetch("p")

    p = asyncio.run(read())["p"]
    assert [r["offset"] for r in p["records"]] == [4, 5] and p["logStartOffset"] == 4


# ------------------------------------------------------------------------ offsets, raw HTTP
def test_offset_edges_and_unknown_names(rb):
    q = uq("fxedge")
    push(rb, q, "p", ["a", "b", "c"])
    other = uq("fxnone")
    got = fetch(rb, entry(q, "p", 0), entry(q, "p", 3), entry(q, "p", 4), entry(q, "p", 5),
                entry(q, "empty", 0), entry(q, "empty", 2), entry(other, "p", 0),
                {"queue": q, "offset": 1})["entries"]
    assert [g["partition"] for g in got[:4]] == ["p"] * 4
    assert [r["offset"] for r in got[0]["records"]] == [1, 2, 3]  # 0 reads from the start
    assert [r["payload"] for r in got[1]["records"]] == ["c"]
    assert got[2]["records"] == [] and "error" not in got[2]  # caught up
    assert got[3]["error"] == "OFFSET_OUT_OF_RANGE" and got[3]["records"] == []
    assert all((g["highWatermark"], g["logStartOffset"]) == (4, 1) for g in got[:4])
    assert got[4] == {"queue": q, "partition": "empty", "highWatermark": 1,
                      "logStartOffset": 1, "records": []}
    assert got[5]["error"] == "OFFSET_OUT_OF_RANGE"
    assert got[6]["error"] == "UNKNOWN_TOPIC_OR_PARTITION" and got[6]["records"] == []
    assert got[7]["partition"] == "Default" and got[7]["records"] == []  # default partition


def test_numeric_partition_names_and_empty_calls(rb):
    q = uq("fxnum")
    push(rb, q, "3", [{"k": 1}])
    got = fetch(rb, {"queue": q, "partition": 3, "offset": 1})["entries"][0]
    assert got["partition"] == "3" and got["records"][0]["payload"] == {"k": 1}
    assert fetch(rb) == {"entries": []}
    r = rb.client.post(FETCH, json={})
    assert r.status_code == 200 and r.json() == {"entries": []}


def test_another_tenants_queue_is_unknown(rb, db):
    q = uq("fxten")
    push(rb, q, "p", [1])
    row = db.execute("SELECT k, error FROM queen.log_fetch_v1(%s, %s, %s, %s, %s, 1000, 10)",
                     (uuid.UUID(int=7), [q], ["p"], [1], [100])).fetchall()
    assert row == [(0, "UNKNOWN_TOPIC_OR_PARTITION")]
    mine = db.execute("SELECT k, error, high FROM queen.log_fetch_v1(%s, %s, %s, %s, %s, 1000,"
                      " 10)", (ZERO, [q], ["p"], [1], [100])).fetchall()
    assert mine == [(0, None, 2)]


# ------------------------------------------------------------------------ byte bounds
def test_max_bytes_per_entry_per_call_and_the_first_record(rb):
    q = uq("fxbytes")
    body = "x" * 98  # 100 bytes of JSON each
    push(rb, q, "a", [body] * 10)
    push(rb, q, "b", [body] * 10)
    per_entry = fetch(rb, entry(q, "a", 1, maxBytes=250))["entries"][0]
    assert [r["offset"] for r in per_entry["records"]] == [1, 2]
    call = fetch(rb, entry(q, "a", 1), entry(q, "b", 1), maxBytes=450)["entries"]
    assert len(call[0]["records"]) == 4 and call[1]["records"] == []
    assert call[1]["highWatermark"] == 11  # a starved entry still reports its bounds
    tiny = fetch(rb, entry(q, "a", 3, maxBytes=1), entry(q, "b", 1, maxBytes=1))["entries"]
    assert [r["offset"] for r in tiny[0]["records"]] == [3]  # the call's first record
    assert tiny[1]["records"] == []

    async def read() -> dict:
        async with Queen(rb.url) as client:
            return await client.queue(q).fetch(["a", "b"], max_bytes=300)

    got = asyncio.run(read())
    assert [len(got[p]["records"]) for p in ("a", "b")] == [10, 10]  # the client pages on


# ------------------------------------------------------------------------ limits, bad input
def test_more_than_1024_entries_is_refused(rb):
    q = uq("fxlim")
    ok = fetch(rb, *[entry(q, f"p{i}", 0) for i in range(1024)])["entries"]
    assert len(ok) == 1024 and all(e["error"] == "UNKNOWN_TOPIC_OR_PARTITION" for e in ok)
    err = fetch(rb, *[entry(q, f"p{i}", 0) for i in range(1025)], status=400)
    assert err["code"] == "invalid_request" and err["limit"] == 1024 and "1024" in err["error"]


@pytest.mark.parametrize(("body", "code", "status", "field"), [
    (b"{", "invalid_request", 400, None),
    (b"[]", "invalid_request", 400, None),
    (b'{"entries": {}}', "invalid_request", 400, "entries"),
    (b'{"entries": [1]}', "invalid_request", 400, "entries"),
    (b'{"entries": [{"partition": "p", "offset": 0}]}', "invalid_request", 400, "queue"),
    (b'{"entries": [{"queue": "q", "partition": "p"}]}', "invalid_request", 400, "offset"),
    (b'{"entries": [{"queue": "q", "offset": -1}]}', "invalid_request", 400, "offset"),
    (b'{"entries": [{"queue": "q", "offset": "1"}]}', "invalid_request", 400, "offset"),
    (b'{"entries": [{"queue": "q", "offset": true}]}', "invalid_request", 400, "offset"),
    (b'{"entries": [{"queue": "q", "offset": 1.5}]}', "invalid_request", 400, "offset"),
    (b'{"entries": [{"queue": "q", "partition": [], "offset": 1}]}', "invalid_request", 400,
     "partition"),
    (b'{"entries": [{"queue": "q", "offset": 1, "maxBytes": 0}]}', "invalid_request", 400,
     "maxBytes"),
    (b'{"entries": [], "maxBytes": "big"}', "invalid_request", 400, "maxBytes"),
    (b'{"entries": [{"queue": "a/b", "offset": 1}]}', "invalid_name", 400, "queue"),
    (b'{"entries": [{"queue": "", "offset": 1}]}', "invalid_name", 400, "queue"),
    (b'{"entries": [{"queue": "q", "partition": "", "offset": 1}]}', "invalid_name", 400,
     "partition"),
    (b'{"entries": [{"queue": "' + b"q" * 256 + b'", "offset": 1}]}', "name_too_long", 413,
     "queue"),
])
def test_bad_bodies_are_refused_naming_the_problem(rb, body, code, status, field):
    assert_refused(rb.client, FETCH, body, code, status, field)


def assert_refused(client: httpx.Client, path: str, body: bytes, code: str, status: int,
                   field: str | None) -> None:
    """The body is refused with this status and code, naming the field at fault."""
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    doc = r.json()
    assert doc["code"] == code and doc["error"], doc
    if field is not None:
        assert doc.get("field") == field, doc


def test_only_post(rb):
    r = rb.client.get(FETCH)
    assert r.status_code == 405 and "POST" in r.headers["allow"]
