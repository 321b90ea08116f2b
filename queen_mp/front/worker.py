"""Per-process state of a gunicorn front worker, opened after fork.

One ``FrontWorker`` per worker process holds what the resources share: the claimed worker
slot, the PostgreSQL pool, the link to the shards, metrics and the shard heartbeat board. It is
started by the ASGI lifespan and stopped in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from queen_mp import keyring
from queen_mp.config import Config
from queen_mp.crypto import PayloadCipher
from queen_mp.db import errors as dberrors
from queen_mp.db import procs
from queen_mp.db.ack_procs import GroupAck
from queen_mp.db.pooled import Pool, connection, failover_pool
from queen_mp.front.acks import Acker
from queen_mp.front.delivery import Claim
from queen_mp.front.ingest import Ingest, PushResults
from queen_mp.front.parking import ParkingLot
from queen_mp.front.popper import Popper
from queen_mp.front.queueflags import QueueFlags
from queen_mp.front.spooldrain import Drainer
from queen_mp.front.spoolhold import HOLD_TTL_MS, SpoolHold, now_us
from queen_mp.front.transactions import Transactions
from queen_mp.heap import HeapTrim, freeze_startup_objects, request_caches
from queen_mp.ipc.flags import FlagsBoard
from queen_mp.ipc.heartbeat import HeartbeatBoard
from queen_mp.ipc.routing import ack_shard
from queen_mp.ipc.shardlink import ShardLink
from queen_mp.ipc.slots import SlotTable
from queen_mp.ipc.wakeboard import WakeBoard, bucket_of
from queen_mp.ipc.wakeup import WakeListener, Waker, WorkerBells
from queen_mp.metrics import Metrics, mark_process_dead
from queen_mp.models.system import ShardState, WorkerState
from queen_mp.runtime import Runtime
from queen_mp.spool import SpoolWriter, spool_stats
from queen_mp.wire.records import LeaseGrant, hash_set

__all__ = ["SHARD_STALE_MS", "FrontWorker"]

log = logging.getLogger("queen_mp.worker")

# A shard that has not beaten for this long is reported dead by /health.
SHARD_STALE_MS = 3000
_FLAGS_FIRST_READ_S = 2.0
#: how often a front worker writes its pool and disk gauges (a scrape also refreshes the
#: answering worker's first); the other workers' values are at most this old
GAUGES_EVERY_S = 1.0


class FrontWorker:
    """Resources of one front worker; ``start``/``stop`` run in the lifespan."""

    def __init__(self, config: Config, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        self.slot = -1
        self.generation = 0
        self.metrics: Metrics | None = None
        self.pool: Pool = failover_pool(
            config.pg_dsn, max_size=config.pg_pool_size, name=f"front-{os.getpid()}")
        self.link: ShardLink | None = None
        self.spool: SpoolWriter | None = None
        self._ingest: Ingest | None = None
        self._slots: SlotTable | None = None
        self._board: HeartbeatBoard | None = None
        ring = keyring.for_process(config)
        self.cipher = PayloadCipher(ring) if ring is not None else None
        self._wake_board: WakeBoard | None = None
        self._popper: Popper | None = None
        self._transactions: Transactions | None = None
        self.acker = Acker(self.pool, config.max_decompressed_mb << 20)
        self.waker: Waker | None = None
        self._listener: WakeListener | None = None
        self._bells: WorkerBells | None = None
        self._flags: FlagsBoard | None = None
        self._drainer: Drainer | None = None
        self.hold: SpoolHold | None = None
        #: percent used of the storage admission protects; the HTTP app hands its sampler in
        #: (http/admission.py measures the disk), None: not measured
        self.disk_used: Callable[[], float] | None = None
        self._gauges: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.metrics = Metrics(self.config.instance_name)
        dberrors.on_event(self.metrics.db_event)
        self.metrics.disk_high_percent.set(self.config.disk_high_pct)
        self.metrics.pg_pool_max.set(self.config.pg_pool_size)
        self._slots = SlotTable.attach(self.runtime.slot_table)
        self.slot, self.generation = self._slots.claim(os.getpid())
        self._board = HeartbeatBoard.attach(self.runtime.heartbeat, self.runtime.shards)
        self.link = ShardLink(self.runtime, self.slot, self.generation)
        await self.link.start()
        if self.config.ack_registry:
            self.acker.link, self.acker.shards = self.link, self.runtime.shards
        self.spool = SpoolWriter(self.config.spool_path, f"w{self.slot}-{os.getpid()}")
        self._flags = FlagsBoard.attach(self.runtime.flags_board)
        self.hold = SpoolHold(self.config.spool_path, self.spool, self._flags,
                              self.publish_hold, keep_order=self.config.spool_hold)
        if self.config.spool_hold and (
                await asyncio.to_thread(spool_stats, self.config.spool_path)).pending:
            # NOTE(queen): records of an earlier process (a crash, a restart): no push may
            # overtake them (front/spoolhold.py); the drain's closing pass ends the hold.
            self._flags.set_local_hold(now_us())
        self._ingest = Ingest(self.link, self.runtime.shards, self.hold,
                              self.config.push_timeout_ms, QueueFlags(self.pool), self.cipher)
        self._transactions = Transactions(self.pool, self._ingest,
                                          self.config.max_decompressed_mb << 20)
        self._wake_board = WakeBoard.attach(self.runtime.wake_board)
        slots, slot = self._slots, self.slot
        lot = ParkingLot(self._wake_board, self.config.pop_wake_tick_ms / 1000,
                         lambda parked: slots.set_parked(slot, parked))
        self.link.on_ring = lot.poke
        self._popper = Popper(self.pool, lot, self.config.max_parked_pops,
                              self.metrics.parked_pops)
        bells = self._bells = WorkerBells(slots, self.runtime.slot_doorbell, slot)

        def rung() -> None:
            lot.poke()  # this worker's own parked pops
            bells.ring()  # and every other worker's

        self.waker = Waker(self._wake_board, self.runtime.prefix, self.config.pg_dsn,
                           notify=self.config.wake_notify, rung=rung)
        # NOTE(queen): always started: besides wakes (QUEEN_WAKE_NOTIFY) the listener keeps
        # the maintenance switches fresh on the flags board.
        self._listener = WakeListener(self._wake_board, self.runtime.prefix,
                                      self.config.pg_dsn, wake=self.config.wake_notify,
                                      flags=self._flags, holder=self.holder,
                                      bumped=lot.poke)
        self._listener.start()
        if not self._flags.read().known:
            # the instance's first worker: do not serve pushes before the switches are known
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._listener.flags_ready.wait(), _FLAGS_FIRST_READ_S)
        await self.pool.open(wait=False)
        self._drainer = Drainer(self.config.spool_path, self._ingest, self._flags, self.spool,
                                f"f{self.slot}-{os.getpid()}", metrics=self.metrics,
                                hold=self.hold, instance=self.holder)
        self._drainer.start()
        self._gauges = asyncio.get_running_loop().create_task(self._gauge_loop())
        freeze_startup_objects()
        log.info("front worker %d ready in slot %d (generation %d)", os.getpid(), self.slot,
                 self.generation)

    async def stop(self) -> None:
        if self._gauges is not None:
            self._gauges.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gauges
        if self._drainer is not None:
            await self._drainer.stop()
        if self._popper is not None:
            await self._popper.lot.close()
        if self._listener is not None:
            await self._listener.stop()
        if self.waker is not None:
            await self.waker.close()
        if self._bells is not None:
            self._bells.close()
        if self.link is not None:
            await self.link.stop()
        await self.pool.close()
        if self.spool is not None:
            self.spool.close()
        if self._board is not None:
            self._board.close()
        if self._wake_board is not None:
            self._wake_board.close()
        if self._flags is not None:
            self._flags.close()
        if self._slots is not None:
            self._slots.release(self.slot, os.getpid())
            self._slots.close()
        mark_process_dead(os.getpid())

    async def _gauge_loop(self) -> None:
        """Every second: the gauges, and the heap's free pages back after a burst (the
        request caches cleared first: ``HeapTrim``)."""
        trim = HeapTrim(clear=request_caches, collect=True)
        while True:
            try:
                self.refresh_gauges()
            except Exception:
                log.exception("pool and disk gauges not written")
            trim.tick()
            await asyncio.sleep(GAUGES_EVERY_S)

    def refresh_gauges(self) -> None:
        """Write this worker's pool gauges (connections in use and idle, requests waiting for
        one) and the disk use; cheap: the pool's counters and admission's sampled figure."""
        m = self.metrics
        if m is None:
            return
        stats = self.pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        m.pg_pool_connections.labels("in_use").set(max(size - idle, 0))
        m.pg_pool_connections.labels("idle").set(idle)
        m.pg_pool_waiting.set(stats.get("requests_waiting", 0))
        if self.disk_used is not None:
            m.disk_used_percent.set(self.disk_used())

    async def publish_hold(self, oldest_us: int | None, episode: int,
                           buckets: list[int] | None) -> dict[str, Any]:
        """This instance's row of ``queen.spool_holds`` (front/spoolhold.py): hold ``episode``
        published with its oldest undrained record's accept time (and per bucket), or
        withdrawn (None)."""
        async with connection(self.pool) as conn:
            return await procs.spool_hold(conn, self.holder, episode, oldest_us, HOLD_TTL_MS,
                                          self.runtime.prefix, buckets)

    @property
    def holder(self) -> str:
        """This instance's key in ``queen.spool_holds``: its spool directory, the same after a
        restart (which takes the row of the process before over)."""
        return f"{self.config.instance_name}:{self.config.spool_path}"

    @property
    def flags(self) -> FlagsBoard:
        assert self._flags is not None, "front worker not started"
        return self._flags

    @property
    def drainer(self) -> Drainer:
        assert self._drainer is not None, "front worker not started"
        return self._drainer

    def push_maintenance(self) -> bool:
        """Push maintenance per the flags board (no PostgreSQL round trip)."""
        return self._flags is not None and self._flags.push_maintenance()

    @property
    def ingest(self) -> Ingest:
        assert self._ingest is not None, "front worker not started"
        return self._ingest

    @property
    def transactions(self) -> Transactions:
        assert self._transactions is not None, "front worker not started"
        return self._transactions

    @property
    def popper(self) -> Popper:
        assert self._popper is not None, "front worker not started"
        return self._popper

    def after_acks(self, tenant: bytes, results: list[GroupAck]) -> None:
        """Count what acks consumed; wake pops parked on the caller's (``tenant``) queues
        where a lease was released."""
        if self.metrics is not None:
            self.metrics.tally.inc(self.metrics.messages_acked, (), sum(r.acked for r in results))
        if self.waker is not None:
            self.waker.wake(bucket_of(tenant, r.queue) for r in results
                            if r.lease_released and r.queue)

    def grant_leases(self, tenant: bytes, lease_id: str, group: str,
                     claims: list[Claim], hashes: dict[int, list[bytes]]) -> dict[int, bytes]:
        """Tell each claim's ack shard what was delivered under the lease (the ack registry);
        the hash set granted, by partition id.

        Best effort: a grant that does not arrive only sends that batch's ack down the SQL path.
        The grants leave at the end of the loop turn, before the pop's answer (written to its
        socket at the end of the turn too, after them).
        """
        granted: dict[int, bytes] = {}
        if not self.config.ack_registry or self.link is None:
            return granted
        # PERF(pop): the canonical text ``Popper`` made of the lease (str of a UUID): its hex
        # read in C, not through UUID's Python constructor (12k instructions)
        lease = bytes.fromhex(lease_id.replace("-", ""))
        for claim in claims:
            delivered = hashes.get(claim.partition_id)
            if not delivered or claim.lease_expires_at is None:
                continue
            distinct = hash_set(delivered)
            if len(distinct) != 16 * len(delivered):
                # NOTE(queen): a transactionId delivered twice (dedup off): acking it resolves
                # to its lowest offset only, which a set cannot express; the SQL path decides.
                continue
            grant = LeaseGrant(tenant, lease, claim.partition_id, claim.end,
                               int(claim.lease_expires_at.timestamp() * 1000), group,
                               claim.queue, distinct)
            self.link.post(ack_shard(claim.partition_id, self.runtime.shards), grant.pack())
            granted[claim.partition_id] = distinct
        return granted

    def after_transaction(self, tenant: bytes, queues: set[str], pushed: int) -> None:
        """A committed transaction of ``tenant``: count its pushes, wake pops parked on what
        it touched."""
        if self.metrics is not None and pushed:
            self.metrics.messages_pushed.labels("queued").inc(pushed)
        if self.waker is not None and queues:
            self.waker.wake(bucket_of(tenant, q) for q in queues)

    def count_popped(self, n: int) -> None:
        if self.metrics is not None:
            self.metrics.tally.inc(self.metrics.messages_popped, (), n)

    def count_pushed(self, results: PushResults) -> None:
        metrics = self.metrics
        if metrics is not None:
            each = results.each
            if len(each) == 1 and each[0] is not None:
                # PERF(metrics): a 1-item push's one status, without the table of four
                # counts (8.1k instructions a push, 3.2k this way; bench.hotpath front1)
                metrics.tally.inc(metrics.messages_pushed, (each[0].status,), 1)
                return
            for status, n in results.counts().items():
                if n:
                    metrics.tally.inc(metrics.messages_pushed, (status,), n)

    def shards_alive(self) -> int:
        return self._board.alive(SHARD_STALE_MS) if self._board is not None else 0

    def processes(self) -> tuple[list[WorkerState], list[ShardState]]:
        """The instance's front worker slots ever claimed and its shards, as shared memory
        tells them (lock-free reads: a slot being taken over may show either owner)."""
        workers: list[WorkerState] = []
        if self._slots is not None:
            for slot in range(self._slots.nslots):
                generation = self._slots.generation(slot)
                if generation:
                    workers.append(WorkerState(slot, self._slots.owner(slot), generation))
        shards: list[ShardState] = []
        if self._board is not None:
            for index in range(self._board.size):
                pid, _beat, boots = self._board.read(index)
                shards.append(ShardState(index, pid, self._board.age_ms(index), boots))
        return workers, shards
