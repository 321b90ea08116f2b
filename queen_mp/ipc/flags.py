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
    6  local_hold      nonzero while this instance's spool may hold undrained records (set
                       after each append, cleared by the drain's closing pass:
                       front/spoolhold.py): 1 pushes wait for the drain, 2 the drain cannot
                       go on now (PostgreSQL or a shard down) and pushes go to the spool
    7  local_oldest    Unix us of the accept time of the oldest undrained record, 0 if unknown
    8  peers           what the last read said of other instances: oldest << 2 | peers present
                       2 | a peer holds 1 (oldest: Unix us of their oldest undrained record)
    9  peers_read_ms   CLOCK_MONOTONIC ms at which the periodic read behind word 8 was sent
   10  hold_beat_ms    CLOCK_MONOTONIC ms of the last heartbeat of this instance's hold row
   11  hold_episode    Unix us of the first append of the current (or last) hold: its key
"""

from __future__ import annotations

import contextlib
import mmap
import time
from typing import NamedTuple

import posix_ipc

from queen_mp.ipc.slots import pid_exists

__all__ = ["DIRECT", "HOLD", "PEERS_VALID_MS", "SPOOL", "Flags", "FlagsBoard", "Peers",
           "monotonic_ms"]

_MAGIC = 0x31474C46504D51  # b"QMPFLG1" little-endian
_BYTES = 128
_PUSH, _POP, _KNOWN = 1, 2, 4
(_W_MAGIC, _W_STATE, _W_REFRESHED, _W_DRAINER, _W_LAST_DRAIN, _W_REQUESTS, _W_HOLD,
 _W_OLDEST, _W_PEERS, _W_PEERS_READ, _W_HOLD_BEAT, _W_EPISODE) = range(12)
_PEER_HOLDS, _PEERS_PRESENT = 1, 2
_BLOCKED = 2  # local_hold while the drain cannot go on
#: how old the read behind "no peer holds" may be while peers exist; their holds' publishers
#: wait longer than this before answering (front/spoolhold.py HOLD_SETTLE_S)
PEERS_VALID_MS = 2500
#: what ``push_route`` answers
DIRECT, SPOOL, HOLD = 0, 1, 2
_MAX_VERSION = (1 << 61) - 1


class Flags(NamedTuple):
    """The switches as last published; ``known`` is false until PostgreSQL was read once."""

    push: bool
    pop: bool
    version: int
    known: bool


class Peers(NamedTuple):
    """Other instances as the last read (or notification) told: whether one holds undrained
    spool records, whether any exists, the oldest of their records (Unix us, 0 if none)."""

    hold: bool
    present: bool
    oldest_us: int


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

    # ------------------------------------------------------------------ push order
    def push_route(self) -> int:
        """Where a push goes now: ``DIRECT``; ``SPOOL`` (push maintenance); ``HOLD``: a spool
        holds records a new push must not overtake (this instance's, or another's, or peers
        exist and what we know of them is too old), so the push waits for the hold to end."""
        # PERF(queen): two or three shared-memory loads per push; the clock only with peers.
        q = self._q
        if q[_W_STATE] & _PUSH:
            return SPOOL
        held = q[_W_HOLD]
        if held:
            return SPOOL if held == _BLOCKED else HOLD
        peers = q[_W_PEERS]
        if not peers:
            return DIRECT
        if peers & _PEER_HOLDS or _monotonic_ms() - q[_W_PEERS_READ] > PEERS_VALID_MS:
            return HOLD
        return DIRECT

    def maintenance_route(self) -> int:
        """``push_route`` without holds (``QUEEN_SPOOL_HOLD`` off): ``SPOOL`` during push
        maintenance, else ``DIRECT``."""
        return SPOOL if self._q[_W_STATE] & _PUSH else DIRECT

    def local_hold(self) -> bool:
        return bool(self._q[_W_HOLD])

    def set_local_hold(self, oldest_us: int) -> bool:
        """After an append: the spool holds records; True if it did not before (a new
        episode, to be published)."""
        q = self._q
        fresh = not q[_W_HOLD]
        if fresh:
            q[_W_EPISODE] = max(oldest_us, q[_W_EPISODE] + 1)
            q[_W_OLDEST] = oldest_us
            q[_W_HOLD] = 1
        elif not q[_W_OLDEST]:
            q[_W_OLDEST] = oldest_us
        return fresh

    def set_hold_blocked(self, blocked: bool) -> None:
        """The drain cannot go on now (``blocked``: pushes go to the spool at once rather
        than wait for it), or it goes on again (they wait); no effect without a hold."""
        if self._q[_W_HOLD]:
            self._q[_W_HOLD] = _BLOCKED if blocked else 1

    @property
    def hold_episode(self) -> int:
        """The key of the current (or last) hold: a withdrawal names the one it ended."""
        return self._q[_W_EPISODE]

    def clear_local_hold(self) -> None:
        self._q[_W_HOLD] = 0
        self._q[_W_OLDEST] = 0

    @property
    def local_oldest_us(self) -> int:
        return self._q[_W_OLDEST]

    def set_local_oldest(self, oldest_us: int) -> None:
        self._q[_W_OLDEST] = oldest_us

    def peers(self) -> Peers:
        word = self._q[_W_PEERS]
        return Peers(bool(word & _PEER_HOLDS), bool(word & _PEERS_PRESENT), word >> 2)

    def publish_peers(self, hold: bool, present: bool, oldest_us: int,
                      read_ms: int | None = None) -> None:
        """Store what a read (``read_ms``: when it was sent, ``monotonic_ms()``) or a
        notification (``read_ms`` None: the freshness stamp is kept) said of the peers."""
        if read_ms is not None:
            self._q[_W_PEERS_READ] = read_ms
        self._q[_W_PEERS] = (oldest_us << 2 if hold else 0) | (
            _PEER_HOLDS if hold else 0) | (_PEERS_PRESENT if present or hold else 0)

    def peers_present(self) -> bool:
        return bool(self._q[_W_PEERS] & _PEERS_PRESENT)

    def claim_hold_beat(self, every_ms: int) -> bool:
        """True for the one caller (usually) that should refresh this instance's hold row."""
        now = _monotonic_ms()
        if now - self._q[_W_HOLD_BEAT] < every_ms:
            return False
        self._q[_W_HOLD_BEAT] = now
        return True


def monotonic_ms() -> int:
    """The clock of ``peers_read_ms`` (one clock for every process of the host)."""
    return _monotonic_ms()
