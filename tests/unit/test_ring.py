"""Ring tests, crash tests with real processes included (fork context)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator

import posix_ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queen_mp.ipc import Ring, RingCorrupt, RingFull

pytestmark = pytest.mark.timeout(20)

MP = multiprocessing.get_context("fork")


def _unique_name() -> str:
    return f"/qmp-test-ring-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ring_name() -> Iterator[str]:
    name = _unique_name()
    yield name
    Ring.unlink_name(name)


def _wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


def _read_n(ring: Ring, n: int, timeout: float = 10.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        batch = ring.read_many(n - len(got))
        if batch:
            got.extend(batch)
        elif time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)} of {n} records arrived")
        else:
            time.sleep(0.0002)
    return got


# -- child process bodies (fork: they inherit their arguments, nothing is pickled) ---------


def _child_reader(name: str, expected: list[bytes], conn) -> None:
    ring = Ring.attach(name)
    try:
        got = _read_n(ring, len(expected), timeout=10.0)
    except Exception as ex:
        conn.send(repr(ex))
        return
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            conn.send(f"record {i}: got {len(g)} bytes, expected {len(e)}")
            return
    conn.send("ok")


def _child_writer(name: str, epoch: int, records: list[bytes]) -> None:
    ring = Ring.attach(name, epoch=epoch)
    for record in records:
        ring.write(record, timeout=15.0)


def _child_reader_dies_before_commit(name: str, conn) -> None:
    ring = Ring.attach(name)

    def die(_new_read: int) -> None:
        conn.send("copied, about to commit")
        os.kill(os.getpid(), signal.SIGKILL)

    ring._commit_read = die  # the record is copied out; the read index is not yet advanced
    ring.read()


def _child_dies_using_a_wrapped_record(name: str, conn) -> None:
    ring = Ring.attach(name)

    def die(record: bytes | memoryview) -> None:
        conn.send(bytes(record))
        os.kill(os.getpid(), signal.SIGKILL)

    ring.read_each(1, die)


def _sleep_while_alive(proc: multiprocessing.process.BaseProcess) -> Callable[[float], None]:
    """A write() wait that fails fast when the reader process is gone."""

    def wait(seconds: float) -> None:
        if not proc.is_alive():
            raise AssertionError(f"reader exited with {proc.exitcode}")
        time.sleep(seconds)

    return wait


def _check_child(proc: multiprocessing.process.BaseProcess, conn, timeout: float = 15.0) -> None:
    assert conn.poll(timeout), "child sent nothing"
    assert conn.recv() == "ok"
    proc.join(5)
    assert proc.exitcode == 0


# -- one process ---------------------------------------------------------------------------


def test_round_trip_one_process(ring_name: str) -> None:
    with Ring.create(ring_name, 1024, epoch=7) as ring:
        assert ring.read() is None
        records = [b"", b"x", os.urandom(200), os.urandom(ring.max_record)]
        for record in records[:3]:
            assert ring.try_write(record)
        assert ring.read_with_epoch() == (records[0], 7)
        assert ring.read_many(10) == records[1:3]
        assert ring.try_write(memoryview(records[3]))
        assert ring.read() == records[3]
        assert ring.read() is None
        assert ring.used == 0


def test_read_each_hands_whole_records_over_in_place_and_the_rest_copied(
        ring_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Ring.create(ring_name, 256, epoch=5) as ring:
        seen: list[tuple[type, bytes, bool]] = []
        kept: list[memoryview] = []

        def use(record: bytes | memoryview) -> None:
            seen.append((type(record), bytes(record),
                         isinstance(record, memoryview) and record.readonly))
            if isinstance(record, memoryview):
                kept.append(record)

        ring.try_write(b"a" * 100)  # offsets 0-127 of 256
        ring.try_write(b"b" * 50)  # 128-207
        assert ring.read_each(1, use) == 1
        assert ring.try_write(b"c" * 60)  # 208-287: wraps, put together in the scratch
        assert ring.read_each(10, use) == 2
        pending = ring.begin_write(b"d" * 600)  # chunked: reassembled, copied
        records = []
        while not pending.pump():
            ring.read_each(10, records.append)
        ring.read_each(10, records.append)
        assert records == [b"d" * 600]
        assert seen == [(memoryview, b"a" * 100, True), (memoryview, b"b" * 50, True),
                        (memoryview, b"c" * 60, True)]
        for view in kept:  # released once used: the writer (or the next wrap) reuses it
            with pytest.raises(ValueError):
                bytes(view)
        assert ring.read_each(10, use) == 0 and ring.used == 0
        # a wrapped record larger than the scratch may grow is copied out
        monkeypatch.setattr("queen_mp.ipc.ring.SCRATCH_MAX", 32)
        while int.from_bytes(ring._mm[64:72], "little") % 256 != 160:
            assert ring.try_write(b"")  # 16 bytes a record
            assert ring.read_each(1, records.append) == 1
        assert ring.try_write(b"f" * 100)  # 160-287: wraps
        assert ring.read_each(10, use) == 1
        assert seen[-1] == (bytes, b"f" * 100, False)


def test_read_each_gives_a_record_back_and_releases_it_whatever_use_does(
        ring_name: str) -> None:
    with Ring.create(ring_name, 256) as ring:
        kept: list[memoryview] = []

        def fail(record: bytes | memoryview) -> None:
            kept.append(record)  # type: ignore[arg-type]
            raise ValueError("bad record")

        ring.try_write(b"xyz")
        ring.try_write(b"next")
        with pytest.raises(ValueError, match="bad record"):
            ring.read_each(10, fail)
        assert ring.read_many(10) == [b"next"]  # the first one was given back, not re-read
        with pytest.raises(ValueError):
            bytes(kept[0])  # released: the writer may overwrite it
        ring.try_write(b"abc")  # at offset 64, after two records of 32
        ring._mm[192 + 64:196 + 64] = (10_000).to_bytes(4, "little")  # a length past the ring
        with pytest.raises(RingCorrupt):
            ring.read_each(1, kept.append)


def test_writer_and_reader_in_separate_attachments(ring_name: str) -> None:
    with Ring.create(ring_name, 256) as owner, Ring.attach(ring_name, epoch=3) as writer:
        writer.write(b"hello", timeout=1)
        assert owner.read_with_epoch() == (b"hello", 3)


def test_wrap_around_many_times(ring_name: str) -> None:
    with Ring.create(ring_name, 256) as ring:
        for i in range(5000):
            record = bytes([i % 251]) * (i % 97)
            assert ring.try_write(record)
            if i % 3 == 0:
                assert ring.try_write(record[:5])
                assert ring.read() == record
                assert ring.read() == record[:5]
            else:
                assert ring.read() == record
        assert ring.used == 0
        write_index = int.from_bytes(ring._mm[64:72], "little")
        assert write_index > 500 * ring.capacity  # went around the data area many times


def test_full_ring_rejects_and_overwrites_nothing(ring_name: str) -> None:
    with Ring.create(ring_name, 512) as ring:
        written = []
        i = 0
        while True:
            record = bytes([i]) * 40
            if not ring.try_write(record):
                break
            written.append(record)
            i += 1
        assert ring.used <= ring.capacity
        with pytest.raises(RingFull):
            ring.write(b"y" * 40, timeout=0.05)
        with pytest.raises(RingFull):
            ring.write(b"z" * (ring.capacity * 3), timeout=0.05)
        assert not ring.try_write(b"y" * 40)
        if ring.capacity - ring.used < 16:
            assert not ring.try_write(b"")
        with pytest.raises(RingFull):
            ring.write(b"", timeout=0.05)
        # the abandoned chunked write never reached the ring, so nothing is lost or glued
        assert ring.read_many(100) == written
        assert ring.read() is None


def test_oversized_record_needs_write(ring_name: str) -> None:
    with Ring.create(ring_name, 256) as ring:
        with pytest.raises(ValueError):
            ring.try_write(b"x" * (ring.max_record + 1))
        pending = ring.begin_write(b"x" * 1000)
        with pytest.raises(RuntimeError):
            ring.try_write(b"y")
        pending.abandon()
        assert ring.try_write(b"y")


def test_parts_are_one_record_wherever_the_data_area_ends(ring_name: str) -> None:
    """try_write_parts publishes the parts joined, as try_write would: a part may straddle
    the data area's end, end exactly on it, or be empty."""
    rng = random.Random(7)
    with Ring.create(ring_name, 256) as ring:
        for i in range(3000):
            parts = [bytes([rng.randrange(256)]) * rng.randrange(0, 31)
                     for _ in range(rng.randrange(1, 6))]
            if i % 5 == 0:
                parts.append(memoryview(bytes(range(i % 40))))
            assert ring.try_write_parts(parts)
            if i % 4 == 0:
                assert ring.try_write(b"between")
                assert ring.read() == b"".join(parts)
                assert ring.read() == b"between"
            else:
                assert ring.read() == b"".join(parts)
        assert ring.used == 0


def test_parts_on_a_full_ring_publish_nothing(ring_name: str) -> None:
    with Ring.create(ring_name, 256) as ring:
        assert ring.try_write(b"a" * 200)
        assert not ring.try_write_parts([b"b" * 20, b"c" * 20])
        with pytest.raises(ValueError):
            ring.try_write_parts([b"x" * ring.max_record, b"y"])
        assert ring.read() == b"a" * 200
        assert ring.read() is None
        assert ring.try_write_parts([b"b" * 20, b"c" * 20])
        assert ring.read() == b"b" * 20 + b"c" * 20


@pytest.mark.parametrize("capacity", [64, 256, 1024])
def test_boundary_sizes_with_pumped_chunks(ring_name: str, capacity: int) -> None:
    sizes = [0, 1, 15, 16, 17, capacity - 33, capacity - 32, capacity - 17, capacity - 16]
    sizes += [capacity - 15, capacity, capacity + 1, 2 * capacity, 3 * capacity + 7]
    with Ring.create(ring_name, capacity) as ring:
        for size in sizes:
            record = os.urandom(size)
            pending = ring.begin_write(record)
            got = None
            for _ in range(10 * (size // 16 + 2)):
                pending.pump()
                got = ring.read()
                if got is not None:
                    break
            assert pending.done
            assert got == record, size
        assert ring.used == 0
        assert ring.discarded == 0


def test_create_attach_unlink_contract(ring_name: str) -> None:
    with pytest.raises(posix_ipc.ExistentialError):
        Ring.attach(ring_name)
    ring = Ring.create(ring_name, 256)
    with pytest.raises(posix_ipc.ExistentialError):
        Ring.create(ring_name, 256)
    ring.try_write(b"old")
    ring.close()
    with Ring.create(ring_name, 512, replace=True) as fresh:
        assert fresh.capacity == 512
        assert fresh.read() is None
    with pytest.raises(ValueError):
        Ring.create(_unique_name(), 100)
    assert Ring.unlink_name(ring_name)
    assert not Ring.unlink_name(ring_name)


def test_reset_drops_unread_bytes(ring_name: str) -> None:
    with Ring.create(ring_name, 256) as ring:
        ring.try_write(b"stale")
        ring.reset()
        assert ring.read() is None
        ring.try_write(b"fresh")
        assert ring.read() == b"fresh"


def test_corrupt_header_is_reported_not_read(ring_name: str) -> None:
    with Ring.create(ring_name, 256) as ring:
        ring.try_write(b"abc")
        ring._mm[192:196] = (10_000).to_bytes(4, "little")  # fragment length beyond the ring
        with pytest.raises(RingCorrupt):
            ring.read()


def test_abandoned_chunked_record_is_not_glued(ring_name: str) -> None:
    with Ring.create(ring_name, 256, epoch=1) as ring:
        pending = ring.begin_write(b"A" * 2000)
        assert not pending.pump()
        assert ring.read() is None  # a prefix is reassembled, not returned
        pending.abandon()
        ring.epoch = 2
        ring.write(b"B" * 10, timeout=1)
        assert ring.read_with_epoch() == (b"B" * 10, 2)
        pending = ring.begin_write(b"C" * 700)
        assert not pending.pump()
        assert ring.read() is None
        pending.abandon()
        ring.write(b"D" * 10, timeout=1)  # same epoch: its FIRST fragment still drops C
        assert ring.read_many(5) == [b"D" * 10]
        assert ring.discarded == 2


def test_new_reader_drops_orphan_tail_of_chunked_record(ring_name: str) -> None:
    with Ring.create(ring_name, 256) as first_reader:
        writer = Ring.attach(ring_name)
        pending = writer.begin_write(b"Q" * 1000)
        pending.pump()
        assert first_reader.read() is None  # took the FIRST fragment, then "died"
        second_reader = Ring.attach(ring_name)
        while not pending.pump():
            assert second_reader.read() is None
        writer.write(b"next", timeout=1)
        assert _read_n(second_reader, 1) == [b"next"]
        assert second_reader.discarded >= 1
        writer.close()
        second_reader.close()


# -- several processes ---------------------------------------------------------------------


def test_64mib_record_through_1mib_ring_with_concurrent_reader(ring_name: str) -> None:
    big = os.urandom(64 << 20)
    records = [b"before", big, b"", b"after"]
    with Ring.create(ring_name, 1 << 20) as ring:
        parent_conn, child_conn = MP.Pipe()
        proc = MP.Process(target=_child_reader, args=(ring_name, records, child_conn))
        proc.start()
        for record in records:
            ring.write(record, timeout=10, wait=_sleep_while_alive(proc))
        _check_child(proc, parent_conn)
        assert ring.used == 0


@st.composite
def ring_workloads(draw: st.DrawFn) -> tuple[int, list[int], int]:
    capacity = draw(st.sampled_from([256, 512, 1024, 4096]))
    edges = [0, 1, capacity - 17, capacity - 16, capacity - 15, capacity, capacity + 1]
    size = st.one_of(st.integers(0, 3 * capacity), st.sampled_from(edges))
    return capacity, draw(st.lists(size, min_size=1, max_size=30)), draw(st.integers(0, 2**32))


# NOTE(queen): 60 forked readers: 2 s alone, 19 s inside a loaded suite's 1 GB pytest process,
# too near the module's 20 s hang guard
@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=ring_workloads())
def test_random_sizes_through_small_ring_with_reader_process(
    workload: tuple[int, list[int], int],
) -> None:
    capacity, sizes, seed = workload
    rnd = random.Random(seed)
    records = [rnd.randbytes(size) for size in sizes]
    name = _unique_name()
    try:
        with Ring.create(name, capacity) as ring:
            parent_conn, child_conn = MP.Pipe()
            proc = MP.Process(target=_child_reader, args=(name, records, child_conn))
            proc.start()
            try:
                for record in records:
                    ring.write(record, timeout=10, wait=_sleep_while_alive(proc))
                _check_child(proc, parent_conn)
            finally:
                if proc.is_alive():
                    proc.kill()
                proc.join()
    finally:
        Ring.unlink_name(name)


def test_writer_killed_mid_chunked_record(ring_name: str) -> None:
    capacity = 4096
    with Ring.create(ring_name, capacity) as reader:
        dead = MP.Process(target=_child_writer, args=(ring_name, 1, [b"\x01" * (10 * capacity)]))
        dead.start()
        _wait_until(lambda: reader.used >= capacity // 2)
        assert reader.read() is None  # consumed the published prefix, record incomplete
        _wait_until(lambda: reader.used > 0)  # the writer published more fragments
        os.kill(dead.pid, signal.SIGKILL)
        dead.join(5)
        assert dead.exitcode == -signal.SIGKILL

        fresh = [b"new-1", os.urandom(3 * capacity + 5), b"", b"new-3"]
        writer = MP.Process(target=_child_writer, args=(ring_name, 2, fresh))
        writer.start()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < len(fresh):
            item = reader.read_with_epoch()
            if item is not None:
                got.append(item)
            assert time.monotonic() < deadline, got
        writer.join(5)
        assert writer.exitcode == 0
        assert got == [(record, 2) for record in fresh]
        assert reader.read() is None
        assert reader.discarded >= 1


def _workload(seed: int, n: int, capacity: int) -> list[bytes]:
    rnd = random.Random(seed)
    sizes = [0, 5, 100, capacity - 16, capacity - 15, 3 * capacity, 7 * capacity + 3]
    return [rnd.randbytes(rnd.choice(sizes)) for _ in range(n)]


def _child_workload_writer(name: str, epoch: int, seed: int, n: int, capacity: int) -> None:
    _child_writer(name, epoch, _workload(seed, n, capacity))


@pytest.mark.parametrize("seed", range(12))
def test_writer_killed_at_random_points(seed: int) -> None:
    """Stress: whatever the kill point, the reader sees a prefix of the dead writer's records,
    then exactly the new writer's records."""
    capacity = 1024
    name = _unique_name()
    dead_records = _workload(seed, 400, capacity)
    new_records = _workload(seed + 1000, 30, capacity)
    try:
        with Ring.create(name, capacity) as reader:
            dead = MP.Process(target=_child_workload_writer, args=(name, 1, seed, 400, capacity))
            dead.start()
            got = []
            kill_at = time.monotonic() + random.Random(seed).uniform(0.0, 0.01)
            while time.monotonic() < kill_at:
                item = reader.read_with_epoch()
                if item is not None:
                    got.append(item)
            os.kill(dead.pid, signal.SIGKILL)
            dead.join(5)
            writer = MP.Process(
                target=_child_workload_writer, args=(name, 2, seed + 1000, 30, capacity)
            )
            writer.start()
            deadline = time.monotonic() + 10
            while sum(epoch == 2 for _, epoch in got) < len(new_records):
                item = reader.read_with_epoch()
                if item is not None:
                    got.append(item)
                assert time.monotonic() < deadline
            writer.join(5)
        from_dead = [record for record, epoch in got if epoch == 1]
        assert from_dead == dead_records[: len(from_dead)]
        assert [record for record, epoch in got if epoch == 2] == new_records
        assert [epoch for _, epoch in got] == sorted(epoch for _, epoch in got)
    finally:
        Ring.unlink_name(name)


def test_reader_killed_mid_read_leaves_record_for_next_reader(ring_name: str) -> None:
    with Ring.create(ring_name, 1024) as ring:
        ring.try_write(b"alpha")
        ring.try_write(b"beta")
        used = ring.used
        parent_conn, child_conn = MP.Pipe()
        proc = MP.Process(target=_child_reader_dies_before_commit, args=(ring_name, child_conn))
        proc.start()
        assert parent_conn.poll(5)
        assert parent_conn.recv() == "copied, about to commit"
        proc.join(5)
        assert proc.exitcode == -signal.SIGKILL
        assert ring.used == used
        assert ring.read_many(5) == [b"alpha", b"beta"]


def test_reader_killed_using_a_wrapped_record_leaves_it_for_next_reader(
        ring_name: str) -> None:
    """A record put together in the reader's scratch is given back to the writer only once
    used, as one read in place: a reader killed while it uses it leaves it to the next."""
    with Ring.create(ring_name, 1024) as ring:
        while int.from_bytes(ring._mm[64:72], "little") % 1024 != 1024 - 64:
            assert ring.try_write(b"")
            assert ring.read() == b""
        record = bytes(range(200))  # its header ends 48 bytes before the end: it wraps
        assert ring.try_write(record)
        used = ring.used
        parent_conn, child_conn = MP.Pipe()
        proc = MP.Process(target=_child_dies_using_a_wrapped_record,
                          args=(ring_name, child_conn))
        proc.start()
        assert parent_conn.poll(5)
        assert parent_conn.recv() == record
        proc.join(5)
        assert proc.exitcode == -signal.SIGKILL
        assert ring.used == used
        assert ring.read_many(5) == [record]


def test_round_trips_wrap_the_ring_many_times(ring_name: str) -> None:
    """20,000 write-read round trips of 200 bytes wrap a 64 KiB ring about 60 times, each
    record back whole. (Its speed is the benchmark's: bench/hotpath.py; a timed assertion
    here failed on loaded machines.)"""
    records = [os.urandom(200) for _ in range(16)]
    with Ring.create(ring_name, 1 << 16) as ring:
        for i in range(20_000):
            assert ring.try_write(records[i % 16]) is True
            assert ring.read() == records[i % 16], i
        assert ring.read() is None
