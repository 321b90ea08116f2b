"""Durable whatever the server says (design invariant 1): every connection of the broker that
writes commits with ``synchronous_commit`` on, on a database whose default is off.

PostgreSQL shows no session's settings to another session, so these tests watch what the
setting does instead. On a private cluster, ``synchronous_standby_names`` names a standby that
never connects: a commit made with ``synchronous_commit`` on (or ``remote_*``) then waits for
it, visible to everyone in ``pg_stat_activity`` as ``wait_event = 'SyncRep'`` under the
committing connection's ``application_name``; a commit made with it off (or ``local``) does
not wait. The test database has ``ALTER DATABASE ... SET synchronous_commit = off``, so a
connection that did not pin the setting commits at once and is never seen waiting: each kind
of work the broker does (push bundle, pop, ack fusion, transaction, KV write, timer scheduling
and firing, housekeeping) must be seen waiting under the application name of the connection
kind that does it. (Only a transaction that wrote WAL waits: a NOTIFY alone, the wake-up
connection's only work, writes none and has nothing to make durable; that connection and the
read-only LISTEN one are made by the same helper, which tests/unit/test_db_boundary.py
checks.) Each waiting backend is then let go with
``pg_cancel_backend``: a commit whose wait for the standby is cancelled has committed locally
and reports success (with a WARNING), so every request still gets its normal answer.

Two controls make a pass mean something: a test connection with the database's default
commits without waiting, and one that asks for ``synchronous_commit=on`` is seen waiting.

Also here: ``queen_mp.db.connect`` against that database directly (pinned over the database's
default and over a DSN's own ``options``; refusing a connection the server would not run
durably), and the migration runner's connection.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queen_mp.db import connect as db_connect
from queen_mp.db.embedded import EmbeddedPostgres
from queen_mp.db.errors import NotDurable, StatementError
from tests.pgharness import drop_database, make_database, make_migrated_database, make_temp_dir

pytestmark = pytest.mark.timeout(240)

PHANTOM = "queen_test_phantom_standby"
# the broker's application names, one per connection kind (queen_mp/db/connect.py callers)
ROLES = {
    "push bundle": r"queen-mp shard \d+",
    "front pool": r"queen-mp front-\d+",
    "ack fusion": r"queen-mp shard \d+ acks",
    "timer firer": r"queen-mp shard \d+ timers",
    "housekeeping": r"queen-mp shard \d+ housekeeping",
}


# ------------------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A private cluster (this module changes ``synchronous_standby_names``); its DSN."""
    base = make_temp_dir()
    server = EmbeddedPostgres(base / "pg", fsync=False)
    try:
        yield server.start()
    finally:
        try:
            server.stop(mode="immediate")
        finally:
            shutil.rmtree(base, ignore_errors=True)


def admin(dsn: str) -> psycopg.Connection:
    """A test connection that never waits for a standby itself."""
    return psycopg.connect(dsn, autocommit=True, application_name="test admin",
                           options="-c synchronous_commit=local")


def default_off(server_dsn: str, dsn: str) -> None:
    """The database's default becomes ``synchronous_commit = off``; and the probes' table."""
    name = conninfo_to_dict(dsn)["dbname"]
    with admin(server_dsn) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
            sql.Identifier(name)))
    with admin(dsn) as conn:
        conn.execute("CREATE TABLE public.test_probe (x int)")


def phantom_standby(server_dsn: str, on: bool) -> None:
    """Make every commit with ``synchronous_commit`` on wait for a standby that never comes
    (``on``), or let every such commit, waiting or not, go (``not on``)."""
    with admin(server_dsn) as conn:
        if on:
            conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(
                sql.Literal(PHANTOM)))
        else:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")


class Watch:
    """Sees the backends of one database that wait for the standby, and lets them go."""

    def __init__(self, dsn: str) -> None:
        self.conn = admin(dsn)
        self.seen: set[str] = set()  # application names seen waiting

    def close(self) -> None:
        self.conn.close()

    def release(self) -> list[str]:
        """Cancel the wait of every backend waiting now; their application names."""
        rows = self.conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE wait_event = 'SyncRep' AND datname = current_database()").fetchall()
        for pid, _ in rows:
            self.conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        names = [name for _, name in rows]
        self.seen.update(names)
        return names

    def until(self, pattern: str, done: Callable[[], bool] | None = None,
              timeout: float = 30.0) -> list[str]:
        """Release waiters until one named ``pattern`` was among them; what was released.

        ``done``: the work meant to produce that wait has finished (then it never will)."""
        deadline = time.monotonic() + timeout
        released: list[str] = []
        while time.monotonic() < deadline:
            released += self.release()
            if any(re.fullmatch(pattern, name) for name in released):
                return released
            if done is not None and done():
                released += self.release()
                break
            time.sleep(0.05)
        raise AssertionError(f"no connection named {pattern!r} waited for the standby; "
                             f"released meanwhile: {released}")


def phantom_in_force(watch: Watch, dsn: str, pool: cf.ThreadPoolExecutor) -> None:
    """Until a connection asking for ``synchronous_commit=on`` waits for the standby (the
    checkpointer applies a reload a moment after ``pg_reload_conf``)."""
    deadline = time.monotonic() + 20
    while True:
        probe = pool.submit(txid_probe, dsn, "test probe on", options="-c synchronous_commit=on")
        try:
            watch.until("test probe on", probe.done, timeout=5)
            probe.result(timeout=10)
            return
        except AssertionError:
            probe.result(timeout=10)
            if time.monotonic() > deadline:
                raise


def txid_probe(dsn: str, name: str, **kwargs: Any) -> None:
    """One committed transaction that wrote WAL (one that did not never waits), on a
    connection of its own."""
    with psycopg.connect(dsn, autocommit=True, application_name=name, **kwargs) as conn:
        conn.execute("INSERT INTO public.test_probe VALUES (1)")


# ------------------------------------------------------------------------------ the helper
def test_the_connect_helper_pins_durability_over_the_database_default(cluster):
    dsn = make_database(cluster)
    try:
        default_off(cluster, dsn)
        with psycopg.connect(dsn) as raw:
            assert raw.execute("SHOW synchronous_commit").fetchone() == ("off",)
        dsn_off = make_conninfo(dsn, options="-c synchronous_commit=off -c work_mem=8MB")

        async def helper() -> list[tuple[str, ...]]:
            out = []
            for d in (dsn, dsn_off):
                conn = await db_connect.connect(d, application_name="test helper")
                try:
                    cur = await conn.execute("SELECT current_setting('synchronous_commit'),"
                                             " current_setting('work_mem')")
                    out.append(await cur.fetchone())
                finally:
                    await conn.close()
            db = db_connect.Dedicated(dsn, application_name="test dedicated",
                                      statement_timeout_ms=2000)
            try:
                out.append(await db.run(_show_sync))
            finally:
                await db.drop()
            pool = db_connect.make_pool(dsn, application_name="test pool", min_size=1,
                                        max_size=2, name="test", timeout=5,
                                        reconnect_timeout=2)
            await pool.open(wait=True)
            try:
                async with pool.connection() as conn:
                    out.append(await _show_sync(conn))
            finally:
                await pool.close()
            return out

        import asyncio
        got = asyncio.run(helper())
        # the DSN's own options are kept, ours come last and win
        assert got == [("on", "4MB"), ("on", "8MB"), ("on",), ("on",)], got
        with db_connect.connect_blocking(dsn, application_name="test blocking") as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        with db_connect.connect_blocking(dsn, application_name="test blocking",
                                         autocommit=False) as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    finally:
        drop_database(cluster, dsn)


async def _show_sync(conn: Any) -> tuple[str, ...]:
    cur = await conn.execute("SHOW synchronous_commit")
    return await cur.fetchone()


def test_the_connect_helper_refuses_a_connection_that_is_not_durable(cluster, monkeypatch):
    """As if a connection pooler dropped the startup options: the database's default (off)
    stays in force, and the helper refuses the connection instead of writing through it."""
    dsn = make_database(cluster)
    try:
        default_off(cluster, dsn)
        monkeypatch.setattr(db_connect, "session_options", lambda *a, **k: "")

        async def helper() -> list[str]:
            out = []
            try:
                await db_connect.connect(dsn, application_name="test refused")
            except NotDurable as ex:
                out.append(type(ex).__name__)
            db = db_connect.Dedicated(dsn, application_name="test refused")
            try:
                await db.run(_show_sync)
            except NotDurable as ex:
                out.append(type(ex).__name__)
            pool = db_connect.make_pool(dsn, application_name="test refused", min_size=1,
                                        max_size=1, name="refused", timeout=1,
                                        reconnect_timeout=1)
            await pool.open(wait=False)
            try:
                async with pool.connection():
                    out.append("pool handed out a connection")
            except psycopg.Error as ex:  # psycopg_pool.PoolTimeout
                out.append(type(ex).__name__)
            finally:
                await pool.close()
            return out

        import asyncio
        assert asyncio.run(helper()) == ["NotDurable", "NotDurable", "PoolTimeout"]
        with pytest.raises(NotDurable):
            db_connect.connect_blocking(dsn, application_name="test refused")
        with admin(dsn) as conn:  # every refused connection was closed
            deadline = time.monotonic() + 5  # a backend ends a moment after its client left
            while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name"
                               " = 'test refused'").fetchone() != (0,):
                assert time.monotonic() < deadline, "a refused connection was left open"
                time.sleep(0.05)
    finally:
        drop_database(cluster, dsn)


# ------------------------------------------------------------------------------ the broker
def _kinds_of_work(broker: Any, watch: Watch, dsn: str, pool: cf.ThreadPoolExecutor,
                   names: dict[str, str]) -> dict[str, list[str]]:
    """Each kind of broker work, started while commits wait for the phantom standby: which
    application names were seen waiting (and released) while it ran."""
    client = broker.client
    queue, group, ns, timer_queue = names["queue"], "g", names["ns"], names["timers"]
    seen: dict[str, list[str]] = {}

    def step(name: str, pattern: str, call: Callable[[], Any]) -> Any:
        future = pool.submit(call)
        seen[name] = watch.until(pattern, future.done)
        return future.result(timeout=30)

    r = step("push", ROLES["push bundle"], lambda: client.post("/api/v1/push", json={"items": [
        {"queue": queue, "partition": "p", "transactionId": "m1", "payload": {"n": 1}}]}))
    assert r.status_code == 201 and r.json()[0]["status"] == "queued", r.text
    r = step("pop", ROLES["front pool"], lambda: client.get(
        f"/api/v1/pop/queue/{queue}", params={"consumerGroup": group, "batch": 1}))
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    r = step("ack", ROLES["ack fusion"], lambda: client.post("/api/v1/ack/batch", json={
        "consumerGroup": group, "acknowledgments": [{
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "status": "completed"}]}))
    assert r.status_code == 200 and r.json()[0]["success"] is True, r.text
    r = step("transaction", ROLES["front pool"], lambda: client.post(
        "/api/v1/transaction", json={"operations": [{"type": "push", "items": [
            {"queue": queue, "partition": "p", "transactionId": "t1", "payload": {"n": 2}}]}]}))
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    r = step("kv", ROLES["front pool"], lambda: client.post("/api/v1/kv", json={"operations": [
        {"op": "put", "ns": ns, "key": "k", "value": 1, "ttlSeconds": 3600}]}))
    assert r.status_code == 200 and r.json()["results"][0]["applied"] is True, r.text
    r = step("timer schedule", ROLES["front pool"], lambda: client.post(
        "/api/v1/timers", json={"operations": [{
            "op": "schedule", "queue": timer_queue, "timerKey": "t", "delayMs": 3_600_000,
            "payload": "eyJ0IjoxfQ=="}]}))  # {"t":1}
    assert r.status_code == 200 and r.json()["results"][0]["ok"] is True, r.text
    with admin(dsn) as conn:  # commits at once: the database's default is off
        conn.execute("UPDATE queen.timers SET fire_at = now() WHERE timer_key = 't'")
        seen["timer fire"] = watch.until(ROLES["timer firer"])
        conn.execute("UPDATE queen.kv SET expires_at = now() - interval '1 second'"
                     " WHERE ns = %s", (ns,))
        seen["housekeeping"] = watch.until(ROLES["housekeeping"])
    return seen


def test_a_sql_ascii_database_is_refused_by_name(cluster):
    """initdb under the C locale (pg_autoctl run with LC_ALL=C did it) makes SQL_ASCII
    databases, whose text psycopg returns as bytes: the helpers name the encoding instead of
    blaming a pooler for ``synchronous_commit=b'on'``."""
    name = f"queen_test_ascii_{uuid.uuid4().hex[:8]}"
    with admin(cluster) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'SQL_ASCII' "
                             "LC_COLLATE 'C' LC_CTYPE 'C'").format(sql.Identifier(name)))
    dsn = make_conninfo(cluster, dbname=name)
    try:
        with pytest.raises(StatementError, match="SQL_ASCII"):
            db_connect.connect_blocking(dsn, application_name="test ascii")

        async def refused() -> str:
            try:
                await db_connect.connect(dsn, application_name="test ascii")
            except StatementError as ex:
                return str(ex)
            return "connected"

        import asyncio
        assert "UTF8" in asyncio.run(refused())
    finally:
        drop_database(cluster, dsn)


def test_every_broker_connection_that_writes_commits_durably(cluster, make_broker):
    dsn = make_migrated_database(cluster)
    names = {k: f"dur{k}-{uuid.uuid4().hex[:10]}" for k in ("queue", "ns", "timers")}
    try:
        default_off(cluster, dsn)
        broker = make_broker(dsn, QUEEN_WORKERS="1", QUEEN_V2_FUSION_SHARDS="1",
                             QUEEN_HOUSEKEEPING_S="1")
        phantom_standby(cluster, True)
        watch = Watch(dsn)
        try:
            with cf.ThreadPoolExecutor(2) as pool:
                # controls: a connection that asks for it waits; one on the default does not
                phantom_in_force(watch, dsn, pool)
                # (a probe that waited for the phantom standby would wait for ever)
                pool.submit(txid_probe, dsn, "test probe default").result(timeout=30)
                assert "test probe default" not in watch.seen
                seen = _kinds_of_work(broker, watch, dsn, pool, names)
        finally:
            phantom_standby(cluster, False)
            watch.release()
            watch.close()
        for kind, pattern in ROLES.items():
            assert any(re.fullmatch(pattern, name) for name in watch.seen), (kind, seen)
        # and what the broker answered for is there
        client = broker.client
        r = client.get(f"/api/v1/pop/queue/{names['queue']}",
                       params={"consumerGroup": "g", "batch": 10, "autoAck": "true"})
        assert r.status_code == 200, r.text
        assert [m["transactionId"] for m in r.json()["messages"]] == ["t1"], r.text
        r = client.get(f"/api/v1/pop/queue/{names['timers']}",
                       params={"batch": 10, "autoAck": "true"})
        assert r.status_code == 200, r.text
        assert [m["data"] for m in r.json()["messages"]] == [{"t": 1}], r.text
        with admin(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM queen.kv WHERE ns = %s",
                                (names["ns"],)).fetchone() == (0,)
    finally:
        phantom_standby(cluster, False)
        drop_database(cluster, dsn)


def test_the_migration_runner_commits_durably(cluster):
    from queen_mp.db.migrations import apply_migrations

    dsn = make_database(cluster)
    try:
        default_off(cluster, dsn)
        phantom_standby(cluster, True)
        watch = Watch(dsn)
        try:
            with cf.ThreadPoolExecutor(1) as pool:
                phantom_in_force(watch, dsn, pool)
            applied: list[Any] = []
            runner = threading.Thread(target=lambda: applied.append(apply_migrations(dsn)))
            runner.start()
            watch.until(r"queen-mp migrations", lambda: not runner.is_alive(), timeout=60)
            while runner.is_alive():  # one wait per migration file: let each go
                watch.release()
                runner.join(0.05)
            assert applied and applied[0], applied
        finally:
            phantom_standby(cluster, False)
            watch.release()
            watch.close()
    finally:
        phantom_standby(cluster, False)
        drop_database(cluster, dsn)


def _gssencmode(pgconn: Any) -> str:
    return next(o.val.decode() for o in pgconn.info if o.keyword == b"gssencmode")


def test_connections_on_this_host_do_not_try_gss_encryption(pg_server_dsn, monkeypatch):
    """queen_mp.db.connect.local_params: every factory connects to a loopback server with
    ``gssencmode=disable`` (no GSSAPI set up per process and per connection), and keeps a
    ``gssencmode`` the DSN names."""
    monkeypatch.delenv("PGGSSENCMODE", raising=False)
    if not db_connect.local_params(pg_server_dsn):
        pytest.skip("the test server is not on this host")
    tcp = make_conninfo(pg_server_dsn, host="127.0.0.1", hostaddr="")
    own = make_conninfo(tcp, gssencmode="prefer")

    async def modes() -> list[str]:
        out = []
        for d in (tcp, own):
            conn = await db_connect.connect(d, application_name="test gss")
            try:
                out.append(_gssencmode(conn.pgconn))
            finally:
                await conn.close()
        pool = db_connect.make_pool(tcp, application_name="test gss pool", min_size=1,
                                    max_size=1, name="gss", timeout=5, reconnect_timeout=2)
        await pool.open(wait=True)
        try:
            async with pool.connection() as conn:
                out.append(_gssencmode(conn.pgconn))
        finally:
            await pool.close()
        return out

    import asyncio
    assert asyncio.run(modes()) == ["disable", "prefer", "disable"]
    with db_connect.connect_blocking(tcp, application_name="test gss") as conn:
        assert _gssencmode(conn.pgconn) == "disable"
