"""Schema migrations and stored functions: bring a database up to this build, across instances.

The SQL tree (package data, ``queen_mp/sql/``) holds two kinds of files:

- ``schema/NNN_name.sql``: tables, indexes, column comments and seed rows. Versioned,
  checksummed, applied once each in number order and never edited once landed (an edited
  applied file stops the boot). Each runs in its own transaction with its bookkeeping row in
  ``queen.schema_migrations``, so a crash leaves the database at a file boundary.
- ``functions/<family>.sql``: the one live body of every function of a family (push, pop,
  ack, ...), and the triggers that bind trigger functions to tables, all as ``CREATE OR
  REPLACE``. Whenever a schema file was applied or any family file's checksum differs from
  ``queen.schema_functions``, every family file is re-applied in ONE transaction, and every
  function or trigger of schema ``queen`` that this transaction did not (re)create is dropped:
  the database then holds exactly the functions the files define, whatever it held before.

Several ``queen-mp serve`` instances may start at once over one database, so the runner takes
a session advisory lock before it even looks at the bookkeeping: starters serialize, and
whoever comes second finds the work done.

Databases made by the versioned chain that preceded this layout (``sql/001`` .. ``sql/135``,
whose checksums ``legacy_chain.sha256`` records) are adopted: when every file of that chain is
recorded as applied, unchanged, the chain's rows are replaced by the baseline's row (the
baseline is that chain's end state, functions aside) and the functions are re-applied. A
database stopped part-way through the old chain is refused, with the reason.

A file is sent as one simple-protocol query (psycopg does so for a statement without
parameters), which allows several statements and ``$$`` bodies. A file must therefore not
contain its own BEGIN/COMMIT, nor statements that refuse to run inside a transaction (CREATE
INDEX CONCURRENTLY, VACUUM). A schema file must not call ``queen`` functions: they are
(re)applied after the schema files. Function bodies are applied with
``check_function_bodies = off`` (as pg_restore does), so the families may be applied in any
order; the test suite is what checks a body.

``queen-mp serve`` runs this module as a child process (``main``), so that the long-lived
supervisor never loads psycopg.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg

from queen_mp.db.connect import connect_blocking
from queen_mp.db.errors import (
    DatabaseError,
    MigrationChecksumError,
    MigrationError,
    OutcomeUnknown,
    Unavailable,
    translate,
)

__all__ = [
    "MIGRATION_LOCK_KEY",
    "FunctionFile",
    "Migration",
    "SqlTree",
    "apply_migrations",
    "load_migrations",
    "load_sql_tree",
    "main",
    "package_sql_root",
]

# NOTE(db): fixed key of pg_advisory_lock(bigint); the first 8 bytes of
# sha256(b"queen-mp:migrations") as a signed integer. Changing it lets an old and a new
# build migrate at the same time.
MIGRATION_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"queen-mp:migrations").digest()[:8], "big", signed=True
)

_FILE_RE = re.compile(r"^(?P<version>\d{3,})_(?P<name>[A-Za-z0-9][A-Za-z0-9_-]*)\.sql$")
_FAMILY_RE = re.compile(r"^[a-z][a-z0-9_]*\.sql$")
_LEGACY_LIST = "legacy_chain.sha256"

_BOOTSTRAP_SQL = """
CREATE SCHEMA IF NOT EXISTS queen;
CREATE TABLE IF NOT EXISTS queen.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS queen.schema_functions (
    file       text PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""

# NOTE(db): what the family files did not (re)create in this transaction is stale. CREATE OR
# REPLACE rewrites a function's (or trigger's) catalog row even when nothing changed, so the
# row's xmin is this transaction's id exactly when a file defined it; xmin is 32 bits, the
# current id is compared modulo 2^32. Triggers first: a stale trigger holds its function.
_STALE_TRIGGERS_SQL = """
SELECT format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'queen'::regnamespace AND NOT t.tgisinternal
  AND t.xmin::text::int8 <> pg_current_xact_id()::text::int8 % 4294967296
ORDER BY 1
"""
_STALE_FUNCTIONS_SQL = """
SELECT format('DROP %s %s', CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
              p.oid::regprocedure)
FROM pg_proc p
WHERE p.pronamespace = 'queen'::regnamespace
  AND p.xmin::text::int8 <> pg_current_xact_id()::text::int8 % 4294967296
ORDER BY 1
"""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned schema file as found in the tree."""

    version: int
    filename: str
    checksum: str  # sha256 hex of the file's bytes
    sql: str


@dataclass(frozen=True, slots=True)
class FunctionFile:
    """One function family file: the current bodies of its functions."""

    filename: str
    checksum: str
    sql: str


@dataclass(frozen=True, slots=True)
class SqlTree:
    """The whole SQL of a build, validated before any database is touched."""

    migrations: tuple[Migration, ...]
    functions: tuple[FunctionFile, ...]
    legacy: tuple[tuple[int, str, str], ...]  # (version, filename, sha256) of the old chain


def package_sql_root() -> Traversable:
    """The SQL tree shipped inside the package (a source checkout and a wheel alike)."""
    return resources.files("queen_mp") / "sql"


def _read(path: Traversable) -> tuple[str, str]:
    """The file's text and the sha256 hex of its bytes."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
    except UnicodeDecodeError as ex:
        raise MigrationError(f"{path.name} is not valid UTF-8: {ex}") from ex


def _sql_files(folder: Traversable) -> list[Traversable]:
    return sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)


def load_migrations(schema_dir: Traversable | Path) -> list[Migration]:
    """Read and validate the versioned schema files, so a bad set fails before touching the
    database.

    Every ``*.sql`` file must be named ``NNN_name.sql`` with a number of its own; numbers may
    be sparse. Other files (README, notes) are ignored.
    """
    if not schema_dir.is_dir():
        raise MigrationError(f"migration directory {schema_dir} does not exist")
    found: dict[int, Migration] = {}
    for path in _sql_files(schema_dir):
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
        text, checksum = _read(path)
        found[version] = Migration(version, path.name, checksum, text)
    return [found[v] for v in sorted(found)]


def load_sql_tree(root: Traversable | Path) -> SqlTree:
    """Read ``schema/``, ``functions/`` and the old chain's checksums under ``root``."""
    if not root.is_dir():
        raise MigrationError(f"SQL directory {root} does not exist")
    migrations = load_migrations(root / "schema")
    functions: list[FunctionFile] = []
    folder = root / "functions"
    for path in _sql_files(folder) if folder.is_dir() else []:
        if _FAMILY_RE.match(path.name) is None:
            raise MigrationError(f"{path}: function files must be named family.sql (a-z, 0-9, _)")
        text, checksum = _read(path)
        functions.append(FunctionFile(path.name, checksum, text))
    legacy: list[tuple[int, str, str]] = []
    listing = root / _LEGACY_LIST
    if listing.is_file():
        for line in _read(listing)[0].splitlines():
            checksum, _, filename = line.partition("  ")
            match = _FILE_RE.match(filename)
            if match is None or len(checksum) != 64:
                raise MigrationError(f"{_LEGACY_LIST}: malformed line {line!r}")
            legacy.append((int(match["version"]), filename, checksum))
    return SqlTree(tuple(migrations), tuple(functions), tuple(legacy))


def apply_migrations(
    dsn: str, root: Traversable | Path | None = None, *, log: logging.Logger | None = None
) -> list[str]:
    """Bring the database at ``dsn`` up to the SQL tree at ``root`` (default: the package's);
    return what this call applied: schema file names, then ``functions/<file>`` names.

    Raises ``MigrationChecksumError`` if an applied schema file was edited, ``MigrationError``
    for an invalid tree, a failing file or a database newer than this build, and another
    ``DatabaseError`` (e.g. ``Unavailable``) if PostgreSQL cannot be reached.
    """
    log = log or _log
    tree = load_sql_tree(package_sql_root() if root is None else root)
    try:
        with connect_blocking(dsn, application_name="queen-mp migrations") as conn:
            # NOTE(db): session lock, held across the per-file transactions and released when
            # the connection closes, even if this process dies.
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            conn.execute(_BOOTSTRAP_SQL, prepare=False)
            _adopt_legacy_chain(conn, tree, log)
            done = _apply_schema(conn, tree.migrations, log)
            return done + _apply_functions(conn, tree.functions, force=bool(done), log=log)
    except psycopg.Error as ex:
        raise translate(ex) from ex


def _adopt_legacy_chain(conn: psycopg.Connection, tree: SqlTree, log: logging.Logger) -> None:
    """Replace the rows of a complete old chain by the baseline's row (see the module doc)."""
    if not tree.legacy or not tree.migrations:
        return
    rows = conn.execute(
        "SELECT version, name, checksum FROM queen.schema_migrations ORDER BY version"
    ).fetchall()
    applied = {(v, n, c) for v, n, c in rows}
    legacy = set(tree.legacy)
    if not applied & legacy:
        return
    if applied != legacy:
        missing = sorted(n for _, n, _ in legacy - applied)
        raise MigrationError(
            "the database was made by queen-mp's old migration chain and stopped before its "
            f"end (missing {', '.join(missing)}), or an old file was edited: finish it with "
            "the build of commit bfc65e0, then start this build"
        )
    baseline = tree.migrations[0]
    log.info("adopting the old migration chain (%d files) as %s", len(legacy), baseline.filename)
    with conn.transaction():
        conn.execute("DELETE FROM queen.schema_migrations")
        conn.execute(
            "INSERT INTO queen.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
            (baseline.version, baseline.filename, baseline.checksum),
        )


def _apply_schema(
    conn: psycopg.Connection, migrations: tuple[Migration, ...], log: logging.Logger
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
        _run_in_transaction(
            conn, migration.filename, migration.sql,
            "INSERT INTO queen.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
            (migration.version, migration.filename, migration.checksum),
        )
        done.append(migration.filename)
    return done


def _apply_functions(
    conn: psycopg.Connection, functions: tuple[FunctionFile, ...], *, force: bool,
    log: logging.Logger,
) -> list[str]:
    """Re-apply every family file in one transaction when any differs from what the database
    records (or a schema file was just applied), then drop what no file defines."""
    recorded = dict(conn.execute("SELECT file, checksum FROM queen.schema_functions").fetchall())
    wanted = {f.filename: f.checksum for f in functions}
    if not force and recorded == wanted:
        return []
    changed = [f"functions/{name}" for name in sorted(set(recorded) | set(wanted))
               if recorded.get(name) != wanted.get(name)]
    log.info("applying function files: %s", ", ".join(changed) or "(all, unchanged)")
    try:
        with conn.transaction():
            conn.execute("SET LOCAL check_function_bodies = off")
            for family in functions:
                try:
                    conn.execute(family.sql, prepare=False)  # type: ignore[arg-type]
                except psycopg.Error as ex:
                    raise _FileFailed(family.filename, ex) from ex
            for query in (_STALE_TRIGGERS_SQL, _STALE_FUNCTIONS_SQL):
                for (drop,) in conn.execute(query).fetchall():
                    log.info("dropping what no function file defines: %s", drop)
                    conn.execute(drop)
            conn.execute("DELETE FROM queen.schema_functions")
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO queen.schema_functions (file, checksum) VALUES (%s, %s)",
                    list(wanted.items()),
                )
    except _FileFailed as failed:
        raise _file_error(f"functions/{failed.filename}", failed.error) from failed.error
    except psycopg.Error as ex:
        raise _file_error("the function files", ex) from ex
    return changed


class _FileFailed(Exception):
    def __init__(self, filename: str, error: psycopg.Error) -> None:
        super().__init__(filename)
        self.filename = filename
        self.error = error


def _run_in_transaction(
    conn: psycopg.Connection, filename: str, sql: str, record: str, params: tuple[object, ...]
) -> None:
    try:
        with conn.transaction():
            conn.execute(sql, prepare=False)  # type: ignore[arg-type]
            conn.execute(record, params)  # type: ignore[arg-type]
    except psycopg.Error as ex:
        raise _file_error(filename, ex) from ex


def _file_error(what: str, ex: psycopg.Error) -> DatabaseError:
    error = translate(ex)
    if isinstance(error, (Unavailable, OutcomeUnknown)):
        return error  # connection trouble, not the file's fault
    return MigrationError(f"{what} failed: [{ex.sqlstate}] {ex}", sqlstate=ex.sqlstate)


def main(argv: list[str] | None = None) -> int:
    """``python -m queen_mp.db.migrations SQL_ROOT LOG_LEVEL``, the DSN on stdin (not in argv,
    where ``ps`` shows a password): the supervisor's migration step.

    A second stdin line, if any, is the instance's key registration (queen_mp/db/key_procs.py),
    done after the migrations in this same short-lived process; its answer is printed last as
    ``keys <JSON>``.

    Logs to stderr; prints what it applied, one a line, and exits 0, or prints the error's
    class and message and exits 1.
    """
    from queen_mp.logs import configure_logging

    argv = sys.argv if argv is None else argv
    configure_logging(argv[2])
    dsn, _, keys_request = sys.stdin.read().strip().partition("\n")
    try:
        # the logger's name as when imported: under -m, __name__ is "__main__"
        applied = apply_migrations(dsn.strip(), Path(argv[1]),
                                   log=logging.getLogger("queen_mp.db.migrations"))
        keys = None
        if keys_request.strip():
            from queen_mp.db.key_procs import register_request

            keys = register_request(dsn.strip(), keys_request)
    except DatabaseError as ex:
        print(f"{type(ex).__name__}: {ex}")
        return 1
    for name in applied:
        print(name)
    if keys is not None:
        print(f"keys {keys}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
