"""Fused ephemeral pushes: ``queen.eph_push_v5`` (sql/functions/ephemeral.sql) and the front
worker's ``EphemeralPushFusion`` (queen_mp/front/ephemeral.py). A fused call answers each
request from its own verdict (stored, queue_full, or pushed alone), stores nothing of a request
it refuses, keeps the bounds exact within the call, keeps seqs in commit order within a
partition, and takes its rows in one order, so two fused calls that wait for each other's
partitions end.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest

from queen_mp.db import ephemeral_procs
from queen_mp.db.binarrays import register_arrays
from queen_mp.db.errors import StatementError
from queen_mp.db.pooled import failover_pool
from queen_mp.front.ephemeral import EphemeralPushFusion
from queen_mp.models.ephemeral import Push
from tests.pgharness import eph_pop


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    c = psycopg.connect(db_dsn, autocommit=True)
    register_arrays(c)
    c.execute("SET deadlock_timeout = '50ms'")
    yield c
    c.close()


Request = tuple[uuid.UUID, str, str, list[str]]  # tenant, queue, partition, payloads


def fused(c: psycopg.Connection, reqs: list[Request]) -> tuple[list[int], list[str | None]]:
    row = c.execute(ephemeral_procs.PUSH_MANY_SQL, ephemeral_procs.push_many_params(
        [t.bytes for t, *_ in reqs], [q for _, q, _, _ in reqs], [p for _, _, p, _ in reqs],
        [ps for *_, ps in reqs])).fetchone()
    assert row is not None
    return row[0], row[1]


def alone(c: psycopg.Connection, tenant: uuid.UUID, queue: str, partition: str,
          payloads: list[str]) -> None:
    c.execute(ephemeral_procs.PUSH_SQL,
              ephemeral_procs.push_params(tenant.bytes, queue, partition, payloads))


def configure(c: psycopg.Connection, tenant: uuid.UUID, queue: str, **options: Any) -> None:
    c.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)",
              (tenant, queue, orjson.dumps(options).decode()))


def drain(c: psycopg.Connection, tenant: uuid.UUID, queue: str) -> list[tuple[str, Any]]:
    """(partition, payload) of every message, in the order one group pops them (autoAck)."""
    out: list[tuple[str, Any]] = []
    while True:
        msgs = eph_pop(c, tenant, queue, None, "g", 1000, True)
        if not msgs:
            return out
        out += [(m["partition"], m["payload"]) for m in msgs]


def depth(c: psycopg.Connection, tenant: uuid.UUID, queue: str) -> int:
    row = c.execute("SELECT queen.eph_gauges_v1(%s, %s)", (tenant, queue)).fetchone()
    assert row is not None
    return int(row[0]["depth"])


def test_each_request_of_a_fused_call_gets_its_own_verdict(conn):
    t1, t2 = sorted([uuid.uuid4(), uuid.uuid4()], key=lambda t: t.bytes)
    q, small = f"fuse-{uuid.uuid4().hex[:8]}", f"fuse-small-{uuid.uuid4().hex[:8]}"
    configure(conn, t1, small, maxLength=4)
    for t, queue, part in ((t1, q, "a"), (t1, q, "b"), (t1, small, "a"), (t2, q, "a")):
        alone(conn, t, queue, part, ["0"])  # the queues and partitions exist
    reqs: list[Request] = [
        (t1, q, "a", ["1", "2"]), (t1, q, "a", ["3"]), (t1, q, "b", ["4"]),
        (t1, small, "a", ["5", "6"]),  # fits: 1 + 2 <= 4
        (t1, small, "a", ["7", "8"]),  # does not: its neighbour's two count
        (t1, small, "a", ["9"]),       # fits again
        (t1, small, "a", ["1", "2", "3", "4", "5"]),  # larger than the queue
        (t2, q, "a", ["10"]),
    ]
    pushed, details = fused(conn, reqs)
    assert pushed == [2, 1, 1, 2, -1, 1, -1, 1]
    assert details[:4] == [None] * 4 and details[5] is None and details[7] is None
    assert "policy is reject" in (details[4] or "")
    assert "larger than the queue" in (details[6] or "")
    # only the stored requests, in request order within a partition, and counted
    assert drain(conn, t1, q) == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 4)]
    assert drain(conn, t1, small) == [("a", 0), ("a", 5), ("a", 6), ("a", 9)]
    assert drain(conn, t2, q) == [("a", 0), ("a", 10)]
    assert depth(conn, t1, q) == depth(conn, t1, small) == depth(conn, t2, q) == 0


def test_the_usual_call_stores_every_request_from_the_callers_runs(conn):
    """Every queue within its bounds and without a ttl: eph_push_v5 stores the runs the caller
    made (neighbours of one partition merged, a run of over 256 messages in two chunks, a
    queue filled exactly to maxLength), each partition's messages in request order."""
    t1, t2 = sorted([uuid.uuid4(), uuid.uuid4()], key=lambda t: t.bytes)
    q, exact = f"fuse-usual-{uuid.uuid4().hex[:8]}", f"fuse-exact-{uuid.uuid4().hex[:8]}"
    configure(conn, t1, exact, maxLength=4)
    for t, queue, part in ((t1, q, "a"), (t1, q, "b"), (t1, exact, "a"), (t2, q, "a")):
        alone(conn, t, queue, part, ["0"])
    big = [str(i) for i in range(100, 400)]
    reqs: list[Request] = [
        (t1, q, "a", ["1", "2"]), (t1, q, "a", big), (t1, q, "b", ["3"]),
        (t1, exact, "a", ["4", "5", "6"]),  # 1 + 3 = maxLength: fits
        (t2, q, "a", ["7"]),
    ]
    order = sorted(range(5), key=lambda i: (reqs[i][0].bytes, reqs[i][1], reqs[i][2]))
    pushed, details = fused(conn, [reqs[i] for i in order])  # as the front sorts them
    assert [pushed[order.index(i)] for i in range(5)] == [2, 300, 1, 3, 1]
    assert details == [None] * 5
    chunks = conn.execute("SELECT count(*) FROM queen.eph_chunks k JOIN queen.eph_partitions p"
                          " ON p.id = k.pid WHERE p.tenant = %s AND p.queue = %s AND "
                          "p.partition = 'a'", (t1, q)).fetchone()
    assert chunks == (3,)  # the first push's, and 302 messages in two (one run: 1 + 2 apart)
    assert drain(conn, t1, q) == [("a", 0), ("a", 1), ("a", 2),
                                  *(("a", int(x)) for x in big), ("b", 0), ("b", 3)]
    assert drain(conn, t1, exact) == [("a", x) for x in range(7) if x in (0, 4, 5, 6)]
    assert drain(conn, t2, q) == [("a", 0), ("a", 7)]
    assert depth(conn, t1, q) == depth(conn, t1, exact) == depth(conn, t2, q) == 0


def test_requests_that_must_drop_go_alone_and_new_partitions_undo_the_call(conn):
    t = uuid.uuid4()
    ttl, oldest, plain = (f"fuse-{k}-{uuid.uuid4().hex[:8]}" for k in ("ttl", "old", "plain"))
    configure(conn, t, ttl, ttlSeconds=60)
    configure(conn, t, oldest, maxLength=2, policy="dropOldest")
    for queue in (ttl, oldest, plain):
        alone(conn, t, queue, "a", ["0"])
    reqs = sorted([(t, ttl, "a", ["1"]), (t, oldest, "a", ["1"]), (t, oldest, "a", ["2", "3"]),
                   (t, plain, "a", ["1"])], key=lambda r: (r[1], r[2]))
    pushed, _ = fused(conn, reqs)
    verdict = {(r[1], tuple(r[3])): n for r, n in zip(reqs, pushed, strict=True)}
    assert verdict == {(ttl, ("1",)): -2, (oldest, ("1",)): 1, (oldest, ("2", "3")): -2,
                       (plain, ("1",)): 1}
    assert depth(conn, t, ttl) == 1 and depth(conn, t, oldest) == 2
    # a partition without a row: QE002, and nothing of the call was written
    last = conn.execute("SELECT last_seq FROM queen.eph_partitions WHERE tenant = %s AND "
                        "queue = %s AND partition = 'a'", (t, plain)).fetchone()
    with pytest.raises(psycopg.Error) as refused:
        fused(conn, [(t, plain, "a", ["2"]), (t, plain, "new", ["3"])])
    assert refused.value.sqlstate == ephemeral_procs.SQLSTATE_PUSH_ALONE
    assert conn.execute("SELECT last_seq FROM queen.eph_partitions WHERE tenant = %s AND "
                        "queue = %s AND partition = 'a'", (t, plain)).fetchone() == last
    assert depth(conn, t, plain) == 2
    # unsorted requests are refused
    with pytest.raises(psycopg.Error) as unsorted:
        fused(conn, [(t, plain, "b", ["1"]), (t, plain, "a", ["2"])])
    assert unsorted.value.sqlstate == "22023"


class Call(threading.Thread):
    def __init__(self, fn: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except psycopg.Error as ex:
            self.error = ex


def test_two_fused_calls_that_wait_for_each_others_partitions_both_end_in_seq_order(
        db_dsn, conn):
    t, q = uuid.uuid4(), f"fuse-locks-{uuid.uuid4().hex[:8]}"
    for part in ("a", "b"):
        alone(conn, t, q, part, ["0"])
    holder = psycopg.connect(db_dsn, autocommit=True)
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM queen.eph_partitions WHERE tenant = %s AND queue = %s AND "
                   "partition = 'b' FOR UPDATE", (t, q))
    conns = []
    for _ in range(2):
        c = psycopg.connect(db_dsn, autocommit=True)
        register_arrays(c)
        c.execute("SET deadlock_timeout = '50ms'")
        conns.append(c)
    first = Call(lambda: fused(conns[0], [(t, q, "a", ["1"]), (t, q, "b", ["1"])]))
    deadline = time.monotonic() + 10
    while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND "
                       "wait_event_type = 'Lock'", (conns[0].info.backend_pid,)).fetchone() != (1,):
        assert time.monotonic() < deadline, "the first call never waited"
        time.sleep(0.01)
    second = Call(lambda: fused(conns[1], [(t, q, "a", ["2"]), (t, q, "b", ["2"])]))
    while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND "
                       "wait_event_type = 'Lock'", (conns[1].info.backend_pid,)).fetchone() != (1,):
        assert time.monotonic() < deadline, "the second call never waited"
        time.sleep(0.01)
    holder.execute("ROLLBACK")
    for call in (first, second):
        call.join(20)
        assert not call.is_alive() and call.error is None, call.error
        assert call.result == ([1, 1], [None, None])
    # the second took its seqs after the first committed: it pops after it in each partition
    assert drain(conn, t, q) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    for c in (*conns, holder):
        c.close()


def test_the_front_fuses_concurrent_pushes_and_answers_each(db_dsn, monkeypatch):
    """Pushes that arrive while one is in flight go out in fused calls; every request is
    answered from its own verdict, whichever call or path it took."""
    calls: list[int] = []
    real = ephemeral_procs.push_many

    async def counted(conn: Any, tenants: Any, *rest: Any) -> Any:
        calls.append(len(tenants))
        return await real(conn, tenants, *rest)

    monkeypatch.setattr(ephemeral_procs, "push_many", counted)
    t, q = uuid.uuid4().bytes, f"fuse-front-{uuid.uuid4().hex[:8]}"
    full, ttl = f"fuse-full-{uuid.uuid4().hex[:8]}", f"fuse-ttl-{uuid.uuid4().hex[:8]}"

    async def scenario() -> list[Any]:
        pool = failover_pool(db_dsn, max_size=4, name="fusion-test")
        await pool.open(wait=True)
        try:
            async with pool.connection() as c:
                await ephemeral_procs.configure(c, t, full, {"maxLength": 30})
                await ephemeral_procs.configure(c, t, ttl, {"ttlSeconds": 60})
            fusion = EphemeralPushFusion(pool)
            pushes = [Push(queue, f"p{i % 3}", tuple(str(i * 10 + j) for j in range(n)))
                      for i in range(60)
                      for queue, n in ((q, 1 + i % 4), (full, 2), (ttl, 1))]

            async def one(p: Push) -> Any:
                try:
                    return await fusion.push(t, p)
                except ephemeral_procs.QueueFull:
                    return "full"

            return await asyncio.gather(*(one(p) for p in pushes))
        finally:
            await pool.close()

    out = asyncio.run(scenario())
    assert calls and max(calls) > 2  # fused calls happened
    by_queue: dict[int, list[Any]] = {0: out[0::3], 1: out[1::3], 2: out[2::3]}
    assert by_queue[0] == [1 + i % 4 for i in range(60)]  # every push of q stored whole
    assert by_queue[2] == [1] * 60  # the ttl queue's, each pushed alone
    assert by_queue[1].count(2) == 15 and by_queue[1].count("full") == 45  # exactly to 30
    with psycopg.connect(db_dsn, autocommit=True) as c:
        tenant = uuid.UUID(bytes=t)
        assert depth(c, tenant, q) == sum(1 + i % 4 for i in range(60))
        assert depth(c, tenant, full) == 30 and depth(c, tenant, ttl) == 60
        popped = drain(c, tenant, q)
        assert sorted(p for _, p in popped) == sorted(
            i * 10 + j for i in range(60) for j in range(1 + i % 4))


def test_a_fused_call_that_fails_answers_each_request_on_its_own(db_dsn, monkeypatch):
    """A failure of the fused call (here a statement error) stored nothing: each request is
    then pushed alone, and answered from that."""
    async def broken(*args: Any) -> Any:
        raise StatementError("the fused call failed")

    monkeypatch.setattr(ephemeral_procs, "push_many", broken)
    t, q = uuid.uuid4().bytes, f"fuse-fail-{uuid.uuid4().hex[:8]}"

    async def scenario() -> list[int]:
        pool = failover_pool(db_dsn, max_size=4, name="fusion-fail-test")
        await pool.open(wait=True)
        try:
            fusion = EphemeralPushFusion(pool)
            return await asyncio.gather(*(fusion.push(t, Push(q, "p", (str(i),)))
                                          for i in range(20)))
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == [1] * 20
    with psycopg.connect(db_dsn, autocommit=True) as c:
        assert sorted(p for _, p in drain(c, uuid.UUID(bytes=t), q)) == list(range(20))


def test_the_pushes_of_one_loop_turn_go_out_as_one_call(db_dsn, monkeypatch):
    """Pushes that reach a quiet worker in one event loop turn are one fused call, the first
    one included (it went alone at once, and only the rest were fused), and a push that
    arrives while that call is in flight goes in the next."""
    fused_calls: list[int] = []
    lone_calls: list[str] = []
    real_many, real_one = ephemeral_procs.push_many, ephemeral_procs.push

    async def many(conn: Any, tenants: Any, *rest: Any) -> Any:
        fused_calls.append(len(tenants))
        return await real_many(conn, tenants, *rest)

    async def one(conn: Any, tenant: Any, queue: str, partition: str, payloads: Any) -> Any:
        lone_calls.append(partition)
        return await real_one(conn, tenant, queue, partition, payloads)

    t, q = uuid.uuid4().bytes, f"fuse-turn-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[list[int], int]:
        pool = failover_pool(db_dsn, max_size=4, name="fusion-turn-test")
        await pool.open(wait=True)
        try:
            async with pool.connection() as c:
                for i in range(8):  # the partitions exist
                    await ephemeral_procs.push(c, t, q, f"p{i}", ["0"])
            monkeypatch.setattr(ephemeral_procs, "push_many", many)
            monkeypatch.setattr(ephemeral_procs, "push", one)
            fusion = EphemeralPushFusion(pool)
            first = [asyncio.ensure_future(fusion.push(t, Push(q, f"p{i}", ("1",))))
                     for i in range(8)]
            await asyncio.sleep(0)  # the call is sent: these two wait for it
            later = [asyncio.ensure_future(fusion.push(t, Push(q, f"p{i}", ("2",))))
                     for i in range(2)]
            return await asyncio.gather(*first, *later), len(fusion._waiting)
        finally:
            await pool.close()

    out, left = asyncio.run(scenario())
    assert out == [1] * 10 and left == 0
    assert fused_calls == [8, 2] and lone_calls == []
    with psycopg.connect(db_dsn, autocommit=True) as c:
        assert depth(c, uuid.UUID(bytes=t), q) == 18


def test_a_fused_call_locks_a_queues_partitions_by_an_index_scan(conn):
    """A queue's partition rows are locked in key order, the one order of every fused call:
    by an index scan of the primary key, never the bitmap scan that the generic plan of
    = ANY otherwise takes here (heap order, which every update moves)."""
    t, q = uuid.uuid4(), f"fuse-plan-{uuid.uuid4().hex[:8]}"
    for i in range(60):
        alone(conn, t, q, f"p{i:02}", ["0"])
    conn.execute("ANALYZE queen.eph_partitions")
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET client_min_messages = log")
    for _ in range(6):  # past plpgsql's custom plans, if any
        assert fused(conn, [(t, q, f"p{i:02}", ["1"]) for i in (3, 17, 42)]) == ([1] * 3,
                                                                                [None] * 3)
    conn.execute("SET client_min_messages = notice")
    updates = [p for p in plans if "Update on eph_partitions" in p]
    assert len(updates) == 6
    assert all("Index Scan using eph_partitions_pkey" in p and "Bitmap" not in p
               for p in updates), updates[-1]
