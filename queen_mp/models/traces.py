"""A trace event (docs/api.md 2.13, ``POST /api/v1/traces``): the body, validated into a record.

Body (the queen-mq 2.6 consumer's ``msg.trace(...)`` sends exactly these)::

    {"transactionId": str, "partitionId": "17" | 17, "consumerGroup": str | null,
     "traceNames": [str, ...] | str | null, "eventType": str | null, "data": {...}}

Rules (400 ``invalid_request`` unless marked; ``field`` names the culprit):

- ``transactionId``: a non-empty string of at most 1024 UTF-8 bytes (over: ``413
  name_too_long``); ``partitionId``: a positive int64, as a decimal string or an integer;
- ``consumerGroup``: absent, null or empty = ``__QUEUE_MODE__`` (the literal is a plain group);
  else a group name (docs/api.md 1.7: ``400 invalid_name`` / ``413 name_too_long``);
- ``traceNames``: null/absent = none, a string = one name, else an array of at most
  ``MAX_TRACE_NAMES`` names, each a name of 1..255 bytes without control characters (``/``
  allowed); repeats are kept once;
- ``eventType``: null/absent = ``"info"``, else a string of 1..``MAX_EVENT_TYPE_BYTES`` bytes
  without control characters;
- ``data``: required, a JSON object whose JSON text is at most ``MAX_TRACE_DATA_BYTES``
  (over: ``413 body_too_large`` with ``limit``).

Unknown keys are ignored (``workerId`` and the like).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from queen_mp.db.trace_procs import TraceEvent
from queen_mp.models.errors import InvalidName, InvalidRequest, NameTooLong
from queen_mp.models.items import (
    QUEUE_MODE,
    parse_group,
    parse_partition_id,
    path_transaction_id,
)
from queen_mp.wire.binary_push import check_name
from queen_mp.wire.errors import BodyTooLarge

__all__ = [
    "MAX_EVENT_TYPE_BYTES",
    "MAX_TRACE_BODY_BYTES",
    "MAX_TRACE_DATA_BYTES",
    "MAX_TRACE_NAMES",
    "TraceEvent",
    "parse_trace",
]

MAX_TRACE_DATA_BYTES = 64 << 10
MAX_TRACE_NAMES = 32
MAX_EVENT_TYPE_BYTES = 64
#: the body as a whole: the data, 32 names, a transactionId and change
MAX_TRACE_BODY_BYTES = 128 << 10
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
#: \u0000 preceded by an even number of backslashes: an escaped NUL, not an escaped backslash
_ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _transaction_id(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise InvalidRequest("transactionId is required: a non-empty string",
                             field="transactionId")
    return path_transaction_id(raw)


def _group(raw: Any) -> str:
    if raw is None:
        return QUEUE_MODE
    if not isinstance(raw, str):
        raise InvalidRequest("consumerGroup must be a string or null", field="consumerGroup")
    return parse_group(raw)


def _names(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list):
        raise InvalidRequest("traceNames must be an array of strings, a string or null",
                             field="traceNames")
    if len(names) > MAX_TRACE_NAMES:
        raise InvalidRequest(f"{len(names)} traceNames, over {MAX_TRACE_NAMES}",
                             field="traceNames", limit=MAX_TRACE_NAMES)
    out: dict[str, None] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise InvalidRequest(f"traceNames[{i}] must be a string", field="traceNames",
                                 index=i)
        check_name(name, "traceNames", slash_ok=True, index=i)
        out[name] = None
    return tuple(out)


def _event_type(raw: Any) -> str:
    if raw is None:
        return "info"
    if not isinstance(raw, str) or not raw:
        raise InvalidRequest("eventType must be a non-empty string or null", field="eventType")
    if len(raw.encode("utf-8", "surrogatepass")) > MAX_EVENT_TYPE_BYTES:
        raise NameTooLong(f"eventType over {MAX_EVENT_TYPE_BYTES} bytes", field="eventType",
                          limit=MAX_EVENT_TYPE_BYTES)
    if _CONTROL.search(raw) is not None:
        raise InvalidName("eventType contains a control character", field="eventType")
    return raw


def _data(doc: dict[str, Any]) -> str:
    if "data" not in doc:
        raise InvalidRequest("data is required: a JSON object", field="data")
    data = doc["data"]
    if not isinstance(data, dict):
        raise InvalidRequest("data must be a JSON object", field="data")
    try:
        text = orjson.dumps(data)
    except orjson.JSONEncodeError:
        raise InvalidRequest("data nested too deeply or holding an integer beyond 64 bits",
                             field="data") from None
    if len(text) > MAX_TRACE_DATA_BYTES:
        raise BodyTooLarge(f"data of {len(text)} bytes of JSON, over {MAX_TRACE_DATA_BYTES}",
                           field="data", limit=MAX_TRACE_DATA_BYTES)
    if _ESCAPED_NUL.search(text) is not None:
        # NOTE(traces): PostgreSQL jsonb refuses NUL in a string (JSON text escapes it)
        raise InvalidRequest("data holds a NUL character (\\u0000), which PostgreSQL jsonb "
                             "refuses", field="data")
    return text.decode()


def parse_trace(doc: Any) -> TraceEvent:
    """The event of a decoded ``POST /api/v1/traces`` body (module docstring)."""
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    if doc.get("partitionId") is None:
        raise InvalidRequest("partitionId is required", field="partitionId")
    return TraceEvent(
        transaction_id=_transaction_id(doc.get("transactionId")),
        partition_id=parse_partition_id(doc["partitionId"], None),
        consumer_group=_group(doc.get("consumerGroup")),
        event_type=_event_type(doc.get("eventType")),
        data_json=_data(doc),
        names=_names(doc.get("traceNames")))
