"""Wakes a front worker sends (queen_mp/ipc/wakeup.py ``WorkerBells``, ``Waker(rung=...)``,
``WakeListener(bumped=...)``): its own parked pops and the other workers' look at the wake
board at once, as after a shard's commit, not at their next wake-board tick."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from queen_mp.front.parking import ParkingLot, ParkKey
from queen_mp.ipc import Doorbell, SlotTable
from queen_mp.ipc.wakeboard import WakeBoard
from queen_mp.ipc.wakeup import WakeListener, Waker, WorkerBells

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def names() -> Iterator[tuple[str, str, str]]:
    tag = uuid.uuid4().hex[:12]
    slots, board, bell = f"/qmp-test-bells-{tag}", f"/qmp-test-board-{tag}", f"/qmp-test-bw-{tag}"
    yield slots, board, bell
    SlotTable.unlink_name(slots)
    WakeBoard.unlink(board)
    for slot in range(4):
        Doorbell.unlink_name(f"{bell}{slot}")


def test_bells_ring_the_other_workers_with_a_parked_pop_only(names) -> None:
    slots_name, _, bell = names
    table = SlotTable.create(slots_name, 4)
    bells = [Doorbell.create(f"{bell}{slot}") for slot in range(4)]
    try:
        for _ in range(3):  # slots 0, 1, 2 owned (by this live process), 3 free
            table.claim(os.getpid())
        for slot in (1, 2, 3):
            table.set_parked(slot, True)
        ringer = WorkerBells(table, lambda slot: f"{bell}{slot}", own=2)
        ringer.ring()
        ringer.ring()
        ringer.close()
        # 0: nothing parked; 2: the caller itself; 3: parked flag left by nobody alive
        assert [b.value for b in bells] == [0, 2, 0, 0]
    finally:
        for b in bells:
            b.close()
        table.close()


def _parked(lot: ParkingLot, board: WakeBoard, key: ParkKey) -> asyncio.Task[None]:
    assert key.bucket is not None
    return asyncio.get_running_loop().create_task(
        lot.park(key, board.value(key.bucket), time.monotonic() + 3600))


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_wake_the_worker_sends_reaches_its_own_parked_pop_at_once(names) -> None:
    _, board_name, _ = names
    board = WakeBoard.create(board_name)

    async def go() -> None:
        lot = ParkingLot(board, tick_s=3600)  # the tick would come in an hour
        key = ParkKey(7, "g", "p")
        pop = _parked(lot, board, key)
        await _turns()
        assert not pop.done()
        Waker(board, "me", "dbname=none", notify=False, rung=lot.poke).wake([7])
        await _turns()
        assert pop.done()
        await lot.close()

    try:
        asyncio.run(go())
    finally:
        board.close()


def test_another_instances_wake_replayed_by_the_listener_pokes_the_lot(names) -> None:
    _, board_name, _ = names
    board = WakeBoard.create(board_name)

    async def go() -> None:
        lot = ParkingLot(board, tick_s=3600)
        pop = _parked(lot, board, ParkKey(9, "g", "p"))
        other = _parked(lot, board, ParkKey(10, "g", "p"))
        await _turns()
        listener = WakeListener(board, "me", "dbname=none", bumped=lot.poke)
        listener._apply("me:9")  # our own instance's wake: already on the board
        await _turns()
        assert not pop.done()
        listener._apply("them:9")
        await _turns()
        assert pop.done() and not other.done()
        await lot.close()

    try:
        asyncio.run(go())
    finally:
        board.close()
