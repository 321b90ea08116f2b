"""Ephemeral queue requests (docs/api.md "Ephemeral queues"): validated, free of HTTP.

Every body of ``/api/v1/ephemeral/*`` is checked completely here, before anything reaches
PostgreSQL, and becomes a frozen record. A refusal is a ``queen_mp.models.errors`` class (400
``invalid_request`` / ``invalid_name``, 413 ``name_too_long``) naming the field, and the
limits are the module constants below. The defaults of an option that is not given live in one
place, ``queen.eph_defaults_v1`` (sql/functions/ephemeral.sql).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from queen_mp.models.errors import InvalidRequest, RequestError
from queen_mp.models.items import dumps_json
from queen_mp.wire.binary_push import check_name, check_partition_name, check_queue_name

__all__ = [
    "ACK_STATUSES",
    "DEFAULT_PARTITION",
    "MAX_ACKS",
    "MAX_BATCH",
    "MAX_ID_CHARS",
    "MAX_LIST",
    "MAX_MESSAGES",
    "MAX_TIMEOUT_MS",
    "OPTION_LIMITS",
    "POLICIES",
    "QUEUE_MODE",
    "Ack",
    "Configure",
    "PopRequest",
    "Push",
    "Window",
    "parse_ack",
    "parse_configure",
    "parse_id",
    "parse_options",
    "parse_push",
    "parse_queue_body",
    "pop_request",
]

DEFAULT_PARTITION = "Default"  # a push without a partition, as on durable queues
QUEUE_MODE = "__QUEUE_MODE__"  # the group of a pop (and ack) without one
MAX_MESSAGES = 10_000  # messages per push
MAX_ACKS = 10_000  # ids per ack
MAX_BATCH = 10_000  # a pop's batch
MAX_TIMEOUT_MS = 300_000  # a pop's long-poll timeout
MAX_LIST = 1_000  # queues listed, partitions and groups in a depth answer
MAX_ID_CHARS = 64  # an ack's id (the broker's are ~40)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
POLICIES = ("reject", "dropOldest")
ACK_STATUSES = ("completed", "failed", "retry")
_STATUSES = frozenset(ACK_STATUSES)
#: option -> (minimum, maximum) of the integer options; 0 on maxBytes, maxLength and
#: leaseSeconds means "the default", on ttlSeconds "no age limit", on retryLimit "never
#: redeliver".
OPTION_LIMITS: dict[str, tuple[int, int]] = {
    "maxBytes": (0, 1 << 30),
    "maxLength": (0, 10_000_000),
    "ttlSeconds": (0, 30 * 86_400),
    "leaseSeconds": (0, 86_400),
    "retryLimit": (0, 1_000),
}
_WINDOW_LIMITS = {"ms": (0, 60_000), "count": (0, MAX_BATCH)}
_ZERO_IS_DEFAULT = frozenset({"maxBytes", "maxLength", "leaseSeconds"})
_OPTIONS = (*OPTION_LIMITS, "policy", "windowBuffer")


@dataclass(frozen=True, slots=True)
class Window:
    """A waiting pop that got something keeps waiting up to ``ms`` for ``count`` messages."""

    ms: int = 0
    count: int = 0

    @property
    def enabled(self) -> bool:
        return self.ms > 0 or self.count > 0

    def ready(self, held: int, batch: int, waited_ms: float) -> bool:
        """Whether a pop holding ``held`` messages (for ``waited_ms``) answers now."""
        if held <= 0:
            return False
        if held >= batch or not self.enabled:
            return True
        if self.count and held >= self.count:
            return True
        return bool(self.ms) and waited_ms >= self.ms


@dataclass(frozen=True, slots=True)
class Configure:
    queue: str
    options: dict[str, Any]  # validated, only what was given (0 = default dropped)


@dataclass(frozen=True, slots=True)
class Push:
    queue: str
    partition: str
    payloads: tuple[str, ...]  # each the JSON text of one payload


@dataclass(frozen=True, slots=True)
class PopRequest:
    queue: str
    partition: str | None  # None: any partition
    group: str  # QUEUE_MODE without one
    batch: int
    wait: bool
    timeout_ms: int
    auto_ack: bool


@dataclass(frozen=True, slots=True)
class Ack:
    queue: str
    group: str
    ids: tuple[str, ...]
    statuses: tuple[str, ...]  # one of ACK_STATUSES per id
    # each id's parts as ``parse_id`` reads them, the seq and delivery as their decimal digits
    # (they go to PostgreSQL as text: Python's int() of each cost an ack of 100 a fifth of
    # its parse); '' where the id is not a message id
    epochs: tuple[str, ...]
    seqs: tuple[str, ...]
    deliveries: tuple[str, ...]


_HEX = frozenset("0123456789abcdef")


def parse_id(message_id: str) -> tuple[str, int, int] | None:
    """A message id ``<epoch>-<seq>-<dlv>`` as minted by ``queen.eph_pop_v5`` (the queue's
    incarnation: 16 lowercase hex digits; the message and its delivery: 1 to 18 decimal
    digits each), or None when it is not one."""
    # PERF(eph): str methods, not a regular expression: 0.5 us an id against 1.5 (timeit)
    parts = message_id.split("-")
    if len(parts) != 3:
        return None
    epoch, seq, dlv = parts
    if (len(epoch) != 16 or not _HEX.issuperset(epoch) or not 0 < len(seq) <= 18
            or not 0 < len(dlv) <= 18 or not (seq + dlv).isascii()
            or not seq.isdigit() or not dlv.isdigit()):
        return None
    return epoch, int(seq), int(dlv)


def _object(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InvalidRequest(f"the body must be a JSON object {what}")
    return doc


def _queue(doc: dict[str, Any]) -> str:
    queue = doc.get("queue")
    if not isinstance(queue, str):
        raise InvalidRequest("queue is required (a string)", field="queue")
    check_queue_name(queue)
    return queue


def _integer(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{field} must be an integer", field=field)
    if not low <= value <= high:
        raise InvalidRequest(f"{field} must be between {low} and {high}, got {value}",
                             field=field, limit=high)
    return value


def _window(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise InvalidRequest("windowBuffer must be an object {ms?, count?}",
                             field="windowBuffer")
    unknown = sorted(set(raw) - set(_WINDOW_LIMITS))
    if unknown:
        raise InvalidRequest(f"unknown windowBuffer field(s) {', '.join(unknown)} "
                             "(known: ms, count)", field="windowBuffer")
    out = {}
    for key, (low, high) in _WINDOW_LIMITS.items():
        value = raw.get(key)
        out[key] = 0 if value is None else _integer(value, f"windowBuffer.{key}", low, high)
    return out


def parse_options(raw: Any) -> dict[str, Any]:
    """The closed option list: an unknown option is refused, never ignored."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequest("options must be an object", field="options")
    unknown = sorted(set(raw) - set(_OPTIONS))
    if unknown:
        raise InvalidRequest(f"unknown option(s) {', '.join(unknown)}; the ephemeral options "
                             f"are {', '.join(_OPTIONS)}", field="options")
    out: dict[str, Any] = {}
    for key, (low, high) in OPTION_LIMITS.items():
        value = raw.get(key)
        if value is None:
            continue
        value = _integer(value, key, low, high)
        if value == 0 and key in _ZERO_IS_DEFAULT:
            continue
        out[key] = value
    policy = raw.get("policy")
    if policy is not None:
        if policy not in POLICIES:
            raise InvalidRequest(f"policy must be one of {', '.join(POLICIES)}",
                                 field="policy")
        out["policy"] = policy
    if raw.get("windowBuffer") is not None:
        out["windowBuffer"] = _window(raw["windowBuffer"])
    return out


def parse_configure(doc: Any) -> Configure:
    doc = _object(doc, '{"queue", "options"}')
    unknown = sorted(set(doc) - {"queue", "options"})
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}", field=unknown[0])
    return Configure(_queue(doc), parse_options(doc.get("options")))


def parse_queue_body(doc: Any) -> str:
    """``{"queue"}`` (reset)."""
    return _queue(_object(doc, '{"queue"}'))


def parse_push(doc: Any) -> Push:
    doc = _object(doc, '{"queue", "partition"?, "messages": [{"payload"}]}')
    queue = _queue(doc)
    partition = doc.get("partition")
    if partition is None:
        partition = DEFAULT_PARTITION
    elif not isinstance(partition, str):
        raise InvalidRequest("partition must be a string", field="partition")
    else:
        check_partition_name(partition)
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages must be an array of {payload}", field="messages")
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequest(f"{len(messages)} messages, over {MAX_MESSAGES} per push",
                             field="messages", limit=MAX_MESSAGES)
    payloads = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "payload" not in message:
            raise InvalidRequest(f"message {i} must be an object with a payload",
                                 field="messages", index=i)
        if len(message) != 1:
            extra = sorted(k for k in message if k != "payload")
            raise InvalidRequest(f"message {i}: unknown field(s) {', '.join(extra)} (an "
                                 "ephemeral message is {payload})", field="messages", index=i)
        try:
            payloads.append(dumps_json(message["payload"]).decode())
        except RequestError as ex:  # nested deeper than a JSON writer can go
            raise InvalidRequest(f"message {i}: {ex.message}", field="messages",
                                 index=i) from None
    return Push(queue, partition, tuple(payloads))


def pop_request(queue: str | None, partition: str | None, group: str | None, batch: int,
                wait: bool, timeout_ms: int, auto_ack: bool) -> PopRequest:
    """A pop's parameters, already read from the query string (names checked here)."""
    if not queue:
        raise InvalidRequest("queue is required", field="queue")
    check_queue_name(queue)
    if partition:
        check_partition_name(partition)
    if group:
        check_name(group, "group")
    if not 1 <= batch <= MAX_BATCH:
        raise InvalidRequest(f"batch must be between 1 and {MAX_BATCH}", field="batch",
                             limit=MAX_BATCH)
    if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise InvalidRequest(f"timeout must be between 0 and {MAX_TIMEOUT_MS} ms",
                             field="timeout", limit=MAX_TIMEOUT_MS)
    return PopRequest(queue, partition or None, group or QUEUE_MODE, batch, wait, timeout_ms,
                      auto_ack)


def parse_ack(doc: Any) -> Ack:
    doc = _object(doc, '{"queue", "group"?, "acks": [{"id", "status"?, "error"?}]}')
    queue = _queue(doc)
    group = doc.get("group")
    if group is None or group == "":
        group = QUEUE_MODE
    elif not isinstance(group, str):
        raise InvalidRequest("group must be a string", field="group")
    else:
        check_name(group, "group")
    acks = doc.get("acks")
    if not isinstance(acks, list):
        raise InvalidRequest("acks must be an array of {id, status?, error?}", field="acks")
    if len(acks) > MAX_ACKS:
        raise InvalidRequest(f"{len(acks)} acks, over {MAX_ACKS} per call", field="acks",
                             limit=MAX_ACKS)
    return Ack(queue, group, *(_our_acks(acks) or _acks(acks)))


_Parsed = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...],
                tuple[str, ...]]


def _our_acks(acks: list[Any]) -> _Parsed | None:
    """The usual acks, every id one of ours (a delivery's, as popped), parsed a list at a time;
    None when any is not (``_acks`` then reads them one by one, and says what is wrong).

    PERF(eph): ``_acks`` took 12.3k instructions an ack of 100 such (callgrind), a third of
    the front worker's CPU of the ack route past the sockets; the ids are split as one string
    here, so Python runs no code per id."""
    n = len(acks)
    try:
        ids = [a["id"] for a in acks]
        parts = "-".join(ids).split("-")
    except (TypeError, KeyError):  # not an object, no id, or an id that is not a string
        return None
    # each id has exactly two dashes: with its neighbours' it could split into 3n parts as well
    if not n or len(parts) != 3 * n or list(map(str.count, ids, repeat("-"))).count(2) != n:
        return None
    epochs, seqs, dlvs = parts[0::3], parts[1::3], parts[2::3]
    digits = "".join(seqs) + "".join(dlvs)
    sizes = [*map(len, seqs), *map(len, dlvs)]
    if (not all(len(e) == 16 and _HEX.issuperset(e) for e in set(epochs))
            or not (digits.isascii() and digits.isdigit()) or min(sizes) < 1
            or max(sizes) > 18):
        return None
    if list(map(len, acks)).count(1) == n:  # {id} each: completed
        statuses: tuple[str, ...] = ("completed",) * n
    else:
        statuses = tuple([a.get("status", "completed") for a in acks])
        if (not _STATUSES.issuperset(statuses)
                or not all(isinstance(a.get("error", ""), str) for a in acks)):
            return None
    return tuple(ids), statuses, tuple(epochs), tuple(seqs), tuple(dlvs)


def _acks(acks: list[Any]) -> _Parsed:
    ids: list[str] = []
    statuses: list[str] = []
    epochs: list[str] = []
    seqs: list[str] = []
    deliveries: list[str] = []
    for i, ack in enumerate(acks):
        if not isinstance(ack, dict):
            raise InvalidRequest(f"ack {i} must be an object with a non-empty string id",
                                 field="acks", index=i)
        mid = ack.get("id")
        parsed = parse_id(mid) if isinstance(mid, str) else None
        if parsed is None:  # one of ours has neither control characters nor 64 of them
            if not isinstance(mid, str) or not mid:
                raise InvalidRequest(f"ack {i} must be an object with a non-empty string id",
                                     field="acks", index=i)
            if len(mid) > MAX_ID_CHARS:
                raise InvalidRequest(f"ack {i}: id over {MAX_ID_CHARS} characters",
                                     field="acks", index=i, limit=MAX_ID_CHARS)
            if _CONTROL.search(mid) is not None:
                raise InvalidRequest(f"ack {i}: id has a control character", field="acks",
                                     index=i)
            epochs.append("")
            seqs.append("")
            deliveries.append("")
        else:
            epochs.append(parsed[0])
            seqs.append(str(parsed[1]))
            deliveries.append(str(parsed[2]))
        status = ack.get("status")
        if status is None:
            status = "completed"
        if status not in ACK_STATUSES:
            raise InvalidRequest(f"ack {i}: status must be one of {', '.join(ACK_STATUSES)}",
                                 field="acks", index=i)
        error = ack.get("error")
        if error is not None and not isinstance(error, str):
            raise InvalidRequest(f"ack {i}: error must be a string", field="acks", index=i)
        ids.append(mid)
        statuses.append(status)
    return tuple(ids), tuple(statuses), tuple(epochs), tuple(seqs), tuple(deliveries)
