"""The gunicorn worker class of the front: uvicorn's, plus a listening socket of its own.

Why: every worker accepts from the one socket the gunicorn master bound, and an idle event loop
takes every connection pending when it wakes. Connections opened in a burst (a consumer service
starting 8 connections, bench/suite.py's consume section) all landed on one worker, which ran
at 100% of a core while the other idled. With ``--reuse-port`` the master's socket joins a
SO_REUSEPORT group; each worker adds a socket of its own on the same address (and gunicorn's
``--backlog``) to that group, and the kernel spreads new connections over the group by their
address hash. A worker still serves the master's socket too, so whatever the kernel puts there
is accepted by whichever worker is free, as before. The options that select this worker are
``queen_mp.processes.arbiter.FRONT_WORKER_ARGS``.

It also serves HTTP with ``CorkedHttpToolsProtocol``: uvicorn writes a response's status line
and headers, then its body, in two ``transport.write`` calls, so two ``send`` syscalls and two
TCP segments, and the client wakes twice per answer. On loopback a ``send`` also runs the
receiver's TCP path and wake-up; under 1-item pushes the two were a fifth of a front worker's
GIL-held samples (py-spy). The corked transport passes the writes of one loop step to one
``writelines``: one syscall per answer.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

__all__ = ["BalancedUvicornWorker", "CorkedHttpToolsProtocol", "CorkedTransport",
           "QuietExitServer", "own_listeners"]


def own_listeners(inherited: list[Any], backlog: int) -> list[socket.socket]:
    """A SO_REUSEPORT socket on the address of each inherited TCP listener that has the option
    (a Unix socket, or a master started without ``--reuse-port``, gets none)."""
    out: list[socket.socket] = []
    for sock in inherited:
        family = sock.family
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
            continue
        own = socket.socket(family, socket.SOCK_STREAM)
        try:
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            own.bind(sock.getsockname())
            own.listen(backlog)
            own.setblocking(False)
        except OSError:
            own.close()
            continue
        out.append(own)
    return out


#: how long a graceful stop keeps an idle keep-alive connection open for a request in flight
IDLE_GRACE_S = 0.25


class CorkedTransport:
    """A transport whose writes of one loop step leave together, at the end of the step.

    Everything but ``write`` and ``close`` is the wrapped transport's. ``close`` sends what is
    held first, as a transport's own ``close`` sends its buffer.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        # PERF(http): asked twice per answer (here and by uvicorn's cycle); not through
        # ``__getattr__``, a failed lookup and a Python call more each time
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a ``CorkedTransport`` (flow control still
    watches the real transport, which ``super().connection_made`` hands it), and closing idle
    keep-alive connections gracefully on a stop.

    uvicorn closes an idle keep-alive connection the moment a graceful stop begins. A request a
    client had just sent on it is then unread, and the close resets it: the client sees its
    request cut off with no answer (the fault matrix's SIGTERM row, issue 29). Here an idle
    connection stays open ``IDLE_GRACE_S`` more: what arrives meanwhile is served and answered
    with ``Connection: close``; then it closes.
    """

    _stopping = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = CorkedTransport(transport, self.loop)  # type: ignore[assignment]

    def shutdown(self) -> None:
        self._stopping = True
        if self.cycle is None or self.cycle.response_complete:
            self.loop.call_later(IDLE_GRACE_S, self._close_when_idle)
        else:
            self.cycle.keep_alive = False  # closed after this answer

    def _close_when_idle(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
        else:
            self.cycle.keep_alive = False

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self._stopping and self.cycle is not None:
            self.cycle.keep_alive = False


class QuietExitServer(Server):
    """uvicorn's server, minus raising the stop signal again once it has shut down.

    uvicorn re-raises a caught SIGTERM after its graceful shutdown so that a standalone server
    dies "of" the signal; under gunicorn the default handler is back by then, so every worker
    of every graceful stop or reload died by SIGTERM and the arbiter logged
    ``[ERROR] Worker (pid:N) was sent SIGTERM!``. A worker that finished its shutdown exits 0.
    """

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        # NOTE(http): uvicorn's list of signals to raise again on leaving capture_signals
        self._captured_signals.clear()


class BalancedUvicornWorker(UvicornWorker):
    # PERF(http): no ProxyHeadersMiddleware (uvicorn's default): nothing of the broker reads
    # the client address or scheme it rewrites from X-Forwarded-*, and it wrapped every
    # request in one more coroutine and a walk of its headers (5 of the 337 Python calls of a
    # 1-item push, cProfile of a front worker). No ``server: uvicorn`` header either: uvicorn
    # checks every header of an answer with two regular expressions, and this one told
    # clients nothing but the server's software.
    CONFIG_KWARGS: dict[str, Any] = {"loop": "auto", "http": CorkedHttpToolsProtocol,
                                     "proxy_headers": False, "server_header": False}

    def init_process(self) -> None:
        # NOTE(http): after fork, before the loop: the worker's own sockets join the group
        # only while it lives; its exit closes them (connections still queued on one are
        # reset, as on any listener closing).
        self.sockets = [*self.sockets, *own_listeners(self.sockets, self.cfg.backlog)]
        super().init_process()

    async def _serve(self) -> None:
        # uvicorn_worker's own _serve with QuietExitServer in place of uvicorn's Server
        self.config.app = self.wsgi
        server = QuietExitServer(config=self.config)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
