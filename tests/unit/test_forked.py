"""Forked children (how the supervisor starts shards): the child runs one function and exits
with its status, with the signal handlers, descriptors and process group a fresh interpreter
would have; the handle reads statuses as ``subprocess.Popen`` does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queen_mp.processes.forked import ForkedChild, exit_status


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (-1, -1),
                                               ("halting: reason", 1), (True, True)])
def test_exit_status_is_what_sys_exit_gives(code, status):
    assert exit_status(code) == status
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.exit({code!r})"],
                          capture_output=True)
    assert done.returncode == status & 0xFF


def _exit(code: object) -> int:
    raise SystemExit(code)


def _fail() -> int:
    raise RuntimeError("boom")


@pytest.mark.parametrize(("target", "status"), [
    (lambda: 0, 0), (lambda: 7, 7), (lambda: _exit(None), 0), (lambda: _exit(4), 4),
    (lambda: _exit("a message"), 1), (_fail, 1)])
def test_the_child_exits_with_the_status_of_its_function(target, status):
    child = ForkedChild.start(target, name="qmp-test")
    assert child.wait(30) == status
    assert child.returncode == status and child.poll() == status


def test_the_child_has_default_signals_its_own_group_and_name(tmp_path):
    report = tmp_path / "report"

    def look() -> int:
        report.write_text(repr((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT),
                                os.getpgid(0) == os.getpid(),
                                Path("/proc/self/comm").read_text().strip())))
        return 0

    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        child = ForkedChild.start(look, name="qmp-shard-12345678")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert child.wait(30) == 0
    assert report.read_text() == repr((signal.SIG_DFL, signal.default_int_handler, True,
                                       "qmp-shard-12345"))


def test_a_stop_signal_ends_the_child_even_if_the_parent_handles_it():
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        child = ForkedChild.start(lambda: time.sleep(60) or 0, name="qmp-test")
    finally:
        signal.signal(signal.SIGTERM, previous)
    with pytest.raises(TimeoutError):
        child.wait(0.2)
    child.terminate()
    assert child.wait(30) == -signal.SIGTERM


def test_inherited_descriptors_are_released_but_their_numbers_stay_taken(tmp_path):
    report = tmp_path / "report"
    r, w = os.pipe()

    def look() -> int:
        fresh = os.open(os.devnull, os.O_RDONLY)
        report.write_text(repr((os.readlink(f"/proc/self/fd/{w}"), fresh not in (r, w))))
        return 0

    child = ForkedChild.start(look, name="qmp-test")
    os.close(w)
    try:
        assert child.wait(30) == 0
        # the child's copy of the write end no longer holds the pipe open: the reader sees EOF
        assert os.read(r, 1) == b""
    finally:
        os.close(r)
    assert report.read_text() == repr(("/dev/null", True))


def test_a_child_reaped_elsewhere_reads_as_status_0_and_is_not_signalled():
    child = ForkedChild.start(lambda: 5, name="qmp-test")
    os.waitpid(child.pid, 0)  # as gunicorn's arbiter does with waitpid(-1)
    assert child.poll() == 0
    child.kill()  # no signal to a pid that may belong to another process now
    assert child.wait() == 0
