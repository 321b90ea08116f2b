"""Every connection queen-mp opens to PostgreSQL is made here, and pinned durable.

Invariant 1 of the design (an answer of 201/200 means the effect is committed) holds only
with ``synchronous_commit`` on: with it off (a server, database or role default) a commit
returns before its WAL is flushed, and a crash of PostgreSQL loses what the broker already
answered for. So no connection trusts the server's default:

* each one is opened with ``options='-c synchronous_commit=on'`` in its startup packet (the
  client's setting, which outranks ``postgresql.conf``, ``ALTER SYSTEM``, ``ALTER DATABASE``
  and ``ALTER ROLE ... SET``), appended to whatever ``options`` the DSN carries, so ours wins;
* right after connecting it reads ``SHOW synchronous_commit`` back and refuses the connection
  (``NotDurable``, an ``Unavailable``: nothing was sent) unless it says ``on``: a connection
  pooler that drops startup options (PgBouncer's ``ignore_startup_parameters = options``)
  would otherwise leave the server's default in force without a word. One round trip per new
  connection, none per statement.

The same startup packet asks for ``TimeZone=UTC`` (``UTC_OPTION``), for speed only: where a
pooler drops it, times still come back right, in the server's zone.

A server on this host (Unix socket, loopback) is reached with ``gssencmode=disable`` unless the
DSN or ``PGGSSENCMODE`` says otherwise (``local_params``): memory, not behaviour.

The factories: ``connect`` (one asyncio connection), ``connect_blocking`` (a blocking one, for
the migration runner), ``make_pool`` (a psycopg_pool pool: the front workers'), and
``Dedicated``: one long-lived connection of a single sequential user (a shard's bundle writers,
ack fusion, housekeeping, timer firer; the wake NOTIFY sender), made on first use, checked
with ``quiet`` before each use and remade when the server dropped it, each unit of work under a
client-side deadline that cancels the statement server-side and quarantines the connection.
``tests/unit/test_db_boundary.py`` checks that no other module of ``queen_mp`` opens a
connection by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import select
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from queen_mp.db.binarrays import register_arrays
from queen_mp.db.errors import (
    DatabaseError,
    NotDurable,
    StatementError,
    StatementTimeout,
    emit,
    translate,
)

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["DURABLE_OPTIONS", "UTC_OPTION", "Conn", "Dedicated", "connect", "connect_blocking",
           "local_params", "make_pool", "quiet", "session_options", "verify_durable",
           "verify_durable_blocking"]

log = logging.getLogger("queen_mp.db.connect")

Conn = psycopg.AsyncConnection[Any]
T = TypeVar("T")

#: The startup option every connection carries (after the DSN's own ``options``).
DURABLE_OPTIONS = "-c synchronous_commit=on"
#: PERF(db): psycopg loads a timestamptz into the session's zone; named ``UTC`` it is
#: ``datetime.timezone.utc``, any other name a ZoneInfo whose conversion cost 2.8k more
#: instructions a value (a pop loads two a segment). Nothing queen-mp answers depends on the
#: zone: the API renders UTC (wire.times) and the SQL names UTC where it formats a time.
UTC_OPTION = "-c TimeZone=UTC"
_SHOW = "SHOW synchronous_commit"
# NOTE(db): the server-side statement_timeout of a Dedicated connection is a backstop a little
# past the client's deadline, so a statement whose cancel request got lost still ends.
_BACKSTOP_MS = 5000


def session_options(dsn: str, statement_timeout_ms: int | None = None) -> str:
    """The ``options`` of a connection to ``dsn``: the DSN's own, then ours (last wins)."""
    own = ""
    if "options" in dsn:
        with contextlib.suppress(psycopg.Error):  # a malformed DSN: connecting reports it
            own = str(conninfo_to_dict(dsn).get("options") or "")
    ours = f"{DURABLE_OPTIONS} {UTC_OPTION}"
    if statement_timeout_ms:
        ours += f" -c statement_timeout={int(statement_timeout_ms)}"
    return f"{own} {ours}" if own else ours


def _on_this_host(addr: str) -> bool:
    """A libpq host or hostaddr entry that reaches a server on this machine: a Unix socket
    (a directory, an abstract ``@name``, or empty: libpq's default socket) or loopback."""
    if not addr or addr.startswith(("/", "@")) or addr.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False


def local_params(dsn: str) -> dict[str, str]:
    """Connection parameters added to the DSN's: ``gssencmode=disable`` when every host the
    DSN (or libpq's ``PGHOST``/``PGHOSTADDR``) names is a Unix socket or a loopback address
    and neither the DSN nor ``PGGSSENCMODE`` chose a ``gssencmode``; else none.

    PERF(memory): libpq's default ``gssencmode=prefer`` makes every TCP connection look for
    Kerberos credentials first (GSSAPI and krb5 initialised, their configuration read). In a
    forked process those allocations land in free chunks of the heap it shares with the
    supervisor, each write copying a page: a broker at rest (2 workers, 1 shard, over
    127.0.0.1) had 0.34-0.52 MB more Private_Dirty in every process, 1.6 MB in all (its
    ``[heap]``), and a connection 4-9 KB more. Over a Unix socket libpq never tries it; over
    loopback the traffic never leaves the machine, so encryption protects nothing there. A
    server whose ``pg_hba.conf`` accepts loopback connections only by ``hostgssenc`` needs
    ``gssencmode=prefer`` (or ``require``) in the DSN, which is then kept. GSSAPI
    *authentication* (``gss`` in ``pg_hba.conf``) is unaffected."""
    if "PGGSSENCMODE" in os.environ:
        return {}
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:  # a malformed DSN: connecting reports it
        return {}
    if params.get("gssencmode"):
        return {}
    hosts = str(params.get("host") or os.environ.get("PGHOST", "")).split(",")
    addrs = str(params.get("hostaddr") or os.environ.get("PGHOSTADDR", "")).split(",")
    entries = max(len(hosts), len(addrs))
    if all(_on_this_host((addrs[i] if i < len(addrs) else "")
                         or (hosts[i] if i < len(hosts) else "")) for i in range(entries)):
        return {"gssencmode": "disable"}
    return {}


def _check_durable(row: tuple[Any, ...] | None) -> None:
    value = row[0] if row else None
    if isinstance(value, bytes):
        # NOTE(db): psycopg decodes no text of a SQL_ASCII database (initdb's choice under
        # the C locale, as pg_autoctl or a container may run it): say so, not "not durable"
        raise StatementError(
            "the database's encoding is SQL_ASCII, whose text psycopg hands over undecoded:"
            " queen-mp needs a UTF8 database (CREATE DATABASE ... ENCODING 'UTF8', or initdb"
            " under a UTF-8 locale such as LC_ALL=C.UTF-8)")
    if value != "on":
        raise NotDurable(f"the server runs this connection with synchronous_commit={value!r},"
                         " not 'on' although the broker asked for it at connect (a connection"
                         " pooler that drops startup options?): refusing to write through it")


async def verify_durable(conn: Conn) -> None:
    """Raise ``NotDurable`` unless ``conn`` commits with ``synchronous_commit`` on
    (``StatementError`` on a database whose text psycopg cannot decode)."""
    cur = await conn.execute(_SHOW)
    _check_durable(await cur.fetchone())


def verify_durable_blocking(conn: psycopg.Connection[Any]) -> None:
    _check_durable(conn.execute(_SHOW).fetchone())


async def connect(dsn: str, *, application_name: str, statement_timeout_ms: int | None = None,
                  connect_timeout: float | None = None, prepare_threshold: int | None = 5,
                  configure: Callable[[Conn], None] | None = None) -> Conn:
    """An autocommit asyncio connection, pinned and verified durable; errors translated."""
    kwargs: dict[str, Any] = {}
    if connect_timeout is not None:
        kwargs["connect_timeout"] = max(1, int(connect_timeout))
    try:
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name=application_name,
            options=session_options(dsn, statement_timeout_ms),
            prepare_threshold=prepare_threshold, **local_params(dsn), **kwargs)
    except psycopg.Error as ex:
        raise translate(ex) from ex
    try:
        await verify_durable(conn)
        if configure is not None:
            configure(conn)
    except BaseException as ex:
        with contextlib.suppress(Exception):
            await conn.close()
        if isinstance(ex, psycopg.Error):
            raise translate(ex) from ex
        raise
    return conn


def connect_blocking(dsn: str, *, application_name: str, autocommit: bool = True,
                     connect_timeout: float | None = None) -> psycopg.Connection[Any]:
    """A blocking connection (the migration runner's), pinned and verified durable; errors
    translated."""
    kwargs: dict[str, Any] = {}
    if connect_timeout is not None:
        kwargs["connect_timeout"] = max(1, int(connect_timeout))
    try:
        conn = psycopg.connect(dsn, autocommit=autocommit, application_name=application_name,
                               options=session_options(dsn), **local_params(dsn),
                               **kwargs)
    except psycopg.Error as ex:
        raise translate(ex) from ex
    try:
        verify_durable_blocking(conn)
        if not autocommit:
            conn.rollback()  # the SHOW opened a transaction: hand the connection over idle
    except BaseException as ex:
        with contextlib.suppress(Exception):
            conn.close()
        if isinstance(ex, psycopg.Error):
            raise translate(ex) from ex
        raise
    return conn


async def _verify_pooled(conn: Conn) -> None:
    try:
        await verify_durable(conn)
        register_arrays(conn)  # the ephemeral calls' array parameters (db/binarrays.py)
    except BaseException:
        # NOTE(db): psycopg_pool discards a connection its configure callback refused, but
        # leaves it open until garbage collection
        with contextlib.suppress(Exception):
            await conn.close()
        raise


def make_pool(dsn: str, *, application_name: str, min_size: int, max_size: int, name: str,
              timeout: float, reconnect_timeout: float,
              check: Callable[[Conn], Awaitable[None]] | None = None) -> AsyncConnectionPool:
    """An autocommit psycopg_pool pool (not opened) whose every connection is pinned durable
    and verified before the pool hands it out."""
    # PERF(db): imported here: the migration runner's child process needs no pool
    from psycopg_pool import AsyncConnectionPool

    return AsyncConnectionPool(
        dsn, min_size=min_size, max_size=max_size, open=False, timeout=timeout, name=name,
        kwargs={"autocommit": True, "application_name": application_name,
                "options": session_options(dsn), **local_params(dsn)},
        configure=_verify_pooled, check=check, reconnect_timeout=reconnect_timeout)


def quiet(conn: Conn) -> bool:
    """True if an idle connection looks usable: open, not broken, nothing unread on its socket.

    After a PostgreSQL failover (docs/operations.md) every connection to the old primary is
    dead: the backend's exit closed the socket, so an idle connection whose socket is readable
    holds either a message nobody asked for (a FATAL ``terminating connection``, or the end of
    the stream) or, rarely, a harmless notice. One ``select`` with a zero timeout, no round
    trip."""
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


class Dedicated:
    """One connection of its own for a sequential user, made on first use.

    ``run(work)`` hands ``work`` the connection (replaced first if the server closed it while
    idle: a restart, a failover; a new one follows the DSN, so a multi-host DSN with
    ``target_session_attrs=read-write`` finds the current primary). With a statement timeout,
    connecting and ``work`` share one client-side deadline: past it the statement is cancelled
    server-side (out-of-band cancel request) and the connection quarantined, closed and never
    reused while the server may still run the abandoned statement and hold its locks; the
    server's own ``statement_timeout`` is a backstop 5 s later. psycopg errors leave as
    ``queen_mp.db.errors``; a connection they broke is dropped.

    ``session()`` is the same for a long piece of work that keeps session state (an advisory
    lock) across many statements: the block gets the connection with no overall deadline and
    bounds each statement with ``step``.
    """

    def __init__(self, dsn: str, *, application_name: str,
                 statement_timeout_ms: int | None = None, connect_timeout: float | None = None,
                 prepare_threshold: int | None = 5,
                 configure: Callable[[Conn], None] | None = None) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self.timeout_s = statement_timeout_ms / 1000 if statement_timeout_ms else None
        self.connect_timeout = connect_timeout
        self.prepare_threshold = prepare_threshold
        self.configure = configure
        self._conn: Conn | None = None

    def usable(self) -> Conn | None:
        """The connection if it is open and looks usable now (``quiet``), else None."""
        conn = self._conn
        return conn if conn is not None and quiet(conn) else None

    async def _ready(self) -> Conn:
        conn = self.usable()
        if conn is not None:
            return conn
        if self._conn is not None:
            await self.drop()  # closed by the server while idle (restart, failover)
        backstop = (int(self.timeout_s * 1000) + _BACKSTOP_MS) if self.timeout_s else None
        conn = await connect(self.dsn, application_name=self.application_name,
                             statement_timeout_ms=backstop,
                             connect_timeout=self.connect_timeout,
                             prepare_threshold=self.prepare_threshold,
                             configure=self.configure)
        self._conn = conn
        return conn

    async def run(self, work: Callable[[Conn], Awaitable[T]], *,
                  commit_sent: bool = False) -> T:
        """``work(conn)`` within the deadline; ``commit_sent``: ``work``'s statements commit
        themselves, so a connection lost during them leaves the outcome open."""
        try:
            async with asyncio.timeout(self.timeout_s):
                conn = await self._ready()
                return await work(conn)
        except TimeoutError as ex:
            raise await self.overrun() from ex
        except psycopg.Error as ex:
            raise self.failed(ex, commit_sent=commit_sent) from ex
        except OSError as ex:
            await self.drop()
            raise translate(ex, commit_sent=commit_sent) from ex

    @contextlib.asynccontextmanager
    async def session(self, *, commit_sent: bool = False) -> AsyncIterator[Conn]:
        """The connection for a block of ``step``-bounded statements; errors translated."""
        try:
            async with asyncio.timeout(self.timeout_s):
                conn = await self._ready()
        except TimeoutError as ex:
            await self.quarantine()
            raise self._timed_out("connecting") from ex
        try:
            yield conn
        except psycopg.Error as ex:
            if conn.closed or conn.broken:
                await self.drop()
            raise translate(ex, commit_sent=commit_sent) from ex
        except OSError as ex:
            await self.drop()
            raise translate(ex, commit_sent=commit_sent) from ex

    async def step(self, statement: Awaitable[T]) -> T:
        """One statement of a ``session`` block, within the statement deadline."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await statement
        except TimeoutError as ex:
            raise await self.overrun() from ex

    async def overrun(self) -> StatementTimeout:
        """A statement passed its deadline: quarantine the connection; the error to raise."""
        await self.quarantine()
        return self._timed_out("statement")

    def failed(self, ex: psycopg.Error, *, commit_sent: bool = False) -> DatabaseError:
        """psycopg's error of a statement, translated; a connection it broke is forgotten."""
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken):
            self._conn = None
        return translate(ex, commit_sent=commit_sent)

    def _timed_out(self, what: str) -> StatementTimeout:
        emit("statement_timeout")
        if self.timeout_s is None:  # a socket timeout of psycopg's own, no deadline of ours
            return StatementTimeout(f"{what} timed out")
        return StatementTimeout(f"{what} exceeded {self.timeout_s:.1f}s")

    async def quarantine(self) -> None:
        """Cancel whatever the server still runs for the connection, then drop it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        emit("quarantine")
        try:
            await asyncio.wait_for(conn.cancel_safe(), 5)
            emit("cancel_sent")
        except Exception as ex:
            emit("cancel_failed")
            log.warning("%s: cancel request failed: %s", self.application_name, ex)
        with contextlib.suppress(Exception):
            await conn.close()

    async def drop(self) -> None:
        """Close the connection (if any); the next ``run`` makes a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    close = drop
