"""The ack registry (ack-internals.md, "Accelerator one"): per (partition, group), the live
lease a pop handed out and the distinct hashes it delivered.

A whole-batch ``completed`` ack by the lease holder whose hash set equals the delivered set
becomes one positional cursor advance, with no hash resolution. The registry only ever decides
"try the fast path"; PostgreSQL re-validates the lease under the consumer row lock, so a stale
entry can never grant an ack the database would refuse. Every entry dies on its first use (hit
or miss: the SQL path then owns that batch), on TTL (lease + 10 s), or by LRU eviction under
the memory bound. A sweep runs on insert at most every 5 s, so no background task is needed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from queen_mp.wire.records import AckRequest, LeaseGrant

__all__ = ["AckRegistry", "Granted"]

_TTL_MARGIN_S = 10.0
_SWEEP_EVERY_S = 5.0
_ENTRY_OVERHEAD = 160  # dict slot, key tuple, dataclass, bytes header (approximate)


@dataclass(frozen=True, slots=True)
class Granted:
    tenant: bytes
    queue: str
    lease: bytes
    batch_end: int
    count: int
    hashes: bytes  # wire.records.hash_set of the delivered transactionIds
    dies_at: float  # monotonic
    size: int


class AckRegistry:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[int, str], Granted] = OrderedDict()
        self._swept = time.monotonic()

    def __len__(self) -> int:
        return len(self._entries)

    def grant(self, g: LeaseGrant) -> None:
        now = time.monotonic()
        ttl = max(0.0, g.expires_ms / 1000 - time.time()) + _TTL_MARGIN_S
        size = _ENTRY_OVERHEAD + len(g.group) + len(g.queue) + len(g.hashes)
        key = (g.partition_id, g.group)
        self._drop(key)
        self._entries[key] = Granted(g.tenant, g.queue, g.lease, g.batch_end,
                                     len(g.hashes) // 16, g.hashes, now + ttl, size)
        self.bytes += size
        while self.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))
        if now - self._swept >= _SWEEP_EVERY_S:
            self._sweep(now)

    def take(self, req: AckRequest) -> Granted | None:
        """The entry if this ack may take the fast path; the entry dies either way."""
        entry = self._drop((req.partition_id, req.group))
        if (entry is None or entry.dies_at < time.monotonic() or entry.lease != req.lease
                or entry.tenant != req.tenant or entry.hashes != req.hashes):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def _drop(self, key: tuple[int, str]) -> Granted | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry.size
        return entry

    def _sweep(self, now: float) -> None:
        self._swept = now
        for key in [k for k, e in self._entries.items() if e.dies_at < now]:
            self._drop(key)
