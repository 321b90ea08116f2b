"""pytest plugin: PostgreSQL for the integration tests, never a skip for want of one.

Registered from the root conftest (`pytest_plugins = ["tests.pgharness"]`) or with
`-p tests.pgharness`. The server comes from, in order:

1. `QUEEN_TEST_DSN`, if set;
2. the local server at 127.0.0.1:5432 as `postgres`, if it answers within 2 s
   (skipped when `QUEEN_TEST_EMBEDDED=1`);
3. a private embedded cluster in a temporary directory, stopped at the end of the session.

Every test database is a fresh `queen_test_<random>` on that server, so parallel sessions and
engineers sharing a server never see each other's data. Migrations are applied for real once
per session, to a template database; each migrated test database is a clone of it (CREATE
DATABASE ... TEMPLATE copies files, many times faster than running the SQL tree again), with the
template's `ALTER DATABASE ... SET` settings, which a clone does not carry, set again.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queen_mp.db import ephemeral_procs
from queen_mp.db.embedded import EmbeddedPostgres
from queen_mp.db.migrations import apply_migrations
from queen_mp.front.ephemeral import render_messages

REPO_ROOT = Path(__file__).resolve().parents[1]
SQL_DIR = REPO_ROOT / "queen_mp" / "sql"
LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def make_temp_dir(prefix: str = "queen-pg-") -> Path:
    """A short, world-searchable temp dir: a cluster's server user must reach into it when
    the tests run as root (pytest's own tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def _answers(dsn: str, timeout: float = 2.0) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, int(timeout))):
            return True
    except psycopg.Error:
        return False


def _with_dbname(dsn: str, dbname: str) -> str:
    return make_conninfo(dsn, dbname=dbname)


def make_database(server_dsn: str, *, template: str | None = None) -> str:
    """Create an empty (or `template`-cloned) `queen_test_<random>` database; return its DSN."""
    name = f"queen_test_{secrets.token_hex(6)}"
    query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template or "template0")
    )
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(query)
    return _with_dbname(server_dsn, name)


def drop_database(server_dsn: str, dsn: str) -> None:
    """Drop the database `dsn` points at, disconnecting whoever still uses it."""
    name = conninfo_to_dict(dsn)["dbname"]
    assert isinstance(name, str) and name.startswith("queen_test_"), name
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def set_statement_timeout(server_dsn: str, dsn: str, ms: int) -> None:
    """Every later connection to the database `dsn` points at runs with `statement_timeout`
    = `ms`: a broker started afterwards then sees a blocked statement fail."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET statement_timeout = {}").format(
            sql.Identifier(name), sql.Literal(ms)))


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """A superuser DSN of the server the session's databases live on."""
    env = os.environ.get("QUEEN_TEST_DSN")
    if env:
        with migrated_template(env):
            yield env
        return
    if os.environ.get("QUEEN_TEST_EMBEDDED") != "1" and _answers(LOCAL_DSN):
        with migrated_template(LOCAL_DSN):
            yield LOCAL_DSN
        return
    base = make_temp_dir()
    server = EmbeddedPostgres(base / "pg", fsync=False)
    try:
        dsn = server.start()
        with migrated_template(dsn):
            yield dsn
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(base, ignore_errors=True)


#: server DSN -> name of the session's migrated template database on that server
_TEMPLATES: dict[str, str] = {}


@contextlib.contextmanager
def migrated_template(server_dsn: str) -> Iterator[None]:
    """While open, `make_migrated_database(server_dsn)` clones one database migrated here."""
    dsn = _migrate_new_database(server_dsn)
    _TEMPLATES[server_dsn] = str(conninfo_to_dict(dsn)["dbname"])
    try:
        yield
    finally:
        del _TEMPLATES[server_dsn]
        drop_database(server_dsn, dsn)


def _migrate_new_database(server_dsn: str) -> str:
    dsn = make_database(server_dsn)
    try:
        apply_migrations(dsn, SQL_DIR)
    except BaseException:
        drop_database(server_dsn, dsn)
        raise
    return dsn


def _clone_database(server_dsn: str, template: str) -> str:
    dsn = make_database(server_dsn, template=template)
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        settings = conn.execute(
            "SELECT unnest(s.setconfig) FROM pg_db_role_setting s JOIN pg_database d"
            " ON d.oid = s.setdatabase WHERE d.datname = %s AND s.setrole = 0", (template,)
        ).fetchall()
        for (setting,) in settings:
            key, value = setting.split("=", 1)
            conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(key), sql.Literal(value)))
    return dsn


def make_migrated_database(server_dsn: str) -> str:
    """A fresh database with `sql/` applied (a clone of the session's template on the session
    server, migrated for real on any other server); return its DSN."""
    template = _TEMPLATES.get(server_dsn)
    if template is None:
        return _migrate_new_database(server_dsn)
    return _clone_database(server_dsn, template)


def wait_for_lock_wait(conn: psycopg.Connection, query_like: str, what: str,
                       timeout_s: float = 10.0) -> None:
    """Return once a backend of ``conn``'s database running a query that contains
    ``query_like`` waits on a lock; fail the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE %s", (f"%{query_like}%",)).fetchone()
        if row is not None and row[0]:
            return
        time.sleep(0.02)
    pytest.fail(what)


@contextlib.contextmanager
def migrated_database(server_dsn: str) -> Iterator[str]:
    """While open, a fresh migrated database (`make_migrated_database`); dropped at exit."""
    dsn = make_migrated_database(server_dsn)
    try:
        yield dsn
    finally:
        drop_database(server_dsn, dsn)


@pytest.fixture(scope="session")
def db_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A migrated database shared by the session's tests (with pytest-xdist, by one worker's:
    the modules that worker runs, in an order that varies from run to run)."""
    with migrated_database(pg_server_dsn) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def module_db_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A migrated database for one test module alone. A module whose rows other modules must
    never meet (placeholder payloads that no route can decode, which failed an unfiltered
    listing of the session database with a 500) takes it as its `db_dsn`:
    `db_dsn = module_db_dsn`; its `db` then connects there too."""
    with migrated_database(pg_server_dsn) as dsn:
        yield dsn


@pytest.fixture
def fresh_db_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A migrated database with no data, for this test alone."""
    with migrated_database(pg_server_dsn) as dsn:
        yield dsn


@pytest.fixture
def db(db_dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the session database."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def private_pg() -> Iterator[EmbeddedPostgres]:
    """A started cluster of this test's own, free to be killed and restarted."""
    base = make_temp_dir()
    server = EmbeddedPostgres(base / "pg", fsync=False)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop(mode="immediate")
        finally:
            shutil.rmtree(base, ignore_errors=True)


def eph_pop(conn: psycopg.Connection, tenant: uuid.UUID, queue: str, partition: str | None,
            group: str, batch: int, auto_ack: bool) -> list[dict[str, Any]]:
    """The messages of one ``queen.eph_pop_v5`` call as the broker renders them."""
    row = conn.execute(ephemeral_procs.POP_SQL, (tenant, queue, partition, group, batch, auto_ack),
                       binary=True).fetchone()
    assert row is not None
    return orjson.loads(render_messages(ephemeral_procs.pop_outcome(row)))
