"""The ack path of a front worker: items -> per (partition, group, lease) calls of the one
authoritative procedure -> DLQ filing -> per-item verdicts (ack-internals.md, docs/api.md 2.4).

The groups the fast path did not take run in (partition id, group) order, the global lock
order, in ONE transaction on one pooled connection: an ack batch over N partitions costs one
commit, not N (an ack that reaches another instance than its pop always comes this way), and
a DLQ hand-off commits with the ack that asked for it. A failed or lost commit fails every one
of those groups' items (``timeout`` / ``outcome_unknown`` / ``unavailable``); the caller
answers 503 with the results, and a retry is safe (the repeat rule answers an ack that took
effect as ``noop``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from queen_mp.db import ack_procs
from queen_mp.db.ack_procs import AckItem, DlqFiling, GroupAck
from queen_mp.db.errors import DatabaseError, OutcomeUnknown, StatementTimeout
from queen_mp.db.pooled import Pool, connection
from queen_mp.front.delivery import Claim, Delivered, unpack_messages
from queen_mp.ipc.routing import ack_shard
from queen_mp.ipc.shardlink import ShardGone, ShardLink, verdicts_of
from queen_mp.wire.hashing import txn_hashes
from queen_mp.wire.ids import ZERO_UUID
from queen_mp.wire.records import ACK_COMMITTED, AckRequest, AckVerdict, hash_set

__all__ = ["AckOutcome", "Acker"]

_FAST_PATH_TIMEOUT_S = 5.0


@dataclass(slots=True)
class AckOutcome:
    item: AckItem
    success: bool = False
    error: str | None = None
    lease_released: bool = False
    dlq: bool = False
    noop: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"index": self.item.index, "transactionId": self.item.transaction_id,
                "partitionId": str(self.item.partition_id), "success": self.success,
                "error": self.error, "leaseReleased": self.lease_released, "dlq": self.dlq,
                "noop": self.noop}


@dataclass(slots=True)
class _Group:
    partition_id: int
    group: str
    lease_id: uuid.UUID | None
    outcomes: list[AckOutcome] = field(default_factory=list)
    completed: bool = True  # every item's status is ``completed``


class Acker:
    """``link`` set = the registry fast path is on: whole-batch ``completed`` acks with a lease
    go to the partition's ack shard first; a miss, a rejection or a failure there falls back
    to the SQL path (design.md invariant 6). No pooled connection is held while waiting on it.
    """

    def __init__(self, pool: Pool, max_chunk: int) -> None:
        self.pool = pool
        self.max_chunk = max_chunk
        self.link: ShardLink | None = None
        self.shards = 0

    async def ack(self, tenant: bytes, items: Iterable[AckItem]
                  ) -> tuple[list[AckOutcome], list[GroupAck]]:
        """Every item's outcome in input order, and the SQL results (for wake-ups, metrics)."""
        groups: dict[tuple[int, str, uuid.UUID | None], _Group] = {}
        ordered: list[AckOutcome] = []
        g: _Group | None = None
        for item in items:
            # PERF(ack): a batch's items share one partition id, group and lease object
            # (decode_ack_items reads each once a body): the item's group is the last one's,
            # found without building and hashing its key (a UUID hashes in Python).
            if g is None or item.lease_id is not g.lease_id or item.group is not g.group \
                    or item.partition_id != g.partition_id:
                key = (item.partition_id, item.group, item.lease_id)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = _Group(item.partition_id, item.group, item.lease_id)
            if item.status != "completed":
                g.completed = False
            outcome = AckOutcome(item)
            g.outcomes.append(outcome)
            ordered.append(outcome)
        results: list[GroupAck] = []
        keys = sorted(groups, key=lambda k: (k[0], k[1], str(k[2]))) if len(groups) > 1 \
            else list(groups)
        if self.link is not None:
            fast = [k for k in keys if k[2] is not None and groups[k].completed]
            answers = await self._fast(tenant, [groups[k] for k in fast])
            done = {k for k, res in zip(fast, answers, strict=True) if res is not None}
            results.extend(res for res in answers if res is not None)
            keys = [k for k in keys if k not in done]
        if not keys:
            return ordered, results
        sql_groups = [groups[k] for k in keys]
        completed = all(g.completed for g in sql_groups)
        try:
            async with connection(self.pool, commit_sent=True) as conn:
                if completed and len(sql_groups) == 1:
                    # one statement that commits itself (no nack: no DLQ filing after it)
                    sql_results = [await self._one(conn, tenant, sql_groups[0])]
                else:
                    async with conn.transaction():
                        sql_results = await self._sql(conn, tenant, sql_groups, completed)
        except DatabaseError as ex:
            code = ("timeout" if isinstance(ex, StatementTimeout) else
                    "outcome_unknown" if isinstance(ex, OutcomeUnknown) else "unavailable")
            for g in sql_groups:
                for o in g.outcomes:
                    o.success = o.lease_released = o.dlq = o.noop = False
                    o.error = code
            return ordered, results
        results.extend(sql_results)
        return ordered, results

    async def _fast(self, tenant: bytes, groups: list[_Group]) -> list[GroupAck | None]:
        """The registry + fusion path of each group; None = take the SQL path for it."""
        link = self.link
        assert link is not None
        request_id = link.next_request_id()
        deadline = asyncio.get_running_loop().time() + _FAST_PATH_TIMEOUT_S
        calls = []
        for index, g in enumerate(groups):
            assert g.lease_id is not None
            req = AckRequest(link.generation, link.slot, request_id, index, tenant,
                             g.lease_id.bytes, g.partition_id, g.group,
                             hash_set(_txn_hashes(g)))
            calls.append(link.submit(ack_shard(g.partition_id, self.shards), request_id, index,
                                     req.pack(), deadline))
        answers: list[GroupAck | None] = []
        for g, verdict in zip(groups, await verdicts_of(calls), strict=True):
            if isinstance(verdict, BaseException) and \
                    not isinstance(verdict, ShardGone | TimeoutError):
                raise verdict
            if not isinstance(verdict, AckVerdict) or verdict.status != ACK_COMMITTED:
                answers.append(None)  # a miss, a rejection, ShardGone or a timeout
                continue
            for o in g.outcomes:
                o.success = o.lease_released = True
            # the shard already woke the pops parked on the queue (no queue named here)
            answers.append(GroupAck(True, None, verdict.new - verdict.old, True))
        return answers

    async def _sql(self, conn: Any, tenant: bytes, groups: list[_Group], completed: bool
                   ) -> list[GroupAck]:
        """Inside the caller's transaction: an ack and the DLQ filing it asks for commit
        together."""
        if completed:
            # PERF(ack): no nack, so no DLQ filing between the calls: N calls, one round trip
            answers = await ack_procs.ack_by_hash_many(
                conn, tenant, [(g.partition_id, g.group, g.lease_id, *_hashes_statuses(g))
                               for g in groups])
            return [_settle(g, res) for g, res in zip(groups, answers, strict=True)]
        return [await self._one(conn, tenant, g) for g in groups]

    async def _one(self, conn: Any, tenant: bytes, g: _Group) -> GroupAck:
        res = _settle(g, await ack_procs.ack_by_hash(conn, tenant, g.partition_id, g.group,
                                                     g.lease_id, *_hashes_statuses(g)))
        if res.ok and res.dlq:
            assert res.signal_index is not None and res.poison is not None
            signal = g.outcomes[res.signal_index]
            filed = await self._file_dlq(conn, tenant, g, res.poison, signal.item)
            signal.dlq = filed.ok
            if filed.lease_released and not res.lease_released:
                res = dataclasses.replace(res, lease_released=True)
                for o in g.outcomes:
                    o.lease_released = True
        return res

    async def _file_dlq(self, conn: Any, tenant: bytes, g: _Group, offset: int,
                        signal: AckItem) -> DlqFiling:
        """The poison's frame from its segment, as stored, into a DLQ row (ack-internals)."""
        message: Delivered | None = None
        created: datetime | None = None
        segment = await ack_procs.segment_at(conn, g.partition_id, offset)
        if segment is not None:
            created = segment.created_at
            claim = Claim("", g.partition_id, "", offset, offset, 0, None, False,
                          [(segment.base_offset, created, segment.payload)])
            message = next(unpack_messages(claim, None, self.max_chunk, decrypt=False), None)
        if message is None:  # NOTE(queen): retained away; the row still records the failure
            return await ack_procs.file_dlq(
                conn, tenant, g.partition_id, g.group, g.lease_id, offset, ZERO_UUID,
                signal.transaction_id, None, None, False, None, signal.error, created)
        return await ack_procs.file_dlq(
            conn, tenant, g.partition_id, g.group, g.lease_id, offset, message.message_id,
            message.transaction_id, message.trace_id, message.producer_sub, message.encrypted,
            message.payload, signal.error, created)


def _txn_hashes(g: _Group) -> list[bytes]:
    return txn_hashes([o.item.transaction_id for o in g.outcomes])


def _hashes_statuses(g: _Group) -> tuple[list[bytes], list[str]]:
    return _txn_hashes(g), [o.item.status for o in g.outcomes]


def _settle(g: _Group, res: GroupAck) -> GroupAck:
    """Each item's verdict from the group's ``log_ack_by_hash_v1`` result (before any DLQ
    filing, which ``Acker._one`` adds)."""
    outs = g.outcomes
    if not res.ok:
        for o in outs:
            o.error = res.error or "lease_invalid"
        return res
    for o in outs:
        o.success = True
    for i in res.noop:
        outs[i].noop = True
    for indexes, code in ((res.stale, "already_committed"), (res.unresolved, "unresolvable"),
                          (res.clamped, "clamped"), (res.invalid, "lease_invalid")):
        for i in indexes:
            outs[i].success, outs[i].error = False, code
    if res.lease_released:
        for o in outs:
            o.lease_released = True
    return res
