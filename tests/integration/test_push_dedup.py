"""Issue 3, push deduplication (api.md 2.1, life-of-a-push 1, 3, 5, 6): layer 1 inside a body,
layer 2 inside a flush, and the SQL probe against stored transactionIds within the window."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import random
import threading
import time

import httpx
import xxhash

from tests.integration.test_push_json import (
    PUSH,
    ZERO_UUID_TEXT,
    partition_state,
    push,
    queue_footprint,
    stored_messages,
    uq,
)


def _counts(db, pid: int) -> tuple[int, int]:
    return db.execute(
        "SELECT (SELECT count(*) FROM queen.log_segments WHERE partition_id = %(p)s), "
        "(SELECT count(*) FROM queen.log_txns WHERE partition_id = %(p)s)", {"p": pid}).fetchone()


def test_duplicate_inside_one_body_reports_the_first_items_id_and_offset(broker, db):
    q = uq("dd")
    res = push(broker.client, [
        {"queue": q, "transactionId": "t1", "payload": 1},
        {"queue": q, "transactionId": "t2", "payload": 2},
        {"queue": q, "transactionId": "t1", "payload": 3},
        {"queue": q, "partition": "other", "transactionId": "t1", "payload": 4},
        {"queue": q, "transactionId": "t1", "payload": 5},
    ])
    assert [r["status"] for r in res] == ["queued", "queued", "duplicate", "queued", "duplicate"]
    assert [r["offset"] for r in res] == [1, 2, 1, 1, 1]
    assert res[2]["messageId"] == res[4]["messageId"] == res[0]["messageId"]
    assert res[2]["message_id"] == res[0]["messageId"]
    assert res[2]["partitionId"] == res[0]["partitionId"] != res[3]["partitionId"]
    assert res[3]["messageId"] != res[0]["messageId"]
    assert all(r["transactionId"] == "t1" for r in (res[0], res[2], res[3], res[4]))
    msgs = stored_messages(db, q)
    assert sorted((m.partition, m.offset, m.payload) for m in msgs) == [
        ("Default", 1, b"1"), ("Default", 2, b"2"), ("other", 1, b"4")]
    assert partition_state(db, q, "Default")[1] == 2


def test_duplicate_across_requests_reports_the_original_and_writes_nothing(broker, db):
    q = uq("dd")
    first = push(broker.client, [{"queue": q, "transactionId": f"t{i}", "payload": i}
                                 for i in range(3)])
    pid, last = partition_state(db, q, "Default")
    assert last == 3
    seg_before = _counts(db, pid)

    again = push(broker.client, [{"queue": q, "transactionId": "t0", "payload": "changed"}])
    assert again[0]["status"] == "duplicate"
    assert again[0]["messageId"] == first[0]["messageId"]
    assert again[0]["offset"] == 1
    assert again[0]["partitionId"] == str(pid)
    assert partition_state(db, q, "Default")[1] == 3
    assert _counts(db, pid) == seg_before

    # the original in the middle of a multi-frame segment: its own id and offset
    again = push(broker.client, [{"queue": q, "transactionId": "t2", "payload": "x"},
                                 {"queue": q, "transactionId": "t1", "payload": "y"}])
    assert [(r["status"], r["messageId"], r["offset"]) for r in again] == [
        ("duplicate", first[2]["messageId"], 3), ("duplicate", first[1]["messageId"], 2)]
    assert partition_state(db, q, "Default")[1] == 3

    # a mix: the duplicate is reported, the new one is queued after the old ones
    mixed = push(broker.client, [{"queue": q, "transactionId": "t1", "payload": "z"},
                                 {"queue": q, "transactionId": "new", "payload": "n"}])
    assert (mixed[0]["status"], mixed[0]["messageId"], mixed[0]["offset"]) == (
        "duplicate", first[1]["messageId"], 2)
    assert (mixed[1]["status"], mixed[1]["offset"]) == ("queued", 4)
    msgs = stored_messages(db, q)
    assert [m.payload for m in msgs] == [b"0", b"1", b"2", b'"n"']
    assert [m.transaction_id for m in msgs] == ["t0", "t1", "t2", "new"]


def test_same_transaction_id_on_another_partition_or_queue_is_queued(broker, db):
    q, q2 = uq("dd"), uq("dd")
    a = push(broker.client, [{"queue": q, "partition": "p1", "transactionId": "same"}])
    b = push(broker.client, [{"queue": q, "partition": "p2", "transactionId": "same"}])
    c = push(broker.client, [{"queue": q2, "partition": "p1", "transactionId": "same"}])
    assert [x[0]["status"] for x in (a, b, c)] == ["queued"] * 3
    assert [x[0]["offset"] for x in (a, b, c)] == [1, 1, 1]
    assert len({x[0]["messageId"] for x in (a, b, c)}) == 3
    assert len({x[0]["partitionId"] for x in (a, b, c)}) == 3
    assert len(stored_messages(db, q)) == 2 and len(stored_messages(db, q2)) == 1


def test_duplicate_after_the_window_is_queued_backdated(broker, db):
    q = uq("dd")
    first = push(broker.client, [{"queue": q, "transactionId": "old", "payload": 1}])
    pid, _ = partition_state(db, q, "Default")
    (window,) = db.execute("SELECT dedup_window FROM queen.queues WHERE name = %s",
                           (q,)).fetchone()
    assert window == 3600  # the default of api.md 4
    db.execute("UPDATE queen.log_txns SET created_at = created_at - interval '3601 seconds' "
               "WHERE partition_id = %s", (pid,))
    again = push(broker.client, [{"queue": q, "transactionId": "old", "payload": 2}])
    assert again[0]["status"] == "queued"
    assert again[0]["offset"] == 2
    assert again[0]["messageId"] != first[0]["messageId"]
    # and that new copy is itself deduplicated against
    third = push(broker.client, [{"queue": q, "transactionId": "old", "payload": 3}])
    assert (third[0]["status"], third[0]["messageId"], third[0]["offset"]) == (
        "duplicate", again[0]["messageId"], 2)
    assert [m.payload for m in stored_messages(db, q)] == [b"1", b"2"]


def test_duplicate_after_a_one_second_window_is_queued(broker, db):
    q = uq("dd")
    first = push(broker.client, [{"queue": q, "transactionId": "w", "payload": 1}])
    db.execute("UPDATE queen.queues SET dedup_window = 1 WHERE name = %s", (q,))
    inside = push(broker.client, [{"queue": q, "transactionId": "w", "payload": 2}])
    assert inside[0]["status"] == "duplicate"
    assert inside[0]["messageId"] == first[0]["messageId"]
    time.sleep(2.2)
    after = push(broker.client, [{"queue": q, "transactionId": "w", "payload": 3}])
    assert after[0]["status"] == "queued" and after[0]["offset"] == 2
    assert [m.payload for m in stored_messages(db, q)] == [b"1", b"3"]


def test_duplicate_of_a_retained_away_segment_reports_the_zero_uuid(broker, db):
    q = uq("dd")
    first = push(broker.client, [{"queue": q, "transactionId": "gone", "payload": 1},
                                 {"queue": q, "transactionId": "gone2", "payload": 2}])
    kept = push(broker.client, [{"queue": q, "transactionId": "kept", "payload": 3}])
    pid, _ = partition_state(db, q, "Default")
    segs = db.execute("SELECT base_offset FROM queen.log_segments WHERE partition_id = %s "
                      "ORDER BY 1", (pid,)).fetchall()
    assert segs == [(1,), (3,)]
    db.execute("DELETE FROM queen.log_segments WHERE partition_id = %s AND base_offset = 1",
               (pid,))
    assert _counts(db, pid) == (1, 2)  # the transactionId sidecar is still there

    again = push(broker.client, [{"queue": q, "transactionId": "gone2", "payload": "x"},
                                 {"queue": q, "transactionId": "kept", "payload": "y"},
                                 {"queue": q, "transactionId": "gone", "payload": "z"}])
    assert [r["status"] for r in again] == ["duplicate"] * 3
    assert again[0]["messageId"] == ZERO_UUID_TEXT and again[0]["offset"] == 2
    assert again[1]["messageId"] == kept[0]["messageId"] and again[1]["offset"] == 3
    assert again[2]["messageId"] == ZERO_UUID_TEXT and again[2]["offset"] == 1
    assert first[0]["messageId"] != ZERO_UUID_TEXT
    assert partition_state(db, q, "Default")[1] == 3
    assert _counts(db, pid) == (1, 2)


def test_follower_of_a_leader_that_is_a_stored_duplicate_reports_the_stored_id(broker, db):
    q = uq("dd")
    original = push(broker.client, [{"queue": q, "transactionId": "lead", "payload": 0}])
    res = push(broker.client, [
        {"queue": q, "transactionId": "lead", "payload": 1},
        {"queue": q, "transactionId": "fresh", "payload": 2},
        {"queue": q, "transactionId": "lead", "payload": 3},
        {"queue": q, "transactionId": "fresh", "payload": 4},
    ])
    oid = original[0]["messageId"]
    assert [(r["status"], r["offset"]) for r in res] == [
        ("duplicate", 1), ("queued", 2), ("duplicate", 1), ("duplicate", 2)]
    assert res[0]["messageId"] == res[2]["messageId"] == oid
    assert res[3]["messageId"] == res[1]["messageId"] != oid
    assert [m.payload for m in stored_messages(db, q)] == [b"0", b"2"]


def test_dedup_window_zero_stores_repeats_across_requests(broker, db):
    q = uq("dd")
    push(broker.client, [{"queue": q, "transactionId": "warm", "payload": 0}])
    db.execute("UPDATE queen.queues SET dedup_window = 0 WHERE name = %s", (q,))
    a = push(broker.client, [{"queue": q, "transactionId": "rep", "payload": 1}])
    b = push(broker.client, [{"queue": q, "transactionId": "rep", "payload": 2}])
    c = push(broker.client, [{"queue": q, "transactionId": "warm", "payload": 3}])
    assert [x[0]["status"] for x in (a, b, c)] == ["queued"] * 3
    assert [x[0]["offset"] for x in (a, b, c)] == [2, 3, 4]
    assert a[0]["messageId"] != b[0]["messageId"]
    # layer 1 (inside one body) does not depend on the window
    d = push(broker.client, [{"queue": q, "transactionId": "rep", "payload": 5},
                             {"queue": q, "transactionId": "rep", "payload": 6}])
    assert [(r["status"], r["offset"]) for r in d] == [("queued", 5), ("duplicate", 5)]
    assert d[1]["messageId"] == d[0]["messageId"]
    msgs = stored_messages(db, q)
    assert [m.payload for m in msgs] == [b"0", b"1", b"2", b"3", b"5"]
    # the sidecar is written anyway (ack by transactionId resolves through it)
    pid, _ = partition_state(db, q, "Default")
    hashes = b"".join(bytes(h) for (h,) in db.execute(
        "SELECT hashes FROM queen.log_txns WHERE partition_id = %s ORDER BY base_offset",
        (pid,)).fetchall())
    assert hashes == b"".join(xxhash.xxh3_128_digest(t.encode())
                              for t in ("warm", "rep", "rep", "warm", "rep"))


def test_concurrent_identical_pushes_store_one_copy(broker, db):
    """Layer 2 and the SQL probe under a race: N clients push one transactionId at once."""
    q = uq("dd")
    n = 24
    start = threading.Barrier(n)

    def one(i: int) -> dict:
        with httpx.Client(base_url=broker.url, timeout=60) as http:
            start.wait()
            r = http.post(PUSH, json={"items": [
                {"queue": q, "partition": "race", "transactionId": "only-once", "payload": i},
                {"queue": q, "partition": "race", "transactionId": f"own-{i}", "payload": i}]})
            assert r.status_code == 201, r.text
            return r.json()

    with cf.ThreadPoolExecutor(n) as ex:
        answers = list(ex.map(one, range(n)))
    shared = [a[0] for a in answers]
    assert sorted(r["status"] for r in shared) == ["duplicate"] * (n - 1) + ["queued"]
    [winner] = [r for r in shared if r["status"] == "queued"]
    assert all(r["messageId"] == winner["messageId"] for r in shared)
    assert all(r["offset"] == winner["offset"] for r in shared)
    own = [a[1] for a in answers]
    assert all(r["status"] == "queued" for r in own)
    msgs = stored_messages(db, q)
    assert len(msgs) == n + 1
    assert sorted(m.offset for m in msgs) == list(range(1, n + 2))
    [stored] = [m for m in msgs if m.transaction_id == "only-once"]
    assert stored.message_id == winner["messageId"] and stored.offset == winner["offset"]
    assert queue_footprint(db, q)[:2] == (1, 1)


def test_overlapping_concurrent_pushes_store_each_transaction_id_once(broker, db):
    """Stress of the duplicate path (SQL writes nothing for a segment with a duplicate, the
    remainder is resubmitted): many clients push overlapping transactionIds at once."""
    q = uq("dd")
    clients, requests = 16, 15
    start = threading.Barrier(clients)

    def run(c: int) -> list[tuple[dict, dict]]:
        rnd = random.Random(c)
        out = []
        with httpx.Client(base_url=broker.url, timeout=60) as http:
            start.wait()
            for _ in range(requests):
                items = [{"queue": q, "partition": f"p{rnd.randrange(3)}",
                          "transactionId": f"t{rnd.randrange(120)}", "payload": c}
                         for _ in range(rnd.randint(1, 6))]
                r = http.post(PUSH, json={"items": items})
                assert r.status_code == 201, r.text
                out.extend(zip(items, r.json(), strict=True))
        return out

    with cf.ThreadPoolExecutor(clients) as ex:
        pairs = [p for part in ex.map(run, range(clients)) for p in part]
    answers: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for item, res in pairs:
        assert res["status"] in ("queued", "duplicate"), res
        answers[(item["partition"], item["transactionId"])].append(res)
    stored = {(m.partition, m.transaction_id): m for m in stored_messages(db, q)}
    assert len(stored) == len(stored_messages(db, q)), "a transactionId stored twice"
    assert set(stored) == set(answers)
    for key, group in answers.items():
        assert sum(r["status"] == "queued" for r in group) == 1, (key, group)
        m = stored[key]
        for r in group:
            assert (r["messageId"], r["offset"]) == (m.message_id, m.offset), (key, r)
    for part in ("p0", "p1", "p2"):
        offs = sorted(m.offset for k, m in stored.items() if k[0] == part)
        assert offs == list(range(1, len(offs) + 1))
    print(f"\n{len(pairs)} items, {len(stored)} stored, "
          f"{sum(r['status'] == 'duplicate' for _, r in pairs)} duplicates")


def _counter(broker, name: str, label: str = "") -> float:
    for line in broker.client.get("/metrics/prometheus").text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rpartition(" ")[2])
    return 0.0


def _read_backs(broker) -> float:
    return _counter(broker, "queen_dedup_read_backs_total", 'result="ok"')


def _sql_probes(broker) -> float:
    return _counter(broker, "queen_dedup_sql_probes_total ")


def test_rows_of_another_writer_are_read_back_and_still_found(broker, db):
    # The shard's filter promises the SQL probe what a partition holds; rows it did not write
    # (a transaction, a timer, another instance) are read back once, and that read-back must
    # cover every one of them, or a repeat of theirs would be stored again.
    q = uq("dd")
    push(broker.client, [{"queue": q, "transactionId": f"t{i}", "payload": i} for i in range(40)])
    # what the shard wrote itself it vouches for: no probe reads stored hashes in SQL
    probes = _sql_probes(broker)
    assert push(broker.client, [{"queue": q, "transactionId": "t40"}])[0]["offset"] == 41
    assert _sql_probes(broker) == probes
    r = broker.client.post("/api/v1/transaction", json={"operations": [  # another writer
        {"type": "push", "items": [{"queue": q, "transactionId": t, "payload": t}
                                   for t in ("x1", "x2")]}]})
    assert r.status_code == 200 and r.json()["success"] is True
    assert partition_state(db, q, "Default")[1] == 43
    before = _read_backs(broker)
    # the other writer's rows it does not know yet: this push's probe reads them in SQL
    assert push(broker.client, [{"queue": q, "transactionId": "t41"}])[0]["offset"] == 44
    assert _sql_probes(broker) == probes + 1
    deadline = time.monotonic() + 10
    while _read_backs(broker) <= before:
        assert time.monotonic() < deadline, "no read-back after the gap"
        time.sleep(0.05)
    again = push(broker.client, [{"queue": q, "transactionId": t, "payload": t}
                                 for t in ("t5", "x2", "t41", "new")])
    assert [(r["status"], r["offset"]) for r in again] == [
        ("duplicate", 6), ("duplicate", 43), ("duplicate", 44), ("queued", 45)]
    assert partition_state(db, q, "Default")[1] == 45


def _spill_round(b, q: str) -> list[list[dict]]:
    """Four partitions, three pushes of 600 each: 7,200 hashes against a bound of 2,000."""
    out: list[list[dict]] = [[] for _ in range(4)]
    for r in range(3):
        for p in range(4):
            out[p] += push(b.client, [{"queue": q, "partition": f"p{p}",
                                       "transactionId": f"{p}-{r}-{j}", "payload": j}
                                      for j in range(600)])
    return out


def test_past_the_filter_bound_big_runs_spill_to_disk_and_pushes_stay_vouched_for(
        make_broker, db_dsn):
    # Past QUEEN_DEDUP_FILTER_ENTRIES the shard moves big runs to its spill file: the
    # partitions stay known, so neither fresh pushes nor repeats read stored hashes in SQL,
    # and a repeat of a hash that lies on disk is still found. Without the file the same
    # load forgets partitions, and their pushes probe in SQL.
    b = make_broker(db_dsn, QUEEN_V2_FUSION_SHARDS="1", QUEEN_DEDUP_FILTER_ENTRIES="2000")
    q = uq("sp")
    first = _spill_round(b, q)
    deadline = time.monotonic() + 30  # the gauges follow every 10 s
    while _counter(b, "queen_dedup_filter_entries ") != 7_200:
        assert time.monotonic() < deadline, "the filter's gauge never showed 7,200 entries"
        time.sleep(0.2)
    assert _counter(b, "queen_dedup_filter_spilled_entries ") >= 5_200
    spill_dir = b.data_dir / "dedup"
    assert spill_dir.is_dir() and list(spill_dir.iterdir()) == []  # the file is unlinked
    probes = _sql_probes(b)
    for p in range(4):
        again = push(b.client, [{"queue": q, "partition": f"p{p}", "transactionId": t}
                                for t in (f"{p}-0-5", f"{p}-2-599", f"fresh-{p}")])
        assert [(r["status"], r["offset"]) for r in again] == [
            ("duplicate", 6), ("duplicate", 1_800), ("queued", 1_801)]
        assert again[0]["messageId"] == first[p][5]["messageId"]
        fresh = push(b.client, [{"queue": q, "partition": f"p{p}", "transactionId": f"n{p}-{j}"}
                                for j in range(100)])
        assert {r["status"] for r in fresh} == {"queued"}
    assert _sql_probes(b) == probes  # every push vouched for: none read the window in SQL

    off = make_broker(db_dsn, QUEEN_V2_FUSION_SHARDS="1", QUEEN_DEDUP_FILTER_ENTRIES="2000",
                      QUEEN_DEDUP_SPILL_BYTES="0")
    q = uq("sp")
    _spill_round(off, q)
    probes = _sql_probes(off)
    for p in range(4):
        push(off.client, [{"queue": q, "partition": f"p{p}", "transactionId": f"fresh-{p}"}])
    assert _sql_probes(off) > probes  # the partitions forgotten probe in SQL
