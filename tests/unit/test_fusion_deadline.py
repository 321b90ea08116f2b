"""A push group whose request's deadline passed before its bundle formed is answered without
being written (shards/fusion.py ``PushFusion._expire``): its front worker answered
``503 timeout`` already and the client retries with new message ids, so a late commit of the
first attempt would store an id no answer gave (the fault matrix's pg-outage "wrong id")."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

from queen_mp.db.bundles import PushBundle, SegmentVerdict
from queen_mp.shards.fusion import PushFusion
from queen_mp.wire.frames import pack_frame
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid7
from queen_mp.wire.records import Piece, PushGroup, PushVerdict


class Writer:
    """Commits every bundle at once: segment k of a partition at offsets from 1 on."""

    size = 1

    def __init__(self) -> None:
        self.bundles: list[PushBundle] = []

    def push(self, bundle: PushBundle, done: Any) -> None:
        self.bundles.append(bundle)
        asyncio.get_running_loop().call_soon(done, [
            SegmentVerdict(partition_id=7, created_at_us=1, queued=True, base_offset=1,
                           window=0, duplicates=())
            for _ in bundle.queues])


class Labels:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def labels(self, reason: str) -> SimpleNamespace:
        return SimpleNamespace(inc=lambda n=1: self.counts.update({reason: n}))


def group(request_id: int, deadline_ms: int) -> PushGroup:
    txn = f"t{request_id}"
    frame = pack_frame(uuid7(), txn.encode(), b'{"n":1}')
    return PushGroup(1, 0, request_id, 0, bytes(16), "q", "p", txn_hash(txn), 1,
                     (Piece(0, 1, frame),), deadline_ms)


def run(groups: list[PushGroup]) -> tuple[Writer, dict[int, PushVerdict], Counter[str]]:
    replies: dict[int, PushVerdict] = {}
    errors = Labels()

    async def main() -> Writer:
        writer = Writer()
        fusion = PushFusion(writer, lambda slot, rec: replies.update(  # type: ignore[arg-type]
            {(v := PushVerdict.unpack(rec)).request_id: v}),
            SimpleNamespace(fusion_errors=errors,  # type: ignore[arg-type]
                            push_bundle=lambda segments, frames, probed: None),
            bundle_max=8, max_inflight=1, hold_ms=1, dedup_entries=16)
        for g in groups:
            fusion.add(0, g)
        for _ in range(20):
            await asyncio.sleep(0)
        return writer

    return asyncio.run(main()), replies, errors.counts


def test_a_group_past_its_deadline_is_answered_and_not_written() -> None:
    now = int(time.time() * 1000)
    writer, replies, errors = run([group(1, now - 5_000), group(2, now + 60_000), group(3, 0)])
    # one bundle, one segment of the two live groups (deadline 0: none)
    assert [list(b.counts) for b in writer.bundles] == [[2]]
    expired = replies[1]
    assert expired.status == 1 and expired.error.startswith("Expired"), expired
    assert replies[2].status == 0 and replies[3].status == 0
    assert errors["Expired"] == 1


def test_groups_within_their_deadline_are_all_written() -> None:
    now = int(time.time() * 1000)
    writer, replies, errors = run([group(1, now + 60_000), group(2, now + 60_000)])
    assert [list(b.counts) for b in writer.bundles] == [[2]]
    assert all(v.status == 0 for v in replies.values()) and len(replies) == 2
    assert not errors
