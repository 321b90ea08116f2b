"""Pooled connections for the front workers' request handlers.

After a PostgreSQL failover (docs/operations.md) every connection to the old primary is dead.
The front workers' pool runs ``quiet`` (queen_mp/db/connect.py) on every checkout
(``failover_pool``): a connection that fails it is discarded together with every idle one of
the pool (they all talked to the same server), so a request is never handed a dead connection
and answered ``outcome_unknown`` for work it never sent. New connections follow the DSN, so a
multi-host DSN with ``target_session_attrs=read-write`` lands on whichever host is the primary
now; like every connection of the broker they are made by ``queen_mp.db.connect``, pinned to
``synchronous_commit=on``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from queen_mp.db.connect import make_pool, quiet
from queen_mp.db.errors import translate

__all__ = ["RECONNECT_TIMEOUT_S", "Pool", "connection", "failover_pool", "quiet"]

#: The front workers' pool, as the modules outside queen_mp/db name its type.
Pool = AsyncConnectionPool

# NOTE(db): psycopg_pool retries a failed connect with an exponential backoff (1, 2, 4, 8 s...)
# until reconnect_timeout, then gives up until a client asks again. Its default (300 s) lets
# the backoff grow past a failover's length: a 30 s outage could keep a worker's pool empty for
# 30 s more. Giving up after 2 s keeps the retries at most ~1 s apart while clients wait.
RECONNECT_TIMEOUT_S = 2.0


def failover_pool(dsn: str, *, max_size: int, name: str, timeout: float = 5.0,
                  min_size: int = 1) -> AsyncConnectionPool:
    """An autocommit pool that never hands out a connection to a server that went away;
    its connections are named ``queen-mp <name>`` in ``pg_stat_activity``."""

    async def check(conn: psycopg.AsyncConnection[Any]) -> None:
        if quiet(conn):
            return
        try:
            await conn.execute("")  # consumes a stray notice; raises if the server is gone
        except psycopg.Error:
            await pool.drain()  # the other idle connections went to the same server
            raise
    pool = make_pool(dsn, application_name=f"queen-mp {name}", min_size=min_size,
                     max_size=max_size, name=name, timeout=timeout, check=check,
                     reconnect_timeout=RECONNECT_TIMEOUT_S)
    return pool


class connection:
    """A pooled autocommit connection; psycopg errors leave as ``queen_mp.db.errors``.

    ``commit_sent``: the block's statements commit themselves (autocommit writes), so a
    connection lost during one leaves the outcome open. No connection at all (pool timeout,
    server down) sent nothing: that is ``Unavailable`` whatever ``commit_sent`` says.

    PERF(db): ``getconn``/``putconn`` under a plain class, not ``pool.connection()`` inside a
    generator context manager: the pool's own context manager adds a connection context (a
    commit call, no-op in autocommit) and usage statistics, and the two generator managers
    cost 61 of the 250 thousand instructions of a pooled one-statement call (callgrind). The
    pool's ``putconn`` still rolls back, or replaces, a connection returned mid-transaction,
    mid-statement (a cancelled request) or broken.
    """

    __slots__ = ("_commit_sent", "_conn", "_pool")

    def __init__(self, pool: AsyncConnectionPool, *, commit_sent: bool = False) -> None:
        self._pool = pool
        self._commit_sent = commit_sent
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        try:
            self._conn = await self._pool.getconn()
        except psycopg.Error as ex:
            raise translate(ex, commit_sent=False) from ex
        return self._conn

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: object) -> None:
        conn, self._conn = self._conn, None
        assert conn is not None
        await self._pool.putconn(conn)
        if isinstance(exc, psycopg.Error):
            raise translate(exc, commit_sent=self._commit_sent) from exc
