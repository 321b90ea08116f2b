"""A hot statement sent through psycopg's libpq wrapper (``conn.pgconn``), not a cursor, and
its answer awaited from the event loop's own poll, not a Task.

Why: the push bundle is one prepared statement a commit, with parameters already in
PostgreSQL's binary form (``queen_mp.db.binarrays``). Through a cursor, psycopg's Python
machinery around it (the query's conversion and dumpers, the prepared-statement cache, the
cursor's state and result handling) and its wait (a future and an interval timer per wait)
came to a good part of the bundle's fixed cost on the shard. Here the statement is prepared
once per connection under a name of ours; each call is ``PQsendQueryPrepared`` and psycopg's
own result generator (``generators.execute``), stepped by the connection's ``Channel`` from
reader/writer callbacks on its socket. libpq still speaks the protocol, psycopg still reads
the results and turns a failed one into its error class.

The caller holds the connection alone (a ``Dedicated`` user), as psycopg's own lock would
ensure: a connection is never shared with a cursor in the middle of a call.

A statement prepared here can disappear behind the connection's flag: psycopg sends
``DEALLOCATE ALL`` after a ROLLBACK (``conn.rollback()``, a ``transaction()`` left by an
exception), DROP, ALTER or DISCARD ALL it runs on a connection where it holds prepared
statements of its own (``psycopg/_preparing.py``, ``_should_discard``/``clear``), and a
DISCARD ALL deallocates by itself. So the server's ``26000`` (invalid_sql_statement_name) for
a statement the flag says prepared clears the flag (``PreparedCall.lost``) and the call goes
again once, prepared first: nothing ran (the name is resolved at Bind, before execution) and
an autocommit connection is idle again. Why not keep psycopg from preparing on these
connections (``prepare_threshold=None``) instead: psycopg then ignores ``prepare=True`` too,
and the front workers' pool, where the pop's claim lives, prepares every other hot statement
(acks, renewals) through psycopg (unprepared, the base's claim statement on an empty queue
took 130-140 us of its backend's CPU a call against 80 prepared); nor would it cover a
DISCARD ALL. The check costs nothing
while the statement is there: one except clause on the error path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import psycopg
from psycopg import errors as e
from psycopg import generators, pq
from psycopg.adapt import Transformer
from psycopg.waiting import READY_R, READY_W, WAIT_W

from queen_mp.db.connect import Conn

__all__ = ["Channel", "PreparedCall", "first_value", "one_result", "pooled_rows"]

_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_IDLE = pq.TransactionStatus.IDLE
#: SQLSTATE invalid_sql_statement_name: the name is not prepared on the connection
_NOT_PREPARED = "26000"

Landed = Callable[[Any], None]  # the results (a list of PGresult), or the exception raised


class PreparedCall:
    """One statement with ``$n`` placeholders, all of whose parameters go in binary; its
    result comes in text, or in binary with ``binary_result``."""

    __slots__ = ("_attr", "_formats", "_result", "name", "sql")

    def __init__(self, name: str, sql: str, nparams: int, *, binary_result: bool = False) -> None:
        self.name = name.encode()
        self.sql = sql.encode()
        self._formats = [pq.Format.BINARY] * nparams
        self._result = pq.Format.BINARY if binary_result else pq.Format.TEXT
        self._attr = f"_queen_prepared_{name}"  # set on a connection once prepared there

    def prepared(self, conn: Conn) -> bool:
        return getattr(conn, self._attr, False)

    def lost(self, conn: Conn, ex: BaseException) -> bool:
        """Whether ``ex`` says the statement the flag says prepared is gone (deallocated
        behind our back, see the module's docstring): the flag is cleared, and True if the
        call may go again, prepared first (the connection is idle: nothing ran)."""
        if getattr(ex, "sqlstate", None) != _NOT_PREPARED or not self.prepared(conn):
            return False
        setattr(conn, self._attr, False)
        return conn.pgconn.transaction_status == _IDLE

    async def prepare(self, conn: Conn) -> None:
        """Prepare the statement on ``conn`` (psycopg's own wait) and flag it there."""
        pgconn = conn.pgconn
        pgconn.send_prepare(self.name, self.sql)
        one_result(await conn.wait(generators.execute(pgconn)), pgconn, _COMMAND_OK)
        setattr(conn, self._attr, True)

    def send(self, conn: Conn, params: Sequence[bytes | None]) -> None:
        """Queue the call on a connection where it is ``prepared`` (its results follow)."""
        conn.pgconn.send_query_prepared(self.name, params, self._formats, self._result)

    async def first(self, conn: Conn, params: Sequence[bytes | None]) -> bytes | None:
        """Prepare if needed, call, and wait with psycopg's own wait: the first use of a
        connection, or the one after the statement was ``lost``."""
        try:
            return await self._first(conn, params)
        except psycopg.Error as ex:
            if not self.lost(conn, ex):
                raise
        return await self._first(conn, params)

    async def _first(self, conn: Conn, params: Sequence[bytes | None]) -> bytes | None:
        if not self.prepared(conn):
            await self.prepare(conn)
        self.send(conn, params)
        pgconn = conn.pgconn
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
    """The first column of the first row (in the call's result format; None for NULL or no
    row)."""
    res = one_result(results, pgconn)
    return res.get_value(0, 0) if res.ntuples else None


class Channel:
    """A connection's socket, watched by the loop for the connection's lifetime, through which
    the results of its calls are read: ``call(landed)`` after a statement was sent, then
    ``landed(results)`` or ``landed(exception)`` once, from a loop callback.

    PERF(queen): uvloop's ``add_reader`` on a descriptor it does not watch yet builds its poll
    handle through a caught KeyError whose traceback Cython makes, about 47k instructions,
    and ``remove_reader`` drops the handle again: psycopg's wait paid that at every statement.
    Here the watch is made once. It watches a duplicate of libpq's descriptor, so libpq
    closing its own (a lost connection, ``PQfinish``) never leaves a closed descriptor
    registered with libuv, which aborts on one. Input while no call is in flight (a notice,
    the server going away, or another user of the connection) ends the watch (``closed``):
    the connection's owner checks it (``quiet``) before its next use, and makes a new watch.
    """

    __slots__ = ("conn", "fd", "gen", "landed", "loop", "writing")

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: Conn) -> None:
        self.loop = loop
        self.conn = conn
        self.gen: Any = None
        self.landed: Landed | None = None
        self.writing = False
        self.fd = os.dup(conn.pgconn.socket)
        try:
            loop.add_reader(self.fd, self._readable)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def call(self, landed: Landed) -> None:
        """Read the results of the statement just sent on the connection."""
        self.landed = landed
        self.gen = generators.execute(self.conn.pgconn)
        try:
            wait = next(self.gen)  # flushes the statement
        except StopIteration as ex:  # never seen: results need a read
            self._land(ex.value, soon=True)
            return
        except Exception as ex:
            self._land(ex, soon=True)
            return
        self._want_write(bool(wait & WAIT_W))

    def _readable(self) -> None:
        if self.gen is None:
            self.close()
        else:
            self._step(READY_R)

    def _writable(self) -> None:
        if self.gen is not None:
            self._step(READY_W)

    def _step(self, ready: int) -> None:
        try:
            wait = self.gen.send(ready)
        except StopIteration as ex:
            self._land(ex.value)
            return
        except Exception as ex:
            self._land(ex)
            return
        self._want_write(bool(wait & WAIT_W))

    def _want_write(self, want: bool) -> None:
        if want != self.writing and self.fd >= 0:
            if want:
                self.loop.add_writer(self.fd, self._writable)
            else:
                self.loop.remove_writer(self.fd)
            self.writing = want

    def _land(self, result: Any, *, soon: bool = False) -> None:
        landed = self.landed
        self.gen = self.landed = None
        self._want_write(False)
        if landed is not None:
            if soon:
                self.loop.call_soon(landed, result)
            else:
                landed(result)

    def probe(self) -> bool:
        """Step the call in flight if its socket has input now; True if it had.

        The owner's backstop for input the loop did not report: after a PostgreSQL
        restart a bundle's socket was seen readable (the server gone) with its call still
        waiting for the loop's callback until the statement deadline, 30 s (fault matrix,
        pg-outage; the cause in the loop's watch was not found)."""
        if self.gen is None or self.fd < 0 or not select.select([self.fd], [], [], 0)[0]:
            return False
        self._step(READY_R)
        return True

    def abandon(self) -> None:
        """Give up the call in flight (``landed`` is not called) and the watch."""
        gen = self.gen
        self.gen = self.landed = None
        if gen is not None:
            gen.close()
        self.close()

    def close(self) -> None:
        """Stop watching; close the duplicate descriptor."""
        fd = self.fd
        if fd < 0:
            return
        self.fd = -1
        loop = self.loop
        with contextlib.suppress(Exception):  # a loop already closed
            loop.remove_reader(fd)
            if self.writing:
                loop.remove_writer(fd)
        self.writing = False
        os.close(fd)


async def pooled_rows(conn: Conn, call: PreparedCall, params: Sequence[bytes | None]
                      ) -> list[tuple[Any, ...]]:
    """Every row of ``call`` on a pooled connection the caller holds alone (a checkout), in
    tuples as a cursor loads them; errors as psycopg raises them.

    PERF(pop): the pop's claim went through a cursor and psycopg's wait, whose machinery
    (query conversion, dumpers, the prepared-statement cache, a future and a poll handle made
    and dropped per wait) was most of the front worker's share of its round trip. Here the
    connection keeps a ``Channel`` (made at its first call, again if other input ended it:
    a cursor used the connection since) and a ``Transformer`` for the rows: 159.9k -> 76.5k
    instructions a one-message autoAck claim in the calling process (callgrind, 300 claims
    less 10, ``pop_procs.claim`` on one connection to a local server, uvloop, two runs each:
    158.6-161.3k, 73.6-79.3k). A statement psycopg deallocated behind the flag
    (``PreparedCall.lost``) is prepared again and the call goes again, once. A caller
    cancelled mid-call abandons the call: the connection goes back to the pool with a
    statement in flight, and the pool closes it."""
    try:
        return await _pooled_rows(conn, call, params)
    except psycopg.Error as ex:
        if not call.lost(conn, ex):  # deallocated behind the flag: prepared again, once
            raise
    return await _pooled_rows(conn, call, params)


async def _pooled_rows(conn: Conn, call: PreparedCall, params: Sequence[bytes | None]
                       ) -> list[tuple[Any, ...]]:
    if not call.prepared(conn):
        await call.prepare(conn)
    pgconn = conn.pgconn
    channel: Channel | None = getattr(conn, "_queen_channel", None)
    if channel is None or channel.closed:
        channel = Channel(asyncio.get_running_loop(), conn)
        conn._queen_channel = channel  # type: ignore[attr-defined]
    landed = channel.loop.create_future()
    call.send(conn, params)
    channel.call(partial(_settle, landed))
    try:
        results = await landed
    except asyncio.CancelledError:
        channel.abandon()
        raise
    res = one_result(results, pgconn)
    tx: Transformer | None = getattr(conn, "_queen_transformer", None)
    if tx is None:
        tx = conn._queen_transformer = Transformer(conn)  # type: ignore[attr-defined]
    tx.set_pgresult(res)
    try:
        return tx.load_rows(0, res.ntuples, tuple)
    finally:
        tx.set_pgresult(None)  # no pop's payloads held until the next call


def _settle(landed: asyncio.Future[Any], result: Any) -> None:
    if not landed.done():
        if isinstance(result, BaseException):
            landed.set_exception(result)
        else:
            landed.set_result(result)
