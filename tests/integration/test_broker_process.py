"""The broker as a real process: health, routing errors, metrics, restarts and clean stops."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from queen_mp.db.migrations import load_sql_tree
from tests.brokerharness import process_tree, shm_segments
from tests.pgharness import SQL_DIR, drop_database, make_database


def test_health_reports_database_shards_and_version(broker):
    r = broker.client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "healthy"
    assert body["database"] == "connected"
    assert body["shards"] == {"alive": 2, "total": 2}
    assert body["version"] == "0.1.0"
    assert body["workerId"] == body["worker_id"]
    assert body["maintenanceMode"] is False
    assert body["databaseWritable"] is True
    assert r.headers["access-control-allow-origin"] == "*"


def test_unknown_route_is_404_json(broker):
    r = broker.client.get("/api/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["code"] == "not_found"
    assert r.headers["content-type"].startswith("application/json")


def test_wrong_method_is_405_with_allow(broker):
    r = broker.client.get("/api/v1/push")
    assert r.status_code == 405
    assert r.json()["code"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]


def test_options_is_204_with_cors(broker):
    r = broker.client.request("OPTIONS", "/api/v1/push")
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "*"


def test_prometheus_metrics_come_from_every_process(broker):
    push = broker.client.post("/api/v1/push", json={"items": [
        {"queue": "metrics-q", "partition": f"p{i}", "payload": i} for i in range(8)]})
    assert push.status_code == 201
    text = broker.client.get("/metrics/prometheus").text
    # written by shard processes
    assert "queen_batch_items_fired_total" in text
    assert "queen_fusion_items_per_batch_bucket" in text
    # written by front workers
    assert 'queen_http_requests_total{route="/api/v1/push",status="201"}' in text
    fired = sum(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("queen_batch_items_fired_total"))
    assert fired >= 8


def test_metrics_json_has_the_client_shape(broker):
    body = broker.client.get("/metrics").json()
    for key in ("uptime", "requests", "messages", "database", "fusion", "ackFusion",
                "ackRegistry", "spool", "parkedPops"):
        assert key in body
    assert body["fusion"]["commits"] >= 0


def test_stopped_shard_makes_health_503_then_recovers(make_broker, db_dsn):
    b = make_broker(db_dsn)
    shard = b.shard_pids()[0]
    os.kill(shard, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            r = b.client.get("/health")
            if r.status_code == 503:
                break
            time.sleep(0.2)
        assert r.status_code == 503
        assert r.json()["code"] == "unavailable"
        assert "shard" in r.json()["error"]
    finally:
        os.kill(shard, signal.SIGCONT)
    assert b.wait_healthy(10)["shards"]["alive"] == 2


def test_killed_shard_is_restarted(make_broker, db_dsn):
    b = make_broker(db_dsn)
    before = set(b.shard_pids())
    victim = sorted(before)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        now = set(b.shard_pids())
        if len(now) == 2 and victim not in now:
            break
        time.sleep(0.2)
    assert victim not in b.shard_pids() and len(b.shard_pids()) == 2
    b.wait_healthy(15)
    r = b.client.post("/api/v1/push", json={"items": [{"queue": "after-restart", "payload": 1}]})
    assert r.status_code == 201
    assert r.json()[0]["status"] == "queued"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_front_worker_that_ends_is_replaced_and_the_shards_stay(make_broker, db_dsn, sig):
    """A worker that ends on its own (SIGTERM: graceful, exit 0) leaves through gunicorn's
    SystemExit in a process forked from the supervisor: it must not run the supervisor's
    halt (stop the shards, unlink the rings) on its way out."""
    b = make_broker(db_dsn)
    workers, shards = b.front_worker_pids(), set(b.shard_pids())
    assert len(workers) == 2 and len(shards) == 2, (workers, shards)
    b.wait_workers_ready(workers[:1])
    os.kill(workers[0], sig)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        now = b.front_worker_pids()
        if len(now) == 2 and workers[0] not in now:
            break
        time.sleep(0.2)
    assert len(now) == 2 and workers[0] not in now, now
    assert b.wait_healthy(10)["status"] == "healthy"
    for _ in range(20):
        r = b.client.post("/api/v1/push", json={"items": [{"queue": "w", "payload": 1}]})
        assert r.status_code == 201, r.text
        assert r.json()[0]["status"] == "queued"
    assert set(b.shard_pids()) == shards
    if sig == signal.SIGTERM:
        log = b.log()
        assert f"Finished server process [{workers[0]}]" in log, log[-3000:]
        assert "was sent SIG" not in log, log[-3000:]
    assert b.stop() == 0


def test_sighup_replaces_the_front_workers_and_keeps_the_shards(make_broker, db_dsn):
    """gunicorn's reload, now run by the supervisor: new workers (they claim free slots of
    the slot table while the old ones finish), the same shards, pushes go on."""
    b = make_broker(db_dsn)
    workers, shards = set(b.front_worker_pids()), set(b.shard_pids())
    assert len(workers) == 2 and len(shards) == 2
    os.kill(b.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = set(b.front_worker_pids())
        if len(now) == 2 and not now & workers:
            break
        time.sleep(0.2)
    assert len(now) == 2 and not now & workers, (workers, now)
    assert set(b.shard_pids()) == shards
    assert b.wait_healthy(15)["status"] == "healthy"
    for i in range(20):
        r = b.client.post("/api/v1/push", json={"items": [{"queue": "hup", "payload": i}]})
        assert r.status_code == 201, r.text
        assert r.json()[0]["status"] == "queued"
    assert b.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT],
                         ids=["SIGTERM", "SIGINT", "SIGQUIT"])
def test_a_stop_signal_is_graceful_and_leaves_no_process_and_no_shared_memory(
        make_broker, db_dsn, sig):
    b = make_broker(db_dsn)
    tree = process_tree(b.proc.pid)
    workers = b.front_worker_pids()
    assert len(tree) >= 5 and len(workers) == 2  # supervisor (arbiter), 2 shards, 2 workers

    def mine() -> set[str]:
        """This broker's segments (queen_mp/runtime.py names them after its supervisor's
        pid): another broker may start or stop meanwhile on a shared machine."""
        return {s for s in shm_segments() if s.startswith((f"qmp{b.proc.pid:x}",
                                                           f"sem.qmp{b.proc.pid:x}"))}

    assert mine()
    # a worker stopped before its server started has no "Finished server process" to log
    b.wait_workers_ready(workers)
    assert b.stop(sig=sig) == 0
    for pid in tree:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid), pid
    assert mine() == set()
    # graceful: each worker finished its requests and its lifespan (gunicorn's quick stop, its
    # own meaning of SIGINT and SIGQUIT, sends them SIGQUIT, then SIGKILL after the timeout),
    # and exited 0: one that dies of the signal after its shutdown is an ERROR in the log
    log = b.log()
    for pid in workers:
        assert f"Finished server process [{pid}]" in log, log[-3000:]
    assert "was sent SIG" not in log, log[-3000:]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_embedded_postgres_when_no_dsn(make_broker, tmp_path):
    b = make_broker(None)
    assert b.client.get("/health").json()["database"] == "connected"
    r = b.client.post("/api/v1/push", json={"items": [{"queue": "emb", "payload": {"x": 1}}]})
    assert r.status_code == 201 and r.json()[0]["status"] == "queued"
    pg_dir = b.data_dir / "pg"
    assert (pg_dir / "PG_VERSION").exists()
    pid = int((pg_dir / "postmaster.pid").read_text().split()[0])
    assert b.stop() == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and not _zombie(pid):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    assert not (pg_dir / "postmaster.pid").exists()


def test_two_instances_migrate_one_empty_database_together(make_broker, pg_server_dsn):
    # Both supervisors race on the advisory lock; both come up healthy on one schema.
    import concurrent.futures as cf

    empty = make_database(pg_server_dsn)
    with cf.ThreadPoolExecutor(2) as ex:
        brokers = list(ex.map(lambda _: make_broker(empty), range(2)))
    for b in brokers:
        assert b.client.get("/health").status_code == 200
    with psycopg.connect(empty) as conn:
        rows = conn.execute("SELECT count(*), count(DISTINCT version) "
                            "FROM queen.schema_migrations").fetchone()
        families = conn.execute("SELECT count(*) FROM queen.schema_functions").fetchone()
    tree = load_sql_tree(SQL_DIR)
    assert rows == (len(tree.migrations), len(tree.migrations))
    assert families == (len(tree.functions),)
    # whoever came second found the work done: exactly one broker applied the files
    applied = [b.log().count("applying function files") for b in brokers]
    assert sorted(applied) == [0, 1], applied
    for b in brokers:
        b.stop()
    drop_database(pg_server_dsn, empty)


def test_health_is_503_when_database_is_gone(make_broker, private_pg):
    dsn = private_pg.dsn
    from queen_mp.db.migrations import apply_migrations
    from queen_mp.processes.supervisor import sql_dir

    apply_migrations(dsn, sql_dir())
    b = make_broker(dsn)
    private_pg.stop(mode="immediate")
    r = httpx.get(b.url + "/health", timeout=10)
    assert r.status_code == 503
    assert r.json()["database"] == "disconnected"
    assert "connection" in r.json()["error"]


def _listening_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on ``port`` (IPv4 and IPv6)."""
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    out.add(cols[9])
    return out


def _socket_inodes(pid: int) -> set[str]:
    out: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def test_every_front_worker_has_a_listener_of_its_own(make_broker, db_dsn):
    """Connections opened in a burst must not all land on one worker (uvworker.py): each
    worker adds a SO_REUSEPORT listener of its own on the port, also after a replacement."""
    b = make_broker(db_dsn, QUEEN_WORKERS="2")
    port = int(b.url.rsplit(":", 1)[1])

    def own_listeners() -> dict[int, set[str]]:
        workers = b.front_worker_pids()
        front = [b.proc.pid, *workers]
        listening = _listening_inodes(port)
        shared = set.intersection(*(_socket_inodes(p) & listening for p in front))
        return {p: (_socket_inodes(p) & listening) - shared for p in workers}

    mine = own_listeners()
    assert len(mine) == 2 and all(len(s) == 1 for s in mine.values()), mine
    assert len(set.union(*mine.values())) == 2
    os.kill(next(iter(mine)), signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        again = own_listeners()
        if len(again) == 2 and all(len(s) == 1 for s in again.values()):
            break
        time.sleep(0.2)
    assert len(again) == 2 and all(len(s) == 1 for s in again.values()), again
    for _ in range(20):
        r = b.client.get("/health")
        assert r.status_code == 200, r.text
