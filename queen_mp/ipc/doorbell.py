"""Doorbells: a named FIFO per consumer, rung by producers after they publish.

A doorbell carries no data, only "look at your rings". One consumer waits on it and drains
every ring it reads when woken, so many rings collapse into one wake-up.

Why a FIFO and not a semaphore: the consumer's event loop watches the FIFO's descriptor itself
(``loop.add_reader``), so a ring wakes the loop's own ``epoll`` with one ``write``. A semaphore
needs a thread blocked in ``sem_wait`` that takes the GIL to hand each ring to the loop: a
futex wake, a thread switch and a GIL handoff per wake-up, a fifth of a shard's samples under
push load (py-spy, session 6).

Every process opens the FIFO read-write and non-blocking: opening never waits for a peer,
writing to it never fails for want of a reader (a restarted consumer finds the bytes rung
while it was away and drains once), and a full pipe (64 KiB of unread rings) drops the ring,
since the consumer already has a wake-up pending. The consumer reads every pending byte before
it drains its rings, so a ring that lands after that read wakes it again: none is lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import termios
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # PERF(ipc): an annotation only; asyncio pulls in ssl, 2.5 MB of RSS in the supervisor,
    # which creates the doorbells but runs no event loop.
    import asyncio

__all__ = ["AsyncDoorbellWaiter", "Doorbell", "doorbell_path"]

BELL_DIR = Path("/dev/shm")  # beside the rings' shared memory, gone at reboot like them
_RING = b"\x01"
_DRAIN = 1 << 16  # a pipe's capacity: one read empties it


def doorbell_path(name: str) -> Path:
    """The FIFO of the doorbell ``name`` (a POSIX-style ``/name``)."""
    return BELL_DIR / f"{name.lstrip('/')}.bell"


class Doorbell:
    """A named FIFO used as a wake-up flag; create with :meth:`create`, open with
    :meth:`attach`."""

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self._fd = fd

    @classmethod
    def create(cls, name: str, *, replace: bool = False) -> Doorbell:
        if replace:
            cls.unlink_name(name)
        os.mkfifo(doorbell_path(name), 0o600)  # FileExistsError unless replaced
        return cls.attach(name)

    @classmethod
    def attach(cls, name: str) -> Doorbell:
        """Open an existing doorbell (``FileNotFoundError`` if there is none)."""
        return cls(name, os.open(doorbell_path(name), os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unlink(self) -> None:
        self.unlink_name(self.name)

    @staticmethod
    def unlink_name(name: str) -> bool:
        """Remove a doorbell by name; False if it did not exist."""
        try:
            doorbell_path(name).unlink()
        except FileNotFoundError:
            return False
        return True

    def __enter__(self) -> Doorbell:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def ring(self) -> None:
        """Wake the consumer. Call it after publishing, never before."""
        # PERF(ipc): try/except, not contextlib.suppress: no context manager per ring.
        try:  # noqa: SIM105
            os.write(self._fd, _RING)
        except BlockingIOError:
            pass  # 64 KiB of rings unread: the consumer has a wake-up pending already

    def clear(self) -> bool:
        """Take every pending ring; True if there was one. The consumer calls it before it
        drains its rings, so that a ring published after this call wakes it again."""
        try:
            return bool(os.read(self._fd, _DRAIN))
        except BlockingIOError:
            return False

    @property
    def value(self) -> int:
        """Rings not yet taken (diagnostics only)."""
        buf = bytearray(4)
        fcntl.ioctl(self._fd, termios.FIONREAD, buf)
        return int.from_bytes(buf, "little")


class AsyncDoorbellWaiter:
    """Calls ``callback`` on ``loop`` when the doorbell rings, from the loop's own poll: no
    thread. Rings that land before the callback runs share one call."""

    def __init__(self, doorbell: Doorbell, loop: asyncio.AbstractEventLoop,
                 callback: Callable[[], object]) -> None:
        self._doorbell = doorbell
        self._loop = loop
        self._callback = callback
        self._watching = False

    def start(self) -> None:
        """Watch the doorbell; call it on the loop's thread."""
        if self._watching:
            raise RuntimeError("already started")
        self._loop.add_reader(self._doorbell.fileno(), self._fire)
        self._watching = True

    def stop(self) -> None:
        """Stop watching. Safe to call twice, and after the loop closed."""
        if self._watching:
            self._watching = False
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                self._loop.remove_reader(self._doorbell.fileno())

    def _fire(self) -> None:
        if self._doorbell.clear():
            self._callback()
