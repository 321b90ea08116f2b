"""Lock ops (docs/api.md 2.14, ``POST /api/v1/locks``): validation and normalisation.

``parse_lock_ops(raw)`` checks every op of a call before anything is applied and returns them
in the normalised form ``queen.locks_apply_v1`` (``sql/functions/locks.sql``) takes as is, every
field present (``None`` when not given); unknown request keys are dropped::

    {"op": "acquire", "name", "ttlSeconds": int, "owner": str | None, "limit": int}
    {"op": "renew",   "name", "slot": int, "token": int, "ttlSeconds": int, "owner": str | None}
    {"op": "release", "name", "slot": int, "token": int}
    {"op": "get",     "name"}

Every refusal is a ``RequestError`` (``queen_mp.models.errors``) in the KV shape: ``index`` (the
op's position), ``field`` when one field is at fault, ``reason`` (a stable id) and ``detail``.
Rules (each a 400 ``invalid_request`` unless marked):

- an op is an object (``locks_bad_request``) whose ``op`` is acquire, renew, release or get
  (``locks_unknown_op``); a ``tenant``/``tenantId``/``_tenant`` field is refused
  (``locks_tenant_not_an_input``: the tenant is the caller's);
- ``name``: a string of 1..256 UTF-8 bytes without a control character or ``#`` (which sits
  between a name and its slot in the permit's key): ``400 invalid_name`` (``locks_bad_name``);
  longer is ``413 name_too_long`` (``locks_name_too_long``); one name per call
  (``locks_duplicate_in_call``);
- ``ttlSeconds`` (acquire, renew): required (``locks_ttl_required``; ``forever`` is refused
  the same way: a permit nobody can take back from a dead holder is not a lock), an integer
  1..2147483647 (``locks_bad_ttl``);
- ``owner``: absent/null, or a string of 1..256 UTF-8 bytes without a control character
  (``locks_bad_owner``);
- ``limit`` (acquire): absent/null = 1, else an integer 1..1024 (``locks_bad_limit``);
- ``token`` (renew, release): required (``locks_token_required``), an integer >= 1
  (``locks_bad_token``); ``slot``: absent/null = 0, else an integer 0..1023 (``locks_bad_slot``);
- at most ``MAX_LOCK_OPS`` ops (``locks_too_many_ops``), and the slots the acquires may try
  together at most ``MAX_LOCK_SLOTS`` (``locks_too_many_keys``).
"""

from __future__ import annotations

import re
from typing import Any

from queen_mp.models.errors import InvalidName, InvalidRequest, NameTooLong, RequestError
from queen_mp.models.kv import MAX_TTL_SECONDS

__all__ = [
    "LOCKS_NS",
    "MAX_LOCK_LIMIT",
    "MAX_LOCK_NAME_BYTES",
    "MAX_LOCK_OPS",
    "MAX_LOCK_SLOTS",
    "MAX_OWNER_BYTES",
    "parse_lock_ops",
]

LOCKS_NS = "queen-locks"  # the KV namespace of every permit
MAX_LOCK_OPS = 64
MAX_LOCK_LIMIT = 1024
MAX_LOCK_SLOTS = 4096
MAX_LOCK_NAME_BYTES = 256
MAX_OWNER_BYTES = 256
_INT64_MAX = (1 << 63) - 1
_KINDS = ("acquire", "renew", "release", "get")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _bad(reason: str, message: str, index: int | None, field: str | None = None,
         cls: type[RequestError] = InvalidRequest, **extra: Any) -> RequestError:
    return cls(message, index=index, field=field, reason=reason, detail=message, **extra)


def _name(op: dict[str, Any], index: int) -> str:
    name = op.get("name")
    rule = (f"op at index {index}: a lock's name is a non-empty string of at most "
            f"{MAX_LOCK_NAME_BYTES} bytes, without control characters and without '#'")
    if not isinstance(name, str) or not name:
        raise _bad("locks_bad_name", rule, index, "name", InvalidName)
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_LOCK_NAME_BYTES:
        raise _bad("locks_name_too_long", f"op at index {index}: name of {size} bytes, over "
                   f"{MAX_LOCK_NAME_BYTES}", index, "name", NameTooLong, limit=MAX_LOCK_NAME_BYTES)
    if "#" in name or _CONTROL.search(name) is not None:
        raise _bad("locks_bad_name", rule, index, "name", InvalidName)
    return name


def _integer(op: dict[str, Any], field: str, index: int, reason: str, low: int, high: int,
             default: int | None) -> int:
    raw = op.get(field)
    if raw is None and default is not None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise _bad(reason, f"op at index {index}: {field} must be an integer within "
                   f"{low}..{high}", index, field)
    return raw


def _ttl(op: dict[str, Any], index: int, kind: str) -> int:
    if "forever" in op or "ttlSeconds" not in op:
        raise _bad("locks_ttl_required", f"op at index {index}: {kind} needs ttlSeconds (an "
                   "integer above 0); a lock has no forever, a holder that needs longer renews",
                   index, "ttlSeconds")
    return _integer(op, "ttlSeconds", index, "locks_bad_ttl", 1, MAX_TTL_SECONDS, None)


def _owner(op: dict[str, Any], index: int) -> str | None:
    owner = op.get("owner")
    if owner is None:
        return None
    if not isinstance(owner, str) or not owner \
            or len(owner.encode("utf-8", "surrogatepass")) > MAX_OWNER_BYTES \
            or _CONTROL.search(owner) is not None:
        raise _bad("locks_bad_owner", f"op at index {index}: owner is a non-empty string of "
                   f"at most {MAX_OWNER_BYTES} bytes, without control characters", index,
                   "owner")
    return owner


def _token(op: dict[str, Any], index: int, kind: str) -> int:
    if "token" not in op:
        raise _bad("locks_token_required", f"op at index {index}: {kind} needs the token of "
                   "the permit (the one the last acquire or renew answered)", index, "token")
    return _integer(op, "token", index, "locks_bad_token", 1, _INT64_MAX, None)


def _parse_one(op: Any, index: int) -> dict[str, Any]:
    if not isinstance(op, dict):
        raise _bad("locks_bad_request", f"op at index {index} is not an object", index)
    kind = op.get("op")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise _bad("locks_unknown_op", f"op at index {index}: unknown operation; the four are "
                   "acquire, renew, release and get", index, "op")
    if any(k in op for k in ("tenant", "tenantId", "_tenant")):
        raise _bad("locks_tenant_not_an_input", f"op at index {index} carries a tenant field; "
                   "the tenant is the caller's", index)
    name = _name(op, index)
    if kind == "get":
        return {"op": kind, "name": name}
    if kind == "acquire":
        return {"op": kind, "name": name, "ttlSeconds": _ttl(op, index, kind),
                "owner": _owner(op, index),
                "limit": _integer(op, "limit", index, "locks_bad_limit", 1, MAX_LOCK_LIMIT, 1)}
    slot = _integer(op, "slot", index, "locks_bad_slot", 0, MAX_LOCK_LIMIT - 1, 0)
    if kind == "renew":
        return {"op": kind, "name": name, "slot": slot, "token": _token(op, index, kind),
                "ttlSeconds": _ttl(op, index, kind), "owner": _owner(op, index)}
    return {"op": kind, "name": name, "slot": slot, "token": _token(op, index, kind)}


def parse_lock_ops(raw: Any) -> list[dict[str, Any]]:
    """Validate and normalise the ``operations`` of a locks call (module docstring)."""
    if not isinstance(raw, list):
        raise _bad("locks_bad_request", 'the body must be {"operations": [op, ...]}', None,
                   "operations")
    if len(raw) > MAX_LOCK_OPS:
        raise _bad("locks_too_many_ops", f"{len(raw)} operations in one call, over "
                   f"{MAX_LOCK_OPS}", None, "operations", limit=MAX_LOCK_OPS)
    ops = [_parse_one(op, i) for i, op in enumerate(raw)]
    seen: set[str] = set()
    for i, op in enumerate(ops):
        if op["name"] in seen:
            raise _bad("locks_duplicate_in_call", f"op at index {i}: a lock may be named by "
                       "one operation per call", i, "name")
        seen.add(op["name"])
    slots = sum(op["limit"] if op["op"] == "acquire" else 1 for op in ops)
    if slots > MAX_LOCK_SLOTS:
        raise _bad("locks_too_many_keys", f"the call names {slots} permits, over "
                   f"{MAX_LOCK_SLOTS}", None, "operations", limit=MAX_LOCK_SLOTS)
    return ops
