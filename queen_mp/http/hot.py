"""The hot routes served straight from ASGI: push, pop from a queue (or one of its
partitions), ack and ack batch.

PERF(http): falcon's request machinery (its Request and Response objects, the walk of the
middleware hooks, each an awaited coroutine, the body stream, the rendering of the answer)
costs a front worker about 23 us a request on these machines, next to 1 us for a bare ASGI
callable; most requests a broker serves are these five routes. Here they take the same steps
in falcon's order through the same code: falcon's own router on falcon's own path, the
middleware's checks (``Authz.principal``, ``Admission.admit``), the responder's ``answer``, a
failure mapped by ``errors.error_of``, the permits given back, the request counted
(``EdgeMiddleware.account``), and the answer sent with the headers falcon sends, in falcon's
order (tests/fuzz: every request answered both ways compares equal, byte for byte). Below ASGI,
the front's protocol answers most of these requests through ``HotRoutes.respond`` without
uvicorn's request cycle (queen_mp/processes/uvworker.py).

A request this module does not take goes to falcon whole: another method or route, a header
read here (Content-Length, Content-Encoding, Authorization) that repeats, a Content-Length
that is not plain digits, or a query string that is not UTF-8 (falcon's own answers to them
stand), as do HTTP versions falcon refuses (``App.__call__``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import msgspec
import orjson

from queen_mp.auth import ANONYMOUS_ADMIN
from queen_mp.http.ack import MAX_BODY as MAX_ACK_BODY
from queen_mp.http.ack import AckBatchResource, AckResource
from queen_mp.http.admission import ADMITTED_PATHS, Admission, Grant
from queen_mp.http.answer import JSON_UTF8, Answer
from queen_mp.http.authz import Authz
from queen_mp.http.body import read_chunks, read_whole
from queen_mp.http.edge import EdgeMiddleware
from queen_mp.http.errors import error_answer, error_of
from queen_mp.http.pop import PopResource
from queen_mp.http.push import PushResource

__all__ = ["HOT_ROUTES", "HotAnswer", "HotCall", "HotRoutes", "head_lines", "header_lines",
           "rendered"]

PUSH = "/api/v1/push"
ACK = "/api/v1/ack"
ACK_BATCH = "/api/v1/ack/batch"
POP_QUEUE = "/api/v1/pop/queue/{queue}"
POP_PARTITION = "/api/v1/pop/queue/{queue}/partition/{partition:path}"
HOT_ROUTES = frozenset({("POST", PUSH), ("POST", ACK), ("POST", ACK_BATCH),
                        ("GET", POP_QUEUE), ("GET", POP_PARTITION)})

_READ_HEADERS = frozenset({b"content-length", b"content-encoding", b"authorization"})
_BODILESS = frozenset({100, 101, 204, 304})  # falcon's: no Content-Length, no body
_CORS = (b"access-control-allow-origin", b"*")
_JSON_TYPE = (b"content-type", JSON_UTF8.encode())
_EOF = {"type": "http.response.body"}

Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


class HotCall(msgspec.Struct, frozen=True, gc=False):
    """A request this module takes, as far as its scope tells.

    PERF(http): a frozen Struct, built in C (a frozen dataclass's ``__init__`` is a Python
    call and an ``object.__setattr__`` per field: 10k instructions), one per request."""

    method: str
    path: str
    query_string: str
    template: str
    params: dict[str, str]
    content_length: int | None
    encoding: str | None
    authorization: str | None


#: a route another module serves here (``HotRoutes``' ``extra``): the answer to a call, from
#: its body (whole or its chunks) and the caller's tenant, past the middleware's checks
HotAnswer = Callable[[HotCall, bytes | AsyncIterable[bytes], bytes], Awaitable[Answer]]


class _Body:
    """The body's chunks from the ASGI events, as falcon's stream yields them: at most
    Content-Length bytes (the first event's included), until an event says no more body (a
    disconnect says so too). With no ``first`` event, the first chunk is received when the
    body is first read (``gone`` tells whether that first event was a disconnect: falcon
    answers nobody then, but answers a body cut short by a later one)."""

    __slots__ = ("_buffer", "_left", "_receive", "_received", "gone")

    def __init__(self, first: dict[str, Any] | None, receive: Receive,
                 declared: int | None) -> None:
        self._receive = receive
        self._received = first is not None
        self.gone = False
        self._buffer = b""
        self._left = 1 << 63 if declared is None else declared
        if first is not None:
            self._take(first)

    def _take(self, first: dict[str, Any]) -> None:
        chunk: bytes = first.get("body", b"")
        self._buffer = chunk[:self._left] if len(chunk) > self._left else chunk
        self._left -= len(self._buffer)
        if self._left and not first.get("more_body", False):
            self._left = 0

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        if self._buffer:
            chunk, self._buffer = self._buffer, b""
            return chunk
        while self._left > 0:
            event = await self._receive()
            first, self._received = not self._received, True
            chunk = event.get("body", b"")
            if chunk:
                if len(chunk) > self._left:
                    chunk = chunk[:self._left]
                self._left -= len(chunk)
            if not event.get("more_body", False):
                self._left = 0
                self.gone = first and event["type"] == "http.disconnect"
            if chunk:
                return chunk
        raise StopAsyncIteration


def rendered(answer: Answer) -> tuple[int, list[tuple[bytes, bytes]], bytes | None]:
    """The status, headers and body (None for a bodiless status) of an answer as falcon sends
    them: the responder's headers (Content-Type, then the error's own), the middleware's CORS
    header, then Content-Length; a media answer gets its Content-Type when falcon renders it,
    after CORS. Header names are lowercase, as the server writes them."""
    status = answer.status
    if status in _BODILESS:
        return status, [_CORS], None
    if answer.data is not None:
        body = answer.data
        headers = [(b"content-type", answer.content_type.encode("latin1")),
                   *((n.encode("latin1"), v.encode("latin1")) for n, v in answer.headers),
                   _CORS]
    else:
        body = orjson.dumps(answer.media)
        headers = [_CORS, _JSON_TYPE]
    headers.append((b"content-length", str(len(body)).encode()))
    return status, headers, body


#: the header lines of a data answer before its Content-Length, by (content type, headers):
#: at most ``_LINES_KEPT`` kinds (the hot routes answer a handful)
_DATA_LINES: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
_LINES_KEPT = 64


def header_lines(headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """Headers as the lines the server writes: ``name: value`` and CRLF each, the name
    lowercased."""
    return b"".join([b"%s: %s\r\n" % (name.lower(), value) for name, value in headers])


def head_lines(answer: Answer) -> tuple[int, bytes, bytes | None]:
    """``rendered``'s status, headers and body, the headers as the lines the server writes
    (``name: value`` and CRLF each, the name lowercased).

    PERF(http): a data answer's lines up to its Content-Length are made once per kind
    (content type and headers) and kept: the lean path rendered, encoded and lowercased
    every header of every answer: 16.7k instructions a request, 6.2k so (callgrind)."""
    data = answer.data
    if data is None or answer.status in _BODILESS:
        status, headers, body = rendered(answer)
        return status, header_lines(headers), body
    key = (answer.content_type, answer.headers)
    lines = _DATA_LINES.get(key)
    if lines is None:
        lines = header_lines(rendered(answer)[1][:-1])  # all but its Content-Length
        if len(_DATA_LINES) < _LINES_KEPT:
            _DATA_LINES[key] = lines
    return answer.status, lines + b"content-length: %d\r\n" % len(data), data


class HotRoutes:
    """``match`` tells whether a scope is one of HOT_ROUTES (or of ``extra``, the (method,
    route template) of other modules' routes taken here: queen_mp/http/ephemeral.py's) as
    falcon would route it; ``serve`` answers it over ASGI, ``respond`` is that answer."""

    #: ``head_lines`` and ``header_lines``, for the front's protocol, which answers below ASGI
    #: (queen_mp/processes/uvworker.py) and does not import this module (it loads psycopg)
    head_lines = staticmethod(head_lines)
    header_lines = staticmethod(header_lines)
    #: none unless given (a class default too: tests build the class without ``__init__``)
    extra: Mapping[tuple[str, str], HotAnswer] = MappingProxyType({})

    def __init__(self, find: Callable[[str], Any], strip_trailing_slash: bool,
                 edge: EdgeMiddleware, authz: Authz, admission: Admission, push: PushResource,
                 pop: PopResource, ack: AckResource, ack_batch: AckBatchResource,
                 extra: Mapping[tuple[str, str], HotAnswer] | None = None) -> None:
        self._find = find
        self._strip = strip_trailing_slash
        self.edge = edge
        self.authz = authz
        self.admission = admission
        self.push = push
        self.pop = pop
        self.acks = {ACK: ack, ACK_BATCH: ack_batch}
        self.extra = dict(extra or {})
        #: by method, the router's answer for each path of a hot route with no path
        #: parameters (push, ack, ack batch), found once: PERF(http): falcon's compiled router
        #: walks its generated matcher for every route, 28k instructions a request
        #: (callgrind), while such a path always routes the same (a template without fields
        #: matches only itself)
        self._static: dict[str, dict[str, tuple[Any, Any, dict[str, str], str]]] = {
            "POST": {}, "GET": {}}

    def match(self, scope: dict[str, Any]) -> HotCall | None:
        return self.match_head(scope["method"], scope["path"], scope["headers"],
                               scope["query_string"])

    def match_head(self, method: str, path: str, headers: Sequence[tuple[bytes, bytes]],
                   raw_query: bytes) -> HotCall | None:
        """``match`` of a request's parts as its scope would hold them (the front's lean
        path has no scope)."""
        path = path or "/"
        if self._strip and len(path) != 1 and path.endswith("/"):
            path = path[:-1]  # as falcon's Request does
        # PERF(http): a hot route's static path by method, found and checked once (9.9k
        # instructions a match, 6.6k so, with the headers' single pass below: callgrind)
        found = self._static[method].get(path) if method in self._static else None
        if found is None:
            if method != "POST" and method != "GET":
                return None
            found = self._find(path)
            if found is None:
                return None
            template = found[3]
            if (method, template) not in HOT_ROUTES and (method, template) not in self.extra:
                return None
            if not found[2]:
                self._static[method][path] = found
        length = encoding = authorization = None
        for name, value in headers:
            if name in _READ_HEADERS:
                if name == b"content-length":
                    if length is not None or not (value.isdigit() and value.isascii()):
                        return None  # a repeat falcon joins or overrides, or falcon's 400
                    length = int(value)
                elif name == b"content-encoding":
                    if encoding is not None:
                        return None
                    encoding = value.decode("latin1")
                elif authorization is not None:
                    return None
                else:
                    authorization = value.decode("latin1")
        try:
            query_string = raw_query.decode()
        except UnicodeDecodeError:
            return None  # falcon's Request raises it: let it
        return HotCall(method, path, query_string, found[3], found[2], length, encoding,
                       authorization)

    async def serve(self, call: HotCall, receive: Receive, send: Send) -> None:
        if call.method == "POST" and call.path in ADMITTED_PATHS:
            # NOTE(memory): the body is first received once admitted (falcon's App awaits
            # the first event before its middleware): a receive resumes reading the
            # connection, so a push waiting for permits held its first chunk and a second
            # one (about 120 KB and 90 KB of a 1,000-item JSON push; at 64 connections,
            # 1.6-4 MB fewer live body bytes in a front worker, tracemalloc).
            reader = _Body(None, receive, call.content_length)
            answer = await self.respond(call, reader)
            if reader.gone:
                return  # as falcon: nobody to answer
        else:
            first = await receive()
            if first["type"] == "http.disconnect":
                return  # as falcon: nobody to answer
            reader = _Body(first, receive, call.content_length)
            del first  # the reader holds its chunk until it is read
            answer = await self.respond(call, reader)
        status, headers, body = rendered(answer)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(_EOF if body is None else {"type": "http.response.body", "body": body})

    async def respond(self, call: HotCall, body: bytes | AsyncIterable[bytes]) -> Answer:
        """The answer to ``call``, counted, its body whole (the front's lean path,
        queen_mp/processes/uvworker.py) or its chunks as they come (``serve``)."""
        started = time.perf_counter()
        grant: Grant | None = None
        try:
            try:
                principal = (ANONYMOUS_ADMIN if self.authz.verifier is None else
                             self.authz.principal(call.method, call.path, call.template,
                                                  call.authorization))
                if call.method == "POST" and call.path in ADMITTED_PATHS:
                    admitted = self.admission.admit_now(call.path, call.content_length)
                    grant = (await self.admission.admit(call.path, call.content_length)
                             if admitted is False else admitted)  # type: ignore[assignment]
                answer = await self._answer(call, body, principal.tenant, principal.sub, grant)
            except Exception as ex:
                answer = error_answer(error_of(ex, call.method, call.path))
        finally:
            if grant is not None:
                grant.release()
        self.edge.account(call.template, answer.status, started)
        return answer

    def _answer(self, call: HotCall, body: bytes | AsyncIterable[bytes], tenant: bytes,
                sub: str | None, grant: Grant | None) -> Awaitable[Answer]:
        """The awaitable of ``call``'s answer.

        PERF(http): not a coroutine itself, and a body read whole is checked and decoded by a
        plain call (``read_whole``): the caller awaits the responder's own coroutine, two
        coroutines fewer a request."""
        other = self.extra.get((call.method, call.template)) if self.extra else None
        if other is not None:
            return other(call, body, tenant)
        if call.method == "GET":
            return self.pop.answer(call.query_string, tenant, call.params["queue"],
                                   call.params.get("partition"))
        if type(body) is not bytes:
            return self._answer_read(call, body, tenant, sub, grant)  # type: ignore[arg-type]
        # NOTE(memory): the body read goes straight into the answer (no local here), which
        # drops a push's once parsed: a local would keep it until every verdict is in. A body
        # the lean path read whole (up to uvworker.LEAN_MAX_BODY) stays with its caller.
        limit = self._body_limit(call)
        if call.path == PUSH:
            return self.push.answer(read_whole(call.content_length, body, call.encoding, limit),
                                    tenant, sub, grant)
        return self.acks[call.path].answer(
            read_whole(call.content_length, body, call.encoding, limit), tenant)

    async def _answer_read(self, call: HotCall, chunks: AsyncIterable[bytes], tenant: bytes,
                           sub: str | None, grant: Grant | None) -> Answer:
        """``_answer`` of a body that comes in chunks (``serve``): joined first, as they
        came (``_answer`` decodes it)."""
        return await self._answer(
            call, await read_chunks(call.content_length, chunks, self._body_limit(call)),
            tenant, sub, grant)

    def _body_limit(self, call: HotCall) -> int:
        """The most body bytes ``call`` may send: a push's configured bound, an ack's own."""
        return self.push.worker.config.max_body_mb << 20 if call.path == PUSH else MAX_ACK_BODY
