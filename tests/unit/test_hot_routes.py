"""The hot routes (queen_mp/http/hot.py) answer every request byte for byte as falcon's
machinery does (status, headers in order, body), on fake backends that answer: pushes
queued (JSON answers and QPB1 counts), pops with messages (JSON, QPF1) or none, acks
committed or lost, and the refusals of the middleware (401 with its header, 429, 413, 400).
tests/fuzz runs the same comparison on hostile requests."""

from __future__ import annotations

import asyncio
import gzip
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
import zstandard
from queen.http import push_binary as client

from queen_mp.config import Config
from queen_mp.db.ack_procs import AckBatch, GroupAck
from queen_mp.front.acks import COMMITTED, Verdict
from queen_mp.front.delivery import Claim
from queen_mp.front.ingest import ItemResult, PushResults
from queen_mp.front.popper import Popped, PopRequest
from queen_mp.http.answer import Answer
from queen_mp.http.app import create_app
from queen_mp.http.hot import head_lines, rendered
from queen_mp.models.items import PushItem
from queen_mp.wire import pack_chunk_raw, pack_frame

T0 = datetime(2026, 12, 1, 21, 40, 18, 601000, tzinfo=UTC)


class FakeIngest:
    async def encrypt(self, *args: Any) -> None:
        return None

    async def push(self, items: list[PushItem], tenant: bytes, chunks: Any = ()
                   ) -> PushResults:
        return PushResults([ItemResult("queued", bytes([i]) * 16, 7, 100 + i,
                                       1_700_000_000_000_000) for i, _ in enumerate(items)])


class FakePopper:
    async def pop(self, r: PopRequest) -> Popped | None:
        if r.queue == "empty":
            return None
        frames = b"".join(pack_frame(bytes([o]) * 16, f"t{o}".encode(), b'{"o":%d}' % o)
                          for o in range(1, 4))
        claim = Claim(r.queue or "q", 7, r.partition or "Default", 1, 3, 1, T0, False,
                      [(1, T0, pack_chunk_raw(frames, 3))])
        return Popped([claim], "0191a2b3-0000-7000-8000-000000000001")


class FakeAcker:
    async def ack(self, tenant: bytes, batch: AckBatch
                  ) -> tuple[list[Verdict], list[GroupAck]]:
        verdict = ((False, "outcome_unknown", False, False, False)
                   if "lost" in batch.transaction_ids else COMMITTED)
        return [verdict] * len(batch), []


class FakeWorker:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = None
        self.cipher = None
        self.ingest = FakeIngest()
        self.popper = FakePopper()
        self.acker = FakeAcker()

    def count_pushed(self, results: Any) -> None:
        pass

    def count_popped(self, n: int) -> None:
        pass

    def after_acks(self, tenant: bytes, results: Any) -> None:
        pass

    def grant_leases(self, *args: Any) -> dict[int, bytes]:
        return {}

    def push_maintenance(self) -> bool:
        return False


def _scope(method: str, target: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    path, _, qs = target.partition("?")
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "server": ("127.0.0.1", 6632),
            "client": ("127.0.0.1", 40000), "scheme": "http", "method": method,
            "root_path": "", "path": path, "raw_path": path.encode(),
            "query_string": qs.encode(), "headers": headers}


async def _exchange(app: Any, method: str, target: str, body: bytes,
                    headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    scope = _scope(method, target, headers)
    events = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return events.pop(0) if events else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _both(app: Any, method: str, target: str, body: bytes = b"",
          extra: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, Any]]:
    headers = [(b"host", b"x"), *(extra or [])]
    if method == "POST":
        headers.append((b"content-length", str(len(body)).encode()))
    assert app.hot.match({"method": method, "path": target.partition("?")[0],
                          "query_string": b"", "headers": headers}) is not None

    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        hot = await _exchange(app, method, target, body, headers)
        saved, app.hot = app.hot, None
        try:
            plain = await _exchange(app, method, target, body, headers)
        finally:
            app.hot = saved
        return hot, plain

    hot, plain = asyncio.run(go())
    assert hot == plain
    return hot


def _app(tmp_path: Any, **env: str) -> Any:
    config = Config.load(env={"QUEEN_DATA_DIR": str(tmp_path), "QUEEN_DISK_HIGH_PCT": "100",
                              **env})
    return create_app(config, None, FakeWorker(config))  # type: ignore[arg-type]


def _push(n: int) -> bytes:
    return json.dumps({"items": [{"queue": "q", "transactionId": f"t{i}", "payload": {"i": i}}
                                 for i in range(n)]}).encode()


def _acks(*txns: str) -> bytes:
    lease = str(uuid.UUID(int=3))
    return json.dumps({"acknowledgments": [{"transactionId": t, "partitionId": "7",
                                            "leaseId": lease} for t in txns]}).encode()


#: (method, target, body, status) of answers of every kind
ANSWERS = [
    ("POST", "/api/v1/push", _push(3), 201),
    ("POST", "/api/v1/push", client.encode_push_binary(
        [client.PushBatch("q", "p", [b"1", b"2"], ["a", "b"])], counts=True), 201),
    ("POST", "/api/v1/push", b"{not json", 400),
    ("POST", "/api/v1/push", b"QTB1....", 400),
    ("GET", "/api/v1/pop/queue/q?batch=3&consumerGroup=g", b"", 200),
    ("GET", "/api/v1/pop/queue/q/partition/a/b?batch=3", b"", 200),
    ("GET", "/api/v1/pop/queue/q?frames=true", b"", 200),
    ("GET", "/api/v1/pop/queue/empty", b"", 204),
    ("GET", "/api/v1/pop/queue/q?batch=0", b"", 400),
    ("POST", "/api/v1/ack", json.dumps({"transactionId": "t1", "partitionId": 7}).encode(), 200),
    ("POST", "/api/v1/ack/batch", _acks("t1", "t2"), 200),
    ("POST", "/api/v1/ack/batch", _acks("t1", "lost"), 503),
    ("POST", "/api/v1/ack/batch", b"[]", 400),
]


@pytest.mark.parametrize(("method", "target", "body", "status"), ANSWERS)
def test_a_hot_route_answers_what_falcon_answers(tmp_path: Any, method: str, target: str,
                                                 body: bytes, status: int) -> None:
    sent = _both(_app(tmp_path), method, target, body)
    assert sent[0]["status"] == status


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
@pytest.mark.parametrize(("target", "body"), [("/api/v1/push", _push(3)),
                                              ("/api/v1/ack/batch", _acks("t1", "t2"))])
def test_a_compressed_body_read_in_chunks_is_decoded_once(tmp_path: Any, encoding: str,
                                                          target: str, body: bytes) -> None:
    """A hot route served as ASGI (its body in chunks, not read whole by the lean path)
    answers a compressed body as falcon does: decoded once (the CI fuzz run found a second
    decode's Content-Length check answering 400)."""
    packed = gzip.compress(body) if encoding == "gzip" else zstandard.compress(body)
    sent = _both(_app(tmp_path), "POST", target, packed,
                 [(b"content-encoding", encoding.encode())])
    assert sent[0]["status"] in (200, 201)


def test_refusals_of_the_middleware_and_the_body_limit(tmp_path: Any) -> None:
    # admission: the budget held by others, no hold: 429 with Retry-After
    app = _app(tmp_path, QUEEN_ADMIT_HOLD_MS="0", QUEEN_MAX_BODY_MB="1")
    budget = app.hot.admission.budget
    asyncio.run(budget.acquire(budget.capacity, 1))
    sent = _both(app, "POST", "/api/v1/push", _push(1))
    assert sent[0]["status"] == 429
    assert (b"retry-after", b"1") in sent[0]["headers"]
    budget.release(budget.capacity)
    # a body over its limit
    sent = _both(app, "POST", "/api/v1/push", b" " * ((1 << 20) + 1))
    assert sent[0]["status"] == 413


def test_a_push_waiting_for_admission_has_read_none_of_its_body(tmp_path: Any) -> None:
    # A receive resumes reading the connection: a push asks for its body once admitted.
    # (falcon's App awaits the first event before its middleware: not the hot routes.)
    app = _app(tmp_path)
    budget = app.hot.admission.budget
    body = _push(3)
    headers = [(b"host", b"x"), (b"content-length", str(len(body)).encode())]
    events = [{"type": "http.request", "body": body, "more_body": False}]
    received: list[str] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        event = events.pop(0) if events else {"type": "http.disconnect"}
        received.append(event["type"])
        return event

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def go() -> None:
        assert await budget.acquire(budget.capacity, 1)
        task = asyncio.get_running_loop().create_task(
            app(_scope("POST", "/api/v1/push", headers), receive, send))
        for _ in range(20):
            await asyncio.sleep(0)
        assert received == [] and sent == []
        budget.release(budget.capacity)
        await task

    asyncio.run(go())
    assert received == ["http.request"]
    assert sent[0]["status"] == 201


def test_a_push_whose_client_left_before_admission_is_not_answered(tmp_path: Any) -> None:
    app = _app(tmp_path)
    body = _push(1)
    headers = [(b"host", b"x"), (b"content-length", str(len(body)).encode())]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(_scope("POST", "/api/v1/push", headers), receive, send))
    assert sent == []


def test_authentication_refusals(tmp_path: Any) -> None:
    app = _app(tmp_path, QUEEN_JWT_ENABLED="1", QUEEN_JWT_SECRET="s" * 32)
    sent = _both(app, "POST", "/api/v1/push", _push(1))
    assert sent[0]["status"] == 401
    assert any(name == b"www-authenticate" for name, _ in sent[0]["headers"])
    sent = _both(app, "GET", "/api/v1/pop/queue/q", b"",
                 [(b"authorization", b"Bearer not-a-token")])
    assert sent[0]["status"] == 401


def test_what_the_hot_routes_leave_to_falcon(tmp_path: Any) -> None:
    hot = _app(tmp_path).hot

    def match(method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None,
              query: bytes = b"") -> bool:
        return hot.match({"method": method, "path": path, "query_string": query,
                          "headers": headers or []}) is not None

    assert match("POST", "/api/v1/push") and match("POST", "/api/v1/push/")
    assert match("GET", "/api/v1/pop/queue/q/partition/p/q")
    assert not match("HEAD", "/api/v1/pop/queue/q")
    assert not match("GET", "/api/v1/pop")  # namespace discovery: falcon
    assert not match("POST", "/api/v1/transaction")
    assert not match("GET", "/api/v1/pop/queue/q", query=b"\xff")
    assert not match("POST", "/api/v1/push", [(b"content-length", b" 1")])
    assert not match("POST", "/api/v1/push", [(b"authorization", b"a"),
                                              (b"authorization", b"b")])
    assert not match("POST", "/api/v1/push", [(b"content-length", b"1"),
                                              (b"content-length", b"1")])
    assert not match("POST", "/api/v1/push", [(b"content-encoding", b"gzip"),
                                              (b"content-encoding", b"gzip")])
    # a static path found once for POST routes no other method
    assert not match("GET", "/api/v1/push") and not match("HEAD", "/api/v1/push")
    call = hot.match({"method": "POST", "path": "/api/v1/ack/batch", "query_string": b"a=1",
                      "headers": [(b"host", b"x"), (b"authorization", b"Bearer t"),
                                  (b"content-length", b"12"), (b"content-encoding", b"gzip")]})
    assert call is not None
    assert (call.template, call.content_length, call.encoding, call.authorization,
            call.query_string) == ("/api/v1/ack/batch", 12, "gzip", "Bearer t", "a=1")


@pytest.mark.parametrize("answer", [
    Answer(200, b'{"a":1}'), Answer(200, b"QPF1..", "application/x-queen-pop"),
    Answer(201, b"[]", headers=(("Retry-After", "1"), ("x-queen-note", "n"))),
    Answer(204), Answer(200, b""), Answer(400, media={"error": "bad"}),
    Answer(429, media={"error": "busy"}, headers=(("Retry-After", "1"),)),
])
def test_head_lines_are_the_rendered_headers_as_the_server_writes_them(answer: Answer) -> None:
    """Made once per kind of data answer and kept: every answer of a kind, whatever its
    length, gets its own Content-Length."""
    for data in (answer.data, None if answer.data is None else answer.data + b" " * 7):
        answer = msgspec.structs.replace(answer, data=data)
        status, headers, body = rendered(answer)
        lines = b"".join(n.lower() + b": " + v + b"\r\n" for n, v in headers)
        assert head_lines(answer) == (status, lines, body)
        assert head_lines(answer) == (status, lines, body)
