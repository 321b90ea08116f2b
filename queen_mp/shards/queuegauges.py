"""The per-queue gauges (depth, oldest unconsumed age, lag per consumer group, DLQ depth), as
shard 0 of an instance computes them for ``/metrics/prometheus``.

Why here and not at scrape time: a scrape is answered by whichever front worker the kernel
picks, several Prometheus servers may scrape, and the numbers come from a pass over every
partition and cursor. So one process computes them, every ``QUEEN_METRICS_QUEUE_S``, with one
SQL call (``queen.queue_gauges_v1``, which also bounds them to ``QUEEN_METRICS_QUEUE_CAP``
series per gauge and folds other tenants' rows), and writes them to a snapshot file in the
metrics directory that every scrape reads (``queen_mp.metrics.QueueGaugeCollector``). A series
that leaves the snapshot (a queue deleted, or pushed out of the cap) leaves the exposition at
once, instead of staying behind at zero as a multiprocess gauge child would.

Each instance computes its own, like each instance serves its own scrape; the snapshot's time
is ``queen_queue_gauges_timestamp_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from queen_mp.db import retention_procs
from queen_mp.db.connect import Conn, Dedicated
from queen_mp.db.errors import DatabaseError
from queen_mp.metrics import QueueRow, write_queue_snapshot

__all__ = ["QueueGauges"]

log = logging.getLogger("queen_mp.queuegauges")


class QueueGauges:
    """Refresh the snapshot now, then every ``every_s`` seconds, until cancelled."""

    def __init__(self, dsn: str, *, directory: str, every_s: float, cap: int, name: str,
                 statement_timeout_ms: int | None = None) -> None:
        self.directory = directory
        self.every_s = every_s
        self.cap = cap
        self.db = Dedicated(dsn, application_name=name, statement_timeout_ms=statement_timeout_ms)
        self._failing = False

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
                if self._failing:
                    log.info("per-queue gauges refreshed again")
                self._failing = False
            except (DatabaseError, OSError) as ex:
                # NOTE(queen): the previous snapshot stays (its timestamp ages); say so once
                if not self._failing:
                    log.warning("per-queue gauges not refreshed (%s); retrying every %.0f s",
                                ex, self.every_s)
                self._failing = True
            await asyncio.sleep(self.every_s)

    async def refresh(self) -> list[QueueRow]:
        """One SQL call, one snapshot file; returns the rows written."""

        async def work(conn: Conn) -> list[QueueRow]:
            return await retention_procs.queue_gauges(conn, self.cap)

        rows = await self.db.run(work)
        write_queue_snapshot(self.directory, rows, time.time())
        return rows

    async def close(self) -> None:
        await self.db.drop()
