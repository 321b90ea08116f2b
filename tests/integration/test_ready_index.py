"""The ready index (schema/002_ready_index.sql, issue 26): a pop finds its partition in
``log_consumers_ready_idx`` instead of reading every partition of its queue, so the work of a
pop does not grow with the partition count; and the index never misses a cursor that has
something to deliver, whatever pushes, pops, acks, seeks, deletes and partition creations run
at the same time (functions/triggers.sql states the protocol these tests attack).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

import httpx
import psycopg
import pytest
import xxhash

from tests.integration.test_pop import (
    QUEUE_MODE,
    assert_204,
    drain,
    pop,
    pop_ok,
    push_n,
    seen_keys,
)
from tests.integration.test_push_json import push, uq

TENANT = uuid.UUID(int=0)

#: cursors that have something to deliver and are not in the index: must always be none
UNLISTED_SQL = """
    SELECT count(*) FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    WHERE (c.ready_at IS NULL OR c.queue_id IS NULL)
      AND GREATEST(c.committed_offset + 1, lp.log_start_offset) <= lp.last_offset"""

#: (partition, group) pairs of a started group that have no cursor row: must always be none
MISSING_SQL = """
    SELECT count(*) FROM queen.consumer_groups_meta m
    JOIN queen.log_partitions lp ON lp.queue_id = m.queue_id
    WHERE m.started AND NOT EXISTS (
        SELECT 1 FROM queen.log_consumers c
        WHERE c.partition_id = lp.id AND c.consumer_group = m.consumer_group)"""


def run_together(seconds: float, *loops: Callable[[threading.Event], None],
                 enough: Callable[[], bool] = lambda: True) -> None:
    """Each loop in a thread of its own until ``seconds`` have passed and ``enough()`` holds
    (or one of them failed); re-raises the first failure. ``enough`` makes a loaded machine run
    longer rather than do less work."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(loop: Callable[[threading.Event], None]) -> None:
        try:
            loop(stop)
        except BaseException as ex:
            errors.append(ex)
            stop.set()

    threads = [threading.Thread(target=run, args=(loop,)) for loop in loops]
    for t in threads:
        t.start()
    stop.wait(seconds)
    while not stop.is_set() and not enough():
        stop.wait(0.1)
    stop.set()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


def fill(client: httpx.Client, queue: str, partitions: int, prefix: str = "p") -> None:
    """One message on each of ``partitions`` partitions, 1,000 items a request."""
    for lo in range(0, partitions, 1000):
        res = push(client, [{"queue": queue, "partition": f"{prefix}{p:05d}", "payload": {"p": p}}
                            for p in range(lo, min(partitions, lo + 1000))])
        assert all(r["status"] == "queued" for r in res)


def reads_of_one_pop(db: psycopg.Connection, queue: str, group: str) -> tuple[list, dict]:
    """One autoAck single-message pop (rolled back) and the rows it read of each table of the
    pop path (counted, not timed: seq_tup_read + idx_tup_fetch of the transaction)."""
    tables = ("log_consumers", "log_partitions", "log_segments", "queues")
    sql = ("SELECT relname, seq_tup_read + COALESCE(idx_tup_fetch, 0)"
           " FROM pg_stat_xact_user_tables WHERE schemaname = 'queen' AND relname = ANY(%s)")
    with db.transaction(force_rollback=True):
        before = dict(db.execute(sql, (list(tables),)).fetchall())
        rows = db.execute(
            "SELECT partition_name, start_off, end_off FROM queen.log_pop_v3(%s, %s, NULL, NULL,"
            " NULL, %s, 1, 1, true, 'all', NULL, NULL, 5000) WHERE partition_id IS NOT NULL",
            (TENANT, queue, group)).fetchall()
        after = dict(db.execute(sql, (list(tables),)).fetchall())
    return rows, {t: after.get(t, 0) - before.get(t, 0) for t in tables}


def test_a_pop_reads_as_few_rows_at_5000_partitions_as_at_10(broker, db):
    """The issue's bound: at 5,000 partitions a pop reads the handful of rows it reads at 10
    (it read every partition and cursor of its queue before: 10,000 rows here)."""
    small, large = uq("ready"), uq("ready")
    fill(broker.client, small, 10)
    fill(broker.client, large, 5000)
    # the group's first pop creates its cursor rows (once); every later pop walks the index
    for q in (small, large):
        pop_ok(broker.client, q, batch=1, autoAck=True)
    assert db.execute("SELECT count(*) FROM queen.log_consumers c JOIN queen.queues q"
                      " ON q.id = c.queue_id WHERE q.name = %s AND c.ready_at IS NOT NULL",
                      (large,)).fetchone()[0] == 4999
    rows_small, reads_small = reads_of_one_pop(db, small, QUEUE_MODE)
    rows_large, reads_large = reads_of_one_pop(db, large, QUEUE_MODE)
    assert len(rows_small) == len(rows_large) == 1
    assert rows_large[0][1:] == (1, 1)
    assert sum(reads_large.values()) <= 16, reads_large
    assert sum(reads_large.values()) <= sum(reads_small.values()) + 2, (reads_small, reads_large)


def test_pops_still_claim_the_oldest_pending_partition_first_through_the_index(broker, db):
    q, g = uq("ready"), uq("g")
    for name in ("c", "a", "b"):
        push_n(broker.client, q, name, 1)
    push_n(broker.client, q, "c", 1, start=1)
    order = [seen_keys(pop_ok(broker.client, q, consumerGroup=g, batch=1, autoAck=True))[0]
             for _ in range(4)]
    assert order == [("c", 1), ("a", 1), ("b", 1), ("c", 2)]
    assert_204(pop(broker.client, q, consumerGroup=g, autoAck=True))
    assert db.execute(UNLISTED_SQL).fetchone()[0] == 0


def test_the_candidate_walk_is_an_index_scan_in_claim_order_under_a_generic_plan(broker, db):
    """What plpgsql settles on after a few pops (a generic plan) must still read the ready
    index in its order and stop early: no sort and no scan of the queue's partitions. The plan
    is read from auto_explain, not timed."""
    q = uq("ready")
    fill(broker.client, q, 30)
    pop_ok(broker.client, q, batch=1, autoAck=True)
    plans: list[str] = []
    db.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    with db.transaction(force_rollback=True):
        db.execute("LOAD 'auto_explain'")
        for name, value in (("plan_cache_mode", "force_generic_plan"),
                            ("auto_explain.log_min_duration", "0"),
                            ("auto_explain.log_nested_statements", "on"),
                            ("auto_explain.log_level", "notice")):
            db.execute("SELECT set_config(%s, %s, true)", (name, value))
        for _ in range(2):
            rows = db.execute(
                "SELECT partition_name FROM queen.log_pop_v3(%s, %s, NULL, NULL, NULL, %s, 1,"
                " 1, true, 'all', NULL, NULL, 5000) WHERE partition_id IS NOT NULL",
                (TENANT, q, QUEUE_MODE)).fetchall()
            assert len(rows) == 1
    walks = [p for p in plans if "log_consumers_ready_idx" in p]
    assert walks, plans
    for plan in walks:
        assert "Sort" not in plan and "log_partitions" not in plan, plan


def test_pushes_pops_and_acks_racing_on_few_partitions_never_unlist_a_pending_cursor(
        broker, db_dsn):
    """Four partitions, pushers, autoAck poppers and lease+ack consumers all at once: a
    cursor is cleared (ready_at NULL) by an ack or a claim that catches up while a push to the
    same partition is about to commit, over and over. The index must never miss a cursor with
    something pending, at any committed state (checked continuously), and every message is
    delivered to the group exactly once."""
    q, g = uq("race"), uq("g")
    parts = [f"r{i}" for i in range(4)]
    pushed: list[str] = []
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    violations: list[int] = []

    def pusher(stop: threading.Event) -> None:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            n = 0
            while not stop.is_set():
                items = [{"queue": q, "partition": parts[(n + k) % 4],
                          "transactionId": f"{uuid.uuid4()}", "payload": {"n": n}}
                         for k in range(2)]
                res = push(c, items)
                assert all(r["status"] == "queued" for r in res), res
                with lock:
                    pushed.extend(r["transactionId"] for r in res)
                n += 1

    def take(answer: dict) -> None:
        with lock:
            seen.update(m["transactionId"] for m in answer["messages"])

    def auto_popper(stop: threading.Event) -> None:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            while not stop.is_set():
                r = pop(c, q, consumerGroup=g, batch=1, autoAck=True)
                if r.status_code == 200:
                    take(r.json())

    def acker(stop: threading.Event) -> None:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            while not stop.is_set():
                r = pop(c, q, consumerGroup=g, batch=3)
                if r.status_code != 200:
                    continue
                answer = r.json()
                take(answer)
                a = c.post("/api/v1/ack/batch", json={"consumerGroup": g, "acknowledgments": [
                    {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": answer["leaseId"], "status": "completed"}
                    for m in answer["messages"]]})
                assert a.status_code == 200 and all(x["success"] for x in a.json()), a.text

    def watcher(stop: threading.Event) -> None:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            while not stop.is_set():
                n = conn.execute(UNLISTED_SQL).fetchone()[0]
                if n:
                    violations.append(n)
                time.sleep(0.005)

    run_together(8, pusher, pusher, auto_popper, auto_popper, acker, watcher,
                 enough=lambda: len(pushed) > 200)
    assert violations == []
    for m in drain(broker.client, q, g, batch=50, partitions=4):
        seen[m["transactionId"]] += 1
    assert set(seen) == set(pushed)
    assert [t for t, n in seen.items() if n != 1] == []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(UNLISTED_SQL).fetchone()[0] == 0
        assert conn.execute("SELECT queen.log_ready_repair_v1()").fetchone()[0] == 0


def test_partitions_created_while_groups_start_all_get_their_cursors(broker, db_dsn):
    """A partition created while a group records its first start: either the start sees the
    partition or the partition's creation sees the group (the queue row lock between them).
    Groups start one after another while pushes create partitions; afterwards every started
    group has a cursor on every partition and can pop every message."""
    q = uq("grow")
    push_n(broker.client, q, "seed", 1)
    created: list[str] = []
    groups: list[str] = []

    def creator(stop: threading.Event) -> None:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            n = 0
            while not stop.is_set():
                names = [f"n{threading.get_ident()}-{n}-{k}" for k in range(3)]
                res = push(c, [{"queue": q, "partition": p, "payload": {}} for p in names])
                assert all(r["status"] == "queued" for r in res), res
                created.extend(names)
                n += 1
                time.sleep(0.05)

    def starter(stop: threading.Event) -> None:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            while not stop.is_set():
                g = uq("g")
                r = pop(c, q, consumerGroup=g, batch=1)
                assert r.status_code in (200, 204), r.text
                groups.append(g)

    run_together(5, creator, creator, starter)
    assert len(groups) > 10 and len(created) > 30
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(MISSING_SQL).fetchone()[0] == 0
        assert conn.execute(UNLISTED_SQL).fetchone()[0] == 0
    # the last group to start sees every partition, all messages but the one it leased
    last = drain(broker.client, q, groups[-1], batch=100, partitions=100)
    assert len(last) == 1 + len(created) - 1


def test_delete_keeping_metadata_drops_the_cursors_and_the_next_pop_restarts(broker, db):
    q, g = uq("ready"), uq("g")
    push_n(broker.client, q, "a", 2)
    push_n(broker.client, q, "b", 1)
    assert len(drain(broker.client, q, g)) == 3
    r = broker.client.delete(f"/api/v1/consumer-groups/{g}/queues/{q}",
                             params={"deleteMetadata": "false"})
    assert r.status_code == 200 and r.json()["deletedPartitions"] == 2, r.text
    assert db.execute("SELECT count(*) FROM queen.log_consumers WHERE consumer_group = %s",
                      (g,)).fetchone()[0] == 0
    assert db.execute("SELECT subscription_mode, started FROM queen.consumer_groups_meta m"
                      " JOIN queen.queues q ON q.id = m.queue_id"
                      " WHERE q.name = %s AND m.consumer_group = %s",
                      (q, g)).fetchone() == ("all", False)
    again = drain(broker.client, q, g)  # from the recorded start: the log start
    assert sorted((m["partition"], m["offset"]) for m in again) == [("a", 1), ("a", 2),
                                                                    ("b", 1)]


def test_every_cursor_writer_sets_the_flag_itself(broker, db):
    """No trigger keeps the index since cons8: each writer that moves a cursor sets ready_at
    through pop.sql's log_ready_at_v1. After every kind of move (a seek to the log start, to
    its end, to a time; a subscription move; a lease-less ack; a purge) no cursor with
    something pending is unlisted, and none with nothing pending stays listed."""
    q, g, h = uq("writers"), uq("g"), uq("h")
    push_n(broker.client, q, "a", 3)
    between = db.execute("SELECT clock_timestamp()").fetchone()[0]
    time.sleep(0.01)
    push_n(broker.client, q, "b", 2)
    got = drain(broker.client, q, g)  # started, everything consumed
    assert len(got) == 5
    b_msgs = sorted((m["offset"], m["partitionId"], m["transactionId"]) for m in got
                    if m["partition"] == "b")

    def listed(group: str) -> list[str]:
        assert db.execute(UNLISTED_SQL).fetchone()[0] == 0
        return [r[0] for r in db.execute(
            "SELECT lp.name FROM queen.log_consumers c JOIN queen.log_partitions lp"
            " ON lp.id = c.partition_id JOIN queen.queues q ON q.id = lp.queue_id"
            " WHERE q.name = %s AND c.consumer_group = %s AND c.ready_at IS NOT NULL"
            " ORDER BY 1", (q, group))]

    seek = "SELECT queen.group_seek_v1(%s, %s, %s, %s, %s)"
    assert listed(g) == []
    db.execute(seek, (TENANT, g, q, "beginning", None))
    assert listed(g) == ["a", "b"]
    db.execute(seek, (TENANT, g, q, "end", None))
    assert listed(g) == []
    db.execute(seek, (TENANT, g, q, "timestamp", between))
    assert listed(g) == ["b"]
    # lease-less acks of b's messages: the first leaves one pending, the second none
    ack = ("SELECT queen.log_ack_by_hash_v1(%s::uuid, %s::int8, %s::text, NULL::uuid,"
           " %s::bytea[], ARRAY['completed'])")
    for (_, pid, tx), left in zip(b_msgs, (["b"], []), strict=True):
        assert db.execute(ack, (TENANT, pid, g, [xxhash.xxh3_128_digest(tx.encode())])
                          ).fetchone()[0]["ok"] is True
        assert listed(g) == left

    # h's cursors made by a seek to the end (nothing consumed), then moved by a subscription
    db.execute(seek, (TENANT, h, q, "end", None))
    assert listed(h) == []
    db.execute("SELECT * FROM queen.group_subscription_v1(%s, %s, %s, %s)",
               (TENANT, h, q, between))
    assert listed(h) == ["b"]

    # a purge moves every cursor below its new log start up to it: nothing is pending
    db.execute(seek, (TENANT, g, q, "beginning", None))
    assert listed(g) == ["a", "b"]
    db.execute("SELECT queen.queue_purge_v1(%s, %s)", (TENANT, q))
    assert listed(g) == [] and listed(h) == []
    # and the next push lists them again (the allocators' half)
    push_n(broker.client, q, "a", 1)
    assert listed(g) == ["a"] and listed(h) == ["a"]


def test_a_drain_pop_leaves_its_cursor_listed_while_an_allocator_holds_the_partition(
        broker, db, db_dsn):
    """An autoAck pop that takes a partition's last message writes NULL (caught up) only under
    the partition's FOR SHARE, which log_pop_v3 takes itself since pop15 (log_ready_at_v1's
    call before): while a push's allocator holds the row, the cursor stays listed with a time,
    and the next pop that meets it, the push gone, clears it."""
    q = uq("drainlock")
    push_n(broker.client, q, "a", 1)
    push_n(broker.client, q, "b", 2)
    pop_one = ("SELECT partition_name, end_off FROM queen.log_pop_v3(%s, %s, %s, NULL, NULL,"
               " 'g', 1, 1, true, 'all', NULL, NULL, 5000) WHERE partition_id IS NOT NULL")
    flag = ("SELECT c.ready_at IS NOT NULL FROM queen.log_consumers c"
            " JOIN queen.log_partitions lp ON lp.id = c.partition_id"
            " JOIN queen.queues q ON q.id = lp.queue_id"
            " WHERE q.name = %s AND lp.name = %s AND c.consumer_group = 'g'")
    assert db.execute(pop_one, (TENANT, q, "b")).fetchall() == [("b", 1)]  # the group starts
    with psycopg.connect(db_dsn) as holder:  # an allocator's row lock, as a push holds it
        holder.execute("SELECT 1 FROM queen.log_partitions lp JOIN queen.queues q"
                       " ON q.id = lp.queue_id WHERE q.name = %s AND lp.name IN ('a', 'b')"
                       " ORDER BY lp.id FOR UPDATE OF lp", (q,))
        assert db.execute(pop_one, (TENANT, q, "a")).fetchall() == [("a", 1)]
        assert db.execute(pop_one, (TENANT, q, "b")).fetchall() == [("b", 2)]
        assert db.execute(flag, (q, "a")).fetchone()[0] is True
        assert db.execute(flag, (q, "b")).fetchone()[0] is True
        holder.rollback()
    assert db.execute(UNLISTED_SQL).fetchone()[0] == 0
    for part in ("a", "b"):
        assert db.execute(pop_one, (TENANT, q, part)).fetchall() == []
        assert db.execute(flag, (q, part)).fetchone()[0] is False
    # and without the lock a drain clears the flag in its own claim
    push_n(broker.client, q, "a", 1, start=1)
    assert db.execute(flag, (q, "a")).fetchone()[0] is True
    assert db.execute(pop_one, (TENANT, q, "a")).fetchall() == [("a", 2)]
    assert db.execute(flag, (q, "a")).fetchone()[0] is False


@pytest.mark.parametrize("damage", ["flag", "queue_id", "cursor", "unstarted"])
def test_the_repair_restores_what_an_older_build_left(broker, db, damage):
    """What a broker of the previous build writes during an upgrade (its pops create cursor
    rows one by one without queue_id or flag, its pushes set no flag) is repaired by
    log_ready_repair_v1 (run by the family files and by housekeeping); a pop finds the
    partition afterwards. The damage and the repair share a transaction: the broker's own
    housekeeping runs the same repair every round."""
    q, g = uq("repair"), uq("g")
    push_n(broker.client, q, "a", 1)
    assert len(drain(broker.client, q, g)) == 1  # started, caught up
    pid = db.execute("SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues q"
                     " ON q.id = lp.queue_id WHERE q.name = %s", (q,)).fetchone()[0]
    with db.transaction():
        db.execute("SET LOCAL session_replication_role = replica")  # no triggers: old build
        db.execute("UPDATE queen.log_partitions SET last_offset = last_offset + 1"
                   " WHERE id = %s", (pid,))  # (its segment below)
        db.execute("INSERT INTO queen.log_segments (partition_id, base_offset, msg_count,"
                   " created_at, payload) SELECT %s, 2, 1, now(), payload"
                   " FROM queen.log_segments WHERE partition_id = %s AND base_offset = 1",
                   (pid, pid))
        db.execute("INSERT INTO queen.log_txns (partition_id, base_offset, msg_count,"
                   " created_at, hashes) SELECT %s, 2, 1, now(), hashes"
                   " FROM queen.log_txns WHERE partition_id = %s AND base_offset = 1",
                   (pid, pid))
        if damage == "queue_id":
            db.execute("UPDATE queen.log_consumers SET queue_id = NULL, ready_at = now()"
                       " WHERE partition_id = %s AND consumer_group = %s", (pid, g))
        elif damage in ("cursor", "unstarted"):
            db.execute("DELETE FROM queen.log_consumers WHERE partition_id = %s", (pid,))
            if damage == "unstarted":  # an old pop made the record, and a cursor elsewhere
                db.execute("UPDATE queen.consumer_groups_meta SET started = false"
                           " WHERE consumer_group = %s", (g,))
                db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group,"
                           " committed_offset) VALUES (%s, %s, 1)", (pid, g))
        # in the same transaction, so that no housekeeping round repairs it first
        db.execute("SET LOCAL session_replication_role = origin")
        assert db.execute(UNLISTED_SQL).fetchone()[0] + db.execute(MISSING_SQL).fetchone()[0] > 0
        with db.transaction(force_rollback=True):  # a pop does not see it
            assert db.execute(
                "SELECT partition_id FROM queen.log_pop_v3(%s, %s, NULL, NULL, NULL, %s, 10, 1,"
                " true, 'all', NULL, NULL, 5000)", (TENANT, q, g)).fetchall() == [(None,)]
        assert db.execute("SELECT queen.log_ready_repair_v1()").fetchone()[0] > 0
        assert db.execute(UNLISTED_SQL).fetchone()[0] == 0
        assert db.execute(MISSING_SQL).fetchone()[0] == 0
    got = drain(broker.client, q, g)
    expected = [("a", 1), ("a", 2)] if damage == "cursor" else [("a", 2)]
    assert [(m["partition"], m["offset"]) for m in got] == expected
    assert db.execute("SELECT queen.log_ready_repair_v1()").fetchone()[0] == 0


def test_a_housekeeping_repair_reads_one_slice_whatever_the_table_holds(broker, db):
    """Housekeeping's backstop (log_ready_repair_v3) reads the partitions of its slice, not
    every cursor of the table: the whole repair, run every round, read 20,000 rows here and
    200-350 ms of PostgreSQL time a round at 55,000 partitions (issue 26). A slice without
    damage finds nothing; the slice holding the damage repairs it."""
    q = uq("slice")
    fill(broker.client, q, 5000)
    pop_ok(broker.client, q, batch=1, autoAck=True)  # the group starts: 5,000 cursor rows
    lo, hi = db.execute("SELECT min(lp.id), max(lp.id) FROM queen.log_partitions lp"
                        " JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s",
                        (q,)).fetchone()
    # NOTE(queen): with the statistics autovacuum keeps in service; right after 5,000 inserts
    # they may still say the tables are small, and a plan for small tables reads them whole
    # (a clean-clone CI run read 10,472 rows so: that is the planner, not the slice)
    db.execute("ANALYZE queen.log_partitions, queen.log_consumers")
    sql = ("SELECT sum(seq_tup_read + COALESCE(idx_tup_fetch, 0)) FROM pg_stat_xact_user_tables"
           " WHERE schemaname = 'queen' AND relname = ANY(%s)")
    tables = ["log_consumers", "log_partitions", "log_segments"]  # the ones partitions grow
    with db.transaction():
        db.execute("SET LOCAL session_replication_role = replica")  # unflag a pending cursor
        db.execute("UPDATE queen.log_consumers SET ready_at = NULL WHERE partition_id = %s",
                   (hi,))
        db.execute("SET LOCAL session_replication_role = origin")
        # a record that a subscription call made (not started): its test must not read every
        # cursor of the table either (it was planned as a hash of a sequential scan)
        db.execute("INSERT INTO queen.consumer_groups_meta (queue_id, consumer_group,"
                   " subscription_mode) SELECT id, %s, 'all' FROM queen.queues WHERE name = %s",
                   (uq("sub"), q))
        before = db.execute(sql, (tables,)).fetchone()[0]
        repaired, after = db.execute("SELECT * FROM queen.log_ready_repair_v3(%s, 100)",
                                     (lo - 1,)).fetchone()
        reads = db.execute(sql, (tables,)).fetchone()[0] - before
        assert repaired == 0
        assert after == db.execute("SELECT id FROM queen.log_partitions WHERE id >= %s"
                                   " ORDER BY id OFFSET 99 LIMIT 1", (lo,)).fetchone()[0]
        assert reads <= 1000, reads  # about 6 a partition of the slice
        assert db.execute("SELECT * FROM queen.log_ready_repair_v3(%s, 100)",
                          (hi - 1,)).fetchone()[0] == 1
        assert db.execute(UNLISTED_SQL).fetchone()[0] == 0
    # a sweep wraps around once it reached the last partition
    assert db.execute("SELECT * FROM queen.log_ready_repair_v3((SELECT max(id)"
                      " FROM queen.log_partitions), 100)").fetchone() == (0, 0)


def nested_plans(conn: psycopg.Connection) -> list[str]:
    """The plans auto_explain reports for every statement ``conn`` runs from now on, nested
    ones (inside functions) included: a list the notices fill."""
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0",
                    "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice"):
        conn.execute(f"SET {setting}")
    return plans


def test_a_housekeeping_repair_probes_each_missing_cursor_by_both_keys(broker, db_dsn):
    """The slice's test for missing cursors of a started group is a probe by (partition,
    group) per partition of the slice, never an anti-join: on tables no ANALYZE had seen since
    they were small (a queue filled, started and drained within a minute) the planner made the
    anti-join read every cursor of the group for each partition of the slice, through
    log_consumers_group_idx on the group alone (1.5 s of CPU a round at 5,000 partitions;
    pop15). Its plan, through auto_explain's nested statements."""
    q = uq("probe")
    fill(broker.client, q, 20)
    pop_ok(broker.client, q, batch=1, autoAck=True)  # a started group
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        plans = nested_plans(conn)
        assert conn.execute("SELECT * FROM queen.log_ready_repair_v3(0, 5000)"
                            ).fetchone()[0] == 0
    (missing,) = [p for p in plans if "g.started" in p and "Query Text" in p]
    assert "Anti Join" not in missing, missing
    assert "SubPlan" in missing, missing


def test_a_group_start_probes_each_partition_by_both_keys(broker, db_dsn):
    """A group's first pop creates its cursor rows (group_start_v1) after testing each
    partition of the queue for one by (partition, group): a subplan per partition, never an
    anti-join. Planned with statistics ANALYZE took while the table held few cursors, the
    anti-join read every cursor of the group in the database for each partition: the first
    pop of a queue mode drain of 5,000 partitions, beside another queue's 50,000 cursors of
    that group, took 7.5 s (bench/partitions.py in make bench, issue 26; 68 ms as probes).
    Its plan, through auto_explain's nested statements, in a rolled back pop."""
    q = uq("gstart")
    fill(broker.client, q, 20)
    with psycopg.connect(db_dsn) as conn:
        plans = nested_plans(conn)
        claimed = conn.execute(
            "SELECT count(*) FROM queen.log_pop_v3(%s, %s, NULL, NULL, NULL, %s, 1, 1, true,"
            " 'all', NULL, NULL, 5000) WHERE partition_id IS NOT NULL",
            (TENANT, q, QUEUE_MODE)).fetchone()[0]
        conn.rollback()
    assert claimed == 1
    (start,) = [p for p in plans if "INSERT INTO queen.log_consumers AS c" in p
                and "Query Text" in p]
    assert "Anti Join" not in start, start
    assert "SubPlan" in start, start


def test_a_group_start_and_lease_less_acks_of_that_group_never_collide(broker, db_dsn):
    """A group's start inserts its cursor rows without ON CONFLICT; the only other writer that
    can create the same rows at the same time, a lease-less ack's first touch, takes the queue
    row FOR KEY SHARE first, so one waits for the other. Each round starts a new group on 50
    partitions while another transaction acks lease-less on all of them for that group and
    holds its rows a moment: without that lock the start fails with a unique violation."""
    q = uq("touch")
    fill(broker.client, q, 50)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id"
            " WHERE q.name = %s ORDER BY lp.id", (q,))]
    assert len(pids) == 50
    errors: list[str] = []

    def start(group: str, go: threading.Barrier) -> None:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            go.wait()
            try:
                conn.execute("SELECT count(*) FROM queen.log_pop_v3(%s, %s, NULL, NULL, NULL,"
                             " %s, 1, 1, true, 'all', NULL, gen_random_uuid(), 5000)",
                             (uuid.UUID(int=0), q, group))
            except psycopg.Error as ex:
                errors.append(f"start: {ex}")

    def touch(group: str, go: threading.Barrier) -> None:
        with psycopg.connect(db_dsn) as conn:
            go.wait()
            try:
                for pid in pids:
                    conn.execute("SELECT queen.log_ack_by_hash_v1(%s, %s, %s, NULL,"
                                 " ARRAY[decode(repeat('00', 16), 'hex')], ARRAY['completed'])",
                                 (uuid.UUID(int=0), pid, group))
                time.sleep(0.02)
                conn.commit()
            except psycopg.Error as ex:
                errors.append(f"touch: {ex}")

    for _ in range(8):
        group, go = uq("g"), threading.Barrier(2)
        threads = [threading.Thread(target=f, args=(group, go)) for f in (start, touch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert errors == []
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM queen.log_consumers"
                                " WHERE consumer_group = %s", (group,)).fetchone()[0] == 50
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(UNLISTED_SQL).fetchone()[0] == 0


def _sql_pop(db: psycopg.Connection, queue: str | None, partition: str | None = None,
             namespace: str | None = None) -> list[tuple]:
    """One leased single-message pop of the queue-mode group: (partition, wake_in_ms) rows."""
    return db.execute(
        "SELECT partition_name, wake_in_ms FROM queen.log_pop_v3(%s, %s, %s, %s, NULL, %s, 1,"
        " 1, false, 'all', NULL, %s, 5000)"
        " WHERE partition_id IS NOT NULL OR base_offset IS NULL",
        (TENANT, queue, partition, namespace, QUEUE_MODE, uuid.uuid4())).fetchall()


@pytest.mark.parametrize("scope", ["queue", "partition", "namespace"])
def test_a_pop_that_finds_only_leased_cursors_wakes_at_the_earliest_lease_expiry(
        broker, db, scope):
    """Leased cursors are left out of the candidate walk by its index scan's filter, so an
    empty answer's wake-up time comes from a query of its own: it must still name the moment
    the first lease frees its partition (a parked pop is re-tried then, no push needed)."""
    q = uq("held")
    push_n(broker.client, q, "a", 1)
    push_n(broker.client, q, "b", 1)
    assert [r[0] for r in _sql_pop(db, q)] == ["a"]
    assert [r[0] for r in _sql_pop(db, q)] == ["b"]  # a's lease is skipped, b is claimed
    db.execute("UPDATE queen.log_consumers c SET lease_expires_at = now() + interval '7 s'"
               " FROM queen.log_partitions lp WHERE lp.id = c.partition_id AND lp.name = 'b'"
               " AND c.queue_id = lp.queue_id AND c.queue_id = (SELECT id FROM queen.queues"
               " WHERE name = %s)", (q,))
    args = {"queue": (q, None, None), "partition": (q, "b", None),
            "namespace": (None, None, q)}[scope]
    rows = _sql_pop(db, *args)
    assert len(rows) == 1 and rows[0][0] is None, rows
    wake = rows[0][1]
    retry_ms = db.execute("SELECT retry_delay FROM queen.queues WHERE name = %s",
                          (q,)).fetchone()[0]
    # b frees up first (7 s and retryDelay; a's lease is the queue's leaseTime, 60 s or more);
    # a partition pop sees only b
    assert wake is not None and 5_000 + retry_ms < wake <= 7_000 + retry_ms, (rows, retry_ms)
