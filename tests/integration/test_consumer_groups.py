"""Consumer groups (api.md 2.10, 1.2, 1.4): listings, delete, subscription and seek, against
the real broker process.

There is no pop route to build cursors with, so state is made the way the broker stores it:
messages are pushed over HTTP (one request per segment), then cursor rows (log_consumers) and
subscription records (consumer_groups_meta) are written with SQL on the broker's own database
(the ``db`` fixture and the ``broker`` fixture share the session database ``db_dsn``). Segment
times are set explicitly so that every expected offset and lag is exact.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid

import httpx
import psycopg
import pytest

PUSH = "/api/v1/push"
CG = "/api/v1/consumer-groups"
ISO_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
LAGGING_ALIASES = {
    "consumer_group": "consumerGroup", "queue_name": "queueName",
    "partition_name": "partitionName", "partition_id": "partitionId", "worker_id": "workerId",
    "offset_lag": "offsetLag", "time_lag_seconds": "timeLagSeconds",
    "oldest_unconsumed_at": "oldestUnconsumedAt", "last_consumed_at": "lastConsumedAt",
}
CURSOR_KEYS = {"partition", "partitionId", "committedOffset", "lastOffset", "offsetLag",
               "timeLagSeconds", "leaseActive", "workerId", "lastConsumedAt", "totalConsumed"}
SUMMARY_KEYS = {"name", "queueName", "topics", "members", "partitions", "partitionsWithLag",
                "totalLag", "maxTimeLag", "state", "subscriptionMode", "subscriptionTimestamp",
                "subscriptionCreatedAt"}


# ---------------------------------------------------------------------------------- helpers
def uq(prefix: str) -> str:
    """A queue or group name no other test (nor an earlier run on the broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def iso(t: dt.datetime) -> str:
    t = t.astimezone(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def push_segments(client: httpx.Client, queue: str, partition: str, n: int) -> None:
    """n sequential one-item pushes: n segments at offsets 1..n (each answered before the next
    is sent, so no two can share a bundle)."""
    for i in range(n):
        r = client.post(PUSH, json={"items": [{"queue": queue, "partition": partition,
                                               "payload": {"i": i}}]})
        assert r.status_code == 201, r.text
        assert r.json()[0]["status"] == "queued", r.text


def pid_of(db: psycopg.Connection, queue: str, partition: str) -> int:
    row = db.execute("SELECT lp.id FROM queen.log_partitions lp "
                     "JOIN queen.queues q ON q.id = lp.queue_id "
                     "WHERE q.name = %s AND lp.name = %s", (queue, partition)).fetchone()
    assert row is not None, (queue, partition)
    return row[0]


def qid_of(db: psycopg.Connection, queue: str) -> int:
    row = db.execute("SELECT id FROM queen.queues WHERE name = %s", (queue,)).fetchone()
    assert row is not None, queue
    return row[0]


def time_segments(db: psycopg.Connection, pid: int, base: dt.datetime,
                  step: dt.timedelta) -> dict[int, dt.datetime]:
    """Segment k (base_offset k) created at base + k*step; returns {base_offset: created_at}.
    Monotone in offset order, as the push path guarantees."""
    db.execute("UPDATE queen.log_segments SET created_at = %s + base_offset * %s "
               "WHERE partition_id = %s", (base, step, pid))
    rows = db.execute("SELECT base_offset, msg_count, created_at FROM queen.log_segments "
                      "WHERE partition_id = %s ORDER BY base_offset", (pid,)).fetchall()
    assert all(count == 1 for _, count, _ in rows), rows
    return {b: t for b, _, t in rows}


def set_cursor(db: psycopg.Connection, pid: int, group: str, committed: int,
               **cols: object) -> None:
    """The cursor row with its queue and ready flag, as the broker's writers set them (pop.sql's
    log_ready_at_v1; no trigger does): the session database's other modules check the ready
    index over every cursor (test_ready_index's UNLISTED_SQL)."""
    names = ["partition_id", "consumer_group", "committed_offset", *cols]
    values = [pid, group, committed, *cols.values()]
    sets = ", ".join(f"{n} = EXCLUDED.{n}" for n in names[2:])
    db.execute(f"INSERT INTO queen.log_consumers ({', '.join(names)}) "
               f"VALUES ({', '.join(['%s'] * len(names))}) "
               f"ON CONFLICT (partition_id, consumer_group) DO UPDATE SET {sets}", values)
    db.execute("UPDATE queen.log_consumers c SET queue_id = lp.queue_id,"
               " ready_at = queen.log_ready_at_v1(c.partition_id, c.committed_offset, NULL, NULL)"
               " FROM queen.log_partitions lp"
               " WHERE lp.id = c.partition_id AND c.partition_id = %s AND c.consumer_group = %s",
               (pid, group))


def set_meta(db: psycopg.Connection, queue: str, group: str, mode: str = "all",
             start: dt.datetime | None = None) -> None:
    db.execute("INSERT INTO queen.consumer_groups_meta (queue_id, consumer_group, "
               "subscription_mode, subscription_from) VALUES (%s, %s, %s, %s)",
               (qid_of(db, queue), group, mode, start))


def cursor(db: psycopg.Connection, pid: int, group: str) -> dict | None:
    cur = db.execute("SELECT * FROM queen.log_consumers WHERE partition_id = %s "
                     "AND consumer_group = %s", (pid, group))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([d.name for d in cur.description], row, strict=True))


def meta(db: psycopg.Connection, queue: str, group: str) -> tuple | None:
    return db.execute("SELECT subscription_mode, subscription_from FROM "
                      "queen.consumer_groups_meta m JOIN queen.queues q ON q.id = m.queue_id "
                      "WHERE q.name = %s AND m.consumer_group = %s", (queue, group)).fetchone()


def group_rows(db: psycopg.Connection, group: str) -> tuple[int, int]:
    """(cursor rows, subscription records) of a group anywhere."""
    row = db.execute("SELECT (SELECT count(*) FROM queen.log_consumers "
                     "        WHERE consumer_group = %(g)s), "
                     "       (SELECT count(*) FROM queen.consumer_groups_meta "
                     "        WHERE consumer_group = %(g)s)", {"g": group}).fetchone()
    assert row is not None
    return row[0], row[1]


def assert_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"], body
    return body


def db_now(db: psycopg.Connection) -> dt.datetime:
    row = db.execute("SELECT date_trunc('second', now())").fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def lagged(broker, db):
    """Queue with partitions A (5 segments) and B (3 segments), one segment per hour from 10 h
    ago; group cursors A at 2 (lag 3, live lease) and B at 3 (no lag)."""
    queue, group = uq("cgq"), uq("cgg")
    push_segments(broker.client, queue, "A", 5)
    push_segments(broker.client, queue, "B", 3)
    pa, pb = pid_of(db, queue, "A"), pid_of(db, queue, "B")
    base = db_now(db) - dt.timedelta(hours=10)
    times_a = time_segments(db, pa, base, dt.timedelta(hours=1))
    time_segments(db, pb, base, dt.timedelta(hours=1))
    lease = uuid.uuid4()
    consumed = db_now(db) - dt.timedelta(minutes=5)
    set_cursor(db, pa, group, 2, lease_id=lease, worker_id="worker-7",
               lease_expires_at=db_now(db) + dt.timedelta(minutes=5), total_consumed=2,
               last_consumed_at=consumed, last_popped_at=consumed)
    set_cursor(db, pb, group, 3, total_consumed=3, last_consumed_at=consumed)
    start = base - dt.timedelta(days=1)
    set_meta(db, queue, group, "timestamp", start)
    return {"queue": queue, "group": group, "pa": pa, "pb": pb, "times_a": times_a,
            "consumed": consumed, "start": start}


# ---------------------------------------------------------------------------------- listings
def test_one_group_by_queue_with_exact_lag(broker, db, lagged):
    r = broker.client.get(f"{CG}/{lagged['group']}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {lagged["queue"]}
    parts = {p["partition"]: p for p in body[lagged["queue"]]["partitions"]}
    assert set(parts) == {"A", "B"}
    a, b = parts["A"], parts["B"]
    assert set(a) >= CURSOR_KEYS
    assert a["partitionId"] == str(lagged["pa"]) and b["partitionId"] == str(lagged["pb"])
    assert (a["committedOffset"], a["lastOffset"], a["offsetLag"]) == (2, 5, 3)
    assert (b["committedOffset"], b["lastOffset"], b["offsetLag"]) == (3, 3, 0)
    # the message at committed + 1 = 3 is 7 h old (segment 3 of 10 h ago + 1 h steps)
    oldest = lagged["times_a"][3]
    assert a["oldestUnconsumedAt"] == iso(oldest)
    assert 7 * 3600 <= a["timeLagSeconds"] < 7 * 3600 + 60
    assert b["timeLagSeconds"] == 0 and b["oldestUnconsumedAt"] is None
    assert a["leaseActive"] is True and a["workerId"] == "worker-7"
    assert b["leaseActive"] is False and b["workerId"] is None
    assert a["totalConsumed"] == 2 and b["totalConsumed"] == 3
    assert a["lastConsumedAt"] == iso(lagged["consumed"])
    assert ISO_MS_Z.match(a["lastConsumedAt"])


def test_list_has_one_row_per_group_and_queue(broker, db, lagged):
    r = broker.client.get(CG)
    assert r.status_code == 200, r.text
    rows = [x for x in r.json() if x["name"] == lagged["group"]]
    assert len(rows) == 1, rows
    row = rows[0]
    assert set(row) >= SUMMARY_KEYS
    assert row["queueName"] == lagged["queue"] and row["topics"] == [lagged["queue"]]
    assert row["members"] == 1
    assert (row["partitions"], row["partitionsWithLag"], row["totalLag"]) == (2, 1, 3)
    assert 7 * 3600 <= row["maxTimeLag"] < 7 * 3600 + 60
    assert row["state"] == "Lagging"  # lag over 60 s, consumed 5 min ago
    assert row["subscriptionMode"] == "timestamp"
    assert row["subscriptionTimestamp"] == iso(lagged["start"])
    assert ISO_MS_Z.match(row["subscriptionCreatedAt"])


def test_list_states_stable_and_dead(broker, db, lagged):
    stable, dead = uq("cgstable"), uq("cgdead")
    set_cursor(db, lagged["pa"], stable, 5)  # no lag
    long_ago = db_now(db) - dt.timedelta(hours=30)
    set_cursor(db, lagged["pa"], dead, 0, last_popped_at=long_ago, last_consumed_at=long_ago,
               created_at=long_ago)
    rows = {x["name"]: x for x in broker.client.get(CG).json()
            if x["name"] in (stable, dead)}
    assert rows[stable]["state"] == "Stable" and rows[stable]["totalLag"] == 0
    assert rows[stable]["maxTimeLag"] == 0 and rows[stable]["partitionsWithLag"] == 0
    assert rows[stable]["subscriptionMode"] is None  # no subscription record
    assert rows[dead]["state"] == "Dead" and rows[dead]["totalLag"] == 5
    assert rows[dead]["members"] == 0


def test_list_includes_a_subscription_record_without_cursors(broker, db, lagged):
    group = uq("cgmeta")
    set_meta(db, lagged["queue"], group, "new")
    rows = [x for x in broker.client.get(CG).json() if x["name"] == group]
    assert len(rows) == 1
    assert rows[0]["partitions"] == 0 and rows[0]["totalLag"] == 0
    assert rows[0]["subscriptionMode"] == "new" and rows[0]["state"] == "Stable"
    # ... but the group has no cursor, so its detail is 404
    assert_error(broker.client.get(f"{CG}/{group}"), 404, "not_found")


def test_lagging_rows_carry_camel_and_snake_keys(broker, db, lagged):
    r = broker.client.get(f"{CG}/lagging", params={"minLagSeconds": 3600})
    assert r.status_code == 200, r.text
    rows = [x for x in r.json() if x["consumerGroup"] == lagged["group"]]
    assert len(rows) == 1, rows  # B has no lag
    row = rows[0]
    for snake, camel in LAGGING_ALIASES.items():
        assert snake in row and camel in row, (snake, camel, row)
        assert row[snake] == row[camel], (snake, row)
    assert row["queueName"] == lagged["queue"] and row["partitionName"] == "A"
    assert row["partitionId"] == str(lagged["pa"]) and row["workerId"] == "worker-7"
    assert row["offsetLag"] == 3
    assert 7 * 3600 <= row["timeLagSeconds"] < 7 * 3600 + 60
    assert row["oldestUnconsumedAt"] == iso(lagged["times_a"][3])
    assert row["lastConsumedAt"] == iso(lagged["consumed"])


def test_lagging_threshold_and_default(broker, db, lagged):
    def groups(params: dict | None = None) -> set[str]:
        r = broker.client.get(f"{CG}/lagging", params=params)
        assert r.status_code == 200, r.text
        return {x["consumerGroup"] for x in r.json()}

    assert lagged["group"] in groups({"minLagSeconds": 7 * 3600 - 60})
    assert lagged["group"] not in groups({"minLagSeconds": 7 * 3600 + 120})
    assert lagged["group"] in groups()  # default 3600
    assert lagged["group"] in groups({"minLagSeconds": 0})
    for bad in ("abc", "-1", "1.5", ""):
        assert_error(broker.client.get(f"{CG}/lagging", params={"minLagSeconds": bad}),
                     400, "invalid_request")


def test_lagging_is_not_a_group_named_lagging(broker, db, lagged):
    set_cursor(db, lagged["pa"], "lagging", 0)
    try:
        r = broker.client.get(f"{CG}/lagging", params={"minLagSeconds": 0})
        assert r.status_code == 200 and isinstance(r.json(), list), r.text
        # a group named 'lagging' can still be deleted
        r = broker.client.delete(f"{CG}/lagging")
        assert r.status_code == 200, r.text
        assert r.json()["consumerGroup"] == "lagging"
        assert r.json()["deletedPartitions"] >= 1
    finally:
        db.execute("DELETE FROM queen.log_consumers WHERE consumer_group = 'lagging'")


def test_unknown_group_is_404(broker):
    body = assert_error(broker.client.get(f"{CG}/{uq('nogroup')}"), 404, "not_found")
    assert "group" in body["error"]


# ---------------------------------------------------------------------------------- delete
@pytest.fixture
def two_queues(broker, db):
    """A group with cursors and subscription records on two queues (two partitions each), and
    a bystander group on the first queue."""
    group, other = uq("cgdel"), uq("cgother")
    queues = [uq("cgdq"), uq("cgdq")]
    pids = []
    for q in queues:
        for part in ("p1", "p2"):
            push_segments(broker.client, q, part, 1)
            pid = pid_of(db, q, part)
            pids.append(pid)
            set_cursor(db, pid, group, 0, lease_id=uuid.uuid4(), worker_id="w",
                       lease_expires_at=db_now(db) + dt.timedelta(minutes=1))
        set_meta(db, q, group)
    set_cursor(db, pids[0], other, 1)
    set_meta(db, queues[0], other)
    return {"group": group, "other": other, "queues": queues, "pids": pids}


def test_delete_group_everywhere(broker, db, two_queues):
    g = two_queues["group"]
    r = broker.client.delete(f"{CG}/{g}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["consumerGroup"] == g
    assert body["deletedPartitions"] == 4 and body["metadataDeleted"] is True
    assert "queueName" not in body
    assert group_rows(db, g) == (0, 0)
    assert group_rows(db, two_queues["other"]) == (1, 1)  # untouched
    assert_error(broker.client.get(f"{CG}/{g}"), 404, "not_found")


def test_delete_group_on_one_queue_keeping_metadata(broker, db, two_queues):
    g, (q1, q2) = two_queues["group"], two_queues["queues"]
    r = broker.client.delete(f"{CG}/{g}/queues/{q1}", params={"deleteMetadata": "false"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body == {**body, "success": True, "consumerGroup": g, "queueName": q1,
                    "deletedPartitions": 2, "metadataDeleted": False}
    assert meta(db, q1, g) is not None and meta(db, q2, g) is not None
    assert group_rows(db, g) == (2, 2)
    left = broker.client.get(f"{CG}/{g}").json()
    assert set(left) == {q2}
    # then the same queue with the default deleteMetadata=true: the record goes too
    r = broker.client.delete(f"{CG}/{g}/queues/{q1}")
    assert r.status_code == 200 and r.json()["deletedPartitions"] == 0, r.text
    assert r.json()["metadataDeleted"] is True
    assert meta(db, q1, g) is None and meta(db, q2, g) is not None
    assert group_rows(db, two_queues["other"]) == (1, 1)


def test_delete_keeps_metadata_everywhere_with_0(broker, db, two_queues):
    g = two_queues["group"]
    r = broker.client.delete(f"{CG}/{g}", params={"deleteMetadata": "0"})
    assert r.status_code == 200 and r.json()["deletedPartitions"] == 4, r.text
    assert group_rows(db, g) == (0, 2)


def test_delete_unknown_group_or_queue_is_200(broker, db, two_queues):
    r = broker.client.delete(f"{CG}/{uq('nogroup')}")
    assert r.status_code == 200, r.text
    assert r.json()["success"] is True and r.json()["deletedPartitions"] == 0
    r = broker.client.delete(f"{CG}/{two_queues['group']}/queues/{uq('noqueue')}")
    assert r.status_code == 200 and r.json()["deletedPartitions"] == 0, r.text
    assert group_rows(db, two_queues["group"]) == (4, 2)


def test_delete_rejects_bad_booleans(broker, db, two_queues):
    for bad in ("yes", "2", ""):
        assert_error(broker.client.delete(f"{CG}/{two_queues['group']}",
                                          params={"deleteMetadata": bad}),
                     400, "invalid_request")
    assert group_rows(db, two_queues["group"]) == (4, 2)
    # a repeated key keeps its first value (api.md 1.1)
    r = broker.client.delete(f"{CG}/{two_queues['group']}?deleteMetadata=false"
                             "&deleteMetadata=true")
    assert r.status_code == 200 and r.json()["metadataDeleted"] is False, r.text
    assert group_rows(db, two_queues["group"]) == (0, 2)


# ---------------------------------------------------------------------------------- subscription
@pytest.fixture
def subscribed(broker, db):
    """Queue with partitions P1..P4, 6 segments each, one a minute from 1 h ago; the group has
    a subscription record and cursors: P1 untouched (0), P2 consumed (total 2), P3 untouched
    under a live lease, P4 untouched with an expired lease. Segment k of every partition is at
    base + k minutes."""
    queue, group = uq("cgsq"), uq("cgsg")
    pids = {}
    for part in ("P1", "P2", "P3", "P4"):
        push_segments(broker.client, queue, part, 6)
        pids[part] = pid_of(db, queue, part)
    base = db_now(db) - dt.timedelta(hours=1)
    for pid in pids.values():
        time_segments(db, pid, base, dt.timedelta(minutes=1))
    now = db_now(db)
    set_cursor(db, pids["P1"], group, 0)
    set_cursor(db, pids["P2"], group, 2, total_consumed=2)
    live = uuid.uuid4()
    set_cursor(db, pids["P3"], group, 0, lease_id=live, worker_id="w3",
               lease_expires_at=now + dt.timedelta(minutes=5))
    expired = uuid.uuid4()
    set_cursor(db, pids["P4"], group, 0, lease_id=expired, worker_id="w4",
               lease_expires_at=now - dt.timedelta(minutes=5), attempt_count=2,
               batch_retry_count=1)
    set_meta(db, queue, group, "all")
    return {"queue": queue, "group": group, "pids": pids, "base": base, "live": live,
            "expired": expired}


def test_subscription_moves_only_unconsumed_partitions(broker, db, subscribed):
    g, q, pids = subscribed["group"], subscribed["queue"], subscribed["pids"]
    ts = subscribed["base"] + dt.timedelta(minutes=3, seconds=30)  # first at/after: segment 4
    r = broker.client.post(f"{CG}/{g}/subscription",
                           json={"subscriptionTimestamp": iso(ts), "queue": q})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["consumerGroup"] == g
    assert body["newTimestamp"] == iso(ts)
    # 1 subscription record + P1 + P4 (P2 consumed, P3 under a live lease)
    assert body["rowsUpdated"] == 3
    assert body["metadataUpdated"] == 1 and body["partitionsUpdated"] == 2
    assert cursor(db, pids["P1"], g)["committed_offset"] == 3
    assert cursor(db, pids["P2"], g)["committed_offset"] == 2
    p3 = cursor(db, pids["P3"], g)
    assert p3["committed_offset"] == 0 and p3["lease_id"] == subscribed["live"]
    p4 = cursor(db, pids["P4"], g)
    assert p4["committed_offset"] == 3
    assert p4["lease_id"] is None and p4["released_lease_id"] == subscribed["expired"]
    assert (p4["attempt_count"], p4["batch_retry_count"]) == (0, 0)
    assert meta(db, q, g) == ("timestamp", ts)


def test_subscription_without_queue_covers_every_recorded_queue(broker, db, subscribed):
    g = subscribed["group"]
    other = uq("cgsq")
    push_segments(broker.client, other, "X", 2)
    px = pid_of(db, other, "X")
    set_cursor(db, px, g, 0)
    set_meta(db, other, g, "new")
    unrecorded = uq("cgsq")  # a cursor on a queue without a subscription record
    push_segments(broker.client, unrecorded, "Y", 2)
    py = pid_of(db, unrecorded, "Y")
    set_cursor(db, py, g, 0)
    ts = db_now(db) + dt.timedelta(hours=1)  # after everything: cursors go to the end
    r = broker.client.post(f"{CG}/{g}/subscription", content=(
        b'{"subscriptionTimestamp": "%s"}' % iso(ts).encode()))
    assert r.status_code == 200, r.text
    assert r.json()["rowsUpdated"] == 2 + 3  # two records; P1, P4 and X
    assert cursor(db, subscribed["pids"]["P1"], g)["committed_offset"] == 6
    assert cursor(db, px, g)["committed_offset"] == 2
    assert cursor(db, py, g)["committed_offset"] == 0
    assert meta(db, other, g) == ("timestamp", ts)
    assert meta(db, unrecorded, g) is None


def test_subscription_on_a_queue_without_record_creates_it(broker, db):
    g, q = uq("cgsg"), uq("cgsq")
    push_segments(broker.client, q, "Default", 1)
    ts = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    r = broker.client.post(f"{CG}/{g}/subscription",
                           json={"subscriptionTimestamp": "2026-01-02T04:04:05.678+01:00",
                                 "queue": q})
    assert r.status_code == 200, r.text
    assert r.json()["newTimestamp"] == "2026-01-02T03:04:05.678Z"
    assert r.json()["rowsUpdated"] == 1
    assert meta(db, q, g) == ("timestamp", ts)


def test_subscription_validation(broker, db, subscribed):
    url = f"{CG}/{subscribed['group']}/subscription"
    for body in ({}, {"queue": subscribed["queue"]}, {"subscriptionTimestamp": None},
                 {"subscriptionTimestamp": "yesterday"}, {"subscriptionTimestamp": 12345},
                 {"subscriptionTimestamp": "2026-01-02T03:04:05"},  # no zone
                 {"subscriptionTimestamp": "2026-01-02T03:04:05Z", "queue": 7}):
        assert_error(broker.client.post(url, json=body), 400, "invalid_request")
    assert_error(broker.client.post(url), 400, "invalid_request")
    assert_error(broker.client.post(url, content=b"{nope"), 400, "invalid_request")
    assert_error(broker.client.post(url, json={"subscriptionTimestamp": "2026-01-02T03:04:05Z",
                                               "queue": "a/b"}), 400, "invalid_name")
    r = broker.client.post(url, json={"subscriptionTimestamp": "2026-01-02T03:04:05Z",
                                      "queue": uq("noqueue")})
    assert_error(r, 404, "not_found")
    assert meta(db, subscribed["queue"], subscribed["group"]) == ("all", None)


# ---------------------------------------------------------------------------------- seek
@pytest.fixture
def seekable(broker, db):
    """Queue with partition A (8 segments; retention moved its log start to 3, segments 1-2
    are gone) and B (4 segments). A's segment k is at base + k min, B's at base + k min + 30 s
    (base = 1 h ago). The group has a cursor on A at 5 under a live lease with retry state,
    and none on B (a seek creates it)."""
    queue, group = uq("cgkq"), uq("cgkg")
    push_segments(broker.client, queue, "A", 8)
    push_segments(broker.client, queue, "B", 4)
    pa, pb = pid_of(db, queue, "A"), pid_of(db, queue, "B")
    base = db_now(db) - dt.timedelta(hours=1)
    time_segments(db, pa, base, dt.timedelta(minutes=1))
    time_segments(db, pb, base + dt.timedelta(seconds=30), dt.timedelta(minutes=1))
    db.execute("DELETE FROM queen.log_segments WHERE partition_id = %s AND base_offset < 3",
               (pa,))
    db.execute("UPDATE queen.log_partitions SET log_start_offset = 3 WHERE id = %s", (pa,))
    lease = uuid.uuid4()
    set_cursor(db, pa, group, 5, lease_id=lease, worker_id="wa", total_consumed=5,
               lease_expires_at=db_now(db) + dt.timedelta(minutes=5), attempt_count=3,
               batch_retry_count=2, batch_start=6, batch_end=8)
    return {"queue": queue, "group": group, "pa": pa, "pb": pb, "base": base, "lease": lease}


def seek(broker, k: dict, body: dict | None) -> httpx.Response:
    return broker.client.post(f"{CG}/{k['group']}/queues/{k['queue']}/seek", json=body)


def offsets(db: psycopg.Connection, k: dict) -> tuple[int | None, int | None]:
    a, b = cursor(db, k["pa"], k["group"]), cursor(db, k["pb"], k["group"])
    return (a and a["committed_offset"], b and b["committed_offset"])


def test_seek_to_end_releases_leases_and_creates_cursors(broker, db, seekable):
    r = seek(broker, seekable, {"toEnd": True})
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True, "consumerGroup": seekable["group"],
                        "queueName": seekable["queue"], "target": "end",
                        "targetTimestamp": None, "partitionsUpdated": 2}
    assert offsets(db, seekable) == (8, 4)
    a = cursor(db, seekable["pa"], seekable["group"])
    assert a["lease_id"] is None and a["worker_id"] is None and a["lease_expires_at"] is None
    assert a["released_lease_id"] == seekable["lease"]
    assert (a["attempt_count"], a["batch_retry_count"]) == (0, 0)
    assert a["total_consumed"] == 5  # history is kept


def test_seek_to_beginning_moves_back_to_the_log_start(broker, db, seekable):
    assert seek(broker, seekable, {"toEnd": True}).status_code == 200
    r = seek(broker, seekable, {"toBeginning": True, "toEnd": False, "timestamp": None})
    assert r.status_code == 200, r.text
    assert r.json()["target"] == "beginning" and r.json()["partitionsUpdated"] == 2
    assert offsets(db, seekable) == (2, 0)  # A's log starts at 3, B's at 1
    # the listing agrees: everything retained is pending again
    detail = broker.client.get(f"{CG}/{seekable['group']}").json()[seekable["queue"]]
    lags = {p["partition"]: p["offsetLag"] for p in detail["partitions"]}
    assert lags == {"A": 6, "B": 4}


@pytest.mark.parametrize(("offset_s", "want"), [
    (-3600, (2, 0)),        # before everything: the log start
    (2 * 60 + 10, (2, 1)),  # A: segment 3 (1-2 retained away) -> 2; B: segment 2 -> 1
    (5 * 60, (4, 4)),       # A: exactly segment 5's time -> 4; B: seg 5 absent -> last (4)
    (5 * 60 + 1, (5, 4)),   # A: segment 6 -> 5
    (3 * 3600, (8, 4)),     # after everything: the last offset
])
def test_seek_to_timestamp_lands_on_exact_offsets(broker, db, seekable, offset_s, want):
    ts = seekable["base"] + dt.timedelta(seconds=offset_s)
    r = seek(broker, seekable, {"timestamp": iso(ts)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["target"] == "timestamp" and body["targetTimestamp"] == iso(ts)
    assert body["partitionsUpdated"] == 2
    assert offsets(db, seekable) == want
    assert cursor(db, seekable["pa"], seekable["group"])["lease_id"] is None


def test_seek_between_segments_of_b(broker, db, seekable):
    # B's segment k is at base + k min + 30 s, A's at base + k min.
    ts = seekable["base"] + dt.timedelta(minutes=2, seconds=40)  # A: seg 3, B: seg 3
    assert seek(broker, seekable, {"timestamp": iso(ts)}).status_code == 200
    assert offsets(db, seekable) == (2, 2)
    ts = seekable["base"] + dt.timedelta(minutes=3, seconds=20)  # A: seg 4, B: seg 3
    assert seek(broker, seekable, {"timestamp": iso(ts)}).status_code == 200
    assert offsets(db, seekable) == (3, 2)
    # a cursor moved forward by one seek moves back by the next
    ts = seekable["base"] + dt.timedelta(seconds=1)
    assert seek(broker, seekable, {"timestamp": iso(ts)}).status_code == 200
    assert offsets(db, seekable) == (2, 0)


def test_seek_validation(broker, db, seekable):
    url = f"{CG}/{seekable['group']}/queues/{seekable['queue']}/seek"
    before = cursor(db, seekable["pa"], seekable["group"])
    for body in ({}, {"toBeginning": False}, {"toBeginning": True, "toEnd": True},
                 {"toEnd": True, "timestamp": "2026-01-02T03:04:05Z"},
                 {"toBeginning": "yes"}, {"toEnd": 1}, {"timestamp": "not a time"},
                 {"timestamp": "2026-01-02T03:04:05"}, {"timestamp": 17}, [], "x"):
        assert_error(broker.client.post(url, json=body), 400, "invalid_request")
    # no body; the client's `{}` without a Content-Type; malformed JSON
    assert_error(broker.client.post(url), 400, "invalid_request")
    assert_error(broker.client.post(url, content=b"{}"), 400, "invalid_request")
    assert_error(broker.client.post(url, content=b'{"toEnd": tr'), 400, "invalid_request")
    assert cursor(db, seekable["pa"], seekable["group"]) == before
    assert cursor(db, seekable["pb"], seekable["group"]) is None


def test_seek_accepts_the_clients_body_without_content_type(broker, db, seekable):
    r = broker.client.post(f"{CG}/{seekable['group']}/queues/{seekable['queue']}/seek",
                           content=b'{"toEnd":true}')
    assert r.status_code == 200, r.text
    assert offsets(db, seekable) == (8, 4)


def test_seek_unknown_queue_is_404(broker, db):
    g = uq("cgkg")
    r = broker.client.post(f"{CG}/{g}/queues/{uq('noqueue')}/seek", json={"toBeginning": True})
    assert_error(r, 404, "not_found")
    assert group_rows(db, g) == (0, 0)


# ---------------------------------------------------------------------------------- names, routes
def test_invalid_group_and_queue_names(broker):
    long_group = "g" * 256
    ok_group = "é" * 127 + "x"  # 255 bytes
    cases = [
        ("GET", f"{CG}/bad%01group", None, 400, "invalid_name"),
        ("GET", f"{CG}/bad%7Fgroup", None, 400, "invalid_name"),
        ("GET", f"{CG}/{long_group}", None, 413, "name_too_long"),
        ("DELETE", f"{CG}/{long_group}", None, 413, "name_too_long"),
        ("DELETE", f"{CG}/x%00y/queues/q", None, 400, "invalid_name"),
        ("DELETE", f"{CG}/g/queues/{'q' * 300}", None, 413, "name_too_long"),
        ("POST", f"{CG}/bad%1Fgroup/subscription",
         {"subscriptionTimestamp": "2026-01-02T03:04:05Z"}, 400, "invalid_name"),
        ("POST", f"{CG}/{long_group}/queues/q/seek", {"toEnd": True}, 413, "name_too_long"),
        ("POST", f"{CG}/g/queues/bad%0Aqueue/seek", {"toEnd": True}, 400, "invalid_name"),
    ]
    for method, url, body, status, code in cases:
        r = broker.client.request(method, url, json=body)
        assert_error(r, status, code)
    r = broker.client.delete(f"{CG}/{ok_group}")
    assert r.status_code == 200 and r.json()["consumerGroup"] == ok_group, r.text


def test_wrong_method_is_405(broker):
    r = broker.client.put(f"{CG}/somegroup")
    assert_error(r, 405, "method_not_allowed")
    r = broker.client.get(f"{CG}/somegroup/queues/q/seek")
    assert_error(r, 405, "method_not_allowed")
