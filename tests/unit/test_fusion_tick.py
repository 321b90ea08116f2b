"""The shard's hold tick (shards/fusion.py ``PushFusion.hold_tick``) sleeps while no push is
pending and is woken by the next arrival: a shard serving only pops and acks pays no timer
wake every ``QUEEN_V2_FUSION_HOLD_MS``. Kicks are counted, not timed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from queen_mp.shards.fusion import PushFusion
from queen_mp.wire.records import PushGroup


class CountingFusion(PushFusion):
    def __init__(self) -> None:
        super().__init__(SimpleNamespace(size=1), reply=lambda slot, rec: None,  # type: ignore[arg-type]
                         metrics=None,  # type: ignore[arg-type]
                         bundle_max=8, max_inflight=1, hold_ms=1, dedup_entries=16)
        self.kicks = 0

    def kick(self) -> None:  # nothing is committed here: the pushes stay pending
        self.kicks += 1


def group() -> PushGroup:
    return PushGroup(1, 0, 1, 0, bytes(16), "q", "p", bytes(16), 1, (), 0)


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_tick_sleeps_without_pending_pushes_and_wakes_on_arrival() -> None:
    async def main() -> tuple[Any, ...]:
        fusion = CountingFusion()
        tick = asyncio.get_running_loop().create_task(fusion.hold_tick())
        await turns(5)
        parked = fusion._arrival is not None
        idle_kicks = fusion.kicks
        fusion.add(0, group())
        woken = fusion._arrival is None
        while fusion.kicks < idle_kicks + 3:  # the 1 ms tick runs again while one is pending
            await asyncio.sleep(0.002)
        tick.cancel()
        return parked, idle_kicks, woken

    parked, idle_kicks, woken = asyncio.run(main())
    assert parked and woken
    assert idle_kicks == 0
