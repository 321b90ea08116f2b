"""Issue 3: the published 2.6 client (``queen-mq``, import ``queen``) pushes unchanged, in its JSON
mode, its binary mode (``binary_push``) and its frames mode (``push_compression``)."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
from queen import Queen

from tests.integration.test_push_binary import parse_frames_body, stored_chunks
from tests.integration.test_push_json import PUSH, compact, is_uuid7, stored_messages, uq


class RecordingTransport(httpx.AsyncHTTPTransport):
    """The real transport, keeping a copy of every push body the client sends."""

    def __init__(self) -> None:
        super().__init__()
        self.push_bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        if request.url.path == PUSH:
            self.push_bodies.append(body)
        return await super().handle_async_request(request)


def _run(coro):
    return asyncio.run(coro)


def test_client_json_push(broker, db):
    q = uq("cli")
    trace = str(uuid.uuid4())
    transport = RecordingTransport()
    duplicates: list = []

    async def go():
        async with Queen(broker.url, transport=transport) as client:
            first = await client.queue(q).partition("p1").push([
                {"data": {"n": 1}},
                {"payload": {"n": 2}, "transactionId": "tx-2"},
                {"n": 3, "nested": {"é": [1, 2]}},
            ])
            again = await (client.queue(q).partition("p1")
                           .push([{"payload": "again", "transactionId": "tx-2"}])
                           .on_duplicate(lambda items, err: _record(duplicates, items)))
            traced = await client.queue(q).push({"payload": "traced", "traceId": trace})
        return first, again, traced

    first, again, traced = _run(go())
    assert all(body[:1] == b"{" for body in transport.push_bodies)
    assert [r["status"] for r in first] == ["queued"] * 3
    assert [r["offset"] for r in first] == [1, 2, 3]
    assert first[1]["transactionId"] == "tx-2"
    assert all(is_uuid7(r["messageId"]) for r in first)
    assert again[0]["status"] == "duplicate"
    assert again[0]["messageId"] == first[1]["messageId"]
    assert len(duplicates) == 1  # the client's duplicate callback saw it
    assert traced[0]["status"] == "queued" and traced[0]["traceId"] == trace
    assert traced[0]["partition"] == "Default"

    msgs = {m.message_id: m for m in stored_messages(db, q)}
    assert len(msgs) == 4
    assert [msgs[r["messageId"]].payload for r in first] == [
        b'{"n":1}', b'{"n":2}', compact({"n": 3, "nested": {"é": [1, 2]}})]
    assert msgs[traced[0]["messageId"]].trace_id == trace
    assert [msgs[r["messageId"]].transaction_id for r in first] == [
        r["transactionId"] for r in first]


async def _record(sink: list, items) -> None:
    sink.append(items)


def test_client_binary_push(broker, db):
    q = uq("cli")
    trace = str(uuid.uuid4())
    transport = RecordingTransport()

    async def go():
        async with Queen(url=broker.url, binary_push=True, transport=transport) as client:
            res = await client.queue(q).partition("b").push(
                [{"payload": {"i": i, "s": "ü" * i}} for i in range(10)]
                + [{"payload": None, "transactionId": "bin-none"}])
            dup = await client.queue(q).partition("b").push(
                [{"payload": 0, "transactionId": "bin-none"}])
            traced = await client.queue(q).partition("b").push(
                [{"payload": "t", "traceId": trace}])
        return res, dup, traced

    res, dup, traced = _run(go())
    assert [b[:5] for b in transport.push_bodies] == [b"QPB1\x04", b"QPB1\x04", b'{"ite']
    assert [r["status"] for r in res] == ["queued"] * 11
    assert [r["offset"] for r in res] == list(range(1, 12))
    assert all(is_uuid7(r["messageId"]) for r in res)
    assert dup[0]["status"] == "duplicate" and dup[0]["messageId"] == res[10]["messageId"]
    assert traced[0]["status"] == "queued" and traced[0]["traceId"] == trace
    msgs = {m.message_id: m for m in stored_messages(db, q)}
    assert len(msgs) == 12
    for i, r in enumerate(res[:10]):
        m = msgs[r["messageId"]]
        assert m.payload == compact({"i": i, "s": "ü" * i})
        assert m.transaction_id == r["transactionId"]
        assert m.offset == r["offset"]
    assert msgs[res[10]["messageId"]].payload == b"null"
    assert msgs[traced[0]["messageId"]].trace_id == trace


def test_client_binary_push_with_compression_keeps_client_ids_and_bytes(broker, db):
    q = uq("cli")
    transport = RecordingTransport()

    async def go():
        async with Queen(url=broker.url, binary_push=True, push_compression=True,
                         transport=transport) as client:
            a = await client.queue(q).partition("z").push(
                [{"payload": {"k": i, "pad": "x" * 40}} for i in range(25)])
            b = await client.queue(q).partition("z2").push({"payload": [1, 2, 3]})
            c = await client.queue(q).partition("z").push(
                [{"payload": "repeat", "transactionId": a[3]["transactionId"]}])
        return a, b, c

    a, b, c = _run(go())
    assert [body[:5] for body in transport.push_bodies] == [b"QPB1\x08"] * 3
    sent = [parse_frames_body(body) for body in transport.push_bodies]
    ids_a = [str(uuid.UUID(bytes=f.message_id)) for f in sent[0][0][4]]
    assert [r["messageId"] for r in a] == ids_a  # client-minted, returned as they are
    assert [r["status"] for r in a] == ["queued"] * 25
    assert [r["offset"] for r in a] == list(range(1, 26))
    assert b[0]["messageId"] == str(uuid.UUID(bytes=sent[1][0][4][0].message_id))
    assert c[0]["status"] == "duplicate" and c[0]["messageId"] == a[3]["messageId"]
    assert c[0]["offset"] == 4
    chunks = stored_chunks(db, q)
    for body in sent[:2]:
        [(_, partition, n, zz, _)] = body
        assert any(ch[0] == partition and ch[1] == n and ch[3] == zz for ch in chunks), \
            f"the client's zstd frame for {partition} is not stored byte for byte"
    msgs = {m.message_id: m for m in stored_messages(db, q)}
    assert len(msgs) == 26
    for i, r in enumerate(a):
        assert json.loads(msgs[r["messageId"]].payload) == {"k": i, "pad": "x" * 40}
        assert msgs[r["messageId"]].transaction_id == r["transactionId"]
