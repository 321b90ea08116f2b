"""Shard liveness board in shared memory.

Each shard process stamps its entry every few hundred milliseconds; the supervisor murders a
shard whose stamp is stale, and ``/health`` in any front worker reads the board without asking
anybody (gunicorn's ``WorkerTmp`` idea, one shared page instead of one file per child).
"""

from __future__ import annotations

import contextlib
import mmap
import time

import posix_ipc

__all__ = ["HeartbeatBoard"]

_FIELDS = 3  # pid, last beat (ms since epoch), boots
_ENTRY_BYTES = 8 * _FIELDS


def _now_ms() -> int:
    return int(time.time() * 1000)


class HeartbeatBoard:
    """Fixed array of (pid, beat_ms, boots), one entry per shard."""

    def __init__(self, name: str, size: int, shm: posix_ipc.SharedMemory) -> None:
        self.name = name
        self.size = size
        self._map = mmap.mmap(shm.fd, _ENTRY_BYTES * size)
        shm.close_fd()
        # NOTE(queen): u64 stores through a "Q" memoryview are single aligned 8-byte writes;
        # struct.pack_into zeroes the target first, so a reader could see a pid of 0.
        self._q = memoryview(self._map).cast("Q")

    @classmethod
    def create(cls, name: str, size: int) -> HeartbeatBoard:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600,
                                     size=_ENTRY_BYTES * size)
        return cls(name, size, shm)

    @classmethod
    def attach(cls, name: str, size: int) -> HeartbeatBoard:
        return cls(name, size, posix_ipc.SharedMemory(name))

    def beat(self, index: int) -> None:
        self._q[index * _FIELDS + 1] = _now_ms()

    def booted(self, index: int, pid: int) -> None:
        """A new shard process took the entry: count the boot, stamp it alive."""
        base = index * _FIELDS
        self._q[base + 2] += 1
        self._q[base + 1] = _now_ms()
        self._q[base] = pid

    def clear(self, index: int) -> None:
        self._q[index * _FIELDS] = 0

    def read(self, index: int) -> tuple[int, int, int]:
        base = index * _FIELDS
        return self._q[base], self._q[base + 1], self._q[base + 2]

    def age_ms(self, index: int) -> int | None:
        """Milliseconds since the last beat, None if the entry has no live owner."""
        pid, beat, _ = self.read(index)
        if not pid:
            return None
        return max(0, _now_ms() - beat)

    def alive(self, stale_ms: int) -> int:
        """How many shards beat within ``stale_ms``."""
        return sum(1 for i in range(self.size)
                   if (age := self.age_ms(i)) is not None and age <= stale_ms)

    def close(self) -> None:
        self._q.release()
        self._map.close()

    @staticmethod
    def unlink(name: str) -> None:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(name)
