"""What a committed bundle answers each push group (shards/fusion.py ``PushFusion._committed``
and ``_answer``): a fast-path entry is answered in the loop that reads its segment's verdict,
at the offsets its frames got; an entry of a slow-path segment (a repeat inside the bundle) is
answered frame by frame; a segment SQL found a duplicate in goes again, and nothing is
answered twice."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any
from unittest.mock import Mock

from queen_mp.db.bundles import PushBundle, SegmentVerdict
from queen_mp.shards.fusion import PushFusion
from queen_mp.wire.frames import pack_frame
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid7
from queen_mp.wire.records import ITEM_DUPLICATE, ITEM_QUEUED, Piece, PushGroup, PushVerdict

_PID = {"a": 11, "b": 12}
_TS = 1_764_000_000_000_000


class Writer:
    """Stores each segment after what its partition holds (offsets from 1), as SQL does;
    a segment holding one of ``stored_txns`` is answered a duplicate of offset 1."""

    size = 1

    def __init__(self, stored: set[bytes]) -> None:
        self.last: dict[str, int] = {}
        self.stored = stored
        self.bundles: list[PushBundle] = []

    def push(self, bundle: PushBundle, done: Any) -> None:
        self.bundles.append(bundle)
        out = []
        for partition, count, hashes in zip(bundle.partitions, bundle.counts, bundle.hashes,
                                            strict=True):
            dups = tuple((k, 1) for k in range(count) if hashes[16 * k:16 * k + 16]
                         in self.stored)
            if dups:
                self.stored.clear()  # the rest goes again, and is stored then
                out.append(SegmentVerdict(_PID[partition], _TS, False, None, 60, dups))
                continue
            base = self.last.get(partition, 0) + 1
            self.last[partition] = base + count - 1
            out.append(SegmentVerdict(_PID[partition], _TS, True, base, 60, ()))
        asyncio.get_running_loop().call_soon(done, out)

    async def segments_at(self, lookups: list[tuple[int, int]]) -> list[None]:
        return [None for _ in lookups]  # retention removed the originals

    async def txn_hashes(self, asks: list[tuple[int, int, int, int]]) -> list[list[Any]]:
        return [[] for _ in asks]  # a gap's read-back: nothing stored in it is in the window


IDS: dict[tuple[int, str], bytes] = {}  # (request id, transaction id) -> message id


def group(request_id: int, partition: str, txns: list[str]) -> PushGroup:
    for t in txns:
        IDS[request_id, t] = uuid7()
    frames = b"".join(pack_frame(IDS[request_id, t], t.encode(), b'{"n":1}') for t in txns)
    return PushGroup(1, request_id % 2, request_id, 0, bytes(16), "q", partition,
                     b"".join(txn_hash(t) for t in txns), len(txns),
                     (Piece(0, len(txns), frames),), 0)


def run(groups: list[PushGroup], stored: set[bytes] = frozenset()  # type: ignore[assignment]
        ) -> tuple[Writer, dict[int, list[PushVerdict]]]:
    replies: dict[int, list[PushVerdict]] = {}

    def reply(slot: int, record: bytes) -> None:
        verdict = PushVerdict.unpack(record)
        assert verdict.slot == slot
        replies.setdefault(verdict.request_id, []).append(verdict)

    async def main() -> Writer:
        writer = Writer(set(stored))
        metrics = SimpleNamespace(push_bundle=lambda segments, frames, probed: None,
                                  dedup_read_backs=None)
        fusion = PushFusion(writer, reply, metrics,  # type: ignore[arg-type]
                            bundle_max=8, max_inflight=1, hold_ms=1, dedup_entries=1 << 10)
        for g in groups:
            fusion.add(g.slot, g)
        for _ in range(50):
            await asyncio.sleep(0)
        return writer

    return asyncio.run(main()), replies


def offsets(verdict: PushVerdict) -> list[tuple[int, int]]:
    return [(item.status, item.offset) for item in verdict.each()]


def test_fast_path_entries_are_answered_once_at_their_offsets() -> None:
    writer, replies = run([group(1, "a", ["t1"]), group(2, "b", ["t2", "t3"]),
                           group(3, "a", ["t4", "t5", "t6"]), group(4, "a", ["t7"])])
    assert [list(b.counts) for b in writer.bundles] == [[5, 2]]  # one bundle, two segments
    assert sorted(replies) == [1, 2, 3, 4]
    assert all(len(v) == 1 for v in replies.values())  # nothing answered twice
    one, two, three, four = (replies[k][0] for k in (1, 2, 3, 4))
    assert [v.status for v in (one, two, three, four)] == [0, 0, 0, 0]
    assert (one.partition_id, two.partition_id, three.partition_id) == (11, 12, 11)
    assert all(v.created_at_us == _TS for v in (one, two, three, four))
    assert offsets(one) == [(ITEM_QUEUED, 1)]
    assert offsets(two) == [(ITEM_QUEUED, 1), (ITEM_QUEUED, 2)]
    assert offsets(three) == [(ITEM_QUEUED, 2), (ITEM_QUEUED, 3), (ITEM_QUEUED, 4)]
    assert offsets(four) == [(ITEM_QUEUED, 5)]


def test_a_repeat_inside_the_bundle_is_answered_frame_by_frame() -> None:
    writer, replies = run([group(1, "a", ["t1", "t2"]), group(2, "a", ["t2", "t3"]),
                           group(3, "b", ["t9"])])
    assert [list(b.counts) for b in writer.bundles] == [[3, 1]]  # t2 stored once
    assert all(len(v) == 1 for v in replies.values())
    assert offsets(replies[1][0]) == [(ITEM_QUEUED, 1), (ITEM_QUEUED, 2)]
    follower = replies[2][0]
    assert offsets(follower) == [(ITEM_DUPLICATE, 2), (ITEM_QUEUED, 3)]
    assert follower.each()[0].original_id == IDS[1, "t2"]  # the leader's message id
    assert offsets(replies[3][0]) == [(ITEM_QUEUED, 1)]


def test_a_segment_holding_a_stored_duplicate_goes_again_without_it() -> None:
    writer, replies = run([group(1, "a", ["old", "new"]), group(2, "b", ["t9"])],
                          stored={txn_hash("old")})
    # the first bundle stores b only; a's remainder goes again, alone
    assert [list(b.counts) for b in writer.bundles] == [[2, 1], [1]]
    assert all(len(v) == 1 for v in replies.values())
    assert offsets(replies[1][0]) == [(ITEM_DUPLICATE, 1), (ITEM_QUEUED, 1)]
    assert offsets(replies[2][0]) == [(ITEM_QUEUED, 1)]


def test_segments_whose_probe_reads_stored_hashes_in_sql_are_counted() -> None:
    # The shard vouches (``p_verified``) for what it wrote itself; offsets written by another
    # writer before it first saw the partition are not vouched for, so that segment's probe
    # reads them in SQL: the one counted. A new partition and one the shard wrote are not.
    probes: list[int] = []

    async def main() -> Writer:
        writer = Writer(set())
        writer.last["a"] = 5  # offsets 1..5 written by someone else
        metrics = Mock()  # the gap's read-back counts too
        metrics.push_bundle = lambda segments, frames, probed: probes.append(probed)
        fusion = PushFusion(writer, lambda slot, record: None, metrics,  # type: ignore[arg-type]
                            bundle_max=8, max_inflight=1, hold_ms=1, dedup_entries=1 << 10)
        for g in (group(1, "a", ["t1"]), group(2, "b", ["t2", "t3"])):
            fusion.add(g.slot, g)
        for _ in range(20):
            await asyncio.sleep(0)
        g = group(3, "b", ["t4"])
        fusion.add(g.slot, g)
        for _ in range(20):
            await asyncio.sleep(0)
        return writer

    writer = asyncio.run(main())
    assert [list(b.partitions) for b in writer.bundles] == [["a", "b"], ["b"]]
    assert [list(b.verified) for b in writer.bundles] == [[0, 0], [2]]
    assert probes == [1, 0]
