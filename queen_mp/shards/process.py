"""A shard process: ``main(index)``, run in a fork of the supervisor
(queen_mp/processes/forked.py).

A shard owns the partitions that hash to it. It reads records from every worker slot's request
ring when its doorbell rings, hands pushes to fusion, and writes verdicts to the reply ring of
the slot that asked, ringing that slot's doorbell. It beats on the heartbeat board so the
supervisor and ``/health`` know it is alive. SIGTERM only sets a flag; the main loop then
flushes whatever is pending and exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import deque
from functools import partial
from itertools import islice, pairwise

import uvloop

from queen_mp import keyring
from queen_mp.config import Config
from queen_mp.crypto import PayloadCipher
from queen_mp.db import errors as dberrors
from queen_mp.db.bundles import BundleWriter
from queen_mp.heap import BUSY_TRIM_EVERY_S, HeapTrim, freeze_startup_objects
from queen_mp.ipc.doorbell import AsyncDoorbellWaiter, Doorbell
from queen_mp.ipc.heartbeat import HeartbeatBoard
from queen_mp.ipc.ring import Ring
from queen_mp.ipc.slots import SlotTable
from queen_mp.ipc.wakeboard import WakeBoard, bucket_of
from queen_mp.ipc.wakeup import Waker
from queen_mp.logs import configure_logging
from queen_mp.metrics import Metrics
from queen_mp.runtime import Runtime
from queen_mp.shards.ackfusion import AckFusion, AckRow
from queen_mp.shards.dedupspill import SpillFile
from queen_mp.shards.fusion import PushFusion
from queen_mp.shards.housekeeping import Housekeeping
from queen_mp.shards.queuegauges import QueueGauges
from queen_mp.shards.registry import AckRegistry
from queen_mp.shards.timerfire import TimerFirer
from queen_mp.wire.errors import RecordDecodeError
from queen_mp.wire.records import (
    ACK_MISS,
    KIND_ACK_REQUEST,
    KIND_LEASE_GRANT,
    KIND_PUSH_GROUP,
    KIND_RECORD_BATCH,
    AckRequest,
    AckVerdict,
    LeaseGrant,
    PushGroup,
    RecordBatch,
    pack_batch,
    peek_kind,
)

__all__ = ["Shard", "main"]

log = logging.getLogger("queen_mp.shard")

BEAT_EVERY_S = 0.25
_READ_BATCH = 256
_BATCH_HEAD_BYTES = RecordBatch.packed_size(())


class Shard:
    def __init__(self, config: Config, runtime: Runtime, index: int) -> None:
        self.config = config
        self.runtime = runtime
        self.index = index
        # PERF(shard): the loop kept once: asyncio.get_running_loop() makes a getpid system
        # call each time on Python 3.11 (its fork check)
        self.loop = asyncio.get_running_loop()
        self.stop_requested = asyncio.Event()
        self.board = HeartbeatBoard.attach(runtime.heartbeat, runtime.shards)
        self.board.booted(index, os.getpid())
        self.epoch = self.board.read(index)[2]
        self.requests = [Ring.attach(runtime.request_ring(s, index)) for s in range(runtime.slots)]
        self.replies = [Ring.attach(runtime.reply_ring(s, index), epoch=self.epoch)
                        for s in range(runtime.slots)]
        self.slot_bells = [Doorbell.attach(runtime.slot_doorbell(s))
                           for s in range(runtime.slots)]
        self.bell = Doorbell.attach(runtime.shard_doorbell(index))
        self.slot_table = SlotTable.attach(runtime.slot_table)
        self.live_slots = self.owned_slots()
        self.outbox: list[deque[bytes]] = [deque() for _ in range(runtime.slots)]
        self.flush_scheduled: set[int] = set()  # slots whose flush_outbox is due this iteration
        self.wake_slots: set[int] = set()  # slots to ring at that flush even with nothing sent
        self.metrics = Metrics(config.instance_name)
        dberrors.on_event(self.metrics.db_event)
        self.writer = BundleWriter(config.pg_dsn, config.v2_fusion_max_inflight,
                                   config.pg_statement_timeout_ms,
                                   f"queen-mp shard {index}")
        self.fusion = PushFusion(self.writer, self.reply, self.metrics,
                                 bundle_max=config.v2_bundle_max,
                                 max_inflight=config.v2_fusion_max_inflight,
                                 hold_ms=config.v2_fusion_hold_ms,
                                 stored=self.wake_pops,
                                 dedup_entries=config.dedup_filter_entries,
                                 dedup_spill=SpillFile(config.dedup_spill_path,
                                                       config.dedup_spill_bytes))
        self.wake_board = WakeBoard.attach(runtime.wake_board)
        self.waker = Waker(self.wake_board, runtime.prefix, config.pg_dsn,
                           notify=config.wake_notify)
        # the acks of the ring pass running now (``drain_requests``), None between passes
        self._acks_due: list[tuple[int, AckRequest]] | None = None
        self.registry = (AckRegistry(config.ack_registry_mb << 20) if config.ack_registry
                         else None)
        # PERF(ack): the two children looked up once; labels() cost 4 us an ack request
        self.ack_hits = self.metrics.ack_registry.labels("hit")
        self.ack_misses = self.metrics.ack_registry.labels("miss")
        self.acks = AckFusion(config.pg_dsn, fused=config.ack_fusion, released=self.wake_pops,
                              name=f"queen-mp shard {index} acks", metrics=self.metrics,
                              statement_timeout_ms=config.pg_statement_timeout_ms)
        self.housekeeping = Housekeeping(config.pg_dsn, shards=runtime.shards, index=index,
                                         every_s=config.housekeeping_s,
                                         name=f"queen-mp shard {index} housekeeping",
                                         metrics=self.metrics,
                                         statement_timeout_ms=config.pg_statement_timeout_ms)
        self.timers = TimerFirer(config.pg_dsn, self.wake_pops,
                                 name=f"queen-mp shard {index} timers",
                                 retention_s=config.timer_fired_retention_s,
                                 cipher=_cipher(config),
                                 max_decompressed=config.max_decompressed_mb << 20,
                                 statement_timeout_ms=config.pg_statement_timeout_ms)
        # one process per instance computes the per-queue gauges (shards/queuegauges.py)
        self.queue_gauges = (QueueGauges(config.pg_dsn, directory=runtime.metrics_dir,
                                         every_s=config.metrics_queue_s,
                                         cap=config.metrics_queue_cap,
                                         name=f"queen-mp shard {index} queue gauges",
                                         statement_timeout_ms=config.pg_statement_timeout_ms)
                             if index == 0 else None)

    # ------------------------------------------------------------------ inbound
    def drain_requests(self) -> None:
        """Every request ring, then the acks read from them.

        NOTE(ack): acks after everything else of the pass, so that a lease grant in another
        worker's ring (grants ring no doorbell: ipc/shardlink.py ``post``) is in the registry
        before the ack that reads it, whatever the order of the rings."""
        more = False
        acks: list[tuple[int, AckRequest]] = []
        self._acks_due = acks
        try:
            for slot, ring in enumerate(self.requests):
                # PERF(shard): read in place (``Ring.read_each``): ``dispatch`` keeps nothing
                # of a record but what it copies or compresses out of it
                ring.read_each(_READ_BATCH, partial(self.dispatch, slot))
                more = more or ring.used > 0
        finally:
            self._acks_due = None
        for slot, req in acks:
            self.ack(slot, req)
        if more:
            self.loop.call_soon(self.drain_requests)

    def dispatch(self, slot: int, raw: bytes | memoryview) -> None:
        """One request record, read in place in its ring when ``raw`` is a view: what is
        kept of it (push groups, grants, acks) is copied or compressed out of it here."""
        try:
            kind = peek_kind(raw)
            if kind == KIND_RECORD_BATCH:
                add, unpack = self.fusion.add, PushGroup.unpack
                bounds = RecordBatch.bounds(raw)
                for start, stop in pairwise(bounds):
                    # PERF(shard): a front worker's pushes of one turn, without a call each,
                    # each group read in place in the batch
                    if start == stop or raw[start] != KIND_PUSH_GROUP:
                        self.dispatch(slot, bytes(raw[start:stop]))
                        continue
                    try:
                        add(slot, unpack(raw, start, stop, True))
                    except RecordDecodeError:
                        log.exception("undecodable request record from slot %d dropped", slot)
            elif kind == KIND_PUSH_GROUP:
                self.fusion.add(slot, PushGroup.unpack(raw, pack_raw=True))
            elif kind == KIND_LEASE_GRANT:
                if self.registry is not None:
                    self.registry.grant(LeaseGrant.unpack(bytes(raw)))
            elif kind == KIND_ACK_REQUEST:
                req = AckRequest.unpack(bytes(raw))
                if self._acks_due is not None:
                    self._acks_due.append((slot, req))
                else:
                    self.ack(slot, req)
            else:
                raise RecordDecodeError(f"unexpected record kind {kind}", raw)
        except RecordDecodeError:
            # NOTE(queen): a bug between our own processes, never client input; the request
            # times out at the front worker rather than taking the shard down.
            log.exception("undecodable request record from slot %d dropped", slot)

    def ack(self, slot: int, req: AckRequest) -> None:
        """Registry hit -> fused positional advance; anything else -> the SQL path (a miss)."""
        entry = self.registry.take(req) if self.registry is not None else None
        (self.ack_hits if entry is not None else self.ack_misses).inc()
        if entry is None:
            self.reply(slot, AckVerdict(req.generation, req.slot, req.request_id,
                                        req.group_index, ACK_MISS).pack())
            return

        def answer(status: int, old: int, new: int) -> None:
            self.reply(slot, AckVerdict(req.generation, req.slot, req.request_id,
                                        req.group_index, status, old, new).pack())

        self.acks.add(AckRow(req.tenant, req.partition_id, req.group, req.lease,
                             entry.batch_end, entry.count, entry.queue), answer)

    # ------------------------------------------------------------------ outbound
    def wake_pops(self, queues: set[tuple[bytes, str]]) -> None:
        """Pops parked on these queues may now claim: tell every front worker (and instance)."""
        self.waker.wake(bucket_of(tenant, queue) for tenant, queue in queues)
        # PERF(pop): ring every front worker (once per loop iteration): one with a parked pop
        # on these queues looks at the board now instead of at its next tick.
        for slot in self.live_slots:
            self.flush_soon(slot, wake=True)

    def owned_slots(self) -> list[int]:
        """The worker slots a front worker owns now.

        PERF(ipc): there are twice as many slots as workers (a replacement takes a free one);
        a wake rang the others too, a FIFO write nobody reads, and once its 64 KiB filled a
        BlockingIOError each. Re-read every heartbeat: a worker that claims a slot meanwhile
        has no parked pop yet, and its pops' wake tick covers the rest."""
        return [slot for slot in range(self.runtime.slots) if self.slot_table.owner(slot)]

    def reply(self, slot: int, record: bytes) -> None:
        """Send a packed verdict (PushVerdict, AckVerdict) to the slot's worker; its flush is
        scheduled once per loop iteration (``flush_soon``, inline: one call per verdict)."""
        self.outbox[slot].append(record)
        if slot not in self.flush_scheduled:
            self.flush_scheduled.add(slot)
            self.loop.call_soon(self.flush_outbox, slot)

    def flush_soon(self, slot: int, *, wake: bool = False) -> None:
        """Flush the slot's outbox (and ring its worker) once per loop iteration; ``wake``
        rings it even with no verdict to send.

        PERF(ipc): one bundle commit answers many requests at once; one ring per front worker
        instead of one per verdict saves a futex wake and a thread switch each.
        """
        if wake:
            self.wake_slots.add(slot)
        if slot not in self.flush_scheduled:
            self.flush_scheduled.add(slot)
            self.loop.call_soon(self.flush_outbox, slot)

    def flush_outbox(self, slot: int) -> None:
        """Write the slot's pending verdicts; ring its worker if any went or a wake asked.

        PERF(ipc): the verdicts that fit one ring record travel as one ``RecordBatch``.
        """
        self.flush_scheduled.discard(slot)
        # PERF(pop): a wake rings only a worker with a parked pop (queen_mp/front/parking.py
        # says why none is missed); every ack that released a lease rang every worker.
        wake = slot in self.wake_slots and self.slot_table.parked(slot)
        self.wake_slots.discard(slot)
        box, ring = self.outbox[slot], self.replies[slot]
        limit = ring.max_record
        sent = False
        n = len(box)
        # PERF(ipc): the common case, every pending verdict in one record, sized in C
        if (n > 1 and sum(map(len, box)) + 4 * n + _BATCH_HEAD_BYTES <= limit
                and ring.try_write(pack_batch(box))):
            box.clear()
            sent = True
        while box:
            if len(box[0]) > limit:
                # NOTE(queen): blocks this loop until the worker drains the chunks (1 s at
                # most); a verdict that large is a 100k-frame push, rare by construction.
                ring.write(box[0], timeout=1.0)
                box.popleft()
                sent = True
                continue
            n, size = 0, RecordBatch.packed_size(())
            for verdict in box:
                size += 4 + len(verdict)
                if size > limit:
                    break
                n += 1
            record = box[0] if n <= 1 else pack_batch(tuple(islice(box, n)))
            n = max(n, 1)
            if not ring.try_write(record):
                break  # full: retried on the next tick
            for _ in range(n):
                box.popleft()
            sent = True
        if sent or wake:
            self.slot_bells[slot].ring()

    # ------------------------------------------------------------------ loops
    async def heartbeat(self) -> None:
        """Every beat: the board, the slots' outboxes, a share of the dedup filter's tidying
        (``Fusion.tidy``), and the heap's free pages back after a burst (``HeapTrim``: the
        same 2% of a core as a front worker's quiet tick).

        PERF(memory): the dedup filter's runs (a few KB each, below the mmap threshold) are
        merged and dropped under push loads; what they freed stayed in the shard's heap for
        good: bench.dedupfilter --pss at the push cells' loads, anonymous pages once trimmed
        35.1 -> 33.1 MB after the 1,000-item case, 29.1 -> 4.5 MB once every run left. Under
        load too, every ``BUSY_TRIM_EVERY_S``: the filter's merges left 11 MB of its heap free
        by the end of that case; a live shard's peak under 80 s of 1,000-item pushes (the
        filter at its bound, bench.parkmem --load 1000 --load-s 80) 66.6-69.8 -> 64.9-67.7 MB
        (3 runs each; issue 26)."""
        parent = os.getppid()
        trim = HeapTrim(quiet_cpu_s=0.02 * BEAT_EVERY_S, busy_every_s=BUSY_TRIM_EVERY_S)
        while True:
            if os.getppid() != parent:
                # NOTE(queen): the supervisor died without stopping us; flush and leave rather
                # than hold partitions nobody supervises.
                log.error("shard %d: supervisor %d is gone; stopping", self.index, parent)
                self.stop_requested.set()
            self.board.beat(self.index)
            self.live_slots = self.owned_slots()
            for slot, box in enumerate(self.outbox):
                if box:
                    self.flush_outbox(slot)
            self.fusion.tidy()
            trim.tick()
            await asyncio.sleep(BEAT_EVERY_S)

    async def run(self) -> None:
        loop = self.loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        waiter = AsyncDoorbellWaiter(self.bell, loop, self.drain_requests)
        waiter.start()
        tasks = [loop.create_task(self.heartbeat()), loop.create_task(self.fusion.hold_tick()),
                 loop.create_task(self.timers.run()),
                 loop.create_task(self.housekeeping.run())]
        if self.queue_gauges is not None:
            tasks.append(loop.create_task(self.queue_gauges.run()))
        self.drain_requests()
        freeze_startup_objects()
        log.info("shard %d up (pid %d, epoch %d)", self.index, os.getpid(), self.epoch)
        await self.stop_requested.wait()
        log.info("shard %d stopping: flushing pending pushes", self.index)
        waiter.stop()
        self.drain_requests()
        try:
            async with asyncio.timeout(self.config.shutdown_timeout_s):
                await self.fusion.drain()
                await self.acks.drain()
        except TimeoutError:
            log.error("shard %d: pending pushes not flushed in time", self.index)
        for slot in range(self.runtime.slots):
            self.flush_outbox(slot)
        for task in tasks:
            task.cancel()
        await self.housekeeping.close()
        if self.queue_gauges is not None:
            await self.queue_gauges.close()
        await self.acks.close()
        await self.writer.close()
        await self.waker.close()
        self.wake_board.close()
        self.slot_table.close()
        self.board.clear(self.index)


def _cipher(config: Config) -> PayloadCipher | None:
    """The instance's keys (the supervisor's ring, inherited at fork), for the timers."""
    ring = keyring.for_process(config)
    return PayloadCipher(ring) if ring is not None else None


def main(index: int) -> int:
    """Run shard ``index`` until it is told to stop; its exit status. Settings and instance
    facts come from the environment the supervisor prepared."""
    config = Config.load()
    configure_logging(config.log_level)
    runtime = Runtime.from_env()
    # PERF(shards): uvloop, as the front workers run; the stdlib loop's own Python (select,
    # handle dispatch, add_reader) was a fifth of a shard's samples under a consume load.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_run(config, runtime, index))
    return 0


async def _run(config: Config, runtime: Runtime, index: int) -> None:
    await Shard(config, runtime, index).run()
