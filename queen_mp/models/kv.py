"""KV ops (docs/api.md 2.5 "KV ops"): validation and normalisation, shared by ``POST /api/v1/kv``
and the ``kv`` array of ``POST /api/v1/transaction``.

``parse_kv_ops(raw, in_transaction=...)`` checks every op before anything is applied and
returns the ops in the normalised form ``queen.kv_apply_v1`` (``sql/functions/kv.sql``) takes as is.
Every refusal is a ``RequestError`` (``queen_mp.models.errors``) carrying ``index`` (the op's
position in ``raw``), ``field`` when one field is at fault, ``reason`` (a stable id, below) and
``detail`` (readable text, the same as the message).

Normalised ops: plain dicts, every field of the kind present (``None`` when not given); unknown
request keys are dropped::

    {"op": "get",         "ns", "key"}
    {"op": "getMany",     "ns", "keys": [str, ...]}                 # 0..1000 keys
    {"op": "getPrefix",   "ns", "prefix": str, "after": str | None, "limit": int,
                          "keysOnly": bool}
    {"op": "put",         "ns", "key", "value": Any, "ttlSeconds": int | None,
                          "expect": int | None, "required": bool}
    {"op": "putIfAbsent", "ns", "key", "value": Any, "ttlSeconds": int | None, "required": bool}
    {"op": "delete",      "ns", "key", "expect": int | None, "required": bool}
    {"op": "check",       "ns", "key", "expect": int, "required": bool}
    {"op": "incr",        "ns", "key", "delta": int, "min": int | None, "max": int | None,
                          "ttlSeconds": int | None, "required": bool}

``ttlSeconds: None`` means ``forever: true`` (the request carried exactly one of the two).
``value`` may be JSON ``null`` (a legal value); an absent ``value`` is refused.

Rules (each a 400 ``invalid_request`` unless marked):

- an op is an object whose ``op`` is one of the eight kinds (``kv_unknown_op``);
- ``ns``: a string of 1..255 UTF-8 bytes, ``key`` (and each ``getMany`` key): 1..1024 bytes;
  empty or holding a control character (U+0000..U+001F, U+007F) is ``400 invalid_name``
  (``kv_bad_namespace`` / ``kv_bad_key``), longer is ``413 name_too_long``
  (``kv_namespace_too_long`` / ``kv_key_too_long``); ``/`` is allowed in both;
- writes (put, putIfAbsent, incr) carry exactly one of ``ttlSeconds`` (an integer
  1..2147483647) and ``forever: true`` (``kv_expiry_not_specified``; a bad ttlSeconds is
  ``kv_bad_ttl``); ``forever: false`` counts as not given; ``delete`` and ``check`` take none;
- ``expect``: an integer 0..2^63-1 (``kv_bad_expect``); ``"expect": null`` is refused, not
  read as "no expect" (a caller that wrote ``expect`` meant to fence); ``check`` requires it;
  ``putIfAbsent`` takes no ``expect`` other than 0 (it IS expect 0);
- ``required``: a boolean (``kv_bad_request``); ignored on reads;
- ``getMany``: ``keys`` an array of at most 1000 keys (``kv_too_many_keys``);
- ``getPrefix``: ``prefix`` a string (may be empty: the whole namespace; same byte limit and
  control-character rule as a key), ``after`` a string or null (an empty string = none),
  ``limit`` an integer >= 1, default 100, values above 1000 CLAMPED to 1000 (as pop ``batch``
  is; ``truncated``/``nextAfter`` tell the caller to page), below 1 ``kv_bad_limit``;
  ``keysOnly`` a boolean; inside a transaction ``getPrefix`` is refused
  (``kv_get_prefix_not_allowed_in_transaction``);
- ``incr``: ``delta`` an integer (``kv_bad_delta``), ``min``/``max`` integers with
  ``min <= max`` (``kv_bad_bounds``), all within int64;
- more than ``MAX_KV_OPS`` ops is ``kv_too_many_ops``; anything else of the wrong type is
  ``kv_bad_request``.

A JSON ``null`` in an optional field reads as "not given", except in ``expect``.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

import orjson

from queen_mp.models.errors import InvalidName, InvalidRequest, NameTooLong, RequestError

__all__ = [
    "MAX_GET_MANY_KEYS",
    "MAX_KV_KEY_BYTES",
    "MAX_KV_NS_BYTES",
    "MAX_KV_OPS",
    "MAX_PREFIX_LIMIT",
    "MAX_TTL_SECONDS",
    "READ_OPS",
    "WRITE_OPS",
    "parse_kv_ops",
]

MAX_KV_OPS = 100_000  # docs/api.md 1.7, ops per transaction
MAX_KV_NS_BYTES = 255
MAX_KV_KEY_BYTES = 1024
MAX_GET_MANY_KEYS = 1000
DEFAULT_PREFIX_LIMIT = 100
MAX_PREFIX_LIMIT = 1000
MAX_TTL_SECONDS = (1 << 31) - 1  # ~68 years: keeps now() + ttl a valid timestamptz
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

READ_OPS = frozenset({"get", "getMany", "getPrefix"})
WRITE_OPS = frozenset({"put", "putIfAbsent", "delete", "check", "incr"})
_KINDS = READ_OPS | WRITE_OPS
_EXPIRING = frozenset({"put", "putIfAbsent", "incr"})

_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _bad(reason: str, message: str, index: int | None, field: str | None = None,
         cls: type[RequestError] = InvalidRequest, **extra: Any) -> RequestError:
    return cls(message, index=index, field=field, reason=reason, detail=message, **extra)


def _text(raw: Any, field: str, index: int, *, limit: int, kind: str, present: bool = True,
          allow_empty: bool = False) -> str:
    """A namespace, key or prefix: a string within ``limit`` UTF-8 bytes, no control char."""
    if not isinstance(raw, str):
        what = "must be a string" if present else "is required"
        raise _bad("kv_bad_request", f"op at index {index}: {field} {what}", index, field)
    bad_reason = "kv_bad_namespace" if kind == "ns" else "kv_bad_key"
    if not raw and not allow_empty:
        raise _bad(bad_reason, f"op at index {index}: empty {field}", index, field, InvalidName)
    # PERF(kv): limit/4 characters are at most `limit` bytes; only longer ones pay for an encode.
    if len(raw) > limit // 4:
        size = len(raw.encode("utf-8", "surrogatepass"))
        if size > limit:
            too_long = "kv_namespace_too_long" if kind == "ns" else "kv_key_too_long"
            raise _bad(too_long, f"op at index {index}: {field} of {size} bytes, over {limit}",
                       index, field, NameTooLong, limit=limit)
    if _CONTROL.search(raw) is not None:
        raise _bad(bad_reason, f"op at index {index}: {field} contains a control character",
                   index, field, InvalidName)
    return raw


def _field(op: dict[str, Any], field: str, index: int, *, limit: int, kind: str,
           allow_empty: bool = False) -> str:
    return _text(op.get(field), field, index, limit=limit, kind=kind, present=field in op,
                 allow_empty=allow_empty)


def _int(op: dict[str, Any], field: str, index: int, reason: str, *, low: int,
         high: int) -> int | None:
    """An optional integer field within [low, high]; absent = None, null refused."""
    if field not in op:
        return None
    raw = op[field]
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _bad(reason, f"op at index {index}: {field} must be an integer", index, field)
    if not low <= raw <= high:
        raise _bad(reason, f"op at index {index}: {field} must be within {low}..{high}",
                   index, field)
    return raw


def _bool(op: dict[str, Any], field: str, index: int) -> bool:
    raw = op.get(field)
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise _bad("kv_bad_request", f"op at index {index}: {field} must be a boolean", index,
                   field)
    return raw


def _ttl(op: dict[str, Any], index: int) -> int | None:
    """Exactly one of ttlSeconds and forever: true; returns the ttl, None = forever."""
    forever = op.get("forever")
    if forever is not None and not isinstance(forever, bool):
        raise _bad("kv_expiry_not_specified", f"op at index {index}: forever must be true",
                   index, "forever")
    ttl = op.get("ttlSeconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)
                            or not 0 < ttl <= MAX_TTL_SECONDS):
        raise _bad("kv_bad_ttl", f"op at index {index}: ttlSeconds must be an integer in "
                   f"1..{MAX_TTL_SECONDS}", index, "ttlSeconds")
    if (ttl is None) == (not forever):
        got = "both" if ttl is not None else "neither"
        raise _bad("kv_expiry_not_specified", f"op at index {index}: exactly one of "
                   f"ttlSeconds (integer > 0) and forever: true is required, got {got}", index)
    return ttl


def _expect(op: dict[str, Any], index: int) -> int | None:
    if "expect" in op and op["expect"] is None:
        raise _bad("kv_bad_expect", f"op at index {index}: expect must be a version "
                   "(0 = must not exist), not null", index, "expect")
    return _int(op, "expect", index, "kv_bad_expect", low=0, high=_INT64_MAX)


def _value(value: Any, index: int) -> Any:
    """A value orjson can write (nesting up to 252 levels, integers within 64 bits: the
    transaction body reads big integers exactly) and jsonb can store (no NUL in a string)."""
    try:
        # NOTE(kv): inside the two levels the ops travel in (kv_procs, txn_procs: [{..}])
        text = orjson.dumps([{"value": value}])
    except orjson.JSONEncodeError:
        raise _bad("kv_bad_request", f"op at index {index}: value nested over 252 levels or "
                   "holding an integer beyond 64 bits", index, "value") from None
    # PERF(kv): walk the value only when its JSON text may hold an escaped NUL.
    if b"\\u0000" in text and _holds_nul(value):
        raise _bad("kv_bad_request", f"op at index {index}: value holds a NUL character "
                   "(\\u0000), which PostgreSQL jsonb refuses", index, "value")
    return value


def _holds_nul(value: Any) -> bool:
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return True
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return False


def _parse_one(op: Any, index: int, in_transaction: bool) -> dict[str, Any]:
    if not isinstance(op, dict):
        raise _bad("kv_bad_request", f"op at index {index} is not an object", index)
    kind = op.get("op")
    if not isinstance(kind, str) or kind not in _KINDS:
        # NOTE(kv): reprlib bounds depth and size; repr() of a deep array is a RecursionError
        raise _bad("kv_unknown_op", f"op at index {index}: unknown operation "
                   f"{reprlib.repr(kind)} (one of " + ", ".join(sorted(_KINDS)) + ")", index,
                   "op")
    ns = _field(op, "ns", index, limit=MAX_KV_NS_BYTES, kind="ns")

    if kind == "getMany":
        keys = op.get("keys")
        if not isinstance(keys, list):
            raise _bad("kv_bad_request", f"op at index {index}: keys must be an array", index,
                       "keys")
        if len(keys) > MAX_GET_MANY_KEYS:
            raise _bad("kv_too_many_keys", f"op at index {index}: {len(keys)} keys, over "
                       f"{MAX_GET_MANY_KEYS}", index, "keys")
        return {"op": kind, "ns": ns,
                "keys": [_text(k, "keys", index, limit=MAX_KV_KEY_BYTES, kind="key")
                         for k in keys]}

    if kind == "getPrefix":
        if in_transaction:
            raise _bad("kv_get_prefix_not_allowed_in_transaction", f"op at index {index}: "
                       "getPrefix is only available on POST /api/v1/kv", index, "op")
        prefix = _field(op, "prefix", index, limit=MAX_KV_KEY_BYTES, kind="key",
                        allow_empty=True)
        after = op.get("after")
        if after is not None and (not isinstance(after, str) or "\x00" in after):
            raise _bad("kv_bad_request", f"op at index {index}: after must be a string "
                       "without NUL", index, "after")
        limit = op.get("limit", DEFAULT_PREFIX_LIMIT)
        if limit is None:
            limit = DEFAULT_PREFIX_LIMIT
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _bad("kv_bad_limit", f"op at index {index}: limit must be an integer >= 1",
                       index, "limit")
        return {"op": kind, "ns": ns, "prefix": prefix, "after": after or None,
                "limit": min(limit, MAX_PREFIX_LIMIT), "keysOnly": _bool(op, "keysOnly", index)}

    key = _field(op, "key", index, limit=MAX_KV_KEY_BYTES, kind="key")
    if kind == "get":
        return {"op": kind, "ns": ns, "key": key}

    out: dict[str, Any] = {"op": kind, "ns": ns, "key": key}
    if kind in ("put", "putIfAbsent"):
        if "value" not in op:
            raise _bad("kv_bad_request", f"op at index {index}: {kind} needs a value "
                       "(null is a legal value, an absent one is not)", index, "value")
        out["value"] = _value(op["value"], index)
    if kind in _EXPIRING:
        out["ttlSeconds"] = _ttl(op, index)
    if kind in ("put", "delete", "check"):
        out["expect"] = _expect(op, index)
        if kind == "check" and out["expect"] is None:
            raise _bad("kv_bad_expect", f"op at index {index}: check needs expect", index,
                       "expect")
    elif kind == "putIfAbsent" and _expect(op, index) not in (None, 0):
        raise _bad("kv_bad_expect", f"op at index {index}: putIfAbsent is expect 0; another "
                   "expect contradicts it", index, "expect")
    if kind == "incr":
        if "delta" not in op:
            raise _bad("kv_bad_delta", f"op at index {index}: incr needs a delta", index,
                       "delta")
        out["delta"] = _int(op, "delta", index, "kv_bad_delta", low=_INT64_MIN,
                            high=_INT64_MAX)
        low = None if op.get("min") is None else _int(op, "min", index, "kv_bad_bounds",
                                                      low=_INT64_MIN, high=_INT64_MAX)
        high = None if op.get("max") is None else _int(op, "max", index, "kv_bad_bounds",
                                                       low=_INT64_MIN, high=_INT64_MAX)
        if low is not None and high is not None and low > high:
            raise _bad("kv_bad_bounds", f"op at index {index}: min {low} is above max {high}",
                       index, "min")
        out["min"] = low
        out["max"] = high
    out["required"] = _bool(op, "required", index)
    return out


def parse_kv_ops(raw: Any, *, in_transaction: bool) -> list[dict[str, Any]]:
    """Validate and normalise a KV op array (module docstring); raise on the first bad op."""
    if not isinstance(raw, list):
        raise _bad("kv_bad_request", "kv operations must be an array", None)
    if len(raw) > MAX_KV_OPS:
        raise _bad("kv_too_many_ops", f"{len(raw)} kv operations, over {MAX_KV_OPS}", None)
    return [_parse_one(op, i, in_transaction) for i, op in enumerate(raw)]
