"""Hostile input in-process: every parser, and the falcon app of a front worker over fakes.

No PostgreSQL: requests that pass every check reach fake backends (tests/fuzz/targets.py) and
come back ``418 reached_backend``. Anything else than a 2xx, that 418 or a 4xx JSON error is a
failure, as is any exception escaping a parser other than its 4xx ``ApiError``/``RequestError``/
``WireError``.

The wire parsers' own corruption and round-trip properties live in tests/unit
(test_binary_push.py, test_frames.py); here the bodies go through the routes' entry points.
``QUEEN_FUZZ_EXAMPLES`` raises the number of examples (``make fuzz``).
"""

from __future__ import annotations

import base64
import gzip
import struct
import tracemalloc
import zlib

import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from queen.http import push_binary as client

from queen_mp.models.items import loads_json
from tests.fuzz import targets as t
from tests.fuzz.strategies import (
    DOC_SEEDS,
    REFUSED_ROUTES,
    Deep,
    edited,
    encode,
    hostile_doc,
    hostile_query,
    hostile_target,
    qtb1_hostile_head,
    refusal_cases,
    refused_doc,
)

# the strategies' reprs hold whole seed documents: hypothesis warns that they are large
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")


def fuzz(default: int) -> settings:
    return settings(max_examples=t.examples(default), deadline=None,
                    suppress_health_check=list(HealthCheck))


def post(path: str, body: bytes, **kw) -> t.Answer:
    answer = t.serve(t.request_bytes("POST", path, body, **kw))
    assert answer is not None
    return answer


# ------------------------------------------------------------------------- parser targets
@pytest.mark.parametrize("name", sorted(t.PARSER_TARGETS))
def test_parser_refuses_edited_bodies_with_4xx_only(name):
    @fuzz(60)
    @given(data=edited(t.SEEDS[name]) | st.binary(max_size=256))
    def run(data):
        t.PARSER_TARGETS[name](data)

    run()


# corpora whose parser is inline in the responder: the route is the target
_ROUTE_OF = {"configure": "/api/v1/configure",
             "groups_body": "/api/v1/consumer-groups/g/queues/fz/seek",
             "system_body": "/api/v1/system/maintenance"}


@pytest.mark.parametrize("name", sorted(DOC_SEEDS))
def test_parser_refuses_hostile_documents_with_4xx_only(name):
    target = t.PARSER_TARGETS.get(name)
    if target is None:
        def target(data):
            t.http_request(t.request_bytes("POST", _ROUTE_OF[name], data))

    @fuzz(60)
    @given(data=st.sampled_from(DOC_SEEDS[name]).flatmap(hostile_doc))
    def run(data):
        target(data)

    run()


@fuzz(60)
@given(data=qtb1_hostile_head())
def test_transaction_refuses_qtb1_with_a_hostile_head_with_4xx_only(data):
    t.transaction(data)
    t.http_request(t.request_bytes("POST", "/api/v1/transaction", data))


# ------------------------------------------------------------------------- the app
_ALL_ROUTES = t.BODY_ROUTES + t.SYSTEM_ROUTES
_DOC_ROUTES = [(m, p, c) for m, p, c in _ALL_ROUTES if c in DOC_SEEDS]


@fuzz(150)
@given(route=st.sampled_from(_DOC_ROUTES), data=st.data())
def test_app_answers_hostile_json_bodies(route, data):
    method, path, corpus = route
    body = data.draw(st.sampled_from(DOC_SEEDS[corpus]).flatmap(hostile_doc))
    t.http_request(t.request_bytes(method, path, body))


@fuzz(150)
@given(route=st.sampled_from(_ALL_ROUTES), data=st.data(),
       encoding=st.sampled_from([None, None, "gzip", "zstd", "GZip ", "br", "identity",
                                 "gzip, zstd", "x" * 200]),
       corrupt=st.booleans())
def test_app_answers_edited_bodies_in_every_encoding(route, data, encoding, corrupt):
    method, path, corpus = route
    body = data.draw(edited(t.SEEDS[corpus]))
    headers = []
    if encoding is not None:
        headers.append(("Content-Encoding", encoding))
        if encoding.strip().lower() == "gzip":
            body = gzip.compress(body, 1)
        elif encoding == "zstd":
            body = zstandard.ZstdCompressor(level=1).compress(body)
        if corrupt:
            body = data.draw(edited([body]))
    t.http_request(t.request_bytes(method, path, body, headers=headers))


@fuzz(100)
@given(route=st.sampled_from(sorted(REFUSED_ROUTES)), data=st.data())
def test_app_refuses_a_body_with_one_bad_field_before_any_backend(route, data):
    """One bad field anywhere: 4xx, decided before anything is stored (api.md 2.1)."""
    body = data.draw(refused_doc(route))
    answer = post(REFUSED_ROUTES[route], body)
    t.check_answer(answer, allow_reached=False)
    assert 400 <= answer.status < 500, answer


_SWEEP = refusal_cases()


@pytest.mark.parametrize(("route", "field", "value", "body"), _SWEEP,
                         ids=[f"{r}-{f}-{i}" for i, (r, f, _, _) in enumerate(_SWEEP)])
def test_issue_27_routes_refuse_each_listed_bad_value_before_any_backend(route, field, value,
                                                                         body):
    """Every known-bad value of the bodies of issue 27's routes (locks, traces, fetch,
    partitions/changed, streams queries/state/cycle, ephemeral push/ack/configure), one at a
    time in an otherwise valid body: a 4xx naming a code, decided before any backend."""
    answer = post(REFUSED_ROUTES[route], body)
    t.check_answer(answer, allow_reached=False)
    assert 400 <= answer.status < 500, (route, field, value, answer)


@fuzz(200)
@given(method=st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD",
                               "FOO"]),
       target=hostile_target(), query=st.none() | hostile_query(),
       body=st.sampled_from([b"", b"{}", b"null", b'{"seconds":5}', b"\x00\xff"]))
def test_app_answers_hostile_paths_and_query_strings(method, target, query, body):
    _, path = target
    raw_target = path if query is None else f"{path}?{query}"
    t.http_request(t.request_bytes(method, raw_target, body))


_POP_AND_LISTS = ["/api/v1/pop/queue/fz", "/api/v1/pop/queue/fz/partition/p/q", "/api/v1/pop",
                  "/api/v1/dlq", "/api/v1/consumer-groups/lagging", "/api/v1/timers/fz",
                  "/api/v1/consumer-groups/g", "/api/v1/resources/queues",
                  "/api/v1/status/queues", "/api/v1/messages/1/t", "/api/v1/traces/names",
                  "/api/v1/traces/by-name/fz", "/api/v1/traces/1/t", "/api/v1/ephemeral/pop",
                  "/api/v1/ephemeral/queues", "/api/v1/ephemeral/queues/fz/depth"]


@fuzz(200)
@given(path=st.sampled_from(_POP_AND_LISTS), query=hostile_query())
def test_app_answers_hostile_query_strings(path, query):
    t.http_request(t.request_bytes("GET", f"{path}?{query}"))


@fuzz(100)
@given(route=st.sampled_from(t.BODY_ROUTES),
       header=st.sampled_from([("Content-Length", "abc"), ("Content-Length", "-1"),
                               ("Content-Length", "1e3"), ("Content-Length", " 5"),
                               ("Content-Length", "99999999999999999999999"),
                               ("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "gzip"),
                               ("Content-Type", "application/x-queen-push"),
                               ("Content-Type", "text/plain; charset=\x7f"),
                               ("Content-Encoding", ""), ("Content-Encoding", "gzip;q=1"),
                               ("Expect", "100-continue"), ("Authorization", "Bearer x.y.z"),
                               ("Host", ""), ("X-Long", "x" * 8000)]),
       declared=st.sampled_from([True, False]))
def test_app_answers_hostile_headers(route, header, declared):
    method, path, corpus = route
    body = t.SEEDS[corpus][0]
    t.http_request(t.request_bytes(method, path, body, headers=[header],
                                   content_length=declared))


# ------------------------------------------------------------------------- bombs
def _peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


_ZEROS = 65 << 20  # over every body limit: the in-process 1 MiB, and ack's fixed 64 MiB
# NOTE(fuzz): the ack routes read up to a fixed 64 MiB (ack.py MAX_BODY), not QUEEN_MAX_BODY_MB
_BODY_LIMIT = {"/api/v1/ack": 64 << 20}


def _gzip_bomb() -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    return b"".join([*(c.compress(block) for _ in range(_ZEROS >> 20)), c.flush()])


def _zstd_bomb(sized: bool) -> bytes:
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=sized)
    if sized:
        return cctx.compress(b"\0" * _ZEROS)
    stream = cctx.compressobj()
    out = [stream.compress(b"\0" * (1 << 20)) for _ in range(_ZEROS >> 20)]
    return b"".join([*out, stream.flush()])


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    # many members/frames, each under the limit, together over it
    members = (_ZEROS >> 19) + 1
    return {"gzip": _gzip_bomb(), "gzip_members": gzip.compress(b"\0" * (512 << 10)) * members,
            "zstd": _zstd_bomb(True), "zstd_nosize": _zstd_bomb(False),
            "zstd_frames": zstandard.ZstdCompressor().compress(b"\0" * (512 << 10)) * members}


@pytest.mark.parametrize("kind", ["gzip", "gzip_members", "zstd", "zstd_nosize", "zstd_frames"])
@pytest.mark.parametrize("path", ["/api/v1/push", "/api/v1/transaction", "/api/v1/kv",
                                  "/api/v1/timers", "/api/v1/ack", "/api/v1/configure"])
def test_content_encoding_bombs_stop_at_the_limit(bombs, kind, path):
    encoding = "gzip" if kind.startswith("gzip") else "zstd"
    answer, peak = _peak(lambda: post(path, bombs[kind],
                                      headers=[("Content-Encoding", encoding)]))
    assert answer.status == 413, answer
    assert answer.json()["code"] == "body_too_large"
    limit = _BODY_LIMIT.get(path, t.LIMIT)
    assert peak < 3 * limit + 8 * t.LIMIT, f"peak {peak} bytes for a {kind} bomb"


def test_qpb1_and_qtb1_zstd_bombs_stop_at_the_limit(bombs):
    sized = bombs["zstd"]
    plain = b"QPB1" + bytes([5]) + struct.pack("<I", _ZEROS) + sized  # flag 1: zstd body
    batches = [client.PushBatch("fz", "p", [b"1"], ["t"])]
    frames = bytearray(client.encode_push_frames(batches))
    # the last group's z_len and z: replace its zstd frame by the bomb
    head = bytes(frames[: frames.rindex(b"\x28\xb5\x2f\xfd") - 4])
    framed = head + struct.pack("<I", len(sized)) + sized
    qtb1 = b"QTB1\x00" + struct.pack("<I", 2) + b"{}" + framed[5:]
    timer = orjson.dumps({"operations": [{"op": "schedule", "queue": "fz", "timerKey": "k",
                                          "payloadZstd": True, "delayMs": 1,
                                          "payload": base64.b64encode(sized).decode()}]})
    for path, body in [("/api/v1/push", plain), ("/api/v1/push", framed),
                       ("/api/v1/transaction", qtb1), ("/api/v1/timers", timer)]:
        answer, peak = _peak(lambda p=path, b=body: post(p, b))
        assert answer.status == 413, (path, answer)
        assert peak < 8 * t.LIMIT, f"{path}: peak {peak} bytes"


# ------------------------------------------------------------------------- found by fuzzing
# Each input below answered 500 (or a 503 "database connection failed" for hostile input)
# before the fix noted; they stay as explicit cases.
_BIG = b"12345678901234567890123"  # 19+ digits: the exact-integer (stdlib json) path


@pytest.mark.parametrize("body", [
    # loads_json's stdlib path let a lone surrogate through: UnicodeEncodeError -> 500
    b'{"items":[{"queue":"q","transactionId":"\\ud800","payload":' + _BIG + b"}]}",
    b'{"items":[{"queue":"q","payload":["\\udc00",' + _BIG + b"]}]}",
    # ... and RecursionError on deep nesting -> 500
    b'{"items":[{"queue":"q","payload":[' + _BIG + b"," + b"[" * 5000 + b"]" * 5000 + b"]}]}",
    # a payload nested 1000 deep: orjson reads it, json.dumps fell into RecursionError -> 500
    b'{"items":[{"queue":"q","payload":' + b"[" * 1000 + b"]" * 1000 + b"}]}",
])
def test_found_push_bodies(body):
    answer = post("/api/v1/push", body)
    t.check_answer(answer, allow_reached=False)
    assert 400 <= answer.status < 500, answer


@pytest.mark.parametrize("body", [b'["\\ud800",' + _BIG + b"]",
                                  b'{"\\udfff":' + _BIG + b"}",
                                  b"[" * 5000 + _BIG + b"]" * 5000])
def test_loads_json_refuses_what_orjson_refuses_with_value_error(body):
    with pytest.raises(ValueError):
        loads_json(body)


@pytest.mark.parametrize(("path", "body"), [
    # a kv value orjson cannot write back (nesting over 254, or an integer over 64 bits in a
    # transaction, read exactly): TypeError in kv_procs/txn_procs -> 500
    ("/api/v1/kv", {"operations": [{"op": "put", "ns": "n", "key": "k", "forever": True,
                                    "value": Deep(300)}]}),
    ("/api/v1/transaction", {"kv": [{"op": "put", "ns": "n", "key": "k", "forever": True,
                                     "value": 10**30}]}),
    # ... and 253 levels: within orjson's 254 alone, over it inside the ops' [{...}]
    ("/api/v1/kv", {"operations": [{"op": "put", "ns": "n", "key": "k", "forever": True,
                                    "value": Deep(253)}]}),
    ("/api/v1/transaction", {"kv": [{"op": "put", "ns": "n", "key": "k", "forever": True,
                                     "value": Deep(253)}]}),
    # a NUL in a kv value or in getPrefix's after: jsonb refuses it -> 503 unavailable
    ("/api/v1/kv", {"operations": [{"op": "put", "ns": "n", "key": "k", "forever": True,
                                    "value": {"a": ["x\x00"]}}]}),
    ("/api/v1/kv", {"operations": [{"op": "getPrefix", "ns": "n", "prefix": "",
                                    "after": "\x00"}]}),
    # an unknown kv/timer op or ack status nested 1000 deep: repr() in the error message
    # raised RecursionError -> 500 (in a broker worker from ~900 levels: its stack is deeper)
    ("/api/v1/kv", {"operations": [{"op": Deep(1000)}]}),
    ("/api/v1/transaction", {"kv": [{"op": Deep(1000, objects=True)}]}),
    ("/api/v1/timers", {"operations": [{"op": Deep(1000), "queue": "q", "timerKey": "k"}]}),
    ("/api/v1/ack", {"transactionId": "t", "partitionId": "1", "status": Deep(1000)}),
    # a NUL in an ack's error text: PostgreSQL text refuses it -> 503 unavailable
    ("/api/v1/transaction", {"operations": [{"type": "ack", "transactionId": "t",
                                             "partitionId": "1", "error": "x\x00"}]}),
])
def test_found_bodies_answer_4xx(path, body):
    answer = post(path, encode(body))
    t.check_answer(answer, allow_reached=False)
    assert 400 <= answer.status < 500, answer


def test_found_ack_error_nested_over_254_levels_is_written_by_the_fallback():
    # orjson.dumps raised TypeError (Recursion limit reached) in parse_ack_item -> 500
    body = {"transactionId": "t", "partitionId": "1", "error": Deep(300)}
    answer = post("/api/v1/ack", encode(body))
    t.check_answer(answer)
    assert answer.json()["code"] == "reached_backend", answer


@pytest.mark.parametrize("target", [
    # int() of over 4300 digits raised ValueError -> 500 (query integers, path and body
    # partition ids); "--5" passed the digit check and failed int() too
    "/api/v1/pop/queue/fz?batch=" + "9" * 5000, "/api/v1/dlq?limit=" + "9" * 5000,
    "/api/v1/pop/queue/fz?batch=--5", "/api/v1/messages/" + "9" * 5000 + "/t",
    # an integer beyond int8 went to PostgreSQL as numeric: no such function -> 503
    "/api/v1/resources/queues?offset=99999999999999999999999",
    "/api/v1/status/queues?offset=99999999999999999999999",
    "/api/v1/consumer-groups/lagging?minLagSeconds=99999999999999999999999",
    # 'to' in year 1's first hour: the default 'from' (an hour before) overflowed -> 500
    "/api/v1/status/queues?to=0001-01-01T00:00:00Z",
    "/api/v1/status/queues/fz?to=0001-01-01T00:30:00Z",
    "/api/v1/status/analytics?to=0001-01-01T00:00:00Z",
])
def test_found_query_and_path_integers(target):
    for method in ("GET", "DELETE"):
        t.http_request(t.request_bytes(method, target))


def test_found_a_partition_id_of_5000_digits_in_a_body():
    for path, body in [("/api/v1/ack", {"transactionId": "t", "partitionId": "9" * 5000}),
                       ("/api/v1/transaction", {"operations": [
                           {"type": "ack", "transactionId": "t", "partitionId": "9" * 5000}]})]:
        answer = post(path, encode(body))
        t.check_answer(answer, allow_reached=False)
        assert answer.status == 400, answer


@pytest.mark.parametrize("version", [b"9.9", b"2.0", b"0.9", b"1.2"])
def test_found_an_http_version_falcon_refuses_answers_400(version):
    # falcon raised UnsupportedError before any handler: uvicorn's bare 500
    answer = t.serve(b"GET /health HTTP/" + version + b"\r\nHost: x\r\n\r\n")
    t.check_answer(answer)
    assert answer.status == 400, answer


def test_a_body_cut_short_by_a_disconnect_is_not_used():
    # falcon ends the stream on http.disconnect: the prefix was used as the whole body until
    # read_body compared the bytes read with Content-Length
    body = b'{"items":[{"queue":"q","payload":1}]}'
    t.http_request(t.request_bytes("POST", "/api/v1/push", body, content_length=len(body) + 8))
