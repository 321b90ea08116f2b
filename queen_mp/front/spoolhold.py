"""The spool hold: a producer's items stay in order per partition while spools drain.

A push answered ``buffered`` is stored when a drain replays it (front/spooldrain.py). A push
that comes after it must not be stored before it, whichever front worker or instance takes it:

- One instance. After every spool append the flags board's ``local_hold`` is set (before the
  push is answered), and while it is set a push waits (``HOLD_WAIT_S`` at most, then it is
  spooled) instead of going to PostgreSQL (``push_route``); so once maintenance is off a spool
  only shrinks. The drain clears the hold in a closing pass: it takes ``hold.lock`` in the
  spool directory exclusively (appends take it shared), replays what is left, clears the hold
  and lets the waiting appends go; an append that then finds the hold cleared is not made and
  its push goes to PostgreSQL. So an item answered ``buffered`` is stored before anything
  accepted after it. While the drain cannot go on (PostgreSQL or a shard down: its last pass
  stopped on a transient failure) the hold says so and pushes are spooled at once, behind
  the others, instead of waiting. Records carry their accept time
  (``SpoolItem.accepted_us``, stamped under this process's lock, so each file is in that
  order) and the drain merges the files by it.
- Several instances over one database. An instance whose hold begins publishes it in
  ``queen.spool_holds`` (schema/010) before answering, refreshes it about once a second while
  it lasts (a row not refreshed for ``HOLD_TTL_MS`` is ignored: a dead instance blocks nobody
  for long) and withdraws it once drained. Every instance reads the holds with the
  maintenance switches (front workers' listeners, ipc/wakeup.py) onto its board: while
  another live instance holds records, pushes wait as for a local hold, and a drain stores a
  record only when no other live instance holds an older one. A hold that is published while
  push maintenance is off is answered only after ``HOLD_SETTLE_S``, longer than any peer may
  trust a read without it (``PEERS_VALID_MS``): a peer that read "no hold" before it was
  published stops trusting that read before our first ``buffered`` answer.

What is guaranteed: per instance, exactly the accept order. Across instances, accept order
as the hosts' wall clocks tell it (a producer's items are ordered across hosts only if their
clocks differ by less than the time between the answer of one item and the acceptance of the
next). While PostgreSQL cannot be reached (fault 3) a hold cannot be published: items buffered
then are ordered within their instance, and across instances only from the moment the hold is
published (the drain's heartbeat, as soon as PostgreSQL answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from queen_mp.db.errors import DatabaseError
from queen_mp.ipc.flags import DIRECT, HOLD, SPOOL, FlagsBoard
from queen_mp.spool import SpoolItem, SpoolWriteError, SpoolWriter

__all__ = ["HOLD_BEAT_MS", "HOLD_SETTLE_S", "HOLD_TTL_MS", "HOLD_WAIT_S", "PUBLISH_TIMEOUT_S",
           "SpoolHold", "now_us"]

log = logging.getLogger("queen_mp.spool.hold")

LOCK_NAME = "hold.lock"
#: a hold row not refreshed for this long is ignored by every instance
HOLD_TTL_MS = 10_000
#: how often the draining instance refreshes its row (the flags board elects one writer)
HOLD_BEAT_MS = 1000
#: how long a push waits for a hold to end before it is spooled
HOLD_WAIT_S = 5.0
_HOLD_POLL_S = 0.005
#: wait after publishing a hold while push maintenance is off and peers exist (> PEERS_VALID_MS)
HOLD_SETTLE_S = 3.0
PUBLISH_TIMEOUT_S = 2.0

#: ``publish(oldest_us or None, episode, buckets or None)``: the instance's hold row (None:
#: withdraw the hold ``episode`` ended; ``buckets``: the oldest per bucket of partitions, the
#: drain's); answers ``spool_view_v2`` and the other holders' buckets
Publisher = Callable[[int | None, int, list[int] | None], Awaitable[dict[str, Any]]]


def _direct() -> int:
    return DIRECT


def _resolve(tick: asyncio.Future[None]) -> None:
    if not tick.done():
        tick.set_result(None)


def now_us() -> int:
    return time.time_ns() // 1000


class SpoolHold:
    """One per front worker: the gate between pushes, the spool and the drain."""

    def __init__(self, spool_dir: str | os.PathLike[str], writer: SpoolWriter,
                 flags: FlagsBoard | None, publish: Publisher | None = None, *,
                 keep_order: bool = True) -> None:
        self.writer = writer
        self.flags = flags
        #: ``QUEEN_SPOOL_HOLD``: off, an append sets no hold and only maintenance spools
        self.keep_order = keep_order
        self.publish = publish if keep_order else None
        self._lock_path = Path(spool_dir) / LOCK_NAME
        #: where a push goes now (``FlagsBoard.push_route``): DIRECT, SPOOL or HOLD
        self.route: Callable[[], int] = (
            _direct if flags is None else flags.push_route if keep_order
            else flags.maintenance_route)
        self._last_us = 0
        #: one stamp-and-append at a time in this process, so its file is in stamp order
        self._appending = asyncio.Lock()
        self._tick: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ the push side
    async def wait_hold(self) -> int:
        """A push met a hold: wait for it to end (``DIRECT``), or give up after
        ``HOLD_WAIT_S`` (``SPOOL``); maintenance answers ``SPOOL`` at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HOLD_WAIT_S
        while True:
            route = self.route()
            if route != HOLD:
                return route
            if loop.time() >= deadline:
                return SPOOL
            # PERF(queen): every waiting push of this worker shares one timer per tick
            await asyncio.shield(self._next_tick(loop))

    def _next_tick(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        tick = self._tick
        if tick is None or tick.done():
            tick = self._tick = loop.create_future()
            loop.call_later(_HOLD_POLL_S, _resolve, tick)
        return tick

    async def append(self, items: Sequence[SpoolItem], *, held: bool) -> bool:
        """Append ``items`` (fsynced) and set the hold; ``held``: only while the route still
        says spool (False: nothing written, the push may go direct now). Raises
        ``SpoolWriteError``. A new hold is published before this returns."""
        async with self._appending:
            fresh = await asyncio.to_thread(self._append, items, held)
        if fresh is None:
            return False
        if fresh and self.publish is not None and self.flags is not None:
            await self._announce()
        return True

    def _append(self, items: Sequence[SpoolItem], held: bool) -> bool | None:
        with self._gate(fcntl.LOCK_SH):
            if held and self.route() == DIRECT:
                return None
            # NOTE(queen): strictly rising in this process even if the clock steps back.
            stamp = self._last_us = max(now_us(), self._last_us + 1)
            self.writer.append([replace(it, accepted_us=stamp).encode() for it in items])
            if self.flags is None or not self.keep_order:
                return False
            return self.flags.set_local_hold(stamp)

    async def publish_held(self, oldest_us: int) -> dict[str, Any]:
        """Publish the hold; if it ended meanwhile (the drain's closing pass withdrew the row
        while this write was under way, and this write put it back), withdraw it again:
        a row nobody refreshes would hold the other instances back until it expires."""
        assert self.publish is not None and self.flags is not None
        episode = self.flags.hold_episode
        view = await self.publish(oldest_us, episode, None)
        if not self.flags.local_hold():
            view = await self.publish(None, episode, None)
        return view

    async def _announce(self) -> None:
        assert self.publish is not None and self.flags is not None
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                view = await self.publish_held(self.flags.local_oldest_us or now_us())
        except (DatabaseError, OSError, TimeoutError) as ex:
            # NOTE(queen): PostgreSQL unreachable (fault 3): the drain's heartbeat publishes
            # the hold once it answers; until then order holds within this instance only.
            log.warning("spool hold not published (%s): ordered within this instance only",
                        ex)
            return
        if not view.get("maintenance") and view.get("peers"):
            # NOTE(queen): a peer may have read "no hold" just before ours committed; it stops
            # trusting that read after PEERS_VALID_MS, and our buffered answer comes later.
            await asyncio.sleep(HOLD_SETTLE_S)

    # ------------------------------------------------------------------ the drain side
    def lock_closing(self) -> int:
        """Take ``hold.lock`` exclusively (blocking: call it from a thread): no append until
        ``unlock``; returns the descriptor to hand back."""
        return self._lock(fcntl.LOCK_EX)

    @staticmethod
    def unlock(fd: int) -> None:
        os.close(fd)  # NOTE(queen): closing the descriptor releases the flock

    @contextlib.contextmanager
    def _gate(self, how: int) -> Iterator[None]:
        try:
            fd = self._lock(how)
        except OSError as ex:
            raise SpoolWriteError(f"cannot lock {self._lock_path}: {ex}", errno=ex.errno) from ex
        try:
            yield
        finally:
            self.unlock(fd)

    def _lock(self, how: int) -> int:
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, how)
        except BaseException:
            os.close(fd)
            raise
        return fd
