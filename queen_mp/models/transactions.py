"""A worker's step as one plan (docs/api.md 2.5, 3.6; life-of-a-step.md): the transaction body
parsed, every 4xx decided, before anything runs (``queen_mp.front.transactions`` runs it).

``parse_json`` / ``parse_qtb1`` turn a body into a ``TxnPlan``. Result order (the flat list
``failedIndex`` counts in): operations in order with each pushed item counted separately (QTB1:
head operations, then pushed items in group order), then kv, then timers.
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from queen_mp.db.ack_procs import AckItem
from queen_mp.models.errors import BadFrame, InvalidRequest, RequestError, UnsupportedFlags
from queen_mp.models.items import (
    DEFAULT_PARTITION,
    MAX_ITEMS,
    ClientChunk,
    PushItem,
    loads_json,
    parse_ack_item,
    parse_json_item,
    stamped_item,
)
from queen_mp.models.kv import parse_kv_ops
from queen_mp.models.timers import mint, parse_timer_ops
from queen_mp.wire.binary_push import groups_growth, read_frame_groups
from queen_mp.wire.errors import WireError

__all__ = ["QTB1_MAGIC", "TxnPlan", "parse_json", "parse_qtb1", "qtb1_decoded_size"]

QTB1_MAGIC = b"QTB1"
_U32 = struct.Struct("<I")


@dataclass
class TxnPlan:
    pushes: list[PushItem] = field(default_factory=list)
    push_flat: list[int] = field(default_factory=list)  # flat result index of each push item
    chunks: list[ClientChunk] = field(default_factory=list)
    acks: list[tuple[int, AckItem]] = field(default_factory=list)  # (flat index, item)
    required: list[uuid.UUID] = field(default_factory=list)
    kv: list[dict[str, Any]] = field(default_factory=list)
    timers: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "push" | "ack" per flat op entry

    @property
    def n_ops(self) -> int:
        return len(self.kinds)


def _riders(plan: TxnPlan, doc: dict[str, Any], producer_sub: str | None) -> None:
    """requiredLeases, kv and timers: the top-level arrays beside ``operations``."""
    required = doc.get("requiredLeases") or []
    if not isinstance(required, list) or not all(isinstance(x, str) for x in required):
        raise InvalidRequest("requiredLeases must be an array of lease id strings",
                             field="requiredLeases")
    for text in required:
        try:
            plan.required.append(uuid.UUID(text))
        except ValueError:
            plan.required.append(uuid.UUID(int=0))  # not a lease id: can never be live
    for name in ("kv", "timers"):
        if name in doc and doc[name] is not None and not isinstance(doc[name], list):
            raise InvalidRequest(f"{name} must be an array (a top-level rider, never an "
                                 "operation)", field=name)
    # NOTE(queen): a rider's errors count within its own array; the answer's `index` counts in
    # the flat result list (operations, then kv, then timers), as failedIndex does.
    if doc.get("kv"):
        with _flat_index(plan.n_ops):
            plan.kv = parse_kv_ops(doc["kv"], in_transaction=True)
    if doc.get("timers"):
        with _flat_index(plan.n_ops + len(plan.kv)):
            plan.timers = mint(parse_timer_ops(doc["timers"]), producer_sub)


@contextlib.contextmanager
def _flat_index(offset: int) -> Iterator[None]:
    try:
        yield
    except RequestError as ex:
        if isinstance(ex.extra.get("index"), int):
            ex.extra["index"] += offset
        raise
    except WireError as ex:
        if ex.index is not None:
            ex.index += offset
        raise


def _operations(plan: TxnPlan, ops: Any, *, pushes_allowed: bool,
                producer_sub: str | None) -> None:
    if ops is None:
        return
    if not isinstance(ops, list):
        raise InvalidRequest("operations must be an array", field="operations")
    for k, op in enumerate(ops):
        if not isinstance(op, dict):
            raise InvalidRequest(f"operation {k} is not an object", index=k)
        kind = op.get("type")
        if kind == "push":
            if not pushes_allowed:
                raise InvalidRequest("a QTB1 head carries no push operation (pushes travel as "
                                     "frame groups)", index=k, field="type")
            items = op.get("items", [op])
            if not isinstance(items, list) or not items:
                raise InvalidRequest(f"operation {k}: items must be a non-empty array",
                                     index=k, field="items")
            for it in items:
                flat = plan.n_ops
                plan.pushes.append(parse_json_item(it, flat, producer_sub))
                plan.push_flat.append(flat)
                plan.kinds.append("push")
        elif kind == "ack":
            flat = plan.n_ops
            plan.acks.append((flat, parse_ack_item(op, flat, None)))
            plan.kinds.append("ack")
        else:
            raise InvalidRequest(f"operation {k}: type must be push or ack (kv and timers are "
                                 "top-level arrays)", index=k, field="type")
        if len(plan.pushes) > MAX_ITEMS or len(plan.kinds) > MAX_ITEMS:
            raise InvalidRequest(f"over {MAX_ITEMS} operations", limit=MAX_ITEMS)


def _check_not_empty(plan: TxnPlan) -> None:
    if not plan.kinds and not plan.kv and not plan.timers:
        raise InvalidRequest("empty transaction: operations, kv or timers must be non-empty",
                             field="operations")


def parse_json(body: bytes, producer_sub: str | None = None) -> TxnPlan:
    """A JSON transaction body; ``producer_sub`` (the token's sub) is stamped on its pushes
    and scheduled timers."""
    try:
        doc = loads_json(body) if body else None
    except (orjson.JSONDecodeError, ValueError) as ex:
        raise InvalidRequest(f"body is not valid JSON: {ex}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("body must be an object with operations, kv or timers")
    plan = TxnPlan()
    _operations(plan, doc.get("operations"), pushes_allowed=True, producer_sub=producer_sub)
    _riders(plan, doc, producer_sub)
    _check_not_empty(plan)
    return plan


def qtb1_decoded_size(body: bytes) -> int:
    """How many bytes a QTB1 body holds once the zstd frames of its push groups are
    decompressed (from their headers, as ``binary_push.decoded_size`` does for QPB1), so the
    work window charges a transaction what it becomes rather than what it weighs."""
    end = len(body)
    if end < 9 or body[:4] != QTB1_MAGIC:
        return end
    head_end = 9 + _U32.unpack_from(body, 5)[0]
    return end + groups_growth(body, head_end) if head_end <= end else end


def parse_qtb1(body: bytes, max_decompressed: int, producer_sub: str | None = None
               ) -> TxnPlan:
    """docs/api.md 3.6: magic, flags 0, the JSON head (no pushes), then QPB1 frame groups.

    With ``producer_sub`` every frame is stamped and its group's client chunk rebuilt."""
    if len(body) < 9:
        raise BadFrame("QTB1 body truncated", field="head_len")
    flags = body[4]
    if flags:
        raise UnsupportedFlags(f"QTB1 flags {flags:#04x} are not supported (only 0)",
                               field="flags")
    head_len = _U32.unpack_from(body, 5)[0]
    head_end = 9 + head_len
    if head_end > len(body):
        raise BadFrame(f"QTB1 head of {head_len} bytes runs past the body", offset=5,
                       field="head_len")
    try:
        head = loads_json(body[9:head_end]) if head_len else {}
    except (orjson.JSONDecodeError, ValueError) as ex:
        raise InvalidRequest(f"QTB1 head is not valid JSON: {ex}") from None
    if not isinstance(head, dict):
        raise InvalidRequest("QTB1 head must be a JSON object")
    plan = TxnPlan()
    _operations(plan, head.get("operations"), pushes_allowed=False, producer_sub=producer_sub)
    groups, _ = read_frame_groups(body, head_end, max_items=MAX_ITEMS,
                                  max_decompressed=max_decompressed, first_index=plan.n_ops)
    for group in groups:
        partition = group.partition or DEFAULT_PARTITION
        if producer_sub is not None:
            for f in group.frames:
                plan.push_flat.append(plan.n_ops)
                plan.kinds.append("push")
                plan.pushes.append(stamped_item(group.queue, partition, f, producer_sub))
            continue
        plan.chunks.append(ClientChunk(group.chunk, len(plan.pushes), group.count))
        for f in group.frames:
            plan.push_flat.append(plan.n_ops)
            plan.kinds.append("push")
            plan.pushes.append(PushItem(group.queue, partition, f.transaction_id, f.message_id,
                                        f.raw, f.trace_id, chunk=len(plan.chunks) - 1))
    _riders(plan, head, producer_sub)
    _check_not_empty(plan)
    return plan
