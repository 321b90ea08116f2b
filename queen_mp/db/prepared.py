"""A hot statement sent through psycopg's libpq wrapper (``conn.pgconn``), not a cursor, and
its answer awaited from the event loop's own poll, not a Task.

Why: the push bundle is one prepared statement a commit, with parameters already in
PostgreSQL's binary form (``queen_mp.db.binarrays``). Through a cursor, psycopg's Python
machinery around it (the query's conversion and dumpers, the prepared-statement cache, the
cursor's state and result handling) and its wait (a future and an interval timer per wait)
came to a good part of the bundle's fixed cost on the shard. Here the statement is prepared
once per connection under a name of ours; each call is ``PQsendQueryPrepared`` and psycopg's
own result generator (``generators.execute``), stepped by a ``Flight`` from reader/writer
callbacks on the socket. libpq still speaks the protocol, psycopg still reads the results and
turns a failed one into its error class.

The caller holds the connection alone (a ``Dedicated`` user), as psycopg's own lock would
ensure: a connection is never shared with a cursor in the middle of a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import errors as e
from psycopg import generators, pq
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W

from queen_mp.db.connect import Conn

__all__ = ["Flight", "PreparedCall"]

_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR

Landed = Callable[[Any], None]  # the results (a list of PGresult), or the exception raised


class PreparedCall:
    """One statement with ``$n`` placeholders, all of whose parameters go in binary."""

    __slots__ = ("_attr", "_formats", "name", "sql")

    def __init__(self, name: str, sql: str, nparams: int) -> None:
        self.name = name.encode()
        self.sql = sql.encode()
        self._formats = [pq.Format.BINARY] * nparams
        self._attr = f"_queen_prepared_{name}"  # set on a connection once prepared there

    def prepared(self, conn: Conn) -> bool:
        return getattr(conn, self._attr, False)

    def send(self, conn: Conn, params: Sequence[bytes]) -> None:
        """Queue the call on a connection where it is ``prepared`` (its results follow)."""
        conn.pgconn.send_query_prepared(self.name, params, self._formats)

    async def first(self, conn: Conn, params: Sequence[bytes]) -> bytes | None:
        """Prepare if needed, call, and wait with psycopg's own wait: the first use of a
        connection."""
        pgconn = conn.pgconn
        if not self.prepared(conn):
            pgconn.send_prepare(self.name, self.sql)
            one_result(await conn.wait(generators.execute(pgconn)), pgconn, _COMMAND_OK)
            setattr(conn, self._attr, True)
        self.send(conn, params)
        return first_value(await conn.wait(generators.execute(pgconn)), pgconn)


def one_result(results: list[Any], pgconn: Any, want: pq.ExecStatus = _TUPLES_OK) -> Any:
    """The one result of a call, or psycopg's error for what the server said."""
    if len(results) != 1:
        raise e.InternalError(f"{len(results)} results for one statement")
    res = results[0]
    if res.status != want:
        if res.status == _FATAL_ERROR:
            raise e.error_from_result(res, encoding=pgconn._encoding)
        raise psycopg.InterfaceError(f"unexpected result {pq.ExecStatus(res.status).name}")
    return res


def first_value(results: list[Any], pgconn: Any) -> bytes | None:
    """The first column of the first row (text form; None for NULL or no row)."""
    res = one_result(results, pgconn)
    return res.get_value(0, 0) if res.ntuples else None


class Flight:
    """The results of a statement just sent on ``conn``, read as the socket becomes ready:
    ``landed(results)`` or ``landed(exception)``, once, from a loop callback (never from the
    constructor). ``abandon`` stops watching (a deadline passed: the caller quarantines the
    connection)."""

    __slots__ = ("fd", "gen", "landed", "loop", "watching")

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: Conn, landed: Landed) -> None:
        self.loop = loop
        self.fd = conn.pgconn.socket
        self.landed = landed
        self.watching = 0
        self.gen: Any = generators.execute(conn.pgconn)
        # the first step flushes the statement; the socket is then watched for what it asks
        try:
            self._watch(next(self.gen))
        except StopIteration as ex:  # libpq had the results already (not seen in practice)
            self.gen = None
            loop.call_soon(landed, ex.value)
        except Exception as ex:
            self.gen = None
            loop.call_soon(landed, ex)

    def _step(self, ready: int) -> None:
        gen = self.gen
        if gen is None:
            return  # a callback queued in the same poll as the one that landed
        try:
            wait = gen.send(ready)
        except StopIteration as ex:
            self._finish()
            self.landed(ex.value)
            return
        except Exception as ex:
            self._finish()
            self.landed(ex)
            return
        self._watch(wait)

    def _watch(self, wait: int) -> None:
        was, loop = self.watching, self.loop
        if wait == was:
            return
        if was & WAIT_R and not wait & WAIT_R:
            loop.remove_reader(self.fd)
        if was & WAIT_W and not wait & WAIT_W:
            loop.remove_writer(self.fd)
        if wait & WAIT_R and not was & WAIT_R:
            loop.add_reader(self.fd, self._step, READY_R)
        if wait & WAIT_W and not was & WAIT_W:
            loop.add_writer(self.fd, self._step, READY_W)
        self.watching = wait

    def _finish(self) -> None:
        self.gen = None
        self._watch(0)

    def abandon(self) -> None:
        """Stop reading; ``landed`` will not be called."""
        gen = self.gen
        if gen is not None:
            self._finish()
            gen.close()
