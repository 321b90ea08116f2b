"""Popper's claim gate: claims of one worker on the same cursor rows run at most
``CLAIMS_PER_KEY`` at a time.

The claim itself is replaced by a recorder (``log_pop_v1`` is covered by the integration
tests); what is checked here is how many claims run at once, per key.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from queen_mp.db import pop_procs
from queen_mp.front.parking import ParkingLot
from queen_mp.front.popper import CLAIMS_PER_KEY, Popper, PopRequest, _enter, _Gate, _leave

TENANT = bytes(16)


class FakeBoard:
    def value(self, bucket: int) -> int:
        return 0

    def snapshot(self) -> bytes:
        return b""


class RecordingPopper(Popper):
    """Claims that take until released and count how many run at once, per queue."""

    def __init__(self) -> None:
        super().__init__(pool=None, lot=ParkingLot(FakeBoard(), 0.01),  # type: ignore[arg-type]
                         max_parked=10)
        self.running: dict[str | None, int] = {}
        self.most: dict[str | None, int] = {}
        self.release = asyncio.Event()
        self.claims = 0

    async def _claim(self, r: PopRequest, lease: uuid.UUID | None,
                     claim_ms: int) -> pop_procs.ClaimResult:
        self.claims += 1
        self.running[r.queue] = self.running.get(r.queue, 0) + 1
        self.most[r.queue] = max(self.most.get(r.queue, 0), self.running[r.queue])
        try:
            await self.release.wait()
        finally:
            self.running[r.queue] -= 1
        return pop_procs.ClaimResult([], None)


def request(queue: str, **kw: Any) -> PopRequest:
    fields: dict[str, Any] = {
        "tenant": TENANT, "queue": queue, "partition": None, "namespace": None, "task": None,
        "group": "g", "batch": 10, "partitions": 1, "wait": False, "timeout_ms": 5000,
        "auto_ack": False, "sub_mode": "all", "sub_from": None}
    fields.update(kw)
    return PopRequest(**fields)


def test_claims_on_the_same_rows_wait_for_each_other_others_do_not() -> None:
    assert CLAIMS_PER_KEY == 2  # the figures below

    async def body() -> None:
        p = RecordingPopper()
        pops = [asyncio.create_task(p.pop(request("a"))) for _ in range(5)]
        pops += [asyncio.create_task(p.pop(request("b"))) for _ in range(3)]
        pops.append(asyncio.create_task(p.pop(request("a", group="other"))))
        pops.append(asyncio.create_task(p.pop(request("a", partition="p1"))))
        for _ in range(20):
            await asyncio.sleep(0)
        # two claims of a/g, two of b/g, one of a/other, one of a/g/p1: four keys
        assert sum(p.running.values()) == 6
        assert p.running == {"a": 4, "b": 2}
        p.release.set()
        assert await asyncio.gather(*pops) == [None] * 10
        assert p.claims == 10
        assert p.most["b"] == 2
        assert p.running == {"a": 0, "b": 0}
        await asyncio.sleep(0)
        assert len(p._gates) == 0  # no pop alive, no gate kept

    asyncio.run(body())


def test_a_pop_whose_claim_time_ran_out_in_the_gate_claims_nothing() -> None:
    async def body() -> None:
        p = RecordingPopper()
        first = [asyncio.create_task(p.pop(request("a", timeout_ms=5000)))
                 for _ in range(CLAIMS_PER_KEY)]
        for _ in range(5):
            await asyncio.sleep(0)
        late = asyncio.create_task(p.pop(request("a", timeout_ms=40)))  # claims until ~30 ms
        await asyncio.sleep(0.06)
        p.release.set()
        assert await asyncio.gather(*first, late) == [None] * (CLAIMS_PER_KEY + 1)
        assert p.claims == CLAIMS_PER_KEY  # the late one never reached the database

    asyncio.run(body())


def test_cancelled_pops_leave_the_gate_to_the_next_in_order() -> None:
    async def body() -> None:
        p = RecordingPopper()
        first = [asyncio.create_task(p.pop(request("a"))) for _ in range(CLAIMS_PER_KEY)]
        for _ in range(3):
            await asyncio.sleep(0)
        queued = [asyncio.create_task(p.pop(request("a"))) for _ in range(3)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert p.claims == CLAIMS_PER_KEY
        queued[0].cancel()  # cancelled while waiting: leaves the line
        await asyncio.sleep(0)
        p.release.set()  # the first claims end: their turns go to the first ones still waiting
        queued[1].cancel()  # cancelled before any claim left: queued[2] is next
        results = await asyncio.gather(*first, *queued, return_exceptions=True)
        done, gone, last = results[:CLAIMS_PER_KEY], results[-3:-1], results[-1]
        assert done == [None] * CLAIMS_PER_KEY and last is None
        assert all(isinstance(r, asyncio.CancelledError) for r in gone), results
        assert p.claims == CLAIMS_PER_KEY + 1 and p.running == {"a": 0}
        assert len(p._gates) == 0

    asyncio.run(body())


def test_a_gate_handed_to_a_cancelled_pop_goes_on_to_the_next() -> None:
    async def body() -> None:
        gate = _Gate(running=CLAIMS_PER_KEY)
        entered: list[str] = []

        async def enter(name: str) -> None:
            await _enter(gate)
            entered.append(name)

        one = asyncio.create_task(enter("one"))
        two = asyncio.create_task(enter("two"))
        await asyncio.sleep(0)
        assert len(gate.waiters) == 2
        _leave(gate)  # a turn handed to one, still counted ...
        assert gate.running == CLAIMS_PER_KEY
        one.cancel()  # ... which is cancelled before it runs: two gets it
        await asyncio.wait_for(asyncio.gather(one, two, return_exceptions=True), 5)
        assert one.cancelled() and entered == ["two"]
        assert gate.running == CLAIMS_PER_KEY and not gate.waiters
        _leave(gate)
        assert gate.running == CLAIMS_PER_KEY - 1

    asyncio.run(body())
