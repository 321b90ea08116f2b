"""Pooled connections for the front workers' request handlers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from queen_mp.db.errors import translate

__all__ = ["connection"]


@contextlib.asynccontextmanager
async def connection(pool: AsyncConnectionPool, *, commit_sent: bool = False
                     ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A pooled autocommit connection; psycopg errors leave as ``queen_mp.db.errors``.

    ``commit_sent``: the block's statements commit themselves (autocommit writes), so a
    connection lost during one leaves the outcome open.
    """
    try:
        async with pool.connection() as conn:
            yield conn
    except psycopg.Error as ex:
        raise translate(ex, commit_sent=commit_sent) from ex
