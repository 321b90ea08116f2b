"""Issue 10: PostgreSQL failover under load (docs/operations.md "PostgreSQL high availability").

The test starts its own primary and a synchronous streaming standby (pg_basebackup -R,
``synchronous_standby_names = '*'``, ``synchronous_commit = on``), a broker whose DSN lists both
(libpq multi-host, ``target_session_attrs=read-write``), and pushes from a few threads with
deterministic transactionIds, plus one thread of transactions (``/api/v1/transaction``, which
commit on pooled connections and so can end ``outcome_unknown``). It then SIGKILLs the primary
postmaster and promotes the standby; the broker must recover by itself (no restart), drain its
spool on the new primary and leave every push it answered ``queued`` or ``buffered`` stored
exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queen_mp.db.embedded import EmbeddedPostgres
from queen_mp.db.errors import DatabaseError
from queen_mp.db.pooled import connection, failover_pool
from queen_mp.front.queueflags import FlagsUnavailable, QueueFlags
from tests.integration.test_maintenance import spool_status, wait_drained, wait_for
from tests.integration.test_push_json import PUSH, stored_messages, uq
from tests.pgharness import make_database, make_migrated_database, make_temp_dir

TXN = "/api/v1/transaction"
OUTAGE_S = 3.0  # from the primary's death to the standby's promotion
OK_503 = {"outcome_unknown", "timeout", "unavailable"}


# ------------------------------------------------------------------ primary + standby
class HaPair:
    """A primary and a synchronous streaming standby, both on 127.0.0.1, of this test alone."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.primary = EmbeddedPostgres(base / "primary", fsync=False)
        self.standby = EmbeddedPostgres(base / "standby", fsync=False)

    def start(self) -> None:
        primary_dsn = self.primary.start()
        account = self.primary._resolve_account()
        target = self.standby.data_dir
        target.mkdir(mode=0o700)
        if account is not None:  # as root the clusters run as the postgres user
            os.chown(target, account.uid, account.gid)
        bins = self.primary._find_binaries()
        done = self.primary._run(
            [str(bins.bin_dir / "pg_basebackup"), "-D", str(target), "-h", "127.0.0.1",
             "-p", str(self.primary.port), "-U", self.primary.superuser, "-X", "stream",
             "-R", "-c", "fast", "--no-sync"], timeout=120)
        assert done.returncode == 0, done.stderr
        # the copy of the primary's remembered port: the standby picks a port of its own
        with contextlib.suppress(FileNotFoundError):
            (target / "queen-mp.port").unlink()
        self.standby.start()
        with psycopg.connect(primary_dsn, autocommit=True) as conn:
            wait_for("the standby to stream", lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()[0] == 1, timeout=30)
            # NOTE(test): only now, or the primary's commits would wait for a standby that does
            # not exist yet. The standby's own copy of the settings has no synchronous standby,
            # so once promoted it commits alone (Patroni's synchronous_mode without _strict).
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
            wait_for("the standby to be synchronous", lambda: conn.execute(
                "SELECT sync_state FROM pg_stat_replication").fetchone()[0] == "sync",
                timeout=30, every=0.05)
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"

    def kill_primary(self) -> None:
        """SIGKILL the postmaster: no shutdown checkpoint, no goodbye to anybody."""
        pid = self.primary.postmaster_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for("the primary to be gone", lambda: self.primary.postmaster_pid() is None,
                 timeout=10, every=0.01)

    def promote(self) -> None:
        bins = self.standby._find_binaries()
        done = self.standby._run([str(bins.pg_ctl), "promote", "-D", str(self.standby.data_dir),
                                  "-w", "-t", "30", "-s"], timeout=40)
        assert done.returncode == 0, done.stderr

    def broker_dsn(self, server_dsn: str) -> str:
        """Both servers over TCP, the writable one chosen by libpq."""
        info = conninfo_to_dict(server_dsn)
        return make_conninfo(
            "", host="127.0.0.1,127.0.0.1", port=f"{self.primary.port},{self.standby.port}",
            user=info["user"], dbname=info["dbname"], target_session_attrs="read-write",
            connect_timeout="2")

    def stop(self) -> None:
        try:
            for server in (self.standby, self.primary):
                with contextlib.suppress(Exception):
                    server.stop(mode="immediate")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def ha_pair() -> Iterator[HaPair]:
    pair = HaPair(make_temp_dir("queen-ha-"))
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


# ------------------------------------------------------------------ the test
def test_failover_to_a_synchronous_standby_loses_nothing_answered(make_broker, ha_pair):
    server_dsn = make_database(ha_pair.primary.dsn)
    dsn = ha_pair.broker_dsn(server_dsn)
    b = make_broker(dsn, QUEEN_PUSH_TIMEOUT_MS="4000", QUEEN_PG_STATEMENT_TIMEOUT_MS="3000")
    health = b.client.get("/health").json()
    assert health["databaseWritable"] is True
    assert health["databaseHost"].endswith(f":{ha_pair.primary.port}"), health
    q, tq = uq("failover"), uq("failover-txn")

    stop = threading.Event()
    lock = threading.Lock()
    phase = ["before"]
    answers: dict[str, list[tuple[dict, dict]]] = collections.defaultdict(list)
    by_phase: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    txn_ok: list[str] = []          # transactionIds of transactions answered 200 success
    txn_unknown: list[str] = []     # answered 503: may or may not have committed
    first_queued_after: list[float] = []
    first_txn_after: list[float] = []
    sent: set[str] = set()          # every transactionId pushed, answered or not

    def note(key: str) -> None:
        by_phase[phase[0]][key] += 1

    def pusher(w: int) -> None:
        rnd = random.Random(w)
        seq = 0
        with httpx.Client(base_url=b.url, timeout=30) as http:
            while not stop.is_set():
                items = [{"queue": q, "partition": f"p{rnd.randrange(8)}",
                          "transactionId": f"w{w}-s{seq}-i{i}", "payload": {"w": w, "s": seq}}
                         for i in range(rnd.randint(1, 5))]
                seq += 1
                with lock:
                    sent.update(it["transactionId"] for it in items)
                try:
                    r = http.post(PUSH, json={"items": items})
                except httpx.HTTPError as ex:
                    with lock:
                        note(f"http {type(ex).__name__}")
                    time.sleep(0.05)
                    continue
                with lock:
                    if r.status_code != 201:
                        note(f"{r.status_code} {r.json().get('code')}")
                    else:
                        for item, res in zip(items, r.json(), strict=True):
                            answers[res["status"]].append((item, res))
                            note(res["status"])
                            if (res["status"] == "queued" and phase[0] == "after"
                                    and not first_queued_after):
                                first_queued_after.append(time.monotonic())
                if r.status_code != 201:
                    time.sleep(0.02)
                time.sleep(0.005)

    def transactor() -> None:
        seq = 0
        with httpx.Client(base_url=b.url, timeout=30) as http:
            while not stop.is_set():
                txn = f"t-{seq}"
                seq += 1
                body = {"operations": [{"type": "push", "items": [
                    {"queue": tq, "partition": f"p{seq % 3}", "transactionId": txn,
                     "payload": {"t": seq}}]}]}
                try:
                    r = http.post(TXN, json=body)
                except httpx.HTTPError as ex:
                    with lock:
                        note(f"txn http {type(ex).__name__}")
                    continue
                with lock:
                    if r.status_code == 200 and r.json()["success"]:
                        txn_ok.append(txn)
                        note("txn 200")
                        if phase[0] == "after" and not first_txn_after:
                            first_txn_after.append(time.monotonic())
                    else:
                        txn_unknown.append(txn)
                        note(f"txn {r.status_code} {r.json().get('code')}")
                if r.status_code != 200:
                    time.sleep(0.02)
                time.sleep(0.005)

    threads = [threading.Thread(target=pusher, args=(w,), daemon=True) for w in range(4)]
    threads.append(threading.Thread(target=transactor, daemon=True))
    for t in threads:
        t.start()
    time.sleep(2.0)

    with lock:
        phase[0] = "outage"
    t_kill = time.monotonic()
    ha_pair.kill_primary()
    time.sleep(OUTAGE_S)  # a failover manager's decision (Patroni: ttl, loop_wait)
    ha_pair.promote()
    t_promoted = time.monotonic()
    with lock:
        phase[0] = "after"
    wait_for("a push queued on the promoted standby", lambda: first_queued_after, timeout=30,
             every=0.02)
    recovered_s = first_queued_after[0] - t_promoted
    health = b.wait_healthy(30)
    t_healthy = time.monotonic()
    assert health["databaseWritable"] is True
    assert health["databaseHost"].endswith(f":{ha_pair.standby.port}"), health
    try:
        wait_for("pushes and transactions to go on after the failover", lambda: (
            by_phase["after"]["queued"] > 100 and by_phase["after"]["txn 200"] > 20),
            timeout=30)
    except AssertionError:
        raise AssertionError(f"no recovery: { {k: dict(v) for k, v in by_phase.items()} }\n"
                             f"{b.log()[-5000:]}") from None
    txn_recovered_s = first_txn_after[0] - t_promoted
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a load thread hung"

    spool = wait_drained(b, timeout=60)
    t_drained = time.monotonic()
    print(f"\nfailover: answers by phase { {k: dict(v) for k, v in by_phase.items()} }"
          f"\n  items: { {k: len(v) for k, v in answers.items()} }, transactions ok "
          f"{len(txn_ok)}, not ok {len(txn_unknown)}"
          f"\n  primary killed -> promoted {t_promoted - t_kill:.2f}s; promoted -> first "
          f"queued {recovered_s:.2f}s, first transaction {txn_recovered_s:.2f}s, healthy "
          f"{t_healthy - t_promoted:.2f}s, spool drained {t_drained - t_promoted:.2f}s; "
          f"spool {spool}")

    # what the clients were told
    assert set(answers) <= {"queued", "buffered"}, set(answers)
    assert by_phase["before"]["queued"] > 0 and by_phase["after"]["queued"] > 0
    for phase_counts in by_phase.values():
        for key in phase_counts:
            if key in ("queued", "buffered", "txn 200"):
                continue
            status, _, code = key.removeprefix("txn ").partition(" ")
            assert status == "503" and code in OK_503, dict(by_phase)
    # by itself and promptly: no restart, no wait for a reconnect backoff
    assert recovered_s < 5 and txn_recovered_s < 5, (recovered_s, txn_recovered_s)
    assert spool["failed"] == 0

    # what the new primary holds: every answered push exactly once, where it was reported
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
        stored = stored_messages(conn, q)
        stored_txn = stored_messages(conn, tq)
    txns = collections.Counter(m.transaction_id for m in stored)
    assert [t for t, n in txns.items() if n > 1] == []
    ids = collections.Counter(m.message_id for m in stored)
    assert [i for i, n in ids.items() if n > 1] == []
    by_pos = {(m.partition_id, m.offset): m for m in stored}
    by_id = {m.message_id: m for m in stored}
    for item, res in answers["queued"]:  # nothing answered queued is lost or moved
        m = by_pos.get((int(res["partitionId"]), res["offset"]))
        assert m is not None and m.message_id == res["messageId"], res
        assert m.transaction_id == item["transactionId"]
    for item, res in answers["buffered"]:  # every buffered item stored once, after the drain
        m = by_id.get(res["messageId"])
        assert m is not None, f"buffered item not stored after the drain: {res}"
        assert (m.partition, m.transaction_id) == (item["partition"], item["transactionId"])
    assert set(txns) <= sent  # and nothing else (a 503 push may or may not be stored)
    # offsets of every partition gapless on the new primary
    for pid in {m.partition_id for m in stored}:
        offs = sorted(m.offset for m in stored if m.partition_id == pid)
        assert offs == list(range(offs[0], offs[0] + len(offs))), pid
    # transactions: every one answered 200 stored once; an unknown one at most once
    tx = collections.Counter(m.transaction_id for m in stored_txn)
    assert [t for t, n in tx.items() if n > 1] == []
    assert [t for t in txn_ok if tx[t] != 1] == []
    assert set(tx) <= set(txn_ok) | set(txn_unknown)
    assert spool_status(b)["pending"] == 0


# ------------------------------------------------------------------ the front workers' pool
def test_the_front_pool_drops_dead_connections_and_reconnects_promptly(private_pg):
    """After the server went away no dead connection is handed out, and once a server answers
    again the pool has a connection within about a second, however long the outage was
    (psycopg_pool's own backoff would wait 8 s more after an 8 s outage)."""
    dsn = make_database(private_pg.dsn)

    async def scenario() -> tuple[float, list[str]]:
        pool = failover_pool(dsn, max_size=4, name="failover-test", timeout=1.0)
        await pool.open(wait=True)
        try:
            async with pool.connection() as c1, pool.connection() as c2:
                await c1.execute("SELECT 1")
                await c2.execute("SELECT 1")
            private_pg.stop(mode="immediate")
            errors: list[str] = []
            outage_end = time.monotonic() + 8.0
            while time.monotonic() < outage_end:
                try:
                    async with connection(pool) as conn:
                        await conn.execute("SELECT 1")
                    errors.append("answered while the server was down")
                except DatabaseError as ex:
                    errors.append(type(ex).__name__)
                await asyncio.sleep(0.2)
            private_pg.start()
            t_up = time.monotonic()
            while True:
                try:
                    async with connection(pool, commit_sent=True) as conn:
                        await conn.execute("SELECT 1")
                    return time.monotonic() - t_up, errors
                except DatabaseError as ex:
                    errors.append(f"after: {type(ex).__name__}")
                    assert time.monotonic() - t_up < 20, errors
                    await asyncio.sleep(0.05)
        finally:
            await pool.close()

    took, errors = asyncio.run(scenario())
    print(f"\npool: a connection {took:.2f}s after the server came back; errors "
          f"{dict(collections.Counter(errors))}")
    # no connection at all is "unavailable", never "outcome unknown"; a dead connection is
    # never handed out, so no request on one ends "outcome unknown" either
    assert set(errors) <= {"Unavailable", "after: Unavailable"}, errors
    # psycopg_pool's own backoff would be 8 s here; 6 s leaves room for a loaded machine
    assert took < 6.0, took


def test_queue_flags_wait_for_a_missing_server_once_a_while_not_per_push(private_pg):
    """Without a writable server (a failover takes pg_auto_failover about 50 s) the encryption
    flag of a known queue comes from the worker's memo and an unknown queue's is unavailable at
    once: after one failed read PostgreSQL is not asked again for ``down_s``, where every push
    whose memo had expired used to wait READ_TIMEOUT_S (3 s) before it was spooled."""
    dsn = make_migrated_database(private_pg.dsn)
    tenant = bytes(16)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, encryption_enabled) VALUES "
                     "('flags-secret', true)")

    async def scenario() -> tuple[list[object], int, int]:
        pool = failover_pool(dsn, max_size=2, name="flags-test", timeout=1.0)
        await pool.open(wait=True)
        flags = QueueFlags(pool, ttl_s=0.0, down_s=30.0)  # every memo expired at once
        try:
            seen: list[object] = [await flags.encrypted(tenant, "flags-secret")]
            private_pg.stop(mode="immediate")
            seen.append(await flags.encrypted(tenant, "flags-secret"))  # the failed read
            asked = pool.get_stats()["requests_num"]
            for queue in ("flags-secret", "flags-new", "flags-secret"):
                try:
                    seen.append(await flags.encrypted(tenant, queue))
                except FlagsUnavailable as ex:
                    seen.append(str(ex))
            asked_down = pool.get_stats()["requests_num"] - asked
            private_pg.start()
            flags.down_s = 0.0
            flags._down_until = 0.0  # as if down_s had passed
            for _ in range(100):  # the pool reconnects about a second after the server is back
                with contextlib.suppress(FlagsUnavailable):
                    if await flags.encrypted(tenant, "flags-new") is False:
                        break
                await asyncio.sleep(0.1)
            return seen, asked_down, pool.get_stats()["requests_num"] - asked
        finally:
            await pool.close()

    seen, asked_down, asked_after = asyncio.run(scenario())
    assert seen[:3] == [True, True, True] and seen[4] is True, seen
    assert isinstance(seen[3], str) and seen[3].startswith("queue flags unreadable: "), seen
    assert asked_down == 0, "PostgreSQL was asked again while known down"
    assert asked_after > 0  # and asked again once the window passed: flags-new is known now
