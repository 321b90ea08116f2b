"""A child process forked from the supervisor to run one function: how the shards start.

Why a fork and not ``python -m queen_mp.shards.process``: a fresh interpreter imports psycopg,
uvloop, numpy and the broker's modules again into memory of its own (a shard was 37 MB of PSS
at idle, 20 of them such imports); a fork of the supervisor after ``preload`` shares those pages
with it and with the front workers.

What a fresh interpreter would not have inherited is undone in the child before the function
runs:

- signal handlers: the supervisor's and gunicorn's arbiter's are back to the interpreter's
  defaults (SIGINT raises KeyboardInterrupt, the others SIG_DFL), no wake-up descriptor;
- descriptors: every inherited one above stderr (the arbiter's listening sockets and pipe,
  shared-memory maps' descriptors) is pointed at /dev/null rather than closed. Its resource
  is released (the port closes when the arbiter closes its own listener, as before), and its
  number stays taken, so an inherited object that closes "its" descriptor later (prometheus
  closes the parent's files after a fork) cannot close one the child has opened since;
- the process group: a new one, as ``Popen(process_group=0)`` gave, so that a terminal's
  Ctrl-C reaches only the supervisor;
- the name: ``/proc/<pid>/comm`` (what ``ps -e``, ``top`` and ``pgrep`` show) is the
  child's, e.g. ``qmp-shard-0``; its command line stays the supervisor's.

Threads do not cross a fork, so the supervisor has none (``preload`` keeps numpy's OpenBLAS
from starting its pool). The child never returns into the supervisor's code: whatever the
function does, the process ends with ``os._exit`` and the function's status.

``ForkedChild`` offers the part of ``subprocess.Popen`` the supervisor uses (``pid``,
``returncode``, ``poll``, ``wait``, ``terminate``, ``kill``), with Popen's conventions: a
status killed by signal N is -N, and a child someone else reaped (gunicorn's arbiter reaps
with ``waitpid(-1)``) reads as 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from queen_mp.heap import before_fork

__all__ = ["ForkedChild", "exit_now", "exit_status"]

_NAME_MAX = 15  # bytes of /proc/<pid>/comm
_WAIT_STEP_S = 0.05


class ForkedChild:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(cls, target: Callable[[], int], name: str) -> ForkedChild:
        """Fork; the child runs ``target`` and exits with its status.

        PERF(memory): what the supervisor made since ``preload`` froze its heap is frozen too
        before the fork: the child's first collection would otherwise walk those objects and
        write to their headers, a private copy of each page they sit on (about 1 MB for 4,700
        objects, measured on a fork's ``Private_Dirty``). The free blocks of its pymalloc pools
        are filled (``seal_free_blocks``) and its C heap's small free chunks taken
        (``seal_free_chunks``), so that the child allocates in pools and pages of its own.
        """
        before_fork()
        pid = os.fork()
        if pid == 0:
            _run_child(target, name)
        return cls(pid)

    def poll(self) -> int | None:
        """The exit status if the child has ended (reaping it), else None."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end; ``TimeoutError`` past ``timeout`` seconds."""
        if timeout is None:
            while self.returncode is None:
                self._reap(0)
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"process {self.pid} still running after {timeout}s")
            time.sleep(min(_WAIT_STEP_S, left))
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid that may have been reused since
            os.kill(self.pid, sig)

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:
            self.returncode = 0  # reaped elsewhere: its status is lost (Popen says 0 too)
            return
        except InterruptedError:
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def exit_status(code: object) -> int:
    """The process status ``sys.exit(code)`` gives (None is 0, any other non-int is 1)."""
    return 0 if code is None else code if isinstance(code, int) else 1


def exit_now(code: object) -> NoReturn:
    """End a forked child now, with the status ``sys.exit(code)`` would give it, without
    unwinding into the code of the process it was forked from."""
    if not (code is None or isinstance(code, int)):
        print(code, file=sys.stderr)  # as sys.exit does with a message
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(exit_status(code) & 0xFF)


def _run_child(target: Callable[[], int], name: str) -> NoReturn:
    code: object = 1
    try:
        os.setpgid(0, 0)
        _default_signals()
        _detach_inherited_descriptors()
        _set_name(name)
        code = target()
    except SystemExit as ex:
        code = ex.code
    except BaseException:
        traceback.print_exc()
    finally:
        exit_now(code)


def _default_signals() -> None:
    """Every signal with a Python handler goes back to what a fresh interpreter has."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _detach_inherited_descriptors() -> None:
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in fds:
        if fd > 2 and fd != null:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
                os.fstat(fd)
                os.dup2(null, fd, inheritable=False)
    os.close(null)


def _set_name(name: str) -> None:
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name.encode()[:_NAME_MAX].decode(errors="ignore"))
