"""EmbeddedPostgres against the real server binaries (as root on CI machines)."""

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from queen_mp.db.embedded import EmbeddedPostgres, find_pg_binaries, socket_dir_for
from queen_mp.db.errors import EmbeddedPostgresError
from tests.pgharness import make_temp_dir

IS_ROOT = os.geteuid() == 0


@pytest.fixture
def base():
    path = make_temp_dir()
    clusters = []
    yield path, clusters
    for cluster in clusters:
        cluster.stop(mode="immediate")
    shutil.rmtree(path, ignore_errors=True)


def new_cluster(base, name="pg", **kwargs):
    path, clusters = base
    cluster = EmbeddedPostgres(path / name, fsync=False, **kwargs)
    clusters.append(cluster)
    return cluster


def proc_uid(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def children_of(pid):
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids, timeout=10.0):
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still alive: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


def test_start_query_stop_leaves_nothing_running(base):
    cluster = new_cluster(base)
    dsn = cluster.start()

    with psycopg.connect(dsn) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)
        assert conn.execute("SELECT current_user").fetchone() == ("queen",)
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user="queen", dbname="postgres"):
        pass  # TCP on loopback as well as the socket

    pid = cluster.postmaster_pid()
    assert pid is not None and cluster.is_running()
    if IS_ROOT:
        assert proc_uid(pid) != 0
    family = [pid, *children_of(pid)]
    assert len(family) > 1

    cluster.stop()

    assert not cluster.is_running()
    assert not (cluster.data_dir / "postmaster.pid").exists()
    wait_gone(family, timeout=0.5)


def test_start_is_idempotent_and_context_manager_stops(base):
    path, _ = base
    with EmbeddedPostgres(path / "pg", fsync=False) as cluster:
        first = cluster.dsn
        assert cluster.start() == first  # adopts the running server
        assert EmbeddedPostgres(path / "pg").start() == first  # so does another instance
    assert not cluster.is_running()


def test_restart_keeps_data_and_port(base):
    cluster = new_cluster(base)
    dsn = cluster.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")
    cluster.stop()

    again = new_cluster(base)
    assert again.start() == dsn
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("still here",)]


def listening_socket(port=0):
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_remembered_port_taken_meanwhile_picks_another(base):
    cluster = new_cluster(base)
    cluster.start()
    old_port = cluster.port
    cluster.stop()
    with listening_socket(old_port):
        again = new_cluster(base)
        dsn = again.start()
    assert again.port != old_port
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_failed_start_shows_the_server_log(base):
    with listening_socket() as busy:
        cluster = new_cluster(base, port=busy.getsockname()[1])
        with pytest.raises(EmbeddedPostgresError, match="Address already in use"):
            cluster.start()
    assert not cluster.is_running()


def test_recovers_after_postmaster_killed(base):
    cluster = new_cluster(base)
    dsn = cluster.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
    pid = cluster.postmaster_pid()
    family = [pid, *children_of(pid)]
    os.kill(pid, signal.SIGKILL)
    wait_gone(family)
    assert (cluster.data_dir / "postmaster.pid").exists()  # stale, left by the crash
    assert not cluster.is_running()

    assert cluster.start() == dsn
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT v FROM t").fetchall() == [(1,)]


def test_stale_pid_file_naming_a_live_foreign_process(base):
    cluster = new_cluster(base)
    dsn = cluster.start()
    cluster.stop()
    # PID reuse after a reboot: the recorded PID is alive but is not a postmaster.
    pid_file = cluster.data_dir / "postmaster.pid"
    pid_file.write_text(f"{os.getpid()}\n{cluster.data_dir}\n")
    assert not cluster.is_running()
    assert cluster.start() == dsn


def test_long_path_puts_socket_in_tmp(base):
    path, _ = base
    deep = path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    for d in (deep, deep.parent):
        d.chmod(0o755)
    cluster = new_cluster((deep, base[1]))
    dsn = cluster.start()
    socket_dir = socket_dir_for(cluster.data_dir)
    assert str(socket_dir).startswith("/tmp/queen-mp-")
    assert f"host={socket_dir}" in dsn
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    cluster.stop()
    shutil.rmtree(socket_dir, ignore_errors=True)


def test_socket_dir_beside_cluster_when_short():
    assert socket_dir_for(Path("/srv/queen/pg")) == Path("/srv/queen/pg-socket")
    long = socket_dir_for(Path("/srv/" + "x" * 100 + "/pg"))
    assert long == socket_dir_for(Path("/srv/" + "x" * 100 + "/pg"))  # stable across starts
    assert len(str(long / ".s.PGSQL.65535")) <= 107


def test_missing_binaries_say_what_to_install(tmp_path):
    with pytest.raises(EmbeddedPostgresError, match="apt-get install postgresql"):
        find_pg_binaries(search_path=str(tmp_path), patterns=())


def test_finds_installed_binaries():
    binaries = find_pg_binaries()
    assert binaries.major >= 13
    assert binaries.pg_ctl.parent == binaries.initdb.parent == binaries.postgres.parent


@pytest.mark.skipif(not IS_ROOT, reason="only root needs a searchable path for another user")
def test_unsearchable_parent_is_named(base):
    path, _ = base
    locked = path / "locked"
    locked.mkdir(mode=0o700)
    locked.chmod(0o700)
    cluster = new_cluster((locked, base[1]))
    with pytest.raises(EmbeddedPostgresError, match=re.escape(f"{locked} is not searchable")):
        cluster.start()


@pytest.mark.skipif(
    not IS_ROOT or shutil.which("useradd") is None, reason="creating a system user needs root"
)
def test_creates_a_system_user_when_asked_for_a_missing_one(base):
    name = f"qmp-t{secrets.token_hex(3)}"
    try:
        cluster = new_cluster(base, run_as=name)
        cluster.start()
        import pwd

        assert proc_uid(cluster.postmaster_pid()) == pwd.getpwnam(name).pw_uid
        cluster.stop()
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def test_private_pg_fixture_can_be_restarted(private_pg):
    dsn = private_pg.dsn
    private_pg.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
    assert private_pg.start() == dsn
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
