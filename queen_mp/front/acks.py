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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from queen_mp.db import ack_procs
from queen_mp.db.ack_procs import AckBatch, AckItem, DlqFiling, GroupAck
from queen_mp.db.errors import DatabaseError, OutcomeUnknown, StatementTimeout
from queen_mp.db.pooled import Pool, connection
from queen_mp.front.delivery import Claim, Delivered, unpack_messages
from queen_mp.ipc.routing import ack_shard
from queen_mp.ipc.shardlink import ShardGone, ShardLink, verdicts_of
from queen_mp.wire.hashing import txn_hashes
from queen_mp.wire.ids import ZERO_UUID
from queen_mp.wire.records import ACK_COMMITTED, AckRequest, AckVerdict, hash_set

__all__ = ["COMMITTED", "AckOutcome", "Acker", "Verdict"]

_FAST_PATH_TIMEOUT_S = 5.0
#: the grants ``Acker.granted`` keeps (the oldest goes first): one per pop answered, taken by
#: its ack, about 3 KB for 100 messages; and the bytes they may hold together (NOTE(memory):
#: grants whose acks go to another worker, or never come, stay until pushed out)
_GRANTS_KEPT = 1024
_GRANT_BYTES = 1 << 20


#: An item's answer: success, error, leaseReleased, dlq, noop (docs/api.md 2.4).
Verdict = tuple[bool, str | None, bool, bool, bool]
#: The verdict of every item of a group the ack shard committed.
COMMITTED: Verdict = (True, None, True, False, False)


@dataclass(slots=True)
class AckOutcome:
    """An item's verdict as the SQL path settles it."""

    item: AckItem
    success: bool = False
    error: str | None = None
    lease_released: bool = False
    dlq: bool = False
    noop: bool = False


@dataclass(slots=True)
class _Group:
    partition_id: int
    group: str
    lease_id: uuid.UUID | None
    indexes: Sequence[int]  # its items' places in the batch
    completed: bool  # every item's status is ``completed``
    outcomes: list[AckOutcome] = field(default_factory=list)  # the SQL path's


def _groups(batch: AckBatch) -> list[_Group]:
    """The batch's (partition, group, lease) groups, in (partition id, group) order (the
    global lock order).

    PERF(ack): the common batch (one partition, group and lease: one pop's messages) is
    found so by three C counts, without a key per item (a UUID hashes in Python)."""
    n = len(batch)
    pids, names, leases, statuses = (batch.partition_ids, batch.groups, batch.lease_ids,
                                     batch.statuses)
    if n and pids.count(pids[0]) == n and names.count(names[0]) == n \
            and leases.count(leases[0]) == n:
        return [_Group(pids[0], names[0], leases[0], range(n),
                       statuses.count("completed") == n)]
    found: dict[tuple[int, str, uuid.UUID | None], list[int]] = {}
    for index, key in enumerate(zip(pids, names, leases, strict=True)):
        found.setdefault(key, []).append(index)
    return [_Group(*key, found[key], all(statuses[i] == "completed" for i in found[key]))
            for key in sorted(found, key=lambda k: (k[0], k[1], str(k[2])))]


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
        # (lease id, partition id) -> (its transactionIds joined by NUL, their count, hash set)
        self._granted: dict[tuple[str, int], tuple[str, int, bytes]] = {}
        self._granted_bytes = 0

    def granted(self, lease_id: str, partition_id: int, ids: list[bytes], distinct: bytes
                ) -> None:
        """Keep the hash set granted for the delivered transactionIds ``ids`` (UTF-8, in
        order), so that the ack of exactly these sends it as it is.

        PERF(ack): a 100-message ack hashed its ids and sorted the hashes again (150k
        instructions, 60k of them the sort) to make the set its grant had made. An ack's ids
        are the delivered ones when, as many, they join by NUL to the same text and no
        delivered id holds a NUL (the joins then cut alike). A plain cache: what it returns
        is exactly what hashing the ack's ids makes."""
        joined = b"\0".join(ids)
        if joined.count(0) != len(ids) - 1:
            return
        text = joined.decode()
        size = len(text) + len(distinct)  # as the evictions count it
        if size > _GRANT_BYTES:
            return
        kept = self._granted
        key = (lease_id, partition_id)
        self._take(key)
        while kept and (len(kept) >= _GRANTS_KEPT or self._granted_bytes + size > _GRANT_BYTES):
            self._take(next(iter(kept)))
        kept[key] = (text, len(ids), distinct)
        self._granted_bytes += size

    def _take(self, key: tuple[str, int]) -> tuple[str, int, bytes] | None:
        """The grant kept under ``key``, no longer kept (None if none was)."""
        kept = self._granted.pop(key, None)
        if kept is not None:
            self._granted_bytes -= len(kept[0]) + len(kept[2])
        return kept

    def _hash_set(self, lease_id: uuid.UUID, partition_id: int, ids: list[str]) -> bytes:
        """``hash_set`` of ``ids``' hashes: the grant's, when ``ids`` are what it delivered."""
        kept = self._take((str(lease_id), partition_id))
        if kept is not None and kept[1] == len(ids) and kept[0] == "\0".join(ids):
            return kept[2]
        return hash_set(txn_hashes(ids))

    async def ack(self, tenant: bytes, batch: AckBatch
                  ) -> tuple[list[Verdict], list[GroupAck]]:
        """Every item's verdict in input order, and the SQL results (for wake-ups, metrics)."""
        groups = _groups(batch)
        # every item's, until a group the shard did not commit settles its own below
        verdicts: list[Verdict] = [COMMITTED] * len(batch)
        results: list[GroupAck] = []
        if self.link is not None:
            fast = [g for g in groups if g.lease_id is not None and g.completed]
            answers = await self._fast(tenant, batch, fast)
            results.extend(res for res in answers if res is not None)
            committed = {id(g) for g, res in zip(fast, answers, strict=True) if res is not None}
            groups = [g for g in groups if id(g) not in committed]
        if not groups:
            return verdicts, results
        for g in groups:
            g.outcomes = [AckOutcome(batch.item(i)) for i in g.indexes]
        try:
            results.extend(await self._settled(tenant, groups))
        except DatabaseError as ex:
            code = ("timeout" if isinstance(ex, StatementTimeout) else
                    "outcome_unknown" if isinstance(ex, OutcomeUnknown) else "unavailable")
            for g in groups:
                for o in g.outcomes:
                    o.success = o.lease_released = o.dlq = o.noop = False
                    o.error = code
        for g in groups:
            for o in g.outcomes:
                verdicts[o.item.index] = (o.success, o.error, o.lease_released, o.dlq, o.noop)
        return verdicts, results

    async def _settled(self, tenant: bytes, groups: list[_Group]) -> list[GroupAck]:
        """The SQL path of ``groups``, in ONE transaction (an ack and the DLQ filing it asks
        for commit together)."""
        completed = all(g.completed for g in groups)
        async with connection(self.pool, commit_sent=True) as conn:
            if completed and len(groups) == 1:
                # one statement that commits itself (no nack: no DLQ filing after it)
                return [await self._one(conn, tenant, groups[0])]
            async with conn.transaction():
                return await self._sql(conn, tenant, groups, completed)

    async def _fast(self, tenant: bytes, batch: AckBatch, groups: list[_Group]
                    ) -> list[GroupAck | None]:
        """The registry + fusion path of each group; None = take the SQL path for it."""
        link = self.link
        assert link is not None
        request_id = link.next_request_id()
        deadline = asyncio.get_running_loop().time() + _FAST_PATH_TIMEOUT_S
        calls = []
        txns = batch.transaction_ids
        for index, g in enumerate(groups):
            assert g.lease_id is not None
            ids = txns if len(g.indexes) == len(txns) else [txns[i] for i in g.indexes]
            req = AckRequest(link.generation, link.slot, request_id, index, tenant,
                             g.lease_id.bytes, g.partition_id, g.group,
                             self._hash_set(g.lease_id, g.partition_id, ids))
            calls.append(link.submit(ack_shard(g.partition_id, self.shards), request_id, index,
                                     req.pack(), deadline))
        answers: list[GroupAck | None] = []
        for verdict in await verdicts_of(calls):
            if isinstance(verdict, BaseException) and \
                    not isinstance(verdict, ShardGone | TimeoutError):
                raise verdict
            if not isinstance(verdict, AckVerdict) or verdict.status != ACK_COMMITTED:
                answers.append(None)  # a miss, a rejection, ShardGone or a timeout
                continue
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


def _hashes_statuses(g: _Group) -> tuple[list[bytes], list[str]]:
    outs = g.outcomes
    return txn_hashes([o.item.transaction_id for o in outs]), [o.item.status for o in outs]


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
