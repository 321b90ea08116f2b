"""Ephemeral messages stored by the chunk (schema 011): what the routes show is what a row per
message showed. A push of more than 256 messages spans chunks, acks out of order free exactly
what they acknowledged, a group that comes later starts at what is still stored even inside a
chunk, and the migration carries the messages of 009 over.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from queen_mp.db import ephemeral_procs
from queen_mp.db.binarrays import register_arrays
from queen_mp.db.migrations import apply_migrations
from queen_mp.models.ephemeral import parse_id
from tests.pgharness import SQL_DIR, drop_database, eph_pop, make_database

E = "/api/v1/ephemeral"


def uq() -> str:
    return f"chunk-{uuid.uuid4().hex[:10]}"


def push(c: httpx.Client, queue: str, payloads: list[Any], partition: str = "p") -> None:
    r = c.post(f"{E}/push", json={"queue": queue, "partition": partition,
                                  "messages": [{"payload": p} for p in payloads]})
    assert r.status_code == 201, r.text


def pop(c: httpx.Client, queue: str, group: str, batch: int) -> list[dict[str, Any]]:
    r = c.get(f"{E}/pop", params={"queue": queue, "group": group, "batch": str(batch)})
    assert r.status_code == 200, r.text
    return r.json()["messages"]


def ack(c: httpx.Client, queue: str, group: str, msgs: list[dict[str, Any]]) -> list[str]:
    r = c.post(f"{E}/ack", json={"queue": queue, "group": group,
                                 "acks": [{"id": m["id"]} for m in msgs]})
    assert r.status_code == 200, r.text
    return [x["outcome"] for x in r.json()["results"]]


def depth(c: httpx.Client, queue: str) -> dict[str, Any]:
    r = c.get(f"{E}/queues/{queue}/depth")
    assert r.status_code == 200, r.text
    return r.json()


def chunks(db_dsn: str, queue: str) -> list[tuple[int, int, int]]:
    """(messages, live, base % 256) of the queue's chunks, in seq order."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT cardinality(k.offs) - 1, k.live, k.base %% 256 FROM queen.eph_chunks k "
            "JOIN queen.eph_partitions p ON p.id = k.pid WHERE p.queue = %s ORDER BY k.base",
            (queue,)).fetchall()]


def test_a_push_over_256_spans_chunks_read_in_order_and_freed_by_out_of_order_acks(broker,
                                                                                   db_dsn):
    q, c = uq(), broker.client
    push(c, q, list(range(600)))
    assert chunks(db_dsn, q) == [(256, 256, 0), (256, 256, 0), (88, 88, 0)]
    got = [pop(c, q, "g", 150) for _ in range(4)]
    assert [m["payload"] for batch in got for m in batch] == list(range(600))
    assert pop(c, q, "g", 10) == []
    # the second delivery first, then every other message of the first: each ack frees what
    # it acknowledged, whatever chunk it sits in
    assert set(ack(c, q, "g", got[1])) == {"acked"}
    assert depth(c, q)["pending"] == 450
    assert set(ack(c, q, "g", got[0][::2])) == {"acked"}
    assert depth(c, q)["pending"] == 375
    assert chunks(db_dsn, q) == [(256, 75, 0), (256, 212, 0), (88, 88, 0)]
    # a second ack of the same ids finds nothing: nothing is counted twice
    assert set(ack(c, q, "g", got[0][::2])) == {"unknown"}
    assert depth(c, q)["pending"] == 375
    assert set(ack(c, q, "g", got[0][1::2] + got[2] + got[3])) == {"acked"}
    d = depth(c, q)
    assert (d["pending"], d["bytes"]) == (0, 0), d
    assert chunks(db_dsn, q) == []  # a chunk goes with its last message


def test_a_chunks_payloads_are_stored_out_of_line_uncompressed(broker, db_dsn):
    """schemas 012 and 015: no pglz at a push nor at each pop of the chunk (the payloads
    compress well, so EXTENDED storage would have compressed them)."""
    q, c = uq(), broker.client
    push(c, q, [{"pad": "x" * 200, "i": i} for i in range(100)])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_column_compression(k.body), pg_column_size(k.body) "
            "FROM queen.eph_chunks k JOIN queen.eph_partitions p ON p.id = k.pid "
            "WHERE p.queue = %s", (q,)).fetchone()
    assert row is not None and row[0] is None and row[1] > 20_000, row
    assert [m["payload"]["i"] for m in pop(c, q, "g", 100)] == list(range(100))


def test_a_large_deliverys_row_is_stored_uncompressed_in_its_page(broker, db_dsn):
    """schema 013: a pop of 600 messages (a 7 kB row of seqs and delivery counts) is neither
    compressed (pglz at the pop, again at the ack) nor moved out of line."""
    q, c = uq(), broker.client
    push(c, q, list(range(600)))
    got = pop(c, q, "g", 600)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_column_compression(l.seqs), pg_column_compression(l.atts), "
            "cardinality(l.seqs), pg_column_size(l.seqs) FROM queen.eph_leases l "
            "WHERE l.queue = %s", (q,)).fetchone()
    assert row is not None and row[:3] == (None, None, 600) and row[3] > 4800, row
    assert set(ack(c, q, "g", got)) == {"acked"}
    assert depth(c, q)["pending"] == 0
    assert chunks(db_dsn, q) == []


def test_deliveries_across_two_chunks_free_what_they_acknowledged(broker, db_dsn):
    """The ack of a delivery that ends inside the next chunk (pops of 70 over pushes of 100):
    the first chunk goes when the run was what it had left, the second loses its run."""
    q, c = uq(), broker.client
    for i in range(3):
        push(c, q, list(range(i * 100, i * 100 + 100)))
    got = [pop(c, q, "g", 70) for _ in range(4)]
    assert [m["payload"] for batch in got for m in batch] == list(range(280))
    assert set(ack(c, q, "g", got[0])) == {"acked"}  # one chunk, part of it
    assert chunks(db_dsn, q) == [(100, 30, 0), (100, 100, 0), (100, 100, 0)]
    assert set(ack(c, q, "g", got[1])) == {"acked"}  # its end, then the next one's start
    assert chunks(db_dsn, q) == [(100, 60, 0), (100, 100, 0)]
    assert set(ack(c, q, "g", got[3])) == {"acked"}  # out of order: inside the third
    assert chunks(db_dsn, q) == [(100, 60, 0), (100, 30, 0)]
    assert set(ack(c, q, "g", got[2])) == {"acked"}  # the second's end and the third's
    assert chunks(db_dsn, q) == [(100, 20, 0)]
    assert depth(c, q)["pending"] == 20
    assert set(ack(c, q, "g", got[2])) == {"unknown"}  # nothing is counted twice
    assert depth(c, q)["pending"] == 20
    assert [m["payload"] for m in pop(c, q, "g", 70)] == list(range(280, 300))


def test_a_later_group_starts_at_what_is_still_stored_inside_a_chunk(broker, db_dsn):
    q, c = uq(), broker.client
    assert pop(c, q, "first", 1) == []  # registered: messages now wait for it
    push(c, q, [f"m{i}" for i in range(10)])
    taken = pop(c, q, "first", 10)
    assert set(ack(c, q, "first", taken[2:5])) == {"acked"}  # m2..m4 leave the chunk
    assert chunks(db_dsn, q) == [(10, 7, 0)]
    d = depth(c, q)
    assert d["pending"] == 7
    assert d["consumerGroups"] == [{"group": "first", "pending": 0, "inFlight": 7}]
    later = pop(c, q, "later", 10)
    assert [m["payload"] for m in later] == ["m0", "m1", "m5", "m6", "m7", "m8", "m9"]
    assert set(ack(c, q, "later", later)) == {"acked"}
    # still held by 'first': stored until it acknowledges them too
    assert depth(c, q)["pending"] == 7
    assert set(ack(c, q, "first", taken[:2] + taken[5:])) == {"acked"}
    assert depth(c, q)["pending"] == 0
    assert chunks(db_dsn, q) == []


def test_a_pop_cut_inside_a_later_run_of_a_chunk_resumes_after_it(broker, db_dsn):
    """A chunk with a hole is two runs (eph_pop_v5): a batch that ends inside the second takes
    its first messages, ids in order, and the next pop goes on from there."""
    q, c = uq(), broker.client
    assert pop(c, q, "first", 1) == []
    push(c, q, [f"m{i}" for i in range(10)])
    taken = pop(c, q, "first", 10)
    assert set(ack(c, q, "first", taken[2:5])) == {"acked"}
    head = pop(c, q, "later", 3)
    assert [m["payload"] for m in head] == ["m0", "m1", "m5"]
    assert [m["id"].split("-")[1] for m in head] == [
        m["id"].split("-")[1] for m in taken[:2] + taken[5:6]]
    rest = pop(c, q, "later", 10)
    assert [m["payload"] for m in rest] == ["m6", "m7", "m8", "m9"]
    assert len({m["id"].split("-")[2] for m in head + rest}) == 2  # two deliveries
    assert set(ack(c, q, "later", head + rest)) == {"acked"}
    assert set(ack(c, q, "first", taken[:2] + taken[5:])) == {"acked"}
    assert chunks(db_dsn, q) == []


def test_pops_over_chunks_of_one_message_read_them_in_order(broker, db_dsn):
    """Pushes of one message (a chunk each): a pop reads its batch from the chunks in one range
    scan (eph_pop_v5), past the cursor, whatever another group still keeps stored below it."""
    q, c = uq(), broker.client
    for g in ("first", "later"):
        assert pop(c, q, g, 1) == []  # registered: messages now wait for both
    for i in range(7):
        push(c, q, [f"m{i}"])
    assert chunks(db_dsn, q) == [(1, 1, 0)] * 7
    taken = pop(c, q, "first", 5)
    assert [m["payload"] for m in taken] == [f"m{i}" for i in range(5)]
    assert set(ack(c, q, "first", taken)) == {"acked"}  # still stored: 'later' needs them
    head = pop(c, q, "later", 2)
    assert [m["payload"] for m in head] == ["m0", "m1"]
    # the cursor sits on a chunk still stored; the next batch starts after it
    rest = pop(c, q, "later", 4)
    assert [m["payload"] for m in rest] == ["m2", "m3", "m4", "m5"]
    assert [m["payload"] for m in pop(c, q, "first", 10)] == ["m5", "m6"]
    assert [m["payload"] for m in pop(c, q, "later", 10)] == ["m6"]
    assert depth(c, q)["pending"] == 7


def test_one_groups_ack_of_a_delivery_over_three_chunks_deletes_and_strikes_each(broker,
                                                                                   db_dsn):
    """The ack of a whole delivery of one group whose messages sit in three chunks, the first
    keeping a message of another delivery (eph_ack_v5's one-group way, neither one chunk nor
    two): the chunks it empties go, the first loses what it acknowledged, each counted once."""
    q, c = uq(), broker.client
    for i in range(3):
        push(c, q, [f"m{i}{j}" for j in range(3)])
    first = pop(c, q, "g", 1)
    got = pop(c, q, "g", 8)
    assert [m["payload"] for m in first + got] == [
        f"m{i}{j}" for i in range(3) for j in range(3)]
    assert set(ack(c, q, "g", got)) == {"acked"}
    assert chunks(db_dsn, q) == [(3, 1, 0)]
    assert depth(c, q)["pending"] == 1
    assert set(ack(c, q, "g", got)) == {"unknown"}
    assert set(ack(c, q, "g", first)) == {"acked"}
    assert chunks(db_dsn, q) == []
    d = depth(c, q)
    assert (d["pending"], d["bytes"]) == (0, 0), d


def test_drop_oldest_cuts_inside_a_chunk_and_redeliveries_read_from_it(broker, db_dsn):
    q, c = uq(), broker.client
    r = c.post(f"{E}/configure", json={"queue": q, "options": {
        "maxLength": 300, "policy": "dropOldest", "retryLimit": 2}})
    assert r.status_code == 201, r.text
    push(c, q, list(range(280)))  # a chunk of 256 and one of 24
    taken = pop(c, q, "g", 5)
    r = c.post(f"{E}/ack", json={"queue": q, "group": "g", "acks": [
        {"id": m["id"], "status": "retry"} for m in taken[3:]]})
    assert [x["outcome"] for x in r.json()["results"]] == ["redelivered"] * 2
    push(c, q, list(range(1000, 1030)))  # 10 over: the ten oldest go, 3 of them leased
    d = depth(c, q)
    assert (d["pending"], d["drops"]["bounds"]) == (300, 10), d
    assert chunks(db_dsn, q) == [(256, 246, 0), (24, 24, 0), (30, 30, 0)]
    assert ack(c, q, "g", taken[:3]) == ["unknown"] * 3  # dropped with their delivery
    again = pop(c, q, "g", 3)
    assert [m["payload"] for m in again] == [10, 11, 12]  # the retried ones were dropped too


def test_011_carries_the_messages_of_009_over(pg_server_dsn, tmp_path: Path):
    tree = tmp_path / "sql"
    shutil.copytree(SQL_DIR, tree)
    for later in (tree / "schema").glob("*.sql"):  # 011 and every file after it
        if later.name >= "011":
            later.unlink()
    dsn = make_database(pg_server_dsn)
    tenant = uuid.UUID(int=0)
    base = 16384 * 7
    # a 009 partition: messages base+0..2 and base+5 (3 and 4 acknowledged), base+256..257
    seqs = [base, base + 1, base + 2, base + 5, base + 256, base + 257]
    try:
        apply_migrations(dsn, tree)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO queen.eph_queues (tenant, queue, epoch) "
                         "VALUES (%s, 'old', '0123456789abcdef')", (tenant,))
            conn.execute("INSERT INTO queen.eph_partitions (tenant, queue, partition, id, "
                         "last_seq) VALUES (%s, 'old', 'p', 42, %s)", (tenant, seqs[-1]))
            for s in seqs:
                conn.execute("INSERT INTO queen.eph_messages (tenant, queue, partition, pid, seq,"
                             " payload, bytes) VALUES (%s, 'old', 'p', 42, %s, %s, %s)",
                             (tenant, s, f'"m{s - base}"', len(f'"m{s - base}"')))
            conn.execute("INSERT INTO queen.eph_counts (tenant, queue, slot, depth, bytes) "
                         "VALUES (%s, 'old', 0, 6, 28)", (tenant,))
        assert apply_migrations(dsn)[0] == "011_ephemeral_chunks.sql"
        with psycopg.connect(dsn, autocommit=True) as conn:
            # and 015 joins a chunk's payloads into its body (a missing one empty)
            rows = conn.execute("SELECT base - %s, body, offs, gone::text, live "
                                "FROM queen.eph_chunks ORDER BY base", (base,)).fetchall()
            assert rows == [
                (0, b'"m0"\x1e"m1"\x1e"m2"\x1e\x1e\x1e"m5"', [0, 5, 10, 15, 16, 17, 22],
                 "{[3,5)}", 4),
                (256, b'"m256"\x1e"m257"', [0, 7, 14], "{}", 2)]
            msgs = eph_pop(conn, tenant, "old", None, "g", 10, False)
            assert [m["payload"] for m in msgs] == ["m0", "m1", "m2", "m5", "m256", "m257"]
            ids = [parse_id(m["id"]) for m in msgs]  # the seqs of 009 name the same messages
            assert [(i[0], i[1]) if i else None for i in ids] == [
                ("0123456789abcdef", s) for s in seqs]
    finally:
        drop_database(pg_server_dsn, dsn)


def test_multibyte_payloads_come_back_verbatim_from_chunk_bodies(db_dsn):
    """schema 015: a chunk's body is its payloads' UTF-8 bytes, a run one substring of it by
    byte offsets: payloads of 1-4 bytes a character, pushed alone (over 256: a chunk's slice
    of the push's offsets) and fused (eph_push_v5, the second request of a partition refused),
    come back verbatim from the usual read, the walk (a pop across chunks and pushes) and a
    redelivery."""
    tenant, q = uuid.uuid4(), uq()
    texts = [orjson.dumps({"i": i, "s": "aé€😀"[: i % 5] * (i % 7)}).decode()
             for i in range(400)]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        register_arrays(conn)
        conn.execute("SELECT queen.eph_configure_v1(%s, %s, '{\"maxLength\": 399}'::jsonb)",
                     (tenant, q))
        for part, msgs in (("a", texts[:300]), ("b", texts[300:301])):
            conn.execute(ephemeral_procs.PUSH_SQL,
                         ephemeral_procs.push_params(tenant.bytes, q, part, msgs))
        # to a, to b, and to b again: the last one would make 400 (maxLength, reject)
        reqs = [("a", texts[301:350]), ("b", texts[350:399]), ("b", texts[399:])]
        row = conn.execute(ephemeral_procs.PUSH_MANY_SQL, ephemeral_procs.push_many_params(
            [tenant.bytes] * 3, [q] * 3, [p for p, _ in reqs], [m for _, m in reqs])).fetchone()
        assert row is not None and row[0] == [49, 49, -1]
        first = eph_pop(conn, tenant, q, "a", "g", 70, False)  # the usual read
        assert [m["payload"]["i"] for m in first] == list(range(70))
        ids = [i for i in (parse_id(m["id"]) for m in first[:5]) if i]
        row = conn.execute(ephemeral_procs.ACK_SQL, ephemeral_procs.ack_params(
            tenant.bytes, q, "g", ["retry"], [i[0] for i in ids], [str(i[1]) for i in ids],
            [str(i[2]) for i in ids])).fetchone()
        assert row is not None
        assert ephemeral_procs.ack_outcome(row, 5).outcomes == ["redelivered"] * 5
        again = eph_pop(conn, tenant, q, "a", "g", 5, True)  # the redelivery
        assert [m["payload"] for m in again] == [m["payload"] for m in first[:5]]
        got = [m["payload"] for m in first[5:]]
        for part in ("a", "b"):  # a: the walk over two chunks and the fused push's
            while msgs := eph_pop(conn, tenant, q, part, "g", 97, True):
                got += [m["payload"] for m in msgs]
    assert got == [orjson.loads(t) for t in texts[5:300] + texts[301:350] + texts[300:301]
                   + texts[350:399]]
