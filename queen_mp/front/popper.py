"""The pop path of a front worker: claim, and when nothing is claimable, park until woken.

One claim is one ``log_pop_v3`` statement on a pooled connection, released before any wait:
a parked pop holds no database connection. Claiming stops a margin before the caller's deadline
(250 ms at most, a quarter of the time left at most) so nothing is leased that cannot be
delivered; a waiting pop that got nothing is still held to its deadline so clients do not spin.

Claims of one worker that compete for the same cursor rows (same tenant, queue or discovery
scope, partition filter and group) run one at a time, or ``CLAIMS_PER_KEY`` at a time while
the key's claims fill their batch: unbounded concurrent claims would all read and lock the
same rows of ``log_consumers`` and mostly skip each other's. With 16 consumers of a
100-partition queue under a push load, PostgreSQL spent 4.7 ms a pop that way, 2.7 ms with
at most two concurrent claims.

Why two while claims come back full: a claim holds its turn until its commit is flushed and
its answer read back, 2-9 ms on a loaded 2-core machine for a 0.55 ms statement (the WAL
flush, the worker's event loop serving the other requests meanwhile). Draining a backlog with
one turn per worker, 8 consumers (pop 100, ack each batch) queued 7-11 ms a pop for it; with
two, 1-3 ms, for the same PostgreSQL CPU per message. A second claim that finds the first
one's candidate locked skips it (SKIP LOCKED) and takes the next, which a backlog has. With
little to claim (a claim that comes back short) the key goes back to one turn: under a push
load that consumers keep up with, two turns made concurrent claims race for the few ready
partitions (PostgreSQL CPU per message of bench.suite's mixed section, 16 consumers, up
from 70-79 to 94-97 us).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from dataclasses import dataclass

import msgspec
from prometheus_client import Gauge

from queen_mp.db import pop_procs
from queen_mp.db.pooled import Pool, connection
from queen_mp.db.pop_procs import Claim, PopRequest
from queen_mp.front.parking import ParkingLot, ParkKey
from queen_mp.ipc.wakeboard import bucket_of
from queen_mp.wire.ids import uuid7

__all__ = ["CLAIMS_PER_KEY", "PopRequest", "Popped", "Popper", "TooManyParked"]

#: claims of one key that may run at once in one worker while they fill their batch (the
#: module's docstring says why 2)
CLAIMS_PER_KEY = 2

_MAX_MARGIN_S = 0.25
_HINT_SLACK_S = 0.01
_MIN_CLAIM_S = 0.005
#: how long past the caller's timeout a claim may keep the answer waiting for a stuck database
_DB_GRACE_S = 5.0


class TooManyParked(Exception):
    """This worker already parks QUEEN_MAX_PARKED_POPS pops (answered 429)."""


class Popped(msgspec.Struct, frozen=True):
    """What a pop claimed, and the lease it holds it under (None: auto-acked)."""

    claims: list[Claim]
    lease_id: str | None


@dataclass(eq=False, slots=True)
class _Gate:
    """At most ``width`` claims at a time for the pops of one key, in arrival order.

    PERF(queen): not an ``asyncio.Lock`` kept in a ``WeakValueDictionary``: a pop made a
    Lock and its weak entry, and entered and left it through five Python calls each time;
    an uncontended pass here is two attribute writes (17 of the 470 Python calls of a
    sequential autoAck pop, cProfile of a front worker)."""

    users: int = 0  # pops alive on this key; the gate leaves the table with the last
    running: int = 0  # claims of this key running now
    width: int = 1  # CLAIMS_PER_KEY while the last claim filled its batch, else 1
    # NOTE(memory): made by the first pop that waits for a turn; most keys never see one,
    # and an empty deque is 624 bytes (a parked pop holds its key's gate)
    waiters: deque[asyncio.Future[None]] | None = None


class Popper:
    def __init__(self, pool: Pool, lot: ParkingLot, max_parked: int,
                 parked_gauge: Gauge | None = None) -> None:
        self.pool = pool
        self.lot = lot
        self.max_parked = max_parked
        self.parked_gauge = parked_gauge
        self._gates: dict[ParkKey, _Gate] = {}
        # the claims on the pool at once: its size (the tests' stand-in has no pool)
        self._pooled = _Gate(width=getattr(pool, "max_size", 1))

    async def pop(self, r: PopRequest) -> Popped | None:
        """Claims for ``r``, parking while there is nothing to claim and ``r`` waits.

        A claim (its turn at the gate included) still pending ``_DB_GRACE_S`` past the
        caller's timeout raises TimeoutError.

        PERF(memory): the timeout is disarmed while the pop is parked: a parked pop holds
        every timer of its chain (a uvloop timer is 0.5 KB), and the park itself ends before
        the deadline (``claim_until``). One ``_Grace``, disarmed and armed again: one per claim
        cost a parked and woken pop 17k more instructions (callgrind, 210k against 193k). A
        waiting pop that got nothing sleeps out its last margin disarmed too."""
        # NOTE(auth): the tenant is part of the key, so a woken waiter of another tenant (same
        # namespace, or a bucket collision) cannot take the baton and leave ours asleep.
        key = ParkKey(bucket_of(r.tenant, r.queue) if r.queue is not None else None, r.group,
                      (r.tenant, r.partition) if r.queue is not None
                      else (r.tenant, r.namespace, r.task))
        loop = asyncio.get_running_loop()
        grace = _Grace(loop, loop.time() + r.timeout_ms / 1000 + _DB_GRACE_S)
        closed = False
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate()
        gate.users += 1
        try:
            grace.arm()
            budget = (r.timeout_ms or 30_000) / 1000  # timeout=0 acts as wait=false
            deadline = time.monotonic() + budget
            # No claim starts after this: what is leased must reach the caller in time.
            claim_until = deadline - min(_MAX_MARGIN_S, budget / 4)
            wait = r.wait and r.timeout_ms > 0
            woken = False
            while True:
                if gate.running >= gate.width or gate.waiters:
                    await _enter(gate)
                else:
                    gate.running += 1
                try:
                    claim_s = claim_until - time.monotonic()
                    if claim_s < _MIN_CLAIM_S:
                        break
                    token = self.lot.token(key.bucket)
                    lease = None if r.auto_ack else uuid.UUID(bytes=uuid7())
                    result = await self._claim(r, lease, int(claim_s * 1000))
                    _widen(gate, sum(c.count for c in result.claims) >= r.batch)
                finally:
                    _leave(gate)
                if result.claims:
                    # NOTE(queen): there may be more to claim; the next pop parked on this key
                    # looks (it parks again at the head if not).
                    self.lot.pass_baton(key)
                    return Popped(result.claims, str(lease) if lease is not None else None)
                if not wait:
                    return None
                if self.lot.parked >= self.max_parked:
                    raise TooManyParked(f"{self.lot.parked} pops already parked in this worker")
                until = claim_until
                if result.wake_in_ms is not None:
                    until = min(until, time.monotonic() + result.wake_in_ms / 1000
                                + _HINT_SLACK_S)
                del result  # NOTE(memory): not held while parked
                if self.parked_gauge is not None:
                    self.parked_gauge.inc()
                grace.disarm()  # PERF(memory): no timer while parked (docstring)
                try:
                    # PERF(memory): the lot's waiter awaited here, not through ``park``'s
                    # coroutine (a parked pop holds every frame of its chain)
                    waiter = self.lot.enter(key, token, until, front=woken)
                    if waiter is not None:
                        try:
                            await waiter
                        finally:
                            self.lot.leave(key, waiter)
                finally:
                    grace.arm()
                    if self.parked_gauge is not None:
                        self.parked_gauge.dec()
                woken = True
            if wait:
                # PERF(memory): on the lot's deadline timer, and the grace disarmed: it falls
                # _DB_GRACE_S past this deadline (docstring)
                grace.disarm()
                await self.lot.sleep_until(deadline)
            return None
        except asyncio.CancelledError as ex:
            closed = True
            if grace.close(cancelled=True):
                raise TimeoutError from ex
            raise
        finally:
            if not closed:
                grace.close(cancelled=False)
            gate.users -= 1
            if not gate.users:
                del self._gates[key]

    async def _claim(self, r: PopRequest, lease: uuid.UUID | None,
                     claim_ms: int) -> pop_procs.ClaimResult:
        """One claim on a pooled connection, its turn at ``_pooled`` first.

        PERF(memory): the pops past the pool's size wait at that gate (a future each), not
        inside the pool's ``getconn`` (a Task, a WaitingClient, a condition, a lock and a timer
        each, some 2.4 KB, kept in arenas after): with 1,000 pops timing out and asked again at
        once during a push burst (the suite's wake section, bench/parkmem.py ``--repark``) a
        front worker's PSS at the peak 37.3 -> 35.9 MB, parked 35.7 -> 34.1 (means of 4 runs
        x 2 workers); an uncontended claim pays 0.8k instructions more (callgrind)."""
        gate = self._pooled
        if gate.running >= gate.width or gate.waiters:
            await _enter(gate)
        else:
            gate.running += 1
        try:
            async with connection(self.pool, commit_sent=True) as conn:
                return await pop_procs.claim(conn, r, lease, claim_ms)
        finally:
            if gate.waiters:
                _leave(gate)
            else:
                gate.running -= 1


class _Grace:
    """``asyncio.timeout_at`` for one pop: once armed, its task is cancelled at ``when`` (loop
    time), and that cancellation leaves the pop as TimeoutError (``close``); ``disarm`` and
    ``arm`` take the timer away while the pop is parked and put it back.

    PERF(pop): asyncio's Timeout enters and leaves through two coroutines and reschedules
    through Python calls: 27k instructions a pop against 14k here (callgrind); the same
    cancel-and-uncancel protocol (an outer cancellation stays a CancelledError)."""

    __slots__ = ("_cancelling", "_handle", "_loop", "_task", "_when", "fired")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        task = asyncio.current_task(loop)
        assert task is not None
        self._loop = loop
        self._task = task
        self._when = when
        self._cancelling = task.cancelling()
        self.fired = False
        self._handle: asyncio.TimerHandle | None = None

    def _fire(self) -> None:
        self._handle = None
        self.fired = True
        self._task.cancel()

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def arm(self) -> None:
        if self._handle is None and not self.fired:
            self._handle = self._loop.call_at(self._when, self._fire)

    def close(self, *, cancelled: bool) -> bool:
        """Disarmed for good; True when the pop left by the cancellation this one made
        (``cancelled``: it left by a CancelledError), which is then a timeout."""
        self.disarm()
        return self.fired and self._task.uncancel() <= self._cancelling and cancelled


async def _enter(gate: _Gate) -> None:
    """Wait for a turn (every turn is taken, or others wait before us): ``_leave`` hands a
    turn over still counted, so nothing overtakes a waiter."""
    turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters = gate.waiters
    if waiters is None:
        waiters = gate.waiters = deque()
    waiters.append(turn)
    try:
        await turn
    except asyncio.CancelledError:
        if turn.done() and not turn.cancelled():
            _leave(gate)  # handed over as we were cancelled: pass it on
        else:
            with contextlib.suppress(ValueError):  # ``_leave`` may have dropped it already
                waiters.remove(turn)
        raise


def _widen(gate: _Gate, full: bool) -> None:
    """A claim came back full (more is likely claimable): CLAIMS_PER_KEY turns, and a waiter
    takes the one that opens now; short: one turn (those running finish)."""
    gate.width = CLAIMS_PER_KEY if full else 1
    waiters = gate.waiters
    while gate.running < gate.width and waiters:
        turn = waiters.popleft()
        if not turn.done():
            gate.running += 1
            turn.set_result(None)


def _leave(gate: _Gate) -> None:
    """A claim is over: the first live waiter gets its turn, still counted; or it is free
    (also when the gate narrowed below the claims running)."""
    waiters = gate.waiters
    while waiters and gate.running <= gate.width:
        turn = waiters.popleft()
        if not turn.done():
            turn.set_result(None)
            return
    gate.running -= 1
