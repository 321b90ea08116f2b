"""The background drain: replays spooled pushes through the normal push path.

Where it runs: every front worker runs one ``Drainer`` task; a pass starts only in the worker
that takes the spool directory's ``drain.lock`` (``SpoolReader``), so an instance has at most
one drainer at a time. The lock is a flock: a worker that dies releases it and another worker
takes over on its next tick (0.25 s). Pending files of earlier processes (a crash, a restart of
the broker) are found by the first pass after boot, which runs unconditionally.

When a pass runs: push maintenance is off (the flags board) and the spool has pending records
(``spool_stats``), or a drain was requested (``POST /api/v1/system/spool/drain``, or maintenance
just ended). A pass that hit a transient failure (PostgreSQL or a shard down, a bundle timeout)
stops and the next one waits 1, 2, 4 then 5 s; a request restarts at once.

How a record is replayed: decoded (``SpoolItem``), checked (names, a single frame whose message
id and transactionId match the record), encrypted when its queue is encrypted and the frame is
not yet (maintenance spools before the encryption lookup), then grouped by (tenant, queue,
partition) and sent to the owning shard as a ``PushGroup``, exactly as ``Ingest.push`` does.
The frame is replayed as it was spooled, so the message keeps its messageId and transactionId;
SQL deduplication on the transactionId makes a replay idempotent: a record answered
``duplicate`` is done (its original is stored, under the same messageId, since that original
can only be an earlier replay or the bundle that failed and committed after all). Within one
batch, a repeat of (tenant, queue, partition, transactionId) is a follower of the first.

Order (front/spoolhold.py): the reader merges the files by accept time. At each turn the
drain publishes in ``queen.spool_holds`` the accept time of its oldest pending record, overall
and per bucket of partitions (``ORDER_BUCKETS``), and in the same call reads the other
instances'; it replays the records older than every other live instance's oldest of their
bucket (a producer's order is per partition), keeps the rest of the batch in memory, and when
none may go, waits for another write to reach the flags board. A pass that finds nothing left
takes ``hold.lock`` exclusively (pushes wait), replays what came in meanwhile, clears the
instance's hold and withdraws its row: from then on pushes go to PostgreSQL again.

Progress is the reader's per-file watermark: after each batch, every file is marked done up to
the last record before its first one that must be retried (or was not replayed). A crash
between a replay and that mark replays the record again (deduplicated). Records that can never
be stored (undecodable, invalid names or frame, an encrypted queue without a key, or a bundle
refused by PostgreSQL with a definite statement error three times) are appended to
``<spool>/failed/`` (fsynced) and then marked done: ``spool.failed`` counts them, and
``POST /api/v1/system/spool/drain {"retryFailed": true}`` appends them to the spool again
(``requeue_failed``).

KNOWN ISSUE (dedupWindow 0): a queue whose dedupWindow is 0 has no deduplication, so a record
whose original bundle did commit after all (a statement timeout or a lost connection after
COMMIT: the push answered ``buffered``, the bundle committed anyway), or a replay cut off
between its commit and its watermark, is stored twice, with the same messageId both times.
The SQL push procedures are left as they are; with the default window the replay is exact.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import functools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queen_mp.db.errors import DatabaseError
from queen_mp.front.ingest import EncryptionUnavailable, Ingest, pieces_of
from queen_mp.front.queueflags import FlagsUnavailable
from queen_mp.front.spoolhold import HOLD_BEAT_MS, PUBLISH_TIMEOUT_S, SpoolHold, now_us
from queen_mp.ipc.flags import FlagsBoard
from queen_mp.ipc.routing import push_shard
from queen_mp.ipc.shardlink import ShardGone, verdicts_of
from queen_mp.models.items import PushItem
from queen_mp.spool.spool import (
    SpoolBusyError,
    SpoolDecodeError,
    SpoolError,
    SpoolItem,
    SpoolPosition,
    SpoolReader,
    SpoolStats,
    SpoolWriteError,
    SpoolWriter,
    spool_stats,
)
from queen_mp.wire.binary_push import check_partition_name, check_queue_name
from queen_mp.wire.errors import WireError
from queen_mp.wire.frames import FLAG_ENCRYPTED, iter_frames
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.records import PushGroup, PushVerdict

__all__ = ["FAILED_DIR", "DrainStatus", "Drainer", "failed_dir", "spool_status"]

log = logging.getLogger("queen_mp.spool.drain")

FAILED_DIR = "failed"
TICK_S = 0.25
BATCH_RECORDS = 500
BATCH_BYTES = 8 << 20
_BACKOFF_S = (1.0, 2.0, 4.0, 5.0)
_IDLE_BACKOFF_S = 30.0  # stats say pending but a pass found nothing (unreadable bytes)
_STATEMENT_STRIKES = 3
_PEER_POLL_S = 0.002
_PEER_WAIT_S = 2.0   # one wait for another instance's older records, then a new pass
_PEER_PASSES_S = 30.0  # how long one drain keeps waiting for them before the loop looks again
_NO_LIMIT = 1 << 62
#: a drain orders its records against other instances' per bucket of partitions (a
#: producer's order is per partition): records of other buckets do not wait for each other
ORDER_BUCKETS = 64


def failed_dir(spool_dir: str | os.PathLike[str]) -> Path:
    """Where permanently rejected records wait for ``retryFailed``."""
    return Path(spool_dir) / FAILED_DIR


@dataclass(frozen=True, slots=True)
class DrainStatus:
    """``GET /api/v1/system/spool`` minus ``dbHealthy``."""

    pending: int
    failed: int
    files: int
    bytes: int
    draining: bool
    last_drain_ms: int


def spool_status(spool_dir: str | os.PathLike[str], flags: FlagsBoard) -> DrainStatus:
    """Blocking (a few syscalls per spool file): call it from a thread."""
    main = spool_stats(spool_dir)
    failed = _stats_or_empty(failed_dir(spool_dir))
    return DrainStatus(main.pending, failed.pending, main.files, main.bytes, flags.draining(),
                       flags.last_drain_ms)


def _stats_or_empty(directory: Path) -> SpoolStats:
    try:
        return spool_stats(directory)
    except FileNotFoundError:
        return SpoolStats(0, 0, 0)


class _Verdict(enum.Enum):
    DONE = "done"        # stored (queued) or already stored (duplicate)
    FAILED = "failed"    # can never be stored: to the failed spool
    RETRY = "retry"      # transient: the pass stops, the record stays pending


class _Pass(enum.Enum):
    EMPTY = "empty"      # nothing was pending
    DRAINED = "drained"  # replayed everything that was pending
    RETRY = "retry"      # stopped on a transient failure
    STOPPED = "stopped"  # maintenance came back on
    BUSY = "busy"        # another worker holds drain.lock
    WAIT = "wait"        # another instance holds older records: stopped before ours


@dataclass(slots=True)
class _Entry:
    position: SpoolPosition
    raw: bytes
    item: SpoolItem | None = None
    verdict: _Verdict | None = None
    reason: str = ""
    leader: int = -1  # index of the batch entry this one follows, -1 = its own leader
    stamp: int = 0  # accept time, Unix us (0: unknown, an older build's record)
    bucket: int = 0  # ORDER_BUCKETS slot of its partition


@dataclass(slots=True)
class _Counters:
    queued: int = 0
    duplicate: int = 0
    failed: int = 0
    retried: int = 0
    strikes: dict[tuple[str, int], int] = field(default_factory=dict)


def _take(records: Iterator[tuple[SpoolPosition, bytes]]) -> list[_Entry]:
    batch: list[_Entry] = []
    size = 0
    for position, raw in records:
        e = _Entry(position, raw, stamp=SpoolItem.accepted_us_of(raw))
        try:
            it = SpoolItem.decode(raw)
            e.bucket = push_shard(it.tenant, it.queue, it.partition, ORDER_BUCKETS)
        except SpoolDecodeError:
            pass  # NOTE(queen): failed when replayed; its bucket does not matter
        batch.append(e)
        size += len(raw)
        if len(batch) >= BATCH_RECORDS or size >= BATCH_BYTES:
            break
    return batch


def _oldest_by_bucket(batch: list[_Entry]) -> list[int]:
    """What we publish per bucket: the oldest accept time of our records not stored yet.
    A bucket without any in the batch gets the batch's last accept time: every record after
    the batch (and every later append) is not older."""
    floor = max((e.stamp for e in batch), default=0)
    oldest = [floor] * ORDER_BUCKETS
    for e in batch:
        if e.verdict is None and e.stamp < oldest[e.bucket]:
            oldest[e.bucket] = e.stamp
    return oldest


def _peer_limits(view: dict[str, Any], instance: str) -> list[int]:
    """Per bucket, the oldest accept time (Unix us) of another holder's records not stored
    yet: ours older than that may be stored."""
    limits = [_NO_LIMIT] * ORDER_BUCKETS
    buckets = view.get("buckets") or {}
    for h in view.get("holds") or ():
        if not isinstance(h, dict) or h.get("instance") == instance:
            continue
        theirs = buckets.get(h.get("instance")) if isinstance(buckets, dict) else None
        if not isinstance(theirs, list) or len(theirs) != ORDER_BUCKETS:
            theirs = [int(h.get("oldestUs") or 0)] * ORDER_BUCKETS
        limits = [min(mine, int(t or 0)) for mine, t in zip(limits, theirs, strict=True)]
    return limits


class Drainer:
    """One per front worker; see the module docstring."""

    def __init__(self, spool_dir: str | os.PathLike[str], ingest: Ingest, flags: FlagsBoard,
                 writer: SpoolWriter, writer_tag: str, *, fsync: bool = True,
                 metrics: Any = None, hold: SpoolHold | None = None,
                 instance: str = "") -> None:
        self.spool_dir = Path(spool_dir)
        self.failed_dir = failed_dir(spool_dir)
        self.ingest = ingest
        self.flags = flags
        self.writer = writer          # this worker's spool writer: where requeued records go
        self.writer_tag = writer_tag  # failed-spool writer id, unique per process
        self.fsync = fsync
        self.metrics = metrics
        self.counters = _Counters()
        self.hold = hold
        self.instance = instance  # this instance's id in queen.spool_holds
        self._published = False  # our row may be in queen.spool_holds
        self._failed_writer: SpoolWriter | None = None
        # NOTE(queen): every reader and writer operation goes through one thread, in order, so
        # a cancelled pass never closes the reader under a mark_done still running.
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spool-drain")
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("spool drainer ended with an error")
        await self._in_io(self._close_failed_writer)
        self._io.shutdown(wait=True)

    def _close_failed_writer(self) -> None:
        if self._failed_writer is not None:
            self._failed_writer.close()
            self._failed_writer = None

    async def _in_io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    # ------------------------------------------------------------------ loop
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        seen = self.flags.drain_requests
        first = True  # the first pass after boot runs whatever the stats say
        not_before = 0.0
        failures = 0
        while True:
            await asyncio.sleep(TICK_S)
            try:
                maintenance = self._gauges()
                await self._beat()
                stats = await self._in_io(spool_stats, self.spool_dir)
                if self.metrics is not None:
                    self.metrics.spool_pending.set(stats.pending)
                if maintenance:
                    continue
                requested = self.flags.drain_requests != seen
                if requested:
                    seen = self.flags.drain_requests
                    not_before = 0.0
                if loop.time() < not_before:
                    continue
                # NOTE(spool): this worker's own file, once drained to its end, is sealed, and
                # the pass below deletes it: its space comes back without waiting for a
                # rotation (a full disk refuses the pushes that would rotate it).
                released = await self._in_io(self.writer.release_if_drained)
                forced = first or requested or released or self.flags.local_hold()
                if not forced and stats.pending == 0:
                    continue
                result, _ = await self.drain_once()
                if result is _Pass.BUSY:
                    continue
                first = False
                # NOTE(queen): while the drain cannot go on, pushes are spooled at once
                # rather than wait for it (their order is kept: they queue behind).
                self.flags.set_hold_blocked(result is _Pass.RETRY)
                if result is _Pass.RETRY:
                    not_before = loop.time() + _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
                    failures += 1
                elif result is _Pass.EMPTY and not forced:
                    # NOTE(queen): pending by the commit hints, yet nothing readable (a live
                    # writer's unreadable bytes): do not rescan the file every tick.
                    not_before = loop.time() + _IDLE_BACKOFF_S
                else:
                    failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("spool drain pass failed")
                not_before = loop.time() + _BACKOFF_S[-1]

    async def _beat(self) -> None:
        """Keep this instance's hold row alive while its spool holds records (one writer per
        instance and second, elected on the flags board), maintenance or not."""
        if (self.hold is None or self.hold.publish is None or not self.flags.local_hold()
                or not self.flags.claim_hold_beat(HOLD_BEAT_MS)):
            return
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                await self.hold.publish_held(self.flags.local_oldest_us or now_us())
        except (DatabaseError, OSError, TimeoutError) as ex:
            log.warning("spool hold not refreshed: %s", ex)

    async def _publish(self, oldest_us: int | None, episode: int | None = None,
                       buckets: list[int] | None = None) -> dict[str, Any] | None:
        """Publish (or withdraw, None) this instance's hold (``episode``: the board's current
        one; ``buckets``: the oldest per ORDER_BUCKETS slot); the holds as read after it, or
        None if PostgreSQL did not answer."""
        if self.hold is None or self.hold.publish is None:
            return None
        if episode is None:
            episode = self.flags.hold_episode
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                view = await self.hold.publish(oldest_us, episode, buckets)
        except (DatabaseError, OSError, TimeoutError) as ex:
            log.warning("spool hold not published: %s", ex)
            return None
        self._published = oldest_us is not None
        return view

    def _gauges(self) -> bool:
        flags = self.flags.read()
        if self.metrics is not None:
            self.metrics.maintenance_mode.labels("push").set(1 if flags.push else 0)
            self.metrics.maintenance_mode.labels("pop").set(1 if flags.pop else 0)
        return flags.push

    async def drain_once(self) -> tuple[_Pass, int]:
        """One pass if this worker gets ``drain.lock``: (outcome, records resolved)."""
        try:
            reader = await self._in_io(functools.partial(SpoolReader, self.spool_dir,
                                                         fsync=self.fsync))
        except SpoolBusyError:
            return _Pass.BUSY, 0
        pid = os.getpid()
        self.flags.set_drainer(pid)
        replayed = 0
        try:
            loop = asyncio.get_running_loop()
            give_up = loop.time() + _PEER_PASSES_S
            while True:
                result, n = await self._pass(reader)
                replayed += n
                if result is not _Pass.WAIT or loop.time() >= give_up:
                    break
            if result in (_Pass.DRAINED, _Pass.EMPTY):
                if self.flags.local_hold() and self.hold is not None:
                    result, n = await self._close(reader)
                    replayed += n
                elif self._published:
                    await self._publish(None)
            return result, replayed
        finally:
            if self.flags.drainer_pid == pid:
                self.flags.set_drainer(0)
            if replayed:
                self.flags.set_last_drain()
            self._io.submit(reader.close)

    async def _close(self, reader: SpoolReader) -> tuple[_Pass, int]:
        """The closing pass: no append while it runs (pushes wait on ``hold.lock``); if it
        drains everything the hold ends and pushes go to PostgreSQL again."""
        assert self.hold is not None
        fd = await self._in_io(self.hold.lock_closing)
        try:
            result, resolved = await self._pass(reader, closing=True)
            ended = result in (_Pass.DRAINED, _Pass.EMPTY)
            episode = self.flags.hold_episode  # no new hold can begin while we hold the lock
            if ended:
                self.flags.clear_local_hold()
        finally:
            await self._in_io(self.hold.unlock, fd)
        if ended:
            await self._publish(None, episode)
            log.info("spool hold ended: pushes go to PostgreSQL again")
        return result, resolved

    async def _pass(self, reader: SpoolReader, *, closing: bool = False) -> tuple[_Pass, int]:
        records = reader.iter_pending()
        taken: list[_Entry] = []  # the batch: progress is recorded once it is done
        resolved = [0]
        try:
            result = await self._replay_pending(reader, records, taken, resolved, closing)
            if taken:
                resolved[0] += await self._in_io(self._commit, reader, taken)
        finally:
            self._io.submit(records.close)
        if result is _Pass.DRAINED:
            if not resolved[0]:
                return _Pass.EMPTY, 0
            log.info("spool drained: %d queued, %d duplicate, %d failed so far",
                     self.counters.queued, self.counters.duplicate, self.counters.failed)
        return result, resolved[0]

    async def _replay_pending(self, reader: SpoolReader,
                              records: Iterator[tuple[SpoolPosition, bytes]],
                              taken: list[_Entry], resolved: list[int], closing: bool) -> _Pass:
        """Replay batch after batch; ``taken`` is the current batch (entries not replayed
        yet have no verdict, so its commit stops each file's watermark before them)."""
        waiting: list[_Entry] = []  # of the batch, not replayed yet, in accept-time order
        while True:
            if self.flags.push_maintenance():
                return _Pass.STOPPED
            if not waiting:
                if taken:
                    resolved[0] += await self._in_io(self._commit, reader, list(taken))
                    taken.clear()
                taken.extend(await self._in_io(_take, records))
                waiting = list(taken)
            if not waiting:
                return _Pass.DRAINED
            head = waiting[0].stamp
            if head:
                self.flags.set_local_oldest(head)
            # NOTE(queen): one call publishes our oldest (per bucket) and reads the others'.
            # It is read after the batch was: a hold published later holds only records
            # accepted later than all of the batch, so what it tells is good for the batch.
            view = await self._publish(head or self.flags.local_oldest_us or None,
                                       buckets=_oldest_by_bucket(waiting))
            limits = _peer_limits(view, self.instance) if view else None
            now = [e for e in waiting if limits is None or e.stamp <= limits[e.bucket]]
            if not now:
                # NOTE(queen): other instances hold older records of every bucket we have:
                # they go first; the batch waits here (not re-read) until one of them wrote.
                # PERF(queen): its progress is recorded once it is done (fsyncs), not at each
                # turn: a crash replays those records again, deduplicated.
                if closing or not await self._wait_peers(int((view or {}).get("version") or 0)):
                    return _Pass.WAIT
                continue
            chosen = {id(e) for e in now}
            waiting = [e for e in waiting if id(e) not in chosen]
            await self._replay(now)
            if any(e.verdict is _Verdict.DONE for e in now):
                self.flags.set_hold_blocked(False)
            if any(e.verdict is _Verdict.RETRY for e in now):
                return _Pass.RETRY

    async def _wait_peers(self, version: int) -> bool:
        """Until the flags board hears of a settings change after ``version`` (another
        instance published its progress); False after ``_PEER_WAIT_S``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _PEER_WAIT_S
        while loop.time() < deadline:
            if self.flags.read().version > version:
                return True
            await asyncio.sleep(_PEER_POLL_S)
        return False

    # ------------------------------------------------------------------ replay
    async def _replay(self, batch: list[_Entry]) -> None:
        leaders: dict[tuple[bytes, str, str, str], int] = {}
        groups: dict[tuple[bytes, str, str], list[int]] = {}
        for n, e in enumerate(batch):
            self._check(e)
            if e.verdict is not None:
                continue
            it = e.item
            assert it is not None
            key = (it.tenant, it.queue, it.partition, it.transaction_id)
            first = leaders.setdefault(key, n)
            if first != n:
                e.leader = first
                continue
            groups.setdefault((it.tenant, it.queue, it.partition), []).append(n)
        items: dict[int, PushItem] = {}
        for (tenant, queue, _), idx in groups.items():
            for n in idx:
                it = batch[n].item
                assert it is not None
                items[n] = PushItem(it.queue, it.partition, it.transaction_id, it.message_id,
                                    it.payload, it.trace_id)
            await self._encrypt(batch, items, idx, tenant, queue)
        calls = []
        members: list[list[int]] = []
        link = self.ingest.link
        request_id = link.next_request_id()
        deadline = asyncio.get_running_loop().time() + self.ingest.timeout_s
        deadline_ms = int((time.time() + self.ingest.timeout_s) * 1000)
        for (tenant, queue, partition), idx in groups.items():
            idx = [n for n in idx if batch[n].verdict is None]
            if not idx:
                continue
            ordered = [items[n] for n in idx]
            try:
                record = PushGroup(
                    generation=link.generation, slot=link.slot, request_id=request_id,
                    group_index=len(members), tenant=tenant, queue=queue, partition=partition,
                    hashes=b"".join(txn_hash(p.transaction_id) for p in ordered),
                    count=len(ordered), pieces=pieces_of(ordered, list(range(len(ordered))), ()),
                    deadline_ms=deadline_ms).pack()
            except ValueError as ex:
                for n in idx:
                    self._fail(batch[n], f"cannot build the push group: {ex}")
                continue
            calls.append(link.submit(self.ingest.shard_of(tenant, queue, partition),
                                     request_id, len(members), record, deadline))
            members.append(idx)
        outcomes = await verdicts_of(calls)
        for idx, outcome in zip(members, outcomes, strict=True):
            self._settle(batch, idx, outcome)
        for e in batch:
            if e.leader >= 0:
                lead = batch[e.leader]
                e.verdict, e.reason = lead.verdict, lead.reason
                if e.verdict is _Verdict.DONE:
                    self.counters.duplicate += 1

    def _check(self, e: _Entry) -> None:
        """Decode and validate one record; a record that can never be stored is failed."""
        try:
            it = SpoolItem.decode(e.raw)
            check_queue_name(it.queue)
            check_partition_name(it.partition)
            frames = list(iter_frames(it.payload))
        except (SpoolDecodeError, WireError, ValueError) as ex:
            self._fail(e, f"unreadable spool record: {ex}")
            return
        if len(frames) != 1:
            self._fail(e, f"spool record holds {len(frames)} frames, not 1")
            return
        f = frames[0]
        if f.message_id != it.message_id or f.transaction_id != it.transaction_id:
            self._fail(e, "spool record and its frame disagree on the message")
            return
        if not it.transaction_id:
            self._fail(e, "spool record without a transactionId")
            return
        e.item = it

    async def _encrypt(self, batch: list[_Entry], items: dict[int, PushItem], idx: list[int],
                       tenant: bytes, queue: str) -> None:
        plain = [items[n] for n in idx
                 if not next(iter_frames(items[n].frame)).flags & FLAG_ENCRYPTED]
        if not plain:
            return
        try:
            await self.ingest.encrypt(plain, tenant, {queue})
        except EncryptionUnavailable as ex:
            for n in idx:
                self._fail(batch[n], str(ex))
        except FlagsUnavailable as ex:
            for n in idx:
                self._retry(batch[n], str(ex))

    def _settle(self, batch: list[_Entry], idx: list[int], outcome: object) -> None:
        if isinstance(outcome, PushVerdict) and outcome.status == 0:
            for n, v in zip(idx, outcome.each(), strict=True):
                batch[n].verdict = _Verdict.DONE
                if v.status == 0:
                    self.counters.queued += 1
                else:
                    self.counters.duplicate += 1
            return
        if isinstance(outcome, PushVerdict):
            # NOTE(queen): fusion labels a failed bundle "<error class>: <text>"; only a
            # definite refusal by the server (StatementError) can be this record's own fault,
            # and a bundle mixes partitions, so it takes three strikes to fail a record.
            if outcome.error.startswith("StatementError"):
                for n in idx:
                    key = (batch[n].position.path, batch[n].position.offset)
                    strikes = self.counters.strikes.get(key, 0) + 1
                    self.counters.strikes[key] = strikes
                    if strikes >= _STATEMENT_STRIKES:
                        self._fail(batch[n], outcome.error)
                    else:
                        self._retry(batch[n], outcome.error)
                return
            reason = outcome.error or "push bundle failed"
        elif isinstance(outcome, (ShardGone, TimeoutError)):
            reason = f"{type(outcome).__name__}: {outcome}"
        else:
            log.error("spool replay of a group failed: %r", outcome)
            reason = repr(outcome)
        for n in idx:
            self._retry(batch[n], reason)

    def _fail(self, e: _Entry, reason: str) -> None:
        e.verdict, e.reason = _Verdict.FAILED, reason

    def _retry(self, e: _Entry, reason: str) -> None:
        e.verdict, e.reason = _Verdict.RETRY, reason

    # ------------------------------------------------------------------ progress (io thread)
    def _commit(self, reader: SpoolReader, batch: list[_Entry]) -> int:
        """File failed records, then move every file's watermark past its resolved prefix."""
        failed = [e for e in batch if e.verdict is _Verdict.FAILED]
        if failed:
            try:
                if self._failed_writer is None:
                    self._failed_writer = SpoolWriter(self.failed_dir, self.writer_tag,
                                                      fsync=self.fsync)
                self._failed_writer.append([e.raw for e in failed])
            except SpoolWriteError as ex:
                log.error("spool: cannot file %d rejected records (%s); retrying later",
                          len(failed), ex)
                for e in failed:
                    self._retry(e, f"failed spool not writable: {ex}")
            else:
                self.counters.failed += len(failed)
                for e in failed:
                    log.error("spool: record %s@%d rejected for good: %s", e.position.path,
                              e.position.offset, e.reason)
        resolved = 0
        # NOTE(spool): the batch interleaves files (accept-time order); each file's entries
        # keep that file's order, and its watermark stops at its first unresolved one.
        by_file: dict[str, list[_Entry]] = {}
        for e in batch:
            by_file.setdefault(e.position.path, []).append(e)
        for path, entries in by_file.items():
            entries.sort(key=lambda e: e.position.offset)
            last: SpoolPosition | None = None
            for e in entries:
                if e.verdict is _Verdict.RETRY or e.verdict is None:
                    break
                last = e.position
                resolved += 1
                self.counters.strikes.pop((path, e.position.offset), None)
            if last is not None:
                try:
                    reader.mark_done(last)
                except SpoolError:
                    log.exception("spool: progress of %s not recorded; it will be replayed "
                                  "again (deduplicated)", path)
        retried = sum(1 for e in batch if e.verdict is _Verdict.RETRY)
        if retried:
            self.counters.retried += retried
            first = next(e for e in batch if e.verdict is _Verdict.RETRY)
            log.warning("spool drain: %d records to retry (%s)", retried, first.reason)
        return resolved

    # ------------------------------------------------------------------ retryFailed
    async def requeue_failed(self) -> int:
        """Append every record of the failed spool to the spool again; returns how many."""
        return await self._in_io(self._requeue_failed)

    def _requeue_failed(self) -> int:
        if not self.failed_dir.is_dir():
            return 0
        # NOTE(queen): the failed spool's own drain.lock: one requeue at a time per instance.
        with SpoolReader(self.failed_dir, fsync=self.fsync) as reader:
            moved = 0
            batch: list[tuple[SpoolPosition, bytes]] = []

            def flush() -> None:
                self.writer.append([raw for _, raw in batch])
                last: dict[str, SpoolPosition] = {}
                for position, _ in batch:
                    last[position.path] = position
                for position in last.values():
                    reader.mark_done(position)
                batch.clear()

            for position, raw in reader.iter_pending():
                batch.append((position, raw))
                if len(batch) >= BATCH_RECORDS:
                    moved += len(batch)
                    flush()
            if batch:
                moved += len(batch)
                flush()
        if moved:
            log.info("spool: %d rejected records queued for another replay", moved)
        return moved
