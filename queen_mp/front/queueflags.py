"""Per-queue switches the front worker must know before building frames, memoised.

A 1000-item push over three queues asks PostgreSQL at most three times, and not again for a
few seconds; a queue's flags change rarely (configure), and a stale answer only affects pushes
made within the memo's lifetime after the change.

When PostgreSQL does not answer within ``READ_TIMEOUT_S`` (an outage: the pool cannot connect),
the last value this worker saw is used however old it is; a queue it never saw raises
``FlagsUnavailable``, and the push path then spools the request (its flags are resolved when
the spool drains), so an outage answers ``buffered``, not 503. After a failed read the worker
asks again only ``down_s`` later: meanwhile those answers come at once, so an outage costs one
push a wait now and then, not every push whose memo expired (a pg_auto_failover failover, 50 s
without a primary, made every push wait the 3 s).
"""

from __future__ import annotations

import asyncio
import time

from queen_mp.db import procs
from queen_mp.db.errors import DatabaseError
from queen_mp.db.pooled import Pool, connection

__all__ = ["FlagsUnavailable", "QueueFlags"]

_TTL_S = 5.0
_DOWN_S = 1.0
READ_TIMEOUT_S = 3.0  # under the pool's own timeout (5 s): an outage is spooled sooner


class FlagsUnavailable(Exception):
    """PostgreSQL could not tell us the queue's flags; nothing was attempted."""


class QueueFlags:
    def __init__(self, pool: Pool, *, ttl_s: float = _TTL_S, down_s: float = _DOWN_S) -> None:
        self.pool = pool
        self.ttl_s, self.down_s = ttl_s, down_s
        self._memo: dict[tuple[bytes, str], tuple[float, bool]] = {}
        #: after a failed read, until when PostgreSQL is not asked, and why it failed
        self._down_until = 0.0
        self._down_cause = ""

    def known_encrypted(self, tenant: bytes, queue: str) -> bool | None:
        """The memoised flag, None when the memo has none (or an expired one)."""
        hit = self._memo.get((tenant, queue))
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return None

    async def encrypted(self, tenant: bytes, queue: str) -> bool:
        known = self.known_encrypted(tenant, queue)
        if known is not None:
            return known
        now = time.monotonic()
        if now < self._down_until:
            return self._last_known(tenant, queue)
        try:
            async with asyncio.timeout(READ_TIMEOUT_S), connection(self.pool) as conn:
                flags = await procs.queue_flags(conn, tenant, queue)
        except (DatabaseError, TimeoutError) as ex:
            cause = ex.__cause__ or ex  # named as psycopg named it (PoolTimeout, ...)
            self._down_until = time.monotonic() + self.down_s
            self._down_cause = f"{type(cause).__name__}: {cause}"
            return self._last_known(tenant, queue)
        value = flags.encryption
        if len(self._memo) > 100_000:
            self._memo.clear()
        self._memo[(tenant, queue)] = (now + self.ttl_s, value)
        return value

    def _last_known(self, tenant: bytes, queue: str) -> bool:
        """The last value seen however old, while PostgreSQL cannot tell."""
        stale = self._memo.get((tenant, queue))
        if stale is None:
            raise FlagsUnavailable(f"queue flags unreadable: {self._down_cause}")
        return stale[1]
