"""The SQL tree: versioned schema files plus one live body per function, and the upgrade of a
database made by the old versioned chain to exactly the state of a fresh one.

The old chain (sql/001 .. sql/135 and the runner that applied it, as of commit bfc65e0) is kept
as a test fixture, ``data/legacy_chain_bfc65e0.tar.gz`` (``git archive --prefix=legacy/
bfc65e0 sql queen_mp/db/migrations.py``); its files' checksums must be the ones the runner
adopts (``queen_mp/sql/legacy_chain.sha256``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import multiprocessing
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

from queen_mp.db.embedded import find_pg_binaries
from queen_mp.db.errors import MigrationError
from queen_mp.db.migrations import apply_migrations, load_sql_tree
from tests.pgharness import SQL_DIR, drop_database, make_database

LEGACY = Path(__file__).parent / "data" / "legacy_chain_bfc65e0.tar.gz"
FUNCTIONS = 134  # functions and trigger functions the family files define


@pytest.fixture(scope="module")
def legacy(tmp_path_factory) -> tuple[Path, ModuleType]:
    """The old chain's SQL folder and its runner, loaded as a module of its own."""
    root = tmp_path_factory.mktemp("legacy")
    with tarfile.open(LEGACY) as tar:
        tar.extractall(root, filter="data")
    path = root / "legacy" / "queen_mp" / "db" / "migrations.py"
    spec = importlib.util.spec_from_file_location("legacy_migrations", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return root / "legacy" / "sql", module


@pytest.fixture
def two_dbs(pg_server_dsn):
    dsns = [make_database(pg_server_dsn), make_database(pg_server_dsn)]
    yield dsns
    for dsn in dsns:
        drop_database(pg_server_dsn, dsn)


def snapshot(dsn: str) -> dict[str, object]:
    """Everything a migration decides, bookkeeping timestamps aside."""
    with psycopg.connect(dsn) as conn:
        state: dict[str, object] = {
            "functions": conn.execute(
                "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid),"
                " obj_description(p.oid, 'pg_proc')"
                " FROM pg_proc p WHERE p.pronamespace = 'queen'::regnamespace ORDER BY 1"
            ).fetchall(),
            "triggers": conn.execute(
                "SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t"
                " JOIN pg_class c ON c.oid = t.tgrelid"
                " WHERE c.relnamespace = 'queen'::regnamespace AND NOT t.tgisinternal"
                " ORDER BY 1"
            ).fetchall(),
            "settings": conn.execute(
                "SELECT key, value::text FROM queen.system_settings ORDER BY 1"
            ).fetchall(),
            "migrations": conn.execute(
                "SELECT version, name, checksum FROM queen.schema_migrations ORDER BY 1"
            ).fetchall(),
            "function_files": conn.execute(
                "SELECT file, checksum FROM queen.schema_functions ORDER BY 1"
            ).fetchall(),
        }
    pg_dump = find_pg_binaries().bin_dir / "pg_dump"
    dump = subprocess.run([str(pg_dump), "--schema-only", "--no-owner", "-d", dsn],
                          capture_output=True, text=True, check=True).stdout
    # pg_dump >= 15.14 brackets its output with a random \restrict key
    state["dump"] = [line for line in dump.splitlines()
                     if not re.match(r"\\(un)?restrict ", line)]
    return state


def test_the_fixture_is_the_chain_the_runner_adopts(legacy):
    sql, _ = legacy
    recorded = (SQL_DIR / "legacy_chain.sha256").read_text().split("\n")
    on_disk = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}"
               for p in sorted(sql.glob("*.sql"))]
    assert on_disk == [line for line in recorded if line]
    assert len(on_disk) == 24


def test_an_old_chain_database_upgrades_to_exactly_a_fresh_one(legacy, two_dbs):
    sql, old_runner = legacy
    upgraded, fresh = two_dbs
    assert len(old_runner.apply_migrations(upgraded, sql)) == 24
    with psycopg.connect(upgraded) as conn:
        before = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'queen'::regnamespace"
        ).fetchone()

    tree = load_sql_tree(SQL_DIR)
    families = [f"functions/{f.filename}" for f in tree.functions]
    # adopted: the old chain's end state is 001's, so only the later schema files run
    later = [m.filename for m in tree.migrations[1:]]
    assert apply_migrations(upgraded, SQL_DIR) == [*later, *families]
    assert apply_migrations(fresh, SQL_DIR) == ["001_baseline.sql", *later, *families]
    assert apply_migrations(upgraded, SQL_DIR) == apply_migrations(fresh, SQL_DIR) == []

    old, new = snapshot(upgraded), snapshot(fresh)
    for key in new:
        assert old[key] == new[key], key
    assert new["migrations"] == [(m.version, m.filename, m.checksum) for m in tree.migrations]
    assert before == (79,)  # the old chain's functions
    assert len(new["functions"]) == FUNCTIONS  # type: ignore[arg-type]


def test_a_database_stopped_inside_the_old_chain_is_refused(legacy, tmp_path, two_dbs):
    sql, old_runner = legacy
    partial = tmp_path / "partial"
    partial.mkdir()
    for path in sorted(sql.glob("*.sql"))[:10]:
        shutil.copy(path, partial)
    old_runner.apply_migrations(two_dbs[0], partial)
    with pytest.raises(MigrationError, match=r"before its end \(missing 070_admin.sql, 075_"):
        apply_migrations(two_dbs[0], SQL_DIR)


def functions_of(dsn: str) -> set[str]:
    """Schema-qualified signatures whatever the role's search_path (the embedded cluster's
    role is ``queen``, whose "$user" path would drop the ``queen.`` of every name)."""
    with psycopg.connect(dsn, options="-c search_path=pg_catalog") as conn:
        return {row[0] for row in conn.execute(
            "SELECT oid::regprocedure::text FROM pg_proc"
            " WHERE pronamespace = 'queen'::regnamespace").fetchall()}


def test_a_changed_family_file_is_reapplied_and_what_no_file_defines_is_dropped(
        tmp_path, two_dbs):
    root = tmp_path / "sql"
    shutil.copytree(SQL_DIR, root)
    dsn = two_dbs[0]
    apply_migrations(dsn, root)
    extra = root / "functions" / "zz_extra.sql"
    extra.write_text("CREATE OR REPLACE FUNCTION queen.extra_v1(p int4) RETURNS int4\n"
                     "LANGUAGE sql IMMUTABLE RETURN p + 1;\n")
    assert apply_migrations(dsn, root) == ["functions/zz_extra.sql"]
    assert "queen.extra_v1(integer)" in functions_of(dsn)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT queen.extra_v1(41)").fetchone() == (42,)

    # a new signature replaces the old one: the old overload is gone, not left behind
    extra.write_text("CREATE OR REPLACE FUNCTION queen.extra_v1(p int8) RETURNS int8\n"
                     "LANGUAGE sql IMMUTABLE RETURN p + 2;\n")
    assert apply_migrations(dsn, root) == ["functions/zz_extra.sql"]
    names = functions_of(dsn)
    assert "queen.extra_v1(bigint)" in names and "queen.extra_v1(integer)" not in names

    extra.unlink()
    assert apply_migrations(dsn, root) == ["functions/zz_extra.sql"]
    assert not any(n.startswith("queen.extra_v1") for n in functions_of(dsn))
    assert len(functions_of(dsn)) == FUNCTIONS
    assert apply_migrations(dsn, root) == []


#: cursors that have something to deliver and are not in the ready index (test_ready_index)
UNLISTED_SQL = """
    SELECT count(*) FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    WHERE (c.ready_at IS NULL OR c.queue_id IS NULL)
      AND GREATEST(c.committed_offset + 1, lp.log_start_offset) <= lp.last_offset"""


def test_an_upgrade_drops_the_ready_trigger_and_the_writers_keep_the_index_true(
        tmp_path, two_dbs):
    """A database migrated with the row trigger that kept the ready index until cons8
    (data/ready_trigger_4f60f65.sql, appended to triggers.sql) and written to under it: the
    upgrade drops the trigger and its function, and from then on the cursor writers
    themselves (log_ready_at_v1) keep every pending cursor listed and clear caught-up ones."""
    from tests.integration.test_sql_push import Seg, pid_of, push, uq

    root = tmp_path / "sql"
    shutil.copytree(SQL_DIR, root)
    triggers = root / "functions" / "triggers.sql"
    old = (Path(__file__).parent / "data" / "ready_trigger_4f60f65.sql").read_text()
    triggers.write_text(triggers.read_text() + old)
    dsn = two_dbs[0]
    apply_migrations(dsn, root)
    names = ("SELECT tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
             " WHERE c.relname = 'log_consumers' AND NOT t.tgisinternal ORDER BY 1")
    with psycopg.connect(dsn, autocommit=True) as db:
        assert [r[0] for r in db.execute(names)] == ["log_consumers_ready_insert",
                                                     "log_consumers_ready_update"]
        q = uq("upg")
        push(db, [Seg(q, "pending", ["a", "b"]), Seg(q, "done", ["c"])])
        pending, done = pid_of(db, q, "pending"), pid_of(db, q, "done")
        # rows as that build's writers left them: queue_id and ready_at from its trigger
        db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group,"
                   " committed_offset) VALUES (%s, 'g', 0), (%s, 'g', 1)", (pending, done))
        flags = "SELECT ready_at IS NOT NULL FROM queen.log_consumers WHERE partition_id = %s"
        assert [db.execute(flags, (p,)).fetchone()[0] for p in (pending, done)] == [True, False]

    assert apply_migrations(dsn, SQL_DIR) == ["functions/triggers.sql"]
    assert "queen.log_consumers_ready()" not in functions_of(dsn)
    assert len(functions_of(dsn)) == FUNCTIONS
    with psycopg.connect(dsn, autocommit=True) as db:
        assert db.execute(names).fetchall() == []
        assert db.execute(UNLISTED_SQL).fetchone()[0] == 0
        push(db, [Seg(q, "done", ["d"], verified=1)])  # the allocator lists the caught-up one
        assert db.execute(flags, (done,)).fetchone()[0] is True
        pop = ("SELECT partition_id, end_off FROM queen.log_pop_v3(%s, %s, %s, NULL, NULL,"
               " 'g', 10, 1, true, 'all', NULL, NULL, 5000) WHERE partition_id IS NOT NULL")
        for part, pid, end in (("pending", pending, 2), ("done", done, 2)):
            assert db.execute(pop, (uuid.UUID(int=0), q, part)).fetchall() == [(pid, end)]
            assert db.execute(flags, (pid,)).fetchone()[0] is False  # caught up: cleared
            assert db.execute(UNLISTED_SQL).fetchone()[0] == 0


def tree_before(tmp_path: Path, first_left_out: str) -> Path:
    """A copy of the SQL tree without the schema file numbered ``first_left_out`` and every
    later one: the tree of the build before that migration, today's function families."""
    root = tmp_path / "sql"
    shutil.copytree(SQL_DIR, root)
    for later in (root / "schema").glob("*.sql"):
        if later.name >= first_left_out:
            later.unlink()
    return root


RENEW_SQL = "SELECT renewed, expires_at IS NOT NULL FROM queen.log_renew_lease_v1(%s, %s, 30)"


def test_an_upgrade_with_live_leases_keeps_them_renewable(tmp_path, two_dbs):
    """A database at schema 013, with leases as that build's pops left them (lease_id on the
    cursors, no log_leases row): 014 lists them, so a live multi-partition lease still renews
    both of its cursors and an expired one is reclaimed; a lease that an older instance issues
    after the upgrade (no row) renews nothing, as an expired one, without an error."""
    from tests.integration.test_sql_push import DEFAULT_TENANT, Seg, pid_of, push, uq

    dsn = two_dbs[0]
    apply_migrations(dsn, tree_before(tmp_path, "014"))
    live, dead, late = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    leased = ("UPDATE queen.log_consumers SET lease_id = %s, worker_id = %s::text,"
              " lease_expires_at = now() + %s * interval '1 second', batch_start = 1,"
              " batch_end = 1, attempt_count = 1"
              " WHERE partition_id = %s AND consumer_group = %s")
    with psycopg.connect(dsn, autocommit=True) as db:
        q = uq("upl")
        push(db, [Seg(q, "a", ["a1"]), Seg(q, "b", ["b1"]), Seg(q, "c", ["c1"])])
        a, b, c = (pid_of(db, q, p) for p in ("a", "b", "c"))
        db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group) VALUES"
                   " (%s, 'g'), (%s, 'g'), (%s, 'g'), (%s, 'h')", (a, b, c, a))
        for lease, secs, pid, group in ((live, 60, a, "g"), (live, 60, b, "g"),
                                        (dead, -1, a, "h")):
            db.execute(leased, (lease, lease, secs, pid, group))

    assert "014_lease_table.sql" in apply_migrations(dsn, SQL_DIR)
    with psycopg.connect(dsn, autocommit=True) as db:
        assert db.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = 'queen'"
                          " AND indexname = 'log_consumers_lease_id_idx'").fetchone() == (0,)
        assert db.execute(RENEW_SQL, (DEFAULT_TENANT, live)).fetchone() == (2, True)
        assert db.execute(RENEW_SQL, (DEFAULT_TENANT, dead)).fetchone() == (0, False)
        db.execute(leased, (late, late, 60, c, "g"))  # an older instance's pop, after 014
        assert db.execute(RENEW_SQL, (DEFAULT_TENANT, late)).fetchone() == (0, False)
        assert db.execute("SELECT queen.lease_reclaim_v1(100)").fetchone() == (2,)
        holders = ("SELECT partition_id, consumer_group FROM queen.log_consumers"
                   " WHERE lease_id IS NOT NULL ORDER BY 1, 2")
        assert db.execute(holders).fetchall() == [(a, "g"), (b, "g"), (c, "g")]
        assert db.execute("SELECT lease_id FROM queen.log_leases").fetchall() == [(live,)]


def test_an_upgrade_keeps_the_retention_of_queues_configured_before_the_switch_acted(
        tmp_path, two_dbs):
    """A database at schema 017, whose queues set retention seconds without retentionEnabled
    (the seconds acted alone then): 018 switches it on for them, so their retention goes on;
    a queue without seconds keeps it off, one with it already on is left as it was."""
    dsn = two_dbs[0]
    apply_migrations(dsn, tree_before(tmp_path, "018"))
    queues = {"ret": (60, 0, False), "done": (0, 60, False), "both": (60, 60, False),
              "none": (0, 0, False), "none_on": (0, 0, True), "on": (60, 0, True)}
    with psycopg.connect(dsn, autocommit=True) as db:
        for name, (ret, done, enabled) in queues.items():
            db.execute("INSERT INTO queen.queues (tenant, name, retention_seconds,"
                       " completed_retention_seconds, retention_enabled, updated_at)"
                       " VALUES (%s, %s, %s, %s, %s, '2026-01-01')",
                       (uuid.UUID(int=0), name, ret, done, enabled))

    assert apply_migrations(dsn, SQL_DIR)[0] == "018_retention_enabled.sql"
    with psycopg.connect(dsn) as db:
        rows = db.execute("SELECT name, retention_enabled, updated_at = '2026-01-01'"
                          " FROM queen.queues ORDER BY name").fetchall()
    assert rows == [("both", True, True), ("done", True, True), ("none", False, True),
                    ("none_on", True, True), ("on", True, True), ("ret", True, True)]


def test_a_failing_family_file_changes_nothing(tmp_path, two_dbs):
    root = tmp_path / "sql"
    shutil.copytree(SQL_DIR, root)
    dsn = two_dbs[0]
    apply_migrations(dsn, root)
    before = snapshot(dsn)
    (root / "functions" / "kv.sql").write_text(
        (SQL_DIR / "functions" / "kv.sql").read_text() + "\nSELECT 1/0;\n")
    (root / "functions" / "aa_first.sql").write_text(
        "CREATE OR REPLACE FUNCTION queen.never_v1() RETURNS int4 LANGUAGE sql RETURN 1;\n")
    with pytest.raises(MigrationError, match=r"functions/kv.sql failed: \[22012\]"):
        apply_migrations(dsn, root)
    assert snapshot(dsn) == before


def _apply_in_child(dsn, barrier, results):
    barrier.wait()
    try:
        results.put(apply_migrations(dsn, SQL_DIR))
    except Exception as ex:  # reported to the parent, which fails the test
        results.put(repr(ex))


def test_instances_starting_at_once_apply_everything_once(two_dbs):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_apply_in_child, args=(two_dbs[0], barrier, results))
             for _ in range(3)]
    for proc in procs:
        proc.start()
    outcomes = sorted((results.get(timeout=60) for _ in procs), key=len)
    for proc in procs:
        proc.join(timeout=30)
    assert outcomes[:2] == [[], []]
    tree = load_sql_tree(SQL_DIR)
    assert outcomes[2] == [*(m.filename for m in tree.migrations),
                           *(f"functions/{f.filename}" for f in tree.functions)]
    assert len(functions_of(two_dbs[0])) == FUNCTIONS
