"""The front's lean path for the hot routes (queen_mp/processes/uvworker.py) leaves on the wire
the bytes uvicorn's request cycle leaves for the same requests, status line, headers and body,
over real sockets: answers of every kind (pushes of 1 and 100 items, pops, acks, errors, the
middleware's refusals), keep-alive and its timeout, pipelining, ``Connection: close``,
HTTP/1.0, a client gone mid-body, and a graceful stop."""

from __future__ import annotations

import asyncio
import gzip
import logging
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import uvicorn

from queen_mp.processes.uvworker import CorkedHttpToolsProtocol, LeanCycle
from tests.unit.test_hot_routes import ANSWERS, FakeIngest, _acks, _app, _push

pytestmark = pytest.mark.timeout(60)

Script = Callable[[int, uvicorn.Server], Any]


class UvicornPath(CorkedHttpToolsProtocol):
    """The same protocol with the lean path off: every request takes uvicorn's cycle."""

    def _lean_cycle(self) -> LeanCycle | None:
        return None


class CountingLean(CorkedHttpToolsProtocol):
    taken: list[str] = []

    def _lean_cycle(self) -> LeanCycle | None:
        lean = super()._lean_cycle()
        if lean is not None:
            CountingLean.taken.append(lean.call.path)
        return lean


class Boom(BaseException):
    pass


class SlowIngest(FakeIngest):
    """Pushes to queue ``slow`` take a while: a request stays in flight."""

    pushed = 0

    async def push(self, items: Any, tenant: bytes, chunks: Any = ()) -> Any:
        SlowIngest.pushed += len(items)
        if items[0].queue == "slow":
            await asyncio.sleep(0.3)
        if items[0].queue == "boom":
            raise Boom  # past every handler of the application: the server's own 500
        return await super().push(items, tenant, chunks)


def _serve(protocol: type, app: Any, script: Script, **config: Any) -> Any:
    """``script(port, server)`` run in a thread against a uvicorn server of ``protocol``."""
    app.hot.push.worker.ingest = SlowIngest()

    async def scenario() -> Any:
        server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=0, http=protocol, lifespan="off", proxy_headers=False,
            server_header=False, **{"log_level": "warning", **config}))
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[listener]))
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            return await asyncio.to_thread(script, listener.getsockname()[1], server)
        finally:
            server.should_exit = True
            await task
            assert not server.server_state.tasks

    return asyncio.run(scenario())


def _both(app_of: Callable[[], Any], script: Script, lean: int, **config: Any) -> Any:
    """What ``script`` saw on the lean path, after checking uvicorn's path saw the same
    (the date header's value aside) and that ``lean`` requests took the lean path."""
    CountingLean.taken.clear()
    got = _serve(CountingLean, app_of(), script, **config)
    assert len(CountingLean.taken) == lean, CountingLean.taken
    plain = _serve(UvicornPath, app_of(), script, **config)
    assert _undated(got) == _undated(plain)
    return got


def _undated(seen: Any) -> Any:
    if isinstance(seen, bytes):
        return re.sub(rb"\r\ndate: [^\r]*\r\n", b"\r\ndate: -\r\n", seen)
    return [_undated(s) for s in seen] if isinstance(seen, list) else seen


def _answer(sock: socket.socket, buffer: list[bytes]) -> bytes:
    """One answer off the socket (``buffer`` keeps what came after it)."""
    data = buffer.pop() if buffer else b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, f"closed before an answer: {data!r}"
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    found = re.search(rb"\r\ncontent-length: (\d+)", head)
    length = int(found.group(1)) if found else 0
    while len(rest) < length:
        rest += sock.recv(65536)
    buffer.append(rest[length:])
    return head + b"\r\n\r\n" + rest[:length]


def _closed(sock: socket.socket, buffer: list[bytes]) -> bool:
    """Whether the server closed the connection (within 3 s), nothing more sent."""
    sock.settimeout(3)
    try:
        return not (buffer and buffer[0]) and sock.recv(1) == b""
    except TimeoutError:
        return False


def _request(method: str, target: str, body: bytes = b"", extra: bytes = b"",
             version: bytes = b"1.1") -> bytes:
    length = b"Content-Length: %d\r\n" % len(body) if method == "POST" else b""
    return b"%s %s HTTP/%s\r\nHost: t\r\n%s%s\r\n%s" % (method.encode(), target.encode(),
                                                         version, length, extra, body)


def _exchange(*requests: bytes, close: bool = False) -> Script:
    """Each request sent and answered in turn on one connection; whether it was closed."""
    def script(port: int, server: uvicorn.Server) -> list[Any]:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            buffer: list[bytes] = []
            out: list[Any] = []
            for raw in requests:
                sock.sendall(raw)
                out.append(_answer(sock, buffer))
            out.append(_closed(sock, buffer) if close else None)
            return out
    return script


CASES = [*ANSWERS,
         ("POST", "/api/v1/push", _push(1), 201),
         ("POST", "/api/v1/push", _push(100), 201),
         ("POST", "/api/v1/push/", _push(1), 201),
         ("GET", "/api/v1/pop/queue/q/partition/a%2Fb?batch=3", b"", 200)]


@pytest.mark.parametrize(("method", "target", "body", "status"), CASES)
def test_an_answer_is_uvicorns_bytes_and_the_connection_stays_open(
        tmp_path: Any, method: str, target: str, body: bytes, status: int) -> None:
    raw = _request(method, target, body)
    first, second, _ = _both(lambda: _app(tmp_path), _exchange(raw, raw), lean=2)
    assert first.startswith(b"HTTP/1.1 %d " % status)
    assert _undated(first) == _undated(second)


def test_refusals_of_the_middleware_and_the_body_limits(tmp_path: Any) -> None:
    def held() -> Any:
        app = _app(tmp_path, QUEEN_ADMIT_HOLD_MS="0", QUEEN_MAX_BODY_MB="1")
        budget = app.hot.admission.budget
        asyncio.run(budget.acquire(budget.capacity, 1))  # held by others, no hold: 429
        return app

    first, _ = _both(held, _exchange(_request("POST", "/api/v1/push", _push(1))), lean=1)
    assert first.startswith(b"HTTP/1.1 429 ") and b"\r\nretry-after: 1\r\n" in first

    def limited() -> Any:
        return _app(tmp_path, QUEEN_MAX_BODY_MB="1")

    bomb = gzip.compress(b" " * ((1 << 20) + 1))  # small on the wire, over the limit decoded
    first, _ = _both(limited, _exchange(_request("POST", "/api/v1/push", bomb,
                                                 b"Content-Encoding: gzip\r\n")), lean=1)
    assert first.startswith(b"HTTP/1.1 413 ")
    # a declared body over LEAN_MAX_BODY takes uvicorn's path
    first, _ = _both(limited, _exchange(_request("POST", "/api/v1/push",
                                                 b" " * ((1 << 20) + 1))), lean=0)
    assert first.startswith(b"HTTP/1.1 413 ")


def test_authentication_refusals(tmp_path: Any) -> None:
    def app() -> Any:
        return _app(tmp_path, QUEEN_JWT_ENABLED="1", QUEEN_JWT_SECRET="s" * 32)

    first, second, _ = _both(app, _exchange(
        _request("POST", "/api/v1/push", _push(1)),
        _request("GET", "/api/v1/pop/queue/q", extra=b"Authorization: Bearer nope\r\n")), lean=2)
    assert first.startswith(b"HTTP/1.1 401 ") and b"\r\nwww-authenticate: " in first
    assert second.startswith(b"HTTP/1.1 401 ")


def test_a_failure_past_the_application_is_uvicorns_500_and_a_close(tmp_path: Any) -> None:
    raw = _request("POST", "/api/v1/push", _push(1).replace(b'"q"', b'"boom"'))
    answer, closed = _both(lambda: _app(tmp_path), _exchange(raw, close=True), lean=1)
    assert answer.startswith(b"HTTP/1.1 500 ") and answer.endswith(b"Internal Server Error")
    assert closed


def test_the_access_log_says_what_uvicorns_says(tmp_path: Any) -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    def script(port: int, server: uvicorn.Server) -> list[Any]:
        logging.getLogger("uvicorn.access").addHandler(Keep())
        return _exchange(_request("POST", "/api/v1/push", _push(1)),
                         _request("GET", "/api/v1/pop/queue/q/partition/a%2Fb?batch=2",
                                  version=b"1.0"))(port, server)

    _both(lambda: _app(tmp_path), script, lean=2, log_level="info")
    logged = [re.sub(r":\d+ - ", ":- - ", line) for line in lines]  # the client's port
    assert logged[:2] == logged[2:] and len(logged) == 4, logged
    assert logged[1] == ('127.0.0.1:- - "GET /api/v1/pop/queue/q/partition/a%2Fb?batch=2 '
                         'HTTP/1.0" 200')


def test_connection_close_and_http_1_0_close_after_the_answer(tmp_path: Any) -> None:
    push = _push(1)
    for raw in (_request("POST", "/api/v1/push", push, b"Connection: close\r\n"),
                _request("POST", "/api/v1/push", push, version=b"1.0"),
                _request("POST", "/api/v1/push", push, b"Connection: keep-alive\r\n",
                         version=b"1.0")):
        answer, closed = _both(lambda: _app(tmp_path), _exchange(raw, close=True), lean=1)
        assert b"\r\nconnection: close\r\n" in answer and closed


def test_the_keep_alive_timeout_closes_an_idle_connection(tmp_path: Any) -> None:
    answer, closed = _both(lambda: _app(tmp_path), _exchange(
        _request("GET", "/api/v1/pop/queue/q"), close=True), lean=1, timeout_keep_alive=1)
    assert b"connection: close" not in answer and closed


def test_pipelined_requests_are_answered_in_order(tmp_path: Any) -> None:
    """The first request takes the lean path; those arriving while it is in flight queue up
    in uvicorn's pipeline, as behind any request."""
    requests = [_request("POST", "/api/v1/push", _push(1).replace(b'"q"', b'"slow"')),
                _request("GET", "/api/v1/pop/queue/q"),
                _request("GET", "/nowhere"),
                _request("POST", "/api/v1/ack/batch", _acks("t1"))]

    def script(port: int, server: uvicorn.Server) -> list[bytes]:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"".join(requests))
            buffer: list[bytes] = []
            return [_answer(sock, buffer) for _ in requests]

    answers = _both(lambda: _app(tmp_path), script, lean=1)
    assert [a[:12] for a in answers] == [b"HTTP/1.1 201", b"HTTP/1.1 200", b"HTTP/1.1 404",
                                         b"HTTP/1.1 200"]
    assert b'"transactionId":"t0"' in answers[0] and b'"messages"' in answers[1]


def test_a_client_gone_mid_body_is_not_answered_nor_pushed(tmp_path: Any) -> None:
    body = _push(1)

    def script(port: int, server: uvicorn.Server) -> bytes:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(_request("POST", "/api/v1/push", body)[:-10])
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port)) as sock:  # the server still serves
            sock.sendall(_request("GET", "/api/v1/pop/queue/empty"))
            return _answer(sock, [])

    SlowIngest.pushed = 0
    CountingLean.taken.clear()
    answer = _serve(CountingLean, _app(tmp_path), script)
    assert answer.startswith(b"HTTP/1.1 204 ")
    assert CountingLean.taken == ["/api/v1/push", "/api/v1/pop/queue/empty"]
    assert SlowIngest.pushed == 0


def test_a_client_gone_while_its_request_is_served_gets_nothing(tmp_path: Any) -> None:
    def script(port: int, server: uvicorn.Server) -> bytes:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(_request("POST", "/api/v1/push", _push(1).replace(b'"q"', b'"slow"')))
            time.sleep(0.1)
        time.sleep(0.4)  # the push ends, its answer is dropped
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(_request("GET", "/api/v1/pop/queue/empty"))
            return _answer(sock, [])

    SlowIngest.pushed = 0
    CountingLean.taken.clear()
    answer = _serve(CountingLean, _app(tmp_path), script)
    assert answer.startswith(b"HTTP/1.1 204 ") and SlowIngest.pushed == 1
    assert CountingLean.taken == ["/api/v1/push", "/api/v1/pop/queue/empty"]


def test_a_graceful_stop_answers_what_is_in_flight_and_arrives_then_closes(
        tmp_path: Any) -> None:
    slow = _request("POST", "/api/v1/push", _push(1).replace(b'"q"', b'"slow"'))

    def in_flight(port: int, server: uvicorn.Server) -> list[Any]:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(slow)
            time.sleep(0.1)
            server.should_exit = True
            buffer: list[bytes] = []
            return [_answer(sock, buffer), _closed(sock, buffer)]

    def idle(port: int, server: uvicorn.Server) -> list[Any]:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            buffer: list[bytes] = []
            sock.sendall(_request("GET", "/api/v1/pop/queue/empty"))
            first = _answer(sock, buffer)
            server.should_exit = True
            time.sleep(0.12)  # the stop has begun; the idle connection is kept a while
            sock.sendall(_request("GET", "/api/v1/pop/queue/q"))
            return [first, _answer(sock, buffer), _closed(sock, buffer)]

    answer, closed = _both(lambda: _app(tmp_path), in_flight, lean=1)
    assert answer.startswith(b"HTTP/1.1 201 ") and b"\r\nconnection: close\r\n" in answer
    assert closed
    first, second, closed = _both(lambda: _app(tmp_path), idle, lean=2)
    assert b"connection: close" not in first
    assert b"\r\nconnection: close\r\n" in second and closed


class KeepingLean(CorkedHttpToolsProtocol):
    """Keeps what a lean request leaves on its protocol once answered."""

    seen: list[tuple[Any, Any, Any, Any, int]] = []

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        KeepingLean.seen.append((self.scope, self.headers, getattr(cycle, "scope", "-"),
                                 type(self.flow).__name__, len(vars(self))))


@pytest.mark.parametrize("access_log", [False, True])
def test_an_answered_lean_request_leaves_no_scope_unless_the_access_log_needs_it(
        tmp_path: Any, access_log: bool) -> None:
    """NOTE(memory): a connection holds what its last request left until the next one (a
    parked pop, until it is answered): the scope and header list stay only for the access
    log, the flow control has no Event before writing ever pauses, and the protocol keeps
    the class's shared dict keys (at most 29 attributes in its dict, CPython 3.11)."""
    KeepingLean.seen.clear()
    answers = _serve(KeepingLean, _app(tmp_path), _exchange(
        _request("GET", "/api/v1/pop/queue/q?batch=2"), _request("POST", "/api/v1/push",
                                                                  _push(1))),
        access_log=access_log, log_level="info")
    assert answers[0].startswith(b"HTTP/1.1 200") and answers[1].startswith(b"HTTP/1.1 201")
    assert len(KeepingLean.seen) == 2
    for scope, headers, cycle_scope, flow, attributes in KeepingLean.seen:
        assert scope is None and headers is None and flow == "LazyFlowControl"
        assert attributes <= 29, attributes
        assert (cycle_scope is not None) == access_log
