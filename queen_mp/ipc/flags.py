"""The flags board: the maintenance switches (docs/api.md 5) and the drain state of one instance,
in one small shared-memory segment every process of the instance reads without a syscall.

PostgreSQL (``queen.system_settings``) is the authority; this is a cache kept fresh by three
writers (queen_mp/ipc/wakeup.py): the front worker that changed a switch, the ``LISTEN
queen_settings`` of every front worker, and a re-read about once a second by whichever
listener finds the last one older than that. Each write carries the ``settings_version`` it
was read at (queen_mp/sql/functions/system.sql) and a write older than the board's is dropped, so a
re-read that raced a change cannot put the old value back.

Layout, u64 words, each stored and loaded whole (aligned 8-byte accesses through a "Q" view
are single instructions, so a reader never sees half a word)::

    0  magic
    1  state           version << 3 | known 4 | pop maintenance 2 | push maintenance 1
    2  refreshed_ms    CLOCK_MONOTONIC ms of the last periodic re-read (a claim, see below)
    3  drainer_pid     the front worker draining the spool now, 0 if none
    4  last_drain_ms   Unix ms at which the last drain pass ended, 0 if never
    5  drain_requests  bumped by POST /api/v1/system/spool/drain and when maintenance ends
"""

from __future__ import annotations

import contextlib
import mmap
import time
from typing import NamedTuple

import posix_ipc

from queen_mp.ipc.slots import pid_exists

__all__ = ["Flags", "FlagsBoard"]

_MAGIC = 0x31474C46504D51  # b"QMPFLG1" little-endian
_BYTES = 64
_PUSH, _POP, _KNOWN = 1, 2, 4
_W_MAGIC, _W_STATE, _W_REFRESHED, _W_DRAINER, _W_LAST_DRAIN, _W_REQUESTS = range(6)
_MAX_VERSION = (1 << 61) - 1


class Flags(NamedTuple):
    """The switches as last published; ``known`` is false until PostgreSQL was read once."""

    push: bool
    pop: bool
    version: int
    known: bool


def _monotonic_ms() -> int:
    # NOTE(queen): CLOCK_MONOTONIC is one clock for every process of the host.
    return time.monotonic_ns() // 1_000_000


class FlagsBoard:
    def __init__(self, name: str, shm: posix_ipc.SharedMemory) -> None:
        self.name = name
        self._map = mmap.mmap(shm.fd, _BYTES)
        shm.close_fd()
        self._q = memoryview(self._map).cast("Q")

    @classmethod
    def create(cls, name: str) -> FlagsBoard:
        board = cls(name, posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600,
                                                 size=_BYTES))
        board._q[_W_MAGIC] = _MAGIC
        return board

    @classmethod
    def attach(cls, name: str) -> FlagsBoard:
        board = cls(name, posix_ipc.SharedMemory(name))
        if board._q[_W_MAGIC] != _MAGIC:
            board.close()
            raise ValueError(f"{name} is not a flags board")
        return board

    @staticmethod
    def unlink(name: str) -> None:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(name)

    def close(self) -> None:
        self._q.release()
        self._map.close()

    # ------------------------------------------------------------------ switches
    def read(self) -> Flags:
        word = self._q[_W_STATE]
        return Flags(bool(word & _PUSH), bool(word & _POP), word >> 3, bool(word & _KNOWN))

    def push_maintenance(self) -> bool:
        return bool(self._q[_W_STATE] & _PUSH)

    def pop_maintenance(self) -> bool:
        return bool(self._q[_W_STATE] & _POP)

    def publish(self, push: bool, pop: bool, version: int, *, force: bool = False) -> bool:
        """Store the switches read at ``version``; a version below the board's is dropped
        unless ``force`` (the database was replaced and its counter restarted)."""
        version = max(0, min(version, _MAX_VERSION))
        current = self._q[_W_STATE]
        if current & _KNOWN and version < current >> 3 and not force:
            return False
        # NOTE(queen): check-then-store is not atomic; two publishers racing can still leave
        # the older value, which the next re-read (<= 1 s) corrects.
        self._q[_W_STATE] = (version << 3) | _KNOWN | (_PUSH if push else 0) | (
            _POP if pop else 0)
        return True

    def claim_refresh(self, every_ms: int) -> bool:
        """True for the one caller (usually) that should re-read PostgreSQL now: the last
        re-read is ``every_ms`` old. The claim is stamped before the read, so the others see it
        fresh and skip."""
        now = _monotonic_ms()
        if now - self._q[_W_REFRESHED] < every_ms:
            return False
        self._q[_W_REFRESHED] = now
        return True

    def refreshed_age_ms(self) -> int:
        return _monotonic_ms() - self._q[_W_REFRESHED]

    # ------------------------------------------------------------------ drain state
    @property
    def drainer_pid(self) -> int:
        return self._q[_W_DRAINER]

    def set_drainer(self, pid: int) -> None:
        self._q[_W_DRAINER] = pid

    def draining(self) -> bool:
        """A live process is draining the spool now."""
        return pid_exists(self._q[_W_DRAINER])

    @property
    def last_drain_ms(self) -> int:
        return self._q[_W_LAST_DRAIN]

    def set_last_drain(self, unix_ms: int | None = None) -> None:
        self._q[_W_LAST_DRAIN] = int(time.time() * 1000) if unix_ms is None else unix_ms

    def request_drain(self) -> int:
        """Ask whoever may drain to start now; returns the new request counter."""
        value = (self._q[_W_REQUESTS] + 1) & 0xFFFF_FFFF_FFFF_FFFF
        self._q[_W_REQUESTS] = value
        return value

    @property
    def drain_requests(self) -> int:
        return self._q[_W_REQUESTS]
