"""Push fusion: per-partition accumulation, one flush in flight per partition, bundles.

Frames of a partition accumulate into one segment while that partition's previous flush is in
flight; a bundle takes up to ``bundle_max`` ready, not-in-flight partitions and commits all of
their segments in one ``log_push_multi_v3`` transaction. Dispatch fires on arrival whenever a
bundle permit is free (fire-on-idle); the hold tick is only a backstop. The in-flight cap adapts
to the commit round trip (Vegas-like), so that under load fewer, larger bundles form.

Layer-2 deduplication runs here on the xxh3_128 hashes (first frame wins, later ones inherit its
verdict); duplicates against stored data are reported by SQL, which then writes nothing for that
segment: the duplicate frames get their verdicts and the remainder is resubmitted.

A bundle names its partitions by the ids earlier verdicts gave (PostgreSQL then skips the
name resolution); a bundle that named one by an id that is gone fails with nothing written
(``STALE_IDS``) and goes again at once by name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

import msgspec

from queen_mp.db.bundles import STALE_IDS, BundleWriter, PushBundle, SegmentVerdict
from queen_mp.db.errors import DatabaseError
from queen_mp.metrics import Metrics
from queen_mp.shards.dedupfilter import DedupFilter, Recall
from queen_mp.shards.dedupspill import SpillFile
from queen_mp.wire import frames as wf
from queen_mp.wire.frames import raw_one_head
from queen_mp.wire.hashing import hash_prefixes
from queen_mp.wire.ids import ZERO_UUID
from queen_mp.wire.records import (
    ITEM_QUEUED,
    KIND_PUSH_VERDICT,
    PIECE_RAW,
    VERDICT_OK,
    ItemVerdict,
    PushGroup,
    PushVerdict,
    blob_from_pieces,
    pack_queued_one,
    pack_queued_run,
)

__all__ = ["PushFusion"]

log = logging.getLogger("queen_mp.fusion")

PENDING, QUEUED, DUPLICATE = 0, 1, 2
# Front workers already bounded every client frame; this only guards our own stored data.
_MAX_SEGMENT_BYTES = 1 << 31
_SUMMARY_EVERY_S = 10.0
# Offsets of gaps one read-back of stored hashes covers (16 bytes each), beyond its first gap.
_RECALL_OFFSETS = 1 << 18
# Partition ids a shard remembers; past that it forgets them all (each is learnt again from
# the next verdict of its partition).
_MAX_PIDS = 1 << 17

Key = tuple[bytes, str, str]  # tenant, queue, partition
_TUPLE_NEW = tuple.__new__
_PARTITION_ID = itemgetter(0)  # SegmentVerdict.partition_id
_COUNT = itemgetter(4)  # Segment.count
_GROUP_COUNT = 8  # PushGroup.count's index (generation, slot, request_id, group_index first)
Reply = Callable[[int, bytes], None]  # (slot, a packed PushVerdict)
Stored = Callable[[set[tuple[bytes, str]]], None]  # (tenant, queue) pairs just committed


class Entry(msgspec.Struct, eq=False, gc=False):
    """One ``PushGroup`` from one front worker (``remaining``: its count at first): its
    frames and their verdicts so far.

    PERF(fusion): the per-frame state (``status``, ``offsets``, ``dup_ids``) is made by the
    first ``resolve``: the fast path answers a whole entry with one run
    (``PushFusion._committed``) and never needs it. A Struct made in C (one a pushed group;
    ``__init__`` setting nine slots was about 3k instructions), compared by identity, never
    in a cycle (so untracked by the collector).
    """

    slot: int
    group: PushGroup
    remaining: int  # frames not answered yet
    status: bytearray | None = None  # per frame: PENDING, QUEUED or DUPLICATE
    offsets: list[int] | None = None  # made with status, by the first resolve
    dup_ids: dict[int, bytes] | None = None  # likewise
    partition_id: int = 0
    created_us: int = 0
    frames: list[bytes] | None = None  # split lazily, only on the slow path

    def pending(self, j: int) -> bool:
        return self.status is None or self.status[j] == PENDING

    def hash(self, j: int) -> bytes:
        return self.group.hashes[16 * j:16 * j + 16]

    def split_frames(self) -> list[bytes]:
        """Every frame as its own bytes, decompressing client chunks (slow path only)."""
        if self.frames is None:
            out: list[bytes] = []
            for piece in self.group.pieces:
                raw = piece.data if piece.kind == 0 else wf.decompress_bounded(
                    piece.data, _MAX_SEGMENT_BYTES)
                out.extend(bytes(f.raw) for f in wf.iter_frames(raw))
            if len(out) != self.group.count:
                raise DatabaseError(f"group declares {self.group.count} frames, has {len(out)}")
            self.frames = out
        return self.frames

    def resolve(self, j: int, status: int, offset: int, original: bytes | None = None) -> None:
        if self.status is None or self.offsets is None or self.dup_ids is None:
            self.status = bytearray(self.group.count)
            self.offsets = [-1] * self.group.count
            self.dup_ids = {}
        elif self.status[j] != PENDING:
            return
        self.status[j] = status
        self.offsets[j] = offset
        if original is not None:
            self.dup_ids[j] = original
        self.remaining -= 1

    def verdict(self) -> PushVerdict:
        """Each frame's outcome, once every frame has one (the slow path's answer)."""
        g = self.group
        status, offsets, dup_ids = self.status, self.offsets, self.dup_ids
        assert status is not None and offsets is not None and dup_ids is not None
        items = tuple(
            ItemVerdict(0, offsets[j], b"") if status[j] == QUEUED
            else ItemVerdict(1, offsets[j], dup_ids.get(j, ZERO_UUID))
            for j in range(g.count))
        return PushVerdict(generation=g.generation, slot=g.slot, request_id=g.request_id,
                           group_index=g.group_index, status=0, partition_id=self.partition_id,
                           created_at_us=self.created_us, items=items)

    def failure(self, error: str) -> bytes:
        g = self.group
        return PushVerdict(generation=g.generation, slot=g.slot, request_id=g.request_id,
                           group_index=g.group_index, status=1, partition_id=0, created_at_us=0,
                           error=error, items=()).pack()


class Segment(NamedTuple):
    """What one partition contributes to a bundle, and how its frames map back to entries.

    PERF(fusion): a NamedTuple made in C (``_segment``), one per partition of every bundle: a
    slots dataclass ran its ``__init__`` in Python; no list is made for ``followers`` unless
    the slow path has some."""

    key: Key
    entries: list[Entry]
    hashes: bytes
    blob: bytes
    count: int                                    # frames stored by this segment
    # segment frame k -> (entry, frame j); None on the fast path, where the entries' frames
    # follow each other whole and in order (``ref`` walks them)
    refs: list[tuple[Entry, int]] | None
    followers: Sequence[tuple[Entry, int, int]] = ()  # (entry, j, leader k)

    def ref(self, k: int) -> tuple[Entry, int]:
        if self.refs is not None:
            return self.refs[k]
        for e in self.entries:
            if k < e.group.count:
                return e, k
            k -= e.group.count
        raise IndexError(k)


def _segment(key: Key, entries: list[Entry], hashes: bytes, blob: bytes, count: int
             ) -> Segment:
    """A fast-path Segment (no refs, no followers), built in C."""
    return _TUPLE_NEW(Segment, (key, entries, hashes, blob, count, None, ()))  # type: ignore[no-any-return]


def _message_id(frame: bytes | memoryview) -> bytes:
    # Frame layout (api.md 3.1): u32 body_len | u8 flags | 16B message id | ...
    return bytes(frame[5:21])


def build_segment(key: Key, entries: list[Entry]) -> Segment:
    """Layer-2 dedup plus the hash and payload blobs of one partition's pending frames."""
    if len(entries) == 1:
        # PERF(fusion): one group of one partition (every segment of 1-item pushes): its own
        # hashes and pieces as they are; one hash needs no distinctness test.
        e = entries[0]
        g = e.group
        if e.remaining == g.count == 1 and g.pieces[0].kind == PIECE_RAW:
            # PERF(fusion): one frame stored raw (codec 0, which every reader of a segment
            # takes): zstd's call on a few hundred bytes was 14.9k instructions a message,
            # an eighth of the shard's under 1-item pushes (bench/shardpath.py), to save
            # some 130 bytes of a 233-byte frame
            # _segment's tuple made here: a Python call less per 1-item segment
            return _TUPLE_NEW(Segment, (key, entries, g.hashes,  # type: ignore[no-any-return]
                                        wf.pack_chunk_raw(g.pieces[0].data, 1), 1, None, ()))
        if e.remaining == g.count:
            # PERF(fusion): a group's hashes are distinct, as PushGroup promises (its front
            # worker sends a repeated transactionId of a request to no shard: it follows its
            # first copy's verdict), so one whole group needs no test; the set of 100 prefixes
            # that proved it was 457 of 4,109 instructions a message at 100-item pushes
            # (callgrind, bench/shardpath.py --items 100)
            return _segment(key, entries, g.hashes, blob_from_pieces(g.pieces), g.count)
    elif all(e.remaining == e.group.count for e in entries):
        hashes = b"".join(e.group.hashes for e in entries)
        total = len(hashes) >> 4
        # PERF(queen): distinct 64-bit prefixes prove distinct hashes, in one C-level pass; a
        # shared prefix (a repeat, or a 2^-64 accident) takes the exact slow path below.
        if len(set(hash_prefixes(hashes))) == total:
            # PERF(queen): the common case keeps client chunks and raw frames as they came.
            return _segment(key, entries, hashes,
                            blob_from_pieces([p for e in entries for p in e.group.pieces]),
                            total)
    # Slow path: intra-flush duplicates or a resubmitted remainder; rebuild from frames.
    leader: dict[bytes, int] = {}
    refs = []
    followers: list[tuple[Entry, int, int]] = []
    hashes: list[bytes] = []
    raw: list[bytes] = []
    for e in entries:
        frames = None
        for j in range(e.group.count):
            if not e.pending(j):
                continue
            h = e.hash(j)
            k = leader.get(h)
            if k is not None:
                followers.append((e, j, k))
                continue
            frames = frames or e.split_frames()
            leader[h] = len(refs)
            refs.append((e, j))
            hashes.append(h)
            raw.append(frames[j])
    blob = wf.pack_chunk_zstd(b"".join(raw), len(raw)) if raw else b""
    return Segment(key, entries, b"".join(hashes), blob, len(refs), refs, followers)


class PushFusion:
    """All push state of one shard; single-task-local, so no locks."""

    def __init__(self, writer: BundleWriter, reply: Reply, metrics: Metrics, *,
                 bundle_max: int, max_inflight: int, hold_ms: int,
                 stored: Stored | None = None, dedup_entries: int,
                 dedup_spill: SpillFile | None = None) -> None:
        self.writer = writer
        self.loop = asyncio.get_running_loop()  # once: each call is a getpid on Python 3.11
        self.dedup = DedupFilter(dedup_entries, spill=dedup_spill)
        self.reply = reply
        self.stored = stored
        self.metrics = metrics
        self.bundle_max = bundle_max
        self.max_inflight = max(1, min(max_inflight, writer.size))
        self.cap = self.max_inflight
        self.hold_s = hold_ms / 1000
        # PERF(fusion): lists, not deques: a bundle takes a partition's list as it is (a
        # deque was made per 1-item push and copied to a list at its flush)
        self.pending: dict[Key, list[Entry]] = {}
        self.pids: dict[Key, int] = {}  # partition ids from verdicts, sent in place of names
        self.ready: OrderedDict[Key, None] = OrderedDict()
        self.inflight_keys: set[Key] = set()
        self._kick_soon = False
        self.bundles_inflight = 0
        self.base_rtt = float("inf")
        self._tasks: set[asyncio.Task[None]] = set()
        self._commits = 0
        self._segments = 0
        self._summary_at = time.monotonic()
        self._recalling = False
        # set while the hold tick sleeps for want of pending pushes; the next ``add`` wakes it
        self._arrival: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ intake
    def add(self, slot: int, group: PushGroup) -> None:
        key: Key = group[4:7]  # (tenant, queue, partition): one slice, not three reads
        queue = self.pending.get(key)
        if queue is None:
            queue = self.pending[key] = []
            if self._arrival is not None:
                self._wake_tick()
        queue.append(Entry(slot, group, group[_GROUP_COUNT]))
        if key not in self.inflight_keys:
            self.ready[key] = None
        if not self._kick_soon:
            # PERF(fusion): fire after every group that arrived in this loop iteration is in
            # (the shard drains its rings in one go): a 10-partition request becomes one
            # bundle, not one bundle per partition while permits last.
            self._kick_soon = True
            self.loop.call_soon(self._kick_arrivals)

    def _wake_tick(self) -> None:
        arrival, self._arrival = self._arrival, None
        if arrival is not None and not arrival.done():
            arrival.set_result(None)

    def _kick_arrivals(self) -> None:
        self._kick_soon = False
        self.kick()

    def kick(self) -> None:
        """Fire bundles while permits are free: the whole batching policy."""
        while self.ready and self.bundles_inflight < self.cap:
            keys: list[Key] = []
            while self.ready and len(keys) < self.bundle_max:
                key, _ = self.ready.popitem(last=False)
                keys.append(key)
                self.inflight_keys.add(key)
            self.bundles_inflight += 1
            self._flush(keys)

    async def hold_tick(self) -> None:
        """Liveness backstop: retry held partitions even if no arrival or commit wakes us.

        PERF(shard): with no push pending there is nothing to retry, so the tick sleeps
        until one arrives (or the next summary is due) instead of waking every ``hold_s``: a
        shard that only serves pops and acks paid 67 timer wakes a second for nothing."""
        loop = self.loop
        while True:
            if not self.pending:
                arrival = self._arrival = loop.create_future()
                timer = loop.call_later(
                    max(0.0, self._summary_at + _SUMMARY_EVERY_S - time.monotonic()) + 0.01,
                    _resolve, arrival)
                try:
                    await arrival
                finally:
                    timer.cancel()
                    if self._arrival is arrival:
                        self._arrival = None
                self._maybe_summary()
                continue
            await asyncio.sleep(self.hold_s)
            self.kick()
            self._maybe_summary()

    async def drain(self) -> None:
        """Flush everything pending (graceful stop)."""
        while self.pending or self.bundles_inflight:
            self.kick()
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------------ flush
    # PERF(fusion): a bundle is a chain of callbacks, not a Task: ``_flush`` sends it, the
    # writer calls ``_landed`` with its verdicts, and only a bundle with duplicates to look up
    # (the rare path) continues in a Task. A Task and its coroutine's steps cost 19k
    # instructions a bundle.
    def _flush(self, keys: list[Key]) -> None:
        segments: list[Segment] = []
        try:
            now_ms = int(time.time() * 1000)
            pending = self.pending
            add = segments.append
            for key in keys:
                entries = pending.pop(key, None)
                if not entries:
                    continue
                e = entries[0]
                # PERF(fusion): the group's fields unpacked, not read by name (_committed)
                _, _, _, _, _, _, _, hashes, count, pieces, deadline_ms = e.group
                # a partition's entries come in arrival order, so the first one's deadline is
                # the earliest (every request has the same push timeout)
                if 0 < deadline_ms < now_ms:
                    entries = self._expire(entries, now_ms)
                    if entries:
                        add(build_segment(key, entries))
                elif (len(entries) == 1 and e.remaining == count == 1
                      and pieces[0][0] == PIECE_RAW):
                    # PERF(fusion): build_segment's first case (one 1-frame group, every
                    # segment of 1-item pushes) here: two Python calls less a segment
                    data = pieces[0][2]  # Piece(kind, count, data)
                    add(_TUPLE_NEW(Segment, (key, entries, hashes,
                                             raw_one_head(len(data)) + data, 1, None, ())))
                else:
                    add(build_segment(key, entries))
            if not segments:
                self._flushed(keys)
                return
            # PERF(fusion): the segments' columns and the keys' transposed by zip in C, no
            # comprehension per column
            keys_of, _, hashes, blobs, counts, _, _ = zip(*segments, strict=True)
            tenants, queues, partitions = zip(*keys_of, strict=True)
            # PERF(fusion): made in C, not by the NamedTuple's ``__new__`` with keywords
            bundle: PushBundle = _TUPLE_NEW(PushBundle, (
                queues, partitions, counts, hashes, self.dedup.verified_all(keys_of, hashes),
                blobs, tenants, list(map(self.pids.get, keys_of, repeat(0)))))
            started = time.monotonic()
            self.writer.push(bundle, lambda result: self._landed(keys, segments, started,
                                                                  result, bundle))
        except Exception as ex:
            self._failed(segments, ex)
            self._flushed(keys)

    def _expire(self, entries: list[Entry], now_ms: int) -> list[Entry]:
        """Answer the entries whose request's deadline passed (``PushGroup.deadline_ms``)
        without writing them; the others, in order.

        Why: their front worker answered ``503 timeout`` already, and its client retries with
        new message ids. A group committed after that (it waited here behind a bundle that
        hung until the statement deadline, a PostgreSQL restart) stored the first attempt's
        id, and a retry answered ``buffered`` meanwhile promised another one (issue 26's
        fault matrix, pg-outage: "wrong id"). Not writing is one of the outcomes a timeout
        leaves open; the retry is then the only copy."""
        live: list[Entry] = []
        expired = 0
        for e in entries:
            deadline = e.group.deadline_ms
            if 0 < deadline < now_ms:
                self.reply(e.slot, e.failure(f"Expired: the request's deadline passed "
                                             f"{now_ms - deadline} ms before its bundle; "
                                             "nothing written"))
                e.remaining = 0
                expired += 1
            else:
                live.append(e)
        self.metrics.fusion_errors.labels("Expired").inc(expired)
        return live

    def _landed(self, keys: list[Key], segments: list[Segment], started: float,
                result: list[SegmentVerdict] | Exception, bundle: PushBundle) -> None:
        try:
            if not isinstance(result, list):
                if (isinstance(result, DatabaseError) and result.sqlstate == STALE_IDS
                        and bundle.pids):
                    # Nothing was written: the same bundle again, its partitions by name.
                    for key in zip(bundle.tenants, bundle.queues, bundle.partitions, strict=True):
                        self.pids.pop(key, None)
                    renamed = bundle._replace(pids=())
                    self.writer.push(renamed, lambda again: self._landed(
                        keys, segments, started, again, renamed))
                    return
                raise result
            self._adapt(time.monotonic() - started)
            rest, dup_lookups = self._committed(segments, result, bundle.pids, bundle.verified)
            if dup_lookups:
                task = self.loop.create_task(self._finish_duplicates(keys, rest, dup_lookups))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            if rest:
                self._answer(rest)
        except Exception as ex:
            self._failed(segments, ex)
        self._flushed(keys)

    async def _finish_duplicates(self, keys: list[Key], segments: list[Segment],
                                 lookups: list[tuple[Segment, int, int, int]]) -> None:
        try:
            await self._resolve_duplicates(lookups)
            self._answer(segments)
        except Exception as ex:
            self._failed(segments, ex)
        self._flushed(keys)

    def _failed(self, segments: list[Segment], ex: Exception) -> None:
        """Every entry of the bundle still unanswered gets the error."""
        reason = type(ex).__name__
        if not isinstance(ex, DatabaseError):
            log.error("push bundle failed", exc_info=ex)
        self.metrics.fusion_errors.labels(reason).inc()
        for seg in segments:
            for e in seg.entries:
                if e.remaining:
                    self.reply(e.slot, e.failure(f"{reason}: {ex}"))
                    e.remaining = 0

    def _flushed(self, keys: list[Key]) -> None:
        """The bundle's permit back and its partitions free to flush again, one loop step
        later (``_release``).

        PERF(fusion): after the bundle's verdicts have gone: ``reply`` schedules their flush
        to the front workers' rings before this runs, and ``_committed`` the dedup filter's
        update with its read-backs (``_remember``), so the next bundle (segments built and
        probed, milliseconds at a time under 100-item pushes; their frames compressed when
        their groups were read, ``PushGroup.unpack``'s ``pack_raw``) is made after
        the front workers were rung, not while they wait (perf sched: one CPU idle for 2 ms
        while the shard built it)."""
        self.loop.call_soon(self._release, keys)

    def _release(self, keys: list[Key]) -> None:
        self.bundles_inflight -= 1
        for key in keys:
            self.inflight_keys.discard(key)
            if self.pending.get(key):
                self.ready[key] = None
        self.kick()

    def _committed(self, segments: list[Segment], results: list[SegmentVerdict],
                   sent: Sequence[int], verified: Sequence[int]
                   ) -> tuple[list[Segment], list[tuple[Segment, int, int, int]]]:
        """Record the bundle's verdicts and the partition ids it did not send (``sent``: the
        ids it named them by, or none), and answer the entries stored in one run each; the
        segments left for ``_answer``, and the duplicates whose originals must be looked up.
        A stored segment whose ``p_verified`` (``verified``) stopped below its base had its
        probe read stored hashes in SQL: counted, so that an operator sees the filter give
        way (past its bound every push of a forgotten partition reads its whole window).

        PERF(fusion): an entry of a fast-path segment (every frame stored, in order) is
        answered here, in the loop that reads its verdict, not by a second pass over the
        bundle; its answer reaches the ring after this callback anyway (``reply``)."""
        frames = sum(map(_COUNT, segments))
        self._commits += 1
        self._segments += len(segments)
        dup_lookups: list[tuple[Segment, int, int, int]] = []  # seg, k, pid, original offset
        rest: list[Segment] = []  # segments with entries not answered here
        reply = self.reply
        stored: set[tuple[bytes, str]] = set()  # (tenant, queue) that got new messages
        remember: list[tuple[Key, int, int, int, bytes, int]] = []  # for the dedup filter
        answered = list(map(_PARTITION_ID, results))
        if answered != sent:
            # PERF(fusion): only a bundle that named some partition learns ids (a dict store
            # of a tuple key of fresh strings, hashed and compared, is about 2k instructions)
            pids = self.pids
            if len(pids) > _MAX_PIDS:
                pids.clear()
            for seg, pid in zip(segments, answered, strict=True):
                pids[seg.key] = pid
        probed = 0
        for seg, res, vouched in zip(segments, results, verified, strict=True):
            # PERF(fusion): the NamedTuples' fields unpacked, not read by name: a field read
            # by name (a ``_tuplegetter``, which Python 3.11 does not specialize) is a type
            # lookup and a descriptor call, some 400 instructions; the 16 such reads of a
            # 1-item segment here were most of its cost (bench/shardpath.py)
            pid, ts, queued, base_or_none, window, _ = res
            if queued:
                key, entries, hashes, _, count, refs, _ = seg
                stored.add(key[:2])
                base: int = base_or_none  # type: ignore[assignment]  # set when queued
                remember.append((key, pid, base, count, hashes, window))
                if vouched < base - 1 and window > 0:
                    probed += 1
                if refs is None:
                    for e in entries:
                        generation, gslot, request_id, group_index = e.group[:4]
                        n = e.group[_GROUP_COUNT]
                        e.remaining = 0
                        # PERF(fusion): a 1-frame group's verdict packed by the struct's C
                        # call here, not through pack_queued_run's Python frame
                        reply(e.slot, pack_queued_one(
                            KIND_PUSH_VERDICT, generation, gslot, request_id, group_index,
                            VERDICT_OK, pid, ts, 1, 0, 0, ITEM_QUEUED, base)
                            if n == 1 else pack_queued_run(generation, gslot, request_id,
                                                           group_index, pid, ts, base, n))
                        base += n
                    continue
            rest.append(seg)
            for e in seg.entries:
                e.partition_id, e.created_us = pid, ts
            if not res.queued:
                frames -= seg.count
                for k, off in res.duplicates:
                    dup_lookups.append((seg, k, pid, off))
                continue
            refs = seg.refs
            assert refs is not None  # a queued segment without refs went on above
            for k, (e, j) in enumerate(refs):
                e.resolve(j, QUEUED, base + k)
            for e, j, k in seg.followers:
                leader_e, leader_j = refs[k]
                e.resolve(j, DUPLICATE, base + k, self._leader_id(leader_e, leader_j))
        # after the verdicts' flush, before the partitions' release (``_flushed``)
        self.loop.call_soon(self._remember, remember)
        self.metrics.push_bundle(len(segments), frames, probed)
        if self.stored is not None and stored:
            self.stored(stored)
        return rest, dup_lookups

    def _answer(self, segments: list[Segment]) -> None:
        """Reply to every entry of these segments (those ``_committed`` did not answer) that
        the bundle answered; requeue the rest of a duplicate's segment."""
        reply = self.reply
        for seg in segments:
            left = False
            for e in seg.entries:
                if e.remaining:
                    left = True
                else:
                    reply(e.slot, e.verdict().pack())
            if left:
                # NOTE(queen): SQL wrote nothing for a segment with duplicates; the rest of
                # its frames go again, ahead of anything that arrived for the partition since.
                leftovers = [e for e in seg.entries if e.remaining]
                self.pending[seg.key] = leftovers + self.pending.get(seg.key, [])
                self._wake_tick()

    async def _resolve_duplicates(self, lookups: list[tuple[Segment, int, int, int]]) -> None:
        """Original message ids of duplicates: fetch the covering segments (rare path)."""
        rows = await self.writer.segments_at([(pid, off) for _, _, pid, off in lookups])
        for (seg, k, _pid, off), row in zip(lookups, rows, strict=True):
            original = ZERO_UUID
            if row is not None:
                original = _frame_id_at(row.payload, off - row.base_offset)
            e, j = seg.ref(k)
            e.resolve(j, DUPLICATE, off, original)
            for fe, fj, lk in seg.followers:
                if lk == k:
                    fe.resolve(fj, DUPLICATE, off, original)

    def tidy(self) -> None:
        """A heartbeat's share of closing the dedup filter's ended epochs
        (``DedupFilter.tidy``): partitions no longer pushed give back what sealing saves."""
        if self.dedup.tidy():
            self._filter_gauges()

    def _filter_gauges(self) -> None:
        self.metrics.dedup_filter_entries.set(self.dedup.entries)
        self.metrics.dedup_filter_spilled_entries.set(self.dedup.spilled)

    def _remember(self, remember: list[tuple[Key, int, int, int, bytes, int]]) -> None:
        """A landed bundle's hashes into the dedup filter, then the read-back of any gap that
        showed (offsets this shard did not write)."""
        self.dedup.committed_all(remember)
        self._recall()

    def _recall(self) -> None:
        """Read back the stored hashes of offsets this shard did not write, one batch at a
        time: until then every push to those partitions probes them in SQL."""
        if self._recalling:
            return
        asks = self.dedup.wanted(_RECALL_OFFSETS)
        if asks:
            self._recalling = True
            task = self.loop.create_task(self._read_back(asks))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read_back(self, asks: list[Recall]) -> None:
        try:
            stored = await self.writer.txn_hashes(
                [(a.pid, a.lo, a.below, a.secs) for a in asks])
        except Exception as ex:
            # The next commit asks again; until then pushes there probe from the gap up.
            log.warning("dedup read-back of %d partitions failed: %s", len(asks), ex)
            self.metrics.dedup_read_backs.labels("failed").inc(len(asks))
            for a in asks:
                self.dedup.unrecalled(a)
            self._recalling = False
            return
        for a, rows in zip(asks, stored, strict=True):
            self.dedup.recalled(a, rows)
        self.metrics.dedup_read_backs.labels("ok").inc(len(asks))
        self._filter_gauges()
        self._recalling = False
        self._recall()

    def _leader_id(self, e: Entry, j: int) -> bytes:
        return _message_id(e.split_frames()[j])

    def _adapt(self, rtt: float) -> None:
        """Vegas-like cap: grow while commits stay near the best round trip, shrink when they
        queue (the database is the bottleneck; fewer, larger bundles then cost less)."""
        self.base_rtt = min(self.base_rtt * 1.01, rtt) if self.base_rtt != float("inf") else rtt
        if rtt > 2.0 * self.base_rtt and self.cap > 1:
            self.cap -= 1
        elif rtt < 1.5 * self.base_rtt and self.cap < self.max_inflight:
            self.cap += 1

    def _maybe_summary(self) -> None:
        now = time.monotonic()
        if now - self._summary_at < _SUMMARY_EVERY_S:
            return
        self._filter_gauges()
        if self._commits:
            log.info("bundle summary commits=%d segments=%d segments_per_commit=%.2f cap=%d",
                     self._commits, self._segments, self._segments / self._commits, self.cap)
        self._commits = self._segments = 0
        self._summary_at = now


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _frame_id_at(blob: bytes, index: int) -> bytes:
    """Message id of frame ``index`` of a stored payload blob."""
    for chunk in wf.iter_chunks(blob):
        if index >= chunk.count:
            index -= chunk.count
            continue
        raw = wf.decode_chunk(chunk.codec, chunk.data, max_size=_MAX_SEGMENT_BYTES)
        for i, frame in enumerate(wf.iter_frames(raw)):
            if i == index:
                return bytes(frame.message_id)
        break
    return ZERO_UUID
