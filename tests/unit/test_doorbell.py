"""Doorbell tests: cross-process wake-ups and the event-loop watch (fork context)."""

from __future__ import annotations

import asyncio
import multiprocessing
import select
import time
import uuid
from collections.abc import Iterator

import pytest

from queen_mp.ipc import AsyncDoorbellWaiter, Doorbell
from queen_mp.ipc.doorbell import doorbell_path

pytestmark = pytest.mark.timeout(10)

MP = multiprocessing.get_context("fork")


@pytest.fixture
def bell_name() -> Iterator[str]:
    name = f"/qmp-test-bell-{uuid.uuid4().hex[:12]}"
    yield name
    Doorbell.unlink_name(name)


def _child_waits(name: str, conn) -> None:
    with Doorbell.attach(name) as bell:
        conn.send("waiting")
        select.select([bell.fileno()], [], [], 30.0)  # what the consumer's event loop does
        conn.send(bell.clear())


def _child_rings_after(name: str, delay: float) -> None:
    time.sleep(delay)
    with Doorbell.attach(name) as bell:
        bell.ring()


def test_nothing_pending_without_a_ring(bell_name: str) -> None:
    with Doorbell.create(bell_name) as bell:
        assert select.select([bell.fileno()], [], [], 0.05)[0] == []
        assert bell.value == 0
        assert not bell.clear()


def test_rings_coalesce(bell_name: str) -> None:
    with Doorbell.create(bell_name) as bell:
        for _ in range(100):
            bell.ring()
        assert bell.value == 100
        assert bell.clear()  # one clear takes every pending ring
        assert bell.value == 0
        assert not bell.clear()


def test_a_full_pipe_drops_the_ring_and_keeps_the_wake_up(bell_name: str) -> None:
    with Doorbell.create(bell_name) as bell:
        for _ in range(70_000):  # past a pipe's 64 KiB
            bell.ring()
        assert 0 < bell.value <= 1 << 16
        assert bell.clear()
        assert not bell.clear()


def test_rings_wait_for_a_consumer_that_is_not_there_yet(bell_name: str) -> None:
    Doorbell.create(bell_name).close()
    with Doorbell.attach(bell_name) as producer:
        producer.ring()  # nobody holds the FIFO open for reading besides the producer itself
        with Doorbell.attach(bell_name) as consumer:
            assert consumer.clear()


def test_create_attach_unlink_contract(bell_name: str) -> None:
    with pytest.raises(FileNotFoundError):
        Doorbell.attach(bell_name)
    bell = Doorbell.create(bell_name)
    assert doorbell_path(bell_name).exists()
    with pytest.raises(FileExistsError):
        Doorbell.create(bell_name)
    bell.ring()
    bell.close()
    with Doorbell.create(bell_name, replace=True) as fresh:
        assert not fresh.clear()
    assert Doorbell.unlink_name(bell_name)
    assert not Doorbell.unlink_name(bell_name)


def test_ring_wakes_a_waiter_in_another_process(bell_name: str) -> None:
    with Doorbell.create(bell_name) as bell:
        parent_conn, child_conn = MP.Pipe()
        proc = MP.Process(target=_child_waits, args=(bell_name, child_conn))
        proc.start()
        assert parent_conn.recv() == "waiting"
        time.sleep(0.05)
        start = time.monotonic()
        bell.ring()
        assert parent_conn.poll(30)
        assert parent_conn.recv() is True
        # woken by the ring, not at the end of its 30 s select (room for a loaded machine)
        assert time.monotonic() - start < 10
        proc.join(5)
        assert proc.exitcode == 0


def test_async_waiter_calls_back_in_the_loop(bell_name: str) -> None:
    async def scenario(bell: Doorbell) -> None:
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        threads = []

        def on_ring() -> None:
            threads.append(asyncio.get_running_loop() is loop)
            woken.set()

        proc = MP.Process(target=_child_rings_after, args=(bell_name, 0.1))
        proc.start()
        waiter = AsyncDoorbellWaiter(bell, loop, on_ring)
        waiter.start()
        try:
            await asyncio.wait_for(woken.wait(), 5)
        finally:
            waiter.stop()
            proc.join(5)
        assert threads == [True]
        assert proc.exitcode == 0

    with Doorbell.create(bell_name) as bell:
        asyncio.run(scenario(bell))


def test_async_waiter_coalesces_rings_while_loop_is_busy(bell_name: str) -> None:
    async def scenario(bell: Doorbell) -> int:
        calls = 0

        def on_ring() -> None:
            nonlocal calls
            calls += 1

        waiter = AsyncDoorbellWaiter(bell, asyncio.get_running_loop(), on_ring)
        waiter.start()
        try:
            for _ in range(20):  # the loop is blocked: nothing can run the callback yet
                bell.ring()
                time.sleep(0.005)
            await asyncio.sleep(0.2)
            first = calls
            bell.ring()
            await asyncio.sleep(0.2)
        finally:
            waiter.stop()
        return first * 100 + calls

    with Doorbell.create(bell_name) as bell:
        assert asyncio.run(scenario(bell)) == 1 * 100 + 2


def test_async_waiter_stops(bell_name: str) -> None:
    async def scenario(bell: Doorbell) -> None:
        calls: list[int] = []
        waiter = AsyncDoorbellWaiter(bell, asyncio.get_running_loop(), lambda: calls.append(1))
        waiter.start()
        waiter.stop()
        bell.ring()
        await asyncio.sleep(0.1)
        assert calls == []  # no longer watched
        assert bell.value == 1  # and the ring is left for whoever watches next
        waiter.stop()  # idempotent

    with Doorbell.create(bell_name) as bell:
        asyncio.run(scenario(bell))
