"""Schema migrations: apply `sql/NNN_name.sql` files once each, in order, across instances.

Several `queen-mp serve` instances may start at once over one database, so the runner takes a
session advisory lock before it even looks at `queen.schema_migrations`: starters serialize,
and whoever comes second finds the work done. Each file runs in its own transaction together
with its bookkeeping row, so a crash leaves the database at a file boundary.

A file is sent as one simple-protocol query (psycopg does so for a statement without
parameters), which allows several statements and `$$` function bodies. A file must therefore
not contain its own BEGIN/COMMIT, nor statements that refuse to run inside a transaction
(CREATE INDEX CONCURRENTLY, ALTER TYPE ... ADD VALUE before PostgreSQL 12, VACUUM).

`queen-mp serve` runs this module as a child process (`main`), so that the long-lived
supervisor never loads psycopg.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

from queen_mp.db.errors import (
    DatabaseError,
    MigrationChecksumError,
    MigrationError,
    OutcomeUnknown,
    Unavailable,
    translate,
)

__all__ = ["MIGRATION_LOCK_KEY", "Migration", "apply_migrations", "load_migrations", "main"]

# NOTE(db): fixed key of pg_advisory_lock(bigint); the first 8 bytes of
# sha256(b"queen-mp:migrations") as a signed integer. Changing it lets an old and a new
# build migrate at the same time.
MIGRATION_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"queen-mp:migrations").digest()[:8], "big", signed=True
)

_FILE_RE = re.compile(r"^(?P<version>\d{3,})_(?P<name>[A-Za-z0-9][A-Za-z0-9_-]*)\.sql$")

_BOOTSTRAP_SQL = """
CREATE SCHEMA IF NOT EXISTS queen;
CREATE TABLE IF NOT EXISTS queen.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file as found on disk."""

    version: int
    filename: str
    checksum: str  # sha256 hex of the file's bytes
    sql: str


def load_migrations(sql_dir: Path) -> list[Migration]:
    """Read and validate the migration set, so a bad set fails before touching the database.

    Every `*.sql` file must be named `NNN_name.sql` with a number of its own; numbers may be
    sparse (001, 010, 020) to group families. Other files (README, notes) are ignored.
    """
    if not sql_dir.is_dir():
        raise MigrationError(f"migration directory {sql_dir} does not exist")
    found: dict[int, Migration] = {}
    for path in sorted(sql_dir.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match is None:
            raise MigrationError(
                f"{path}: migration files must be named NNN_name.sql (letters, digits, _ and -)"
            )
        version = int(match["version"])
        if version in found:
            raise MigrationError(
                f"{path.name} and {found[version].filename} share migration number {version}"
            )
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as ex:
            raise MigrationError(f"{path.name} is not valid UTF-8: {ex}") from ex
        found[version] = Migration(version, path.name, hashlib.sha256(data).hexdigest(), text)
    return [found[v] for v in sorted(found)]


def apply_migrations(
    dsn: str, sql_dir: Path, *, log: logging.Logger | None = None
) -> list[str]:
    """Bring the database at `dsn` up to `sql_dir`; return the file names applied by this call.

    Raises `MigrationChecksumError` if an applied file was edited, `MigrationError` for an
    invalid set, a failing file or a database newer than this build, and another
    `DatabaseError` (e.g. `Unavailable`) if PostgreSQL cannot be reached.
    """
    log = log or _log
    migrations = load_migrations(sql_dir)
    try:
        with psycopg.connect(
            dsn, autocommit=True, application_name="queen-mp migrations"
        ) as conn:
            # NOTE(db): session lock, held across the per-file transactions and released when
            # the connection closes, even if this process dies.
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            conn.execute(_BOOTSTRAP_SQL, prepare=False)
            return _apply_locked(conn, migrations, log)
    except psycopg.Error as ex:
        raise translate(ex) from ex


def _apply_locked(
    conn: psycopg.Connection, migrations: list[Migration], log: logging.Logger
) -> list[str]:
    rows = conn.execute(
        "SELECT version, name, checksum FROM queen.schema_migrations ORDER BY version"
    ).fetchall()
    applied = {version: (name, checksum) for version, name, checksum in rows}
    known = {m.version for m in migrations}
    unknown = sorted(set(applied) - known)
    if unknown:
        names = ", ".join(applied[v][0] for v in unknown)
        raise MigrationError(
            f"the database has migrations this build does not know ({names}): "
            "refusing to run older code against a newer schema"
        )
    # NOTE(db): a file numbered below one already applied would run out of order (and on
    # some databases only): a hole in the applied history, refused like an edited file.
    newest = max(applied, default=0)
    late = [m.filename for m in migrations if m.version not in applied and m.version < newest]
    if late:
        raise MigrationError(
            f"{', '.join(late)} would apply after {applied[newest][0]}, which is already applied: "
            "number new migrations above every applied one"
        )
    done: list[str] = []
    for migration in migrations:
        if migration.version in applied:
            name, checksum = applied[migration.version]
            if checksum != migration.checksum:
                raise MigrationChecksumError(
                    f"{migration.filename} changed after it was applied "
                    f"(applied sha256 {checksum}, file sha256 {migration.checksum}); "
                    "add a new migration instead of editing an applied one"
                )
            if name != migration.filename:
                raise MigrationError(
                    f"migration {migration.version} was applied as {name} "
                    f"but the file is now {migration.filename}"
                )
            continue
        log.info("applying migration %s", migration.filename)
        try:
            with conn.transaction():
                conn.execute(migration.sql, prepare=False)  # type: ignore[arg-type]
                conn.execute(
                    "INSERT INTO queen.schema_migrations (version, name, checksum)"
                    " VALUES (%s, %s, %s)",
                    (migration.version, migration.filename, migration.checksum),
                )
        except psycopg.Error as ex:
            error = translate(ex)
            if isinstance(error, (Unavailable, OutcomeUnknown)):
                raise error from ex  # connection trouble, not the file's fault
            raise MigrationError(
                f"{migration.filename} failed: [{ex.sqlstate}] {ex}", sqlstate=ex.sqlstate
            ) from ex
        done.append(migration.filename)
    return done


def main(argv: list[str] | None = None) -> int:
    """``python -m queen_mp.db.migrations SQL_DIR LOG_LEVEL``, the DSN on stdin (not in argv,
    where ``ps`` shows a password): the supervisor's migration step.

    Logs to stderr; prints the applied file names, one a line, and exits 0, or prints the
    error's class and message and exits 1.
    """
    from queen_mp.cli import configure_logging  # click: for the child process only

    argv = sys.argv if argv is None else argv
    configure_logging(argv[2])
    try:
        # the logger's name as when imported: under -m, __name__ is "__main__"
        applied = apply_migrations(sys.stdin.read().strip(), Path(argv[1]),
                                   log=logging.getLogger("queen_mp.db.migrations"))
    except DatabaseError as ex:
        print(f"{type(ex).__name__}: {ex}")
        return 1
    for name in applied:
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
