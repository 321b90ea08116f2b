"""The dedup filter's second tier: runs of fingerprints moved out of the shard's memory into a
local file, read back with one ``pread`` a run when a probe or a merge needs them.

Past its in-memory bound the filter used to forget whole partitions, and every push to one
then probed its partition's whole window in SQL: about 0.3 us of PostgreSQL CPU a stored hash,
some 1.9 ms a probed 100-item segment at the suite's depth (docs/scaling.md). A run read back
from the page cache costs a copy of 4 bytes an entry instead, and the filter stays complete, so
the promise still covers the window. A read that misses the page cache (a partition idle long
enough for the kernel to drop its pages) waits for the disk inside the shard's loop: one read
of a run, against the SQL probe of its whole window it replaces. The file is unlinked once
created: a crash leaves nothing behind, and a restarted shard starts empty, as its filter does.

Space: slots of power-of-two sizes (at least ``MIN_SLOT`` bytes), freed ones kept by size and
reused (the runs merge like a binary counter, so their sizes come near powers of two), the file
cut back to nothing once every slot is free. ``max_bytes`` bounds the file: past it ``put``
refuses and the filter forgets partitions as it did without this tier.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["MIN_SLOT", "SpillFile"]

log = logging.getLogger("queen_mp.dedup")

MIN_SLOT = 1 << 11  # bytes: 512 fingerprints, the smallest run the filter moves out


def _slot(nbytes: int) -> int:
    return max(MIN_SLOT, 1 << (nbytes - 1).bit_length())


class SpillFile:
    """Slots of one unlinked file, opened at the first ``put``; ``entries`` and ``size`` say
    how many fingerprints it holds and how big it is."""

    def __init__(self, directory: Path | None, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.entries = 0
        self.used = 0  # bytes of the slots in use
        self.size = 0  # bytes of the file
        self._fd = -1
        self._free: dict[int, list[int]] = {}  # slot size -> offsets of free slots

    def put(self, fps: np.ndarray) -> int:
        """Store these fingerprints (a contiguous array of 4-byte ints); the slot's offset, or
        -1 when the file is full or could not be written (they stay in memory then)."""
        nbytes = fps.nbytes
        slot = _slot(nbytes)
        free = self._free.get(slot)
        at = free[-1] if free else self.size
        if not free and at + slot > self.max_bytes:
            return -1
        try:
            if self._fd < 0:
                self._open()
            written = os.pwrite(self._fd, fps, at)
        except OSError as ex:
            log.warning("dedup spill file: write of %d bytes failed: %s", nbytes, ex)
            return -1
        if written != nbytes:
            log.warning("dedup spill file: %d of %d bytes written", written, nbytes)
            return -1
        if free:
            free.pop()
        else:
            self.size += slot
        self.used += slot
        self.entries += len(fps)
        return at

    def get(self, at: int, n: int) -> bytes:
        """The ``n`` fingerprints of the slot at ``at``, as their bytes."""
        data = os.pread(self._fd, 4 * n, at)
        if len(data) != 4 * n:
            raise OSError(f"dedup spill file: {len(data)} of {4 * n} bytes read at {at}")
        return data

    def free(self, at: int, n: int) -> None:
        """The slot at ``at`` holding ``n`` fingerprints is no longer needed."""
        slot = _slot(4 * n)
        self.used -= slot
        self.entries -= n
        if self.used == 0:  # every run left: give the disk back
            os.ftruncate(self._fd, 0)
            self.size = 0
            self._free.clear()
        else:
            self._free.setdefault(slot, []).append(at)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _open(self) -> None:
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="dedup-spill-", dir=self.directory)
        os.unlink(path)
        self._fd = fd
