"""Worker slot table: how a gunicorn front worker learns which rings are its own.

Gunicorn numbers nothing stable across respawns, so each front worker claims a slot
0..W-1 at startup, taking over the slot (and so the rings) of a dead predecessor. Every claim
bumps the slot's generation; the worker writes its request rings with the generation as epoch
and shards stamp replies with it, so a replacement drops replies meant for the dead worker.

Segment layout::

    0    magic u64, nslots u64, lock holder pid u64 (diagnostics)
    64   nslots entries of 16 bytes: pid u32, generation u32, process start time u64
    then nslots u32 words: 1 while the slot's worker has a parked pop (``set_parked``)

The entries change only under a named semaphore used as a mutex (``<name>-lock``); pid and
generation are also read without it, so they are stored as single aligned u32 words through a
memoryview (struct.pack_into zero-fills before writing: a lock-free reader could see 0). The
start time (``/proc/<pid>/stat`` field 22) makes a recycled pid count as dead.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator

import posix_ipc

__all__ = ["NoFreeSlot", "SlotTable", "pid_exists"]

_MAGIC = 0x31544F4C53504D51  # b"QMPSLOT1" read as a little-endian u64
_HEADER = struct.Struct("<QQQ")
_HOLDER_OFF = 16
_U64 = struct.Struct("<Q")
_ENTRIES_OFF = 64
_ENTRY_SIZE = 16
_ENTRY_WORDS = _ENTRY_SIZE // 4
_START = struct.Struct("<Q")
_START_OFF = 8  # inside an entry
_MAX_GENERATION = 0xFFFFFFFF
_HAVE_PROC = os.path.exists("/proc/self/stat")


class NoFreeSlot(RuntimeError):
    """Every slot is owned by a live process."""


def _size(nslots: int) -> int:
    return _ENTRIES_OFF + nslots * (_ENTRY_SIZE + 4)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process from /proc, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


def _start_time(pid: int) -> int:
    stat = _proc_stat(pid) if _HAVE_PROC else None
    return 0 if stat is None else stat[1]


def pid_exists(pid: int) -> bool:
    """A process ``pid`` exists (signal 0; one owned by another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    return True


def _is_alive(pid: int, start_time: int) -> bool:
    """Whether ``pid`` is still the live process that claimed a slot at ``start_time``."""
    if not pid_exists(pid):
        return False
    if not _HAVE_PROC:
        return True
    stat = _proc_stat(pid)
    if stat is None:
        return False  # exited between the two checks
    state, started = stat
    if state in ("Z", "X"):  # zombie: dead, just not reaped yet
        return False
    return not (start_time and started != start_time)


class SlotTable:
    """Shared table of front-worker slots; create with :meth:`create`, open with :meth:`attach`."""

    def __init__(self, name: str, shm: posix_ipc.SharedMemory, lock: posix_ipc.Semaphore) -> None:
        self.name = name
        size = shm.size
        self._mm = mmap.mmap(shm.fd, size)
        shm.close_fd()
        self._lock = lock
        magic, nslots, _holder = _HEADER.unpack_from(self._mm, 0)
        if magic != _MAGIC or size < _size(nslots):
            self._mm.close()
            self._lock.close()
            raise ValueError(f"{name}: not a slot table segment")
        self._nslots: int = nslots
        self._words = memoryview(self._mm)[_ENTRIES_OFF:].cast("I")
        self._parked_off = nslots * _ENTRY_WORDS  # the parked words, after the entries

    @staticmethod
    def _lock_name(name: str) -> str:
        return f"{name}-lock"

    @classmethod
    def create(cls, name: str, nslots: int, *, replace: bool = False) -> SlotTable:
        if nslots < 1:
            raise ValueError("nslots must be >= 1")
        if replace:
            cls.unlink_name(name)
        size = _size(nslots)
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        with mmap.mmap(shm.fd, size) as mm:
            _HEADER.pack_into(mm, 0, _MAGIC, nslots, 0)
        try:
            lock = posix_ipc.Semaphore(
                cls._lock_name(name), posix_ipc.O_CREX, mode=0o600, initial_value=1
            )
        except BaseException:
            shm.close_fd()
            posix_ipc.unlink_shared_memory(name)
            raise
        return cls(name, shm, lock)

    @classmethod
    def attach(cls, name: str) -> SlotTable:
        shm = posix_ipc.SharedMemory(name)
        try:
            lock = posix_ipc.Semaphore(cls._lock_name(name))
        except BaseException:
            shm.close_fd()
            raise
        return cls(name, shm, lock)

    def close(self) -> None:
        if not self._mm.closed:
            self._words.release()
            self._mm.close()
        with contextlib.suppress(posix_ipc.ExistentialError):
            self._lock.close()

    def unlink(self) -> None:
        self.unlink_name(self.name)

    @classmethod
    def unlink_name(cls, name: str) -> bool:
        """Remove the table and its lock by name; False if the table did not exist."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore(cls._lock_name(name))
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            return False
        return True

    def __enter__(self) -> SlotTable:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def nslots(self) -> int:
        return self._nslots

    @contextlib.contextmanager
    def _locked(self, timeout: float) -> Iterator[None]:
        try:
            self._lock.acquire(timeout)
        except posix_ipc.BusyError:
            holder = _U64.unpack_from(self._mm, _HOLDER_OFF)[0]
            # NOTE(ipc): a process SIGKILLed inside this few-microsecond section would leave
            # the lock taken; we do not steal it (two stealers would both get it). The
            # supervisor recreates the table on restart.
            raise TimeoutError(f"{self.name}: lock held for {timeout}s by pid {holder}") from None
        try:
            _U64.pack_into(self._mm, _HOLDER_OFF, os.getpid())
            yield
        finally:
            _U64.pack_into(self._mm, _HOLDER_OFF, 0)
            self._lock.release()

    def _entry(self, slot: int) -> tuple[int, int, int]:
        """(pid, generation, start time); the start time is consistent only under the lock."""
        word = slot * _ENTRY_WORDS
        start = _START.unpack_from(self._mm, _ENTRIES_OFF + slot * _ENTRY_SIZE + _START_OFF)[0]
        return self._words[word], self._words[word + 1], start

    def _set_entry(self, slot: int, pid: int, generation: int, start: int) -> None:
        word = slot * _ENTRY_WORDS
        _START.pack_into(self._mm, _ENTRIES_OFF + slot * _ENTRY_SIZE + _START_OFF, start)
        self._words[word + 1] = generation
        self._words[word] = pid

    def claim(self, pid: int | None = None, *, timeout: float = 5.0) -> tuple[int, int]:
        """Take the lowest slot that is free or whose owner died; returns (slot, generation).

        Raises NoFreeSlot when every slot has a live owner.
        """
        pid = os.getpid() if pid is None else pid
        started = _start_time(pid)
        with self._locked(timeout):
            for slot in range(self._nslots):
                owner, generation, owner_started = self._entry(slot)
                if _is_alive(owner, owner_started):
                    continue
                generation = generation % _MAX_GENERATION + 1  # 1..2**32-1; 0 = never claimed
                self._set_entry(slot, pid, generation, started)
                self._words[self._parked_off + slot] = 0  # a dead predecessor's pops are gone
                return slot, generation
        raise NoFreeSlot(f"{self.name}: all {self._nslots} slots are owned by live processes")

    def release(self, slot: int, pid: int | None = None, *, timeout: float = 5.0) -> bool:
        """Free a slot on clean shutdown; a no-op (False) unless ``pid`` still owns it."""
        self._check(slot)
        pid = os.getpid() if pid is None else pid
        with self._locked(timeout):
            owner, generation, _started = self._entry(slot)
            if owner != pid:
                return False
            self._set_entry(slot, 0, generation, 0)
            return True

    def generation(self, slot: int) -> int:
        """Current generation of a slot (lock-free: one aligned u32 load)."""
        self._check(slot)
        return self._words[slot * _ENTRY_WORDS + 1]

    def owner(self, slot: int) -> int:
        """Pid recorded for a slot (0 if free); it may be dead."""
        self._check(slot)
        return self._words[slot * _ENTRY_WORDS]

    def set_parked(self, slot: int, parked: bool) -> None:
        """The owner of ``slot`` has a parked pop (True) or none any more (False): a shard
        rings a worker after a commit that woke queues only while it has one."""
        if not self._mm.closed:  # a pop leaving after the worker closed the table
            self._words[self._parked_off + slot] = 1 if parked else 0

    def parked(self, slot: int) -> bool:
        """Whether the worker of ``slot`` said it has a parked pop (one aligned u32 load)."""
        return bool(self._words[self._parked_off + slot])

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self._nslots:
            raise IndexError(f"slot {slot} out of range 0..{self._nslots - 1}")
