"""Hostile input against a real broker over HTTP (issue 9: "hostile input").

One private broker on a fresh database for the module; its tests run in file order:

1. **refused phase**: bodies that MUST be refused (a valid body with one bad field at a random
   place, truncated or padded binary bodies, valid bodies in an unsupported encoding or over a
   declared limit). Every answer is a 4xx JSON error with ``code`` and, per request, no row of
   any table changed.
2. **mutation phase**: hostile and byte-edited bodies for every body route (timers excepted):
   a 2xx or a 4xx JSON error, never 5xx; on a 4xx the log (queues, partitions, offsets) and KV
   did not change.
3. timers, hostile query strings, path segments, headers, Content-Length lies, decompression
   bombs: never 5xx, 4xx as JSON (or the HTTP parser's own 400), never a hang.
4. **afterwards**: ``/health`` is 200, the supervisor (gunicorn's arbiter), shards and front
   workers have the pids they had before (no crash, no restart), their RSS grew less than
   200 MB, and the broker's log holds no unhandled error.

``QUEEN_FUZZ_EXAMPLES`` raises the number of examples per test (``make fuzz``).
"""

from __future__ import annotations

import gzip
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.brokerharness import Broker, is_shard, process_tree, start_broker
from tests.fuzz import targets as t
from tests.fuzz.strategies import (
    DOC_SEEDS,
    REFUSED_ROUTES,
    edited,
    hostile_doc,
    hostile_query,
    hostile_target,
    qtb1_hostile_head,
    refused_doc,
)
from tests.pgharness import drop_database, make_migrated_database

RSS_GROWTH_LIMIT = 200 << 20

# every row count a request could change (strict: the refused phase)
STRICT_STATE = """
SELECT (SELECT count(*) FROM queen.queues), (SELECT count(*) FROM queen.log_partitions),
       (SELECT coalesce(sum(last_offset), 0) FROM queen.log_partitions),
       (SELECT count(*) FROM queen.log_segments), (SELECT count(*) FROM queen.log_txns),
       (SELECT count(*) FROM queen.kv), (SELECT coalesce(sum(version), 0) FROM queen.kv),
       (SELECT count(*) FROM queen.timers), (SELECT count(*) FROM queen.log_dlq),
       (SELECT count(*) FROM queen.log_consumers),
       (SELECT count(*) FROM queen.consumer_groups_meta),
       (SELECT count(*) FROM queen.message_traces), (SELECT count(*) FROM queen.stream_queries),
       (SELECT count(*) FROM queen.stream_state), (SELECT count(*) FROM queen.stream_cycles),
       (SELECT count(*) FROM queen.eph_config), (SELECT count(*) FROM queen.eph_queues),
       (SELECT coalesce(sum(live), 0) FROM queen.eph_chunks)
"""
# what only a request can change while earlier accepted mutations settle (leases expire,
# retention and purges run): queues, partitions, the log's offsets, KV writes
LOG_STATE = """
SELECT (SELECT count(*) FROM queen.queues), (SELECT count(*) FROM queen.log_partitions),
       (SELECT coalesce(sum(last_offset), 0) FROM queen.log_partitions),
       (SELECT count(*) FROM queen.kv), (SELECT coalesce(sum(version), 0) FROM queen.kv)
"""

# the strategies' reprs hold whole seed documents: hypothesis warns that they are large
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")


def fuzz(default: int) -> settings:
    return settings(max_examples=t.examples(default), deadline=None,
                    suppress_health_check=list(HealthCheck))


@dataclass
class Proc:
    pid: int
    role: str
    rss: int


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return -1
    return 0


def _role(broker: Broker, pid: int) -> str:
    if pid == broker.proc.pid:
        return "supervisor"
    if pid in broker.front_worker_pids():
        return "front"
    if not Path(f"/proc/{pid}").exists():
        return "gone"
    return "shard" if is_shard(pid) else "other"


def processes(broker: Broker) -> dict[int, Proc]:
    return {pid: Proc(pid, _role(broker, pid), _rss(pid))
            for pid in process_tree(broker.proc.pid)}


class Fuzzed:
    """The module's broker, its database, and what it looked like before the run."""

    def __init__(self, broker: Broker, dsn: str, db: psycopg.Connection) -> None:
        self.broker, self.dsn, self.db = broker, dsn, db
        self.port = int(broker.url.rsplit(":", 1)[1])
        self.before: dict[int, Proc] = processes(broker)
        self.counts: dict[str, int] = {}

    def __repr__(self) -> str:  # hypothesis prints it with every failing example
        return f"Fuzzed({self.broker.url})"

    def state(self, query: str = STRICT_STATE) -> tuple:
        return self.db.execute(query).fetchone()

    def count(self, answer: t.Answer | httpx.Response) -> None:
        status = answer.status if isinstance(answer, t.Answer) else answer.status_code
        key = f"{status // 100}xx"
        self.counts[key] = self.counts.get(key, 0) + 1


@pytest.fixture(scope="module")
def fz(pg_server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    dsn = make_migrated_database(pg_server_dsn)
    broker = start_broker(tmp_path_factory.mktemp("fuzz-broker"), dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as db:
            f = Fuzzed(broker, dsn, db)
            yield f
            print(f"\nbroker answers by class: {f.counts}")
    finally:
        code = broker.stop()
        drop_database(pg_server_dsn, dsn)
    assert code == 0, broker.log()[-4000:]


def check(answer: httpx.Response) -> None:
    """A 2xx, or a 4xx JSON error with ``code`` (never 5xx)."""
    t.check_answer(t.Answer(answer.status_code, dict(answer.headers), answer.content,
                            method=answer.request.method), allow_reached=False)


def send(fz: Fuzzed, method: str, path: str, body: bytes = b"", **kw) -> httpx.Response:
    r = fz.broker.client.request(method, path, content=body, **kw)
    fz.count(r)
    return r


# ------------------------------------------------------------------------- 1. refused phase
@fuzz(40)
@given(route=st.sampled_from(sorted(REFUSED_ROUTES)), data=st.data())
def test_refused_bodies_store_nothing(fz, route, data):
    body = data.draw(refused_doc(route, tag="refused"))
    before = fz.state()
    r = send(fz, "POST", REFUSED_ROUTES[route], body)
    check(r)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    assert fz.state() == before, f"{route}: a {r.status_code} changed state: {r.text[:300]}"


def _binary_bodies() -> list[tuple[str, bytes]]:
    return [("/api/v1/push", b) for b in t.SEEDS["qpb1_push"]] + \
        [("/api/v1/transaction", b) for b in t.SEEDS["transaction"] if b[:4] == b"QTB1"]


@fuzz(40)
@given(case=st.sampled_from(_binary_bodies()), cut=st.integers(0, 1 << 16),
       extra=st.sampled_from([b"", b"\x00", b"QPB1", b"\xff" * 9]))
def test_truncated_or_padded_binary_bodies_store_nothing(fz, case, cut, extra):
    path, body = case
    # keep the magic: without it the body is read as JSON
    body = body[: 4 + cut % (len(body) - 4)] if not extra else body + extra
    before = fz.state()
    r = send(fz, "POST", path, body)
    check(r)
    assert r.status_code == 400 and r.json()["code"] == "bad_frame", r.text[:300]
    assert fz.state() == before


@pytest.mark.parametrize("headers", [
    {"Content-Encoding": "br"}, {"Content-Encoding": "deflate"},
    {"Content-Encoding": "gzip"}, {"Content-Encoding": "zstd"},  # the body is not encoded
    {"Content-Encoding": "gzip, gzip"}, {"Content-Encoding": "x" * 2000},
])
@pytest.mark.parametrize("route", ["push", "transaction", "kv", "timers", "ack", "configure"])
def test_valid_bodies_in_a_wrong_encoding_store_nothing(fz, route, headers):
    body = {"push": t.SEEDS["json_push"][0], "transaction": t.SEEDS["transaction"][1],
            "kv": t.SEEDS["kv_ops"][0], "timers": t.SEEDS["timer_ops"][0],
            "ack": t.SEEDS["ack_body"][1], "configure": t.SEEDS["configure"][0]}[route]
    path = REFUSED_ROUTES[route] if route != "ack" else "/api/v1/ack/batch"
    before = fz.state()
    r = send(fz, "POST", path, body, headers=headers)
    check(r)
    assert r.status_code in (400, 415), (r.status_code, r.text[:300])
    assert fz.state() == before


def test_declared_lengths_over_the_limit_are_refused_before_reading(fz):
    # NOTE(fuzz): falcon waits for the first body event before it routes (ASGI spec), so
    # the refusal comes with the first bytes of the body, not with the headers alone
    before = fz.state()
    for path in ("/api/v1/push", "/api/v1/transaction", "/api/v1/kv", "/api/v1/timers",
                 "/api/v1/configure", "/api/v1/ack"):
        raw = t.request_bytes("POST", path, b"{" * 1024, content_length=(64 << 20) + 1)
        answer = t.send_raw(fz.port, raw, timeout=10)
        assert answer is not None, f"{path}: no answer"
        fz.count(answer)
        t.check_answer(answer, allow_reached=False)
        assert answer.status == 413, (path, answer)
        assert answer.json()["code"] == "body_too_large"
    assert fz.state() == before


def test_a_content_length_shorter_than_the_body_stores_nothing(fz):
    body = t.SEEDS["json_push"][0]
    before = fz.state()
    raw = t.request_bytes("POST", "/api/v1/push", body, content_length=len(body) - 5)
    answer = t.send_raw(fz.port, raw, timeout=10)
    assert answer is not None
    t.check_answer(answer, allow_reached=False)
    assert answer.status == 400
    assert fz.state() == before


def test_a_body_cut_short_by_a_disconnect_stores_nothing(fz):
    # found here: the prefix was stored (no one to answer) until read_body compared the bytes
    # read with Content-Length
    body = b'{"items":[{"queue":"fz-cut","payload":1}]}'
    before = fz.state()
    raw = t.request_bytes("POST", "/api/v1/push", body, content_length=len(body) + 8)
    t.send_raw(fz.port, raw, timeout=5, half_close=True)
    time.sleep(0.5)
    assert fz.state() == before


# ------------------------------------------------------------------------- 2. mutation phase
_MUTATED = [(m, p, c) for m, p, c in t.BODY_ROUTES if c != "timer_ops"]
_NO_TIMERS = {c: [{k: v for k, v in d.items() if k != "timers"} for d in docs]
              for c, docs in DOC_SEEDS.items()}


@fuzz(80)
@given(route=st.sampled_from(_MUTATED), data=st.data(), as_doc=st.booleans())
def test_mutated_bodies_never_5xx_and_4xx_change_nothing(fz, route, data, as_doc):
    method, path, corpus = route
    if as_doc and corpus == "transaction" and data.draw(st.booleans()):
        body = data.draw(qtb1_hostile_head())
    elif as_doc and corpus in _NO_TIMERS:
        body = data.draw(st.sampled_from(_NO_TIMERS[corpus]).flatmap(hostile_doc))
    else:
        seeds = [s for s in t.SEEDS[corpus] if b'"timers"' not in s]
        body = data.draw(edited(seeds) | st.binary(max_size=64))
    before = fz.state(LOG_STATE)
    r = send(fz, method, path, body)
    check(r)
    if r.status_code >= 400:
        assert fz.state(LOG_STATE) == before, f"a {r.status_code} changed state: {r.text[:300]}"


# ------------------------------------------------------------------------- 3. the rest
@fuzz(40)
@given(data=st.data(), as_doc=st.booleans())
def test_mutated_timer_bodies_never_5xx(fz, data, as_doc):
    if as_doc:
        body = data.draw(st.sampled_from(DOC_SEEDS["timer_ops"]).flatmap(hostile_doc))
    else:
        body = data.draw(edited(t.SEEDS["timer_ops"]))
    check(send(fz, "POST", "/api/v1/timers", body))


_QUERIED = ["/api/v1/pop/queue/fz", "/api/v1/pop/queue/fz/partition/p", "/api/v1/pop",
            "/api/v1/dlq", "/api/v1/consumer-groups", "/api/v1/consumer-groups/lagging",
            "/api/v1/consumer-groups/g", "/api/v1/timers/fz", "/api/v1/resources/queues",
            "/api/v1/resources/partitions", "/api/v1/status/queues", "/api/v1/messages/1/t",
            "/api/v1/traces/names", "/api/v1/traces/by-name/fz", "/api/v1/traces/1/t",
            "/api/v1/ephemeral/pop", "/api/v1/ephemeral/queues",
            "/api/v1/ephemeral/queues/fz/depth"]


def _raw(fz: Fuzzed, method: str, target: str, body: bytes = b"", **kw) -> t.Answer:
    answer = t.send_raw(fz.port, t.request_bytes(method, target, body, **kw), timeout=20)
    assert answer is not None, f"{method} {target[:200]}: closed without an answer"
    answer.method = method
    fz.count(answer)
    t.check_answer(answer, allow_reached=False)
    return answer


@fuzz(60)
@given(path=st.sampled_from(_QUERIED), query=hostile_query())
def test_hostile_query_strings_never_5xx(fz, path, query):
    # NOTE(fuzz): a repeated key keeps its FIRST value (api.md 1.1): no long poll over 100 ms
    _raw(fz, "GET", f"{path}?timeout=100&{query}")


# routes whose POST or DELETE would switch the broker itself (maintenance) or drop queues:
# the path fuzz sends them GET only
_GET_ONLY = ("/api/v1/system", "/api/v1/resources/queues/")


@fuzz(60)
@given(method=st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]),
       target=hostile_target(),
       body=st.sampled_from([b"", b"{}", b'{"seconds":5}', b'{"toEnd":true}', b"\x00\xff"]))
def test_hostile_path_segments_never_5xx(fz, method, target, body):
    _, path = target
    if path.startswith(_GET_ONLY):
        method = "GET"
    _raw(fz, method, f"{path}?timeout=100", body)


@pytest.mark.parametrize("raw", [
    b"GET /api/v1/pop/queue/\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/v1/pop/queue/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/v1/pop/queue/a b HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"v" * 70000 + b"\r\n\r\n",
    b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
    b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n{}",
    b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
    b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}",
    b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
    b"BREW /api/v1/push HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",  # was a bare 500 (falcon raised)
    b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS hello
], ids=lambda raw: raw[:40].decode("latin-1").replace("\r\n", " ")[:30])
def test_malformed_http_is_refused(fz, raw):
    before = fz.state(LOG_STATE)
    answer = t.send_raw(fz.port, raw, timeout=10, half_close=True)
    if answer is not None:  # closing without an answer is fine for bytes that are not HTTP
        fz.count(answer)
        t.check_answer(answer, allow_reached=False)
        assert answer.status < 500, answer
    assert fz.state(LOG_STATE) == before


# each answered 500 (or 503) before its fix; the seek and subscription ones after they had
# moved the cursor. True: must be refused (4xx, nothing stored); False: just no 5xx (a number
# beyond int8 clamps like any value over its maximum)
_FOUND = [
    ("POST", "/api/v1/consumer-groups/g/queues/fz-found/seek",
     b'{"timestamp":"0001-01-01T00:00:00+01:00"}', True),
    ("POST", "/api/v1/consumer-groups/g/subscription",
     b'{"subscriptionTimestamp":"9999-12-31T23:59:59-01:00"}', True),
    ("GET", "/api/v1/pop/queue/fz-found?subscriptionFrom=0001-01-01T00:00:00%2B01:00", b"",
     True),
    ("GET", "/api/v1/pop/queue/fz-found?batch=--5", b"", True),
    ("GET", "/api/v1/messages/" + "9" * 5000 + "/t", b"", True),
    ("POST", "/api/v1/ack", b'{"transactionId":"t","partitionId":"' + b"9" * 5000 + b'"}', True),
    ("POST", "/api/v1/kv", b'{"operations":[{"op":' + b"[" * 900 + b"]" * 900 + b"}]}", True),
    ("POST", "/api/v1/kv", b'{"operations":[{"op":"put","ns":"n","key":"k","forever":true,'
     b'"value":"\\u0000"}]}', True),
    ("GET", "/api/v1/pop/queue/fz-found?batch=" + "9" * 5000, b"", False),
    ("GET", "/api/v1/resources/queues?offset=99999999999999999999999", b"", False),
    ("GET", "/api/v1/consumer-groups/lagging?minLagSeconds=99999999999999999999999", b"", False),
]


@pytest.mark.parametrize(("method", "target", "body", "refused"), _FOUND,
                         ids=[f"{m} {p[:50]}" for m, p, _, _ in _FOUND])
def test_found_inputs(fz, method, target, body, refused):
    if "fz-found" in target:  # a queue for the seek to move (and not to)
        send(fz, "POST", "/api/v1/push", b'{"items":[{"queue":"fz-found","payload":1}]}')
    before = fz.state()
    answer = _raw(fz, method, target, body)
    if refused:
        assert 400 <= answer.status < 500, answer
        assert fz.state() == before


# ------------------------------------------------------------------------- bombs
_BOMB = 80 << 20  # decoded: over the 64 MiB body limit


def _gzip_bomb() -> bytes:
    return gzip.compress(b"\0" * _BOMB, compresslevel=9)


def _zstd_bomb(size: int, *, sized: bool = True) -> bytes:
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=sized)
    stream = cctx.compressobj(size=size if sized else -1)
    block = b"\0" * (1 << 20)
    out = [stream.compress(block) for _ in range(size >> 20)]
    return b"".join([*out, stream.flush()])


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {"gzip": _gzip_bomb(), "zstd": _zstd_bomb(_BOMB),
            "zstd_nosize": _zstd_bomb(_BOMB, sized=False)}


@pytest.mark.parametrize("kind", ["gzip", "zstd", "zstd_nosize"])
@pytest.mark.parametrize("path", ["/api/v1/push", "/api/v1/transaction", "/api/v1/kv",
                                  "/api/v1/timers", "/api/v1/ack", "/api/v1/configure"])
def test_content_encoding_bombs_answer_413(fz, bombs, kind, path):
    encoding = "gzip" if kind == "gzip" else "zstd"
    before = fz.state(LOG_STATE)
    r = send(fz, "POST", path, bombs[kind], headers={"Content-Encoding": encoding})
    check(r)
    assert r.status_code == 413 and r.json()["code"] == "body_too_large", r.text[:300]
    assert fz.state(LOG_STATE) == before


def test_binary_zstd_bombs_answer_413(fz):
    """QPB1 flag 1 and frames groups, QTB1 groups: frames that claim (or hold) more than
    QUEEN_MAX_DECOMPRESSED_MB (256 MiB) are refused, a large one within it is decoded once."""
    huge = zstandard.ZstdCompressor(write_content_size=True).compressobj(size=1 << 40)
    # a frame header that says 1 TiB, one block, and no more
    claim = huge.compress(b"\0" * 1024) + huge.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    big = _zstd_bomb(257 << 20)
    within = _zstd_bomb(96 << 20)
    cases = [
        ("/api/v1/push", b"QPB1\x05" + struct.pack("<I", 0xFFFFFFFF) + claim, 413),
        ("/api/v1/push", b"QPB1\x05" + struct.pack("<I", 257 << 20) + big, 413),
        # 96 MiB of zeros: decodes (under 256 MiB), then it is no valid plain body
        ("/api/v1/push", b"QPB1\x05" + struct.pack("<I", 96 << 20) + within, 400),
    ]
    group = struct.pack("<H", 2) + b"fz" + struct.pack("<H", 1) + b"p" + struct.pack("<I", 1)
    for z in (claim, big):
        frames = struct.pack("<I", 1) + group + struct.pack("<I", len(z)) + z
        cases.append(("/api/v1/push", b"QPB1\x08" + frames, 413))
        cases.append(("/api/v1/transaction",
                      b"QTB1\x00" + struct.pack("<I", 2) + b"{}" + frames, 413))
    before = fz.state(LOG_STATE)
    for path, body, status in cases:
        r = send(fz, "POST", path, body)
        check(r)
        assert r.status_code == status, (path, body[:8], r.status_code, r.text[:300])
    assert fz.state(LOG_STATE) == before


# ------------------------------------------------------------------------- 4. afterwards
def test_the_broker_survived_unchanged(fz):
    """Runs last (file order): health, same processes, bounded memory, no unhandled error."""
    r = fz.broker.client.get("/health")
    assert r.status_code == 200, r.text
    after = processes(fz.broker)
    assert sorted(after) == sorted(fz.before), (
        f"processes changed (a crash or a restart): before {sorted(fz.before.values(), key=str)}"
        f" after {sorted(after.values(), key=str)}")
    grown = {p.pid: (p.role, after[p.pid].rss - p.rss) for p in fz.before.values()
             if p.role in ("supervisor", "front", "shard")}
    assert all(g < RSS_GROWTH_LIMIT for _, g in grown.values()), grown
    log = fz.broker.log()
    for marker in ("unhandled error", "Exception in ASGI application", "Traceback",
                   "WORKER TIMEOUT", "; restarting", "stopped beating", "halting"):
        assert marker not in log, f"{marker!r} in the broker's log:\n" + log[
            max(0, log.find(marker) - 2000): log.find(marker) + 3000]
    print(f"\nRSS growth by pid (role, bytes): {grown}")
    assert os.path.exists(f"/proc/{fz.broker.proc.pid}")
