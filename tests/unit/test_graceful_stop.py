"""A front worker's graceful stop (queen_mp/processes/uvworker.py ``QuietExitServer``): the
connections waiting in its listening socket's backlog when the stop begins, their requests
already sent, are answered with ``Connection: close``, not reset as the listener closes."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
import uvicorn

from queen_mp.processes.uvworker import CorkedHttpToolsProtocol, QuietExitServer
from tests.unit.test_hot_routes import FakeIngest, _app, _push
from tests.unit.test_lean_http import _answer, _closed, _request

pytestmark = pytest.mark.timeout(60)


def test_requests_waiting_in_the_backlog_when_the_stop_begins_are_answered(
        tmp_path: Any) -> None:
    app = _app(tmp_path)
    app.hot.push.worker.ingest = FakeIngest()
    push = _request("POST", "/api/v1/push", _push(1))

    async def scenario() -> list[socket.socket]:
        server = QuietExitServer(uvicorn.Config(
            app, http=CorkedHttpToolsProtocol, lifespan="off", proxy_headers=False,
            server_header=False, log_level="warning"))
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[listener]))
        while not server.started:
            await asyncio.sleep(0.01)
        # the loop is held here: the kernel completes these connections, the server has
        # accepted none when its stop begins (its tick is due before the loop polls again)
        clients = [socket.create_connection(listener.getsockname()) for _ in range(5)]
        for sock in clients:
            sock.sendall(push)
        server.should_exit = True
        time.sleep(0.3)
        await task
        return clients

    clients = asyncio.run(scenario())
    for sock in clients:
        with sock:
            buffer: list[bytes] = []
            answer = _answer(sock, buffer)
            assert answer.startswith(b"HTTP/1.1 201 "), answer
            assert b"\r\nconnection: close\r\n" in answer
            assert _closed(sock, buffer)
