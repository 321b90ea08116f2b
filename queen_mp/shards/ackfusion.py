"""Ack fusion (ack-internals.md, "Accelerator two"): many registry-hit cursor advances, one
commit.

A cursor advance is monotone and idempotent, so independent advances fuse into one
``log_ack_multi_v3`` transaction with no loss of meaning. Fire-on-idle: with nothing in flight
an arrival flushes at once (one round trip at low load); under load arrivals accumulate while
the one flush in flight runs, and the next flush takes them all. Rows of the same
(partition, group, lease) fold to max(batch_end) and share the row's verdict; different leases
never fold. Each waiting ack is answered only when its flush committed. With fusion off every
advance is its own ``log_ack_at_v1`` call, one after another.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from queen_mp.db import ack_procs
from queen_mp.db.ack_procs import Advance
from queen_mp.db.binarrays import register_arrays
from queen_mp.db.connect import Conn, Dedicated
from queen_mp.metrics import Metrics
from queen_mp.wire.records import ACK_COMMITTED, ACK_FAILED, ACK_REJECTED

__all__ = ["AckFusion", "AckRow"]

log = logging.getLogger("queen_mp.ack_fusion")

Answer = Callable[[int, int, int], None]  # (ACK_* status, old cursor, new cursor)
Released = Callable[[set[tuple[bytes, str]]], None]  # (tenant, queue) whose leases were freed
_SUMMARY_EVERY_S = 10.0


@dataclass
class AckRow:
    tenant: bytes
    partition_id: int
    group: str
    lease: bytes
    batch_end: int
    count: int
    queue: str
    answers: list[Answer] = field(default_factory=list)

    @property
    def key(self) -> tuple[bytes, int, str, bytes]:
        return (self.tenant, self.partition_id, self.group, self.lease)


class AckFusion:
    def __init__(self, dsn: str, *, fused: bool, released: Released, name: str,
                 metrics: Metrics | None = None,
                 statement_timeout_ms: int | None = None) -> None:
        self.dsn = dsn
        self.metrics = metrics
        self.fused = fused
        self.released = released
        self.name = name
        self._pending: dict[tuple[bytes, int, str, bytes], AckRow] = {}
        self._task: asyncio.Task[None] | None = None
        # a flush past statement_timeout_ms is cancelled server-side and answered failed
        self.db = Dedicated(dsn, application_name=name,
                            statement_timeout_ms=statement_timeout_ms,
                            configure=register_arrays)
        self.commits = 0
        self.rows = 0
        self._window_commits = 0
        self._window_rows = 0
        self._summary_at = time.monotonic()

    def add(self, row: AckRow, answer: Answer) -> None:
        held = self._pending.get(row.key)
        if held is None:
            row.answers.append(answer)
            self._pending[row.key] = row
        else:  # fold: monotone and idempotent, so the larger end answers both
            held.batch_end = max(held.batch_end, row.batch_end)
            held.count = max(held.count, row.count)
            held.answers.append(answer)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def drain(self) -> None:
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while self._pending:
            batch, self._pending = list(self._pending.values()), {}
            try:
                results = await self._commit(batch)
            except Exception as ex:
                # NOTE(queen): outcome unknown; the front worker falls back to the SQL path,
                # whose repeat rule answers an advance that did commit as a noop.
                log.warning("ack flush of %d rows failed: %s", len(batch), ex)
                await self.db.drop()
                for row in batch:
                    for answer in row.answers:
                        answer(ACK_FAILED, 0, 0)
                continue
            freed: set[tuple[bytes, str]] = set()
            for row, res in zip(batch, results, strict=True):
                status = ACK_COMMITTED if res.ok else ACK_REJECTED
                if res.lease_released:
                    freed.add((row.tenant, row.queue))
                for answer in row.answers:
                    answer(status, res.old, res.new)
            if freed:
                self.released(freed)
            self._maybe_summary()

    async def _commit(self, batch: list[AckRow]) -> list[Advance]:
        return await self.db.run(lambda conn: self._commit_on(conn, batch), commit_sent=True)

    async def _commit_on(self, conn: Conn, batch: list[AckRow]) -> list[Advance]:
        if not self.fused:
            out = []
            for row in batch:
                out.append(await ack_procs.ack_at(conn, row.tenant, row.partition_id, row.group,
                                                  row.lease, row.batch_end, row.count))
                self._count(1)
            return out
        by_tenant: dict[bytes, list[int]] = {}
        for i, row in enumerate(batch):
            by_tenant.setdefault(row.tenant, []).append(i)
        out_by_index: dict[int, Advance] = {}
        for tenant, idx in by_tenant.items():
            rows = [batch[i] for i in idx]
            results = await ack_procs.ack_multi(
                conn, tenant, [r.partition_id for r in rows], [r.group for r in rows],
                [r.lease for r in rows], [r.batch_end for r in rows], [r.count for r in rows])
            for i, res in zip(idx, results, strict=True):
                out_by_index[i] = res
            self._count(len(rows))
        return [out_by_index[i] for i in range(len(batch))]

    def _count(self, rows: int) -> None:
        self.commits += 1
        self.rows += rows
        self._window_commits += 1
        self._window_rows += rows
        if self.metrics is not None:
            self.metrics.ack_fusion_commits.inc()
            self.metrics.ack_fusion_rows.inc(rows)

    def _maybe_summary(self) -> None:
        now = time.monotonic()
        if now - self._summary_at < _SUMMARY_EVERY_S:
            return
        if self._window_commits:
            log.info("coalesce summary commits=%d rows=%d rows_per_commit=%.2f",
                     self._window_commits, self._window_rows,
                     self._window_rows / self._window_commits)
        self._window_commits = self._window_rows = 0
        self._summary_at = now

    async def close(self) -> None:
        """After ``drain`` (bounded by the caller): a flush still running is abandoned."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        await self.db.drop()
