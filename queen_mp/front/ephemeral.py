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

Pushes are fused (``EphemeralPushFusion``): those that reach a worker in one event loop turn, or
while its previous call is in flight, go out together as one call and one transaction
(``queen.eph_push_v5``), each answered from its own verdict.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson

from queen_mp.db import ephemeral_procs
from queen_mp.db.errors import Conflict, DatabaseError, OutcomeUnknown, Unavailable
from queen_mp.db.pooled import Pool, connection
from queen_mp.front.parking import ParkingLot, ParkKey
from queen_mp.front.popper import TooManyParked
from queen_mp.ipc.wakeboard import bucket_of
from queen_mp.models.ephemeral import MAX_MESSAGES, PopRequest, Push, Window

__all__ = ["EPH_KEY", "EphemeralPopper", "EphemeralPushFusion", "Popped", "TooManyParked",
           "render_messages", "wake_bucket"]

EPH_KEY = "\x00eph\x00"  # no queue name has a control character: never a durable name
_MAX_MARGIN_S = 0.25  # no claim starts this close to the deadline (what is leased is sent)
_HINT_SLACK_S = 0.01
#: a fused call's bounds: eph_push_v5 takes at most 16,384 messages per partition, and one
#: push (MAX_MESSAGES) always fits
_FUSED_MESSAGES = MAX_MESSAGES
_FUSED_REQUESTS = 256
_CONFLICT_TRIES = 3  # as http/dbcall.py's call_db: a lost lock race changed nothing


def wake_bucket(tenant: bytes, queue: str) -> int:
    """The wake board word of an ephemeral queue."""
    return bucket_of(tenant, EPH_KEY + queue)


@dataclass(frozen=True, slots=True)
class Popped:
    messages: bytes  # a JSON array
    count: int


_SEP = b"\x1e"  # between two payloads of a run (eph_pop_v5): never in JSON text
_RUN = b"\x1f"  # between two runs


def render_messages(out: ephemeral_procs.PopOutcome) -> bytes:
    """A claim's messages as the answer's JSON array, ``[{id, partition, attempts, payload}]``
    with ids ``<epoch>-<seq>-<dlv>`` and payloads verbatim.

    A payload is JSON text as ``models.items.dumps_json`` wrote it, whose control characters
    are always escaped, so 0x1e and 0x1f never occur in one. PERF(eph): a run is one format,
    made of its payloads by a ``replace`` of their separator with the next message's head, and
    applied to the run's seqs: C passes over the bytes and no Python per message (a split
    and a ``%`` per message cost 2.5x more instructions, a str format 3x)."""
    if not out.claimed:
        return b"[]"
    blob = out.payloads
    if b"%" in blob:
        blob = blob.replace(b"%", b"%%")
    runs = [blob] if len(out.counts) == 1 else blob.split(_RUN)
    epoch = out.epoch.encode()
    rendered = []
    for run, part, dlv, att, first, n in zip(runs, out.parts, out.dlvs, out.atts, out.firsts,
                                             out.counts, strict=True):
        head = b'{"id":"%b-%%d-%d","partition":%b,"attempts":%d,"payload":' % (
            epoch, dlv, orjson.dumps(part).replace(b"%", b"%%"), att)
        try:
            rendered.append(b"".join((head, run.replace(_SEP, b"}," + head), b"}"))
                            % tuple(range(first, first + n)))
        except TypeError:  # a separator inside a payload: never one that dumps_json wrote
            raise ValueError(f"eph_pop_v5: a run of {n} messages does not hold {n} payloads"
                             ) from None
    return b"[" + b",".join(rendered) + b"]"


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
                parts.append(render_messages(got))
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


@dataclass(frozen=True, slots=True)
class _Waiting:
    tenant: bytes
    push: Push
    done: asyncio.Future[int]


def _settle(done: asyncio.Future[int], pushed: int | None, error: BaseException | None) -> None:
    if done.done():  # its request went away (a cancelled handler): nobody to answer
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(pushed or 0)


class EphemeralPushFusion:
    """A front worker's ephemeral pushes, at most one call of them in flight: the pushes that
    arrive in one event loop turn, or while a call is in flight, go out together when the
    turn ends (when it is answered), as one call and one transaction
    (sql/functions/ephemeral.sql ``eph_push_v5``; a lone push ``eph_push_v3``), sorted by
    (tenant, queue, partition), as eph_push_v5 takes them (its queues' locks in that order).

    PERF(eph): a push was one pooled call, one statement and one transaction of its own, ~100
    us of PostgreSQL CPU for one message (of which every statement's set-up, whatever its
    rows, is most) and as much again of the front's for the call; the durable push fuses.
    The first push of a quiet worker went alone at once and only those that came during its
    call were fused, so concurrent clients alternated between a call of one and a call of the
    rest; a push now waits for the end of its turn (pg_stat_user_functions, 8 clients pushing
    1 message to 2 workers: 1.8 pushes a call before, 2.9 after, 4.2 a fused call; a lone
    push that waited up to three more turns for company: 3.0, no better).

    A request is answered from its own verdict: stored, ``QueueFull`` (nothing of it
    written), or pushed alone after the fused call (one that must drop messages, or whose
    queue or partition is new: eph_push_v5's header). A fused call that fails stored nothing
    (autocommit): each of its requests is then pushed alone, so a neighbour's failure is never
    another's answer; only a lost connection after the call was sent (``OutcomeUnknown``: it
    may have committed) is every request's answer.
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._waiting: list[_Waiting] = []
        self._drainer: asyncio.Task[None] | None = None

    async def push(self, tenant: bytes, push: Push) -> int:
        """How many messages were stored (all of them); raises ``ephemeral_procs.QueueFull``
        and the ``DatabaseError`` tree."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        self._waiting.append(_Waiting(tenant, push, done))
        if self._drainer is None:  # its first step runs once this turn's callbacks have
            self._drainer = loop.create_task(self._drain())
        return await done

    async def _drain(self) -> None:
        try:
            while self._waiting:
                await self._send(self._take())
        finally:
            self._drainer = None
            for w in self._waiting:  # cancelled (the worker stops): never sent
                _settle(w.done, None, Unavailable("the worker stopped before the push"))
            self._waiting = []

    def _take(self) -> list[_Waiting]:
        """The longest prefix of the waiting pushes within one call's bounds (one at least)."""
        waiting = self._waiting
        total, end = 0, 0
        while end < len(waiting) and end < _FUSED_REQUESTS:
            total += len(waiting[end].push.payloads)
            if end and total > _FUSED_MESSAGES:
                break
            end += 1
        batch, self._waiting = waiting[:end], waiting[end:]
        return batch

    async def _send(self, batch: list[_Waiting]) -> None:
        if len(batch) == 1:
            await self._settle_alone(batch[0])
            return
        batch.sort(key=lambda w: (w.tenant, w.push.queue, w.push.partition))
        try:
            async with connection(self.pool) as conn:
                out = await ephemeral_procs.push_many(
                    conn, [w.tenant for w in batch], [w.push.queue for w in batch],
                    [w.push.partition for w in batch], [w.push.payloads for w in batch])
        except OutcomeUnknown as ex:
            for w in batch:
                _settle(w.done, None, ex)
            return
        except DatabaseError:  # rolled back whole: each is answered on its own
            await self._settle_each(batch)
            return
        except BaseException:  # cancelled (the worker stops): the call may have been sent
            for w in batch:
                _settle(w.done, None, OutcomeUnknown("the fused push was interrupted"))
            raise
        alone = []
        for w, pushed, detail in zip(batch, out.pushed, out.details, strict=True):
            if pushed == ephemeral_procs.PUSHED_ALONE:
                alone.append(w)
            elif pushed == ephemeral_procs.PUSHED_FULL:
                _settle(w.done, None, ephemeral_procs.QueueFull(detail or "queue_full"))
            else:
                _settle(w.done, pushed, None)
        if alone:
            await self._settle_each(alone)

    async def _settle_each(self, batch: list[_Waiting]) -> None:
        """Push each of ``batch`` alone: the queues side by side, a queue's pushes one after
        another, in batch order, as the fused call would have stored them. Side by side, the
        pushes of one queue would each check its bounds before the others commit (a reject
        queue of maxLength 30 took 32-34 messages in test_ephemeral_fusion, when its
        partitions were new and the whole call went alone)."""
        queues: dict[tuple[bytes, str], list[_Waiting]] = {}
        for w in batch:
            queues.setdefault((w.tenant, w.push.queue), []).append(w)

        async def in_turn(ws: list[_Waiting]) -> None:
            for w in ws:
                await self._settle_alone(w)

        await asyncio.gather(*(in_turn(ws) for ws in queues.values()))

    async def _settle_alone(self, w: _Waiting) -> None:
        try:
            pushed = await self._alone(w.tenant, w.push)
        except Exception as ex:
            _settle(w.done, None, ex)
        else:
            _settle(w.done, pushed, None)

    async def _alone(self, tenant: bytes, push: Push) -> int:
        for attempt in range(_CONFLICT_TRIES):
            try:
                async with connection(self.pool) as conn:
                    return await ephemeral_procs.push(conn, tenant, push.queue, push.partition,
                                                      push.payloads)
            except Conflict:
                if attempt + 1 == _CONFLICT_TRIES:
                    raise
                await asyncio.sleep(0.02 * (attempt + 1))
        raise AssertionError("unreachable")
