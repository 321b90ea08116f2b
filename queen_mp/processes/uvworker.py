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

And it answers the hot routes (queen_mp/http/hot.py) on a lean path below uvicorn's request
cycle: a small request to one of them, when nothing else is in flight on its connection, is
read whole by the protocol and answered by one task that writes the bytes uvicorn would
(``CorkedHttpToolsProtocol``).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import sys
import weakref
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools
from gunicorn.arbiter import Arbiter
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import (
    get_client_addr,
    get_local_addr,
    get_path_with_query_string,
    get_remote_addr,
    is_ssl,
)
from uvicorn.server import Server, ServerState
from uvicorn_worker import UvicornWorker

from queen_mp.config import Config
from queen_mp.front.deadlines import DeadlineHeap

if TYPE_CHECKING:
    # NOTE(http): the hot routes come with the app (queen_mp/http/app.py); importing them
    # here would load psycopg into the supervisor, which loads this module to name gunicorn's
    # worker class (tests/unit/test_import_weight.py)
    from queen_mp.http.hot import HotCall, HotRoutes

__all__ = ["BalancedUvicornWorker", "CorkedHttpToolsProtocol", "CorkedTransport", "IdleSweep",
           "LazyFlowControl", "LeanCycle", "QuietExitServer", "StoppingServerState",
           "limit_receive_buffers", "own_listeners", "waiting_connections"]


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


def limit_receive_buffers(listeners: list[Any], kb: int) -> None:
    """Give the TCP ``listeners`` a receive buffer of ``kb`` KiB (0: leave the kernel's
    autotuning), which the connections they accept inherit.

    PERF(memory): a request's body waits for admission and the work window unread
    (queen_mp/http/admission.py), but what reached the worker's socket before then was read
    with the headers (uvloop reads up to 250 KB at once) and sat in the worker as bytes: with
    autotuned buffers a waiting 1,000-item JSON push was mostly in user space, some 7 MB in
    each front worker under 64 connections. A small buffer leaves a waiting body in the
    client's socket and the network, where it costs the broker nothing."""
    if kb <= 0:
        return
    for sock in listeners:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, kb << 10)


#: how long a graceful stop keeps an idle keep-alive connection open for a request in flight
IDLE_GRACE_S = 0.25
#: the largest body the lean path reads whole before answering; a larger one takes uvicorn's
#: path, where admission refuses it before its body is read (reading pauses at its headers)
LEAN_MAX_BODY = HIGH_WATER_LIMIT
#: what uvicorn answers when the application fails before answering (its header lines)
_FAILED = (500, b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n",
           b"Internal Server Error")


@functools.lru_cache(maxsize=256)
def request_target(url: bytes) -> tuple[str, bytes, bytes]:
    """A request target's path (decoded, unquoted), raw path and query string, as uvicorn's
    ``on_headers_complete`` sets them in a scope.

    PERF(http): cached by the target's bytes: a client sends the same few (a producer's push
    path, a consumer's pop with its query) over and over; httptools' parse of it made a URL
    object and the path was decoded anew for each request. NOTE(memory): at most 256
    targets, as their bytes and parts."""
    parsed = httptools.parse_url(url)
    raw_path = parsed.path
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path)
    return path, raw_path, parsed.query or b""


#: the last list of default headers the server set (it sets a new one with each new Date) and
#: its lines
_DEFAULT_LINES: list[tuple[list[tuple[bytes, bytes]], bytes]] = [([], b"")]


class CorkedTransport:
    """A transport whose writes of one loop step leave together, at the end of the step.

    Everything but ``write`` and ``close`` is the wrapped transport's. ``close`` sends what is
    held first, as a transport's own ``close`` sends its buffer.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        # NOTE(memory): a list only while writes are held (an idle or parked connection
        # holds none)
        self._held: list[bytes | bytearray | memoryview] | tuple[()] = ()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held:
            held.append(data)  # type: ignore[union-attr]
        else:
            self._loop.call_soon(self.flush)
            self._held = [data]

    def flush(self) -> None:
        held, self._held = self._held, ()
        if held and not self._transport.is_closing():
            self._transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_answer(self, head: bytes, body: bytes | None) -> None:
        """A whole answer: at once when nothing is held (one ``writelines``, one syscall),
        else after what is."""
        held = self._held
        if held:
            held.append(head)  # type: ignore[union-attr]
            if body:
                held.append(body)  # type: ignore[union-attr]
        elif not self._transport.is_closing():
            self._transport.writelines((head, body) if body else (head,))

    def is_closing(self) -> bool:
        # PERF(http): asked twice per answer (here and by uvicorn's cycle); not through
        # ``__getattr__``, a failed lookup and a Python call more each time
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LazyFlowControl(FlowControl):
    """uvicorn's flow control, whose Event is made the first time writing pauses.

    PERF(memory): uvicorn's makes an ``asyncio.Event`` per connection, and an Event's empty
    deque of waiters is 624 bytes: 0.85 KB of each open connection (a parked long poll holds
    one), for an Event that only a client reading slower than the answers come ever needs.
    Its attributes in slots (uvicorn's class has none, so the instance dict is only never
    made): 0.1 KB less a connection."""

    __slots__ = ("_is_writable_event", "_transport", "read_paused", "write_paused")

    def __init__(self, transport: asyncio.Transport) -> None:  # not super()'s: its Event
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._is_writable_event: asyncio.Event | None = None  # type: ignore[assignment]

    async def drain(self) -> None:
        event = self._is_writable_event
        if event is not None:  # never paused: writable
            await event.wait()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            if self._is_writable_event is None:
                self._is_writable_event = asyncio.Event()
            else:
                self._is_writable_event.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            if self._is_writable_event is not None:
                self._is_writable_event.set()


class _Pipeline(list):  # type: ignore[type-arg]
    """uvicorn's queue of pipelined requests (it calls ``appendleft`` and ``pop``) as a list.

    PERF(memory): an empty deque is 624 bytes, an empty list 56: pipelining is rare, and every
    open connection holds its queue."""

    __slots__ = ()

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


def _big_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request's body is more than the lean path reads whole: chunked, or a
    ``Content-Length`` over ``LEAN_MAX_BODY``."""
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) > LEAN_MAX_BODY
        if name == b"transfer-encoding":
            return True
    return False


class IdleSweep(DeadlineHeap["CorkedHttpToolsProtocol"]):
    """The keep-alive checks of one server's connections, each connection at most once in it.

    PERF(memory): a connection answered and asked again (a long poll answered 204 and parked
    again, the suite's wake section) held a uvloop timer for ``timeout_keep_alive`` seconds.
    An entry whose connection closed stays until its time or a compaction (at most ``_SLACK``
    such, or as many as there are live ones)."""

    __slots__ = ("_dead",)

    _SLACK = 16

    def __init__(self) -> None:
        super().__init__()
        self._dead = 0  # entries of connections closed since they were queued

    def closed(self) -> None:
        """A queued connection closed: its entry is dead (dropped by a compaction when they
        are many)."""
        self._dead += 1
        if self._dead > self._SLACK and 2 * self._dead > len(self._heap):
            self.compact(_queued)
            self._dead = 0

    def _due(self, items: list[CorkedHttpToolsProtocol]) -> None:
        for conn in items:
            if not conn._idle_queued:
                self._dead -= 1
                continue
            conn._idle_queued = False
            try:
                conn._idle_check()
            except Exception as ex:  # as a timer's own callback: reported, the others go on
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "keep-alive check failed", "exception": ex})


def _queued(conn: CorkedHttpToolsProtocol) -> bool:
    return conn._idle_queued


#: each server's ``IdleSweep`` (by its state, which its connections share)
_SWEEPS: weakref.WeakKeyDictionary[ServerState, IdleSweep] = weakref.WeakKeyDictionary()
#: a connection's address not asked yet (``CorkedHttpToolsProtocol.server``, ``.client``)
_UNKNOWN: Any = object()


class LeanCycle:
    """A hot-route request on the lean path: what uvicorn's RequestResponseCycle would hold
    of it, under the names the protocol's code (uvicorn's and ours) reads of a cycle."""

    __slots__ = ("call", "chunks", "disconnected", "keep_alive", "response_complete", "scope",
                 "task")

    def __init__(self, call: HotCall, scope: dict[str, Any] | None, keep_alive: bool) -> None:
        self.call = call
        self.scope = scope
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.disconnected = False
        self.response_complete = False
        #: the task answering it, set once made; dropped when it ends (it holds this cycle)
        self.task: asyncio.Task[None] | None = None


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a ``CorkedTransport`` (flow control still
    watches the real transport, which ``super().connection_made`` hands it), closing idle
    keep-alive connections gracefully on a stop, and answering the hot routes on a lean path.

    uvicorn closes an idle keep-alive connection the moment a graceful stop begins. A request a
    client had just sent on it is then unread, and the close resets it: the client sees its
    request cut off with no answer (the fault matrix's SIGTERM row, issue 29). Here an idle
    connection stays open ``IDLE_GRACE_S`` more: what arrives meanwhile is served and answered
    with ``Connection: close``; then it closes.

    PERF(memory): per connection, ``LazyFlowControl`` and ``_Pipeline`` (1.5 KB less than
    uvicorn's Event and deque), and a request on the lean path leaves the protocol's scope and
    header list (about 1.8 KB) to its ``LeanCycle``, which keeps the scope only for the access
    log: a parked long poll holds its connection for up to its whole timeout.

    PERF(http): uvicorn serves each request with a RequestResponseCycle, an asyncio.Event, a
    task running the ASGI app, and ASGI receive/send awaits of dict messages, then checks each
    header of the answer against two regular expressions: 46 Python calls and 70k of the 316k
    instructions of a 1-item push served over fake backends (cProfile, callgrind), about a
    tenth of a front worker's CPU per 1-item push on a real broker. A request to one of
    hot.py's routes with no body or a Content-Length one of at most ``LEAN_MAX_BODY`` bytes,
    not chunked, not expecting 100-continue, no upgrade, HTTP/1.0 or 1.1, that
    ``HotRoutes.match`` takes, arriving while nothing else is in flight on its connection, is
    read whole here (a ``LeanCycle`` stands in as ``self.cycle``) and answered by one task
    through ``HotRoutes.respond``, writing uvicorn's bytes for the answer
    (tests/unit/test_lean_http.py compares them). Pipelining, keep-alive, ``shutdown``, the
    access log and the task count of a graceful stop see it as a cycle; everything else takes
    uvicorn's path.
    """

    # PERF(memory): this class's own attributes, and uvicorn's ``url``, in slots: with them
    # in the instance dict an answered connection had 30 to 32 keys, and past 29 CPython 3.11
    # gives up the class's shared keys for a dict of the instance's own, 1.6 KB against 0.3
    __slots__ = ("_client", "_hot", "_idle_queued", "_idle_since", "_server", "_stopping", "_sweep",
                 "url")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stopping = False
        #: loop time the connection last went idle (None while a request is in flight)
        self._idle_since: float | None = None
        #: whether its keep-alive check is in its server's ``IdleSweep``
        self._idle_queued = False
        self.url = b""
        super().__init__(*args, **kwargs)
        sweep = _SWEEPS.get(self.server_state)
        if sweep is None:
            sweep = _SWEEPS[self.server_state] = IdleSweep()
        self._sweep = sweep
        self.pipeline = _Pipeline()  # type: ignore[assignment]
        hot = getattr(self.app, "hot", None)  # queen_mp.http.app.App's, when it is served bare
        self._hot: HotRoutes | None = (
            hot if hasattr(hot, "head_lines") and self.limit_concurrency is None
            and not self.config.reset_contextvars else None)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # uvicorn's, its addresses found when first asked (``server``, ``client``)
        self.connections.add(self)
        self._server = self._client = _UNKNOWN
        self.scheme = "https" if is_ssl(transport) else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            self.transport = transport
            client = self.client
            prefix = f"{client[0]}:{client[1]} - " if client else ""
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection made", prefix)
        self.flow = LazyFlowControl(transport)
        self.transport = CorkedTransport(transport, self.loop)  # type: ignore[assignment]
        if getattr(self.server_state, "stopping", False):
            # made after the stop began: taken from the backlog by ``QuietExitServer``, or
            # accepted in the loop turn that began it (uvloop calls ``connection_made`` a turn
            # after the accept), after uvicorn asked the connections it had to shut down
            self.shutdown()

    # PERF(memory): a connection's addresses are asked only for a scope (uvicorn's path, the
    # access log): uvloop keeps what ``get_extra_info("socket")`` made and the addresses it
    # read, some 0.5 KB a connection (tracemalloc), which most lean-path connections never use
    @property
    def server(self) -> tuple[str, int | None] | None:  # type: ignore[override]
        found = self._server
        if found is _UNKNOWN:
            found = self._server = get_local_addr(self.transport)
        return found  # type: ignore[no-any-return]

    @server.setter
    def server(self, value: tuple[str, int | None] | None) -> None:
        self._server = value

    @property
    def client(self) -> tuple[str, int] | None:  # type: ignore[override]
        found = self._client
        if found is _UNKNOWN:
            found = self._client = get_remote_addr(self.transport)
        return found  # type: ignore[no-any-return]

    @client.setter
    def client(self, value: tuple[str, int] | None) -> None:
        self._client = value

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        if type(cycle) is LeanCycle:
            cycle.disconnected = True  # its answer, if any comes, is dropped
            self.cycle = None  # type: ignore[assignment]
        if self._idle_queued:
            self._idle_queued = False
            self._sweep.closed()
        super().connection_lost(exc)

    # PERF(http): uvicorn arms a keep-alive timer after every answer and cancels it at the
    # next request's first bytes: a TimerHandle and a libuv timer start and stop per request.
    # Here one check per connection stays queued (in its server's ``IdleSweep``, PERF(memory):
    # not a timer each); when it comes it closes the connection if it has been idle
    # ``timeout_keep_alive`` seconds, else queues itself for the rest of that time (or, while
    # a request is in flight, lets the next answer queue it again).
    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None

    def on_response_complete(self) -> None:
        # uvicorn's, arming the keep-alive timer only when none is armed
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        if self.flow.read_paused:  # PERF(http): not a Python call per answer to learn so
            self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = now = self.loop.time()
        if not self._idle_queued:
            self._idle_queued = True
            self._sweep.add(now + self.timeout_keep_alive, self)

    def _idle_check(self) -> None:
        since = self._idle_since
        if since is None or self.transport.is_closing():
            return
        due = since + self.timeout_keep_alive
        if due <= self.loop.time():
            self.timeout_keep_alive_handler()
        else:
            self._idle_queued = True
            self._sweep.add(due, self)

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

    def on_message_begin(self) -> None:
        # uvicorn's, minus the request's ASGI scope: PERF(http): the lean path reads the
        # method, target and headers from the parser and this protocol, and a request has its
        # scope made (``_new_scope``) only if it takes uvicorn's path or the access log wants
        # it (a dict of ten keys, two of them new dicts, per request)
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = None  # type: ignore[assignment]

    def _new_scope(self) -> dict[str, Any]:
        """The scope uvicorn's ``on_message_begin`` makes, of the request's headers so far."""
        return {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_headers_complete(self) -> None:
        lean = self._lean_cycle()
        if lean is not None:
            self.cycle = lean  # type: ignore[assignment]
            # NOTE(memory): the next request's ``on_message_begin`` makes them anew (the
            # target's parts are the call's: a parked pop held its URL twice)
            self.headers = None  # type: ignore[assignment]
            self.url = b""
            return
        if self.scope is None:
            self.scope = self._new_scope()  # type: ignore[assignment]
        super().on_headers_complete()
        if self._stopping and self.cycle is not None:
            self.cycle.keep_alive = False
        if not self.flow.read_paused and _big_body(self.headers) and (
                not self.parser.should_upgrade()):
            # PERF(memory): a body past the lean path's waits unread in its socket until
            # the app asks for it (uvicorn's ``receive`` resumes reading; its answer does
            # too): uvicorn went on reading it up to its 64 KiB high-water mark, so a push
            # waiting for the work window held up to two reads of it in the worker
            self.flow.pause_reading()

    def _lean_cycle(self) -> LeanCycle | None:
        """The request whose headers just ended as a ``LeanCycle``, if the lean path takes it
        (its scope then has what uvicorn's has at this point)."""
        hot, cycle, parser = self._hot, self.cycle, self.parser
        if hot is None or self.pipeline or self.expect_100_continue or (
                cycle is not None and not cycle.response_complete) or parser.should_upgrade():
            return None
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            return None
        headers = self.headers
        for name, _ in headers:
            if name == b"transfer-encoding":
                return None
        method = parser.get_method().decode("ascii")
        if method != "POST" and method != "GET":
            return None
        path, raw_path, query = request_target(self.url)
        call = hot.match_head(method, self.root_path + path, headers, query)
        if call is None:
            return None
        length = call.content_length
        if (length is None and method == "POST") or (length is not None and
                                                     length > LEAN_MAX_BODY):
            return None
        keep_alive = version != "1.0" and parser.should_keep_alive() and not self._stopping
        if not self.access_log:
            return LeanCycle(call, None, keep_alive)
        # kept for the access log: what uvicorn's on_headers_complete sets
        scope = self._new_scope()
        scope["method"] = method
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = query
        if version != "1.1":
            scope["http_version"] = version
        return LeanCycle(call, scope, keep_alive)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is LeanCycle:
            cycle.chunks.append(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not LeanCycle:
            super().on_message_complete()
            return
        cycle.task = task = self.loop.create_task(self._answer_lean(cycle))
        self.tasks.add(task)

    async def _answer_lean(self, cycle: LeanCycle) -> None:
        try:
            hot = self._hot
            assert hot is not None
            # NOTE(memory): no list left while the answer waits (a parked pop's)
            whole, cycle.chunks = b"".join(cycle.chunks), ()  # type: ignore[assignment]
            try:
                # PERF(memory): not through a coroutine of its own (a parked pop holds its chain)
                status, lines, body = hot.head_lines(await hot.respond(cycle.call, whole))
            except BaseException as ex:  # as uvicorn's cycle: logged, answered 500, closed
                self.logger.error("Exception in ASGI application\n", exc_info=ex)
                (status, lines, body), cycle.keep_alive = _FAILED, False
            if self.flow.write_paused and not cycle.disconnected:
                await self.flow.drain()
            if cycle.disconnected:
                return  # as uvicorn's cycle: nobody to answer
            scope = cycle.scope
            if scope is not None:  # kept for the access log only
                self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope),
                                        scope["method"], get_path_with_query_string(scope),
                                        scope["http_version"], status)
            # PERF(http): the server's default headers (its Date, once a second) as lines, made
            # once for each list of them the server sets
            defaults = self.server_state.default_headers
            made = _DEFAULT_LINES[0]
            if made[0] is not defaults:
                made = _DEFAULT_LINES[0] = (defaults, hot.header_lines(defaults))
            transport: CorkedTransport = self.transport  # type: ignore[assignment]
            transport.write_answer(b"".join((STATUS_LINE[status], made[1], lines, b"\r\n"
                                             if cycle.keep_alive else
                                             b"connection: close\r\n\r\n")), body)
            cycle.response_complete = True
            if not cycle.keep_alive:
                transport.close()
            self.on_response_complete()
        finally:
            # PERF(http): out of ``tasks`` here, not by a done callback (a loop callback
            # made, run and freed per request); a task cancelled before its first step (only
            # by a graceful stop past its timeout, which stops waiting for tasks) stays
            # PERF(http): the cycle's, not ``asyncio.current_task()`` (a Python call, and its
            # running loop's check for a fork is a getpid system call on CPython 3.11)
            task, cycle.task = cycle.task, None
            self.tasks.discard(task)  # type: ignore[arg-type]


class StoppingServerState(ServerState):
    """uvicorn's state shared by a server's connections, plus whether its stop has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False


def waiting_connections(sock: Any) -> list[socket.socket]:
    """The connections in a non-blocking listening socket's backlog, accepted."""
    out: list[socket.socket] = []
    while True:
        try:
            conn, _ = sock.accept()
        except ConnectionAbortedError:  # reset by its client while it waited
            continue
        except OSError:  # BlockingIOError: the backlog is empty
            return out
        out.append(conn)


class QuietExitServer(Server):
    """uvicorn's server, minus raising the stop signal again once it has shut down, and taking
    in what waits in its listening sockets' backlogs before it closes them.

    uvicorn re-raises a caught SIGTERM after its graceful shutdown so that a standalone server
    dies "of" the signal; under gunicorn the default handler is back by then, so every worker
    of every graceful stop or reload died by SIGTERM and the arbiter logged
    ``[ERROR] Worker (pid:N) was sent SIGTERM!``. A worker that finished its shutdown exits 0.

    A connection the kernel has completed waits in its listener's backlog until the worker
    accepts it, and its client has sent its request meanwhile. uvicorn closes the listeners
    at once when it stops, and the kernel resets what waits in a listener closed for good
    (the last worker's copy of gunicorn's socket, or a worker's own one): under 16 clients
    each pushing on a connection of its own, about 9 requests a stop were cut with no answer
    (ConnectionResetError; the fault matrix's SIGTERM row saw it as a ReadError). Here the
    backlogs are emptied right before they close, in the same loop step, and what was in them
    is served, answered with ``Connection: close``.
    """

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.server_state = StoppingServerState()

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        # NOTE(http): uvicorn's list of signals to raise again on leaving capture_signals
        self._captured_signals.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state: StoppingServerState = self.server_state  # type: ignore[assignment]
        state.stopping = True
        waiting: list[socket.socket] = []
        if sockets and len(sockets) == len(self.servers):
            # uvicorn made one server of each socket, in order, serving its descriptor
            for server, sock in zip(self.servers, sockets, strict=True):
                waiting += waiting_connections(sock)
                server.close()  # uvicorn's own close, after this, finds it closed
        if waiting:
            loop = asyncio.get_running_loop()
            config = self.config
            factory = functools.partial(config.http_protocol_class, config=config,
                                        server_state=state, app_state=self.lifespan.state)
            made = await asyncio.gather(*(loop.connect_accepted_socket(factory, conn)
                                          for conn in waiting), return_exceptions=True)
            for conn, outcome in zip(waiting, made, strict=True):
                if isinstance(outcome, BaseException):
                    conn.close()
        await super().shutdown(sockets)


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
        limit_receive_buffers(self.sockets, Config.load().recv_buffer_kb)
        super().init_process()

    async def _serve(self) -> None:
        # uvicorn_worker's own _serve with QuietExitServer in place of uvicorn's Server
        self.config.app = self.wsgi
        server = QuietExitServer(config=self.config)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
