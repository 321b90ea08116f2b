"""The ack procedures (sql/040_ack.sql), called directly.

ack-internals.md "The authoritative decision procedure" and api.md 2.4: log_ack_by_hash_v1
(resolution, signal, branch table, noop / stale / unresolved / clamped, repeat safety),
log_dlq_head_v1 (DLQ filing), log_ack_at_v1 (registry fast path) and log_ack_multi_v3 (fusion).

Data comes from the real push procedure; leases are written straight into log_consumers with
the lead's conventions (lease_id, worker_id = lease_id::text, lease_expires_at, batch_start,
batch_end). The `db` database is this module's own (its payloads are placeholders no route
can decode, which another module's unfiltered listing must never meet); every test uses its
own queue.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import pytest
import xxhash
from psycopg.rows import dict_row

from tests.pgharness import module_db_dsn, wait_for_lock_wait

db_dsn = module_db_dsn  # this module's own database (the docstring says why)

DEFAULT_TENANT = uuid.UUID(int=0)
PUSH_MULTI = (
    "SELECT queen.log_push_multi_v1(%s::text[], %s::text[], %s::int4[], %s::bytea[],"
    " %s::int8[], %s::bytea[], %s::uuid[])"
)
ACK = (
    "SELECT queen.log_ack_by_hash_v1(%s::uuid, %s::int8, %s::text, %s::uuid, %s::bytea[],"
    " %s::text[])"
)
DLQ_HEAD = (
    "SELECT queen.log_dlq_head_v1(%s::uuid, %s::int8, %s::text, %s::uuid, %s::int8, %s::uuid,"
    " %s::text, %s::uuid, %s::text, %s::boolean, %s::bytea, %s::text, %s::timestamptz)"
)
ACK_AT = "SELECT queen.log_ack_at_v1(%s::uuid, %s::int8, %s::text, %s::uuid, %s::int8, %s::int4)"
ACK_MULTI = (
    "SELECT queen.log_ack_multi_v3(%s::uuid, %s::int8[], %s::text[], %s::uuid[], %s::int8[],"
    " %s::int4[])"
)
MULTI_ERRORS = (None, "lease_invalid", "partition_not_found", "beyond_batch", "partly_committed")
G = "billing"
RESULT_KEYS = {"ok", "error", "old", "new", "acked", "leaseReleased", "dlq", "poison",
               "signalIndex", "signal", "dropped", "retryCount", "noop", "stale", "unresolved",
               "clamped", "invalid", "queue"}


def uq(prefix: str = "ack") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def h(txn: str) -> bytes:
    return xxhash.xxh3_128_digest(txn.encode())


@dataclass
class Part:
    """One partition with messages pushed: offset k carries transactionId txn(k)."""

    queue: str
    name: str
    pid: int

    def txn(self, off: int) -> str:
        return f"{self.queue}/{self.name}/{off}"


def push_txns(conn, queue: str, partition: str, txns: list[str],
              tenant: uuid.UUID = DEFAULT_TENANT) -> dict:
    row = conn.execute(PUSH_MULTI, (
        [queue], [partition], [len(txns)], [b"".join(h(t) for t in txns)], [0],
        ["|".join(txns).encode()], [tenant])).fetchone()
    assert row is not None and row[0][0]["s"] == "queued", row
    return row[0][0]


def make_part(conn, n: int = 5, *, segments: list[int] | None = None, queue: str | None = None,
              name: str = "p", tenant: uuid.UUID = DEFAULT_TENANT) -> Part:
    """A partition holding offsets 1..n, pushed as `segments` (sizes) or one segment."""
    queue = queue or uq()
    sizes = segments or [n]
    assert sum(sizes) == n
    part = Part(queue, name, 0)
    off = 0
    for size in sizes:
        res = push_txns(conn, queue, name, [part.txn(off + k + 1) for k in range(size)], tenant)
        assert res["base"] == off + 1
        part.pid = res["pid"]
        off += size
    return part


def configure(conn, part: Part, **opts) -> None:
    sets = ", ".join(f"{k} = %({k})s" for k in opts)
    conn.execute(f"UPDATE queen.queues SET {sets} WHERE id = "
                 "(SELECT queue_id FROM queen.log_partitions WHERE id = %(pid)s)",
                 {**opts, "pid": part.pid})


def insert_cursor(conn, pid: int, group: str) -> None:
    """The cursor row (at 0) as the broker's writers create it: with its queue and its ready
    flag (the writers set both themselves, pop.sql's log_ready_at_v1; no trigger does)."""
    conn.execute(
        "INSERT INTO queen.log_consumers (partition_id, consumer_group, queue_id, ready_at) "
        "SELECT lp.id, %s, lp.queue_id, queen.log_ready_at_v1(lp.id, 0, NULL, NULL)"
        " FROM queen.log_partitions lp WHERE lp.id = %s "
        "ON CONFLICT DO NOTHING", (group, pid))


def lease(conn, pid: int, start: int, end: int, group: str = G, seconds: float = 60,
          **extra) -> uuid.UUID:
    """Give (pid, group) a live lease over [start, end]; returns the lease id."""
    lid = uuid.uuid4()
    cols = {"lease_id": lid, "worker_id": str(lid), "batch_start": start, "batch_end": end,
            "secs": seconds, **extra}
    extra_sets = "".join(f", {k} = %({k})s" for k in extra)
    insert_cursor(conn, pid, group)
    conn.execute(
        "UPDATE queen.log_consumers SET lease_id = %(lease_id)s, worker_id = %(worker_id)s, "
        "lease_expires_at = now() + make_interval(secs => %(secs)s), leased_at = now(), "
        "batch_start = %(batch_start)s, batch_end = %(batch_end)s" + extra_sets +
        " WHERE partition_id = %(pid)s AND consumer_group = %(g)s",
        {**cols, "pid": pid, "g": group})
    return lid


def consumer(conn, pid: int, group: str = G) -> dict | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM queen.log_consumers "
                           "WHERE partition_id = %s AND consumer_group = %s",
                           (pid, group)).fetchone()


def set_cursor(conn, pid: int, committed: int, group: str = G, **extra) -> None:
    insert_cursor(conn, pid, group)
    sets = "".join(f", {k} = %({k})s" for k in extra)
    conn.execute("UPDATE queen.log_consumers SET committed_offset = %(c)s,"
                 " ready_at = queen.log_ready_at_v1(partition_id, %(c)s, NULL, NULL)" + sets +
                 " WHERE partition_id = %(pid)s AND consumer_group = %(g)s",
                 {**extra, "c": committed, "pid": pid, "g": group})


def ack(conn, part: Part | int, items: list[tuple[str | bytes, str]],
        lease_id: uuid.UUID | None = None, group: str = G,
        tenant: uuid.UUID = DEFAULT_TENANT) -> dict:
    """items: (transactionId or raw 16-byte hash, status)."""
    pid = part.pid if isinstance(part, Part) else part
    hashes = [t if isinstance(t, bytes) else h(t) for t, _ in items]
    res = conn.execute(ACK, (tenant, pid, group, lease_id, hashes,
                             [s for _, s in items])).fetchone()[0]
    assert set(res) == RESULT_KEYS, res
    if res["ok"]:
        assert res["acked"] == res["new"] - res["old"]
    return res


def items(part: Part, spec: list[tuple[int, str]]) -> list[tuple[str, str]]:
    return [(part.txn(off), status) for off, status in spec]


def payload_of(offset: int) -> bytes:
    """JSON text, as every broker route stores it: a DLQ listing splices it verbatim, so a
    non-JSON payload here broke the all-queues listing of test_dlq.py run after this file."""
    return b'"payload-%d"' % offset


def dlq_head(conn, part: Part, offset: int, lease_id: uuid.UUID | None, error: str = "boom",
             group: str = G, tenant: uuid.UUID = DEFAULT_TENANT, message_id=None) -> dict:
    return conn.execute(DLQ_HEAD, (
        tenant, part.pid, group, lease_id, offset, message_id or uuid.uuid4(), part.txn(offset),
        None, "sub-1", False, payload_of(offset), error, None)).fetchone()[0]


def ack_at(conn, pid: int, lease_id, batch_end: int, count: int = 1, group: str = G,
           tenant: uuid.UUID = DEFAULT_TENANT) -> dict:
    return conn.execute(ACK_AT, (tenant, pid, group, lease_id, batch_end, count)).fetchone()[0]


def ack_multi(conn, rows: list[tuple[int, str, uuid.UUID | None, int, int]],
              tenant: uuid.UUID = DEFAULT_TENANT) -> list[dict]:
    """log_ack_multi_v3's (code, old, new) per row as log_ack_at_v1's objects plus "i"."""
    flat = conn.execute(ACK_MULTI, (
        tenant, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
        [r[3] for r in rows], [r[4] for r in rows])).fetchone()[0]
    assert len(flat) == 3 * len(rows)
    return [{"i": k, "ok": flat[3 * k] == 0, "error": MULTI_ERRORS[flat[3 * k]],
             "old": flat[3 * k + 1], "new": flat[3 * k + 2], "leaseReleased": flat[3 * k] == 0}
            for k in range(len(rows))]


def dlq_rows(conn, pid: int, group: str = G) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM queen.log_dlq WHERE partition_id = %s "
                           "AND consumer_group = %s ORDER BY id", (pid, group)).fetchall()


def assert_live(row: dict, lid: uuid.UUID) -> None:
    assert row["lease_id"] == lid and row["worker_id"] == str(lid)
    assert row["lease_expires_at"] is not None


def assert_released(row: dict, lid: uuid.UUID, *, redeliver: bool = False) -> None:
    """Released; a release for redelivery keeps its time in lease_expires_at (retryDelay)."""
    assert row["lease_id"] is None and row["worker_id"] is None
    if redeliver:
        assert row["lease_expires_at"] is not None
        assert row["lease_expires_at"] <= datetime.now(UTC)
    else:
        assert row["lease_expires_at"] is None
    assert row["released_lease_id"] == lid


# ---------------------------------------------------------------------------------------------
# The branch table
# ---------------------------------------------------------------------------------------------

def test_dlq_signal_advances_prefix_keeps_lease_and_hands_off_the_poison(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, batch_retry_count=1)
    res = ack(db, p, items(p, [(1, "completed"), (2, "completed"), (3, "dlq")]), lid)
    assert res["ok"] and res["error"] is None
    assert (res["old"], res["new"], res["acked"]) == (0, 2, 2)
    assert (res["dlq"], res["poison"], res["signal"], res["signalIndex"]) == (True, 3, "dlq", 2)
    assert res["leaseReleased"] is False and res["dropped"] is False
    assert res["retryCount"] == 0  # the cursor moved: the head's count restarted
    row = consumer(db, p.pid)
    assert_live(row, lid)
    assert row["committed_offset"] == 2 and row["total_consumed"] == 2
    assert row["last_consumed_at"] is not None


def test_failed_with_budget_releases_and_charges_once(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, attempt_count=2)
    res = ack(db, p, items(p, [(1, "completed"), (2, "failed"), (2, "failed")]), lid)
    assert res["ok"] and (res["old"], res["new"]) == (0, 1)
    assert (res["signal"], res["signalIndex"], res["dlq"]) == ("failed", 1, False)
    assert res["leaseReleased"] is True and res["retryCount"] == 1
    assert res["clamped"] == [2]  # the second mention of the signal position is not acted on
    row = consumer(db, p.pid)
    assert_released(row, lid, redeliver=True)
    assert row["committed_offset"] == 1 and row["batch_retry_count"] == 1
    # attempt_count and the batch are kept on release (the pop counts redeliveries with them)
    assert (row["attempt_count"], row["batch_start"], row["batch_end"]) == (2, 1, 5)


@pytest.mark.parametrize(("dead_letter_queue", "dlq_after_max_retries"),
                         [(True, True), (True, False), (False, True)])
def test_failed_exhausted_with_dlq_enabled_acts_as_dlq(db, dead_letter_queue,
                                                       dlq_after_max_retries):
    p = make_part(db, 5)
    configure(db, p, retry_limit=2, dead_letter_queue=dead_letter_queue,
              dlq_after_max_retries=dlq_after_max_retries)
    lid = lease(db, p.pid, 1, 5, batch_retry_count=2)
    res = ack(db, p, items(p, [(1, "failed"), (2, "completed")]), lid)
    assert res["ok"] and (res["old"], res["new"]) == (0, 0)
    assert (res["dlq"], res["poison"], res["signal"], res["signalIndex"]) == (True, 1, "failed", 0)
    assert res["leaseReleased"] is False and res["dropped"] is False
    assert res["retryCount"] == 2 and res["clamped"] == [1]
    row = consumer(db, p.pid)
    assert_live(row, lid)
    assert row["batch_retry_count"] == 2 and row["committed_offset"] == 0


def test_failed_exhausted_with_dlq_disabled_drops_the_poison(db):
    p = make_part(db, 5)
    configure(db, p, retry_limit=0, dead_letter_queue=False, dlq_after_max_retries=False)
    lid = lease(db, p.pid, 1, 5, attempt_count=3)
    res = ack(db, p, items(p, [(1, "completed"), (2, "failed"), (4, "completed")]), lid)
    assert res["ok"] and (res["old"], res["new"], res["acked"]) == (0, 2, 2)
    assert res["dropped"] is True and res["dlq"] is False and res["poison"] == 2
    assert res["leaseReleased"] is True and res["retryCount"] == 0
    assert res["clamped"] == [2]
    row = consumer(db, p.pid)
    assert_released(row, lid)
    assert (row["committed_offset"], row["batch_retry_count"], row["attempt_count"]) == (2, 0, 0)
    assert dlq_rows(db, p.pid) == []


def test_retry_releases_without_a_charge(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, batch_retry_count=2, attempt_count=1)
    res = ack(db, p, items(p, [(1, "retry")]), lid)
    assert res["ok"] and (res["old"], res["new"]) == (0, 0)
    assert (res["signal"], res["leaseReleased"], res["retryCount"]) == ("retry", True, 2)
    row = consumer(db, p.pid)
    assert_released(row, lid)  # a hand-back: no retryDelay
    assert (row["batch_retry_count"], row["attempt_count"]) == (2, 1)


def test_retry_after_a_completed_prefix_restarts_the_count(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, batch_retry_count=2)
    res = ack(db, p, items(p, [(1, "completed"), (2, "retry"), (3, "completed")]), lid)
    assert (res["new"], res["retryCount"], res["clamped"], res["leaseReleased"]) == (
        1, 0, [2], True)
    assert consumer(db, p.pid)["batch_retry_count"] == 0


def test_complete_batch_releases_and_resets(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, attempt_count=2, batch_retry_count=1)
    res = ack(db, p, items(p, [(k, "completed") for k in (5, 3, 1, 2, 4)]), lid)
    assert res["ok"] and (res["old"], res["new"], res["acked"]) == (0, 5, 5)
    assert res["leaseReleased"] is True and res["signal"] is None and res["retryCount"] == 0
    assert res["noop"] == res["stale"] == res["unresolved"] == res["clamped"] == []
    row = consumer(db, p.pid)
    assert_released(row, lid)
    assert (row["committed_offset"], row["attempt_count"], row["batch_retry_count"]) == (5, 0, 0)
    assert row["total_consumed"] == 5 and row["last_consumed_at"] is not None
    assert (row["batch_start"], row["batch_end"]) == (1, 5)


def test_partial_ack_keeps_the_lease(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, attempt_count=2)
    res = ack(db, p, items(p, [(1, "completed"), (2, "completed")]), lid)
    assert res["ok"] and (res["new"], res["leaseReleased"]) == (2, False)
    row = consumer(db, p.pid)
    assert_live(row, lid)
    assert (row["committed_offset"], row["attempt_count"]) == (2, 2)
    # the rest of the batch can still be acked under the same lease
    res = ack(db, p, items(p, [(5, "completed")]), lid)
    assert (res["old"], res["new"], res["leaseReleased"]) == (2, 5, True)


def test_dlq_outranks_failed_outranks_retry_on_one_position(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    res = ack(db, p, items(p, [(2, "retry"), (2, "failed"), (2, "dlq"), (3, "failed")]), lid)
    assert (res["signal"], res["signalIndex"], res["poison"]) == ("dlq", 2, 2)
    assert res["clamped"] == [0, 1, 3] and res["new"] == 0
    lid2 = uuid.uuid4()
    db.execute("UPDATE queen.log_consumers SET lease_id = %s, worker_id = %s::text "
               "WHERE partition_id = %s", (lid2, lid2, p.pid))
    res = ack(db, p, items(p, [(2, "retry"), (2, "failed")]), lid2)
    assert (res["signal"], res["signalIndex"], res["retryCount"]) == ("failed", 1, 1)


# ---------------------------------------------------------------------------------------------
# Lists: noop, stale, unresolved, clamped; implicit completion
# ---------------------------------------------------------------------------------------------

def test_noop_lists_completed_positions_below_the_cursor(db):
    p = make_part(db, 5)
    set_cursor(db, p.pid, 2)
    lid = lease(db, p.pid, 3, 5)
    res = ack(db, p, items(p, [(1, "completed"), (3, "completed"), (2, "completed")]), lid)
    assert res["ok"] and res["noop"] == [0, 2] and res["stale"] == []
    assert (res["old"], res["new"], res["leaseReleased"]) == (2, 3, False)


def test_stale_lists_a_nack_below_the_cursor_without_a_lease(db):
    p = make_part(db, 5)
    set_cursor(db, p.pid, 3, batch_retry_count=1)
    before = consumer(db, p.pid)
    res = ack(db, p, items(p, [(2, "failed"), (1, "dlq"), (3, "retry"), (1, "completed")]))
    assert res["ok"] and res["stale"] == [0, 1, 2] and res["noop"] == [3]
    assert res["signal"] is None and res["dlq"] is False and res["new"] == 3
    assert consumer(db, p.pid) == before  # no charge, no write at all


def test_unresolved_lists_a_hash_never_pushed(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    res = ack(db, p, [(p.txn(1), "completed"), ("never-pushed", "failed"),
                      (b"\x00" * 16, "completed")], lid)
    assert res["ok"] and res["unresolved"] == [1, 2]
    assert res["signal"] is None and res["new"] == 1  # an unresolvable nack is no signal


def test_unresolved_lists_a_hash_whose_sidecar_row_was_purged(db):
    p = make_part(db, 6, segments=[3, 3])
    db.execute("DELETE FROM queen.log_txns WHERE partition_id = %s AND base_offset = 4",
               (p.pid,))
    lid = lease(db, p.pid, 1, 6)
    res = ack(db, p, items(p, [(2, "completed"), (5, "completed"), (4, "failed")]), lid)
    assert res["ok"] and res["unresolved"] == [1, 2]
    assert (res["new"], res["signal"], res["leaseReleased"]) == (2, None, False)
    assert consumer(db, p.pid)["batch_retry_count"] == 0


def test_a_completed_ack_above_a_failed_one_never_skips_it(db):
    p = make_part(db, 6)
    lid = lease(db, p.pid, 1, 6)
    res = ack(db, p, items(p, [(6, "completed"), (1, "completed"), (3, "failed"),
                               (4, "completed"), (5, "dlq")]), lid)
    assert res["ok"] and (res["new"], res["signal"], res["signalIndex"]) == (1, "failed", 2)
    assert res["clamped"] == [0, 3, 4]
    assert res["dlq"] is False and res["poison"] is None
    row = consumer(db, p.pid)
    assert row["committed_offset"] == 1 and row["batch_retry_count"] == 1


def test_unmentioned_positions_below_the_cursor_are_completed_implicitly(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    res = ack(db, p, items(p, [(4, "completed")]), lid)
    assert (res["old"], res["new"], res["acked"], res["leaseReleased"]) == (0, 4, 4, False)
    assert consumer(db, p.pid)["total_consumed"] == 4
    # but a signal with nothing completed below it leaves the gap alone
    res = ack(db, p, items(p, [(5, "failed")]), lid)
    assert (res["new"], res["signal"], res["leaseReleased"]) == (4, "failed", True)


def test_a_repushed_hash_resolves_to_the_copy_in_the_span(db):
    q = uq()
    push_txns(db, q, "p", ["a", "b", "c"])
    db.execute("UPDATE queen.queues SET dedup_window = 0 WHERE name = %s", (q,))
    pid = push_txns(db, q, "p", ["a", "d"])["pid"]  # "a" again at offset 4
    set_cursor(db, pid, 3)
    lid = lease(db, pid, 4, 5)
    res = ack(db, pid, [("a", "completed")], lid)
    assert res["noop"] == [] and res["new"] == 4


# ---------------------------------------------------------------------------------------------
# Retry limit and the DLQ hand-off
# ---------------------------------------------------------------------------------------------

def test_retry_limit_then_poison_then_dlq_filing(db):
    p = make_part(db, 4)
    configure(db, p, retry_limit=2)
    for k in (1, 2):
        lid = lease(db, p.pid, 1, 4)
        res = ack(db, p, items(p, [(1, "failed")]), lid)
        assert (res["new"], res["retryCount"], res["dlq"], res["leaseReleased"]) == (
            0, k, False, True)
        assert consumer(db, p.pid)["batch_retry_count"] == k
    lid = lease(db, p.pid, 1, 4, attempt_count=3)
    res = ack(db, p, items(p, [(1, "failed")]), lid)
    assert (res["dlq"], res["poison"], res["leaseReleased"], res["retryCount"]) == (
        True, 1, False, 2)
    assert_live(consumer(db, p.pid), lid)

    mid = uuid.uuid4()
    filed = dlq_head(db, p, 1, lid, error="handler exploded", message_id=mid)
    assert filed["ok"] and filed["new"] == 1 and filed["leaseReleased"] is True
    assert isinstance(filed["dlqId"], int)
    rows = dlq_rows(db, p.pid)
    assert len(rows) == 1
    r = rows[0]
    assert (r["id"], r["offset"], r["error"], r["retry_count"]) == (
        filed["dlqId"], 1, "handler exploded", 2)
    assert (r["message_id"], r["transaction_id"], r["partition_name"]) == (mid, p.txn(1), "p")
    assert bytes(r["payload"]) == payload_of(1) and r["producer_sub"] == "sub-1"
    qid, tenant = db.execute("SELECT q.id, q.tenant FROM queen.queues q WHERE q.name = %s",
                             (p.queue,)).fetchone()
    assert (r["queue_id"], r["tenant"]) == (qid, tenant)
    row = consumer(db, p.pid)
    assert_released(row, lid)
    assert (row["committed_offset"], row["batch_retry_count"], row["attempt_count"]) == (1, 0, 0)
    assert row["total_consumed"] == 1

    # twice: one row, nothing changes
    again = dlq_head(db, p, 1, lid)
    assert again["ok"] is False and again["dlqId"] is None and again["new"] == 1
    assert dlq_head(db, p, 1, None)["ok"] is False
    assert len(dlq_rows(db, p.pid)) == 1
    assert consumer(db, p.pid) == row


def test_retry_limit_zero_makes_the_first_failed_poison(db):
    p = make_part(db, 3)
    configure(db, p, retry_limit=0)
    lid = lease(db, p.pid, 1, 3)
    res = ack(db, p, items(p, [(1, "failed")]), lid)
    assert (res["dlq"], res["poison"], res["retryCount"]) == (True, 1, 0)


def test_dlq_head_rejects_a_wrong_lease_and_an_offset_outside_the_batch(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 3)
    before = consumer(db, p.pid)
    assert dlq_head(db, p, 2, uuid.uuid4())["error"] == "lease_invalid"
    assert dlq_head(db, p, 4, lid)["error"] == "beyond_batch"
    assert dlq_head(db, p, 2, lid, tenant=uuid.uuid4())["error"] == "partition_not_found"
    assert dlq_rows(db, p.pid) == [] and consumer(db, p.pid) == before


def test_lease_less_dlq_hand_off_files_and_moves_past_the_poison(db):
    p = make_part(db, 5)
    res = ack(db, p, items(p, [(3, "dlq")]))
    assert (res["dlq"], res["poison"], res["new"], res["leaseReleased"]) == (True, 3, 0, False)
    filed = dlq_head(db, p, 3, None)
    assert filed["ok"] and filed["new"] == 3 and filed["leaseReleased"] is False
    assert dlq_head(db, p, 3, None)["ok"] is False
    assert len(dlq_rows(db, p.pid)) == 1
    # the repeat of the dlq ack is now below the cursor: stale without a lease id
    assert ack(db, p, items(p, [(3, "dlq")]))["stale"] == [0]


# ---------------------------------------------------------------------------------------------
# Lease validation, tenancy, lease-less acks
# ---------------------------------------------------------------------------------------------

def test_wrong_lease_is_lease_invalid_and_changes_nothing(db):
    p = make_part(db, 5)
    lease(db, p.pid, 1, 5)
    before = consumer(db, p.pid)
    res = ack(db, p, items(p, [(1, "completed"), (2, "failed")]), uuid.uuid4())
    assert (res["ok"], res["error"], res["old"], res["new"]) == (False, "lease_invalid", 0, 0)
    assert res["noop"] == res["clamped"] == []
    assert consumer(db, p.pid) == before


def test_expired_lease_is_lease_invalid(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, seconds=-1)
    before = consumer(db, p.pid)
    res = ack(db, p, items(p, [(1, "completed")]), lid)
    assert (res["ok"], res["error"]) == (False, "lease_invalid")
    assert consumer(db, p.pid) == before


def test_lease_on_a_group_without_a_consumer_row_is_lease_invalid(db):
    p = make_part(db, 2)
    res = ack(db, p, items(p, [(1, "completed")]), uuid.uuid4(), group="nobody")
    assert (res["ok"], res["error"], res["old"]) == (False, "lease_invalid", 0)
    assert consumer(db, p.pid, "nobody") is None


def test_unknown_partition_and_foreign_tenant_are_partition_not_found(db):
    other = uuid.uuid4()
    p = make_part(db, 3, tenant=other)
    for pid, tenant in ((p.pid, DEFAULT_TENANT), (2**62, DEFAULT_TENANT), (p.pid, uuid.uuid4())):
        res = ack(db, pid, items(p, [(1, "completed")]), tenant=tenant)
        assert (res["ok"], res["error"], res["old"]) == (False, "partition_not_found", None)
    assert consumer(db, p.pid) is None  # no row created for a foreign tenant
    res = ack(db, p, items(p, [(2, "completed")]), tenant=other)
    assert res["ok"] and res["new"] == 2


def test_lease_less_ack_creates_the_row_and_advances_the_cursor(db):
    p = make_part(db, 5)
    res = ack(db, p, items(p, [(3, "completed")]))
    assert res["ok"] and (res["old"], res["new"], res["leaseReleased"]) == (0, 3, False)
    row = consumer(db, p.pid)
    assert (row["committed_offset"], row["total_consumed"], row["lease_id"]) == (3, 3, None)
    # a lease-less failed charges the head but touches no lease column
    res = ack(db, p, items(p, [(4, "failed")]))
    assert (res["new"], res["retryCount"], res["leaseReleased"]) == (3, 1, False)


def test_lease_less_ack_past_a_live_batch_releases_it(db):
    p = make_part(db, 6)
    lid = lease(db, p.pid, 1, 3, attempt_count=2)
    res = ack(db, p, items(p, [(2, "completed")]))
    assert (res["new"], res["leaseReleased"]) == (2, False)
    assert_live(consumer(db, p.pid), lid)
    res = ack(db, p, items(p, [(5, "completed")]))
    assert (res["new"], res["leaseReleased"]) == (5, True)
    row = consumer(db, p.pid)
    assert_released(row, lid)
    assert row["attempt_count"] == 0


# ---------------------------------------------------------------------------------------------
# Repeat safety and monotonicity
# ---------------------------------------------------------------------------------------------

def test_repeat_of_a_releasing_ack_is_noop_and_changes_nothing(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    call = items(p, [(k, "completed") for k in range(1, 6)])
    first = ack(db, p, call, lid)
    assert first["leaseReleased"] and first["new"] == 5
    before = consumer(db, p.pid)
    again = ack(db, p, call, lid)
    assert again["ok"] and again["noop"] == [0, 1, 2, 3, 4]
    assert (again["old"], again["new"], again["acked"], again["leaseReleased"]) == (5, 5, 0, False)
    assert consumer(db, p.pid) == before


def test_repeat_of_a_failed_ack_is_not_charged_twice(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    call = items(p, [(1, "completed"), (2, "failed"), (3, "completed")])
    first = ack(db, p, call, lid)
    assert (first["new"], first["retryCount"], first["leaseReleased"]) == (1, 1, True)
    before = consumer(db, p.pid)
    again = ack(db, p, call, lid)
    assert again["ok"] and again["noop"] == [0] and again["invalid"] == [1, 2]
    assert again["signal"] is None and again["retryCount"] == 1 and again["new"] == 1
    assert consumer(db, p.pid) == before
    # even after the partition was leased again to someone else
    lease(db, p.pid, 2, 5)
    before = consumer(db, p.pid)
    assert ack(db, p, call, lid)["noop"] == [0]
    assert consumer(db, p.pid) == before


def test_repeat_of_a_dlq_ack_after_filing_is_noop(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    call = items(p, [(1, "completed"), (2, "dlq")])
    assert ack(db, p, call, lid)["poison"] == 2
    assert dlq_head(db, p, 2, lid)["ok"]
    before = consumer(db, p.pid)
    again = ack(db, p, call, lid)
    assert again["ok"] and again["noop"] == [0, 1] and again["dlq"] is False
    assert consumer(db, p.pid) == before and len(dlq_rows(db, p.pid)) == 1


def test_cursor_never_moves_backwards(db):
    p = make_part(db, 6)
    set_cursor(db, p.pid, 4)
    # a stale batch that starts below the cursor: positions below it are noop
    lid = lease(db, p.pid, 1, 6)
    res = ack(db, p, items(p, [(2, "completed"), (3, "completed")]), lid)
    assert (res["old"], res["new"], res["noop"]) == (4, 4, [0, 1])
    assert consumer(db, p.pid)["committed_offset"] == 4
    # the positional fast path refuses a batch the cursor is already inside (the broker then
    # takes the hash path, which answers noop for the committed part)
    res = ack_at(db, p.pid, lid, 3)
    assert (res["ok"], res["error"], res["old"], res["new"]) == (False, "partly_committed", 4, 4)
    assert consumer(db, p.pid)["committed_offset"] == 4
    assert dlq_head(db, p, 3, None)["error"] == "already_committed"
    assert consumer(db, p.pid)["committed_offset"] == 4


# ---------------------------------------------------------------------------------------------
# log_ack_at_v1 and log_ack_multi_v3
# ---------------------------------------------------------------------------------------------

def test_ack_at_advances_releases_and_resets(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5, attempt_count=2, batch_retry_count=1)
    res = ack_at(db, p.pid, lid, 5, 5)
    assert res == {"ok": True, "error": None, "old": 0, "new": 5, "leaseReleased": True}
    row = consumer(db, p.pid)
    assert_released(row, lid)
    assert (row["committed_offset"], row["attempt_count"], row["batch_retry_count"],
            row["total_consumed"]) == (5, 0, 0, 5)


def test_ack_at_rejects_a_stale_lease(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    assert ack_at(db, p.pid, lid, 5)["ok"]
    before = consumer(db, p.pid)
    assert ack_at(db, p.pid, lid, 5)["error"] == "lease_invalid"  # released
    expired = lease(db, p.pid, 1, 5, seconds=-1)
    before = consumer(db, p.pid)
    assert ack_at(db, p.pid, expired, 5)["error"] == "lease_invalid"
    assert ack_at(db, p.pid, None, 5)["error"] == "lease_invalid"
    assert ack_at(db, p.pid, expired, 5, tenant=uuid.uuid4())["error"] == "partition_not_found"
    assert consumer(db, p.pid) == before


def test_ack_at_rejects_beyond_the_batch(db):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 3)
    before = consumer(db, p.pid)
    res = ack_at(db, p.pid, lid, 4)
    assert res == {"ok": False, "error": "beyond_batch", "old": 0, "new": 0,
                   "leaseReleased": False}
    assert consumer(db, p.pid) == before


COMPARED = ("committed_offset", "lease_id", "worker_id", "lease_expires_at", "released_lease_id",
            "batch_start", "batch_end", "attempt_count", "batch_retry_count", "total_consumed")


def test_ack_multi_answers_in_input_order_and_equals_separate_ack_at_calls(db):
    def scenario() -> tuple[list[Part], list[tuple]]:
        q = uq("multi")
        parts = [make_part(db, 6, queue=q, name=n) for n in ("a", "b", "c")]
        assert parts[0].pid < parts[1].pid < parts[2].pid
        rows = []
        for part in parts:
            for g in ("g2", "g1"):
                lid = lease(db, part.pid, 1, 4, group=g, attempt_count=1)
                rows.append((part.pid, g, lid, 4, 4))
        # rejections: a stale lease beside the live one on (a, g1) (two leases on one
        # (partition, group) are not folded), and a batch clamp on (c, g2)
        rows.append((rows[1][0], rows[1][1], rows[1][2], 3, 3))
        rows[1] = (rows[1][0], rows[1][1], uuid.uuid4(), 4, 4)
        rows[4] = (rows[4][0], rows[4][1], rows[4][2], 5, 5)
        order = [6, 5, 2, 0, 4, 3, 1]  # out of (partition, group) order
        return parts, [rows[k] for k in order]

    parts_m, rows_m = scenario()
    res = ack_multi(db, rows_m)
    assert [r["i"] for r in res] == list(range(len(rows_m)))

    parts_s, rows_s = scenario()
    pos = {pid: k for k, pid in enumerate(p.pid for p in parts_s)}
    # separate calls, in the same lock order the multi call uses
    singles: dict[int, dict] = {}
    for i in sorted(range(len(rows_s)), key=lambda i: (pos[rows_s[i][0]], rows_s[i][1], i)):
        pid, g, lid, end, cnt = rows_s[i]
        singles[i] = ack_at(db, pid, lid, end, cnt, group=g)
    for i, r in enumerate(res):
        assert {k: v for k, v in r.items() if k != "i"} == singles[i], i
    assert [r["ok"] for r in res] == [singles[i]["ok"] for i in range(len(rows_s))]
    assert {r["error"] for r in res} == {None, "lease_invalid", "beyond_batch"}

    def state(parts: list[Part]) -> list[tuple]:
        out = []
        for k, part in enumerate(parts):
            for g in ("g1", "g2"):
                row = consumer(db, part.pid, g)
                out.append((k, g, row["committed_offset"], row["lease_id"] is None,
                            row["attempt_count"], row["batch_retry_count"],
                            row["total_consumed"]))
        return out

    assert state(parts_m) == state(parts_s)


def test_ack_multi_rejections_equal_separate_ack_at_calls(db):
    """Every way a row can fail (and a plain advance beside them) answers as log_ack_at_v1
    does, changing nothing of the failed rows; the foreign tenant's row is not found."""
    def scenario() -> tuple[list[tuple], list[Part]]:
        q = uq("rej")
        ok, partly, nogroup, foreign = (make_part(db, 6, queue=q, name=n)
                                        for n in ("ok", "partly", "nogroup", "foreign"))
        live = lease(db, ok.pid, 1, 4)
        inside = lease(db, partly.pid, 3, 6)
        set_cursor(db, partly.pid, 4)  # a lease-less ack moved the cursor inside the batch
        mine = lease(db, foreign.pid, 1, 6)
        rows = [(partly.pid, G, inside, 6, 4), (ok.pid, G, live, 4, 4),
                (nogroup.pid, "nobody", uuid.uuid4(), 2, 2), (2 ** 62, G, uuid.uuid4(), 1, 1),
                (foreign.pid, G, mine, 6, 6)]
        return rows, [ok, partly, nogroup, foreign]

    rows_m, parts_m = scenario()
    before = [consumer(db, p.pid) for p in parts_m[1:]]
    res = [r for r in ack_multi(db, rows_m[:4])]
    res.append(ack_multi(db, rows_m[4:], tenant=uuid.uuid4())[0])
    assert [r["error"] for r in res] == ["partly_committed", None, "lease_invalid",
                                        "partition_not_found", "partition_not_found"]
    assert [consumer(db, p.pid) for p in parts_m[1:]] == before
    rows_s, _ = scenario()
    singles = [ack_at(db, pid, lid, end, cnt, group=g) for pid, g, lid, end, cnt in rows_s[:4]]
    pid, g, lid, end, cnt = rows_s[4]
    singles.append(ack_at(db, pid, lid, end, cnt, group=g, tenant=uuid.uuid4()))
    assert [{k: v for k, v in r.items() if k != "i"} for r in res] == singles


def test_ack_multi_empty_and_misaligned(db):
    assert ack_multi(db, []) == []
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute(ACK_MULTI, (DEFAULT_TENANT, [1, 2], ["g"], [None], [1], [1]))


def test_ack_multi_deletes_the_row_of_a_one_partition_lease_it_released(db):
    """Ack fusion deletes the log_leases row of a lease whose one cursor it released; a lease
    of two partitions keeps its row (the other cursor still holds it), as does an ack that
    releases nothing."""
    a, b = make_part(db, 3), make_part(db, 3)
    one, two = lease(db, a.pid, 1, 3), lease(db, b.pid, 1, 3, group="other")
    lease(db, a.pid, 1, 3, group="other")
    db.execute("UPDATE queen.log_consumers SET lease_id = %s, worker_id = %s::text"
               " WHERE partition_id = %s AND consumer_group = 'other'", (two, two, a.pid))
    db.execute("INSERT INTO queen.log_leases (lease_id, tenant, consumer_group, partition_ids)"
               " VALUES (%s, %s, %s, ARRAY[%s]::int8[]), (%s, %s, 'other', ARRAY[%s, %s]::int8[])",
               (one, DEFAULT_TENANT, G, a.pid, two, DEFAULT_TENANT, a.pid, b.pid))
    rows = "SELECT lease_id FROM queen.log_leases WHERE lease_id = ANY (%s) ORDER BY 1"
    assert [r["error"] for r in ack_multi(db, [(a.pid, G, uuid.uuid4(), 3, 3)])] == [
        "lease_invalid"]
    assert db.execute(rows, ([one, two],)).fetchall() == sorted([(one,), (two,)])
    res = ack_multi(db, [(a.pid, G, one, 3, 3), (a.pid, "other", two, 3, 3)])
    assert [r["ok"] for r in res] == [True, True]
    assert db.execute(rows, ([one, two],)).fetchall() == [(two,)]
    renew = "SELECT renewed FROM queen.log_renew_lease_v1(%s, %s, 30)"
    assert db.execute(renew, (DEFAULT_TENANT, two)).fetchone() == (1,)  # b still holds it
    assert db.execute(renew, (uuid.uuid4(), two)).fetchone() == (0,)  # a foreign tenant


def test_ack_multi_locks_consumer_rows_in_key_order(db, db_dsn):
    q = uq("lock")
    parts = [make_part(db, 3, queue=q, name=n) for n in ("a", "b", "c")]
    pa, pb, pc = (p.pid for p in parts)
    leases = {pid: lease(db, pid, 1, 3) for pid in (pa, pb, pc)}
    errors: list[BaseException] = []
    results: list = []
    with psycopg.connect(db_dsn) as blocker, psycopg.connect(db_dsn, autocommit=True) as probe:
        blocker.execute("SELECT 1 FROM queen.log_consumers WHERE partition_id = %s "
                        "AND consumer_group = %s FOR UPDATE", (pb, G))

        def run() -> None:
            try:
                with psycopg.connect(db_dsn, autocommit=True) as c:
                    results.append(ack_multi(c, [(pid, G, leases[pid], 3, 3)
                                                 for pid in (pc, pa, pb)]))
            except BaseException as ex:  # pragma: no cover - reported below
                errors.append(ex)

        t = threading.Thread(target=run)
        t.start()
        try:
            wait_for_lock_wait(probe, "log_ack_multi_v3",
                               "the fused ack never waited on the blocked consumer row")
            probe.execute("BEGIN")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                probe.execute("SELECT 1 FROM queen.log_consumers WHERE partition_id = %s "
                              "FOR UPDATE NOWAIT", (pa,))
            probe.execute("ROLLBACK")
            probe.execute("BEGIN")
            probe.execute("SELECT 1 FROM queen.log_consumers WHERE partition_id = %s "
                          "FOR UPDATE NOWAIT", (pc,))  # not reached yet
            probe.execute("ROLLBACK")
        finally:
            blocker.rollback()
            t.join(timeout=30)
    assert not errors, errors
    assert [r["ok"] for r in results[0]] == [True, True, True]


def test_ack_never_locks_the_partition_row(db, db_dsn):
    p = make_part(db, 5)
    lid = lease(db, p.pid, 1, 5)
    with psycopg.connect(db_dsn) as blocker, psycopg.connect(db_dsn, autocommit=True) as c:
        # a push in flight holds the allocator row
        blocker.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s FOR UPDATE", (p.pid,))
        c.execute("SET lock_timeout = '2s'")
        res = ack(c, p, items(p, [(1, "completed"), (2, "failed")]), lid)
        assert res["new"] == 1
        lid = lease(c, p.pid, 2, 5)
        assert ack_at(c, p.pid, lid, 5)["ok"]
        assert ack_multi(c, [(p.pid, G, uuid.uuid4(), 5, 1)])[0]["error"] == "lease_invalid"
        blocker.rollback()


def test_bad_input_raises_invalid_parameter_value(db):
    p = make_part(db, 2)
    bad = [
        (DEFAULT_TENANT, p.pid, G, None, [h("x")], []),
        (DEFAULT_TENANT, p.pid, G, None, [b"short"], ["completed"]),
        (DEFAULT_TENANT, p.pid, G, None, [h(p.txn(1))], ["success"]),
        (DEFAULT_TENANT, p.pid, None, None, [h(p.txn(1))], ["completed"]),
    ]
    for args in bad:
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            db.execute(ACK, args)
    assert consumer(db, p.pid) is None


# ---------------------------------------------------------------------------------------------
# Concurrency
# ---------------------------------------------------------------------------------------------

def test_concurrent_acks_pushes_and_fusion_never_deadlock(db, db_dsn):
    q = uq("conc")
    names = [f"p{k}" for k in range(4)]
    groups = ["g0", "g1", "g2"]
    parts = [make_part(db, 40, segments=[10] * 4, queue=q, name=n) for n in names]
    pairs = [(p, g) for p in parts for g in groups]
    for p, g in pairs:
        set_cursor(db, p.pid, 0, group=g)
    threads_n, seconds = 8, 3.0
    errors: list[BaseException] = []
    calls = [0] * threads_n
    start = threading.Barrier(threads_n)

    def take_lease(conn, p: Part, g: str, size: int) -> tuple[uuid.UUID, int] | None:
        lid = uuid.uuid4()
        row = conn.execute(
            "UPDATE queen.log_consumers c SET lease_id = %(l)s, worker_id = %(l)s::text, "
            "lease_expires_at = now() + interval '30 seconds',"
            " batch_start = c.committed_offset + 1,"
            " batch_end = LEAST(c.committed_offset + %(n)s, lp.last_offset) "
            "FROM queen.log_partitions lp WHERE lp.id = c.partition_id "
            "AND c.partition_id = %(pid)s AND c.consumer_group = %(g)s "
            "AND (c.lease_id IS NULL OR c.lease_expires_at <= now()) "
            "AND c.committed_offset < lp.last_offset RETURNING c.batch_end",
            {"l": lid, "n": size, "pid": p.pid, "g": g}).fetchone()
        return (lid, row[0]) if row else None

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                start.wait()
                deadline = time.monotonic() + seconds
                k = 0
                while time.monotonic() < deadline:
                    k += 1
                    if n == 0:  # a pusher: partition locks only, never consumer rows
                        for p in rng.sample(parts, 2):
                            push_txns(conn, q, p.name, [f"{q}/{p.name}/x{k}-{j}"
                                                        for j in range(3)])
                        continue
                    chosen = rng.sample(pairs, rng.randint(2, 6))
                    rows = []
                    for p, g in chosen:
                        got = take_lease(conn, p, g, rng.randint(1, 5))
                        lid, end = got if got else (uuid.uuid4(), 1)
                        rows.append((p.pid, g, lid, end, 1))
                    res = ack_multi(conn, rows)
                    assert [r["i"] for r in res] == list(range(len(rows)))
                    for r in res:
                        assert r["error"] is not None or r["new"] >= r["old"]
                    p, g = rng.choice(pairs)
                    got = take_lease(conn, p, g, 4)
                    offs = [rng.randint(1, 40) for _ in range(3)]
                    statuses = [rng.choice(["completed", "completed", "failed", "retry"])
                                for _ in offs]
                    res = ack(conn, p, [(p.txn(o), s) for o, s in zip(offs, statuses,
                                                                      strict=True)],
                              got[0] if got and rng.random() < 0.7 else None, group=g)
                    assert res["error"] in (None, "lease_invalid")
                    assert res["ok"] is False or res["new"] >= res["old"]
                    calls[n] += 1
        except BaseException as ex:
            errors.append(ex)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert all(c > 0 for c in calls[1:]), calls
    moved = 0
    for p, g in pairs:
        row = consumer(db, p.pid, g)
        moved += row["committed_offset"]
        last = db.execute("SELECT last_offset FROM queen.log_partitions WHERE id = %s",
                          (p.pid,)).fetchone()[0]
        assert 0 <= row["committed_offset"] <= last
        assert row["total_consumed"] == row["committed_offset"]
    assert moved > 0  # the acks did real work, not only rejections
