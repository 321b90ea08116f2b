"""Wake-ups of parked pops: who says a queue may have become claimable, and how it travels.

``Waker`` is used by whoever makes a queue claimable (a shard after a push commit, a front
worker after an ack released a lease). It bumps the instance's shared wake board at once and,
when other instances may be listening, sends the buckets in one batched ``NOTIFY`` per tick.
``WakeListener`` runs in each front worker: it ``LISTEN``s and bumps the local board for wakes
of other instances, so parked pops see one source of truth, the board.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import psycopg

from queen_mp.ipc.wakeboard import WAKE_BUCKETS, WakeBoard

__all__ = ["CHANNEL", "WakeListener", "Waker"]

log = logging.getLogger("queen_mp.wakeup")

CHANNEL = "queen_wake"
_NOTIFY_EVERY_S = 0.005
_MAX_PAYLOAD = 7000  # NOTIFY payloads must stay under 8000 bytes
_RECONNECT_S = 1.0


class Waker:
    """Bumps local buckets now; forwards them to other instances at most once per tick."""

    def __init__(self, board: WakeBoard, instance: str, dsn: str, *, notify: bool) -> None:
        self.board = board
        self.instance = instance
        self.dsn = dsn
        self.notify = notify
        self._pending: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection | None = None

    def wake(self, buckets: Iterable[int]) -> None:
        buckets = set(buckets)
        if not buckets:
            return
        self.board.bump(buckets)
        if self.notify:
            self._pending |= buckets
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._send_soon())

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
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self.dsn, autocommit=True, application_name="queen-mp waker")
                await self._conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            except psycopg.Error as ex:
                # NOTE(queen): best effort; another instance's parked pop still wakes at its
                # lease-expiry hint or deadline.
                log.warning("wake notify failed: %s", ex)
                self._pending.clear()
                if self._conn is not None:
                    await self._conn.close()
                    self._conn = None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            await self._conn.close()


class WakeListener:
    """LISTENs for other instances' wakes and replays them onto the local board."""

    def __init__(self, board: WakeBoard, instance: str, dsn: str) -> None:
        self.board = board
        self.instance = instance
        self.dsn = dsn
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self.dsn, autocommit=True,
                        application_name="queen-mp wake listener") as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    async for note in conn.notifies():
                        self._apply(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as ex:
                log.warning("wake listener lost its connection (%s); reconnecting", ex)
            await asyncio.sleep(_RECONNECT_S)

    def _apply(self, payload: str) -> None:
        origin, _, rest = payload.partition(":")
        if origin == self.instance or not rest:
            return
        buckets = {int(b) for b in rest.split(",") if b.isdigit() and int(b) < WAKE_BUCKETS}
        self.board.bump(buckets)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
