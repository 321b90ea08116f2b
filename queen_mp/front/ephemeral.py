"""The ephemeral pop of a front worker: claim, and when nothing is claimable, park until woken.

Ephemeral queues live in PostgreSQL (UNLOGGED tables, sql/functions/ephemeral.sql), so every
broker instance over the database serves the same queues, and a long poll waits the way a
durable pop does (front/parking.py): no connection held and no polling loop while parked. A
push or a redelivering ack bumps the queue's word on the wake board, which reaches the
front workers of this instance through the board and other instances through the batched
``NOTIFY`` of ``ipc/wakeup.py``. The ephemeral queue's word is that of an ``EPH_KEY``-prefixed
name, so a durable queue of the same name is not woken by it (a collision only costs a query).

A pop that got messages but fewer than its queue's ``windowBuffer`` asks for keeps waiting,
up to the window's ``ms`` (never past its own timeout), to answer with a fuller batch.

The calls of one queue run side by side in PostgreSQL (sql/functions/ephemeral.sql: no row
that every call needs; concurrent pops of a group take different partitions), so nothing here
serialises them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from queen_mp.db import ephemeral_procs
from queen_mp.db.pooled import Pool, connection
from queen_mp.front.parking import ParkingLot, ParkKey
from queen_mp.front.popper import TooManyParked
from queen_mp.ipc.wakeboard import bucket_of
from queen_mp.models.ephemeral import PopRequest, Window

__all__ = ["EPH_KEY", "EphemeralPopper", "Popped", "TooManyParked", "wake_bucket"]

EPH_KEY = "\x00eph\x00"  # no queue name has a control character: never a durable name
_MAX_MARGIN_S = 0.25  # no claim starts this close to the deadline (what is leased is sent)
_HINT_SLACK_S = 0.01


def wake_bucket(tenant: bytes, queue: str) -> int:
    """The wake board word of an ephemeral queue."""
    return bucket_of(tenant, EPH_KEY + queue)


@dataclass(frozen=True, slots=True)
class Popped:
    messages: bytes  # a JSON array
    count: int


def _join(parts: list[bytes]) -> bytes:
    if len(parts) == 1:
        return parts[0]
    return b"[" + b",".join(p[1:-1] for p in parts) + b"]"


class EphemeralPopper:
    def __init__(self, pool: Pool, lot: ParkingLot, max_parked: int) -> None:
        self.pool = pool
        self.lot = lot
        self.max_parked = max_parked

    async def _claim(self, tenant: bytes, r: PopRequest, batch: int
                     ) -> ephemeral_procs.PopOutcome:
        async with connection(self.pool) as conn:
            return await ephemeral_procs.pop(conn, tenant, r.queue, r.partition, r.group,
                                             batch, r.auto_ack)

    async def pop(self, tenant: bytes, r: PopRequest) -> Popped:
        """Raises ``TooManyParked`` (429) and the database errors of ``ephemeral_procs``."""
        budget = r.timeout_ms / 1000
        start = time.monotonic()
        deadline = start + budget
        claim_until = deadline - min(_MAX_MARGIN_S, budget / 4)
        wait = r.wait and r.timeout_ms > 0
        bucket = wake_bucket(tenant, r.queue)
        key = ParkKey(bucket, r.group, (tenant, EPH_KEY, r.partition))
        window: Window | None = None  # the queue's windowBuffer, from the first claim
        parts: list[bytes] = []
        held = 0
        first_at: float | None = None
        woken = False
        while True:
            token = self.lot.token(bucket)
            got = await self._claim(tenant, r, r.batch - held)
            now = time.monotonic()
            if got.claimed:
                parts.append(got.messages)
                held += got.claimed
                first_at = first_at if first_at is not None else now
                if woken:
                    self.lot.pass_baton(key)  # there may be more for the next waiter
            if not wait or held >= r.batch or now >= claim_until:
                break
            if held and window is None:
                window = Window(got.window_ms, got.window_count)
            if window is not None and window.ready(held, r.batch, (now - (first_at or now)) * 1000):
                break
            until = claim_until
            if window is not None and first_at is not None:
                until = min(until, first_at + window.ms / 1000) if window.ms else until
                if now >= until:
                    break  # the window is over: answer with what is held
            if got.wake_in_ms is not None:
                until = min(until, now + got.wake_in_ms / 1000 + _HINT_SLACK_S)
            if self.lot.parked >= self.max_parked:
                if held:
                    break
                raise TooManyParked(f"{self.lot.parked} pops already parked in this worker")
            await self.lot.park(key, token, until, front=woken)
            woken = True
        return Popped(_join(parts) if parts else b"[]", held)
