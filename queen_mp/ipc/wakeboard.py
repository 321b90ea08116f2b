"""The wake board: one word per queue bucket in shared memory, bumped when a queue may have
become claimable (a push committed, a lease was released).

Parked pops do not subscribe to anything: each front worker compares the board with its last
snapshot on a short tick while it has parked pops, and wakes the pops of the buckets that
changed. Writers (every shard, every front worker) store values that are unique per writer and
increasing, so a concurrent pair of bumps can never leave the word at a value a reader already
saw (an increment could: two writers reading 5 would both store 6).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time

import posix_ipc
import xxhash

__all__ = ["WAKE_BUCKETS", "WakeBoard", "bucket_of"]

WAKE_BUCKETS = 4096
_BYTES = 8 * WAKE_BUCKETS


def bucket_of(tenant: bytes, queue: str) -> int:
    """The board word of a (tenant, queue); collisions only cost a spurious wake."""
    return xxhash.xxh3_64_intdigest(tenant + queue.encode("utf-8")) % WAKE_BUCKETS


class WakeBoard:
    def __init__(self, name: str, shm: posix_ipc.SharedMemory) -> None:
        self.name = name
        self._map = mmap.mmap(shm.fd, _BYTES)
        shm.close_fd()
        # NOTE(queen): aligned 8-byte stores through a "Q" view are single writes.
        self._q = memoryview(self._map).cast("Q")
        self._tag = os.getpid() & 0xFFFF
        self._last = 0

    @classmethod
    def create(cls, name: str) -> WakeBoard:
        return cls(name, posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=_BYTES))

    @classmethod
    def attach(cls, name: str) -> WakeBoard:
        return cls(name, posix_ipc.SharedMemory(name))

    @staticmethod
    def unlink(name: str) -> None:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(name)

    def _next_value(self) -> int:
        # (ns clock << 16 | writer tag), strictly increasing per writer, distinct across writers
        value = ((time.monotonic_ns() & 0xFFFF_FFFF_FFFF) << 16) | self._tag
        if value <= self._last:
            value = self._last + 0x10000
        self._last = value
        return value

    def bump(self, buckets: set[int] | list[int]) -> None:
        value = self._next_value()
        for b in buckets:
            self._q[b] = value

    def value(self, bucket: int) -> int:
        return self._q[bucket]

    def snapshot(self) -> bytes:
        return self._map[:_BYTES]

    @staticmethod
    def changed(old: bytes, new: bytes) -> list[int]:
        """Buckets whose word differs between two snapshots."""
        if old == new:
            return []
        out: list[int] = []
        # PERF(queen): compare 512-byte blocks first; only a differing block is walked by word.
        for block in range(0, _BYTES, 512):
            if old[block:block + 512] != new[block:block + 512]:
                for at in range(block, block + 512, 8):
                    if old[at:at + 8] != new[at:at + 8]:
                        out.append(at // 8)
        return out

    def close(self) -> None:
        self._q.release()
        self._map.close()
