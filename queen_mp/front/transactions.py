"""A worker's step as one PostgreSQL transaction (docs/api.md 2.5, 3.6; life-of-a-step.md).

``queen_mp.models.transactions`` parses a body into a ``TxnPlan`` (every 4xx decided there,
before anything runs). ``Transactions.run`` packs the pushes into one segment per partition,
exactly as a push would be stored, and calls ``log_transaction_wire_v1`` once. A DLQ hand-off
needs the poison's payload snapshot, which only the broker can read out of its segment: SQL
rolls back with ``needs_snapshot``, the broker reads the frame and calls again with it.

Result order (the flat list ``failedIndex`` counts in): operations in order with each pushed
item counted separately (QTB1: head operations, then pushed items in group order), then kv,
then timers.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

from queen_mp.db import ack_procs, txn_procs
from queen_mp.db.pooled import Pool, connection
from queen_mp.front.delivery import Claim, unpack_messages
from queen_mp.front.ingest import Ingest, pieces_of
from queen_mp.models.items import ClientChunk, PushItem
from queen_mp.models.timers import queues_to_provision
from queen_mp.models.transactions import TxnPlan
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid7, uuid_text
from queen_mp.wire.records import blob_from_pieces
from queen_mp.wire.times import iso_from_us

__all__ = ["Members", "Transactions", "segments_of"]

_SNAPSHOT_ROUNDS = 3


Members = list[tuple[tuple[str, str], list[int]]]


def segments_of(pushes: list[PushItem], chunks: list[ClientChunk]
                ) -> tuple[Members, txn_procs.Segments]:
    """The pushes as one segment per (queue, partition), first-seen order: each group's item
    indexes, and the segments as log_transaction_wire_v1 takes them (also the streams cycle's
    sink pushes, queen_mp.front.streams)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, it in enumerate(pushes):
        groups.setdefault((it.queue, it.partition), []).append(i)
    members = list(groups.items())
    return members, txn_procs.Segments(
        queues=[q for (q, _), _ in members], partitions=[p for (_, p), _ in members],
        counts=[len(idx) for _, idx in members],
        hashes=[b"".join(txn_hash(pushes[i].transaction_id) for i in idx)
                for _, idx in members],
        blobs=[blob_from_pieces(pieces_of(pushes, idx, chunks)) for _, idx in members])


def _rollback(reason: str, error: str, failed: int | None, **extra: Any) -> dict[str, Any]:
    return {"success": False, "reason": reason, "error": error, "failedIndex": failed,
            **extra, "results": []}


class Transactions:
    def __init__(self, pool: Pool, ingest: Ingest, max_chunk: int) -> None:
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
        members, segments = segments_of(plan.pushes, plan.chunks)
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
        claim = Claim("", pid, "", off, off, 0, None, False,
                      [(segment.base_offset, segment.created_at, segment.payload)])
        m = next(unpack_messages(claim, None, self.max_chunk, decrypt=False), None)
        if m is not None:
            snap.update(messageId=uuid_text(m.message_id), transactionId=m.transaction_id,
                        traceId=uuid_text(m.trace_id) if m.trace_id else None,
                        producerSub=m.producer_sub, encrypted=m.encrypted,
                        payload=base64.b64encode(m.payload).decode(),
                        createdAt=segment.created_at.isoformat())
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
