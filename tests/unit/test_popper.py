"""Popper's claim gate: claims of one worker on the same cursor rows run one at a time, or
``CLAIMS_PER_KEY`` at a time while they come back full.

The claim itself is replaced by a recorder (``log_pop_v3`` is covered by the integration
tests); what is checked here is how many claims run at once, per key.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from queen_mp.db import pop_procs
from queen_mp.front import popper
from queen_mp.front.parking import ParkingLot, ParkKey
from queen_mp.front.popper import CLAIMS_PER_KEY, Popper, PopRequest, _enter, _Gate, _leave

TENANT = bytes(16)


class FakeBoard:
    def value(self, bucket: int) -> int:
        return 0

    def snapshot(self) -> bytes:
        return b""


class RecordingPopper(Popper):
    """Claims that take until released and count how many run at once, per queue; each
    claims ``fill`` messages (0: nothing)."""

    def __init__(self) -> None:
        super().__init__(pool=None, lot=ParkingLot(FakeBoard(), 0.01),  # type: ignore[arg-type]
                         max_parked=10)
        self.running: dict[str | None, int] = {}
        self.most: dict[str | None, int] = {}
        self.release = asyncio.Event()
        self.turns = asyncio.Semaphore(0)  # with ``stepped``: one claim ends per release()
        self.stepped = False
        self.fill = 0
        self.claims = 0

    async def _claim(self, r: PopRequest, lease: uuid.UUID | None,
                     claim_ms: int) -> pop_procs.ClaimResult:
        self.claims += 1
        self.running[r.queue] = self.running.get(r.queue, 0) + 1
        self.most[r.queue] = max(self.most.get(r.queue, 0), self.running[r.queue])
        try:
            if self.stepped:
                await self.turns.acquire()
            else:
                await self.release.wait()
        finally:
            self.running[r.queue] -= 1
        if not self.fill:
            return pop_procs.ClaimResult([], None)
        return pop_procs.ClaimResult(
            [pop_procs.Claim(r.queue or "", 1, "p", 1, self.fill, 1, None, False)], None)


def request(queue: str, **kw: Any) -> PopRequest:
    fields: dict[str, Any] = {
        "tenant": TENANT, "queue": queue, "partition": None, "namespace": None, "task": None,
        "group": "g", "batch": 10, "partitions": 1, "wait": False, "timeout_ms": 5000,
        "auto_ack": False, "sub_mode": "all", "sub_from": None}
    fields.update(kw)
    return PopRequest(**fields)


def test_claims_on_the_same_rows_wait_for_each_other_others_do_not() -> None:
    async def body() -> None:
        p = RecordingPopper()
        pops = [asyncio.create_task(p.pop(request("a"))) for _ in range(5)]
        pops += [asyncio.create_task(p.pop(request("b"))) for _ in range(3)]
        pops.append(asyncio.create_task(p.pop(request("a", group="other"))))
        pops.append(asyncio.create_task(p.pop(request("a", partition="p1"))))
        for _ in range(20):
            await asyncio.sleep(0)
        # one claim of a/g, one of b/g, one of a/other, one of a/g/p1: four keys, four claims
        assert sum(p.running.values()) == 4
        assert p.running == {"a": 3, "b": 1}
        p.release.set()
        assert await asyncio.gather(*pops) == [None] * 10
        assert p.claims == 10
        assert p.most["b"] == 1
        assert p.running == {"a": 0, "b": 0}
        await asyncio.sleep(0)
        assert len(p._gates) == 0  # no pop alive, no gate kept

    asyncio.run(body())


def test_a_pop_whose_claim_time_ran_out_in_the_gate_claims_nothing() -> None:
    async def body() -> None:
        p = RecordingPopper()
        first = asyncio.create_task(p.pop(request("a", timeout_ms=5000)))
        for _ in range(5):
            await asyncio.sleep(0)
        late = asyncio.create_task(p.pop(request("a", timeout_ms=40)))  # claims until ~30 ms
        await asyncio.sleep(0.06)
        p.release.set()
        assert await asyncio.gather(first, late) == [None, None]
        assert p.claims == 1  # the late one never reached the database

    asyncio.run(body())


def test_cancelled_pops_leave_the_gate_to_the_next_in_order() -> None:
    async def body() -> None:
        p = RecordingPopper()
        first = asyncio.create_task(p.pop(request("a")))
        for _ in range(3):
            await asyncio.sleep(0)
        queued = [asyncio.create_task(p.pop(request("a"))) for _ in range(3)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert p.claims == 1
        queued[0].cancel()  # cancelled while waiting: leaves the line
        await asyncio.sleep(0)
        p.release.set()  # the first claim ends: the gate goes to the first one still waiting
        queued[1].cancel()  # cancelled before the first claim left: queued[2] is next
        results = await asyncio.gather(first, *queued, return_exceptions=True)
        assert results[0] is None and results[3] is None
        assert all(isinstance(r, asyncio.CancelledError) for r in results[1:3]), results
        assert p.claims == 2 and p.running == {"a": 0}
        assert len(p._gates) == 0

    asyncio.run(body())


def test_a_gate_handed_to_a_cancelled_pop_goes_on_to_the_next() -> None:
    async def body() -> None:
        gate = _Gate(running=1)
        entered: list[str] = []

        async def enter(name: str) -> None:
            await _enter(gate)
            entered.append(name)

        one = asyncio.create_task(enter("one"))
        two = asyncio.create_task(enter("two"))
        await asyncio.sleep(0)
        assert len(gate.waiters) == 2
        _leave(gate)  # handed to one, still counted ...
        assert gate.running == 1
        one.cancel()  # ... which is cancelled before it runs: two gets it
        await asyncio.wait_for(asyncio.gather(one, two, return_exceptions=True), 5)
        assert one.cancelled() and entered == ["two"]
        assert gate.running == 1 and not gate.waiters
        _leave(gate)
        assert gate.running == 0

    asyncio.run(body())


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_claims_that_come_back_full_open_a_second_turn_short_ones_close_it() -> None:
    assert CLAIMS_PER_KEY == 2  # the figures below

    async def body() -> None:
        p = RecordingPopper()
        p.stepped, p.fill = True, 10  # request(): batch 10, so every claim is full
        pops = [asyncio.create_task(p.pop(request("a"))) for _ in range(5)]
        await _settle()
        assert p.running == {"a": 1}  # no claim came back yet: one turn
        p.turns.release()
        await _settle()
        assert p.running == {"a": 2}  # it was full: two turns
        p.fill = 5  # the next ones come back short
        p.turns.release()
        await _settle()
        assert p.running == {"a": 1}  # one short claim: back to one turn, no new one starts
        p.turns.release()
        await _settle()
        assert p.running == {"a": 1}  # the other one ended too; the next waiter got the turn
        p.fill = 10
        p.turns.release()  # full again: two turns, but only one waiter was left
        await _settle()
        assert p.running == {"a": 1}
        p.turns.release()
        results = await asyncio.gather(*pops)
        assert p.claims == 5 and p.most == {"a": 2} and p.running == {"a": 0}
        assert all(r is not None and r.claims[0].count in (5, 10) for r in results)
        assert len(p._gates) == 0

    asyncio.run(body())


def test_the_parking_lot_says_when_its_first_pop_parks_and_its_last_leaves() -> None:
    """The worker publishes it for the shards (slot table ``set_parked``), BEFORE the pop
    compares its token: a commit that bumped the board after that comparison finds it set."""
    calls: list[tuple[bool, int]] = []

    async def go() -> None:
        lot = ParkingLot(FakeBoard(), 0.001, lambda parked: calls.append((parked, lot.parked)))
        key = ParkKey(1, "g", (TENANT, None))
        deadline = time.monotonic() + 5
        first = asyncio.ensure_future(lot.park(key, 0, deadline))
        second = asyncio.ensure_future(lot.park(key, 0, deadline))
        await asyncio.sleep(0)
        assert calls == [(True, 1)]
        await lot.park(key, 1, deadline)  # a moved token: back at once, still published
        assert calls == [(True, 1)]
        lot.pass_baton(key)
        await first
        assert calls == [(True, 1)]
        lot.pass_baton(key)
        await second
        assert calls == [(True, 1), (False, 0)]

    asyncio.run(go())


def test_a_claim_stuck_past_the_grace_times_out_and_so_does_a_pop_waiting_its_turn(
        monkeypatch: Any) -> None:
    """The database grace runs from the pop's start over its claims and their turns at the
    gate (not only while parked: a parked pop holds no timer for it)."""
    monkeypatch.setattr(popper, "_DB_GRACE_S", 0.05)

    async def body() -> None:
        p = RecordingPopper()  # its claims never end: a stuck database
        t0 = time.monotonic()
        stuck = asyncio.create_task(p.pop(request("a", timeout_ms=100)))
        await _settle()
        behind = asyncio.create_task(p.pop(request("a", timeout_ms=100)))
        results = await asyncio.wait_for(
            asyncio.gather(stuck, behind, return_exceptions=True), 5)
        assert [type(r) for r in results] == [TimeoutError, TimeoutError]
        assert 0.14 <= time.monotonic() - t0 < 2
        assert p.claims == 1 and p.running == {"a": 0}
        assert len(p._gates) == 0

    asyncio.run(body())


def test_a_parked_pop_answers_at_its_deadline_past_a_shorter_grace(monkeypatch: Any) -> None:
    monkeypatch.setattr(popper, "_DB_GRACE_S", 0.01)

    async def body() -> None:
        p = RecordingPopper()
        p.release.set()  # claims answer at once, with nothing
        t0 = time.monotonic()
        assert await p.pop(request("a", wait=True, timeout_ms=200)) is None
        assert 0.19 <= time.monotonic() - t0 < 2
        assert p.lot.parked == 0 and len(p._gates) == 0

    asyncio.run(body())


def test_parked_pops_return_at_their_own_deadlines_under_one_timer() -> None:
    """Deadlines out of order, one pop woken before its time, one cancelled: each of the others
    returns at its own deadline, and the lot forgets the deadlines of pops gone."""
    async def go() -> None:
        lot = ParkingLot(FakeBoard(), 0.5)
        t0 = time.monotonic()
        ends: dict[str, float] = {}

        async def parked(name: str, key: ParkKey, after: float) -> None:
            await lot.park(key, 0, t0 + after)
            ends[name] = time.monotonic() - t0

        keys = {n: ParkKey(i, "g", (TENANT, n)) for i, n in enumerate("abcde")}
        tasks = [asyncio.ensure_future(parked(n, keys[n], after)) for n, after in
                 (("a", 0.30), ("b", 0.10), ("c", 0.20), ("d", 0.05), ("e", 0.15))]
        await asyncio.sleep(0.02)
        lot.pass_baton(keys["d"])  # woken before its deadline
        tasks[4].cancel()  # e: its client went away
        await asyncio.gather(*tasks, return_exceptions=True)
        assert ends["d"] < 0.045, ends
        for name, after in (("b", 0.10), ("c", 0.20), ("a", 0.30)):
            assert after - 0.002 <= ends[name] < after + 0.25, ends  # never early
        assert ends["b"] < ends["c"] < ends["a"], ends
        assert "e" not in ends and lot.parked == 0 and lot._deadlines._timer is None
        assert not lot._deadlines

        # pops woken at once leave no deadline behind for their whole timeout
        for _ in range(3):
            many = [asyncio.ensure_future(lot.park(ParkKey(1, "g", (TENANT, str(i))), 0,
                                                   time.monotonic() + 60)) for i in range(200)]
            await asyncio.sleep(0)
            for i in range(200):
                lot.pass_baton(ParkKey(1, "g", (TENANT, str(i))))
            await asyncio.gather(*many)
        assert len(lot._deadlines) <= 66, len(lot._deadlines)  # 600 without compaction
        await lot.close()
        assert not lot._deadlines and lot._deadlines._timer is None

    asyncio.run(go())


def test_a_bucket_wakes_the_first_waiter_of_each_of_its_keys_and_of_every_discovery_key(
) -> None:
    """A bucket's keys (one held as itself, several in a set) and the discovery keys (bucket
    None) are woken by a change of that bucket; keys leave their bucket with their last
    waiter, and a bucket left with one key still wakes it."""
    async def go() -> None:
        lot = ParkingLot(FakeBoard(), 60)
        until = time.monotonic() + 30
        lone, a, b, c = (ParkKey(1, "g", (TENANT, "p")), ParkKey(2, "g", (TENANT, "a")),
                         ParkKey(2, "h", (TENANT, "a")), ParkKey(2, "g", (TENANT, "c")))
        found = ParkKey(None, "g", (TENANT, "ns", None))
        pops = {name: asyncio.ensure_future(lot.park(key, 0, until)) for name, key in
                (("lone", lone), ("a", a), ("a2", a), ("b", b), ("c", c), ("found", found))}
        await asyncio.sleep(0)
        assert lot._by_bucket[1] == lone and lot._by_bucket[2] == {a, b, c}
        lot.wake_buckets([1])
        await asyncio.sleep(0)
        assert {n for n, p in pops.items() if p.done()} == {"lone", "found"}
        assert 1 not in lot._by_bucket and None not in lot._by_bucket
        lot.wake_buckets([2])  # the first waiter of each key: a, b and c, not a2
        await asyncio.sleep(0)
        assert {n for n, p in pops.items() if not p.done()} == {"a2"}
        assert lot._by_bucket[2] == {a}
        lot.wake_buckets([3])
        await asyncio.sleep(0)
        assert not pops["a2"].done()
        lot.wake_buckets([2])
        await asyncio.sleep(0)
        assert pops["a2"].done() and not lot._by_bucket and lot.parked == 0
        again = asyncio.ensure_future(lot.park(c, 0, until))  # a bucket emptied takes anew
        await asyncio.sleep(0)
        assert lot._by_bucket[2] == c
        lot.wake_buckets([2])
        await again
        await lot.close()

    asyncio.run(go())


class CountingPool:
    """A pool of ``max_size`` stand-in connections that counts how many are out at once."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.out = self.most = 0

    async def getconn(self) -> object:
        self.out += 1
        self.most = max(self.most, self.out)
        return object()

    async def putconn(self, conn: object) -> None:
        self.out -= 1


def test_pops_past_the_pools_size_wait_at_the_popper_not_in_the_pool(monkeypatch) -> None:
    async def body() -> None:
        release = asyncio.Event()
        claims = 0

        async def claim(conn: object, r: PopRequest, lease: Any, claim_ms: int
                        ) -> pop_procs.ClaimResult:
            nonlocal claims
            claims += 1
            await release.wait()
            return pop_procs.ClaimResult([], None)

        monkeypatch.setattr(popper.pop_procs, "claim", claim)
        pool = CountingPool(2)
        p = Popper(pool, ParkingLot(FakeBoard(), 0.01), 10)  # type: ignore[arg-type]
        pops = [asyncio.create_task(p.pop(request(f"q{i}"))) for i in range(6)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert (pool.out, claims) == (2, 2)
        pops[3].cancel()  # a waiter cancelled: its turn goes to the next
        release.set()
        done = await asyncio.gather(*pops, return_exceptions=True)
        assert isinstance(done[3], asyncio.CancelledError)
        assert done[:3] + done[4:] == [None] * 5
        assert (pool.most, pool.out, claims) == (2, 0, 5)
        assert p._pooled.running == 0 and not p._pooled.waiters

    asyncio.run(body())


def test_a_waiting_pop_that_claims_nothing_answers_at_its_deadline_with_no_timer_of_its_own(
        ) -> None:
    """It parks until its last claim may start, then sleeps out the margin on the parking
    lot's deadline timer (``sleep_until``), its grace disarmed: None at the deadline, not
    before, and the lot's heap empties."""

    async def body() -> None:
        p = RecordingPopper()
        p.lot = ParkingLot(FakeBoard(), 3600)  # its watcher's one sleep, not a tick each
        p.release.set()  # claims end at once, with nothing
        loop = asyncio.get_running_loop()
        timers: list[str] = []
        real_call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any,
                             **kw: Any) -> asyncio.TimerHandle:
            timers.append(callback.__qualname__)
            return real_call_at(when, callback, *args, **kw)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        t0 = time.monotonic()
        pops = [asyncio.create_task(p.pop(request(f"q{i}", wait=True, timeout_ms=200)))
                for i in range(5)]
        assert await asyncio.gather(*pops) == [None] * 5
        took = time.monotonic() - t0
        assert 0.19 <= took < 0.5, took
        assert p.lot.parked == 0 and not p.lot._deadlines and p.lot._sleeping == 0
        # asyncio.sleep's timers: the watcher's one; the graces armed while claiming only
        assert timers.count("_set_result_unless_cancelled") == 1, timers
        assert timers.count("_Grace._fire") == 10, timers
        await p.lot.close()

    asyncio.run(body())


def test_enter_and_leave_count_parked_pops_as_park_does() -> None:
    async def go() -> None:
        lot = ParkingLot(FakeBoard(), 0.001)
        key = ParkKey(1, "g", (TENANT, None))
        deadline = time.monotonic() + 5
        assert lot.enter(key, 1, deadline) is None and lot.parked == 0  # a moved token
        assert lot.enter(key, 0, time.monotonic() - 1) is None and lot.parked == 0
        waiter = lot.enter(key, 0, deadline)
        assert waiter is not None and lot.parked == 1
        lot.pass_baton(key)
        await waiter
        lot.leave(key, waiter)
        assert lot.parked == 0 and not lot._queues and not lot._by_bucket
        await lot.close()

    asyncio.run(go())
