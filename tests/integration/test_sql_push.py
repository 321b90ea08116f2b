"""The schema (sql/001_schema.sql) and the push procedures (sql/010_push.sql), called directly.

life-of-a-push.md sections 4 and 5: log_push_multi_v1 (alignment guard, provisioning skip,
ordered pre-lock, bundle timestamp, per-segment allocator, completeness guard), log_push_one_v1
(stride check, dedup probe, allocation, two inserts) and log_segment_at_v1.

The `db` / `db_dsn` database is this module's own (its payloads are placeholders no route can
decode, which another module's unfiltered listing must never meet); every test still works on
its own queue names and counts rows by its own queue / partition ids.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
import xxhash

from tests.pgharness import module_db_dsn, wait_for_lock_wait

db_dsn = module_db_dsn  # this module's own database (the docstring says why)

PUSH_MULTI = (
    "SELECT queen.log_push_multi_v1(%s::text[], %s::text[], %s::int4[], %s::bytea[],"
    " %s::int8[], %s::bytea[], %s::uuid[])"
)
PUSH_MULTI_V3 = (
    "SELECT queen.log_push_multi_v3(%s::int8[], %s::text[], %s::text[], %s::int4[],"
    " %s::bytea[], %s::int8[], %s::bytea[], %s::uuid[])"
)
PUSH_ONE = (
    "SELECT queen.log_push_one_v1(%s::int8, %s::int4, %s::int4, %s::bytea, %s::int8,"
    " %s::bytea, %s::timestamptz)"
)
SEGMENT_AT = "SELECT * FROM queen.log_segment_at_v1(%s::int8, %s::int8)"
DEFAULT_TENANT = uuid.UUID(int=0)


def uq(prefix: str = "sp") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def h(txn: str) -> bytes:
    return xxhash.xxh3_128_digest(txn.encode())


def hblob(txns: list[str]) -> bytes:
    return b"".join(h(t) for t in txns)


@dataclass
class Seg:
    queue: str
    partition: str
    txns: list[str]
    verified: int = 0
    blob: bytes = field(default=b"")

    def payload(self) -> bytes:
        return self.blob or ("|".join(self.txns)).encode()


def _params(segs: list[Seg], tenants: list | None) -> tuple[Any, ...]:
    return ([s.queue for s in segs], [s.partition for s in segs], [len(s.txns) for s in segs],
            [hblob(s.txns) for s in segs], [s.verified for s in segs],
            [s.payload() for s in segs], tenants)


def push(conn: psycopg.Connection, segs: list[Seg], tenants: list | None = None) -> list[dict]:
    """log_push_multi_v1: one JSON object a segment."""
    row = conn.execute(PUSH_MULTI, _params(segs, tenants)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def push_v3(conn: psycopg.Connection, segs: list[Seg], tenants: list | None = None,
            pids: list[int] | None = None) -> list[int]:
    """log_push_multi_v3: its int8[] answer; by ``pids`` if given, else by name."""
    row = conn.execute(PUSH_MULTI_V3, (pids, *_params(segs, tenants))).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def push_in_thread(dsn: str, segs: list[Seg], errors: list[BaseException]) -> threading.Thread:
    """``push`` on a connection of its own in a started thread; what it raises goes to
    ``errors``."""

    def run() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                push(c, segs)
        except BaseException as ex:  # reported by the caller
            errors.append(ex)

    t = threading.Thread(target=run)
    t.start()
    return t


def pid_of(conn, queue: str, partition: str, tenant: uuid.UUID = DEFAULT_TENANT) -> int:
    row = conn.execute(
        "SELECT lp.id FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id "
        "WHERE q.tenant = %s AND q.name = %s AND lp.name = %s",
        (tenant, queue, partition)).fetchone()
    assert row is not None, (queue, partition)
    return row[0]


def last_offset(conn, pid: int) -> int:
    return conn.execute("SELECT last_offset FROM queen.log_partitions WHERE id = %s",
                        (pid,)).fetchone()[0]


def counts(conn, pid: int) -> tuple[int, int, int]:
    """(segments, log_txns rows, last_offset) of one partition."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM queen.log_segments WHERE partition_id = %(p)s),"
        " (SELECT count(*) FROM queen.log_txns WHERE partition_id = %(p)s),"
        " (SELECT last_offset FROM queen.log_partitions WHERE id = %(p)s)",
        {"p": pid}).fetchone()


def segments(conn, pid: int) -> list[tuple]:
    return conn.execute(
        "SELECT base_offset, msg_count, created_at FROM queen.log_segments "
        "WHERE partition_id = %s ORDER BY base_offset", (pid,)).fetchall()


def epoch_us(ts) -> int:
    return round(ts.timestamp() * 1_000_000)


def assert_gapless(conn, pid: int) -> int:
    """Segments and sidecar rows tile 1..last_offset exactly; created_at never goes back."""
    segs = segments(conn, pid)
    expect = 1
    prev_ts = None
    for base, n, ts in segs:
        assert base == expect, (pid, segs)
        expect = base + n
        assert prev_ts is None or ts >= prev_ts, (pid, segs)
        prev_ts = ts
    assert expect - 1 == last_offset(conn, pid)
    txns = conn.execute("SELECT base_offset, msg_count, octet_length(hashes) FROM queen.log_txns "
                        "WHERE partition_id = %s ORDER BY base_offset", (pid,)).fetchall()
    assert [(b, n) for b, n, _ in txns] == [(b, n) for b, n, _ in segs]
    assert all(ln == 16 * n for _, n, ln in txns)
    return expect - 1


# ---------------------------------------------------------------------------------------------
# Allocation
# ---------------------------------------------------------------------------------------------

def test_first_push_allocates_1_to_n_and_stores_both_rows(db):
    q = uq()
    res = push(db, [Seg(q, "p", ["a", "b", "c"], blob=b"\x01chunk")])
    assert len(res) == 1
    r = res[0]
    pid = pid_of(db, q, "p")
    assert set(r) == {"i", "pid", "s", "base", "ts", "w"}  # w: the dedup window (100_push)
    assert (r["i"], r["pid"], r["s"], r["base"]) == (0, pid, "queued", 1)
    base, n, created, payload = db.execute(
        "SELECT base_offset, msg_count, created_at, payload FROM queen.log_segments "
        "WHERE partition_id = %s", (pid,)).fetchone()
    assert (base, n, bytes(payload)) == (1, 3, b"\x01chunk")
    assert r["ts"] == epoch_us(created)
    hashes, tcreated = db.execute(
        "SELECT hashes, created_at FROM queen.log_txns WHERE partition_id = %s AND base_offset = 1",
        (pid,)).fetchone()
    assert bytes(hashes) == hblob(["a", "b", "c"]) and tcreated == created
    assert counts(db, pid) == (1, 1, 3)
    lw = db.execute("SELECT last_write_at FROM queen.log_partitions WHERE id = %s",
                    (pid,)).fetchone()[0]
    assert lw is not None


def test_second_push_continues_after_the_first(db):
    q = uq()
    push(db, [Seg(q, "p", ["a", "b"])])
    res = push(db, [Seg(q, "p", ["c", "d", "e"])])
    assert (res[0]["s"], res[0]["base"]) == ("queued", 3)
    assert last_offset(db, res[0]["pid"]) == 5
    assert assert_gapless(db, res[0]["pid"]) == 5


def test_offsets_are_gapless_across_many_bundles(db):
    q = uq()
    parts = ["p0", "p1", "p2"]
    rng = random.Random(7)
    expected = dict.fromkeys(parts, 0)
    for b in range(60):
        chosen = rng.sample(parts, rng.randint(1, 3))
        segs = [Seg(q, p, [f"{b}-{p}-{k}" for k in range(rng.randint(1, 9))]) for p in chosen]
        res = push(db, segs)
        for s, r in zip(segs, res, strict=True):
            assert r["s"] == "queued"
            assert r["base"] == expected[s.partition] + 1
            expected[s.partition] += len(s.txns)
    for p in parts:
        assert assert_gapless(db, pid_of(db, q, p)) == expected[p]


def test_empty_bundle_returns_an_empty_array(db):
    assert push(db, []) == []


# ---------------------------------------------------------------------------------------------
# Bundles: input order of results, id order of locks, one timestamp
# ---------------------------------------------------------------------------------------------

def test_multi_partition_bundle_answers_in_input_order(db):
    q = uq()
    push(db, [Seg(q, "a", ["x"])])
    push(db, [Seg(q, "b", ["x"])])
    push(db, [Seg(q, "c", ["x"])])
    pa, pb, pc = (pid_of(db, q, p) for p in "abc")
    assert pa < pb < pc
    res = push(db, [Seg(q, "c", ["1", "2"]), Seg(q, "a", ["3"]), Seg(q, "b", ["4", "5", "6"])])
    assert [r["i"] for r in res] == [0, 1, 2]
    assert [r["pid"] for r in res] == [pc, pa, pb]
    assert [r["base"] for r in res] == [2, 2, 2]
    assert counts(db, pc)[2] == 3 and counts(db, pa)[2] == 2 and counts(db, pb)[2] == 4
    # one bundle timestamp for every segment of the bundle
    assert len({r["ts"] for r in res}) == 1


def test_bundle_locks_partitions_in_ascending_id_order(db, db_dsn):
    q = uq()
    push(db, [Seg(q, "a", ["x"])])
    push(db, [Seg(q, "b", ["x"])])
    push(db, [Seg(q, "c", ["x"])])
    pa, pb, pc = (pid_of(db, q, p) for p in "abc")
    assert pa < pb < pc
    errors: list[BaseException] = []
    with psycopg.connect(db_dsn) as blocker, psycopg.connect(db_dsn, autocommit=True) as probe:
        # hold the middle partition: a bundle over c, a, b (input order) must hold a and wait
        # on b, and must not have touched c yet
        blocker.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s FOR UPDATE", (pb,))
        t = push_in_thread(db_dsn, [Seg(q, "c", ["c1"]), Seg(q, "a", ["a1"]),
                                    Seg(q, "b", ["b1"])], errors)
        try:
            wait_for_lock_wait(probe, "log_push_multi_v1",
                               "the bundle never waited on the blocked partition")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                probe.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s "
                              "FOR UPDATE NOWAIT", (pa,))
            # c (highest id) is not locked yet
            probe.execute("BEGIN")
            probe.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s FOR UPDATE NOWAIT",
                          (pc,))
            probe.execute("ROLLBACK")
        finally:
            blocker.rollback()
            t.join(timeout=30)
    assert not errors, errors
    assert [counts(db, p)[2] for p in (pa, pb, pc)] == [2, 2, 2]


# ---------------------------------------------------------------------------------------------
# Provisioning
# ---------------------------------------------------------------------------------------------

def test_provisioning_creates_queues_with_derived_names_and_default_options(db):
    base = uq("prov")
    names = [f"{base}.billing.eu", f"{base}.sub", base]
    res = push(db, [Seg(n, "Default", ["t"]) for n in names])
    assert [r["s"] for r in res] == ["queued"] * 3
    rows = {r[0]: r[1:] for r in db.execute(
        "SELECT name, namespace, task FROM queen.queues WHERE name = ANY(%s)", (names,))}
    assert rows[f"{base}.billing.eu"] == (base, "billing")
    assert rows[f"{base}.sub"] == (base, "sub")
    assert rows[base] == (base, None)
    opts = db.execute(
        "SELECT tenant, lease_time, retry_limit, dead_letter_queue, dlq_after_max_retries,"
        " dedup_window, retention_seconds, completed_retention_seconds, encryption_enabled,"
        " delayed_processing, window_buffer, priority, max_size, retry_delay, ttl,"
        " max_wait_time_seconds, retention_enabled FROM queen.queues WHERE name = %s",
        (base,)).fetchone()
    assert opts == (DEFAULT_TENANT, 300, 3, True, True, 3600, 0, 0, False, 0, 0, 0, 0, 1000,
                    3600, 0, False)
    part = db.execute(
        "SELECT lp.name, lp.last_offset, lp.txns_start, lp.log_start_offset FROM "
        "queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s",
        (base,)).fetchall()
    assert part == [("Default", 1, 1, 1)]


def test_provisioning_is_per_tenant(db):
    q = uq()
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    r1 = push(db, [Seg(q, "p", ["same"])], tenants=[t1])
    r2 = push(db, [Seg(q, "p", ["same"])], tenants=[t2])
    # NULL tenant (and a NULL array) mean the default tenant
    r3 = push(db, [Seg(q, "p", ["same"])], tenants=[None])
    r4 = push(db, [Seg(q, "p", ["same"])])
    assert [r[0]["s"] for r in (r1, r2, r3, r4)] == ["queued", "queued", "queued", "duplicate"]
    assert len({r1[0]["pid"], r2[0]["pid"], r3[0]["pid"]}) == 3
    assert r4[0]["pid"] == r3[0]["pid"] == pid_of(db, q, "p")
    assert db.execute("SELECT count(*) FROM queen.queues WHERE name = %s", (q,)).fetchone()[0] == 3


def test_existing_queue_options_are_used_not_replaced(db):
    q = uq()
    db.execute("INSERT INTO queen.queues (name, dedup_window, namespace) VALUES (%s, 0, 'x')",
               (q,))
    push(db, [Seg(q, "p", ["a"])])
    push(db, [Seg(q, "p2", ["a"])])
    res = push(db, [Seg(q, "p", ["a"])])  # window 0: no dedup
    assert res[0]["s"] == "queued"
    assert db.execute("SELECT namespace, dedup_window FROM queen.queues WHERE name = %s",
                      (q,)).fetchone() == ("x", 0)


# ---------------------------------------------------------------------------------------------
# Deduplication
# ---------------------------------------------------------------------------------------------

def test_duplicate_within_window_reports_dups_and_writes_nothing(db):
    q = uq()
    push(db, [Seg(q, "p", ["t1", "t2", "t3"])])
    pid = pid_of(db, q, "p")
    before = counts(db, pid)
    res = push(db, [Seg(q, "p", ["t4", "t2", "t5", "t3"])])
    r = res[0]
    assert (r["i"], r["pid"], r["s"], r["base"]) == (0, pid, "duplicate", None)
    assert r["dups"] == [{"i": 1, "off": 2}, {"i": 3, "off": 3}]
    assert isinstance(r["ts"], int)
    assert counts(db, pid) == before == (1, 1, 3)
    # the broker resubmits the remainder: that is queued right after the original
    res = push(db, [Seg(q, "p", ["t4", "t5"])])
    assert (res[0]["s"], res[0]["base"]) == ("queued", 4)


def test_duplicate_segment_does_not_disturb_the_rest_of_the_bundle(db):
    q = uq()
    push(db, [Seg(q, "a", ["x"]), Seg(q, "b", ["y"])])
    pa, pb = pid_of(db, q, "a"), pid_of(db, q, "b")
    res = push(db, [Seg(q, "b", ["y2"]), Seg(q, "a", ["x"]), Seg(q, "c", ["z"])])
    assert [r["s"] for r in res] == ["queued", "duplicate", "queued"]
    assert res[1]["dups"] == [{"i": 0, "off": 1}]
    assert counts(db, pa) == (1, 1, 1)
    assert counts(db, pb) == (2, 2, 2)


def test_v3_answers_one_int8_array_in_input_order(db):
    """log_push_multi_v3: ids, bases (0 = duplicate), stamps, windows, then the duplicate
    frames as (segment, frame, offset) triples, ascending segment then frame, whatever the
    partition ids' order; the shard decodes it (queen_mp.db.calls.segment_verdicts)."""
    q = uq()
    push(db, [Seg(q, "a", ["a1", "a2"]), Seg(q, "b", ["b1"]), Seg(q, "c", ["c1", "c2", "c3"])])
    pa, pb, pc = pid_of(db, q, "a"), pid_of(db, q, "b"), pid_of(db, q, "c")
    assert pa < pb < pc
    segs = [Seg(q, "c", ["c9", "c3", "c1"]), Seg(q, "d", ["d1"]), Seg(q, "a", ["a2"]),
            Seg(q, "b", ["b2", "b3"])]
    got, n = push_v3(db, segs), len(segs)
    pd = pid_of(db, q, "d")
    assert got[:n] == [pc, pd, pa, pb]
    assert got[n:2 * n] == [0, 1, 0, 2]
    assert all(isinstance(t, int) and t > 0 for t in got[2 * n:3 * n])
    assert got[3 * n:4 * n] == [3600] * n
    assert got[4 * n:] == [0, 1, 3, 0, 2, 1, 2, 0, 2]
    assert counts(db, pc) == (1, 1, 3) and counts(db, pa) == (1, 1, 2)
    assert counts(db, pb) == (2, 2, 3)
    assert db.execute(PUSH_MULTI_V3, (None, [], [], [], [], [], [], None)).fetchone() == ([],)


def test_v3_probe_and_set_based_segments_in_one_bundle(db):
    """A segment that needs the probe (verified below stored offsets) beside segments that
    skip it (verified up to the last offset, or a new partition): all stored, one ts rule."""
    q = uq()
    push(db, [Seg(q, "a", ["a1"]), Seg(q, "b", ["b1"])])
    pa, pb = pid_of(db, q, "a"), pid_of(db, q, "b")
    res = push(db, [Seg(q, "b", ["b2"], verified=1), Seg(q, "a", ["a2"], verified=0),
                    Seg(q, "n", ["n1"])])
    assert [(r["s"], r["base"]) for r in res] == [("queued", 2), ("queued", 2), ("queued", 1)]
    assert res[0]["ts"] == res[1]["ts"] == res[2]["ts"]
    assert assert_gapless(db, pa) == 2 and assert_gapless(db, pb) == 2


def test_v3_writes_each_segment_its_own_blob_hashes_and_window(db):
    """Input order against partition id order, two queues of different windows, a probe
    segment between set-based ones: every segment stored with its own payload, hashes and
    count at its own partition's next offset, under one timestamp, and answered with its own
    queue's window (the bundle takes them by input ordinal, not through its joins)."""
    q1, q2 = uq(), uq()
    db.execute("INSERT INTO queen.queues (name, dedup_window) VALUES (%s, 0)", (q2,))
    for seg in (Seg(q1, "a", ["a1"]), Seg(q1, "b", ["b1"]), Seg(q2, "c", ["c1"])):
        push(db, [seg])
    pa, pb, pc = pid_of(db, q1, "a"), pid_of(db, q1, "b"), pid_of(db, q2, "c")
    assert pa < pb < pc
    segs = [Seg(q2, "c", ["c2", "c3", "c4"], verified=0, blob=b"payload of c"),
            Seg(q1, "a", ["a2"], verified=0, blob=b"payload of a"),  # probes offset 1
            Seg(q1, "n", ["n1", "n2"], blob=b"payload of n"),
            Seg(q1, "b", ["b2", "b3"], verified=1, blob=b"payload of b")]
    got, n = push_v3(db, segs), len(segs)
    pn = pid_of(db, q1, "n")
    assert got[:n] == [pc, pa, pn, pb]
    assert got[n:2 * n] == [2, 2, 1, 2]
    assert len(set(got[2 * n:3 * n])) == 1
    assert got[3 * n:4 * n] == [0, 3600, 3600, 3600]
    assert got[4 * n:] == []
    for seg, pid, base in zip(segs, (pc, pa, pn, pb), (2, 2, 1, 2), strict=True):
        stored = db.execute(
            "SELECT s.msg_count, s.payload, t.msg_count, t.hashes, s.created_at, t.created_at "
            "FROM queen.log_segments s JOIN queen.log_txns t USING (partition_id, base_offset) "
            "WHERE s.partition_id = %s AND s.base_offset = %s", (pid, base)).fetchone()
        assert stored is not None, seg
        assert stored[:4] == (len(seg.txns), seg.payload(), len(seg.txns), hblob(seg.txns))
        assert epoch_us(stored[4]) == epoch_us(stored[5]) == got[2 * n]
        assert assert_gapless(db, pid) == base + len(seg.txns) - 1
    # segments of one queue (its window once, each partition by name; one of them new)
    res = push(db, [Seg(q2, "new", ["x1"]), Seg(q2, "c", ["c5"])])
    assert [(r["pid"], r["s"], r["base"], r["w"]) for r in res] == [
        (pid_of(db, q2, "new"), "queued", 1, 0), (pc, "queued", 5, 0)]


def test_v3_by_cached_ids_answers_as_by_name(db):
    """Every partition named by the id an earlier answer gave (the shard's cache): stored
    and answered as by name, each segment with its own queue's window in input order, and the
    dedup probe still run where the promise stops below stored offsets."""
    q1, q2 = uq(), uq()
    db.execute("INSERT INTO queen.queues (name, dedup_window) VALUES (%s, 0)", (q2,))
    first = push_v3(db, [Seg(q1, "a", ["a1"]), Seg(q2, "c", ["c1"]), Seg(q1, "b", ["b1"])])
    pa, pc, pb = first[:3]
    assert [pa, pc, pb] == [pid_of(db, q1, "a"), pid_of(db, q2, "c"), pid_of(db, q1, "b")]
    segs = [Seg(q2, "c", ["c2"], verified=1),
            Seg(q1, "b", ["b2", "b1"], verified=0),  # b1 is stored: the probe finds it
            Seg(q1, "a", ["a2", "a3"], verified=1)]
    got, n = push_v3(db, segs, pids=[pc, pb, pa]), len(segs)
    assert got[:n] == [pc, pb, pa]
    assert got[n:2 * n] == [2, 0, 2]
    assert got[3 * n:4 * n] == [0, 3600, 3600]
    assert got[4 * n:] == [1, 1, 1]  # segment 1, frame 1, the original at offset 1
    assert counts(db, pb) == (1, 1, 1)
    assert assert_gapless(db, pa) == 3 and assert_gapless(db, pc) == 2
    # as the shard sends it once it knows every id: no names, no tenants
    got = db.execute(PUSH_MULTI_V3, ([pa, pc], [], [], [1, 1], [h("a4"), h("c3")], [3, 2],
                                     [b"a4", b"c3"], [])).fetchone()[0]
    assert got == [pa, pc, 4, 3, got[4], got[4], 3600, 0]
    assert assert_gapless(db, pa) == 4 and assert_gapless(db, pc) == 3
    # names may be left out only when every partition has its id
    with pytest.raises(psycopg.Error) as err:
        db.execute(PUSH_MULTI_V3, ([pa, 0], [], [], [1, 1], [h("a5"), h("c4")], [4, 3],
                                   [b"a5", b"c4"], []))
    assert err.value.sqlstate == "22023" and "misaligned" in str(err.value)
    assert assert_gapless(db, pa) == 4


def test_v3_a_gone_cached_id_writes_nothing_and_answers_qm002(db):
    """A cached id whose partition was deleted and recreated under its name, or whose queue
    was deleted: QM002 and nothing of the bundle written (not even its live partitions); by
    name the same bundle lands in the partitions of today. An id named twice is 21000, as a
    name named twice."""
    q = uq()
    pa, pb = push_v3(db, [Seg(q, "a", ["a1"]), Seg(q, "b", ["b1"])])[:2]
    db.execute("DELETE FROM queen.log_partitions WHERE id = %s", (pb,))
    push(db, [Seg(q, "b", ["b0"])])  # recreated: a new id
    pb2 = pid_of(db, q, "b")
    assert pb2 != pb
    segs = [Seg(q, "a", ["a2"], verified=1), Seg(q, "b", ["b2"], verified=1)]
    with pytest.raises(psycopg.Error) as err:
        push_v3(db, segs, pids=[pa, pb])
    assert err.value.sqlstate == "QM002"
    assert counts(db, pa) == (1, 1, 1) and counts(db, pb2) == (1, 1, 1)
    got = push_v3(db, segs, pids=[pa, 0])  # an unknown id (0): every partition by name
    assert got[:2] == [pa, pb2] and got[2:4] == [2, 2]
    with pytest.raises(psycopg.Error) as err:
        push_v3(db, [Seg(q, "a", ["x"]), Seg(q, "a", ["y"])], pids=[pa, pa])
    assert err.value.sqlstate == "21000"
    db.execute("DELETE FROM queen.queues WHERE name = %s", (q,))
    with pytest.raises(psycopg.Error) as err:
        push_v3(db, [Seg(q, "a", ["a3"])], pids=[pa])
    assert err.value.sqlstate == "QM002"
    pa2 = push_v3(db, [Seg(q, "a", ["a3"])])[0]
    assert pa2 != pa and counts(db, pa2) == (1, 1, 1)


def test_duplicate_reports_the_lowest_offset_in_the_window(db):
    q = uq()
    push(db, [Seg(q, "p", ["w"])])
    pid = pid_of(db, q, "p")
    db.execute("UPDATE queen.queues SET dedup_window = 0 WHERE name = %s", (q,))
    push(db, [Seg(q, "p", ["w"])])
    push(db, [Seg(q, "p", ["v", "w"])])
    db.execute("UPDATE queen.queues SET dedup_window = 3600 WHERE name = %s", (q,))
    res = push(db, [Seg(q, "p", ["w", "v"])])
    assert res[0]["dups"] == [{"i": 0, "off": 1}, {"i": 1, "off": 3}]
    # once the oldest copy is out of the window, the next one is the original
    db.execute("UPDATE queen.log_txns SET created_at = created_at - interval '2 hours' "
               "WHERE partition_id = %s AND base_offset = 1", (pid,))
    res = push(db, [Seg(q, "p", ["w"])])
    assert res[0]["dups"] == [{"i": 0, "off": 2}]


def test_same_hash_on_another_partition_is_queued(db):
    q = uq()
    push(db, [Seg(q, "p1", ["same"])])
    res = push(db, [Seg(q, "p2", ["same"]), Seg(uq(), "p1", ["same"])])
    assert [(r["s"], r["base"]) for r in res] == [("queued", 1), ("queued", 1)]


def test_window_zero_never_dedups_but_still_writes_the_sidecar(db):
    q = uq()
    db.execute("INSERT INTO queen.queues (name, dedup_window) VALUES (%s, 0)", (q,))
    for k in range(3):
        res = push(db, [Seg(q, "p", ["rep", "rep2"])])
        assert (res[0]["s"], res[0]["base"]) == ("queued", 1 + 2 * k)
    pid = pid_of(db, q, "p")
    assert counts(db, pid) == (3, 3, 6)
    stored = b"".join(bytes(x) for (x,) in db.execute(
        "SELECT hashes FROM queen.log_txns WHERE partition_id = %s ORDER BY base_offset", (pid,)))
    assert stored == hblob(["rep", "rep2"] * 3)


def test_duplicate_after_the_window_is_queued(db):
    q = uq()
    db.execute("INSERT INTO queen.queues (name, dedup_window) VALUES (%s, 5)", (q,))
    push(db, [Seg(q, "p", ["old", "keep"])])
    pid = pid_of(db, q, "p")
    assert push(db, [Seg(q, "p", ["old"])])[0]["s"] == "duplicate"
    db.execute("UPDATE queen.log_txns SET created_at = created_at - interval '10 seconds' "
               "WHERE partition_id = %s", (pid,))
    res = push(db, [Seg(q, "p", ["old"])])
    assert (res[0]["s"], res[0]["base"]) == ("queued", 3)
    # and the new copy is itself deduplicated against
    res = push(db, [Seg(q, "p", ["keep", "old"])])
    assert res[0]["dups"] == [{"i": 1, "off": 3}]


def test_probe_range_starts_above_verified_and_txns_start(db):
    q = uq()
    push(db, [Seg(q, "p", ["a", "b", "c"])])  # 1..3, one sidecar row
    push(db, [Seg(q, "p", ["d"])])  # 4
    pid = pid_of(db, q, "p")
    # the broker vouches for offsets <= 2: a (1) is not probed, c (3) is, though its row
    # starts below the verified offset
    res = push(db, [Seg(q, "p", ["a", "c"], verified=2)])
    assert res[0]["dups"] == [{"i": 1, "off": 3}]
    res = push(db, [Seg(q, "p", ["a"], verified=2)])
    assert (res[0]["s"], res[0]["base"]) == ("queued", 5)
    res = push(db, [Seg(q, "p", ["d", "a"], verified=7)])  # beyond last_offset: no probe
    assert (res[0]["s"], res[0]["base"]) == ("queued", 6)
    # txns_start raises the floor the same way
    db.execute("UPDATE queen.log_partitions SET txns_start = 5 WHERE id = %s", (pid,))
    res = push(db, [Seg(q, "p", ["b", "d", "a"])])
    assert res[0]["dups"] == [{"i": 1, "off": 6}, {"i": 2, "off": 5}]


def test_probe_over_out_of_line_sidecar_rows(db):
    """Segments big enough for their hash blob to be TOASTed out of line (EXTERNAL)."""
    q = uq()
    toast = db.execute("SELECT reltoastrelid::regclass::text FROM pg_class "
                       "WHERE oid = 'queen.log_txns'::regclass").fetchone()[0]
    chunks_before = db.execute(f"SELECT count(*) FROM {toast}").fetchone()[0]
    big = [f"big-{k}" for k in range(400)]  # 6400 bytes of hashes
    push(db, [Seg(q, "p", big)])
    push(db, [Seg(q, "p", [f"more-{k}" for k in range(400)])])
    pid = pid_of(db, q, "p")
    # stored out of line (TOAST chunks appeared) and uncompressed (STORAGE EXTERNAL)
    assert db.execute(f"SELECT count(*) FROM {toast}").fetchone()[0] > chunks_before
    assert db.execute("SELECT pg_column_compression(hashes) FROM queen.log_txns "
                      "WHERE partition_id = %s AND base_offset = 1", (pid,)).fetchone()[0] is None
    fresh = [f"new-{k}" for k in range(300)]
    incoming = [*fresh[:100], "big-399", *fresh[100:200], "more-0", "big-0", *fresh[200:]]
    res = push(db, [Seg(q, "p", incoming)])
    assert res[0]["dups"] == [{"i": 100, "off": 400}, {"i": 201, "off": 401},
                              {"i": 202, "off": 1}]
    assert counts(db, pid) == (2, 2, 800)


def test_a_few_frames_found_only_as_bytes_across_stored_hashes_are_queued(db):
    """A segment of up to 4 frames searches the stored blobs for its hashes' bytes before it
    probes: bytes found across two stored hashes, or in a straddling row below the verified
    offset, are no duplicate; a true one is still reported at its offset."""
    q = uq()
    push(db, [Seg(q, "p", ["a", "b", "c"])])  # 1..3, one sidecar row
    pid = pid_of(db, q, "p")
    across = h("a")[8:] + h("b")[:8]  # occurs in the row's blob at byte 8, no hash of it
    res = _raw(db, [q], ["p"], [1], [across], [0], [b"x"]).fetchone()[0]
    assert (res[0]["s"], res[0]["base"]) == ("queued", 4)
    across = h("b")[8:] + h("c")[:8]
    res = _raw(db, [q], ["p"], [2], [h("new") + across], [0], [b"x"]).fetchone()[0]
    assert (res[0]["s"], res[0]["base"]) == ("queued", 5)
    # "a" lies in the row straddling the verified offset, but below it: not probed
    res = push(db, [Seg(q, "p", ["a"], verified=2)])
    assert (res[0]["s"], res[0]["base"]) == ("queued", 7)
    res = push(db, [Seg(q, "p", ["x", "c", "y"])])
    assert res[0]["dups"] == [{"i": 1, "off": 3}]
    # five frames (four new ones and "b") take the probe alone: the same answers
    fresh = [f"n{k}" for k in range(4)]
    res = push(db, [Seg(q, "p", [*fresh, "b"])])
    assert res[0]["dups"] == [{"i": 4, "off": 2}]
    assert counts(db, pid)[2] == 7


def test_probe_of_a_giant_segment(db):
    """More than 8192 frames takes the join form of the probe; same answers."""
    q = uq()
    first = [f"g-{k}" for k in range(9000)]
    push(db, [Seg(q, "p", first)])
    incoming = [f"h-{k}" for k in range(9000)]
    incoming[17] = "g-8999"
    incoming[8999] = "g-0"
    res = push(db, [Seg(q, "p", incoming)])
    assert res[0]["dups"] == [{"i": 17, "off": 9000}, {"i": 8999, "off": 1}]
    incoming[17], incoming[8999] = "h-17", "h-8999"
    res = push(db, [Seg(q, "p", incoming)])
    assert (res[0]["s"], res[0]["base"]) == ("queued", 9001)


# ---------------------------------------------------------------------------------------------
# Guards
# ---------------------------------------------------------------------------------------------

def _raw(db, queues, parts, counts_, hashes, verified, blobs, tenants=None):
    return db.execute(PUSH_MULTI, (queues, parts, counts_, hashes, verified, blobs, tenants))


def test_alignment_guard(db):
    q = uq()
    one = hblob(["a"])
    cases = [
        ([q, q], ["p"], [1], [one], [0], [b"x"]),
        ([q], ["p"], [1, 1], [one], [0], [b"x"]),
        ([q], ["p"], [1], [one, one], [0], [b"x"]),
        ([q], ["p"], [1], [one], [0, 0], [b"x"]),
        ([q], ["p"], [1], [one], [0], [b"x", b"y"]),
        ([q], ["p"], [1], [one], [], [b"x"]),
        ([q], ["p"], [1], [one], None, [b"x"]),
    ]
    for case in cases:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as ex:
            _raw(db, *case)
        assert ex.value.sqlstate == "22023"
        assert "misaligned" in str(ex.value)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        _raw(db, [q], ["p"], [1], [one], [0], [b"x"], [DEFAULT_TENANT, DEFAULT_TENANT])
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        _raw(db, [q], [None], [1], [one], [0], [b"x"])
    assert db.execute("SELECT count(*) FROM queen.queues WHERE name = %s", (q,)).fetchone()[0] == 0


def test_stride_guard(db):
    q = uq()
    push(db, [Seg(q, "p", ["a"])])
    pid = pid_of(db, q, "p")
    for hashes, n in ((hblob(["a", "b"])[:-1], 2), (hblob(["a"]), 2), (hblob(["a", "b"]), 1)):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as ex:
            _raw(db, [q, uq()], ["p", "p"], [1, n], [hblob(["z"]), hashes], [0, 0],
                 [b"x", b"y"])
        assert "stride" in str(ex.value)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            db.execute(PUSH_ONE, (pid, 3600, n, hashes, 0, b"x", None))
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            db.execute(PUSH_ONE, (pid, 0, n, hashes, 0, b"x", None))
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute(PUSH_ONE, (pid, 0, 0, b"", 0, b"x", None))
    # the whole bundle rolled back, the good segment included
    assert counts(db, pid) == (1, 1, 1)


def test_same_partition_twice_in_one_bundle_raises(db):
    q = uq()
    push(db, [Seg(q, "p", ["a"])])
    pid = pid_of(db, q, "p")
    with pytest.raises(psycopg.errors.CardinalityViolation) as ex:
        push(db, [Seg(q, "p", ["b"]), Seg(q, "other", ["c"]), Seg(q, "p", ["d"])])
    assert ex.value.sqlstate == "21000"
    assert counts(db, pid) == (1, 1, 1)
    # distinct tenants make distinct partitions, so that is fine
    res = push(db, [Seg(q, "p", ["b"]), Seg(q, "p", ["b"])], tenants=[None, uuid.uuid4()])
    assert [r["s"] for r in res] == ["queued", "queued"]


def test_partition_deleted_while_the_bundle_waits_for_its_lock_is_retryable(db, db_dsn):
    """A partition resolved, then deleted (its queue dropped) while the bundle waits to lock it:
    40001, nothing written, the other partition of the bundle untouched."""
    q = uq()
    push(db, [Seg(q, "a", ["x"])])
    push(db, [Seg(q, "b", ["x"])])
    pa, pb = pid_of(db, q, "a"), pid_of(db, q, "b")
    errors: list[BaseException] = []
    with psycopg.connect(db_dsn) as blocker, psycopg.connect(db_dsn, autocommit=True) as probe:
        blocker.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s FOR UPDATE", (pb,))
        t = push_in_thread(db_dsn, [Seg(q, "b", ["b1"]), Seg(q, "a", ["a1"])], errors)
        try:
            wait_for_lock_wait(probe, "log_push_multi_v1",
                               "the bundle never waited on the blocked partition")
            blocker.execute("DELETE FROM queen.log_partitions WHERE id = %s", (pb,))
            blocker.commit()
        finally:
            blocker.rollback()
            t.join(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.SerializationFailure), errors
    assert "vanished" in str(errors[0])
    assert counts(db, pa) == (1, 1, 1)


def test_push_one_unknown_partition_raises(db):
    with pytest.raises(psycopg.errors.NoDataFound):
        db.execute(PUSH_ONE, (-1, 3600, 1, hblob(["a"]), 0, b"x", None))
    with pytest.raises(psycopg.errors.NoDataFound):
        db.execute(PUSH_ONE, (-1, 0, 1, hblob(["a"]), 0, b"x", None))


def test_push_one_called_directly(db):
    """The transaction wire calls the allocator itself, without a bundle timestamp."""
    q = uq()
    push(db, [Seg(q, "p", ["a"])])
    pid = pid_of(db, q, "p")
    r = db.execute(PUSH_ONE, (pid, 0, 2, hblob(["b", "c"]), 0, b"x", None)).fetchone()[0]
    assert (r["pid"], r["s"], r["base"]) == (pid, "queued", 2) and "i" not in r
    r = db.execute(PUSH_ONE, (pid, 3600, 1, hblob(["c"]), 0, b"x", None)).fetchone()[0]
    assert (r["s"], r["base"], r["dups"]) == ("duplicate", None, [{"i": 0, "off": 3}])
    assert assert_gapless(db, pid) == 3


def _cursor_ready_at(conn, pid: int, group: str):
    return conn.execute(
        "SELECT ready_at FROM queen.log_consumers WHERE partition_id = %s AND consumer_group = %s",
        (pid, group)).fetchone()[0]


@pytest.mark.parametrize("path", ["bundle", "push_one"])
def test_a_push_makes_the_caught_up_cursors_ready_at_its_segment(db, path):
    """The allocators keep the ready index (push.sql, pop.sql's log_ready_at_v1): a caught-up
    cursor (ready_at NULL) becomes ready at the created_at of the segment that grows its
    partition; a cursor that already waits keeps its older time; a cursor of another
    partition is not touched. The rows are written as the cursor writers write them, their
    flag from log_ready_at_v1."""
    q = uq()
    push(db, [Seg(q, "p", ["a"]), Seg(q, "other", ["b"])])
    pid, other = pid_of(db, q, "p"), pid_of(db, q, "other")
    db.execute(
        "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed_offset,"
        " queue_id, ready_at)"
        " SELECT v.pid, v.g, v.c, lp.queue_id, queen.log_ready_at_v1(v.pid, v.c, NULL, NULL)"
        " FROM (VALUES (%s::int8, 'caught_up', 1::int8), (%s, 'waiting', 0),"
        "              (%s, 'caught_up', 1)) v(pid, g, c)"
        " JOIN queen.log_partitions lp ON lp.id = v.pid",
        (pid, pid, other))
    assert _cursor_ready_at(db, pid, "caught_up") is None
    waiting = _cursor_ready_at(db, pid, "waiting")
    assert waiting is not None
    if path == "bundle":
        push(db, [Seg(q, "p", ["c"], verified=1)])
    else:
        db.execute(PUSH_ONE, (pid, 0, 1, hblob(["c"]), 0, b"x", None))
    created = segments(db, pid)[-1][2]
    assert _cursor_ready_at(db, pid, "caught_up") == created
    assert _cursor_ready_at(db, pid, "waiting") == waiting
    assert _cursor_ready_at(db, other, "caught_up") is None


def test_push_one_locks_the_caught_up_cursors_in_key_order(db, db_dsn):
    """log_push_one_v1 marks a partition's caught-up cursors in (partition, group) order, the
    order ack fusion locks them in (design.md invariant 4). Group "b" is written first, so a
    scan in heap order meets it first: while "a" is held by another transaction, the push
    must wait for "a" before it locks "b", or the two could deadlock."""
    q = uq()
    push(db, [Seg(q, "p", ["a"])])
    pid = pid_of(db, q, "p")
    for group in ("b", "a"):
        db.execute(
            "INSERT INTO queen.log_consumers (partition_id, consumer_group, committed_offset,"
            " queue_id, ready_at)"
            " SELECT lp.id, %s, 1, lp.queue_id, NULL FROM queen.log_partitions lp"
            " WHERE lp.id = %s", (group, pid))
    errors: list[BaseException] = []

    def push_one() -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                conn.execute(PUSH_ONE, (pid, 0, 1, hblob(["c"]), 0, b"x", None))
        except BaseException as ex:
            errors.append(ex)

    with psycopg.connect(db_dsn) as blocker, psycopg.connect(db_dsn, autocommit=True) as probe:
        blocker.execute("SELECT 1 FROM queen.log_consumers WHERE partition_id = %s"
                        " AND consumer_group = 'a' FOR UPDATE", (pid,))
        t = threading.Thread(target=push_one)
        t.start()
        try:
            wait_for_lock_wait(probe, "log_push_one_v1", "the push never waited for group a")
            probe.execute("SELECT 1 FROM queen.log_consumers WHERE partition_id = %s"
                          " AND consumer_group = 'b' FOR UPDATE NOWAIT", (pid,))
        finally:
            blocker.rollback()
            t.join(timeout=30)
    assert errors == []
    created = segments(db, pid)[-1][2]
    assert _cursor_ready_at(db, pid, "a") == _cursor_ready_at(db, pid, "b") == created


# ---------------------------------------------------------------------------------------------
# created_at, HOT
# ---------------------------------------------------------------------------------------------

def test_created_at_is_monotone_even_if_the_clock_lags(db):
    q = uq()
    push(db, [Seg(q, "p", ["a"])])
    pid = pid_of(db, q, "p")
    future = db.execute(
        "UPDATE queen.log_partitions SET last_created_at = now() + interval '1 hour' "
        "WHERE id = %s RETURNING last_created_at", (pid,)).fetchone()[0]
    r = push(db, [Seg(q, "p", ["b"]), Seg(q, "other", ["c"])])
    assert r[0]["ts"] == epoch_us(future)
    assert r[1]["ts"] < r[0]["ts"]  # the other partition keeps the bundle timestamp
    assert segments(db, pid)[-1][2] == future
    assert_gapless(db, pid)


def test_allocator_updates_are_hot(fresh_db_dsn):
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        q = uq()
        push(conn, [Seg(q, "p", ["warm"])])
        for k in range(300):
            push(conn, [Seg(q, "p", [f"t{k}"], verified=k + 1)])
        conn.execute("SELECT pg_stat_force_next_flush()")
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        upd, hot = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relid = 'queen.log_partitions'::regclass").fetchone()
    assert upd >= 300
    assert hot >= 0.9 * upd, (upd, hot)


def test_storage_settings(db):
    rows = dict(db.execute(
        "SELECT c.relname || '.' || a.attname, a.attstorage FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'queen' AND a.attname IN ('payload', 'hashes') "
        "AND c.relname IN ('log_segments', 'log_txns')").fetchall())
    assert rows == {"log_segments.payload": "e", "log_txns.hashes": "e"}
    opts = db.execute("SELECT reloptions FROM pg_class WHERE oid = 'queen.log_partitions'::regclass"
                      ).fetchone()[0]
    assert "fillfactor=50" in opts
    settings = dict(db.execute("SELECT key, value FROM queen.system_settings").fetchall())
    assert settings["maintenance_mode"] is False
    assert settings["pop_maintenance_mode"] is False


# ---------------------------------------------------------------------------------------------
# log_segment_at_v1
# ---------------------------------------------------------------------------------------------

def test_segment_at_finds_the_covering_segment(db):
    q = uq()
    push(db, [Seg(q, "p", ["a", "b", "c"], blob=b"first")])
    push(db, [Seg(q, "p", ["d", "e"], blob=b"second")])
    pid = pid_of(db, q, "p")

    def at(off: int):
        return [(b, n, bytes(p)) for b, n, _, p in db.execute(SEGMENT_AT, (pid, off))]

    for off in (1, 2, 3):
        assert at(off) == [(1, 3, b"first")]
    for off in (4, 5):
        assert at(off) == [(4, 2, b"second")]
    assert at(0) == [] and at(6) == [] and at(-5) == []
    assert db.execute(SEGMENT_AT, (-1, 1)).fetchall() == []
    created = db.execute(SEGMENT_AT, (pid, 2)).fetchone()[2]
    assert created == segments(db, pid)[0][2]
    db.execute("DELETE FROM queen.log_segments WHERE partition_id = %s AND base_offset = 1",
               (pid,))
    assert at(2) == [] and at(4) == [(4, 2, b"second")]


# ---------------------------------------------------------------------------------------------
# Cascade
# ---------------------------------------------------------------------------------------------

def _footprint(db, qid: int, pids: list[int]) -> dict[str, int]:
    return dict(zip(
        ["log_partitions", "log_segments", "log_txns", "log_consumers", "consumer_groups_meta",
         "log_dlq", "timers"],
        db.execute(
            "SELECT (SELECT count(*) FROM queen.log_partitions WHERE queue_id = %(q)s),"
            " (SELECT count(*) FROM queen.log_segments WHERE partition_id = ANY(%(p)s)),"
            " (SELECT count(*) FROM queen.log_txns WHERE partition_id = ANY(%(p)s)),"
            " (SELECT count(*) FROM queen.log_consumers WHERE partition_id = ANY(%(p)s)),"
            " (SELECT count(*) FROM queen.consumer_groups_meta WHERE queue_id = %(q)s),"
            " (SELECT count(*) FROM queen.log_dlq WHERE queue_id = %(q)s"
            "    OR partition_id = ANY(%(p)s)),"
            " (SELECT count(*) FROM queen.timers WHERE queue_id = %(q)s)",
            {"q": qid, "p": pids}).fetchone(), strict=True))


def test_deleting_a_queue_cascades_everything(db):
    q, other = uq(), uq()
    push(db, [Seg(q, "p1", ["a", "b"]), Seg(q, "p2", ["c"]), Seg(other, "p1", ["a"])])
    push(db, [Seg(q, "p1", ["d"])])
    qid = db.execute("SELECT id FROM queen.queues WHERE name = %s", (q,)).fetchone()[0]
    oqid = db.execute("SELECT id FROM queen.queues WHERE name = %s", (other,)).fetchone()[0]
    pids = [pid_of(db, q, "p1"), pid_of(db, q, "p2")]
    opids = [pid_of(db, other, "p1")]
    for pid in pids:
        db.execute("INSERT INTO queen.log_consumers (partition_id, consumer_group,"
                   " committed_offset, lease_id, worker_id, lease_expires_at)"
                   " VALUES (%s, 'g', 1, gen_random_uuid(), 'w', now() + interval '1 minute')",
                   (pid,))
    db.execute("INSERT INTO queen.consumer_groups_meta (queue_id, consumer_group,"
               " subscription_mode) VALUES (%s, 'g', 'new')", (qid,))
    db.execute("INSERT INTO queen.log_dlq (queue_id, partition_id, partition_name,"
               " consumer_group, \"offset\", message_id, transaction_id, payload, error,"
               " retry_count) VALUES (%s, %s, 'p1', 'g', 1, gen_random_uuid(), 'a', '\\x7b7d',"
               " 'boom', 3)", (qid, pids[0]))
    db.execute("INSERT INTO queen.timers (queue_id, timer_key, fire_at, payload,"
               " transaction_id, message_id) VALUES (%s, 'k', now(), '\\x7b7d', 'tx',"
               " gen_random_uuid())", (qid,))
    assert _footprint(db, qid, pids) == {
        "log_partitions": 2, "log_segments": 3, "log_txns": 3, "log_consumers": 2,
        "consumer_groups_meta": 1, "log_dlq": 1, "timers": 1}
    other_before = _footprint(db, oqid, opids)

    # a DLQ row outlives the segments it came from (no FK into segments)
    db.execute("DELETE FROM queen.log_segments WHERE partition_id = %s AND base_offset = 1",
               (pids[0],))
    assert _footprint(db, qid, pids)["log_dlq"] == 1

    db.execute("DELETE FROM queen.queues WHERE id = %s", (qid,))
    assert set(_footprint(db, qid, pids).values()) == {0}
    assert _footprint(db, oqid, opids) == other_before
    assert db.execute("SELECT count(*) FROM queen.queues WHERE id = %s", (qid,)).fetchone()[0] == 0


def test_deleting_a_partition_cascades_its_log(db):
    q = uq()
    push(db, [Seg(q, "p1", ["a"]), Seg(q, "p2", ["b"])])
    p1, p2 = pid_of(db, q, "p1"), pid_of(db, q, "p2")
    db.execute("DELETE FROM queen.log_partitions WHERE id = %s", (p1,))
    assert counts(db, p1)[:2] == (0, 0)
    assert counts(db, p2) == (1, 1, 1)


# ---------------------------------------------------------------------------------------------
# Concurrency
# ---------------------------------------------------------------------------------------------

def test_concurrent_bundles_never_deadlock_and_stay_gapless(db, db_dsn):
    queues = [uq("cc"), uq("cc")]
    # some partitions exist before the race, others are provisioned by it, concurrently
    pool = [(q, f"p{k}") for q in queues for k in range(6)]
    push(db, [Seg(q, p, ["warm"]) for q, p in pool[::2]])
    threads_n, seconds = 8, 3.0
    errors: list[BaseException] = []
    pushed: list[int] = [0] * threads_n
    bundles: list[int] = [0] * threads_n
    start = threading.Barrier(threads_n)

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                start.wait()
                deadline = time.monotonic() + seconds
                k = 0
                while time.monotonic() < deadline:
                    chosen = rng.sample(pool, rng.randint(1, len(pool)))  # random order
                    segs = [Seg(q, p, [f"{n}-{k}-{j}" for j in range(rng.randint(1, 4))])
                            for q, p in chosen]
                    k += 1
                    res = push(conn, segs)
                    assert [r["s"] for r in res] == ["queued"] * len(segs)
                    assert [r["i"] for r in res] == list(range(len(segs)))
                    pushed[n] += sum(len(s.txns) for s in segs)
                    bundles[n] += 1
        except BaseException as ex:
            errors.append(ex)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert all(b > 0 for b in bundles), bundles
    total = 0
    for q, p in pool:
        total += assert_gapless(db, pid_of(db, q, p))
    assert total == sum(pushed) + len(pool[::2])
