"""Waker (queen_mp/ipc/wakeup.py): the local board is bumped at every wake; a NOTIFY goes out
only while another instance may listen, and while "nobody else listens" is believed a wake
schedules no send at all (no task, no timer, no connection check per commit)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from queen_mp.ipc import wakeup
from queen_mp.ipc.wakeup import Waker


class _Board:
    def __init__(self) -> None:
        self.bumps: list[set[int]] = []

    def bump(self, buckets: set[int]) -> None:
        self.bumps.append(set(buckets))


class _Db:
    """Dedicated's run without a server: the work gets a stand-in connection."""

    async def run(self, work: Any, **_: Any) -> Any:
        return await work(object())

    async def drop(self) -> None:
        return None


def _waker(monkeypatch: pytest.MonkeyPatch, peers: list[bool], sent: list[str]
           ) -> tuple[Waker, _Board]:
    async def wake_peers(conn: Any, instance: str) -> bool:
        return peers.pop(0)

    async def notify(conn: Any, channel: str, payload: str) -> None:
        sent.append(payload)

    monkeypatch.setattr(wakeup.procs, "wake_peers", wake_peers)
    monkeypatch.setattr(wakeup.procs, "notify", notify)
    board = _Board()
    waker = Waker(board, "me", "dbname=none", notify=True)  # type: ignore[arg-type]
    waker.db = _Db()  # type: ignore[assignment]
    return waker, board


def test_lone_instance_schedules_no_send_while_it_knows_it_is_alone(monkeypatch):
    sent: list[str] = []
    waker, board = _waker(monkeypatch, [False], sent)

    async def go() -> None:
        waker.wake([1])
        first = waker._task
        assert first is not None
        await first  # asked the database once: nobody else listens
        for bucket in (2, 3, 4):
            waker.wake([bucket])
            assert waker._task is first  # no new send scheduled
        assert not waker._pending

    asyncio.run(go())
    assert board.bumps == [{1}, {2}, {3}, {4}]
    assert sent == []


def test_wakes_are_sent_while_another_instance_listens(monkeypatch):
    sent: list[str] = []
    waker, board = _waker(monkeypatch, [True], sent)

    async def go() -> None:
        waker.wake([1])
        assert waker._task is not None
        await waker._task
        waker.wake([2])
        assert waker._task is not None and not waker._task.done()
        await waker._task

    asyncio.run(go())
    assert board.bumps == [{1}, {2}]
    assert sent == ["me:1", "me:2"]


def test_a_stale_belief_is_asked_again(monkeypatch):
    sent: list[str] = []
    waker, _ = _waker(monkeypatch, [False, True], sent)

    async def go() -> None:
        waker.wake([1])
        assert waker._task is not None
        await waker._task
        waker._peers_at -= wakeup._PEERS_EVERY_S  # the belief has aged out
        waker.wake([5])
        assert waker._task is not None and not waker._task.done()
        await waker._task

    asyncio.run(go())
    assert sent == ["me:5"]
