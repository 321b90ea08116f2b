"""Fuzz targets: plain functions of ``bytes``, for hypothesis and for the long-run driver.

Two kinds:

- **parser targets** (``json_push``, ``qpb1_push``, ``transaction``, ``kv_ops``, ``timer_ops``,
  ``ack_body``, ``lease_body``, ``query_string``, ``gzip_body``, ``zstd_body``, ``lock_ops``,
  ``trace_body``, ``fetch_body``, ``changed_body``, ``streams_register``, ``streams_state``,
  ``streams_cycle``, ``eph_push``, ``eph_ack``, ``eph_configure``): the bytes go
  to one parser, which may accept them or refuse with an ``ApiError`` / ``RequestError`` /
  ``WireError`` of a 4xx status. Anything else escaping (``UnicodeEncodeError``,
  ``RecursionError``, ``TypeError``...) is the bug the target exists to find: the broker would
  answer it ``500``.
- **the app target** (``http_request``): the bytes are one raw HTTP/1.1 request. h11 reads it
  as uvicorn would, and the falcon app of a front worker answers it in-process, with fake
  backends (``FakeWorker``): a request that passes every check reaches a fake connection, which
  adapts the statement's parameters as psycopg would (NUL in text, JSON dumps, NUL in jsonb)
  and answers ``418 reached_backend``. Every answer must be a 2xx, that 418, or a 4xx with a
  JSON body carrying ``code``; nothing may escape the app, hang, or keep admission bytes.

``send_raw`` sends the same raw requests to a real broker (``test_fuzz_broker.py``).

Long run without hypothesis (random mutations of the seeds, for a while)::

    python -m tests.fuzz.targets --seconds 600 [--target json_push ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import logging
import os
import random
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import h11
import orjson
import psycopg
import psycopg.errors
import zstandard
from psycopg.types.json import Json
from queen.http import push_binary as client

from queen_mp.config import Config
from queen_mp.front.transactions import Transactions
from queen_mp.http import ack as ack_http
from queen_mp.http import kv as kv_http
from queen_mp.http import leases as leases_http
from queen_mp.http import locks as locks_http
from queen_mp.http.admission import Admission
from queen_mp.http.body import read_body
from queen_mp.http.errors import ApiError, from_request, from_wire
from queen_mp.http.push import parse_binary, parse_json_push
from queen_mp.http.query import Query
from queen_mp.models import ephemeral as eph_model
from queen_mp.models.errors import RequestError
from queen_mp.models.items import loads_json, parse_ack_item
from queen_mp.models.kv import parse_kv_ops
from queen_mp.models.locks import parse_lock_ops
from queen_mp.models.reads import parse_changed, parse_fetch
from queen_mp.models.streams import parse_cycle, parse_register, parse_state_get
from queen_mp.models.timers import mint, parse_timer_ops
from queen_mp.models.traces import parse_trace
from queen_mp.models.transactions import parse_json, parse_qtb1
from queen_mp.wire.errors import WireError

__all__ = [
    "BODY_ROUTES",
    "LIMIT",
    "PARSER_TARGETS",
    "SEEDS",
    "SYSTEM_ROUTES",
    "Answer",
    "FakeWorker",
    "Reached",
    "check_answer",
    "examples",
    "http_request",
    "main",
    "mutate",
    "request_bytes",
    "send_raw",
    "serve",
]

# In-process limits: small, so that a bomb costs milliseconds (the broker keeps its defaults).
LIMIT = 1 << 20
REFUSED = (ApiError, RequestError, WireError)


def examples(default: int) -> int:
    """Examples per hypothesis test: ``QUEEN_FUZZ_EXAMPLES`` when set, else ``default``."""
    raw = os.environ.get("QUEEN_FUZZ_EXAMPLES", "")
    return int(raw) if raw.strip() else default


def _refusal(ex: BaseException) -> ApiError:
    """A parser's refusal, checked: a 4xx with a renderable body."""
    err = from_wire(ex) if isinstance(ex, WireError) else from_request(ex)  # type: ignore[arg-type]
    assert 400 <= err.status < 500, f"{type(ex).__name__} -> {err.status}: {ex}"
    body = orjson.loads(orjson.dumps(err.to_dict()))
    assert isinstance(body.get("code"), str) and body["code"], body
    return err


def _refused(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except REFUSED as ex:
        _refusal(ex)
        return None


# ------------------------------------------------------------------------- parser targets
def json_push(data: bytes) -> None:
    items = _refused(lambda: parse_json_push(data))
    for it in items or ():
        assert isinstance(it.frame, bytes | bytearray | memoryview)


def qpb1_push(data: bytes) -> None:
    _refused(lambda: parse_binary(data, LIMIT))


def _plan(data: bytes) -> Any:
    if data[:4] == b"QTB1":
        return parse_qtb1(data, LIMIT)
    return parse_json(data)


def transaction(data: bytes) -> None:
    """A transaction body (JSON or QTB1); the accepted plan must serialise as txn_procs does."""
    plan = _refused(lambda: _plan(data))
    if plan is not None:
        orjson.dumps(plan.kv)
        orjson.dumps(plan.timers)


def kv_ops(data: bytes) -> None:
    ops = _refused(lambda: parse_kv_ops(kv_http._operations(data), in_transaction=False))
    if ops is not None:
        orjson.dumps(ops)  # what kv_procs.apply sends


def lock_ops(data: bytes) -> None:
    ops = _refused(lambda: parse_lock_ops(locks_http._operations(data)))
    if ops is not None:
        orjson.dumps(ops)  # what lock_procs.apply sends


def trace_body(data: bytes) -> None:
    try:
        doc = loads_json(data)
    except ValueError:
        return  # the route refuses it (400 invalid_request) before the model
    event = _refused(lambda: parse_trace(doc))
    if event is not None:
        adapt([event.transaction_id, event.consumer_group, event.event_type, event.data_json,
               list(event.names)])


def timer_ops(data: bytes) -> None:
    def parse() -> list[dict[str, Any]]:
        doc = orjson.loads(data)
        if not isinstance(doc, dict):
            return []
        return mint(parse_timer_ops(doc.get("operations"), max_decompressed=LIMIT))

    try:
        ops = _refused(parse)
    except orjson.JSONDecodeError:
        return  # the route refuses it before the op parser (TimerInvalidRequest)
    if ops:
        orjson.dumps(ops)


def ack_body(data: bytes) -> None:
    """Both ack routes' body rules (single object, or ``acknowledgments`` of a batch)."""
    def parse() -> None:
        doc = ack_http._load(data)
        if isinstance(doc, dict) and isinstance(doc.get("acknowledgments"), list):
            group = doc.get("consumerGroup")
            for i, a in enumerate(doc["acknowledgments"]):
                parse_ack_item(a, i, group if isinstance(group, str) else None)
        else:
            parse_ack_item(doc, 0, None)

    _refused(parse)


def lease_body(data: bytes) -> None:
    _refused(lambda: leases_http._seconds(data))


def fetch_body(data: bytes) -> None:
    """``POST /api/v1/fetch`` bodies (api.md 2.15): checked whole, every value typed."""
    plan = _refused(lambda: parse_fetch(data))
    if plan is not None:
        for e in plan.entries:
            adapt([e.queue, e.partition, e.offset, e.max_bytes])


def changed_body(data: bytes) -> None:
    """``POST /api/v1/partitions/changed`` bodies (api.md 2.15)."""
    entries = _refused(lambda: parse_changed(data))
    if entries is not None:
        for e in entries:
            adapt([e.queue, e.limit, e.after])


def _eph(parse: Callable[[Any], Any], data: bytes) -> Any:
    """An ephemeral body: malformed JSON is the route's 400, the rest the model's."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return _refused(lambda: parse(doc))


def eph_push(data: bytes) -> None:
    push = _eph(eph_model.parse_push, data)
    if push is not None:
        for text in push.payloads:
            orjson.loads(text)  # stored as JSON text and sent back as is


def eph_ack(data: bytes) -> None:
    ack = _eph(eph_model.parse_ack, data)
    if ack is not None:
        # ephemeral_procs.ack sends them comma-separated: one element each, one per id
        lists = (ack.epochs, ack.seqs, ack.deliveries, ack.statuses)
        assert all(len(x) == len(ack.ids) and "," not in "".join(x)
                   for x in lists)


def eph_configure(data: bytes) -> None:
    spec = _eph(eph_model.parse_configure, data)
    if spec is not None:
        orjson.dumps(spec.options)  # what ephemeral_procs.configure sends


def query_string(data: bytes) -> None:
    """Every typed read of api.md 1.1 on an arbitrary (ASCII, as h11 admits) query string."""
    q = Query(data.decode("latin-1").encode("ascii", "replace").decode())
    names = ["batch", "wait", "timeout", "from", "limit", "x", ""]
    for name in names:
        _refused(lambda n=name: q.flag(n, False))
        _refused(lambda n=name: q.integer(n, 1, minimum=1, maximum=10_000))
        _refused(lambda n=name: q.time(n))
        q.text(name)


class _BodyReq:
    """Enough of ``falcon.asgi.Request`` for ``read_body``."""

    def __init__(self, body: bytes, encoding: str | None, declared: int | None,
                 chunk: int = 1 << 16) -> None:
        self._body, self._encoding, self.content_length = body, encoding, declared
        self._chunk = chunk

    def get_header(self, name: str) -> str | None:
        return self._encoding if name.lower() == "content-encoding" else None

    @property
    def stream(self) -> Any:
        async def gen() -> Any:
            for at in range(0, len(self._body), self._chunk):
                yield self._body[at: at + self._chunk]
        return gen()


def _read_body(data: bytes, encoding: str, limit: int = LIMIT) -> bytes | None:
    req = _BodyReq(data, encoding, len(data))
    try:
        out = _loop().run_until_complete(read_body(req, limit))  # type: ignore[arg-type]
    except REFUSED as ex:
        _refusal(ex)
        return None
    assert len(out) <= limit, f"decoded {len(out)} bytes over the {limit} limit"
    return out


def gzip_body(data: bytes) -> None:
    _read_body(data, "gzip")


def zstd_body(data: bytes) -> None:
    _read_body(data, "zstd")


def streams_register(data: bytes) -> None:
    _refused(lambda: parse_register(data))


def streams_state(data: bytes) -> None:
    _refused(lambda: parse_state_get(data))


def streams_cycle(data: bytes) -> None:
    """A cycle body; an accepted one's state ops must be storable JSON text (jsonb)."""
    req = _refused(lambda: parse_cycle(data))
    if req is not None:
        adapt(req.state_ops_json)


PARSER_TARGETS: dict[str, Callable[[bytes], None]] = {
    "json_push": json_push, "qpb1_push": qpb1_push, "transaction": transaction,
    "kv_ops": kv_ops, "timer_ops": timer_ops, "ack_body": ack_body, "lease_body": lease_body,
    "query_string": query_string, "gzip_body": gzip_body, "zstd_body": zstd_body,
    "lock_ops": lock_ops, "trace_body": trace_body,
    "fetch_body": fetch_body, "changed_body": changed_body,
    "streams_register": streams_register, "streams_state": streams_state,
    "streams_cycle": streams_cycle,
    "eph_push": eph_push, "eph_ack": eph_ack, "eph_configure": eph_configure,
}


# ------------------------------------------------------------------------- raw HTTP requests
def request_bytes(method: str, target: str | bytes, body: bytes = b"", *,
                  headers: list[tuple[str, str | bytes]] | None = None,
                  content_length: int | bool | None = True) -> bytes:
    """One HTTP/1.1 request. ``content_length``: True = the body's length, an int = that
    (a lie), False/None = no header (add your own, e.g. Transfer-Encoding)."""
    if isinstance(target, str):
        target = target.encode("latin-1")
    lines = [method.encode("latin-1") + b" " + target + b" HTTP/1.1", b"Host: fuzz"]
    for name, value in headers or []:
        raw = value if isinstance(value, bytes) else value.encode("latin-1")
        lines.append(name.encode("latin-1") + b": " + raw)
    if content_length is True:
        lines.append(b"Content-Length: %d" % len(body))
    elif isinstance(content_length, int) and content_length is not False:
        lines.append(b"Content-Length: %d" % content_length)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    # "app"; "http" when the HTTP parser refused it (uvicorn's 400); "gone" when the client
    # left mid-request and nobody was answered
    layer: str = "app"
    complete: bool = True  # the whole declared body arrived
    method: str = ""

    def json(self) -> Any:
        return orjson.loads(self.body)


def check_answer(answer: Answer, *, allow_reached: bool = True) -> None:
    """2xx, ``418 reached_backend`` (in-process) or a 4xx JSON error with ``code``."""
    if answer.layer == "http":
        assert 400 <= answer.status < 500, answer
        return
    if answer.layer == "gone":
        return
    if not answer.complete:
        assert answer.status != 418, "a body cut short by a disconnect was used as complete"
    s = answer.status
    if 200 <= s < 300:
        return
    assert 400 <= s < 500, f"status {s}: {answer.body[:2000]!r}"
    if answer.method == "HEAD":  # an answer to HEAD has no body
        return
    try:
        body = answer.json()
    except orjson.JSONDecodeError:
        raise AssertionError(f"{s} without a JSON body: {answer.body[:500]!r}") from None
    assert isinstance(body, dict) and isinstance(body.get("code"), str), body
    assert "error" in body, body
    if s == 418:
        assert allow_reached and body["code"] == "reached_backend", body


# ------------------------------------------------------------------------- fake backends
class Reached(ApiError):
    """The request passed every check and reached a (fake) backend."""

    status = 418
    code = "reached_backend"


def _json_strings(value: Any) -> Iterator[str]:
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list | tuple):
            todo.extend(v)


def _jsonb(text: str) -> None:
    """PostgreSQL's jsonb input: no \\u0000 in a string (22P05)."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return
    if any("\x00" in s for s in _json_strings(doc)):
        raise psycopg.errors.UntranslatableCharacter("unsupported Unicode escape sequence")


def adapt(value: Any) -> None:
    """What psycopg and PostgreSQL do with a parameter before the statement runs."""
    if isinstance(value, Json):  # Json and Jsonb
        text = (value.dumps or (lambda o: orjson.dumps(o).decode()))(value.obj)
        adapt(text)
        _jsonb(text)
    elif isinstance(value, str):
        value.encode("utf-8")  # a lone surrogate fails here, as in psycopg's dumper
        if "\x00" in value:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        if value[:1] in ("{", "["):
            _jsonb(value)
    elif isinstance(value, list | tuple):
        for v in value:
            adapt(v)
    elif isinstance(value, dict):
        for v in value.values():
            adapt(v)
    elif isinstance(value, int) and not -(1 << 63) <= value < 1 << 63:
        # NOTE(fuzz): every integer parameter of our procedures is at most int8
        raise psycopg.errors.NumericValueOutOfRange("bigint out of range")


class _AsyncNull:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


class FakeConn:
    def transaction(self, *args: Any, **kwargs: Any) -> Any:
        return _AsyncNull()

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        adapt(params)
        raise Reached(f"statement reached: {str(query)[:80]}")

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return _FakeCursor()

    def __getattr__(self, name: str) -> Any:
        raise Reached(f"connection.{name} reached")


class _FakeCursor(_AsyncNull):
    async def __aenter__(self) -> Any:
        return self

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        adapt(params)
        raise Reached(f"statement reached: {str(query)[:80]}")

    def __getattr__(self, name: str) -> Any:
        raise Reached(f"cursor.{name} reached")


class FakePool:
    @contextlib.asynccontextmanager
    async def connection(self, *args: Any, **kwargs: Any) -> Any:
        yield FakeConn()

    def __getattr__(self, name: str) -> Any:
        raise Reached(f"pool.{name} reached")


class FakeIngest:
    async def encrypt(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def push(self, items: Any, *args: Any, **kwargs: Any) -> Any:
        for it in items:
            assert isinstance(it.queue, str) and isinstance(it.partition, str)
            it.queue.encode("utf-8")
            it.partition.encode("utf-8")
            it.transaction_id.encode("utf-8")
        raise Reached("ingest.push reached")

    def __getattr__(self, name: str) -> Any:
        raise Reached(f"ingest.{name} reached")


class FakeWorker:
    """A front worker whose every backend is a fake (module docstring)."""

    def __init__(self, config: Config) -> None:
        from queen_mp.front.acks import Acker

        self.config = config
        self.metrics = None
        self.cipher = None
        self.slot = 0
        self.pool = FakePool()
        self.ingest = FakeIngest()
        self.acker = Acker(self.pool, config.max_decompressed_mb << 20)  # type: ignore[arg-type]
        self.transactions = Transactions(self.pool, self.ingest,  # type: ignore[arg-type]
                                         config.max_decompressed_mb << 20)

    def push_maintenance(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise Reached(f"worker.{name} reached")


_LOOP: asyncio.AbstractEventLoop | None = None
_APP: Any = None
_ADMISSION: Admission | None = None


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    return _LOOP


def inprocess_app() -> Any:
    """The falcon app over a ``FakeWorker`` (made once per process)."""
    global _APP, _ADMISSION
    if _APP is None:
        from queen_mp.http.app import create_app

        data = tempfile.mkdtemp(prefix="queen-fuzz-")
        config = Config.load(env={"QUEEN_DATA_DIR": data, "QUEEN_MAX_BODY_MB": "1",
                                  "QUEEN_MAX_DECOMPRESSED_MB": "1",
                                  "QUEEN_DISK_HIGH_PCT": "100", "QUEEN_ADMIT_HOLD_MS": "0"})
        _APP = create_app(config, None, FakeWorker(config))  # type: ignore[arg-type]
        for mw in _APP._unprepared_middleware:
            if isinstance(mw, Admission):
                _ADMISSION = mw
    return _APP


def _parse_request(raw: bytes) -> tuple[h11.Request | None, list[bytes], bool, Answer | None]:
    """(request, body chunks, complete, refusal) as uvicorn's h11 protocol would see them."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
    try:
        conn.receive_data(raw)
        request: h11.Request | None = None
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                return request, chunks, False, None
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return request, chunks, True, None
            else:
                return request, chunks, False, None
    except h11.RemoteProtocolError as ex:  # uvicorn answers 400 to all of them
        return None, [], False, Answer(400, body=str(ex).encode(), layer="http")


async def _exchange(app: Any, scope: dict[str, Any], chunks: list[bytes],
                    complete: bool) -> list[dict[str, Any]]:
    """What the app sends for the request, its body in ``chunks`` (then the end of the body,
    or the client gone when not ``complete``)."""
    events = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    if complete:
        events.append({"type": "http.request", "body": b"", "more_body": False})
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if events:
            return events.pop(0)
        if not complete:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)  # uvicorn waits for the disconnect that never comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=20)
    return sent


async def _call(app: Any, request: h11.Request, chunks: list[bytes], complete: bool) -> Answer:
    raw_path, _, qs = request.target.partition(b"?")
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.http_version.decode("ascii"), "server": ("127.0.0.1", 6632),
        "client": ("127.0.0.1", 40000), "scheme": "http",
        "method": request.method.decode("ascii"), "root_path": "",
        "path": unquote(raw_path.decode("ascii")), "raw_path": raw_path, "query_string": qs,
        "headers": [(k.lower(), v) for k, v in request.headers],
    }
    sent = await _exchange(app, scope, chunks, complete)
    if scope["type"] == "http" and app.hot.match(scope) is not None:
        # NOTE(fuzz): a hot route (queen_mp/http/hot.py) must answer what falcon answers,
        # byte for byte: the same request once more through falcon's machinery.
        hot, app.hot = app.hot, None
        try:
            assert await _exchange(app, scope, chunks, complete) == sent, "hot != falcon"
        finally:
            app.hot = hot
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    if start is None:  # falcon answers nobody once the client has gone
        assert not complete, "a complete request got no answer"
        return Answer(0, layer="gone")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answer(start["status"], headers, body)


def serve(raw: bytes) -> Answer | None:
    """Answer one raw request in-process (None: h11 still waits for the request head)."""
    request, chunks, complete, refusal = _parse_request(raw)
    if refusal is not None:
        return refusal
    if request is None:
        return None
    app = inprocess_app()
    answer = _loop().run_until_complete(_call(app, request, chunks, complete))
    answer.complete, answer.method = complete, request.method.decode("ascii")
    assert _ADMISSION is not None and _ADMISSION.budget.in_use == 0, "admission bytes kept"
    return answer


def http_request(raw: bytes) -> Answer | None:
    """The app target: the answer to one raw request, checked."""
    answer = serve(raw)
    if answer is not None:
        check_answer(answer)
    return answer


# ------------------------------------------------------------------------- a real broker
def _read_answer(sock: socket.socket, deadline: float, method: str) -> Answer | None:
    conn = h11.Connection(h11.CLIENT)
    # what we sent, so that h11 expects the right answer (HEAD: no body)
    conn.send(h11.Request(method=method, target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    status, headers, body = 0, {}, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(1 << 16)
            except (TimeoutError, ConnectionResetError):
                data = b""
            conn.receive_data(data)
            if not data and status == 0:
                return None
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    return Answer(status, headers, bytes(body), method=method)


def send_raw(port: int, raw: bytes, *, timeout: float = 30.0, half_close: bool = False,
             host: str = "127.0.0.1") -> Answer | None:
    """Send raw bytes on a fresh connection; the first answer (None: closed unanswered).

    ``half_close`` shuts our side for writing after the bytes (a client gone mid-body). An
    answer that is not JSON from the server's HTTP parser is marked ``layer="http"``.
    """
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        method = "HEAD" if raw.startswith(b"HEAD ") else "GET"
        try:
            answer = _read_answer(sock, deadline, method)
        except h11.RemoteProtocolError:
            return None
    if answer is not None and answer.headers.get("content-type", "").startswith("text/plain") \
            and answer.status == 400:
        answer.layer = "http"  # uvicorn's "Invalid HTTP request received."
    return answer


# ------------------------------------------------------------------------- seeds
def _qpb1_seeds() -> list[bytes]:
    items = [{"queue": "fz", "partition": "p", "payload": {"k": [1, 2]}, "transactionId": "t1"},
             {"queue": "fz", "partition": "p/2", "payload": "x", "transactionId": ""},
             {"queue": "fz2", "partition": "", "payload": None, "transactionId": "t3"}]
    batches = [client.PushBatch("fz", "p", [b'{"k":[1,2]}', b"3"], ["t1", ""])]
    return [client.binary_push_body(items, False) or b"",
            client.binary_push_body(items, True) or b"",
            client.encode_push_binary(batches, compress=True),
            client.encode_push_binary(batches, counts=True)]


def _qtb1_seeds() -> list[bytes]:
    out = []
    for request in (
        {"operations": [{"type": "push", "items": [{"queue": "fz", "payload": {"a": 1}},
                                                  {"queue": "fz", "partition": "p",
                                                   "transactionId": "x", "payload": [1]}]},
                        {"type": "ack", "transactionId": "t", "partitionId": "1"}]},
        {"operations": [{"type": "push", "queue": "fz", "payload": 1}],
         "kv": [{"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True}]},
    ):
        body = client.transaction_frames(request)
        if body is not None:
            out.append(body[0])
    return out


_JSON_PUSH = [
    b'{"items":[{"queue":"fz","partition":"p","transactionId":"t-1","payload":{"total":30}}]}',
    b'{"items":[{"queue":"fz","payload":[1,2,3],"traceId":"0196f3a2-c000-7000-8000-000000000a0a"'
    b'},{"queue":"fz.a.b","partition":"x/y","data":"d"}]}',
    b'{"items":[]}',
    b'{"items":[{"queue":"fz","payload":12345678901234567890123}]}',
]
_TXN = [
    b'{"operations":[{"type":"push","items":[{"queue":"fz","payload":{"a":1}}]},'
    b'{"type":"ack","transactionId":"t","partitionId":"1","leaseId":null}],'
    b'"requiredLeases":[],"kv":[{"op":"put","ns":"n","key":"k","value":{"v":1},'
    b'"forever":true}],"timers":[{"op":"schedule","queue":"fz","timerKey":"tk",'
    b'"payload":"eyJhIjoxfQ==","delayMs":2592000000}]}',
    b'{"operations":[{"type":"push","queue":"fz","partition":"p","transactionId":"x",'
    b'"payload":1}]}',
    b'{"kv":[{"op":"incr","ns":"n","key":"c","delta":2,"min":0,"max":9,"forever":true}]}',
]
_KV = [
    b'{"operations":[{"op":"put","ns":"n","key":"k","value":{"a":[1,2]},"forever":true},'
    b'{"op":"get","ns":"n","key":"k"},{"op":"getMany","ns":"n","keys":["a","b"]},'
    b'{"op":"getPrefix","ns":"n","prefix":"k","after":"a","limit":10,"keysOnly":true},'
    b'{"op":"delete","ns":"n","key":"k","expect":3},{"op":"check","ns":"n","key":"k",'
    b'"expect":0},{"op":"incr","ns":"n","key":"c","delta":1,"forever":true},'
    b'{"op":"putIfAbsent","ns":"n","key":"z","value":null,"forever":true,"required":true}]}',
]
_LOCKS = [
    b'{"operations":[{"op":"acquire","name":"job","ttlSeconds":30,"owner":"w-1","limit":3},'
    b'{"op":"renew","name":"r","token":7,"ttlSeconds":30,"slot":1,"owner":"w-1"},'
    b'{"op":"release","name":"x","token":9},{"op":"get","name":"g/1"}]}',
]
_TRACE = [
    b'{"transactionId":"order-1","partitionId":"17","consumerGroup":"__QUEUE_MODE__",'
    b'"traceNames":["flow","a/b"],"eventType":"step","data":{"k":[1,{"x":null}]}}',
    b'{"transactionId":"t","partitionId":17,"consumerGroup":null,"traceNames":"one",'
    b'"data":{}}',
]
_TIMERS = [
    b'{"operations":[{"op":"schedule","queue":"fz","timerKey":"a/b","partition":"p",'
    b'"payload":"eyJhIjoxfQ==","delayMs":2592000000,"txn":"t"},'
    b'{"op":"reschedule","queue":"fz","timerKey":"a","payload":"","delayMs":2592000000},'
    b'{"op":"cancel","queue":"fz","timerKey":"c"}]}',
    b'{"operations":[{"op":"schedule","queue":"fz","timerKey":"z","payloadZstd":true,'
    b'"payload":"KLUv/SAHOQAAeyJhIjoxfQ==","delayMs":2592000000}]}',
]
_ACK = [
    b'{"transactionId":"t","partitionId":"17","status":"failed","consumerGroup":"g",'
    b'"leaseId":"0196f3a2-c000-7000-8000-000000000a0a","error":{"why":"boom"}}',
    b'{"acknowledgments":[{"transactionId":"t","partitionId":17,"status":"success"},'
    b'{"transactionId":"u","partitionId":"18","status":"dlq","leaseId":"x"}],'
    b'"consumerGroup":"g"}',
]
_STREAMS_REGISTER = [
    b'{"name":"fz.q","source_queue":"fz","sink_queue":"fz.out","config_hash":"ab12",'
    b'"reset":false}',
]
_STREAMS_STATE = [
    b'{"query_id":"0196f3a2-c000-7000-8000-000000000a0a","partition_id":"17","keys":["a"],'
    b'"key_prefix":"tumb:1\\u001f","ripe_at_or_before":1717000000000}',
]
_STREAMS_CYCLE = [
    b'{"query_id":"0196f3a2-c000-7000-8000-000000000a0a","partition_id":"17",'
    b'"consumer_group":"streams.fz","state_ops":[{"type":"upsert","key":"k","value":{"acc":1,'
    b'"windowEnd":1000}},{"type":"delete","key":"j"}],"push_items":[{"queue":"fz.out",'
    b'"partition":"p","payload":{"count":2}}],"ack":{"transactionId":"t","leaseId":'
    b'"0196f3a2-c000-7000-8000-000000000a0b","status":"completed","count":2},'
    b'"release_lease":false}',
    b'{"query_id":"0196f3a2-c000-7000-8000-000000000a0a","partition_id":17,"ack":null,'
    b'"state_ops":[{"type":"delete","key":"w"}],"push_items":[]}',
]
_LEASE = [b"", b"{}", b'{"seconds":30}']
_GROUPS = [b'{"toBeginning":true}', b'{"toEnd":true}', b'{"timestamp":"2026-05-16T08:41:27.123Z"}',
           b'{"subscriptionTimestamp":"2026-05-16T08:41:27.123Z","queue":"fz"}']
_SYSTEM = [b'{"enabled":true}', b'{"enabled":false}', b"{}", b""]
_CONFIGURE = [
    b'{"queue":"fz","namespace":"ns","task":"t","options":{"leaseTime":30,"retryLimit":2,'
    b'"deadLetterQueue":true,"dedup_window":60,"priority":-3,"maxSize":0,"unknown":1}}',
]
_FETCH = [
    b'{"entries":[{"queue":"fz","partition":"p","offset":0,"maxBytes":1048576},'
    b'{"queue":"fz","partition":3,"offset":17},{"queue":"fz.a","offset":1}],"maxBytes":8388608}',
    b'{"entries":[]}',
]
_CHANGED = [
    b'{"entries":[{"queue":"fz","limit":1000,"since":"2026-05-16T08:41:27.123Z","after":"17"},'
    b'{"queue":"fz.a"},{"queue":"fz","limit":2,"after":null,"since":null}]}',
    b'{"entries":[]}',
]
_EPH_PUSH = [b'{"queue":"fz","partition":"p/1","messages":[{"payload":{"a":[1,2.5,null]}},'
             b'{"payload":"x"},{"payload":null}]}', b'{"queue":"fz","messages":[]}']
_EPH_ACK = [b'{"queue":"fz","group":"g","acks":[{"id":"0123456789abcdef-1-1","status":"retry",'
            b'"error":"e"},{"id":"x"}]}']
_EPH_RESET = [b'{"queue":"fz"}', b'{"queue":"fz/x","extra":[1]}', b"{}"]
_EPH_CONFIGURE = [b'{"queue":"fz","options":{"maxBytes":1024,"maxLength":10,"policy":"dropOldest",'
                  b'"ttlSeconds":5,"leaseSeconds":2,"retryLimit":1,'
                  b'"windowBuffer":{"ms":10,"count":2}}}']
_QUERY = [b"batch=10&wait=true&timeout=100&consumerGroup=g&autoAck=1&partitions=2",
          b"subscriptionMode=new&subscriptionFrom=2026-05-16T08:41:27.123Z&frames=true",
          b"queue=fz&from=2026-01-01T00:00:00Z&to=now&limit=5&offset=1"]


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1)


def _zs(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(data)


SEEDS: dict[str, list[bytes]] = {
    "json_push": _JSON_PUSH,
    "qpb1_push": _qpb1_seeds(),
    "transaction": _TXN + _qtb1_seeds(),
    "kv_ops": _KV,
    "lock_ops": _LOCKS,
    "trace_body": _TRACE,
    "timer_ops": _TIMERS,
    "ack_body": _ACK,
    "lease_body": _LEASE,
    "streams_register": _STREAMS_REGISTER,
    "streams_state": _STREAMS_STATE,
    "streams_cycle": _STREAMS_CYCLE,
    "groups_body": _GROUPS,
    "system_body": _SYSTEM,
    "configure": _CONFIGURE,
    "query_string": _QUERY,
    "fetch_body": _FETCH,
    "changed_body": _CHANGED,
    "eph_push": _EPH_PUSH,
    "eph_ack": _EPH_ACK,
    "eph_configure": _EPH_CONFIGURE,
    "eph_reset": _EPH_RESET,
    "gzip_body": [_gz(_JSON_PUSH[0]), _gz(b"") + _gz(b"{}"), _gz(b"\0" * 5000)],
    "zstd_body": [_zs(_JSON_PUSH[0]), _zs(b"a") + _zs(b"b"), _zs(b"\0" * 5000)],
}

# (method, path, seed corpus) of the routes whose body the app target fuzzes
BODY_ROUTES: list[tuple[str, str, str]] = [
    ("POST", "/api/v1/push", "json_push"), ("POST", "/api/v1/push", "qpb1_push"),
    ("POST", "/api/v1/transaction", "transaction"), ("POST", "/api/v1/kv", "kv_ops"),
    ("POST", "/api/v1/timers", "timer_ops"), ("POST", "/api/v1/ack", "ack_body"),
    ("POST", "/api/v1/ack/batch", "ack_body"), ("POST", "/api/v1/configure", "configure"),
    ("POST", "/api/v1/lease/0196f3a2-c000-7000-8000-000000000a0a/extend", "lease_body"),
    ("POST", "/api/v1/consumer-groups/g/queues/fz/seek", "groups_body"),
    ("POST", "/api/v1/consumer-groups/g/subscription", "groups_body"),
    ("POST", "/api/v1/locks", "lock_ops"), ("POST", "/api/v1/traces", "trace_body"),
    ("POST", "/api/v1/fetch", "fetch_body"), ("POST", "/api/v1/partitions/changed", "changed_body"),
    ("POST", "/streams/v1/queries", "streams_register"),
    ("POST", "/streams/v1/state/get", "streams_state"),
    ("POST", "/streams/v1/cycle", "streams_cycle"),
    ("POST", "/api/v1/ephemeral/push", "eph_push"), ("POST", "/api/v1/ephemeral/ack", "eph_ack"),
    ("POST", "/api/v1/ephemeral/configure", "eph_configure"),
    ("POST", "/api/v1/ephemeral/reset", "eph_reset"),
]
# in-process only: on a real broker these would switch maintenance on (and spool pushes)
SYSTEM_ROUTES: list[tuple[str, str, str]] = [
    ("POST", "/api/v1/system/maintenance", "system_body"),
    ("POST", "/api/v1/system/maintenance/pop", "system_body"),
    ("POST", "/api/v1/system/spool/drain", "system_body"),
    ("POST", "/api/v1/stats/refresh", "system_body"),
]


# ------------------------------------------------------------------------- mutation driver
_INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\xed\xa0\x80", b'"\\ud800"', b"\\u0000", b"-1",
                b"1e999", b"99999999999999999999", b"[" * 1100, b"{}", b"null", b"true", b'""',
                b"/", b"%00", b"..", b"QPB1", b"QTB1", b"\x28\xb5\x2f\xfd",
                struct.pack("<I", 0xFFFFFFFF), struct.pack("<H", 0xFFFF)]


def mutate(data: bytes, rng: random.Random, corpus: list[bytes] | None = None) -> bytes:
    """A few random edits: flips, inserts of interesting tokens, deletes, splices."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        at = rng.randint(0, len(buf))
        if kind == 0 and buf:
            at = min(at, len(buf) - 1)
            buf[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            buf[at:at] = rng.choice(_INTERESTING)
        elif kind == 2:
            del buf[at: at + rng.randint(1, 16)]
        elif kind == 3:
            buf[at:at] = rng.randbytes(rng.randint(1, 8))
        elif kind == 4 and corpus:
            other = rng.choice(corpus)
            cut = rng.randint(0, len(other))
            buf[at:] = other[cut:]
        else:
            buf[at:at] = buf[at: at + rng.randint(1, 64)] * rng.randint(1, 8)
    return bytes(buf)


def _app_case(rng: random.Random) -> bytes:
    method, path, corpus = rng.choice(BODY_ROUTES + SYSTEM_ROUTES)
    body = mutate(rng.choice(SEEDS[corpus]), rng, SEEDS[corpus])
    headers: list[tuple[str, str | bytes]] = []
    if rng.random() < 0.1:
        headers.append(("Content-Encoding", rng.choice(["gzip", "zstd"])))
        body = _gz(body) if headers[-1][1] == "gzip" else _zs(body)
        if rng.random() < 0.5:
            body = mutate(body, rng)
    return request_bytes(method, path, body, headers=headers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--target", action="append", choices=[*PARSER_TARGETS, "http"])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default="var/fuzz-crashes")
    args = parser.parse_args(argv)
    logging.getLogger("queen_mp").setLevel(logging.CRITICAL)  # the 500s are counted below
    rng = random.Random(args.seed)
    names = args.target or [*PARSER_TARGETS, "http"]
    runs = dict.fromkeys(names, 0)
    found: dict[tuple[str, str, str], int] = {}
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        name = rng.choice(names)
        if name == "http":
            data, fn = _app_case(rng), http_request
        else:
            corpus = SEEDS[name]
            data = mutate(rng.choice(corpus), rng, corpus)
            fn = PARSER_TARGETS[name]
        try:
            fn(data)
        except Exception as ex:
            kind = (name, type(ex).__name__, str(ex)[:60])
            found[kind] = found.get(kind, 0) + 1
            if found[kind] <= 3:  # keep a few inputs of each kind of failure
                os.makedirs(args.out, exist_ok=True)
                path = os.path.join(args.out, f"{name}-{uuid.uuid4().hex[:12]}.bin")
                with open(path, "wb") as out:
                    out.write(data)
                print(f"{name}: {type(ex).__name__}: {str(ex)[:200]} -> {path}", flush=True)
        runs[name] += 1
    print(f"{sum(runs.values())} inputs in {args.seconds:.0f} s: {runs}")
    for (name, exc, text), n in sorted(found.items()):
        print(f"FAIL x{n} {name}: {exc}: {text}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
