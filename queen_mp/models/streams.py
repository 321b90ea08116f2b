"""The Streams SDK's bodies (docs/api.md "Streams"; client-contract.md 1.11), parsed into frozen
records before anything runs: every 4xx of the three routes is decided here.

The keys are snake_case, as the SDK sends them. ``parse_register`` -> ``RegisterRequest``,
``parse_state_get`` -> ``StateGetRequest``, ``parse_cycle`` -> ``CycleRequest``. Unknown keys are
ignored (docs/api.md 1.2).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from queen_mp.models.errors import InvalidRequest, InvalidStatus, NameTooLong
from queen_mp.models.items import (
    MAX_ITEMS,
    PushItem,
    dumps_json,
    loads_json,
    parse_group,
    parse_json_item,
    parse_partition_id,
)
from queen_mp.wire.binary_push import check_name, check_queue_name
from queen_mp.wire.frames import MAX_TXN_BYTES
from queen_mp.wire.hashing import txn_hash

__all__ = [
    "MAX_STATE_KEYS",
    "MAX_STATE_KEY_BYTES",
    "MAX_STATE_ROWS",
    "CycleAckSpec",
    "CycleRequest",
    "RegisterRequest",
    "StateGetRequest",
    "parse_cycle",
    "parse_register",
    "parse_state_get",
]

MAX_STATE_KEY_BYTES = 1024  # as a KV key (docs/api.md 1.7)
MAX_STATE_KEYS = 10_000  # keys of one state read
MAX_STATE_ROWS = 100_000  # rows one state read answers (then "truncated": true)
_MAX_HASH_BYTES = 255


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    name: str
    source_queue: str
    sink_queue: str | None
    config_hash: str
    reset: bool


@dataclass(frozen=True, slots=True)
class StateGetRequest:
    query_id: uuid.UUID
    partition_id: int
    keys: tuple[str, ...]  # empty = every key
    key_prefix: str | None
    ripe_at_or_before: float | None  # epoch ms: only rows whose value.windowEnd <= it


@dataclass(frozen=True, slots=True)
class CycleAckSpec:
    """The source ack: every message of the batch through ``transaction_id``."""

    transaction_id: str
    lease_id: uuid.UUID
    count: int


@dataclass(frozen=True, slots=True)
class CycleRequest:
    query_id: uuid.UUID
    partition_id: int
    consumer_group: str
    state_ops: tuple[dict[str, Any], ...]  # {"type", "key", "value"?}, normalised
    state_ops_json: str  # the same, as the JSON text SQL takes
    push_items: tuple[PushItem, ...]
    ack: CycleAckSpec | None
    release_lease: bool


def _doc(body: bytes) -> dict[str, Any]:
    try:
        doc = loads_json(body) if body else None
    except (orjson.JSONDecodeError, ValueError) as ex:
        raise InvalidRequest(f"body is not valid JSON: {ex}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("body must be a JSON object")
    return doc


def _string(doc: dict[str, Any], field: str, *, required: bool = True) -> str | None:
    value = doc.get(field)
    if value is None or value == "":
        if required:
            raise InvalidRequest(f"{field} is required (a non-empty string)", field=field)
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{field} must be a string", field=field)
    return value


def _bool(doc: dict[str, Any], field: str, default: bool) -> bool:
    value = doc.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{field} must be true or false", field=field)
    return value


def _query_id(doc: dict[str, Any]) -> uuid.UUID:
    text = _string(doc, "query_id")
    try:
        return uuid.UUID(text)
    except (TypeError, ValueError):
        raise InvalidRequest("query_id must be the query id that registration answered "
                             "(a UUID)", field="query_id") from None


def _partition_id(doc: dict[str, Any]) -> int:
    if doc.get("partition_id") is None:
        raise InvalidRequest("partition_id is required", field="partition_id")
    try:
        return parse_partition_id(doc["partition_id"], 0)
    except InvalidRequest as ex:
        raise InvalidRequest(ex.message.replace("partitionId", "partition_id"),
                             field="partition_id") from None


def _state_key(key: Any, field: str, index: int | None = None) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidRequest(f"{field} must be a non-empty string", field=field, index=index)
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRequest(f"{field} holds a lone surrogate", field=field,
                             index=index) from None
    if size > MAX_STATE_KEY_BYTES:
        raise NameTooLong(f"{field} of {size} bytes, over {MAX_STATE_KEY_BYTES}", field=field,
                          limit=MAX_STATE_KEY_BYTES, index=index)
    if "\x00" in key:  # PostgreSQL text cannot hold it
        raise InvalidRequest(f"{field} contains a NUL character", field=field, index=index)
    return key


def parse_register(body: bytes) -> RegisterRequest:
    """``POST /streams/v1/queries``: name, source_queue, config_hash, sink_queue?, reset?"""
    doc = _doc(body)
    name = _string(doc, "name")
    assert name is not None
    check_name(name, "name", slash_ok=True)
    source = _string(doc, "source_queue")
    assert source is not None
    check_queue_name(source)
    sink = _string(doc, "sink_queue", required=False)
    if sink is not None:
        check_queue_name(sink)
    config_hash = _string(doc, "config_hash")
    assert config_hash is not None
    if len(config_hash.encode("utf-8", "surrogatepass")) > _MAX_HASH_BYTES \
            or "\x00" in config_hash:
        raise InvalidRequest(f"config_hash must be 1..{_MAX_HASH_BYTES} bytes of text",
                             field="config_hash")
    return RegisterRequest(name, source, sink, config_hash, _bool(doc, "reset", False))


def parse_state_get(body: bytes) -> StateGetRequest:
    """``POST /streams/v1/state/get``: query_id, partition_id, keys?, key_prefix?,
    ripe_at_or_before?"""
    doc = _doc(body)
    keys = doc.get("keys")
    if keys is None:
        keys = []
    if not isinstance(keys, list):
        raise InvalidRequest("keys must be an array of strings", field="keys")
    if len(keys) > MAX_STATE_KEYS:
        raise InvalidRequest(f"over {MAX_STATE_KEYS} keys", field="keys", limit=MAX_STATE_KEYS)
    parsed = tuple(_state_key(k, "keys", i) for i, k in enumerate(keys))
    prefix = doc.get("key_prefix")
    if prefix == "":
        prefix = None
    if prefix is not None:
        prefix = _state_key(prefix, "key_prefix")
    ripe = doc.get("ripe_at_or_before")
    if ripe is not None and (isinstance(ripe, bool) or not isinstance(ripe, int | float)):
        raise InvalidRequest("ripe_at_or_before must be a number (epoch ms)",
                             field="ripe_at_or_before")
    return StateGetRequest(_query_id(doc), _partition_id(doc), parsed, prefix,
                           None if ripe is None else float(ripe))


def _state_ops(raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest("state_ops must be an array", field="state_ops")
    if len(raw) > MAX_ITEMS:
        raise InvalidRequest(f"over {MAX_ITEMS} state_ops", field="state_ops", limit=MAX_ITEMS)
    ops: list[dict[str, Any]] = []
    for i, op in enumerate(raw):
        if not isinstance(op, dict):
            raise InvalidRequest(f"state_ops[{i}] is not an object", field="state_ops",
                                 index=i)
        kind = op.get("type")
        key = _state_key(op.get("key"), "key", i)
        if kind == "upsert":
            # NOTE(streams): an upsert without a value stores {} (upstream's default)
            value = op.get("value", {})
            _storable(value, i)
            ops.append({"type": "upsert", "key": key, "value": value})
        elif kind == "delete":
            ops.append({"type": "delete", "key": key})
        else:
            raise InvalidRequest(f"state_ops[{i}].type must be upsert or delete", field="type",
                                 index=i)
    return tuple(ops)


def _storable(value: Any, index: int) -> None:
    """A state value PostgreSQL's jsonb can hold: no NUL in any string or key (22P05)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            if "\x00" in v:
                raise InvalidRequest(f"state_ops[{index}].value holds a NUL character",
                                     field="value", index=index)
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)


def _ack(raw: Any) -> CycleAckSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidRequest("ack must be an object or null", field="ack")
    txn = raw.get("transactionId")
    if not isinstance(txn, str) or not txn:
        raise InvalidRequest("ack.transactionId is required (a non-empty string)",
                             field="transactionId")
    if len(txn.encode("utf-8", "surrogatepass")) > MAX_TXN_BYTES:
        raise NameTooLong(f"ack.transactionId over {MAX_TXN_BYTES} bytes",
                          field="transactionId", limit=MAX_TXN_BYTES)
    lease = raw.get("leaseId")
    if not isinstance(lease, str) or not lease:
        raise InvalidRequest("ack.leaseId is required: a cycle acks the batch it was "
                             "delivered under a lease (an autoAck pop has nothing to ack)",
                             field="leaseId")
    try:
        lease_id = uuid.UUID(lease)
    except ValueError:
        lease_id = uuid.UUID(int=0)  # no lease id at all: never live (lease_lost)
    status = raw.get("status", "completed")
    if status not in ("completed", "success"):
        raise InvalidStatus("a cycle's ack.status must be completed (or success); failures "
                            "are redelivered by not committing the cycle", field="status")
    count = raw.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 1 << 31:
        raise InvalidRequest("ack.count must be a non-negative integer", field="count")
    return CycleAckSpec(txn, lease_id, count)


def _push_items(raw: Any, sub: str | None, query_id: uuid.UUID, partition_id: int,
                ack: CycleAckSpec | None) -> tuple[PushItem, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest("push_items must be an array", field="push_items")
    if len(raw) > MAX_ITEMS:
        raise InvalidRequest(f"over {MAX_ITEMS} push_items", field="push_items",
                             limit=MAX_ITEMS)
    items = []
    # NOTE(streams): a leased cycle's sink messages get transactionIds of their own, from what
    # identifies the cycle (the lease, unique per pop, and the message acked through), so a
    # repeat that got past the cycle ledger would still be refused by push dedup instead of
    # stored twice.
    cycle = (f"qs:{query_id}:{partition_id}:{ack.lease_id}:"
             f"{txn_hash(ack.transaction_id).hex()[:16]}" if ack is not None else None)
    for i, it in enumerate(raw):
        if isinstance(it, dict) and not it.get("transactionId") and cycle is not None:
            it = {**it, "transactionId": f"{cycle}:{i}"}
        items.append(parse_json_item(it, i, sub))
    return tuple(items)


def parse_cycle(body: bytes, producer_sub: str | None = None) -> CycleRequest:
    """``POST /streams/v1/cycle``: query_id, partition_id, consumer_group?, state_ops?,
    push_items?, ack?, release_lease? (default true)."""
    doc = _doc(body)
    query_id, partition_id = _query_id(doc), _partition_id(doc)
    group = doc.get("consumer_group")
    if group is not None and not isinstance(group, str):
        raise InvalidRequest("consumer_group must be a string", field="consumer_group")
    if group:
        check_name(group, "consumer_group")
    ack = _ack(doc.get("ack"))
    ops = _state_ops(doc.get("state_ops"))
    items = _push_items(doc.get("push_items"), producer_sub, query_id, partition_id, ack)
    return CycleRequest(query_id, partition_id, parse_group(group), ops,
                        dumps_json(list(ops)).decode(), items, ack,
                        _bool(doc, "release_lease", True))
