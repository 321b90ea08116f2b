"""The front's corked HTTP transport: one write per answer, nothing lost or reordered."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any
from urllib.parse import unquote

import httptools
import pytest
import uvicorn

from queen_mp.processes.uvworker import (
    CorkedHttpToolsProtocol,
    CorkedTransport,
    IdleSweep,
    LazyFlowControl,
    limit_receive_buffers,
    request_target,
)

pytestmark = pytest.mark.timeout(20)


class FakeTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, parts: list[bytes]) -> None:
        self.calls.append(("writelines", [bytes(p) for p in parts]))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_writes_of_one_step_leave_in_one_writelines() -> None:
    async def scenario() -> FakeTransport:
        raw = FakeTransport()
        corked = CorkedTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
        corked.write(b"body")
        assert raw.calls == []  # held until the step ends
        await asyncio.sleep(0)
        corked.write(b"next")
        await asyncio.sleep(0)
        return raw

    raw = asyncio.run(scenario())
    assert raw.calls == [("writelines", [b"HTTP/1.1 200 OK\r\n\r\n", b"body"]),
                         ("writelines", [b"next"])]


def test_close_sends_what_is_held_first_and_later_writes_are_dropped() -> None:
    async def scenario() -> FakeTransport:
        raw = FakeTransport()
        corked = CorkedTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        corked.write(b"400 answer")
        corked.close()
        corked.write(b"late")
        await asyncio.sleep(0)
        assert corked.get_extra_info("peername") == "info:peername"  # the rest passes through
        return raw

    raw = asyncio.run(scenario())
    assert raw.calls == [("writelines", [b"400 answer"]), ("close", None)]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one", b"two"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    answer = b"echo:" + body
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head:
        while not rest.endswith(b"0\r\n\r\n"):
            rest += sock.recv(65536)
        return head + b"\r\n\r\n" + rest
    length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


def _served(app: Any, client: Any, receive_kb: int = 0) -> Any:
    """``client(port)``, run in a thread against ``app`` served by the front's protocol on a
    listener of its own (``receive_kb``: its receive buffer, as ``limit_receive_buffers``)."""
    async def scenario() -> Any:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, http=CorkedHttpToolsProtocol,
                                lifespan="off", log_level="warning")
        server = uvicorn.Server(config)
        listener = _listener()
        limit_receive_buffers([listener], receive_kb)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[listener]))
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            return await asyncio.to_thread(client, listener.getsockname()[1])
        finally:
            server.should_exit = True
            await task

    return asyncio.run(scenario())


def test_a_served_answer_is_one_flush_and_keep_alive_and_streams_still_work(monkeypatch) -> None:
    flushes: list[int] = []
    real_flush = CorkedTransport.flush

    def counting_flush(self: CorkedTransport) -> None:
        flushes.append(len(self._held))
        real_flush(self)

    monkeypatch.setattr(CorkedTransport, "flush", counting_flush)

    def client(port: int) -> list[bytes]:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            out = []
            for body in (b"a", b"bc"):
                sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                out.append(_read_answer(sock))
            sock.sendall(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
            out.append(_read_answer(sock))
            return out

    answers = _served(_app, client)
    assert answers[0].startswith(b"HTTP/1.1 201") and answers[0].endswith(b"\r\n\r\necho:a")
    assert answers[1].startswith(b"HTTP/1.1 201") and answers[1].endswith(b"\r\n\r\necho:bc")
    assert answers[2].startswith(b"HTTP/1.1 200")
    assert answers[2].endswith(b"\r\n\r\n3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n")
    # head and body of each fixed-length answer left together; the stream flushed per step
    assert flushes[:2] == [2, 2], flushes


def test_the_worker_serves_the_app_bare_and_without_a_server_header() -> None:
    from queen_mp.processes.uvworker import BalancedUvicornWorker

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not called")

    config = uvicorn.Config(app, **BalancedUvicornWorker.CONFIG_KWARGS)
    config.load()
    assert config.loaded_app is app  # no ProxyHeadersMiddleware around it
    assert b"server" not in dict(config.encoded_headers)


def test_lazy_flow_control_makes_its_event_on_the_first_pause_and_drains_as_uvicorns() -> None:
    async def scenario() -> None:
        flow = LazyFlowControl(FakeTransport())  # type: ignore[arg-type]
        await asyncio.wait_for(flow.drain(), 1)  # never paused: writable
        assert flow._is_writable_event is None
        flow.resume_writing()  # as connection_lost calls it, unpaused: nothing to do
        flow.pause_writing()
        assert flow.write_paused
        drained = asyncio.ensure_future(flow.drain())
        await asyncio.sleep(0.01)
        assert not drained.done()
        flow.resume_writing()
        await asyncio.wait_for(drained, 1)
        flow.pause_writing()  # paused again: the same Event, cleared
        again = asyncio.ensure_future(flow.drain())
        await asyncio.sleep(0.01)
        assert not again.done()
        flow.resume_writing()
        await asyncio.wait_for(again, 1)

    asyncio.run(scenario())


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    return sock


def test_a_limited_listener_leaves_a_waiting_body_in_the_socket_not_in_one_read() -> None:
    """What the worker reads of a body before admission lets it is one read: at most the
    receive buffer the accepted connection inherited from its listener."""
    with _listener() as listener:
        limit_receive_buffers([listener], 32)
        with socket.create_connection(listener.getsockname()) as client:
            conn, _ = listener.accept()
            with conn:
                size = conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                assert size == listener.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                assert 32 << 10 <= size <= 64 << 10  # Linux doubles what it is given
                client.setblocking(False)
                with contextlib.suppress(BlockingIOError):  # the client's buffer may fill up
                    client.send(b"x" * (1 << 20))  # a body far larger than the buffer
                time.sleep(0.2)  # what the network will deliver before the worker reads
                first = conn.recv(256_000)  # uvloop's read size
                assert 0 < len(first) <= size


def test_no_limit_leaves_the_kernel_s_receive_buffer() -> None:
    with _listener() as listener, _listener() as untouched:
        limit_receive_buffers([listener], 0)
        assert (listener.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                == untouched.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))


@pytest.mark.parametrize("url", [b"/api/v1/push", b"/api/v1/pop/queue/q?batch=2&wait=true",
                                 b"/api/v1/pop/queue/a%2Fb/partition/p%20q?x=%41",
                                 b"http://example.com/api/v1/push?", b"/"])
def test_request_target_is_what_uvicorn_puts_in_a_scope(url: bytes) -> None:
    """The lean path's path, raw path and query string of a target, as uvicorn's
    ``on_headers_complete`` sets them (the same again from its cache)."""
    parsed = httptools.parse_url(url)
    expected = (unquote(parsed.path.decode("ascii")), parsed.path, parsed.query or b"")
    assert request_target(url) == expected
    assert request_target(bytes(url)) == expected


def test_request_target_raises_as_httptools_does() -> None:
    with pytest.raises(httptools.HttpParserInvalidURLError):
        request_target(b"not a url")


def test_a_scope_made_late_is_the_one_uvicorn_makes_at_message_begin() -> None:
    """The lean path skips uvicorn's ``on_message_begin`` scope and makes it only when a
    request takes uvicorn's path (``_new_scope``): it must be the same dict, key for key, as
    the installed uvicorn's, which a new uvicorn release may change."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    proto = object.__new__(CorkedHttpToolsProtocol)
    proto.asgi_version = "3.0"  # type: ignore[attr-defined]
    proto.server, proto.client = ("127.0.0.1", 6632), ("127.0.0.1", 50000)
    proto.scheme, proto.root_path = "http", "/root"
    proto.app_state = {"k": 1}
    HttpToolsProtocol.on_message_begin(proto)
    theirs = proto.scope
    proto.headers.append((b"host", b"x"))
    proto.on_message_begin()
    assert proto.scope is None and proto.headers == [] and proto.url == b""
    proto.headers.append((b"host", b"x"))
    ours = proto._new_scope()
    assert ours == theirs and ours["headers"] is proto.headers
    assert ours["state"] is not proto.app_state


async def _late_reader(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``_app``, asking for the body only after a while, as a push waiting for the window."""
    if scope["type"] == "http":
        await asyncio.sleep(0.3)
    await _app(scope, receive, send)


def test_a_big_body_waits_unread_until_the_app_asks_for_it(monkeypatch) -> None:
    """Past the lean path's size (Content-Length or chunked), a body is not read beyond what
    came with its headers until the app's first ``receive``; then all of it is, and the
    small requests behind it on the connection, pipelined or not, and a 100-continue one,
    are answered as before."""
    reads: list[int] = []  # bytes of each read while no request has asked for its body
    asked: list[bool] = []
    real_received = CorkedHttpToolsProtocol.data_received

    def data_received(self: CorkedHttpToolsProtocol, data: bytes) -> None:
        if not asked:
            reads.append(len(data))
        real_received(self, data)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def first_receive() -> Any:
            asked.append(True)
            return await receive()
        await _late_reader(scope, first_receive if not asked else receive, send)

    monkeypatch.setattr(CorkedHttpToolsProtocol, "data_received", data_received)
    big = b"x" * 300_000
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (big[:100_000], big[100_000:]))

    def client(port: int) -> list[bytes]:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            out = []
            sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                         b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nz"
                         % (len(big), big))
            out += [_read_answer(sock), _read_answer(sock)]
            sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                         b"\r\n" + chunked + b"0\r\n\r\n")
            out.append(_read_answer(sock))
            sock.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n"
                         b"Expect: 100-continue\r\n\r\n")
            assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(big[:100_000])
            out.append(_read_answer(sock))
            return out

    answers = _served(app, client, receive_kb=32)
    assert [a.split(b"\r\n\r\n", 1)[1] for a in answers] == [
        b"echo:" + big, b"echo:z", b"echo:" + big, b"echo:" + big[:100_000]]
    assert len(reads) == 1, reads  # the read with the headers, none more until asked


class _Idle:
    """A connection as ``IdleSweep`` sees it: queued, checked (``_idle_check``), closed."""

    def __init__(self, sweep: IdleSweep, log: list[tuple[str, float]], name: str) -> None:
        self.sweep, self.log, self.name = sweep, log, name
        self._idle_queued = False
        self.requeue_at: float | None = None

    def queue(self, when: float) -> None:
        self._idle_queued = True
        self.sweep.add(when, self)  # type: ignore[arg-type]

    def _idle_check(self) -> None:
        loop = asyncio.get_running_loop()
        self.log.append((self.name, loop.time()))
        if self.requeue_at is not None:
            at, self.requeue_at = self.requeue_at, None
            self.queue(at)

    def close(self) -> None:
        if self._idle_queued:
            self._idle_queued = False
            self.sweep.closed()


def test_the_idle_sweep_checks_each_connection_at_its_time_on_one_timer() -> None:
    """Each queued connection is checked once, in time order, not before its time; one
    queued again is checked again later; a closed one is not checked; closed ones' entries
    go when they are many."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        sweep = IdleSweep()
        log: list[tuple[str, float]] = []
        now = loop.time()
        a, b, c = (_Idle(sweep, log, n) for n in "abc")
        b.queue(now + 0.06)
        a.queue(now + 0.02)
        c.queue(now + 0.04)
        a.requeue_at = now + 0.08
        c.close()
        await asyncio.sleep(0.15)
        assert [n for n, _ in log] == ["a", "b", "a"]
        for (name, at), due in zip(log, (0.02, 0.06, 0.08), strict=True):
            assert at >= now + due - 0.001, (name, at - now)
        assert not sweep._heap and sweep._dead == 0 and sweep._timer is None
        many = [_Idle(sweep, log, str(i)) for i in range(3 * IdleSweep._SLACK)]
        for conn in many:
            conn.queue(loop.time() + 60)
        for conn in many:
            conn.close()
        assert len(sweep._heap) <= IdleSweep._SLACK + 1

    asyncio.run(go())
