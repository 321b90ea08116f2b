"""Hypothesis strategies for hostile input, shared by the in-process and the broker fuzz tests.

- ``edited(seeds)``: a seed body with a few byte edits (flip, cut, insert, delete, set), the
  way the wire tests corrupt QPB1 bodies, here for every body kind;
- ``hostile_doc(seed)``: a JSON seed document with some values replaced by hostile ones
  (control characters, NUL, lone surrogates, huge integers, nesting past every parser's depth,
  wrong types), keys dropped or added; ``encode`` writes it, lone surrogates and integers beyond
  64 bits included (which no JSON library would write for us);
- ``refused_doc(route)``: a VALID document of a route with exactly one known-bad change at a
  random place, so the route must answer 4xx and store nothing (``refusal_cases()`` lists
  every such change of the issue 27 routes once, for a deterministic sweep);
- ``hostile_target(...)``, ``hostile_query()``: request targets with hostile path segments and
  query strings.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
from hypothesis import strategies as st

from tests.fuzz.targets import SEEDS

__all__ = [
    "DOC_SEEDS",
    "REFUSED_ROUTES",
    "Deep",
    "Raw",
    "edited",
    "encode",
    "hostile_doc",
    "hostile_query",
    "hostile_segment",
    "hostile_target",
    "hostile_text",
    "hostile_value",
    "qtb1_hostile_head",
    "refusal_cases",
    "refused_doc",
]


# ------------------------------------------------------------------------- byte edits
_TOKENS = [b"\x00", b"\xff", b"\xed\xa0\x80", b'"\\ud800"', b'"\\u0000"', b"-1", b"1e999",
           b"123456789012345678901234567890", b"[" * 1100, b"{}", b"null", b'""', b"QPB1",
           b"QTB1", b"\x28\xb5\x2f\xfd", b"\xff\xff\xff\xff", b"\xff\xff"]

_edit = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16),
              st.sampled_from(_TOKENS) | st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.integers(1, 16)),
    st.tuples(st.just("set"), st.integers(0, 1 << 16), st.sampled_from([0, 0x7F, 0x80, 0xFF])),
)


def _apply(body: bytes, edits: list[tuple[str, int, Any]]) -> bytes:
    data = bytearray(body)
    for kind, at, arg in edits:
        at %= len(data) + 1
        if kind == "insert":
            data[at:at] = arg
            continue
        if not data:
            continue
        at = min(at, len(data) - 1)
        if kind == "flip":
            data[at] ^= arg
        elif kind == "set":
            data[at] = arg
        elif kind == "cut":
            del data[at:]
        else:
            del data[at: at + arg]
    return bytes(data)


def edited(seeds: list[bytes], max_edits: int = 4) -> st.SearchStrategy[bytes]:
    return st.builds(_apply, st.sampled_from(seeds),
                     st.lists(_edit, min_size=1, max_size=max_edits))


# ------------------------------------------------------------------------- hostile JSON
@dataclass(frozen=True)
class Deep:
    """``inner`` wrapped in ``depth`` arrays (or objects), written without recursion."""

    depth: int
    inner: Any = None
    objects: bool = False


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are (a number no library writes, a broken token)."""

    data: bytes


def encode(value: Any) -> bytes:
    """JSON text of ``value``; strings as ASCII escapes, so lone surrogates survive."""
    out: list[bytes] = []
    todo: list[Any] = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, bytes):  # already written text, queued by a container below
            out.append(v)
        elif isinstance(v, Raw):
            out.append(v.data)
        elif isinstance(v, Deep):
            head, tail = (b'{"a":', b"}") if v.objects else (b"[", b"]")
            out.append(head * v.depth)
            todo.append(tail * v.depth)
            todo.append(v.inner)
        elif isinstance(v, dict):
            parts: list[Any] = [b"{"]
            for i, (k, x) in enumerate(v.items()):
                parts += [b"," if i else b"", json.dumps(str(k)).encode(), b":", x]
            parts.append(b"}")
            todo.extend(reversed(parts))
        elif isinstance(v, list | tuple):
            parts = [b"["]
            for i, x in enumerate(v):
                parts += [b"," if i else b"", x]
            parts.append(b"]")
            todo.extend(reversed(parts))
        else:
            out.append(json.dumps(v).encode())
    return b"".join(out)


_SPECIAL_TEXT = ["", " ", "\x00", "a\x00b", "\ud800", "x\udfff", "\ud83d\ude00", "a/b", "/",
                 "..", ".", "\x7f", "\n", "\t", "\r\n", "\x1b[31m", "%00", "%2F", "\ufffd",
                 "\u202e", "\ufeff", "null", "0", "-1", "true", "__QUEUE_MODE__",
                 "00000000-0000-0000-0000-000000000000", "0196f3a2-c000-7000-8000-000000000a0a",
                 "é" * 128, "x" * 255, "x" * 256, "x" * 1024, "x" * 1025, "\\u0000",
                 "2026-05-16T08:41:27.123Z", "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00",
                 "9999-12-31T23:59:59.999999-01:00", "2026-05-16T08:41:27", "now"]
_SPECIAL_INT = [0, -1, 1, 1 << 31, (1 << 31) - 1, (1 << 63) - 1, 1 << 63, 1 << 64,
                -(1 << 63), -(1 << 63) - 1, 10**30, -(10**30)]


def hostile_text() -> st.SearchStrategy[str]:
    return st.sampled_from(_SPECIAL_TEXT) | st.text(max_size=12) | st.text(
        st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)


_leaf = st.one_of(
    st.none(), st.booleans(), st.sampled_from(_SPECIAL_INT), st.integers(),
    st.floats(allow_nan=False, allow_infinity=False), hostile_text(),
    st.sampled_from([Raw(b"1e999"), Raw(b"-0"), Raw(b"1.0e-400"), Raw(b"123456789012345678901")]),
)


def hostile_value() -> st.SearchStrategy[Any]:
    nested = st.recursive(
        _leaf, lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(hostile_text(), inner, max_size=3), max_leaves=6)
    # NOTE(fuzz): around orjson's limits (254 to write, 1024 to read) and below Python's
    # recursion limit, which a deep call stack (a broker worker's) reaches sooner
    deep = st.builds(Deep, st.sampled_from([100, 253, 254, 255, 256, 300, 500, 700, 800, 900,
                                            950, 990, 1000, 1023, 1024, 1025, 3000]),
                     _leaf, st.booleans())
    return nested | deep


def _mutate_doc(draw: Any, value: Any, depth: int) -> Any:
    if draw(st.integers(0, 12)) == 0:
        return draw(hostile_value())
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, inner in value.items():
            if draw(st.integers(0, 15)) == 0:
                continue  # drop the key
            out[key] = _mutate_doc(draw, inner, depth + 1)
        if draw(st.integers(0, 10)) == 0:
            out[draw(hostile_text())] = draw(hostile_value())
        return out
    if isinstance(value, list):
        out_list = [_mutate_doc(draw, x, depth + 1) for x in value]
        if out_list and draw(st.integers(0, 10)) == 0:
            out_list.append(copy.deepcopy(out_list[draw(st.integers(0, len(out_list) - 1))]))
        if draw(st.integers(0, 12)) == 0:
            out_list.append(draw(hostile_value()))
        return out_list
    return value


@st.composite
def hostile_doc(draw: Any, seed: Any) -> bytes:
    """The encoded body of ``seed`` (a document) after hostile changes."""
    return encode(_mutate_doc(draw, seed, 0))


DOC_SEEDS: dict[str, list[Any]] = {name: [orjson.loads(b) for b in SEEDS[name]
                                          if b[:1] == b"{"]
                                   for name in ("json_push", "transaction", "kv_ops",
                                                "timer_ops", "ack_body", "configure",
                                                "lock_ops", "trace_body",
                                                "streams_register", "streams_state",
                                                "streams_cycle", "eph_push", "eph_ack",
                                                "eph_configure")}
# NOTE(fuzz): DOC_SEEDS keys name corpora of targets.SEEDS
DOC_SEEDS["lease_body"] = [{}, {"seconds": 30}]
DOC_SEEDS["groups_body"] = [orjson.loads(b) for b in SEEDS["groups_body"]]
DOC_SEEDS["system_body"] = [{"enabled": True}]
DOC_SEEDS["fetch_body"] = [orjson.loads(b) for b in SEEDS["fetch_body"]]
DOC_SEEDS["changed_body"] = [orjson.loads(b) for b in SEEDS["changed_body"]]


@st.composite
def qtb1_hostile_head(draw: Any) -> bytes:
    """A client QTB1 body whose JSON head (everything but the pushes) is hostile."""
    body = draw(st.sampled_from([b for b in SEEDS["transaction"] if b[:4] == b"QTB1"]))
    head_len = int.from_bytes(body[5:9], "little")
    head = orjson.loads(body[9: 9 + head_len])
    new = encode(_mutate_doc(draw, head, 0))
    return body[:5] + len(new).to_bytes(4, "little") + new + body[9 + head_len:]


# ------------------------------------------------------------------------- refused documents
_B64 = base64.b64encode(b'{"a":1}').decode()


def _push_item(n: int, tag: str) -> dict[str, Any]:
    return {"queue": f"fz-refused-{tag}", "partition": f"p{n % 3}",
            "transactionId": f"{tag}-{n}", "payload": {"n": n}}


# (route, field to break, bad values): one of them replaces a valid value
_BAD_ITEM = {
    "queue": ["", "a/b", "a\x00b", "a\nb", "\x7f", "x" * 256, "\ud800", None, 1, [], {}],
    "partition": ["a\x00", "\x1f", "p" * 256, "\udc00", 5, [], {}],
    "transactionId": ["t" * 1025, "é" * 513, 7, [], {}],
    "traceId": ["not-a-uuid", "", 5, "0196f3a2-c000-7000-8000-000000000a0", []],
    "payload": [Deep(1030), Raw(b"1e999e"), Raw(b"NaN"), Raw(b"Infinity")],
}
_BAD_KV = {
    "ns": ["", "\x00", "a\nb", "n" * 256, 5, None, [], "\ud800"],
    "key": ["", "\x00", "k" * 1025, 5, None, {}],
    "op": ["nope", "", None, 5, "PUT"],
    "forever": [False, "yes", 1],
    "ttlSeconds": [0, -1, 1 << 31, "10", 1.5],
    "expect": [-1, 1 << 63, None, "1", 1.5],
    "required": ["true", 1, []],
}
_BAD_TIMER = {
    "op": ["fire", None, 3],
    "queue": ["", "q/q", "q\x00", "q" * 256, 5, None],
    "timerKey": ["", "k\x00", "k" * 1025, 5, None],
    "payload": ["not base64!", "eyJh", 5, None, base64.b64encode(b"{nope").decode()],
    "delayMs": ["10", None, 1.5, 10**30, True],
    "payloadZstd": ["yes", 1],
    "messageId": ["0196f3a2-c000-7000-8000-000000000a0a"],
    "tenantId": ["x"],
    "_x": [1],
}
_BAD_ACK = {
    "transactionId": ["", None, 5, "t" * 1025, []],
    "partitionId": ["abc", -1, 0, 1 << 63, "1.5", None, True, "\u0661\u0662", "9" * 5000,
                    "9" * 20],
    "status": ["done", "", None, 5, "COMPLETED"],
    "consumerGroup": ["g/g", "g\x00", "g" * 256, 5, "\ud800"],
    "leaseId": [5, [], {}],
}
_BAD_CONFIGURE = {
    "queue": ["", "q/q", "q\x00", "q" * 256, None, 5],
    "namespace": ["n\x00", "n" * 256, 5],
    "task": ["t\x01", "t" * 256, 5],
    "options": [[], "x", 5],
}
_BAD_OPTION = {"leaseTime": [-1, 1 << 31, "30", 1.5, True],
               "retryLimit": [-1, "2", []],
               "deadLetterQueue": ["true", 1, 0],
               "priority": [1 << 31, -(1 << 31) - 1, "1"],
               # maxSize: only 0 (no cap) is accepted; ttl: only its default (issue 27)
               "maxSize": [-1, 1 << 63, 5, 10**12],
               "ttl": [60, 0, "3600"],
               "retryDelay": [-1, 1 << 31, "1000", 1.5],
               "maxWaitTimeSeconds": [-1, "10", True]}

# ---- the routes of issue 27: a valid body of n parts, the parts one of which is broken
_QID = "0196f3a2-c000-7000-8000-000000000a0a"
_BAD_LOCK = {
    "op": ["nope", "", None, 5, "ACQUIRE"],
    "name": ["", "a#b", "a\x00b", "n" * 300, 5, None, "\ud800"],
    "ttlSeconds": [0, -1, "30", 1.5, True, None],
    "owner": ["", 5, "o\x01", "o" * 300],
    "limit": [0, -1, "3", 1 << 20, 1.5],
    "forever": [True],
    "tenant": ["someone-else"],
}
_BAD_TRACE = {
    "transactionId": ["", None, 5, "t" * 1025],
    "partitionId": ["abc", -1, 0, None, True, "1.5", 1 << 63],
    "consumerGroup": ["g\x00", "g" * 256, 5],
    "traceNames": [5, [5], ["n" * 300]],
    "data": [Deep(1030)],
}
_BAD_FETCH = {
    "queue": ["", None, 5, "q\x00"],
    "offset": [-1, "1", 1.5, True, 1 << 63],
    "maxBytes": [-1, "1", 1.5, True],
}
_BAD_CHANGED = {
    "queue": ["", None, 5, "q\x00"],
    "limit": [0, -1, "1", 1.5, True],  # a larger one is clamped to 1,000 (api.md 2.15)
    "since": ["not a time", 5, "2026-13-45T99:99:99Z"],
}
_BAD_STREAMS_REGISTER = {
    "name": ["", None, 5, "n" * 300, "n\x00"],
    "source_queue": ["", None, 5, "q\x00"],
    "config_hash": [None, 5, []],
    "reset": ["yes", 1, []],
}
_BAD_STREAMS_STATE = {
    "query_id": ["nope", None, 5, ""],
    "partition_id": ["abc", None, -1, True, "1.5"],
    "keys": [5, [5], "a", [None]],
}
_BAD_STREAMS_CYCLE = {
    "query_id": ["nope", None, 5],
    "partition_id": ["abc", None, -1, True],
    "state_ops": [5, [5], [{"type": "nope", "key": "k"}], [{"type": "upsert"}],
                  [{"type": "upsert", "key": 5, "value": 1}]],
    "push_items": [5, [5], [{"queue": "", "payload": 1}], [{"queue": "q\x00", "payload": 1}]],
    "ack": [5, "x", {"transactionId": "t", "leaseId": _QID, "status": "nope"}],
    "release_lease": ["yes", 1],
}
_BAD_EPH_PUSH = {
    "queue": ["", None, 5, "q\x00"],
    "partition": [5, [], "p\x00"],
    "messages": [None, 5, [5], "x"],
}
_BAD_EPH_ACK = {
    "queue": ["", None, 5, "q\x00"],
    "group": [5, [], "g\x00"],
    "acks": [None, 5, [5], [{"status": "completed"}], [{"id": "x", "status": "nope"}]],
}
_BAD_EPH_OPTION = {
    "maxLength": [-1, "10", 1.5, 10**8, True],
    "maxBytes": [-1, "1", 1.5],
    "policy": ["nope", 5, ""],  # null counts as absent
    "ttlSeconds": [-1, 10**9, "5"],
    "leaseSeconds": [-1, 10**9, "5"],
    "retryLimit": [-1, "1"],
    "windowBuffer": [5, "x", {"ms": -1}, {"count": "2"}],
}
_BAD_27: dict[str, dict[str, list[Any]]] = {
    "locks": _BAD_LOCK, "traces": _BAD_TRACE, "fetch": _BAD_FETCH, "changed": _BAD_CHANGED,
    "streams_register": _BAD_STREAMS_REGISTER, "streams_state": _BAD_STREAMS_STATE,
    "streams_cycle": _BAD_STREAMS_CYCLE, "eph_push": _BAD_EPH_PUSH, "eph_ack": _BAD_EPH_ACK,
    "eph_configure": _BAD_EPH_OPTION,
}


def _doc_27(route: str, n: int, tag: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(a valid body of ``route`` with n parts where it has parts, the objects that
    ``_BAD_27[route]`` may break: one of them gets one bad value)."""
    if route == "locks":
        ops = [{"op": "acquire", "name": f"fz-{tag}-{i}", "ttlSeconds": 30, "owner": "w-1"}
               for i in range(n)]
        return {"operations": ops}, ops
    if route == "traces":
        doc = {"transactionId": f"{tag}-t", "partitionId": "17",
               "consumerGroup": "__QUEUE_MODE__", "traceNames": ["flow"],
               "eventType": "info", "data": {"k": 1}}
        return doc, [doc]
    if route == "fetch":
        entries = [{"queue": f"fz-{tag}", "partition": "p", "offset": i, "maxBytes": 65536}
                   for i in range(n)]
        return {"entries": entries, "maxBytes": 1 << 20}, entries
    if route == "changed":
        entries = [{"queue": f"fz-{tag}-{i}", "limit": 10} for i in range(n)]
        return {"entries": entries}, entries
    if route == "streams_register":
        doc = {"name": f"fz.{tag}", "source_queue": f"fz-{tag}", "sink_queue": f"fz-{tag}.out",
               "config_hash": "ab12", "reset": False}
        return doc, [doc]
    if route == "streams_state":
        doc = {"query_id": _QID, "partition_id": "17", "keys": [f"k{i}" for i in range(n)]}
        return doc, [doc]
    if route == "streams_cycle":
        doc = {"query_id": _QID, "partition_id": "17", "consumer_group": f"streams.{tag}",
               "state_ops": [{"type": "upsert", "key": f"k{i}", "value": {"acc": i}}
                             for i in range(n)],
               "push_items": [{"queue": f"fz-{tag}.out", "partition": "p", "payload": {"n": 1}}],
               "ack": {"transactionId": "t", "leaseId": _QID, "status": "completed",
                       "count": n},
               "release_lease": True}
        return doc, [doc]
    if route == "eph_push":
        doc = {"queue": f"fz-{tag}", "partition": "p",
               "messages": [{"payload": {"n": i}} for i in range(n)]}
        return doc, [doc]
    if route == "eph_ack":
        doc = {"queue": f"fz-{tag}", "group": "g",
               "acks": [{"id": f"0123456789abcdef-1-{i}", "status": "completed"}
                        for i in range(n)]}
        return doc, [doc]
    if route == "eph_configure":
        options = {"maxLength": 10 * n, "policy": "reject", "ttlSeconds": 5}
        return {"queue": f"fz-{tag}", "options": options}, [options]
    raise AssertionError(route)


def refusal_cases(tag: str = "sweep") -> list[tuple[str, str, Any, bytes]]:
    """Every (route, field, bad value, body) of the issue 27 routes: a valid body of two
    parts with that one value in the first, for a deterministic sweep of ``_BAD_27``."""
    cases = []
    for route, bad in sorted(_BAD_27.items()):
        for field, values in sorted(bad.items()):
            for value in values:
                doc, parts = _doc_27(route, 2, tag)
                parts[0][field] = value
                cases.append((route, field, value, encode(doc)))
    return cases


def _break(draw: Any, target: dict[str, Any], bad: dict[str, list[Any]]) -> None:
    field = draw(st.sampled_from(sorted(bad)))
    target[field] = draw(st.sampled_from(bad[field]))


@st.composite
def refused_doc(draw: Any, route: str, tag: str = "r") -> bytes:
    """A valid body of ``route`` with exactly one change that the route must refuse."""
    n = draw(st.integers(1, 6))
    bad_at = draw(st.integers(0, n - 1))
    if route == "push":
        items = [_push_item(i, tag) for i in range(n)]
        _break(draw, items[bad_at], _BAD_ITEM)
        return encode({"items": items})
    if route == "kv":
        ops = [{"op": "put", "ns": f"fz-{tag}", "key": f"k{i}", "value": i, "forever": True}
               for i in range(n)]
        _break(draw, ops[bad_at], _BAD_KV)
        return encode({"operations": ops})
    if route == "timers":
        ops = [{"op": "schedule", "queue": f"fz-t-{tag}", "timerKey": f"k{i}",
                "payload": _B64, "delayMs": 30 * 86_400_000} for i in range(n)]
        _break(draw, ops[bad_at], _BAD_TIMER)
        return encode({"operations": ops})
    if route == "ack":
        acks = [{"transactionId": f"t{i}", "partitionId": str(i + 1), "status": "completed"}
                for i in range(n)]
        _break(draw, acks[bad_at], _BAD_ACK)
        return encode({"acknowledgments": acks, "consumerGroup": "g"})
    if route == "configure":
        doc: dict[str, Any] = {"queue": f"fz-c-{tag}", "options": {"leaseTime": 30}}
        if draw(st.booleans()):
            _break(draw, doc, _BAD_CONFIGURE)
        else:
            _break(draw, doc["options"], _BAD_OPTION)
        return encode(doc)
    if route == "transaction":
        # valid pushes, kv and timers; the one bad change lands in any of the three
        ops: list[Any] = [{"type": "push", "items": [_push_item(i, tag) for i in range(n)]}]
        kv = [{"op": "put", "ns": f"fz-{tag}", "key": f"k{i}", "value": i, "forever": True}
              for i in range(n)]
        timers = [{"op": "schedule", "queue": f"fz-t-{tag}", "timerKey": f"x{i}",
                   "payload": _B64, "delayMs": 30 * 86_400_000} for i in range(n)]
        where = draw(st.sampled_from(["push", "kv", "timers", "shape"]))
        if where == "push":
            _break(draw, ops[0]["items"][bad_at], _BAD_ITEM)
        elif where == "kv":
            _break(draw, kv[bad_at], _BAD_KV)
        elif where == "timers":
            _break(draw, timers[bad_at], _BAD_TIMER)
        else:
            ops.append(draw(st.sampled_from([{"type": "kv"}, {"type": None}, 5, [],
                                             {"type": "push", "items": []},
                                             {"type": "ack", "partitionId": "1"}])))
        return encode({"operations": ops, "kv": kv, "timers": timers})
    if route in _BAD_27:
        doc, parts = _doc_27(route, n, tag)
        _break(draw, parts[draw(st.integers(0, len(parts) - 1))], _BAD_27[route])
        return encode(doc)
    raise AssertionError(route)


REFUSED_ROUTES = {"push": "/api/v1/push", "kv": "/api/v1/kv", "timers": "/api/v1/timers",
                  "ack": "/api/v1/ack/batch", "configure": "/api/v1/configure",
                  "transaction": "/api/v1/transaction", "locks": "/api/v1/locks",
                  "traces": "/api/v1/traces", "fetch": "/api/v1/fetch",
                  "changed": "/api/v1/partitions/changed",
                  "streams_register": "/streams/v1/queries",
                  "streams_state": "/streams/v1/state/get", "streams_cycle": "/streams/v1/cycle",
                  "eph_push": "/api/v1/ephemeral/push", "eph_ack": "/api/v1/ephemeral/ack",
                  "eph_configure": "/api/v1/ephemeral/configure"}


# ------------------------------------------------------------------------- targets, queries
_SEGMENTS = ["%00", "a%00b", "%0A", "%0D%0A", "%1F", "%7F", "%FF", "%ED%A0%80", "%C0%AF", "..",
             ".", "%2E%2E", "%2F", "a%2Fb", "%25", "%", "%zz", "~", "x" * 300, "é",
             "%C3%A9" * 200, "__QUEUE_MODE__", "null", "-1", "0", "99999999999999999999",
             "0196f3a2-c000-7000-8000-000000000a0a", "a;b", "a,b", "a=b", "a+b", "*", "'", '"',
             "%22", "%27", "%5C", "\\", "a%20b", "%u0000", "9" * 19, "9" * 5000,
             "0" * 30 + "1"]


def hostile_segment() -> st.SearchStrategy[str]:
    """One path segment as it appears on the wire (ASCII, percent-escapes as given)."""
    vchar = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E,
                                  exclude_characters="/?#"), min_size=1, max_size=20)
    escaped = st.text(max_size=8).map(lambda t: quote(t, safe=""))
    long = st.integers(256, 6000).map(lambda n: "q" * n)
    return st.sampled_from(_SEGMENTS) | vchar | escaped.filter(bool) | long


_TEMPLATES = [
    "/api/v1/pop/queue/{}", "/api/v1/pop/queue/{}/partition/{}",
    "/api/v1/pop/queue/{}/partition/{}/{}", "/api/v1/lease/{}/extend",
    "/api/v1/consumer-groups/{}", "/api/v1/consumer-groups/{}/queues/{}",
    "/api/v1/consumer-groups/{}/queues/{}/seek", "/api/v1/consumer-groups/{}/subscription",
    "/api/v1/timers/{}", "/api/v1/timers/{}/{}", "/api/v1/timers/{}/{}/{}",
    "/api/v1/messages/{}/{}", "/api/v1/messages/{}/{}/retry", "/api/v1/resources/queues/{}",
    "/api/v1/resources/queues/{}/depth", "/api/v1/status/queues/{}", "/api/v1/{}", "/{}",
    "/api/v1/push/{}", "/health/{}",
    # issue 27's routes with path parameters
    "/api/v1/traces/{}/{}", "/api/v1/traces/by-name/{}", "/api/v1/traces/{}",
    "/api/v1/ephemeral/queue/{}", "/api/v1/ephemeral/queues/{}/depth",
    "/api/v1/ephemeral/{}", "/streams/v1/{}",
]


@st.composite
def hostile_target(draw: Any) -> tuple[str, str]:
    """(template, target): a route template with hostile segments (query not included)."""
    template = draw(st.sampled_from(_TEMPLATES))
    segments = [draw(hostile_segment()) for _ in range(template.count("{}"))]
    return template, template.format(*segments)


_QUERY_KEYS = ["batch", "wait", "timeout", "partitions", "consumerGroup", "autoAck", "frames",
               "subscriptionMode", "subscriptionFrom", "namespace", "task", "conflation",
               "autopilot", "queue", "partition", "from", "to", "limit", "offset",
               "minLagSeconds", "deleteMetadata", "status", "group", "search"]
_QUERY_VALUES = ["", "true", "false", "1", "0", "TRUE", "yes", "-1", "10001", "300001",
                 "99999999999999999999999", "1e3", "0x10", " 1", "1 ", "+1", "%D9%A1", "now",
                 "beginning", "2026-05-16T08:41:27.123Z", "2026-13-45T99:99:99Z", "null",
                 "%00", "%FF", "%ED%A0%80", "a%2Fb", "a+b", "x" * 300, "__QUEUE_MODE__",
                 "--5", "-", "-0", "00000000000000000000001", "-99999999999999999999999",
                 "9" * 5000, "-" + "9" * 5000, "0001-01-01T00:00:00%2B01:00",
                 "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00Z"]


@st.composite
def hostile_query(draw: Any) -> str:
    """A query string (without ``?``): known keys, hostile values, repeats, junk."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        key = draw(st.sampled_from(_QUERY_KEYS) | st.text(
            st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="&#="),
            max_size=6))
        value = draw(st.sampled_from(_QUERY_VALUES) | st.text(max_size=8).map(
            lambda t: quote(t, safe="")))
        parts.append(draw(st.sampled_from([f"{key}={value}", key, f"{key}=", f"={value}"])))
    return "&".join(parts)
