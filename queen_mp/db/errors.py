"""queen-mp's database errors: what a caller can decide, not what libpq said.

psycopg errors never leave `queen_mp/db`: the boundary turns them into this tree with
`translate`, branching on exception class and SQLSTATE only, never on message text::

    DatabaseError                  base; `sqlstate` is the server's code, or None
     ├── Unavailable               no connection, or lost before the outcome could matter
     │    └── NotDurable           connected, but the server will not run it with
     │                             synchronous_commit on (queen_mp/db/connect.py): not used
     ├── OutcomeUnknown            lost after COMMIT was sent: may or may not be committed
     ├── StatementTimeout          57014: statement_timeout or a cancel; nothing committed
     ├── Conflict                  40001, 40P01, 55P03: lost a race; nothing committed, retry
     ├── MaintenanceOn             QM001: push maintenance refuses writes; nothing committed
     ├── StatementError            the server (or psycopg) refused the statement: a definite
     │                             failure that a retry will not fix
     ├── MigrationError            bad migration set, or a migration file failed
     │    └── MigrationChecksumError   an applied migration file was edited afterwards
     └── EmbeddedPostgresError     the embedded cluster cannot be found, set up or started

A server-reported error (one with a SQLSTATE) means the server answered, so the transaction is
known not to have committed; only a silent connection loss, or a shutdown of the backend, after
COMMIT was sent leaves the outcome open. Callers say which case they are in with `commit_sent`.

The events an operator counts (issue 28: `queen_pg_statement_timeouts_total`,
`queen_pg_cancels_total`, `queen_pg_quarantines_total`) are reported where they happen, to
the process's listener (`on_event`; a process with metrics sets it): "statement_timeout" when a
`StatementTimeout` is made (a client-side deadline, or SQLSTATE 57014 from the server),
"cancel_sent" / "cancel_failed" and "quarantine" from `queen_mp.db.connect.Dedicated.quarantine`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

__all__ = [
    "Conflict",
    "DatabaseError",
    "EmbeddedPostgresError",
    "MaintenanceOn",
    "MigrationChecksumError",
    "MigrationError",
    "NotDurable",
    "OutcomeUnknown",
    "StatementError",
    "StatementTimeout",
    "Unavailable",
    "emit",
    "on_event",
    "translate",
]

_listener: Callable[[str], None] | None = None


def on_event(listener: Callable[[str], None] | None) -> None:
    """Report this process's database events (module docstring) to ``listener``."""
    global _listener
    _listener = listener


def emit(event: str) -> None:
    """Tell the listener (if any) that ``event`` happened; never raises into the caller."""
    listener = _listener
    if listener is not None:
        # NOTE(db): a metrics failure must not turn into (or hide) a database error
        with contextlib.suppress(Exception):
            listener(event)


class DatabaseError(Exception):
    """Base of every database error raised out of `queen_mp/db`."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class Unavailable(DatabaseError):
    """No usable connection; nothing was committed, so the work may be retried or spooled."""


class NotDurable(Unavailable):
    """A new connection does not run with ``synchronous_commit`` on although it asked for it:
    refused before anything was sent on it, so its user is told there is no connection."""


class OutcomeUnknown(DatabaseError):
    """The connection died after COMMIT was sent: the effect may or may not be durable."""


class StatementTimeout(DatabaseError):
    """The server cancelled the statement (statement_timeout or cancel); nothing committed."""


class Conflict(DatabaseError):
    """Serialization failure, deadlock or lock timeout; nothing committed, a retry may pass."""


class MaintenanceOn(DatabaseError):
    """QM001 from queen.require_writable_v1: push maintenance is on; nothing was written."""


class StatementError(DatabaseError):
    """The statement was refused for a reason a retry will not fix (bug, constraint, data)."""


class MigrationError(DatabaseError):
    """The migration set is invalid or a migration failed; the broker must not start."""


class MigrationChecksumError(MigrationError):
    """An already applied migration file has changed since it was applied."""


class EmbeddedPostgresError(DatabaseError):
    """The embedded PostgreSQL cluster could not be found, initialised, started or stopped."""


# NOTE(db): SQLSTATE classes and codes, per the PostgreSQL "Error Codes" appendix.
_CONNECTION_CLASS = "08"  # connection_exception family
_RESOURCES_CLASS = "53"  # insufficient_resources: too_many_connections, disk_full, ...
_LOST_BACKEND = frozenset({"57P01", "57P02", "57P05"})  # admin/crash shutdown, idle timeout
_CANNOT_CONNECT_NOW = "57P03"
_IDLE_IN_TX_TIMEOUT = "25P03"
_QUERY_CANCELED = "57014"
_CONFLICTS = frozenset({"40001", "40P01", "55P03"})
_MAINTENANCE = "QM001"  # queen.require_writable_v1


def translate(exc: BaseException, *, commit_sent: bool = False) -> DatabaseError:
    """Map a psycopg (or socket) error to queen-mp's tree; use as `raise translate(ex) from ex`.

    `commit_sent` tells whether COMMIT (or an autocommit statement with effects) had been sent
    when the error arrived: a lost connection then becomes `OutcomeUnknown`, not `Unavailable`.
    """
    if isinstance(exc, DatabaseError):
        return exc
    # PERF(db): imported here so that the error tree alone (the supervisor's, through
    # queen_mp.db.embedded) does not load psycopg, 21 MB of RSS; psycopg is already loaded
    # wherever a psycopg error can occur.
    import psycopg

    message = str(exc) or type(exc).__name__
    lost = OutcomeUnknown if commit_sent else Unavailable
    if isinstance(exc, psycopg.Error):
        sqlstate = exc.sqlstate
        if sqlstate is None:
            # NOTE(db): no SQLSTATE means the server never answered: refused or broken
            # connection, pool timeout (OperationalError) or a closed connection object
            # (InterfaceError). Anything else without a code is a client-side refusal.
            if isinstance(exc, psycopg.OperationalError):
                return lost(message)
            if isinstance(exc, psycopg.InterfaceError):
                return Unavailable(message)
            return StatementError(message)
        if isinstance(exc, psycopg.errors.QueryCanceled):
            emit("statement_timeout")
            return StatementTimeout(message, sqlstate=sqlstate)
        if sqlstate in _CONFLICTS:
            return Conflict(message, sqlstate=sqlstate)
        if sqlstate == _MAINTENANCE:
            return MaintenanceOn(message, sqlstate=sqlstate)
        if sqlstate == _CANNOT_CONNECT_NOW:
            return Unavailable(message, sqlstate=sqlstate)
        if sqlstate in _LOST_BACKEND or sqlstate.startswith(_CONNECTION_CLASS):
            return lost(message, sqlstate=sqlstate)
        if sqlstate == _IDLE_IN_TX_TIMEOUT or sqlstate.startswith(_RESOURCES_CLASS):
            return Unavailable(message, sqlstate=sqlstate)
        return StatementError(message, sqlstate=sqlstate)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return lost(message)
    return DatabaseError(message)
