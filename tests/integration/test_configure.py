"""``POST /api/v1/configure`` (api.md 2.7, 4, 1.9) against the real broker process: create,
partial update, snake_case aliases, ignored keys, 400s with ``field``, the encryption key rule,
namespace/task overrides, the 2.6 client's ``config().create()`` and ``delete()``, and that the
next pop / nack flow / push uses what was configured.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from queen import Queen

from tests.integration.test_dlq import ack, dlq, pop
from tests.integration.test_dlq import push as push_payloads
from tests.integration.test_push_encryption import KEY, _stored_frames
from tests.integration.test_push_json import uq

CONFIGURE = "/api/v1/configure"
DEFAULTS = {
    "leaseTime": 300, "retryLimit": 3, "deadLetterQueue": True, "dlqAfterMaxRetries": True,
    "dedupWindow": 3600, "retentionSeconds": 0, "completedRetentionSeconds": 0,
    "encryptionEnabled": False, "delayedProcessing": 0, "windowBuffer": 0, "priority": 0,
    "maxSize": 0, "retryDelay": 1000, "ttl": 3600, "maxWaitTimeSeconds": 0,
    "retentionEnabled": False,
}
COLUMNS = {
    "leaseTime": "lease_time", "retryLimit": "retry_limit",
    "deadLetterQueue": "dead_letter_queue", "dlqAfterMaxRetries": "dlq_after_max_retries",
    "dedupWindow": "dedup_window", "retentionSeconds": "retention_seconds",
    "completedRetentionSeconds": "completed_retention_seconds",
    "encryptionEnabled": "encryption_enabled", "delayedProcessing": "delayed_processing",
    "windowBuffer": "window_buffer", "priority": "priority", "maxSize": "max_size",
    "retryDelay": "retry_delay", "ttl": "ttl", "maxWaitTimeSeconds": "max_wait_time_seconds",
    "retentionEnabled": "retention_enabled",
}
ANSWER_KEYS = {"configured", "created", "queue", "queueId", "namespace", "task", "options",
               "ignoredOptions"}


# ---------------------------------------------------------------------------------- helpers
def configure(client: httpx.Client, queue: str, options: dict | None = None,
              **extra: Any) -> dict:
    body: dict[str, Any] = {"queue": queue, **extra}
    if options is not None:
        body["options"] = options
    r = client.post(CONFIGURE, json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert set(answer) == ANSWER_KEYS, answer
    assert answer["configured"] is True
    assert set(answer["options"]) == set(DEFAULTS)
    return answer


def stored(db: psycopg.Connection, queue: str) -> dict[str, Any] | None:
    """The queue row as api.md 4 option names (plus id, namespace, task), or None."""
    cols = ", ".join(f"{c} AS \"{k}\"" for k, c in COLUMNS.items())
    cur = db.execute(f"SELECT id, namespace, task, {cols} FROM queen.queues WHERE name = %s",
                     (queue,))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([d.name for d in cur.description], row, strict=True))


def options_of(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in DEFAULTS}


def assert_400(r: httpx.Response, field: str | None, code: str = "invalid_request") -> dict:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == code, body
    if field is not None:
        assert body.get("field") == field, body
    return body


# ------------------------------------------------------------------------------- configure
def test_configure_creates_a_queue_with_defaults_plus_the_given_options(broker, db):
    q = f"{uq('cfg')}.billing.eu"
    answer = configure(broker.client, q, {"leaseTime": 30, "windowBuffer": 2})
    row = stored(db, q)
    assert row is not None
    assert answer["created"] is True
    assert answer["queue"] == q
    assert answer["queueId"] == str(row["id"])  # api.md 1.3: decimal string
    assert answer["namespace"] == q.split(".")[0] and answer["task"] == "billing"
    assert answer["ignoredOptions"] == []
    expected = {**DEFAULTS, "leaseTime": 30, "windowBuffer": 2}
    assert answer["options"] == expected
    assert options_of(row) == expected

    # the same call again: nothing created, nothing changed
    again = configure(broker.client, q, {"leaseTime": 30})
    assert again["created"] is False and again["queueId"] == answer["queueId"]
    assert again["options"] == expected


def test_configure_updates_only_the_options_present(broker, db):
    q = uq("cfg")
    push_payloads(broker.client, q, [{"n": 1}])  # the push created it with the defaults
    first = configure(broker.client, q, {"retryLimit": 7, "priority": -2, "maxSize": 0,
                                         "retryDelay": 250, "deadLetterQueue": False})
    assert first["created"] is False
    second = configure(broker.client, q, {"leaseTime": 45, "retentionEnabled": True})
    expected = {**DEFAULTS, "retryLimit": 7, "priority": -2, "retryDelay": 250,
                "deadLetterQueue": False, "leaseTime": 45, "retentionEnabled": True}
    assert second["options"] == expected
    assert options_of(stored(db, q)) == expected
    # no options at all: still 200, nothing changes
    third = configure(broker.client, q)
    assert third["options"] == expected
    # null values count as absent
    fourth = configure(broker.client, q, {"leaseTime": None, "retry_limit": None})
    assert fourth["options"] == expected and fourth["ignoredOptions"] == []


def test_snake_case_aliases_and_ignored_options(broker, db):
    q = uq("cfg")
    answer = configure(broker.client, q, {
        "lease_time": 12, "dead_letter_queue": False, "max_wait_time_seconds": 9,
        "completed_retention_seconds": 60, "dlq_after_max_retries": False,
        "foo": 1, "leaseTime": 12, "encryption": True, "bar_baz": None})
    assert answer["ignoredOptions"] == ["foo", "encryption", "bar_baz"]
    expected = {**DEFAULTS, "leaseTime": 12, "deadLetterQueue": False,
                "maxWaitTimeSeconds": 9, "completedRetentionSeconds": 60,
                "dlqAfterMaxRetries": False}
    assert answer["options"] == expected
    assert options_of(stored(db, q)) == expected
    # both spellings with different values contradict each other
    r = broker.client.post(CONFIGURE, json={"queue": q, "options": {"leaseTime": 5,
                                                                    "lease_time": 6}})
    assert_400(r, "lease_time")
    assert stored(db, q)["leaseTime"] == 12


BAD_OPTIONS = [
    ({"leaseTime": "30"}, "leaseTime"),
    ({"leaseTime": -1}, "leaseTime"),
    ({"leaseTime": 2**31}, "leaseTime"),
    ({"retryLimit": 1.5}, "retryLimit"),
    ({"retry_limit": True}, "retry_limit"),
    ({"deadLetterQueue": 1}, "deadLetterQueue"),
    ({"dedupWindow": None, "dlqAfterMaxRetries": "yes"}, "dlqAfterMaxRetries"),
    ({"priority": -(2**31) - 1}, "priority"),
    ({"maxSize": -1}, "maxSize"),
    ({"maxSize": 2**63}, "maxSize"),
    ({"maxSize": 10**12}, "maxSize"),  # in range, but no cap is enforced: refused (FIXED)
    ({"max_size": 1}, "max_size"),
    ({"delayed_processing": []}, "delayed_processing"),
    ({"windowBuffer": {"s": 1}}, "windowBuffer"),
    ({"retryDelay": -5}, "retryDelay"),
]


@pytest.mark.parametrize(("options", "field"), BAD_OPTIONS)
def test_bad_option_types_and_ranges_are_400_with_field(broker, db, options, field):
    q = uq("cfg")
    r = broker.client.post(CONFIGURE, json={"queue": q, "options": {"leaseTime": 10,
                                                                    **options}})
    assert_400(r, field)
    assert stored(db, q) is None  # nothing written, not even the queue


def test_bad_bodies_are_4xx_and_write_nothing(broker, db):
    q = uq("cfg")
    c = broker.client
    assert_400(c.post(CONFIGURE, json={"options": {}}), "queue")
    assert_400(c.post(CONFIGURE, json={"queue": 5}), "queue")
    assert_400(c.post(CONFIGURE, json={"queue": q, "options": [1]}), "options")
    assert_400(c.post(CONFIGURE, json={"queue": q, "namespace": 3}), "namespace")
    assert_400(c.post(CONFIGURE, json={"queue": q, "task": False}), "task")
    assert_400(c.post(CONFIGURE, json={"queue": q, "namespace": ""}), "namespace",
               "invalid_name")
    assert_400(c.post(CONFIGURE, json={"queue": "a/b"}), "queue", "invalid_name")
    assert_400(c.post(CONFIGURE, json={"queue": "bad\x01name"}), "queue", "invalid_name")
    assert_400(c.post(CONFIGURE, json=[q]), None)
    assert_400(c.post(CONFIGURE, content=b"{nope"), None)
    assert_400(c.post(CONFIGURE, content=b""), None)
    r = c.post(CONFIGURE, json={"queue": "q" * 256})
    assert r.status_code == 413 and r.json()["code"] == "name_too_long", r.text
    assert stored(db, q) is None


def test_encryption_without_a_key_is_400(make_broker, db_dsn, db):
    # no key file and none created (a broker has a key by default: test_key_rotation.py)
    broker = make_broker(db_dsn, QUEEN_ENCRYPTION_KEY_CREATE="0")
    q = uq("cfg")
    r = broker.client.post(CONFIGURE, json={"queue": q, "options": {
        "leaseTime": 10, "encryptionEnabled": True}})
    body = assert_400(r, "encryptionEnabled")
    assert "QUEEN_ENCRYPTION_KEY" in body["error"]
    assert stored(db, q) is None
    # turning it off (or leaving it off) needs no key
    assert configure(broker.client, q, {"encryption_enabled": False})["options"][
        "encryptionEnabled"] is False


def test_encryption_with_a_key_reaches_pushes_within_the_flag_memo(make_broker, db_dsn, db):
    b = make_broker(db_dsn, QUEEN_ENCRYPTION_KEY=KEY)
    # a queue configured before its first push: the very first push is encrypted
    fresh = uq("enc")
    assert configure(b.client, fresh, {"encryptionEnabled": True})["options"][
        "encryptionEnabled"] is True
    push_payloads(b.client, fresh, [{"card": "4111"}])
    (frame,) = _stored_frames(db_dsn, fresh)
    assert b"4111" not in bytes(frame.payload)

    # a queue pushed to before: the front workers' memo (5 s) may keep the old flag, then
    # every push is encrypted
    old = uq("enc")
    push_payloads(b.client, old, [{"n": 0}])
    configure(b.client, old, {"encryption_enabled": True})
    time.sleep(5.3)
    push_payloads(b.client, old, [{"card": "4111"}])
    frames = _stored_frames(db_dsn, old)
    assert b"4111" not in bytes(frames[-1].payload)
    assert orjson.loads(bytes(frames[0].payload)) == {"n": 0}


def test_namespace_and_task_override(broker, db):
    q = f"{uq('ns')}.t1.x"
    derived = configure(broker.client, q)
    assert (derived["namespace"], derived["task"]) == (q.split(".")[0], "t1")
    over = configure(broker.client, q, namespace="payments", task="refunds/eu")
    assert (over["namespace"], over["task"]) == ("payments", "refunds/eu")
    row = stored(db, q)
    assert (row["namespace"], row["task"]) == ("payments", "refunds/eu")
    # null keeps what is stored (no reset to the derived values)
    kept = configure(broker.client, q, {"priority": 3}, namespace=None, task=None)
    assert (kept["namespace"], kept["task"]) == ("payments", "refunds/eu")
    # "" removes the task
    cleared = configure(broker.client, q, task="")
    assert cleared["task"] == ""
    assert stored(db, q)["task"] is None
    # a new queue created with explicit values
    other = uq("plain")
    made = configure(broker.client, other, namespace="n2", task="t2")
    assert made["created"] is True and (made["namespace"], made["task"]) == ("n2", "t2")
    plain = configure(broker.client, uq("plain"))
    assert plain["task"] == ""  # a name without '.' has no task


def test_the_26_client_create_and_delete(broker, db):
    q = uq("cli")

    async def go() -> tuple[Any, Any, Any, Any]:
        async with Queen(broker.url) as client:
            created = await client.queue(q).config({"lease_time": 20, "retry_limit": 2,
                                                    "priority": 4}).create()
            updated = await client.queue(q).config({"leaseTime": 25}).create()
            gone = await client.queue(q).delete()
            again = await client.queue(q).delete()
        return created, updated, gone, again

    created, updated, gone, again = asyncio.run(go())
    assert created["configured"] is True and created["created"] is True
    assert created["options"] == {**DEFAULTS, "leaseTime": 20, "retryLimit": 2, "priority": 4}
    # the client sends its nine defaults every time: those are written again
    assert updated["created"] is False
    assert updated["options"] == {**DEFAULTS, "leaseTime": 25}
    assert gone == {"deleted": True, "queue": q, "existed": True}
    assert again == {"deleted": True, "queue": q, "existed": False}
    assert stored(db, q) is None


# --------------------------------------------------------------- the options are acted on
def _lease_seconds(db: psycopg.Connection, queue: str, partition: str) -> float:
    row = db.execute(
        "SELECT extract(epoch FROM c.lease_expires_at - c.leased_at) FROM queen.log_consumers c"
        " JOIN queen.log_partitions lp ON lp.id = c.partition_id"
        " JOIN queen.queues q ON q.id = lp.queue_id"
        " WHERE q.name = %s AND lp.name = %s AND c.lease_id IS NOT NULL",
        (queue, partition)).fetchone()
    assert row is not None
    return float(row[0])


def test_lease_time_change_is_used_by_the_next_pop(broker, db):
    q = uq("lease")
    push_payloads(broker.client, q, [1], partition="A")
    push_payloads(broker.client, q, [2], partition="B")
    configure(broker.client, q, {"leaseTime": 7})
    assert pop(broker.client, q, "g", partition="A") is not None
    assert _lease_seconds(db, q, "A") == pytest.approx(7, abs=0.01)
    configure(broker.client, q, {"lease_time": 11})
    assert pop(broker.client, q, "g", partition="B") is not None
    assert _lease_seconds(db, q, "B") == pytest.approx(11, abs=0.01)


def test_retry_limit_is_honoured_by_a_nack_flow(broker, db):
    q, g = uq("nack"), "workers"
    push_payloads(broker.client, q, [{"n": 1}])
    configure(broker.client, q, {"retryLimit": 1, "retryDelay": 0})
    for attempt in (1, 2):
        got = pop(broker.client, q, g)
        assert got is not None
        (m,) = got["messages"]
        assert m["deliveryAttempt"] == attempt
        item = ack(broker.client, m, "failed", f"boom {attempt}")
        assert item["success"], item
        assert item["dlq"] is (attempt == 2), item
    assert pop(broker.client, q, g) is None
    body = dlq(broker.client, queue=q)
    assert body["total"] == 1
    assert body["messages"][0]["errorMessage"] == "boom 2"
    assert body["messages"][0]["data"] == {"n": 1}
