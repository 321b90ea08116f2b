"""Timer ops (docs/api.md 2.5 "Timer ops", 2.11): validation, normalisation and id minting.

``parse_timer_ops`` checks a client's ``timers`` / ``operations`` array completely before
anything touches the database and returns the **normalised** ops that ``queen.timer_apply_v1``
(queen_mp/sql/functions/timers.sql) takes; ``mint`` then fills the broker-minted fields. Both
``POST /api/v1/timers`` and ``POST /api/v1/transaction`` use them.

Normalised op (a plain dict, JSON-serialisable)::

    {"op": "schedule" | "reschedule", "queue": str, "timerKey": str, "partition": str,
     "payload": str,          # standard base64 (canonical, padded) of the bytes to store
     "payloadZstd": bool,     # payload is a zstd frame of the JSON bytes
     "delayMs": int,          # >= 0 (a negative delay means now)
     "txn": str | None}       # None = mint it
    {"op": "cancel", "queue": str, "timerKey": str, "txn": str | None}

After ``mint``: schedule/reschedule ops carry ``messageId`` (UUIDv7 text) and ``txn`` (the
message id text when absent); cancel ops are unchanged (their ``txn`` is only echoed).

Errors are ``queen_mp.wire.errors`` classes (400 ``invalid_request`` / ``invalid_name``, 413
``name_too_long`` / ``body_too_large``) with ``index`` = the op's position and ``field``; each
also carries ``reason``, the stable id of the KV/timer error shape (docs/api.md 1.4, 2.11), which
``to_dict`` adds together with ``detail`` (the text).
"""

from __future__ import annotations

import base64
import binascii
import reprlib
from typing import Any, ClassVar

import orjson

from queen_mp.wire import errors as we
from queen_mp.wire.binary_push import check_partition_name, check_queue_name
from queen_mp.wire.frames import MAX_TXN_BYTES, decompress_bounded
from queen_mp.wire.ids import uuid7_many, uuid_text

__all__ = [
    "DEFAULT_PARTITION",
    "MAX_DELAY_MS",
    "MAX_KEY_BYTES",
    "MAX_OPS",
    "OPS",
    "SERVER_OWNED",
    "TimerBodyTooLarge",
    "TimerInvalidName",
    "TimerInvalidRequest",
    "TimerNameTooLong",
    "check_queue",
    "check_timer_key",
    "mint",
    "parse_timer_ops",
    "payload_json",
    "queues_to_provision",
]

OPS = ("schedule", "reschedule", "cancel")
DEFAULT_PARTITION = "Default"
MAX_OPS = 100_000  # docs/api.md 1.7: ops per transaction
MAX_KEY_BYTES = 1024  # docs/api.md 1.7: timer key
# NOTE(timers): about 100 years; keeps now() + delay far inside PostgreSQL's timestamp range.
MAX_DELAY_MS = 100 * 366 * 86_400_000
DEFAULT_MAX_DECOMPRESSED = 256 << 20  # QUEEN_MAX_DECOMPRESSED_MB's default
# docs/api.md 2.5: fields the broker owns; also any key starting with "tenant" or "_".
SERVER_OWNED = frozenset({"producerSub", "messageId", "deliverAt", "attempts"})


class _Reasoned:
    """Mixin: a stable ``reason`` id next to the wire error's code (KV/timer error shape)."""

    default_reason: ClassVar[str] = "invalid_request"

    def _init_reason(self, reason: str | None) -> None:
        self.reason = reason or self.default_reason

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()  # type: ignore[misc]
        body["reason"] = self.reason
        body["detail"] = self.message  # type: ignore[attr-defined]
        return body


class TimerInvalidRequest(_Reasoned, we.InvalidRequest):
    def __init__(self, message: str, *, reason: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self._init_reason(reason)


class TimerInvalidName(_Reasoned, we.InvalidName):
    default_reason = "invalid_name"

    def __init__(self, message: str, *, reason: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self._init_reason(reason)


class TimerNameTooLong(_Reasoned, we.NameTooLong):
    default_reason = "name_too_long"

    def __init__(self, message: str, *, reason: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self._init_reason(reason)


class TimerBodyTooLarge(_Reasoned, we.BodyTooLarge):
    default_reason = "payload_too_large"

    def __init__(self, message: str, *, reason: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self._init_reason(reason)


def _where(i: int | None) -> str:
    return "" if i is None else f"timer op {i}: "


def _bad(i: int | None, message: str, reason: str, field: str | None = None
         ) -> TimerInvalidRequest:
    return TimerInvalidRequest(f"{_where(i)}{message}", reason=reason, index=i, field=field)


def _text_bytes(i: int | None, value: str, field: str) -> int:
    """UTF-8 size of a text field; lone surrogates and NUL (PostgreSQL text) are refused."""
    if "\x00" in value:
        raise _bad(i, f"{field} contains a NUL character", "invalid_text", field)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _bad(i, f"{field} is not valid UTF-8 text", "invalid_text", field) from None


def _check_name(i: int | None, value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _bad(i, f"'{field}' must be a string", "wrong_type", field)
    try:
        if field == "queue":
            check_queue_name(value, index=i)
        else:
            check_partition_name(value, index=i)
    except we.NameTooLong as ex:
        raise TimerNameTooLong(f"{_where(i)}{ex.message}", index=i, field=field,
                               limit=ex.limit) from None
    except we.WireError as ex:
        raise TimerInvalidName(f"{_where(i)}{ex.message}", index=i, field=field) from None
    _text_bytes(i, value, field)
    return value


def _check_key(i: int | None, value: Any) -> str:
    if not isinstance(value, str):
        raise _bad(i, "'timerKey' must be a string", "wrong_type" if value is not None
                   else "missing_field", "timerKey")
    if not value:
        raise _bad(i, "empty timerKey", "missing_field", "timerKey")
    size = _text_bytes(i, value, "timerKey")
    if size > MAX_KEY_BYTES:
        raise TimerNameTooLong(f"{_where(i)}timerKey of {size} bytes, over {MAX_KEY_BYTES}",
                               reason="key_too_long", index=i, field="timerKey",
                               limit=MAX_KEY_BYTES)
    return value


def _check_txn(i: int, value: Any) -> str | None:
    """None or "" = mint it (docs/api.md 1.3)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _bad(i, "'txn' must be a string", "wrong_type", "txn")
    size = _text_bytes(i, value, "txn")
    if size > MAX_TXN_BYTES:
        raise TimerNameTooLong(f"timer op {i}: txn of {size} bytes, over {MAX_TXN_BYTES}",
                               reason="txn_too_long", index=i, field="txn",
                               limit=MAX_TXN_BYTES)
    return value


def _check_delay(i: int, value: Any) -> int:
    if value is None:
        raise _bad(i, "'delayMs' is required", "missing_field", "delayMs")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(i, "'delayMs' must be an integer (milliseconds)", "wrong_type", "delayMs")
    if value > MAX_DELAY_MS:
        raise _bad(i, f"'delayMs' {value} is over {MAX_DELAY_MS}", "out_of_range", "delayMs")
    return max(0, value)


def payload_json(stored: bytes, zstd: bool, max_decompressed: int) -> bytes:
    """The JSON bytes of a stored timer payload (decompressed if ``zstd``); raises WireError."""
    raw = decompress_bounded(stored, max_decompressed) if zstd else stored
    if raw:
        orjson.loads(raw)
    return raw


def _check_payload(i: int, value: Any, zstd: bool, max_decompressed: int) -> str:
    if value is None:
        raise _bad(i, "'payload' is required (base64 of the JSON bytes)", "missing_field",
                   "payload")
    if not isinstance(value, str):
        raise _bad(i, "'payload' must be a base64 string", "wrong_type", "payload")
    try:
        stored = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise _bad(i, "'payload' is not valid base64", "invalid_base64", "payload") from None
    try:
        payload_json(stored, zstd, max_decompressed)
    except we.BodyTooLarge as ex:
        raise TimerBodyTooLarge(f"timer op {i}: payload {ex.message}", index=i,
                                field="payload", limit=ex.limit) from None
    except we.WireError as ex:
        raise _bad(i, f"'payload' is not a valid zstd frame: {ex.message}", "invalid_zstd",
                   "payload") from None
    except orjson.JSONDecodeError as ex:
        what = "decompressed payload" if zstd else "payload"
        raise _bad(i, f"{what} is not JSON text: {ex}", "invalid_payload", "payload") from None
    # NOTE(timers): canonical form, so that PostgreSQL's decode(..., 'base64') reads it as-is.
    return base64.b64encode(stored).decode("ascii")


def _parse_op(i: int, raw: Any, max_decompressed: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _bad(i, "must be an object", "not_an_object")
    for name in raw:
        if name in SERVER_OWNED or name.startswith(("tenant", "_")):
            raise _bad(i, f"'{name}' is set by the server", "server_owned_field", name)
    kind = raw.get("op")
    if kind not in OPS:
        what = "missing" if kind is None else reprlib.repr(kind)
        raise _bad(i, f"'op' {what}: must be schedule, reschedule or cancel", "unknown_op",
                   "op")
    queue = raw.get("queue")
    if queue is None:
        raise _bad(i, "'queue' is required", "missing_field", "queue")
    op: dict[str, Any] = {"op": kind, "queue": _check_name(i, queue, "queue"),
                          "timerKey": _check_key(i, raw.get("timerKey"))}
    if kind == "cancel":
        op["txn"] = _check_txn(i, raw.get("txn"))
        return op
    partition = raw.get("partition")
    if partition is None or partition == "":
        partition = DEFAULT_PARTITION
    else:
        _check_name(i, partition, "partition")
    zstd = raw.get("payloadZstd", False)
    if zstd is None:
        zstd = False
    if not isinstance(zstd, bool):
        raise _bad(i, "'payloadZstd' must be a boolean", "wrong_type", "payloadZstd")
    op["partition"] = partition
    op["payload"] = _check_payload(i, raw.get("payload"), zstd, max_decompressed)
    op["payloadZstd"] = zstd
    op["delayMs"] = _check_delay(i, raw.get("delayMs"))
    op["txn"] = _check_txn(i, raw.get("txn"))
    return op


def parse_timer_ops(raw: Any, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED
                    ) -> list[dict[str, Any]]:
    """Validate a list of client timer ops; the normalised ops, in order (module docstring).

    ``max_decompressed`` bounds one zstd payload (QUEEN_MAX_DECOMPRESSED_MB).
    """
    if not isinstance(raw, list):
        raise TimerInvalidRequest("timer ops must be an array", reason="wrong_type")
    if len(raw) > MAX_OPS:
        raise TimerInvalidRequest(f"{len(raw)} timer ops, over the {MAX_OPS} limit",
                                  reason="too_many_ops", limit=MAX_OPS)
    return [_parse_op(i, op, max_decompressed) for i, op in enumerate(raw)]


def mint(ops: list[dict[str, Any]], producer_sub: str | None = None
         ) -> list[dict[str, Any]]:
    """Copies of ``ops`` with ``messageId`` (UUIDv7 text) and a default ``txn`` filled in on
    schedule / reschedule ops (cancel ops are copied unchanged); with ``producer_sub`` (the
    scheduling request's token subject) those also get ``producerSub``, which the timer's
    message carries when it fires (a client cannot send it: ``SERVER_OWNED``)."""
    writes = sum(1 for op in ops if op["op"] != "cancel")
    ids = iter(uuid7_many(writes))
    out: list[dict[str, Any]] = []
    for op in ops:
        op = dict(op)
        if op["op"] != "cancel":
            mid = uuid_text(next(ids))
            op["messageId"] = mid
            if not op.get("txn"):
                op["txn"] = mid
            if producer_sub is not None:
                op["producerSub"] = producer_sub
        out.append(op)
    return out


def check_queue(queue: str) -> str:
    """A queue name given outside an op (a route's path): the rules of ``queue`` in an op."""
    return _check_name(None, queue, "queue")


def check_timer_key(key: str) -> str:
    """A timer key given outside an op (a route's path): 1..1024 UTF-8 bytes, no NUL."""
    return _check_key(None, key)


def queues_to_provision(ops: list[dict[str, Any]]) -> list[str]:
    """The queues that scheduling creates (docs/api.md 1.9): those of schedule ops, sorted."""
    return sorted({op["queue"] for op in ops if op["op"] == "schedule"})
