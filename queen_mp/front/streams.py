"""The Streams SDK's work (docs/api.md "Streams"): registration, state reads and the cycle.

A cycle is one ``stream_cycle_v1`` call (sql/functions/streams.sql): the sink pushes are packed
into one segment per (queue, partition) exactly as a transaction's (encrypted when their queue
says so), and SQL commits them with the state ops and the source ack in one PostgreSQL
transaction, or nothing. Its repeat rules (a retried cycle answers, never applies twice) are
SQL's and are described there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from queen_mp.db import stream_procs
from queen_mp.db.pooled import Pool, connection
from queen_mp.front.ingest import Ingest
from queen_mp.front.transactions import segments_of
from queen_mp.models.streams import (
    MAX_STATE_ROWS,
    CycleRequest,
    RegisterRequest,
    StateGetRequest,
)
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid_text
from queen_mp.wire.times import iso_from_us

__all__ = ["CycleOutcome", "Streams"]


@dataclass(frozen=True, slots=True)
class CycleOutcome:
    """A cycle's answer body, and what committed: pushes stored and queues to wake."""

    body: dict[str, Any]
    pushed: int
    woken: frozenset[str]


class Streams:
    def __init__(self, pool: Pool, ingest: Ingest) -> None:
        self.pool = pool
        self.ingest = ingest

    async def register(self, tenant: bytes, req: RegisterRequest) -> dict[str, Any]:
        """``stream_register_v1``'s verdict (``ok`` false: the config hash differs)."""
        async with connection(self.pool, commit_sent=True) as conn:
            return await stream_procs.register(conn, tenant, req.name, req.source_queue,
                                               req.sink_queue, req.config_hash, req.reset)

    async def state_get(self, tenant: bytes, req: StateGetRequest) -> dict[str, Any]:
        """``stream_state_get_v1``'s verdict (``found`` false: no such query)."""
        async with connection(self.pool) as conn:
            return await stream_procs.state_get(conn, tenant, req.query_id, req.partition_id,
                                                list(req.keys), req.key_prefix,
                                                req.ripe_at_or_before, MAX_STATE_ROWS)

    async def cycle(self, tenant: bytes, req: CycleRequest) -> CycleOutcome:
        pushes = list(req.push_items)
        if pushes:
            await self.ingest.encrypt(pushes, tenant, {it.queue for it in pushes})
        members, segments = segments_of(pushes, [])
        ack = None
        if req.ack is not None:
            ack = stream_procs.CycleAck(req.ack.lease_id, txn_hash(req.ack.transaction_id),
                                        req.release_lease, req.ack.count)
        async with connection(self.pool, commit_sent=True) as conn:
            res = await stream_procs.cycle(conn, tenant, req.query_id, req.partition_id,
                                           req.consumer_group, req.state_ops_json,
                                           segments, ack)
        base = {"query_id": str(req.query_id), "partition_id": str(req.partition_id)}
        if not res["success"]:
            return CycleOutcome({"success": False, **base, "reason": res["reason"],
                                 "error": res["error"]}, 0, frozenset())
        ack_res = res.get("ack")
        ack_body = None if not ack_res else {
            "success": True, "count": ack_res["count"],
            "lease_released": bool(ack_res["leaseReleased"]), "dlq": False}
        if res.get("deferred"):
            return CycleOutcome({"success": True, **base, "repeat": False, "deferred": True,
                                 "state_ops_applied": 0, "push_results": [],
                                 "ack_result": None}, 0, frozenset())
        if res.get("repeat"):
            # NOTE(streams): a repeat applied nothing now; its ack_result is the original's,
            # its push results are not given again (this body's message ids were never stored)
            return CycleOutcome({"success": True, **base, "repeat": True,
                                 "state_ops_applied": 0, "push_results": [],
                                 "ack_result": ack_body}, 0, frozenset())
        results: list[dict[str, Any]] = []
        for seg in res["push"]:
            (queue, partition), idx = members[int(seg["i"])]
            for pos, i in enumerate(idx):
                it = pushes[i]
                results.append({"index": i, "status": "queued", "queue": queue,
                                "queueName": queue, "partition": partition,
                                "partitionId": str(seg["pid"]),
                                "offset": int(seg["base"]) + pos,
                                "messageId": uuid_text(it.message_id),
                                "transactionId": it.transaction_id,
                                "createdAt": iso_from_us(int(seg["ts"]))})
        results.sort(key=lambda r: r["index"])
        woken = set(res.get("sinkQueues") or [])
        if ack_res and ack_res.get("leaseReleased") and res.get("queue"):
            woken.add(res["queue"])
        body = {"success": True, **base, "repeat": False,
                "state_ops_applied": int(res["stateOpsApplied"]), "push_results": results,
                "ack_result": ack_body}
        return CycleOutcome(body, len(pushes), frozenset(woken))
