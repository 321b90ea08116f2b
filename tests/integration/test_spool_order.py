"""Issue 29, fault 8: a producer's items keep their order per partition across push
maintenance (queen_mp/front/spoolhold.py), through one instance and through two over one
database.

A producer pushes one item at a time (the next only after the last one's answer) to three
partitions, through the instances in turn, while push maintenance is switched on and off three
times (each switch on the other instance). Afterwards every item is stored once, and in every
partition the stored offsets follow the order in which the producer sent the items, whether
each was answered ``queued`` or ``buffered``.
"""

from __future__ import annotations

import threading
import time

import httpx
import psycopg
import pytest

from tests.brokerharness import Broker
from tests.integration.test_maintenance import set_maintenance, wait_drained, wait_for
from tests.integration.test_push_json import PUSH, stored_messages, uq

PARTITIONS = 3
TOGGLES = 6  # on, off, three times
TOGGLE_EVERY_S = 0.4


class Producer(threading.Thread):
    """Sequential pushes through ``brokers`` in turn until ``stop``; what each was told."""

    def __init__(self, brokers: list[Broker], queue: str) -> None:
        super().__init__(name="order-producer", daemon=True)
        self.brokers = brokers
        self.queue = queue
        self.stop = threading.Event()
        self.sent: list[tuple[str, str, str]] = []  # (transactionId, partition, status)
        self.error: BaseException | None = None

    def run(self) -> None:
        clients = [httpx.Client(base_url=b.url, timeout=30) for b in self.brokers]
        try:
            k = 0
            while not self.stop.is_set():
                txn, partition = f"o-{k}", f"p{k % PARTITIONS}"
                r = clients[k % len(clients)].post(PUSH, json={"items": [{
                    "queue": self.queue, "partition": partition, "transactionId": txn,
                    "payload": {"k": k}}]})
                assert r.status_code == 201, r.text
                (answer,) = r.json()
                assert answer["status"] in ("queued", "buffered"), answer
                self.sent.append((txn, partition, answer["status"]))
                k += 1
        except BaseException as ex:  # reported by the test
            self.error = ex
        finally:
            for c in clients:
                c.close()


@pytest.mark.parametrize("instances", [1, 2])
def test_a_producers_items_are_stored_in_its_order_across_maintenance(
        make_broker, fresh_db_dsn: str, instances: int) -> None:
    brokers = [make_broker(fresh_db_dsn) for _ in range(instances)]
    q = uq("order")
    producer = Producer(brokers, q)
    producer.start()
    try:
        wait_for("the first pushes", lambda: len(producer.sent) >= 10)
        for n in range(TOGGLES):
            set_maintenance(brokers[n % instances], enabled=n % 2 == 0)
            time.sleep(TOGGLE_EVERY_S)
        # NOTE(test): pushes go on after the last switch, while the spools drain
        try:
            wait_for("pushes after maintenance", lambda: producer.sent[-1][2] == "queued", 30)
        except AssertionError:
            logs = "\n".join(b.log()[-3000:] for b in brokers)
            raise AssertionError(f"pushes stay buffered: {producer.sent[-3:]}\n{logs}"
                                 ) from None
        after = len(producer.sent)
        wait_for("more pushes", lambda: len(producer.sent) >= after + 20)
    finally:
        producer.stop.set()
        producer.join(60)
    assert not producer.is_alive() and producer.error is None, producer.error
    for b in brokers:
        wait_drained(b, timeout=60)
    statuses = {s for _, _, s in producer.sent}
    assert statuses == {"queued", "buffered"}, statuses

    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        stored = wait_for("every item stored", lambda: (
            m := stored_messages(conn, q)) and len(m) >= len(producer.sent) and m)
    where = {m.transaction_id: (m.partition, m.offset) for m in stored}
    assert len(stored) == len(where) == len(producer.sent)  # each once
    overtaken: list[str] = []
    last: dict[str, tuple[int, str, str]] = {}
    for txn, partition, status in producer.sent:
        stored_in, offset = where[txn]
        assert stored_in == partition
        before = last.get(partition)
        if before is not None and offset < before[0]:
            overtaken.append(f"{txn} ({status}) at offset {offset}, below {before[1]} "
                             f"({before[2]}) at {before[0]}")
        last[partition] = max(before or (-1, "", ""), (offset, txn, status))
    assert not overtaken, f"{len(overtaken)} items stored before an earlier one: {overtaken[:5]}"


def hold_row(conn: psycopg.Connection, holder: str, oldest_us: int | None, episode: int,
             buckets: list[int] | None = None) -> dict:
    return conn.execute("SELECT queen.spool_hold_v2(%s, %s, 10000, 'me', %s, %s::int8[])",
                        (holder, oldest_us, episode, buckets)).fetchone()[0]


def test_a_hold_row_is_withdrawn_only_by_the_hold_that_ended(fresh_db_dsn: str) -> None:
    """queen.spool_hold_v2: a late withdrawal of an ended hold keeps the next one, a late
    refresh of an ended hold does not overwrite the next one, a heartbeat keeps the buckets
    of its own hold; the answer lists the live holds and their buckets."""
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        view = hold_row(conn, "a", 1_000, episode=10, buckets=[1_000] * 64)
        assert view["holds"] == [{"instance": "a", "oldestUs": 1_000}]
        assert view["buckets"] == {"a": [1_000] * 64}
        assert {"maintenance", "popMaintenance", "version", "peers"} <= view.keys()
        hold_row(conn, "a", 5_000, episode=20)                  # the next hold begins
        assert hold_row(conn, "a", None, episode=10)["holds"] == [  # ended hold: kept
            {"instance": "a", "oldestUs": 5_000}]
        assert hold_row(conn, "a", 1_000, episode=10)["holds"] == [  # late refresh: ignored
            {"instance": "a", "oldestUs": 5_000}]
        hold_row(conn, "a", 6_000, episode=20, buckets=[6_000] * 64)
        assert hold_row(conn, "a", 7_000, episode=20)["buckets"] == {"a": [6_000] * 64}
        hold_row(conn, "b", 2_000, episode=1)
        view = hold_row(conn, "a", None, episode=20)
        assert view["holds"] == [{"instance": "b", "oldestUs": 2_000}]
        assert view["buckets"] == {}
        conn.execute("UPDATE queen.spool_holds SET expires_at = now() - interval '1 s'")
        assert hold_row(conn, "c", None, episode=0)["holds"] == []  # expired: ignored
