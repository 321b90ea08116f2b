"""The migration set is validated on disk before any database is touched."""

import hashlib

import pytest

from queen_mp.db.errors import DatabaseError, MigrationChecksumError, MigrationError
from queen_mp.db.migrations import MIGRATION_LOCK_KEY, load_migrations


def write(path, text):
    path.write_text(text)
    return path


def test_sorted_by_number_with_sha256_of_bytes(tmp_path):
    write(tmp_path / "010_ten.sql", "select 10;")
    for n in range(1, 10):
        write(tmp_path / f"{n:03d}_m{n}.sql", f"select {n};")
    write(tmp_path / "README.md", "not a migration")

    migrations = load_migrations(tmp_path)

    assert [m.version for m in migrations] == list(range(1, 11))
    assert migrations[-1].filename == "010_ten.sql"
    assert migrations[0].checksum == hashlib.sha256(b"select 1;").hexdigest()
    assert migrations[0].sql == "select 1;"


def test_sparse_numbers_group_families(tmp_path):
    for name in ("001_schema.sql", "010_push.sql", "020_system.sql"):
        write(tmp_path / name, "select 1;")
    assert [m.version for m in load_migrations(tmp_path)] == [1, 10, 20]


def test_empty_directory_is_an_empty_set(tmp_path):
    assert load_migrations(tmp_path) == []


def test_checksum_changes_with_any_byte(tmp_path):
    path = write(tmp_path / "001_a.sql", "select 1;\n")
    before = load_migrations(tmp_path)[0].checksum
    path.write_text("select 1; \n")
    assert load_migrations(tmp_path)[0].checksum != before


@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        (["001_a.sql", "001_b.sql"], "share migration number 1"),  # duplicate
        (["001_a.sql", "0001_b.sql"], "share migration number 1"),  # duplicate, other width
        (["001_a.sql", "2_b.sql"], "2_b.sql"),  # bad name
        (["001_a.sql", "002 b.sql"], "002 b.sql"),  # bad name
    ],
)
def test_invalid_sets_are_refused(tmp_path, names, fragment):
    for name in names:
        write(tmp_path / name, "select 1;")
    with pytest.raises(MigrationError, match=fragment):
        load_migrations(tmp_path)


def test_missing_directory(tmp_path):
    with pytest.raises(MigrationError, match="does not exist"):
        load_migrations(tmp_path / "nope")


def test_non_utf8_file(tmp_path):
    (tmp_path / "001_a.sql").write_bytes(b"select '\xff';")
    with pytest.raises(MigrationError, match="UTF-8"):
        load_migrations(tmp_path)


def test_error_tree():
    assert issubclass(MigrationChecksumError, MigrationError)
    assert issubclass(MigrationError, DatabaseError)
    assert -(2**63) <= MIGRATION_LOCK_KEY < 2**63


def test_supervisor_halts_the_boot_when_the_migration_child_fails(tmp_path, monkeypatch):
    # the supervisor migrates in a child process (queen_mp.db.migrations.main); its failure
    # must still stop the boot with the error's message and the boot-error exit code
    from queen_mp.config import Config
    from queen_mp.processes.supervisor import EXIT_BOOT_ERROR, HaltServer, Supervisor

    monkeypatch.setattr("queen_mp.processes.supervisor.sql_dir", lambda: tmp_path / "nope")
    with pytest.raises(HaltServer) as halt:
        Supervisor(Config.load(env={})).migrate()
    assert halt.value.exit_status == EXIT_BOOT_ERROR
    assert halt.value.reason == (f"migrations failed: MigrationError: SQL directory "
                                 f"{tmp_path / 'nope'} does not exist")


def test_the_package_tree_has_one_live_body_per_function():
    """Each function is created in exactly one family file, schema files create none, and
    every family file replaces rather than creates (it is re-applied over itself)."""
    import re

    from queen_mp.db.migrations import load_sql_tree, package_sql_root

    tree = load_sql_tree(package_sql_root())
    create = re.compile(r"^CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+(queen\.\w+)", re.I | re.M)
    homes: dict[str, list[str]] = {}
    for family in tree.functions:
        for match in create.finditer(family.sql):
            assert match[1], f"{family.filename}: CREATE FUNCTION {match[2]} without OR REPLACE"
            homes.setdefault(match[2], []).append(family.filename)
        assert not re.search(r"^CREATE\s+TRIGGER", family.sql, re.I | re.M), family.filename
    assert {name: files for name, files in homes.items() if len(files) > 1} == {}
    assert len(homes) == 134
    for migration in tree.migrations:
        assert not create.search(migration.sql), migration.filename
    assert [m.filename for m in tree.migrations] == [
        "001_baseline.sql", "002_ready_index.sql", "003_traces.sql", "004_reads.sql",
        "005_keys.sql", "006_streams.sql", "007_cursors_cascade.sql", "008_ephemeral.sql",
        "009_ephemeral_rows.sql", "010_spool_holds.sql", "011_ephemeral_chunks.sql",
        "012_ephemeral_uncompressed.sql", "013_ephemeral_leases_inline.sql",
        "014_lease_table.sql", "015_ephemeral_bodies.sql", "016_pop_queue_options.sql",
        "018_retention_enabled.sql", "019_claim_record_base.sql"]
    assert len(tree.legacy) == 24
