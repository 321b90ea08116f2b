"""Housekeeping (sql/functions/retention.sql, queen_mp/shards/housekeeping.py) against real
PostgreSQL: time retention, completed retention, both only while retentionEnabled, never inside
a live lease, maxWaitTimeSeconds whatever the switch says, the sidecar's own clock, expired
leases, expired KV keys. The `db` database is this module's own: its payloads are placeholders
no route can decode, which another module's unfiltered listing must never meet."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
import xxhash

from queen_mp.shards.housekeeping import Housekeeping
from tests.pgharness import module_db_dsn

db_dsn = module_db_dsn  # this module's own database (the docstring says why)

PUSH = ("SELECT queen.log_push_multi_v1(%s::text[], %s::text[], %s::int4[], %s::bytea[],"
        " %s::int8[], %s::bytea[], %s::uuid[])")
T = uuid.UUID(int=0)


def uq(prefix: str = "ret") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def push(conn, queue: str, txns: list[str]) -> int:
    hashes = b"".join(xxhash.xxh3_128_digest(t.encode()) for t in txns)
    res = conn.execute(PUSH, ([queue], ["p"], [len(txns)], [hashes], [0], [b"blob"],
                              [T])).fetchone()[0]
    return int(res[0]["pid"])


def age(conn, pid: int, seconds: int, upto: int | None = None) -> None:
    """Pretend the partition's rows (up to an offset) were written ``seconds`` ago."""
    for table in ("log_segments", "log_txns"):
        conn.execute(f"UPDATE queen.{table} SET created_at = now() - make_interval(secs => %s)"
                     " WHERE partition_id = %s AND (%s::int8 IS NULL OR base_offset <= %s)",
                     (seconds, pid, upto, upto))


def state(conn, pid: int) -> tuple[int, int, int, int]:
    return conn.execute(
        "SELECT lp.log_start_offset, lp.txns_start,"
        " (SELECT count(*) FROM queen.log_segments s WHERE s.partition_id = lp.id),"
        " (SELECT count(*) FROM queen.log_txns t WHERE t.partition_id = lp.id)"
        " FROM queen.log_partitions lp WHERE lp.id = %s", (pid,)).fetchone()


def step(conn, pid: int) -> dict:
    return conn.execute("SELECT queen.retention_partition_v2(%s, 1000)", (pid,)).fetchone()[0]


def setq(conn, queue: str, **opts) -> None:
    sets = ", ".join(f"{k} = %({k})s" for k in opts)
    conn.execute(f"UPDATE queen.queues SET {sets} WHERE name = %(q)s", {**opts, "q": queue})


def test_time_retention_deletes_old_segments_consumed_or_not(db):
    q = uq()
    pid = push(db, q, ["a", "b"])
    push(db, q, ["c"])
    push(db, q, ["d"])
    setq(db, q, retention_enabled=True, retention_seconds=60, dedup_window=60)
    age(db, pid, 120, upto=3)  # segments at 1 (a, b) and 3 (c) are old; 4 (d) is new
    res = step(db, pid)
    assert res["segments"] == 2
    log_start, txns_start, segs, txns = state(db, pid)
    assert (log_start, segs) == (4, 1)
    # the sidecar keeps its own clock: GREATEST(window, completed, 900 s) > 120 s
    assert (txns_start, txns) == (1, 3)


def test_nothing_inside_a_live_lease_is_deleted(db):
    q = uq()
    pid = push(db, q, ["a"])
    push(db, q, ["b"])
    push(db, q, ["c"])
    setq(db, q, retention_enabled=True, retention_seconds=60)
    age(db, pid, 120)
    db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group, lease_id,"
               " worker_id, lease_expires_at, batch_start, batch_end)"
               " VALUES (%s, 'g', %s, 'w', now() + interval '1 minute', 2, 3)",
               (pid, uuid.uuid4()))
    assert step(db, pid)["segments"] == 1
    assert state(db, pid)[0] == 2  # offsets 2 and 3 stay while leased


def test_completed_retention_needs_every_group_past_the_segment(db):
    q = uq()
    pid = push(db, q, ["a"])
    push(db, q, ["b"])
    push(db, q, ["c"])
    setq(db, q, retention_enabled=True, completed_retention_seconds=60)
    age(db, pid, 120)
    assert step(db, pid)["segments"] == 0  # nobody consumes it: kept
    db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group, committed_offset)"
               " VALUES (%s, 'fast', 3), (%s, 'slow', 1)", (pid, pid))
    assert step(db, pid)["segments"] == 1
    assert state(db, pid)[0] == 2
    db.execute("UPDATE queen.log_consumers SET committed_offset = 3 WHERE partition_id = %s",
               (pid,))
    assert step(db, pid)["segments"] == 2
    assert state(db, pid)[0] == 4


def candidates(conn, pid: int) -> bool:
    """Whether retention_partitions_v2 lists the partition (one shard: every partition)."""
    rows = conn.execute("SELECT * FROM queen.retention_partitions_v2(%s, 1, 1, 0)",
                        (pid - 1,)).fetchall()
    return rows == [(pid,)]


def test_retention_acts_only_while_retention_enabled(db):
    """As upstream's retention sweeps: retentionSeconds and completedRetentionSeconds delete
    nothing while retentionEnabled is false (the queue is not even a candidate); switched on,
    the same queue is trimmed."""
    q = uq()
    pid = push(db, q, ["a"])
    push(db, q, ["b"])
    push(db, q, ["c"])
    setq(db, q, retention_seconds=60, completed_retention_seconds=60)
    db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group, committed_offset)"
               " VALUES (%s, 'g', 3)", (pid,))
    age(db, pid, 120, upto=2)
    assert not candidates(db, pid)
    assert step(db, pid)["segments"] == 0
    assert state(db, pid)[:3:2] == (1, 3)
    setq(db, q, retention_enabled=True)
    assert candidates(db, pid)
    assert step(db, pid)["segments"] == 2
    assert state(db, pid)[:3:2] == (3, 1)


def test_max_wait_evicts_whatever_retention_enabled_says(db):
    """maxWaitTimeSeconds is not retention (upstream's eviction does not read the switch):
    with retentionEnabled false it still deletes and counts what waited too long."""
    q = uq()
    pid = push(db, q, ["a", "b"])
    push(db, q, ["c"])
    setq(db, q, retention_enabled=False, retention_seconds=60, max_wait_time_seconds=60)
    age(db, pid, 120, upto=1)
    assert candidates(db, pid)
    res = step(db, pid)
    assert (res["segments"], res["evicted"]) == (1, 2)
    assert state(db, pid)[:3:2] == (3, 1)


def test_sidecar_purge_follows_the_longest_of_window_completed_and_900s(db):
    q = uq()
    pid = push(db, q, ["a"])
    push(db, q, ["b"])
    setq(db, q, dedup_window=60)
    age(db, pid, 600, upto=1)
    assert step(db, pid)["txns"] == 0  # 600 s < 900 s floor
    age(db, pid, 1000, upto=1)
    assert step(db, pid)["txns"] == 1
    log_start, txns_start, segs, txns = state(db, pid)
    assert (txns_start, txns, segs, log_start) == (2, 1, 2, 1)  # segments untouched
    # a push after the purge still deduplicates against what is left, and an ack of the purged
    # transactionId is unresolvable (api.md 4)
    res = db.execute("SELECT queen.log_ack_by_hash_v1(%s, %s, 'g', NULL, %s::bytea[],"
                     " %s::text[])", (T, pid, [xxhash.xxh3_128_digest(b"a")],
                                      ["completed"])).fetchone()[0]
    assert res["unresolved"] == [0]


def test_candidates_are_split_by_shard_and_skip_young_partitions(db):
    q_old, q_young = uq(), uq()
    old = push(db, q_old, ["a"])
    young = push(db, q_young, ["a"])
    setq(db, q_old, retention_enabled=True, retention_seconds=60)
    setq(db, q_young, retention_enabled=True, retention_seconds=60)
    age(db, old, 120)
    found = set()
    for shard in range(2):
        rows = db.execute("SELECT * FROM queen.retention_partitions_v2(0, 100000, 2, %s)",
                          (shard,)).fetchall()
        found |= {r[0] for r in rows}
        assert all(r[0] % 2 == shard for r in rows)
    assert old in found and young not in found


LEASE_ROWS_SQL = "SELECT lease_id FROM queen.log_leases WHERE lease_id = ANY (%s)"


def test_expired_leases_are_reclaimed_live_ones_kept(db):
    """Cursor rows and lease rows as a pop writes them (log_pop_v3): the expired lease's
    cursor drops its lease id and the lease's row goes; a released lease's row goes; the
    live lease and its row stay."""
    q = uq()
    pid = push(db, q, ["a"])
    live, dead, released = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group, lease_id,"
               " worker_id, lease_expires_at, batch_start, batch_end, attempt_count,"
               " released_lease_id) VALUES"
               " (%s, 'live', %s, 'w', now() + interval '1 minute', 1, 1, 1, NULL),"
               " (%s, 'dead', %s, 'w', now() - interval '1 second', 1, 1, 1, NULL),"
               " (%s, 'released', NULL, NULL, NULL, 1, 1, 1, %s)",
               (pid, live, pid, dead, pid, released))
    db.execute("INSERT INTO queen.log_leases (lease_id, tenant, consumer_group, partition_ids)"
               " SELECT l, %s, g, ARRAY[%s]::int8[]"
               " FROM unnest(%s::uuid[], ARRAY['live', 'dead', 'released']) AS x(l, g)",
               (uuid.UUID(int=0), pid, [live, dead, released]))
    # one cursor cleared, two lease rows deleted (other tests' leases may be reclaimed too)
    assert db.execute("SELECT queen.lease_reclaim_v1(100000)").fetchone()[0] >= 3
    rows = dict(db.execute("SELECT consumer_group, lease_id FROM queen.log_consumers"
                           " WHERE partition_id = %s", (pid,)).fetchall())
    assert rows == {"live": live, "dead": None, "released": None}
    attempts = db.execute("SELECT batch_start, attempt_count FROM queen.log_consumers"
                          " WHERE partition_id = %s AND consumer_group = 'dead'",
                          (pid,)).fetchone()
    assert attempts == (1, 1)  # a redelivery still counts its attempt
    kept = db.execute(LEASE_ROWS_SQL, ([live, dead, released],)).fetchall()
    assert kept == [(live,)]


def test_a_lease_row_stays_while_its_expired_cursor_is_locked(db, db_dsn):
    """A cursor that another transaction holds is skipped (SKIP LOCKED), and its lease's row
    kept, so that a later round clears the cursor."""
    q = uq()
    pid = push(db, q, ["a"])
    dead = uuid.uuid4()
    db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group, lease_id,"
               " worker_id, lease_expires_at, batch_start, batch_end, attempt_count) VALUES"
               " (%s, 'locked', %s, 'w', now() - interval '1 second', 1, 1, 1)", (pid, dead))
    db.execute("INSERT INTO queen.log_leases (lease_id, tenant, consumer_group, partition_ids)"
               " VALUES (%s, %s, 'locked', ARRAY[%s]::int8[])", (dead, uuid.UUID(int=0), pid))
    holder_sql = ("SELECT 1 FROM queen.log_consumers WHERE partition_id = %s"
                  " AND consumer_group = 'locked' FOR UPDATE")
    with psycopg.connect(db_dsn) as holder:
        holder.execute(holder_sql, (pid,))
        db.execute("SELECT queen.lease_reclaim_v1(100000)")
        assert db.execute(LEASE_ROWS_SQL, ([dead],)).fetchall() == [(dead,)]
        holder.rollback()
    assert db.execute("SELECT queen.lease_reclaim_v1(100000)").fetchone()[0] >= 2
    assert db.execute(LEASE_ROWS_SQL, ([dead],)).fetchall() == []
    cleared = db.execute("SELECT lease_id FROM queen.log_consumers WHERE partition_id = %s"
                         " AND consumer_group = 'locked'", (pid,)).fetchone()
    assert cleared == (None,)


@pytest.fixture
def fresh(fresh_db_dsn: str):
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        yield fresh_db_dsn, conn


def test_housekeeping_round_over_every_shard(fresh):
    """Six queues with retention on are trimmed by the rounds of both shards; two with the
    same seconds and retentionEnabled false keep everything."""
    dsn, conn = fresh
    pids, kept = [], []
    for n in range(8):
        q = uq()
        pid = push(conn, q, ["a"])
        push(conn, q, ["b"])
        setq(conn, q, retention_enabled=n < 6, retention_seconds=60,
             completed_retention_seconds=60)
        age(conn, pid, 120, upto=1)
        (pids if n < 6 else kept).append(pid)
    conn.execute("INSERT INTO queen.kv (ns, key, value, expires_at) VALUES"
                 " ('n', 'gone', '1', now() - interval '1 s'), ('n', 'kept', '1', NULL)")

    async def rounds() -> list[dict]:
        out = []
        for index in range(2):
            hk = Housekeeping(dsn, shards=2, index=index, every_s=60, name="test hk")
            out.append(await hk.round())
            await hk.close()
        return out

    done = asyncio.run(rounds())
    assert sum(d["segments"] for d in done) == 6
    assert done[0]["kv"] == 1
    assert all(state(conn, pid)[0] == 2 for pid in pids)
    assert all(state(conn, pid)[:3:2] == (1, 2) for pid in kept)
    assert [r[0] for r in conn.execute("SELECT key FROM queen.kv").fetchall()] == ["kept"]
