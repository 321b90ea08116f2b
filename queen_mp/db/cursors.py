"""One reused cursor per connection for the hot statements that take one (the SQL-path acks).

Why: psycopg gives every ``conn.execute`` a new cursor, and a new cursor copies the
connection's adapters map and starts with cold dumper and loader caches. For a 13-parameter,
12-column prepared statement (the pop's claim, which ``queen_mp.db.prepared.pooled_rows``
sends now) that was 60 of the 190 thousand instructions of a round trip
(callgrind, uvloop, psycopg 3.3). A connection serves one statement at a time here (a pool
checkout or a ``Dedicated`` user), so one cursor per connection and format is enough; the
rows are fetched and the cursor's result dropped before the call returns, so a connection
never holds a large result until its next statement. Pipelined calls, which need one
cursor per statement in flight, keep ``conn.execute``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.abc import Query

from queen_mp.db.connect import Conn

__all__ = ["fetch_one"]

_ATTR = ("_queen_text_cursor", "_queen_binary_cursor")


def _cursor(conn: Conn, binary: bool) -> psycopg.AsyncCursor[Any]:
    attr = _ATTR[binary]
    cur: psycopg.AsyncCursor[Any] | None = getattr(conn, attr, None)
    if cur is None or cur.closed:
        cur = conn.cursor(binary=binary)
        setattr(conn, attr, cur)
    return cur


async def fetch_one(conn: Conn, query: Query, params: Any, *, prepare: bool | None = None,
                    binary: bool = False) -> Any:
    """The first row of ``query`` (None if it returned none), on the reused cursor."""
    return await _fetch(conn, query, params, prepare, binary)


async def _fetch(conn: Conn, query: Query, params: Any, prepare: bool | None, binary: bool
                 ) -> Any:
    cur = _cursor(conn, binary)
    try:
        await cur.execute(query, params, prepare=prepare)
        return await cur.fetchone()
    finally:
        # NOTE(db): psycopg's own reset (3.x, pinned < 3.4): drops the result it holds
        cur._reset()
