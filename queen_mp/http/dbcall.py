"""Database work of a request handler, and what its failures mean to the client (docs/api.md 1.4).

A lost lock race (``Conflict``) changed nothing and is retried a few times; the rest map to the
503 codes whose texts the 2.6 consume loop reads (``connection`` / ``timeout``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from queen_mp.db import errors as dberrors
from queen_mp.db.pooled import Pool, connection
from queen_mp.http.errors import ApiError, Maintenance, OutcomeUnknown, Timeout, Unavailable

__all__ = ["api_error", "call_db"]

T = TypeVar("T")
_CONFLICT_TRIES = 3


def api_error(ex: dberrors.DatabaseError) -> ApiError:
    if isinstance(ex, dberrors.OutcomeUnknown):
        return OutcomeUnknown(f"database connection lost after the change was sent; it may "
                              f"or may not have applied: {ex}")
    if isinstance(ex, dberrors.StatementTimeout):
        return Timeout(f"database statement timeout: {ex}")
    if isinstance(ex, dberrors.MaintenanceOn):
        return Maintenance("push maintenance is on: writes are refused (retry later)")
    if isinstance(ex, dberrors.Conflict):
        return Unavailable("database conflict persisted (lock contention); nothing was "
                           "changed, retry")
    return Unavailable(f"database connection failed: {ex}")


async def call_db(pool: Pool, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``fn(conn)`` on a pooled connection; database failures become API errors."""
    for attempt in range(_CONFLICT_TRIES):
        try:
            async with connection(pool) as conn:
                return await fn(conn)
        except dberrors.Conflict as ex:
            if attempt + 1 == _CONFLICT_TRIES:
                raise api_error(ex) from None
            await asyncio.sleep(0.02 * (attempt + 1))
        except dberrors.DatabaseError as ex:
            raise api_error(ex) from None
    raise AssertionError("unreachable")
