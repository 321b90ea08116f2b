"""Disk spool tests: durability contract, torn and corrupt files, drain progress, processes."""

from __future__ import annotations

import errno
import itertools
import logging
import multiprocessing
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import queen_mp.spool as spool_pkg
from queen_mp.spool import (
    SpoolBusyError,
    SpoolDecodeError,
    SpoolItem,
    SpoolPosition,
    SpoolReader,
    SpoolStats,
    SpoolWriteError,
    SpoolWriter,
    spool_stats,
)

pytestmark = pytest.mark.timeout(30)

MP = multiprocessing.get_context("fork")
FILE_HEADER = 48
RECORD_HEADER = 25


def _read(directory: Path) -> list[tuple[SpoolPosition, bytes]]:
    """One drain pass without marking anything."""
    with SpoolReader(directory, fsync=False) as reader:
        return list(reader.iter_pending())


def _payloads(directory: Path) -> list[bytes]:
    return [payload for _, payload in _read(directory)]


def _logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("spool-*.log"))


def _write(directory: Path, batches: Sequence[Sequence[bytes]], **kwargs: object) -> None:
    with SpoolWriter(directory, "w0-1", fsync=False, **kwargs) as writer:  # type: ignore[arg-type]
        for batch in batches:
            writer.append(batch)


def _copy_with(src: Path, dst: Path, change: Callable[[bytearray], bytearray]) -> Path:
    dst.mkdir()
    target = dst / src.name
    target.write_bytes(bytes(change(bytearray(src.read_bytes()))))
    return dst


# --- round trip, group commit, rotation -------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    batches = [[b"a", b"", b"ccc"], [b"x" * 1000], [bytes(range(256))] * 3]
    with SpoolWriter(tmp_path, "w0-1") as writer:
        for batch in batches:
            writer.append(batch)
        writer.append([])  # nothing to write, nothing created
    got = _read(tmp_path)
    assert [p for _, p in got] == [r for batch in batches for r in batch]
    positions = [pos for pos, _ in got]
    assert [pos.sequence for pos in positions] == list(range(7))
    assert positions[0].offset == FILE_HEADER
    assert all(a.end == b.offset for a, b in itertools.pairwise(positions))
    # sealed file: only the last record is final
    assert [pos.final for pos in positions] == [False] * 6 + [True]


def test_append_fsyncs_once_per_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    with SpoolWriter(tmp_path, "w0-1") as writer:
        writer.append([b"first"])
        assert len(calls) == 3  # new file: its header, its directory entry, then the data
        calls.clear()
        writer.append([b"item %d" % i for i in range(500)])
        assert len(calls) == 1
    calls.clear()
    with SpoolWriter(tmp_path, "w1-1", fsync=False) as writer:
        writer.append([b"a", b"b"])
    assert calls == []
    assert len(_payloads(tmp_path)) == 503


def test_rotation(tmp_path: Path) -> None:
    records = [b"%03d" % i + b"r" * 97 for i in range(40)]
    with SpoolWriter(tmp_path, "w0-1", fsync=False, max_file_bytes=1000) as writer:
        first = None
        for record in records:
            writer.append([record])
            first = first or writer.path
        assert writer.path != first
        writer.append([b"big" * 1000])  # larger than a file: lands whole in one file
    files = _logs(tmp_path)
    # 48-byte file header + 7 records of 125 bytes fit in 1000: 6 files, then the big one
    assert [f.stat().st_size for f in files[:-1]] == [48 + 7 * 125] * 5 + [48 + 5 * 125]
    assert _payloads(tmp_path) == [*records, b"big" * 1000]
    assert spool_stats(tmp_path) == SpoolStats(
        pending=41, files=7, bytes=sum(f.stat().st_size for f in files)
    )


def test_restarted_writer_starts_a_new_file(tmp_path: Path) -> None:
    _write(tmp_path, [[b"one"]])
    _write(tmp_path, [[b"two"]])
    names = [f.name for f in _logs(tmp_path)]
    assert names == ["spool-w0-1-0000000001.log", "spool-w0-1-0000000002.log"]
    assert _payloads(tmp_path) == [b"one", b"two"]


# --- torn and corrupt files -------------------------------------------------------------------


def test_torn_tail_at_every_cut_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "src"
    records = [b"rec-%d-" % i + b"p" * (10 + i) for i in range(5)]
    _write(src, [records[:2], records[2:]])
    [log_file] = _logs(src)
    last = _read(src)[-1][0]
    assert last.end == log_file.stat().st_size
    for cut in range(last.offset, last.end):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="queen_mp.spool"):
            copy = _copy_with(log_file, tmp_path / f"cut{cut}", lambda b, c=cut: b[:c])
            got = _read(copy)
        assert [p for _, p in got] == records[:4], cut
        assert got[-1][0].final
        assert ("torn" in caplog.text) == (cut > last.offset), cut


def test_cut_inside_file_header_sets_file_aside(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write(src, [[b"only"]])
    [log_file] = _logs(src)
    for cut in (0, 4, FILE_HEADER - 1):
        copy = _copy_with(log_file, tmp_path / f"cut{cut}", lambda b, c=cut: b[:c])
        assert _read(copy) == []
        assert [f.name for f in copy.iterdir() if f.name != "drain.lock"] == [
            log_file.name + ".corrupt"
        ]
        assert spool_stats(copy) == SpoolStats(0, 0, 0)


def test_flipped_byte_is_detected_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "src"
    records = [b"QSPR" + b"%d" % i * 20 for i in range(5)]  # payloads even hold the magic
    _write(src, [records])
    [log_file] = _logs(src)
    middle = _read(src)[2][0]
    for at in range(middle.offset, middle.end):
        caplog.clear()

        def flip(b: bytearray, at: int = at) -> bytearray:
            b[at] ^= 0x01
            return b

        with caplog.at_level(logging.WARNING, logger="queen_mp.spool"):
            got = _payloads(_copy_with(log_file, tmp_path / f"flip{at}", flip))
        assert got == records[:2] + records[3:], at
        assert "corrupt bytes" in caplog.text
    # a flipped salt makes every record of the file fail: nothing false is yielded
    salted = _copy_with(log_file, tmp_path / "salt", lambda b: b[:8] + bytes([b[8] ^ 1]) + b[9:])
    assert _payloads(salted) == []


# --- drain progress ---------------------------------------------------------------------------


def test_mark_done_survives_restart_and_deletes_drained_file(tmp_path: Path) -> None:
    records = [b"r%d" % i for i in range(10)]
    _write(tmp_path, [records[:5], records[5:]])
    with SpoolReader(tmp_path) as reader:
        it = reader.iter_pending()
        seen = [next(it) for _ in range(4)]
        it.close()
        reader.mark_done(seen[-1][0])
    assert spool_stats(tmp_path).pending == 6
    with SpoolReader(tmp_path) as reader:
        rest = list(reader.iter_pending())
        assert [p for _, p in rest] == records[4:]
        for pos, _ in rest[:-1]:
            reader.mark_done(pos)
        assert spool_stats(tmp_path).pending == 1
        assert rest[-1][0].final
        reader.mark_done(rest[-1][0])
    assert sorted(f.name for f in tmp_path.iterdir()) == ["drain.lock"]
    assert spool_stats(tmp_path) == SpoolStats(0, 0, 0)
    assert _read(tmp_path) == []


def test_live_file_is_drained_but_kept_until_sealed(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path, "w0-1", fsync=False)
    writer.append([b"a", b"b"])
    with SpoolReader(tmp_path, fsync=False) as reader:
        got = list(reader.iter_pending())
        assert [p for _, p in got] == [b"a", b"b"]
        assert not got[-1][0].final  # the writer may still append
        reader.mark_done(got[-1][0])
        assert list(reader.iter_pending()) == []
        writer.append([b"c"])
        [(pos, payload)] = list(reader.iter_pending())
        assert payload == b"c" and not pos.final
        reader.mark_done(pos)
        assert len(_logs(tmp_path)) == 1
        writer.close()
        assert list(reader.iter_pending()) == []  # sealed and fully drained: deleted
    assert _logs(tmp_path) == []
    assert not list(tmp_path.glob("*.done"))


def test_a_writer_releases_its_file_once_drained_to_its_end(tmp_path: Path) -> None:
    """release_if_drained: a live file gives its space back as soon as the drain has replayed
    all of it (issue 29, fault 6), never before; the next append opens a new file."""
    writer = SpoolWriter(tmp_path, "w0-1", fsync=False)
    assert not writer.release_if_drained()  # no file yet
    writer.append([b"a", b"b"])
    with SpoolReader(tmp_path, fsync=False) as reader:
        got = list(reader.iter_pending())
        reader.mark_done(got[0][0])
        assert not writer.release_if_drained()  # b is not replayed yet
        reader.mark_done(got[1][0])
        writer.append([b"c"])
        assert not writer.release_if_drained()  # c came after the drain
        [(pos, _)] = list(reader.iter_pending())
        reader.mark_done(pos)
        assert writer.release_if_drained()
        assert writer.path is None
        assert list(reader.iter_pending()) == []  # sealed and fully drained: deleted
        assert _logs(tmp_path) == []
        writer.append([b"d"])
        assert [p for _, p in reader.iter_pending()] == [b"d"]
    writer.close()


def test_uncommitted_append_is_invisible_to_the_drain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen_during_fsync: list[list[bytes]] = []
    real_fsync = os.fsync

    def fsync_and_peek(fd: int) -> None:
        seen_during_fsync.append(_payloads(tmp_path))
        real_fsync(fd)

    with SpoolWriter(tmp_path, "w0-1", fsync=True) as writer:
        writer.append([b"committed"])
        monkeypatch.setattr(os, "fsync", fsync_and_peek)
        writer.append([b"in flight", b"also"])
        monkeypatch.undo()
        assert seen_during_fsync == [[b"committed"]]  # complete on disk, not yet promised
        assert _payloads(tmp_path) == [b"committed", b"in flight", b"also"]


def test_second_drain_is_refused(tmp_path: Path) -> None:
    with SpoolReader(tmp_path), pytest.raises(SpoolBusyError):
        SpoolReader(tmp_path)
    SpoolReader(tmp_path).close()


def test_orphan_progress_file_is_removed(tmp_path: Path) -> None:
    (tmp_path / "spool-w0-1-0000000007.done").write_bytes(b"x" * 24)
    assert _read(tmp_path) == []
    assert not (tmp_path / "spool-w0-1-0000000007.done").exists()
    # and a writer never reuses a file name a progress file could still point at
    (tmp_path / "spool-w0-1-0000000009.done").write_bytes(b"x" * 24)
    _write(tmp_path, [[b"new"]])
    assert [f.name for f in _logs(tmp_path)] == ["spool-w0-1-0000000010.log"]


def test_corrupt_progress_file_replays_from_start(tmp_path: Path) -> None:
    _write(tmp_path, [[b"a", b"b"]])
    with SpoolReader(tmp_path) as reader:
        first, _ = next(reader.iter_pending())
        reader.mark_done(first)
    [done] = tmp_path.glob("*.done")
    done.write_bytes(b"\0" * 24)
    assert _payloads(tmp_path) == [b"a", b"b"]


# --- several processes ------------------------------------------------------------------------


def _writer_process(directory, tag, start):
    start.wait()
    with SpoolWriter(directory, f"{tag}-{os.getpid()}", max_file_bytes=4096) as writer:
        for i in range(60):
            writer.append([b"%s:%d:%d:" % (tag.encode(), i, j) + b"z" * (i % 50) for j in range(3)])


def test_two_writer_processes_do_not_interleave(tmp_path: Path) -> None:
    start = MP.Event()
    procs = [MP.Process(target=_writer_process, args=(str(tmp_path), t, start)) for t in "ab"]
    for proc in procs:
        proc.start()
    start.set()
    for proc in procs:
        proc.join(20)
        assert proc.exitcode == 0
    got = _read(tmp_path)
    for tag in (b"a", b"b"):
        mine = [(pos, p) for pos, p in got if p.startswith(tag + b":")]
        expected = [
            b"%s:%d:%d:" % (tag, i, j) + b"z" * (i % 50) for i in range(60) for j in range(3)
        ]
        assert [p for _, p in mine] == expected
        # every file of this writer holds its records only
        assert all(f"spool-{tag.decode()}-" in os.path.basename(pos.path) for pos, _ in mine)
    assert len(got) == 360
    assert len({pos.path for pos, _ in got}) > 2  # both rotated while the other wrote


# --- write failures ---------------------------------------------------------------------------


def test_unusable_directory_raises_spool_write_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(SpoolWriteError) as info:
        SpoolWriter(blocker / "spool", "w0-1").append([b"x"])
    assert info.value.errno in (errno.ENOTDIR, errno.EEXIST)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_read_only_directory_raises_spool_write_error(tmp_path: Path) -> None:
    tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(SpoolWriteError) as info:
            SpoolWriter(tmp_path, "w0-1").append([b"x"])
        assert info.value.errno == errno.EACCES
    finally:
        tmp_path.chmod(stat.S_IRWXU)


def test_enospc_rolls_back_and_file_stays_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    calls = 0

    def half_then_enospc(fd: int, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, memoryview(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with SpoolWriter(tmp_path, "w0-1") as writer:
        writer.append([b"kept-1", b"kept-2"])
        good_size = os.path.getsize(writer.path or "")
        monkeypatch.setattr(os, "write", half_then_enospc)
        with pytest.raises(SpoolWriteError) as info:
            writer.append([b"lost-%d" % i for i in range(10)])
        monkeypatch.undo()
        assert info.value.errno == errno.ENOSPC
        assert calls == 2
        assert os.path.getsize(writer.path or "") == good_size
        assert _payloads(tmp_path) == [b"kept-1", b"kept-2"]
        writer.append([b"after"])
        # right behind the good records: no hole where the failed append was
        assert os.path.getsize(writer.path or "") == good_size + RECORD_HEADER + len(b"after")
    got = _read(tmp_path)
    assert [p for _, p in got] == [b"kept-1", b"kept-2", b"after"]
    assert [pos.sequence for pos, _ in got] == [0, 1, 2]


def test_fsync_failure_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync
    failures = [OSError(errno.EIO, "I/O error")]

    def failing_fsync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_fsync(fd)  # the rollback's own fsync

    with SpoolWriter(tmp_path, "w0-1") as writer:
        writer.append([b"kept"])
        monkeypatch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(SpoolWriteError):
            writer.append([b"lost"])
        monkeypatch.undo()
        writer.append([b"after"])
        size = FILE_HEADER + 2 * RECORD_HEADER + len(b"kept") + len(b"after")
        assert os.path.getsize(writer.path or "") == size
    assert _payloads(tmp_path) == [b"kept", b"after"]


def test_failed_rollback_abandons_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_write = os.write

    def half_then_enospc(fd: int, data: bytes) -> int:
        if len(data) > 40:
            return real_write(fd, memoryview(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def failing_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    with SpoolWriter(tmp_path, "w0-1", fsync=False) as writer:
        writer.append([b"kept"])
        first = writer.path
        monkeypatch.setattr(os, "write", half_then_enospc)
        monkeypatch.setattr(os, "ftruncate", failing_truncate)
        with (
            caplog.at_level(logging.ERROR, logger="queen_mp.spool"),
            pytest.raises(SpoolWriteError),
        ):
            writer.append([b"lost" * 20])
        monkeypatch.undo()
        assert "abandoning" in caplog.text
        assert writer.path is None  # abandoned: the next append never follows the half record
        writer.append([b"after"])
        assert writer.path != first
    assert _payloads(tmp_path) == [b"kept", b"after"]


def test_closed_writer_refuses(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path, "w0-1")
    writer.close()
    with pytest.raises(SpoolWriteError):
        writer.append([b"x"])


def test_bad_writer_id(tmp_path: Path) -> None:
    for bad in ("", "a/b", "x" * 65, "sp ace"):
        with pytest.raises(ValueError):
            SpoolWriter(tmp_path, bad)


# --- properties -------------------------------------------------------------------------------

_batches = st.lists(st.lists(st.binary(max_size=80), min_size=1, max_size=6), max_size=12)


@settings(max_examples=150, deadline=None)
@given(batches=_batches, max_file_bytes=st.integers(60, 1200), data=st.data())
def test_truncated_spool_yields_exactly_a_prefix(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[bytes]],
    max_file_bytes: int,
    data: st.DataObject,
) -> None:
    directory = tmp_path_factory.mktemp("prop")
    _write(directory, batches, max_file_bytes=max_file_bytes)
    appended = [r for batch in batches for r in batch]
    before = _read(directory)
    assert [p for _, p in before] == appended
    if not appended:
        return
    last_file = _logs(directory)[-1]
    size = last_file.stat().st_size
    cut = data.draw(st.integers(0, size), label="cut")
    os.truncate(last_file, cut)
    got = _payloads(directory)
    survivors = [p for pos, p in before if pos.path != str(last_file) or pos.end <= cut]
    assert got == survivors
    assert got == appended[: len(got)]


@settings(max_examples=150, deadline=None)
@given(batches=_batches, data=st.data())
def test_flipped_byte_never_yields_a_corrupt_record(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[bytes]], data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("flip")
    _write(directory, batches, max_file_bytes=400)
    before = _read(directory)
    if not before:
        return
    target = Path(data.draw(st.sampled_from(sorted({pos.path for pos, _ in before}))))
    raw = bytearray(target.read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1), label="at")
    raw[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    target.write_bytes(bytes(raw))
    got = _payloads(directory)
    hit = [(pos, p) for pos, p in before if pos.path == str(target) and pos.offset <= at < pos.end]
    if at >= FILE_HEADER:
        assert got == [p for pos, p in before if (pos, p) not in hit]
    else:
        # magic, version or salt: that file is lost whole; any other header field only loses
        # the commit hint, which a sealed file does not need
        others = [p for pos, p in before if pos.path != str(target)]
        assert got in (others, [p for _, p in before])


# --- SpoolItem --------------------------------------------------------------------------------

_item = st.builds(
    SpoolItem,
    tenant=st.binary(min_size=16, max_size=16),
    queue=st.text(max_size=40),
    partition=st.text(max_size=40),
    message_id=st.binary(min_size=16, max_size=16),
    transaction_id=st.text(max_size=60),
    trace_id=st.none() | st.binary(min_size=16, max_size=16),
    payload=st.binary(max_size=200),
    producer_sub=st.none() | st.text(max_size=30),
)


@given(_item)
def test_spool_item_round_trip(item: SpoolItem) -> None:
    assert SpoolItem.decode(item.encode()) == item


def test_spool_item_rejects_bad_bytes() -> None:
    item = SpoolItem(
        tenant=b"t" * 16,
        queue="orders",
        partition="customer-42",
        message_id=b"m" * 16,
        transaction_id="order-1001",
        trace_id=b"r" * 16,
        payload=b'\x00\x00\x00\x00{"total":30}',
        producer_sub="alice",
    )
    raw = item.encode()
    for bad in (raw[:-1], raw + b"\0", b"\x02" + raw[1:], raw[:1] + b"\x80" + raw[2:], b""):
        with pytest.raises(SpoolDecodeError) as info:
            SpoolItem.decode(bad)
        assert info.value.data == bad
    with pytest.raises(ValueError):
        SpoolItem(b"short", "q", "p", b"m" * 16, "t", None, b"")


def test_exported_members() -> None:
    assert sorted(spool_pkg.__all__) == sorted(
        name for name in dir(spool_pkg) if not name.startswith("_") and name != "spool"
    )
