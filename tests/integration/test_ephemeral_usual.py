"""The usual pop and the usual ack (sql/functions/ephemeral.sql, eph_pop_v5 and eph_ack_v5: one
statement each, eph14) answer what the general way answers. Two queues take the same pushes,
pops and acks: one where the usual statements apply, and one where they never do (a
ttlSeconds that expires nothing sends every pop the general way; an ack with an element per id
sends it the general way). Every pop must hand out the same messages in the same runs, every
ack must answer the same outcomes, and the queues' gauges and chunks must agree after each
step: a usual path that took more or fewer messages, moved a cursor wrong, struck the wrong
range or counted wrong fails here.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import orjson
import psycopg
import pytest

from queen_mp.db import ephemeral_procs
from queen_mp.db.binarrays import register_arrays
from queen_mp.front.ephemeral import render_messages

ACK = ("SELECT outcomes FROM queen.eph_ack_v5(%s, %s, %s, %s::text[],"
       " array_to_string(%s::int8[], ','), %s::int8[], %s::text[])")


@pytest.fixture
def conn(db_dsn: str) -> Any:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        register_arrays(c)
        yield c


class Queue:
    """One queue of the pair; ``usual``: the usual statements may serve it."""

    def __init__(self, conn: psycopg.Connection, usual: bool, bounded: bool) -> None:
        self.conn, self.usual = conn, usual
        self.tenant, self.name = uuid.uuid4(), f"usual-{uuid.uuid4().hex[:8]}"
        # bounded: pushes drop the oldest messages, inside chunks too (gone messages ahead of
        # the cursors, which the usual pop must leave to the general way)
        opts: dict[str, Any] = ({"maxLength": 450, "policy": "dropOldest"} if bounded
                                else {"maxLength": 1000000})
        if not usual:
            opts["ttlSeconds"] = 3600
        conn.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)",
                     (self.tenant, self.name, orjson.dumps(opts).decode()))

    def push(self, partition: str, payloads: list[str]) -> None:
        self.conn.execute(ephemeral_procs.PUSH_SQL, ephemeral_procs.push_params(
            self.tenant.bytes, self.name, partition, payloads))

    def pop(self, group: str, batch: int, partition: str | None = None
            ) -> tuple[ephemeral_procs.PopOutcome, list[dict[str, Any]]]:
        row = self.conn.execute(ephemeral_procs.POP_SQL, (self.tenant, self.name, partition,
                                                          group, batch, False),
                                binary=True).fetchone()
        assert row is not None
        out = ephemeral_procs.pop_outcome(row)
        return out, orjson.loads(render_messages(out))

    def ack(self, group: str, msgs: list[dict[str, Any]], status: str = "completed"
            ) -> list[str]:
        ids = [m["id"].split("-") for m in msgs]
        # as the broker sends them (ephemeral_procs.ack_params: one delivery's ids as one
        # epoch, delivery and status), or with an element per id (the general way)
        k = 1 if self.usual and len({i[2] for i in ids}) == 1 else len(ids)
        row = self.conn.execute(ACK, (self.tenant, self.name, group, [i[0] for i in ids][:k],
                                      [int(i[1]) for i in ids], [int(i[2]) for i in ids][:k],
                                      [status] * k)).fetchone()
        assert row is not None
        return ["acked"] * len(msgs) if row[0] is None else row[0]

    def state(self) -> tuple[Any, ...]:
        g = self.conn.execute("SELECT queen.eph_gauges_v1(%s, %s)",
                              (self.tenant, self.name)).fetchone()
        assert g is not None
        chunks = self.conn.execute(
            "SELECT p.partition, cardinality(k.offs) - 1, k.live, k.gone::text"
            " FROM queen.eph_chunks k JOIN queen.eph_partitions p ON p.id = k.pid"
            " WHERE p.tenant = %s AND p.queue = %s ORDER BY p.partition, k.base",
            (self.tenant, self.name)).fetchall()
        leases = self.conn.execute(
            "SELECT grp, partition, cardinality(seqs) FROM queen.eph_leases WHERE tenant = %s"
            " AND queue = %s ORDER BY 1, 2, 3", (self.tenant, self.name)).fetchall()
        return (g[0]["depth"], g[0]["bytes"],
                [tuple(c) for c in chunks], leases)


def shape(out: ephemeral_procs.PopOutcome, msgs: list[dict[str, Any]]) -> tuple[Any, ...]:
    """What a pop handed out, without the seqs and deliveries (the two queues' differ)."""
    return (out.parts, out.counts, out.atts, [(m["partition"], m["payload"], m["attempts"])
                                              for m in msgs])


@pytest.mark.parametrize("seed", range(4))
def test_the_usual_pop_and_ack_answer_what_the_general_way_answers(conn, seed):
    rng = random.Random(seed)
    fast, slow = Queue(conn, True, seed >= 2), Queue(conn, False, seed >= 2)
    both = (fast, slow)
    groups = ["g"] if seed % 2 == 0 else ["g", "h"]  # one group, or two (the ack's general way)
    for q in both:
        for g in groups:
            assert q.pop(g, 1)[0].claimed == 0  # registered before the pushes
    held: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = []
    n = 0
    for _ in range(60):
        step = rng.random()
        if step < 0.35:
            part = f"p{rng.randrange(3)}"
            size = rng.choice([1, 3, 100, 180, 300])
            payloads = [f'"m{n + i}"' for i in range(size)]
            n += size
            for q in both:
                q.push(part, payloads)
        elif step < 0.8:
            group = rng.choice(groups)
            batch = rng.choice([1, 7, 70, 100, 256, 400])
            partition = rng.choice([None, None, None, "p1"])
            got = [q.pop(group, batch, partition) for q in both]
            assert shape(*got[0]) == shape(*got[1])
            if got[0][0].claimed:
                held.append((group, got[0][1], got[1][1]))
        elif held:
            group, fmsgs, smsgs = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.3 and len(fmsgs) > 1:  # part of a delivery, the rest later
                cut = rng.randrange(1, len(fmsgs))
                held.append((group, fmsgs[cut:], smsgs[cut:]))
                fmsgs, smsgs = fmsgs[:cut], smsgs[:cut]
            assert fast.ack(group, fmsgs) == slow.ack(group, smsgs)
        assert fast.state() == slow.state()
    for group, fmsgs, smsgs in held:
        assert fast.ack(group, fmsgs) == slow.ack(group, smsgs)
    for g in groups:  # drained the same way
        while True:
            got = [q.pop(g, 100) for q in both]
            assert shape(*got[0]) == shape(*got[1])
            if not got[0][0].claimed:
                break
            assert fast.ack(g, got[0][1]) == slow.ack(g, got[1][1])
            assert fast.state() == slow.state()
    assert fast.state()[:3] == (0, 0, [])
