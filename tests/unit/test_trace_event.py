"""queen_mp.models.traces: the body of ``POST /api/v1/traces`` validated into a TraceEvent
(docs/api.md 2.13), without a database."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from queen_mp.db.trace_procs import TraceEvent
from queen_mp.models.errors import RequestError
from queen_mp.models.traces import MAX_TRACE_DATA_BYTES, MAX_TRACE_NAMES, parse_trace
from queen_mp.wire.errors import WireError

BASE = {"transactionId": "t-1", "partitionId": "17", "data": {"k": 1}}


def body(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


def test_what_the_2_6_client_sends_and_the_defaults():
    got = parse_trace({"transactionId": "order-1", "partitionId": "17",
                       "consumerGroup": "__QUEUE_MODE__", "traceNames": ["a", "b/c", "a"],
                       "eventType": "step", "data": {"x": [1, None]}, "workerId": "ignored"})
    assert got == TraceEvent("order-1", 17, "__QUEUE_MODE__", "step", '{"x":[1,null]}',
                             ("a", "b/c"))
    plain = parse_trace(body(partitionId=17, consumerGroup=None, traceNames=None))
    assert (plain.consumer_group, plain.event_type, plain.names) == ("__QUEUE_MODE__", "info", ())
    assert parse_trace(body(consumerGroup="", traceNames="one")).names == ("one",)
    assert parse_trace(body(consumerGroup="billing")).consumer_group == "billing"


@pytest.mark.parametrize(("doc", "field", "code"), [
    ("text", None, "invalid_request"),
    ({**BASE, "transactionId": None}, "transactionId", "invalid_request"),
    ({**BASE, "transactionId": "é" * 513}, "transactionId", "name_too_long"),
    ({**BASE, "transactionId": "a\x00b"}, "transactionId", "invalid_request"),
    ({k: v for k, v in BASE.items() if k != "partitionId"}, "partitionId", "invalid_request"),
    ({**BASE, "partitionId": "0"}, "partitionId", "invalid_request"),
    ({**BASE, "partitionId": -3}, "partitionId", "invalid_request"),
    ({**BASE, "partitionId": 1.5}, "partitionId", "invalid_request"),
    ({k: v for k, v in BASE.items() if k != "data"}, "data", "invalid_request"),
    ({**BASE, "data": None}, "data", "invalid_request"),
    ({**BASE, "data": "s"}, "data", "invalid_request"),
    ({**BASE, "data": {"n": "\x00"}}, "data", "invalid_request"),
    ({**BASE, "consumerGroup": ["g"]}, "consumerGroup", "invalid_request"),
    ({**BASE, "consumerGroup": "a\x01"}, "consumerGroup", "invalid_name"),
    ({**BASE, "traceNames": {"a": 1}}, "traceNames", "invalid_request"),
    ({**BASE, "traceNames": ["ok", None]}, "traceNames", "invalid_request"),
    ({**BASE, "traceNames": ["a\x7f"]}, "traceNames", "invalid_name"),
    ({**BASE, "traceNames": ["n"] * (MAX_TRACE_NAMES + 1)}, "traceNames", "invalid_request"),
    ({**BASE, "eventType": ""}, "eventType", "invalid_request"),
    ({**BASE, "eventType": "a\nb"}, "eventType", "invalid_name"),
])
def test_refusals_name_the_field(doc, field, code):
    with pytest.raises((RequestError, WireError)) as info:
        parse_trace(doc)
    err = info.value
    assert err.code == code
    got = err.extra.get("field") if isinstance(err, RequestError) else err.field
    assert got == field


def test_data_size_is_bounded_and_an_escaped_backslash_is_not_a_nul():
    fits = {"x": "y" * (MAX_TRACE_DATA_BYTES - len(orjson.dumps({"x": ""})))}
    assert len(parse_trace(body(data=fits)).data_json) == MAX_TRACE_DATA_BYTES
    with pytest.raises(WireError) as info:
        parse_trace(body(data={**fits, "z": 1}))
    assert info.value.code == "body_too_large" and info.value.limit == MAX_TRACE_DATA_BYTES
    assert parse_trace(body(data={"s": "\\u0000"})).data_json == '{"s":"\\\\u0000"}'
