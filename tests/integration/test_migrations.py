"""The migration runner and error translation against a real server."""

import multiprocessing
import socket

import psycopg
import pytest

from queen_mp.db.errors import (
    Conflict,
    DatabaseError,
    MigrationChecksumError,
    MigrationError,
    OutcomeUnknown,
    StatementError,
    StatementTimeout,
    Unavailable,
    translate,
)
from queen_mp.db.migrations import apply_migrations
from tests.pgharness import drop_database, make_database

# A file exercising what the runner must pass through untouched: several statements, a
# plpgsql $$ body with semicolons, a % that is not a placeholder, quotes.
SCHEMA = """
CREATE SCHEMA IF NOT EXISTS queen;   -- the runner made it already; files must tolerate that
CREATE SCHEMA app;
CREATE TABLE app.applied (file text NOT NULL);
INSERT INTO app.applied VALUES ('001');
CREATE FUNCTION app.pct(n int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s text;
BEGIN
    s := n::text || '%';  -- not a placeholder; it's fine
    RETURN s;
END;
$$;
"""
SECOND = "INSERT INTO app.applied VALUES ('002');"


@pytest.fixture
def empty_db(pg_server_dsn):
    dsn = make_database(pg_server_dsn)
    yield dsn
    drop_database(pg_server_dsn, dsn)


@pytest.fixture
def sql_dir(tmp_path):
    """The schema folder of a SQL tree of the test's own (its root is the parent)."""
    schema = tmp_path / "schema"
    schema.mkdir()
    (schema / "001_schema.sql").write_text(SCHEMA)
    (schema / "002_second.sql").write_text(SECOND)
    return schema


def applied_rows(dsn):
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT version, name, length(checksum) FROM queen.schema_migrations ORDER BY 1"
        ).fetchall()


def test_apply_twice(empty_db, sql_dir):
    assert apply_migrations(empty_db, sql_dir.parent) == ["001_schema.sql", "002_second.sql"]
    assert apply_migrations(empty_db, sql_dir.parent) == []

    assert applied_rows(empty_db) == [(1, "001_schema.sql", 64), (2, "002_second.sql", 64)]
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT app.pct(5)").fetchone() == ("5%",)
        assert conn.execute("SELECT file FROM app.applied ORDER BY 1").fetchall() == [
            ("001",), ("002",)
        ]


def test_new_file_is_applied_later(empty_db, sql_dir):
    apply_migrations(empty_db, sql_dir.parent)
    (sql_dir / "003_third.sql").write_text("INSERT INTO app.applied VALUES ('003');")
    assert apply_migrations(empty_db, sql_dir.parent) == ["003_third.sql"]


def test_empty_set_creates_the_bookkeeping_table(empty_db, tmp_path):
    (tmp_path / "schema").mkdir()
    assert apply_migrations(empty_db, tmp_path) == []
    assert applied_rows(empty_db) == []


def _apply_in_child(dsn, sql_dir, barrier, results):
    barrier.wait()
    try:
        results.put(apply_migrations(dsn, sql_dir))
    except Exception as ex:  # reported to the parent, which fails the test
        results.put(repr(ex))


def test_concurrent_starters_apply_each_file_once(empty_db, sql_dir):
    # NOTE: the sleep holds the lock long enough that every starter queues behind it.
    (sql_dir / "001_schema.sql").write_text(SCHEMA + "SELECT pg_sleep(0.3);")
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_apply_in_child, args=(empty_db, sql_dir.parent, barrier, results))
        for _ in range(3)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=10)

    assert all(isinstance(o, list) for o in outcomes), outcomes
    assert sorted(name for o in outcomes for name in o) == ["001_schema.sql", "002_second.sql"]
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT file FROM app.applied ORDER BY 1").fetchall() == [
            ("001",), ("002",)
        ]


def test_edited_applied_file_refuses_to_start(empty_db, sql_dir):
    apply_migrations(empty_db, sql_dir.parent)
    (sql_dir / "002_second.sql").write_text(SECOND + "\n-- an innocent comment\n")
    (sql_dir / "003_third.sql").write_text("CREATE TABLE app.never ();")

    with pytest.raises(MigrationChecksumError, match=r"002_second\.sql"):
        apply_migrations(empty_db, sql_dir.parent)
    assert [r[0] for r in applied_rows(empty_db)] == [1, 2]  # 003 was not applied


def test_failing_file_rolls_back_alone(empty_db, sql_dir):
    (sql_dir / "002_second.sql").write_text("CREATE TABLE app.half (); SELECT 1/0;")
    with pytest.raises(MigrationError, match=r"002_second\.sql") as info:
        apply_migrations(empty_db, sql_dir.parent)
    assert info.value.sqlstate == "22012"
    assert [r[0] for r in applied_rows(empty_db)] == [1]
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('app.half')").fetchone() == (None,)

    (sql_dir / "002_second.sql").write_text(SECOND)
    assert apply_migrations(empty_db, sql_dir.parent) == ["002_second.sql"]


def test_file_numbered_below_an_applied_one_is_refused(empty_db, sql_dir):
    (sql_dir / "002_second.sql").rename(sql_dir / "005_second.sql")
    apply_migrations(empty_db, sql_dir.parent)
    (sql_dir / "003_forgotten.sql").write_text("CREATE TABLE app.late ();")
    with pytest.raises(MigrationError, match=r"003_forgotten\.sql would apply after 005"):
        apply_migrations(empty_db, sql_dir.parent)


def test_database_newer_than_the_build(empty_db, sql_dir):
    apply_migrations(empty_db, sql_dir.parent)
    (sql_dir / "002_second.sql").unlink()
    with pytest.raises(MigrationError, match=r"002_second\.sql"):
        apply_migrations(empty_db, sql_dir.parent)


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_is_unavailable(sql_dir):
    dsn = f"host=127.0.0.1 port={closed_port()} user=postgres dbname=postgres connect_timeout=2"
    with pytest.raises(Unavailable):
        apply_migrations(dsn, sql_dir.parent)


def test_harness_databases_are_migrated(db, fresh_db_dsn, db_dsn):
    assert fresh_db_dsn != db_dsn
    assert db.execute("SELECT to_regclass('queen.schema_migrations')").fetchone() != (None,)
    with psycopg.connect(fresh_db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM queen.schema_migrations").fetchone() == (
            db.execute("SELECT count(*) FROM queen.schema_migrations").fetchone()
        )


# -- translate() on errors provoked for real ----------------------------------------------------


def caught(fn):
    try:
        fn()
    except psycopg.Error as ex:
        return ex
    raise AssertionError("no error raised")


def test_statement_timeout(empty_db):
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("SET statement_timeout = 10")
        error = translate(caught(lambda: conn.execute("SELECT pg_sleep(1)")))
    assert isinstance(error, StatementTimeout)
    assert error.sqlstate == "57014"


def test_connection_refused():
    error = translate(caught(lambda: psycopg.connect(
        host="127.0.0.1", port=closed_port(), user="postgres", connect_timeout=2
    )))
    assert type(error) is Unavailable


def test_terminated_backend(empty_db):
    with psycopg.connect(empty_db, autocommit=True) as victim, psycopg.connect(
        empty_db, autocommit=True
    ) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
        ex = caught(lambda: victim.execute("SELECT 1"))
    assert type(translate(ex)) is Unavailable
    assert type(translate(ex, commit_sent=True)) is OutcomeUnknown


def test_serialization_failure_and_lock_timeout_are_conflicts(empty_db):
    with psycopg.connect(empty_db, autocommit=True) as setup:
        setup.execute("CREATE TABLE c (id int PRIMARY KEY, v int); INSERT INTO c VALUES (1, 0)")
    with psycopg.connect(empty_db) as a, psycopg.connect(empty_db) as b:
        a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        a.execute("SELECT v FROM c")
        b.execute("UPDATE c SET v = 1 WHERE id = 1")
        b.commit()
        serialization = translate(caught(lambda: a.execute("UPDATE c SET v = 2 WHERE id = 1")))
        a.rollback()

        b.execute("SELECT * FROM c FOR UPDATE")
        a.execute("SET lock_timeout = 20")
        lock_timeout = translate(caught(lambda: a.execute("SELECT * FROM c FOR UPDATE")))
    assert isinstance(serialization, Conflict) and serialization.sqlstate == "40001"
    assert isinstance(lock_timeout, Conflict) and lock_timeout.sqlstate == "55P03"


def test_constraint_violation_is_a_statement_error(empty_db):
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE u (id int PRIMARY KEY); INSERT INTO u VALUES (1)")
        error = translate(caught(lambda: conn.execute("INSERT INTO u VALUES (1)")))
    assert type(error) is StatementError and error.sqlstate == "23505"


def test_translate_without_a_server():
    assert type(translate(psycopg.OperationalError("gone"))) is Unavailable
    assert type(translate(psycopg.OperationalError("gone"), commit_sent=True)) is OutcomeUnknown
    assert type(translate(psycopg.InterfaceError("the connection is closed"))) is Unavailable
    assert type(translate(psycopg.errors.CannotConnectNow())) is Unavailable
    assert type(translate(psycopg.errors.TooManyConnections())) is Unavailable
    assert type(translate(ConnectionResetError())) is Unavailable
    assert type(translate(psycopg.ProgrammingError("bad placeholder"))) is StatementError
    assert type(translate(ValueError("?"))) is DatabaseError
    already = Unavailable("x")
    assert translate(already) is already
