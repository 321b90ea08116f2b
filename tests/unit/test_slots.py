"""Slot table tests with real processes: live owners, killed owners, zombies."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Iterator

import posix_ipc
import pytest

from queen_mp.ipc import NoFreeSlot, SlotTable

pytestmark = pytest.mark.timeout(10)

MP = multiprocessing.get_context("fork")


@pytest.fixture
def table_name() -> Iterator[str]:
    name = f"/qmp-test-slots-{uuid.uuid4().hex[:12]}"
    yield name
    SlotTable.unlink_name(name)


def _child_claims_and_holds(name: str, conn) -> None:
    with SlotTable.attach(name) as table:
        conn.send(table.claim())
        conn.recv()  # hold the slot until told to go


def _start_claimer(name: str) -> tuple[multiprocessing.process.BaseProcess, object, tuple]:
    parent_conn, child_conn = MP.Pipe()
    proc = MP.Process(target=_child_claims_and_holds, args=(name, child_conn))
    proc.start()
    assert parent_conn.poll(5)
    return proc, parent_conn, parent_conn.recv()


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    return raw[raw.rfind(b")") + 2 :].split()[0].decode()


def test_claims_from_live_processes_get_distinct_slots(table_name: str) -> None:
    with SlotTable.create(table_name, 2) as table:
        first, conn1, claim1 = _start_claimer(table_name)
        second, conn2, claim2 = _start_claimer(table_name)
        try:
            assert {claim1[0], claim2[0]} == {0, 1}
            assert claim1[1] == claim2[1] == 1
            assert table.owner(claim1[0]) == first.pid
            with pytest.raises(NoFreeSlot):
                table.claim()
        finally:
            for proc, conn in ((first, conn1), (second, conn2)):
                conn.send("go")
                proc.join(5)


def test_slot_of_killed_owner_is_reused_with_next_generation(table_name: str) -> None:
    with SlotTable.create(table_name, 2) as table:
        victim, _conn, (victim_slot, victim_gen) = _start_claimer(table_name)
        survivor, conn, (survivor_slot, _) = _start_claimer(table_name)
        try:
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(5)  # reaped
            assert table.claim() == (victim_slot, victim_gen + 1)
            assert table.generation(victim_slot) == victim_gen + 1
            assert table.owner(survivor_slot) == survivor.pid
        finally:
            conn.send("go")
            survivor.join(5)


def test_zombie_owner_counts_as_dead(table_name: str) -> None:
    with SlotTable.create(table_name, 1) as table:
        pid = os.fork()
        if pid == 0:  # child: just exist until killed
            time.sleep(30)
            os._exit(0)
        try:
            assert table.claim(pid) == (0, 1)
            with pytest.raises(NoFreeSlot):
                table.claim()
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while _proc_state(pid) != "Z":
                assert time.monotonic() < deadline
                time.sleep(0.001)
            assert table.claim() == (0, 2)  # not reaped yet, still reusable
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_recycled_pid_counts_as_dead(table_name: str) -> None:
    with SlotTable.create(table_name, 1) as table:
        assert table.claim() == (0, 1)
        # Pretend the process that claimed started at another time: its pid was recycled.
        _pid, generation, started = table._entry(0)
        table._set_entry(0, os.getpid(), generation, started + 1)
        assert table.claim() == (0, 2)


def test_release_only_by_owner(table_name: str) -> None:
    with SlotTable.create(table_name, 1) as table:
        slot, generation = table.claim()
        assert not table.release(slot, os.getpid() + 1)
        assert table.owner(slot) == os.getpid()
        assert table.release(slot)
        assert table.owner(slot) == 0
        assert table.generation(slot) == generation
        assert table.claim() == (slot, generation + 1)
        with pytest.raises(IndexError):
            table.generation(1)


def test_create_attach_unlink_contract(table_name: str) -> None:
    with pytest.raises(posix_ipc.ExistentialError):
        SlotTable.attach(table_name)
    table = SlotTable.create(table_name, 4)
    with pytest.raises(posix_ipc.ExistentialError):
        SlotTable.create(table_name, 4)
    table.claim()
    table.close()
    with SlotTable.attach(table_name) as attached:
        assert attached.nslots == 4
        assert attached.generation(0) == 1
    with SlotTable.create(table_name, 2, replace=True) as fresh:
        assert fresh.nslots == 2
        assert fresh.generation(0) == 0
    assert SlotTable.unlink_name(table_name)
    assert not SlotTable.unlink_name(table_name)


def test_parked_words_are_per_slot_and_cleared_by_a_new_owner(table_name: str) -> None:
    with SlotTable.create(table_name, 2) as table, SlotTable.attach(table_name) as shard:
        slot, _ = table.claim()
        assert not shard.parked(slot)
        table.set_parked(slot, True)
        assert shard.parked(slot) and not shard.parked(1 - slot)
        table.set_parked(slot, False)
        assert not shard.parked(slot)
        table.set_parked(slot, True)
        table.release(slot)
        assert table.claim() == (slot, 2)
        assert not shard.parked(slot)  # the predecessor's parked pops died with it
    table.set_parked(slot, False)  # closed: a late pop's call is a no-op
