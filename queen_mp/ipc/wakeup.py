"""Wake-ups of parked pops: who says a queue may have become claimable, and how it travels.

``Waker`` is used by whoever makes a queue claimable (a shard after a push commit, a front
worker after an ack released a lease). It bumps the instance's shared wake board at once and,
when other instances may be listening, sends the buckets in one batched ``NOTIFY`` per tick.
``WakeListener`` runs in each front worker: it ``LISTEN``s and bumps the local board for wakes
of other instances, so parked pops see one source of truth, the board. It reconnects by itself
(a restart or a failover of PostgreSQL: a multi-host DSN finds the new primary) and, since
wakes sent meanwhile are lost, then bumps every bucket once.

The same listener connection (one per front worker) also keeps the flags board
(``queen_mp/ipc/flags.py``) in step with ``queen.system_settings``: it ``LISTEN``s on
``queen_settings`` (queen_mp/sql/functions/system.sql notifies every change at commit), re-reads the
switches whenever it (re)connects, and, about once a second, whichever listener of the instance
finds the board's last re-read older than that re-reads it (the safety net for a lost
notification). So every worker of every instance sees a change within a second. The re-read
(``spool_view_v2``) and every notification also carry the other instances' spool holds
(queen_mp/front/spoolhold.py), which the listener writes to the board beside the switches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from queen_mp.db import procs
from queen_mp.db.connect import Conn, Dedicated, connect
from queen_mp.db.errors import DatabaseError
from queen_mp.db.procs import maintenance_flags as fetch_flags
from queen_mp.db.procs import set_maintenance
from queen_mp.ipc.doorbell import Doorbell
from queen_mp.ipc.flags import FlagsBoard, monotonic_ms
from queen_mp.ipc.slots import SlotTable
from queen_mp.ipc.wakeboard import WAKE_BUCKETS, WakeBoard

__all__ = ["CHANNEL", "SETTINGS_CHANNEL", "WakeListener", "Waker", "WorkerBells", "fetch_flags",
           "publish_flags", "publish_holds", "set_maintenance"]

log = logging.getLogger("queen_mp.wakeup")

CHANNEL = "queen_wake"
_NOTIFY_EVERY_S = 0.005
_MAX_PAYLOAD = 7000  # NOTIFY payloads must stay under 8000 bytes
_RECONNECT_S = 1.0
SETTINGS_CHANNEL = "queen_settings"
_TICK_S = 0.2          # how often a listener looks whether the periodic re-read is due
_REFRESH_MS = 900      # re-read age that makes it due: one re-read per ~second per instance
_BEHIND_FORCE = 3      # re-reads in a row below the board's version: the database was replaced
_CONNECT_TIMEOUT_S = 5
_PEERS_EVERY_S = 2.0   # how long "no other instance listens" is believed
LISTENER_NAME = "queen-mp wake listener"


def publish_flags(board: FlagsBoard, doc: dict[str, Any], *, force: bool = False) -> bool:
    """Store a ``maintenance_flags_v1`` answer (or notification payload) on the board."""
    return board.publish(bool(doc.get("maintenance")), bool(doc.get("popMaintenance")),
                         int(doc.get("version") or 0), force=force)


def publish_holds(board: FlagsBoard, doc: dict[str, Any], holder: str,
                  read_ms: int | None = None) -> None:
    """Store what a ``spool_view_v2`` answer or a notification says of the other holders'
    spool holds (nothing if it says nothing of them); ``read_ms``: when that read was sent."""
    holds = doc.get("holds")
    if not isinstance(holds, list):
        return
    others = [int(h.get("oldestUs") or 0) for h in holds
              if isinstance(h, dict) and h.get("instance") != holder]
    present = bool(doc["peers"]) if "peers" in doc else board.peers_present()
    board.publish_peers(bool(others), present, min(others) if others else 0, read_ms)


class WorkerBells:
    """Rings every front worker that has a parked pop, but the caller's own slot: a wake a
    front worker sends (an ack settled in SQL, a transaction, a DLQ requeue, an ephemeral push)
    reaches their parked pops at once, as a shard's commit does (shards/process.py), instead
    of at their next wake-board tick (up to QUEEN_POP_WAKE_TICK_MS later)."""

    def __init__(self, slots: SlotTable, doorbell_name: Callable[[int], str], own: int) -> None:
        self.slots = slots
        self.doorbell_name = doorbell_name
        self.own = own
        self._bells: dict[int, Doorbell] = {}

    def ring(self) -> None:
        slots = self.slots
        for slot in range(slots.nslots):
            if slot == self.own or not slots.parked(slot) or not slots.owner(slot):
                continue
            bell = self._bells.get(slot)
            if bell is None:
                try:
                    bell = self._bells[slot] = Doorbell.attach(self.doorbell_name(slot))
                except FileNotFoundError:
                    continue  # the runtime is going away
            bell.ring()

    def close(self) -> None:
        for bell in self._bells.values():
            bell.close()
        self._bells.clear()


class Waker:
    """Bumps local buckets now; forwards them to other instances at most once per tick.

    ``rung`` (front workers) is called after each bump: the worker's own parked pops look at
    the board and the other workers' are rung, rather than at their next tick."""

    def __init__(self, board: WakeBoard, instance: str, dsn: str, *, notify: bool,
                 rung: Callable[[], None] | None = None) -> None:
        self.board = board
        self.rung = rung
        self.instance = instance
        self.dsn = dsn
        self.notify = notify
        self._pending: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self.db = Dedicated(dsn, application_name="queen-mp waker",
                            connect_timeout=_CONNECT_TIMEOUT_S)
        self._peers = True
        self._peers_at = float("-inf")

    def wake(self, buckets: Iterable[int]) -> None:
        buckets = set(buckets)
        if not buckets:
            return
        self.board.bump(buckets)
        if self.rung is not None:
            self.rung()
        if self.notify:
            if self._task is None or self._task.done():
                loop = asyncio.get_running_loop()
                # PERF(ipc): while "nobody else listens" is still believed, the NOTIFY would
                # be dropped anyway: no task, no 5 ms timer, no connection check per commit
                # (one each for most ack and push commits of a lone instance).
                if not self._peers and loop.time() - self._peers_at < _PEERS_EVERY_S:
                    return
                self._task = loop.create_task(self._send_soon())
            self._pending |= buckets

    async def _send_soon(self) -> None:
        await asyncio.sleep(_NOTIFY_EVERY_S)
        while self._pending:
            batch: list[str] = []
            size = len(self.instance) + 1
            while self._pending and size < _MAX_PAYLOAD:
                text = str(self._pending.pop())
                batch.append(text)
                size += len(text) + 1
            payload = f"{self.instance}:{','.join(batch)}"

            async def send(conn: Conn, payload: str = payload) -> bool:
                if not await self._have_peers(conn):
                    return False
                await procs.notify(conn, CHANNEL, payload)
                return True

            try:
                # NOTE(queen): a connection the server closed while idle (restart, failover)
                # is replaced first: a NOTIFY sent on it would fail and lose this batch.
                if not await self.db.run(send):
                    self._pending.clear()  # nobody else listens: the local board is enough
                    return
            except (DatabaseError, OSError) as ex:
                # NOTE(queen): best effort; another instance's parked pop still wakes at its
                # lease-expiry hint or deadline.
                log.warning("wake notify failed: %s", ex)
                self._pending.clear()
                await self.db.drop()

    async def _have_peers(self, conn: Conn) -> bool:
        loop = asyncio.get_running_loop()
        if loop.time() - self._peers_at >= _PEERS_EVERY_S:
            self._peers = await procs.wake_peers(conn, self.instance)
            self._peers_at = loop.time()
        return self._peers

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.db.drop()


class WakeListener:
    """LISTENs for other instances' wakes and replays them onto the local board; keeps the
    flags board fresh (``queen_settings`` notifications, re-read on connect and ~1 s).

    ``bumped`` is called after each replay: every front worker listens, so each one pokes
    its own parked pops then, not at their next tick."""

    def __init__(self, board: WakeBoard | None, instance: str, dsn: str, *,
                 wake: bool = True, flags: FlagsBoard | None = None, holder: str = "",
                 bumped: Callable[[], None] | None = None) -> None:
        self.board = board
        self.bumped = bumped
        self.instance = instance
        self.holder = holder  # this instance's key in queen.spool_holds
        self.dsn = dsn
        self.wake = wake and board is not None
        self.flags = flags
        #: set once the flags were read from PostgreSQL by this listener
        self.flags_ready = asyncio.Event()
        self._behind = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        connected_before = False
        while True:
            try:
                async with await connect(
                        self.dsn, connect_timeout=_CONNECT_TIMEOUT_S,
                        application_name=f"{LISTENER_NAME} {self.instance}") as conn:
                    if self.wake:
                        await procs.listen(conn, CHANNEL)
                        if connected_before and self.board is not None:
                            # NOTE(queen): wakes sent while we were disconnected (a failover,
                            # a restart of PostgreSQL) are lost: every parked pop of this
                            # instance looks once more.
                            self.board.bump(list(range(WAKE_BUCKETS)))
                            if self.bumped is not None:
                                self.bumped()
                    connected_before = True
                    if self.flags is None:
                        async for note in conn.notifies():
                            self._dispatch(note.channel, note.payload)
                        continue
                    await procs.listen(conn, SETTINGS_CHANNEL)
                    # NOTE(queen): after LISTEN, so a change committed from now on is either in
                    # this read or notified; what happened while disconnected is in the read.
                    await self._reread(conn)
                    while True:
                        async for note in conn.notifies(timeout=_TICK_S):
                            self._dispatch(note.channel, note.payload)
                        if self.flags.claim_refresh(_REFRESH_MS):
                            await self._reread(conn)
            except asyncio.CancelledError:
                raise
            except Exception as ex:
                log.warning("wake listener lost its connection (%s); reconnecting", ex)
            await asyncio.sleep(_RECONNECT_S)

    async def _reread(self, conn: Conn) -> None:
        assert self.flags is not None
        sent = monotonic_ms()
        doc = await procs.spool_view(conn, self.instance)
        if publish_flags(self.flags, doc):
            self._behind = 0
            publish_holds(self.flags, doc, self.holder, sent)
        else:
            self._behind += 1
            if self._behind >= _BEHIND_FORCE:
                log.warning("settings_version went back to %s; taking the database's flags",
                            doc.get("version"))
                publish_flags(self.flags, doc, force=True)
                publish_holds(self.flags, doc, self.holder, sent)
                self._behind = 0
        self.flags_ready.set()

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == SETTINGS_CHANNEL:
            if self.flags is None:
                return
            try:
                doc = orjson.loads(payload)
            except orjson.JSONDecodeError:
                log.warning("unreadable %s payload %r", SETTINGS_CHANNEL, payload[:200])
                return
            if isinstance(doc, dict) and publish_flags(self.flags, doc):
                publish_holds(self.flags, doc, self.holder)
            return
        if channel == CHANNEL and self.wake:
            self._apply(payload)

    def _apply(self, payload: str) -> None:
        origin, _, rest = payload.partition(":")
        if origin == self.instance or not rest or self.board is None:
            return
        buckets = {int(b) for b in rest.split(",") if b.isdigit() and int(b) < WAKE_BUCKETS}
        self.board.bump(buckets)
        if buckets and self.bumped is not None:
            self.bumped()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
