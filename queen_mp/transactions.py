"""A worker's step as one PostgreSQL transaction (api.md 2.5, 3.6; life-of-a-step.md).

``parse_json`` / ``parse_qtb1`` turn a body into a ``TxnPlan`` (every 4xx decided there, before
anything runs). ``Transactions.run`` packs the pushes into one segment per partition, exactly as
a push would be stored, and calls ``log_transaction_wire_v1`` once. A DLQ hand-off needs the
poison's payload snapshot, which only the broker can read out of its segment: SQL rolls back
with ``needs_snapshot``, the broker reads the frame and calls again with it.

Result order (the flat list ``failedIndex`` counts in): operations in order with each pushed
item counted separately (QTB1: head operations, then pushed items in group order), then kv,
then timers.
"""

from __future__ import annotations

import base64
import contextlib
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from psycopg_pool import AsyncConnectionPool

from queen_mp.acks import AckItem
from queen_mp.db import ack_procs, txn_procs
from queen_mp.db.pooled import connection
from queen_mp.delivery import Claim, unpack_messages
from queen_mp.http.errors import ApiError, BadFrame, InvalidRequest, UnsupportedFlags
from queen_mp.http.items import (
    DEFAULT_PARTITION,
    MAX_ITEMS,
    loads_json,
    parse_ack_item,
    parse_json_item,
)
from queen_mp.ingest import ClientChunk, Ingest, PushItem, pieces_of, stamped_item
from queen_mp.kv import parse_kv_ops
from queen_mp.timers import mint, parse_timer_ops, queues_to_provision
from queen_mp.wire.binary_push import groups_growth, read_frame_groups
from queen_mp.wire.errors import WireError
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid7, uuid_text
from queen_mp.wire.records import blob_from_pieces
from queen_mp.wire.times import iso_from_us

__all__ = ["QTB1_MAGIC", "Transactions", "TxnPlan", "parse_json", "parse_qtb1",
           "qtb1_decoded_size"]

QTB1_MAGIC = b"QTB1"
_U32 = struct.Struct("<I")
_SNAPSHOT_ROUNDS = 3


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
    except ApiError as ex:
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
    """api.md 3.6: magic, flags 0, the JSON head (no pushes), then QPB1 frame groups.

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


def _rollback(reason: str, error: str, failed: int | None, **extra: Any) -> dict[str, Any]:
    return {"success": False, "reason": reason, "error": error, "failedIndex": failed,
            **extra, "results": []}


class Transactions:
    def __init__(self, pool: AsyncConnectionPool, ingest: Ingest, max_chunk: int) -> None:
        self.pool = pool
        self.ingest = ingest
        self.max_chunk = max_chunk

    async def run(self, tenant: bytes, plan: TxnPlan) -> tuple[dict[str, Any], set[str]]:
        """The answer body, and the queues whose parked pops may claim now (to wake)."""
        seen: dict[tuple[str, str, str], int] = {}
        for it, flat in zip(plan.pushes, plan.push_flat, strict=True):
            first = seen.setdefault((it.queue, it.partition, it.transaction_id), flat)
            if first != flat:
                return _rollback("duplicate", f"transactionId {it.transaction_id!r} is repeated "
                                 "in this transaction", flat), set()
        if plan.pushes:
            await self.ingest.encrypt(plan.pushes, tenant, {it.queue for it in plan.pushes})
        groups: dict[tuple[str, str], list[int]] = {}
        for i, it in enumerate(plan.pushes):
            groups.setdefault((it.queue, it.partition), []).append(i)
        members = list(groups.items())
        segments = txn_procs.Segments(
            queues=[q for (q, _), _ in members], partitions=[p for (_, p), _ in members],
            counts=[len(idx) for _, idx in members],
            hashes=[b"".join(txn_hash(plan.pushes[i].transaction_id) for i in idx)
                    for _, idx in members],
            blobs=[blob_from_pieces(pieces_of(plan.pushes, idx, plan.chunks))
                   for _, idx in members])
        acks = [item for _, item in plan.acks]
        snapshots: list[dict[str, Any]] = []
        timer_queues = queues_to_provision(plan.timers)
        async with connection(self.pool, commit_sent=True) as conn:
            for _ in range(_SNAPSHOT_ROUNDS):
                res = await txn_procs.transaction_wire(
                    conn, tenant, segments, acks, [flat for flat, _ in plan.acks],
                    snapshots, plan.required, plan.kv, plan.timers, timer_queues)
                if res.get("reason") != "needs_snapshot":
                    break
                snapshots.append(await self._snapshot(conn, res["detail"]))
        if not res["success"]:
            return self._failure(plan, members, res), set()
        return self._success(plan, members, res)

    async def _snapshot(self, conn: Any, detail: dict[str, Any]) -> dict[str, Any]:
        """The poison frame as stored, for its DLQ row (ack-internals "Filing the DLQ row")."""
        pid, off = int(detail["pid"]), int(detail["off"])
        snap: dict[str, Any] = {"pid": pid, "off": off, "messageId": str(uuid.UUID(int=0)),
                                "transactionId": "", "payload": None, "encrypted": False}
        segment = await ack_procs.segment_at(conn, pid, off)
        if segment is None:
            return snap
        base, created, blob = segment
        claim = Claim("", pid, "", off, off, 0, None, False, [(base, created, blob)])
        m = next(unpack_messages(claim, None, self.max_chunk, decrypt=False), None)
        if m is not None:
            snap.update(messageId=uuid_text(m.message_id), transactionId=m.transaction_id,
                        traceId=uuid_text(m.trace_id) if m.trace_id else None,
                        producerSub=m.producer_sub, encrypted=m.encrypted,
                        payload=base64.b64encode(m.payload).decode(),
                        createdAt=created.isoformat())
        return snap

    def _failure(self, plan: TxnPlan, members: list[tuple[tuple[str, str], list[int]]],
                 res: dict[str, Any]) -> dict[str, Any]:
        reason, detail = res["reason"], res.get("detail") or {}
        if reason == "duplicate":
            idx = members[int(detail["segment"])][1]
            flat = plan.push_flat[idx[int(detail.get("frame") or 0)]]
            item = plan.pushes[idx[int(detail.get("frame") or 0)]]
            return _rollback(reason, f"transactionId {item.transaction_id!r} is already stored "
                             f"in {item.queue}/{item.partition}", flat)
        if reason == "kv_precondition":
            k = int(detail.get("failedIndex") or 0)
            return _rollback(reason, f"kv precondition failed at index {plan.n_ops + k}",
                             plan.n_ops + k, kvReason=detail.get("kvReason"),
                             version=detail.get("version"), value=detail.get("value"))
        if reason == "needs_snapshot":  # the poison kept moving: nothing applied, retry
            return _rollback("rejected_ack", "the dead-letter hand-off did not settle; retry",
                             detail.get("op"))
        why = detail.get("error") or "rejected"
        op = detail.get("op")
        if op is None:
            return _rollback(reason, f"required lease {detail.get('leaseId')} is not live",
                             None)
        return _rollback(reason, f"ack at index {op} rejected: {why}", int(op))

    def _success(self, plan: TxnPlan, members: list[tuple[tuple[str, str], list[int]]],
                 res: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
        results: list[dict[str, Any] | None] = [None] * plan.n_ops
        woken: set[str] = set()
        for seg in res["push"]:
            k = int(seg["i"])
            (queue, partition), idx = members[k]
            base, pid, ts = int(seg["base"]), str(seg["pid"]), int(seg["ts"])
            woken.add(queue)
            for pos, i in enumerate(idx):
                it = plan.pushes[i]
                flat = plan.push_flat[i]
                results[flat] = {
                    "index": flat, "type": "push", "success": True, "status": "queued",
                    "messageId": uuid_text(it.message_id), "transactionId": it.transaction_id,
                    "queue": queue, "partition": partition, "partitionId": pid,
                    "offset": base + pos, "createdAt": iso_from_us(ts)}
        for a in res["acks"]:
            flat, item = plan.acks[int(a["i"])]
            if a.get("leaseReleased") and a.get("queue"):
                woken.add(a["queue"])
            results[flat] = {"index": flat, "type": "ack", "success": True,
                             "transactionId": item.transaction_id,
                             "partitionId": str(item.partition_id),
                             "leaseReleased": bool(a.get("leaseReleased")),
                             "dlq": bool(a.get("dlq"))}
        flat_results = [r for r in results if r is not None]
        for k, r in enumerate(res.get("kv") or []):
            flat_results.append({"index": plan.n_ops + k, "type": "kv", **r})
        base_t = plan.n_ops + len(plan.kv)
        for k, r in enumerate(res.get("timers") or []):
            flat_results.append({"index": base_t + k, "type": "timer", **r})
        return ({"success": True, "transactionId": uuid_text(uuid7()),
                 "results": flat_results}, woken)
