"""The front worker's half of a push: mint, layer-1 dedup, group, route, collect verdicts.

Input is a list of ``PushItem`` in request order (from JSON or ``QPB1``). Leaders (first
occurrence of queue/partition/transactionId in the body) become frames; followers produce no
frame and copy their leader's *final* verdict. Frames are grouped by (queue, partition), each
group is sent to the shard owning ``hash(tenant, queue, partition)``, and the request resolves
when every group has its verdict. A group whose shard failed or vanished is written to the disk
spool and reported ``buffered`` (``failed`` if the spool write fails too). While push
maintenance is on, every leader goes to the spool before anything is routed: no shard and no
PostgreSQL connection is touched. While a spool (this instance's or another's) holds records a
new push must not overtake (``SpoolHold.route``, the flags board: front/spoolhold.py), the
push first waits for that hold to end, and goes to the spool if it does not end in time. So
does every leader of a request whose queues' encryption flags PostgreSQL cannot tell (an
outage, and a queue this worker has not seen): the drain resolves them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import msgspec

from queen_mp.crypto import PayloadCipher
from queen_mp.front.queueflags import FlagsUnavailable, QueueFlags
from queen_mp.front.spoolhold import SpoolHold
from queen_mp.ipc.flags import HOLD, SPOOL
from queen_mp.ipc.routing import push_shard
from queen_mp.ipc.shardlink import ShardGone, ShardLink, verdicts_of
from queen_mp.models.items import ClientChunk, PushBatch, PushItem
from queen_mp.spool import SpoolItem, SpoolWriteError
from queen_mp.wire.frames import iter_frames, pack_frame
from queen_mp.wire.hashing import txn_hash_bytes
from queen_mp.wire.records import (
    PIECE_RAW,
    PIECE_ZSTD,
    AckVerdict,
    Piece,
    PushVerdict,
    pack_push_group,
)

__all__ = [
    "EncryptionUnavailable",
    "Ingest",
    "ItemResult",
    "PushResults",
    "QueuedRun",
    "group_items",
    "pieces_of",
    "queued_run",
]

log = logging.getLogger("queen_mp.ingest")

QUEUED, DUPLICATE, BUFFERED, FAILED = "queued", "duplicate", "buffered", "failed"

_QUEUE = attrgetter("queue")
_PARTITION = attrgetter("partition")
_TXN = attrgetter("transaction_id")
_FRAME = attrgetter("frame")
_STATUS = itemgetter(0)  # of an ItemVerdict
_OFFSET = itemgetter(1)
_IDX = attrgetter("idx")
#: xxh3_128 of a transactionId's UTF-8 (``txn_hash``), from the str itself. PERF(queen):
#: xxhash reads a str as its UTF-8 bytes (an ASCII str's own, others' cached in the str), so
#: a push hashes its transactionIds without encoding each into new bytes first
_txn_digest: Callable[[str], bytes] = txn_hash_bytes  # type: ignore[assignment]
# PERF(queen): a Piece built in C, not through its NamedTuple's Python ``__new__`` (3.1k
# instructions a call, 0.5k so)
_piece = tuple.__new__


class ItemResult(msgspec.Struct, gc=False):
    """One item's verdict. PERF(queen): Structs here are built in C (a dataclass's
    ``__init__`` is a Python call, a frozen one's dearer still)."""

    status: str
    message_id: bytes
    partition_id: int = 0
    offset: int | None = None
    created_us: int = 0
    error: str | None = None


class QueuedRun(msgspec.Struct, frozen=True, gc=False):
    """The items ``idx`` (ascending) of one group, every one queued, at consecutive offsets
    from ``first``: the shard's common verdict, kept whole instead of a result per item."""

    idx: list[int]
    partition_id: int
    created_us: int
    first: int

    def expand(self, items: Sequence[PushItem], results: list[ItemResult | None]) -> None:
        """Write each of the run's items its own result (where one is needed after all)."""
        pid, first, created = self.partition_id, self.first, self.created_us
        for k, i in enumerate(self.idx):
            results[i] = ItemResult(QUEUED, items[i].message_id, pid, first + k, created)


class PushResults(msgspec.Struct, frozen=True, gc=False):
    """Every item's verdict of one push: ``each`` in request order, None where one of
    ``runs`` holds the item.

    PERF(queen): a 100-item push queued whole makes no object per item between the shard's
    verdict and the answer, which renders a run at once (``http.push.render_items``)."""

    each: list[ItemResult | None]
    runs: tuple[QueuedRun, ...] = ()

    def counts(self) -> dict[str, int]:
        """How many items got each status (every status named, zero or not)."""
        counts = {QUEUED: 0, DUPLICATE: 0, BUFFERED: 0, FAILED: 0}
        if self.runs:
            counts[QUEUED] = sum(map(len, map(_IDX, self.runs)))
        each = self.each
        if len(each) == 1:  # PERF(queen): a 1-item push's, counted without a scan
            if each[0] is not None:
                counts[each[0].status] += 1
        elif each.count(None) != len(each):
            for r in each:
                if r is not None:
                    counts[r.status] += 1
        return counts


class EncryptionUnavailable(Exception):
    """An encrypted queue was pushed to while this broker has no key."""


class Ingest:
    """Push pipeline of one front worker (stateless between requests)."""

    def __init__(self, link: ShardLink, shards: int, hold: SpoolHold,
                 push_timeout_ms: int, flags: QueueFlags, cipher: PayloadCipher | None) -> None:
        self.link = link
        self.flags = flags
        self.cipher = cipher
        self.shards = shards
        self.hold = hold
        self.timeout_s = push_timeout_ms / 1000

    def shard_of(self, tenant: bytes, queue: str, partition: str) -> int:
        return push_shard(tenant, queue, partition, self.shards) if self.shards > 1 else 0

    def push(self, items: Sequence[PushItem], tenant: bytes,
             chunks: Sequence[ClientChunk] = ()) -> Coroutine[Any, Any, PushResults]:
        """Every item's verdict (awaited); raises ``TimeoutError`` past the push deadline.

        PERF(queen): not a coroutine itself: the caller awaits the one of its path, and a
        1-item push builds one coroutine instead of two."""
        if len(items) == 1 and not chunks:
            return self._push_one(items[0], tenant)
        return self._push_many(items, tenant, chunks)

    async def _push_many(self, items: Sequence[PushItem], tenant: bytes,
                         chunks: Sequence[ClientChunk]) -> PushResults:
        """``push`` of any body, through the groups of its items."""
        n = len(items)
        results: list[ItemResult | None] = [None] * n
        groups, leader_of = group_items(items)
        if not groups:
            return PushResults([])
        route = self.hold.route()
        if route == HOLD:
            route = await self.hold.wait_hold()
        # NOTE(queen): before encryption too (its flag lookup reads PostgreSQL); the drain
        # encrypts what it replays into an encrypted queue. An append refused because the
        # hold ended meanwhile (the drain's closing pass) lets the push go on to PostgreSQL.
        if route == SPOOL and await self._spool(
                items, [i for idx in groups.values() for i in idx], tenant, results,
                held=True):
            return PushResults(_fill_followers(items, results, leader_of))
        flags = self.flags
        try:
            # PERF(queen): the memo answers almost every push: no coroutine then
            if any(flags.known_encrypted(tenant, q) is not False for q, _ in groups):
                if type(items) is PushBatch:  # encrypt re-frames items, not the batch
                    items = items.items
                await self.encrypt(items, tenant, {q for q, _ in groups})
        except FlagsUnavailable as ex:
            log.warning("push spooled: %s", ex)
            await self._spool(items, [i for idx in groups.values() for i in idx], tenant,
                              results)
            return PushResults(_fill_followers(items, results, leader_of))
        link = self.link
        deadline = link.loop.time() + self.timeout_s
        request_id = link.next_request_id()
        deadline_ms = int((time.time() + self.timeout_s) * 1000)
        calls = []
        members = list(groups.items())
        for gi, ((queue, partition), idx) in enumerate(members):
            # PERF(queen): the group's hashes and frames joined by C loops (map), not a
            # Python step per item
            group = items if len(idx) == n else [items[i] for i in idx]
            txns = group.transaction_ids if type(group) is PushBatch else map(_TXN, group)
            # NOTE(memory): only the packed bytes outlive this line, until they are in the ring.
            record = pack_push_group(
                link.generation, link.slot, request_id, gi, tenant, queue, partition,
                b"".join(map(_txn_digest, txns)), len(idx), pieces_of(items, idx, chunks),
                deadline_ms)
            calls.append(link.submit(self.shard_of(tenant, queue, partition), request_id, gi,
                                     record, deadline))
        del record, group, txns
        outcomes = await verdicts_of(calls)
        to_spool: list[int] = []
        runs: list[QueuedRun] = []
        for (_, idx), outcome in zip(members, outcomes, strict=True):
            if isinstance(outcome, TimeoutError):
                raise outcome
            if isinstance(outcome, PushVerdict) and outcome.status == 0:
                run = queued_run(idx, outcome)
                if run is not None:
                    runs.append(run)
                    continue
                for i, v in zip(idx, outcome.items or outcome.each(), strict=True):
                    queued = v.status == 0
                    results[i] = ItemResult(
                        QUEUED if queued else DUPLICATE,
                        items[i].message_id if queued else v.original_id,
                        outcome.partition_id, v.offset if v.offset >= 0 else None,
                        outcome.created_at_us)
                continue
            if isinstance(outcome, BaseException) and not isinstance(outcome, ShardGone):
                log.error("push group failed: %r", outcome)
            elif isinstance(outcome, PushVerdict):
                log.warning("push bundle failed on the shard: %s", outcome.error)
            to_spool.extend(idx)
        if to_spool:
            await self._spool(items, to_spool, tenant, results)
        if leader_of is not None and runs:
            # a follower copies its leader's result: a run's leaders get theirs
            for run in runs:
                run.expand(items, results)
            runs = []
        return PushResults(_fill_followers(items, results, leader_of), tuple(runs))

    async def _push_one(self, item: PushItem, tenant: bytes) -> PushResults:
        """``push`` of a body of one item and no client chunk: the same steps, answers and
        errors, for one group of one frame.

        PERF(queen): no grouping, leader table, generator over groups, per-group loop, hash
        map, pieces join, gathering coroutine or verdict loop: a 1-item push (the commonest
        request) cost 88k instructions here through the general path, 55k through this one."""
        results: list[ItemResult | None] = [None]
        route = self.hold.route()
        if route == HOLD:
            route = await self.hold.wait_hold()
        # NOTE(queen): as ``push``: the spool before encryption's flag lookup
        if route == SPOOL and await self._spool((item,), [0], tenant, results, held=True):
            return PushResults(results)
        queue = item.queue
        try:
            if self.flags.known_encrypted(tenant, queue) is not False:
                await self.encrypt((item,), tenant, {queue})
        except FlagsUnavailable as ex:
            log.warning("push spooled: %s", ex)
            await self._spool((item,), [0], tenant, results)
            return PushResults(results)
        link = self.link
        request_id = link.next_request_id()
        partition = item.partition
        record = pack_push_group(
            link.generation, link.slot, request_id, 0, tenant, queue, partition,
            _txn_digest(item.transaction_id), 1, (_piece(Piece, (PIECE_RAW, 1, item.frame)),),
            int((time.time() + self.timeout_s) * 1000))
        try:
            outcome: PushVerdict | AckVerdict | BaseException = await link.submit(
                self.shard_of(tenant, queue, partition), request_id, 0, record,
                link.loop.time() + self.timeout_s)
        except TimeoutError:
            raise
        except Exception as ex:  # as ``verdicts_of``: the group's outcome, to spool
            outcome = ex
        if isinstance(outcome, PushVerdict) and outcome.status == 0:
            (v,) = outcome.items or outcome.each()
            queued = v.status == 0
            results[0] = ItemResult(QUEUED if queued else DUPLICATE,
                                    item.message_id if queued else v.original_id,
                                    outcome.partition_id, v.offset if v.offset >= 0 else None,
                                    outcome.created_at_us)
            return PushResults(results)
        if isinstance(outcome, PushVerdict):
            log.warning("push bundle failed on the shard: %s", outcome.error)
        elif not isinstance(outcome, ShardGone):
            log.error("push group failed: %r", outcome)
        await self._spool((item,), [0], tenant, results)
        return PushResults(results)

    async def encrypt(self, items: Sequence[PushItem], tenant: bytes, queues: set[str]) -> None:
        """Re-frame the payloads of encrypted queues (flag 4); their client chunks are then
        rebuilt by the shard's normal raw-frame path."""
        # PERF(queen): the memo answers almost every push: no await per queue then
        flags = self.flags
        if not any(flags.known_encrypted(tenant, q) is not False for q in queues):
            return
        secret = {q for q in queues if await flags.encrypted(tenant, q)}
        if not secret:
            return
        if self.cipher is None:
            raise EncryptionUnavailable(
                f"queue {sorted(secret)[0]!r} is encrypted but this broker has no key "
                "(QUEEN_ENCRYPTION_KEY, or the key file its start log names)")
        for it in items:
            if it.queue not in secret:
                continue
            f = next(iter_frames(it.frame))
            it.frame = pack_frame(f.message_id, f.transaction_id.encode(),
                                  self.cipher.encrypt(bytes(f.payload)),
                                  trace_id=f.trace_id, producer_sub=f.producer_sub,
                                  encrypted=True)
            it.chunk = -1

    async def _spool(self, items: Sequence[PushItem], idx: list[int], tenant: bytes,
                     results: list[ItemResult | None], *, held: bool = False) -> bool:
        """Spool the leaders ``idx`` and set their results; ``held``: only while the route
        still says spool (False: nothing done, the push goes to PostgreSQL)."""
        records = [SpoolItem(tenant=tenant, queue=items[i].queue,
                             partition=items[i].partition, message_id=items[i].message_id,
                             transaction_id=items[i].transaction_id,
                             trace_id=items[i].trace_id, payload=bytes(items[i].frame),
                             producer_sub=items[i].producer_sub) for i in idx]
        try:
            # NOTE(queen): append fsyncs, off the event loop so other requests go on.
            if not await self.hold.append(records, held=held):
                return False
            status, error = BUFFERED, None
        except SpoolWriteError as ex:
            log.error("spool write failed: %s", ex)
            status, error = FAILED, "spool_write_failed"
        for i in idx:
            results[i] = ItemResult(status, items[i].message_id, error=error)
        return True


def group_items(items: Sequence[PushItem]
                ) -> tuple[dict[tuple[str, str], list[int]], list[int] | None]:
    """The leaders' indexes by (queue, partition), in body order, and each item's leader
    (None when every item leads: no transactionId repeats inside its partition).

    PERF(queen): a body of one partition and distinct transactionIds (what a producer
    batching one partition sends) is told by counts and a set size, C loops all, not a step
    per item (a count compares by identity first: a decoded body's names are one str each)."""
    n = len(items)
    if type(items) is PushBatch:  # one partition, no transactionId repeated
        return {(items.queue, items.partition): list(range(n))}, None
    if n == 1:
        return {(items[0].queue, items[0].partition): [0]}, None
    if n:
        queue, partition = items[0].queue, items[0].partition
        if list(map(_QUEUE, items)).count(queue) == n \
                and list(map(_PARTITION, items)).count(partition) == n \
                and len(set(map(_TXN, items))) == n:
            return {(queue, partition): list(range(n))}, None
    leader_of: list[int] = list(range(n))
    seen: dict[tuple[str, str, str], int] = {}
    groups: dict[tuple[str, str], list[int]] = {}
    followers = False
    for i, it in enumerate(items):
        key = (it.queue, it.partition, it.transaction_id)
        first = seen.setdefault(key, i)
        if first != i:
            leader_of[i] = first
            followers = True
            continue
        groups.setdefault((it.queue, it.partition), []).append(i)
    # NOTE(memory): a key per item (about 120 bytes each): not kept while verdicts come.
    return groups, leader_of if followers else None


def queued_run(idx: list[int], verdict: PushVerdict) -> QueuedRun | None:
    """The verdict of the group ``idx`` as one run, when it queued every item at consecutive
    offsets (the shard's common answer); None otherwise."""
    if len(idx) < 2:  # one item: its result costs no more
        return None
    if verdict.queued_run is not None:
        first, count = verdict.queued_run
        if count != len(idx) or first < 0:
            return None
        return QueuedRun(idx, verdict.partition_id, verdict.created_at_us, first)
    its = verdict.items
    if len(its) != len(idx):
        return None
    first = its[0].offset
    if first < 0 or any(map(_STATUS, its)) \
            or tuple(map(_OFFSET, its)) != tuple(range(first, first + len(its))):
        return None
    return QueuedRun(idx, verdict.partition_id, verdict.created_at_us, first)


def _fill_followers(items: Sequence[PushItem], results: list[ItemResult | None],
                    leader_of: list[int] | None) -> list[ItemResult | None]:
    if leader_of is None:
        return results
    for i, lead in enumerate(leader_of):
        if lead != i:
            r = results[lead]
            assert r is not None
            results[i] = _follow(r, items[lead].message_id)
    return results


def _follow(leader: ItemResult, leader_id: bytes) -> ItemResult:
    """A body-internal repeat reports its leader's final id and position."""
    if leader.status in (QUEUED, DUPLICATE):
        return ItemResult(DUPLICATE, leader.message_id, leader.partition_id, leader.offset,
                          leader.created_us)
    return ItemResult(leader.status, leader_id, error=leader.error)


def pieces_of(items: Sequence[PushItem], idx: list[int],
            chunks: Sequence[ClientChunk]) -> tuple[Piece, ...]:
    """Raw frames, except whole client chunks whose every frame is in this group."""
    if type(items) is PushBatch and len(idx) == len(items):
        if items.chunk is not None:  # PERF(queen): the client's zstd frame, as it came
            return (_piece(Piece, (PIECE_ZSTD, len(idx), bytes(items.chunk))),)
        return (_piece(Piece, (PIECE_RAW, len(idx), items.frames)),)
    if not chunks and idx:  # PERF(queen): a JSON push's group: one C join of its frames
        group = items if len(idx) == len(items) else map(items.__getitem__, idx)
        return (_piece(Piece, (PIECE_RAW, len(idx), b"".join(map(_FRAME, group)))),)
    pieces: list[Piece] = []
    raw: list[bytes | memoryview] = []
    pos = 0
    while pos < len(idx):
        it = items[idx[pos]]
        if it.chunk >= 0:
            ch = chunks[it.chunk]
            span = idx[pos:pos + ch.count]
            if span == list(range(ch.first_item, ch.first_item + ch.count)):
                if raw:
                    pieces.append(Piece(0, len(raw), b"".join(raw)))
                    raw = []
                # PERF(queen): the client's zstd frame travels and is stored untouched.
                pieces.append(Piece(1, ch.count, bytes(ch.data)))
                pos += ch.count
                continue
        raw.append(it.frame)
        pos += 1
    if raw:
        pieces.append(Piece(0, len(raw), b"".join(raw)))
    return tuple(pieces)
