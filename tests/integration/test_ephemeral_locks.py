"""Lock order of the ephemeral functions (sql/functions/ephemeral.sql, its header's "Lock
order"): interleavings that closed a wait cycle, driven statement by statement from several
connections, must complete. Each test builds its state with the functions themselves, then
holds a row from a third connection so that the calls meet in the order that deadlocked, and
waits until each call is parked on a lock before letting the next one go. deadlock_timeout is
short, so a cycle would be reported (40P01) within the test's time.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from queen_mp.db import ephemeral_procs
from queen_mp.db.binarrays import register_arrays
from tests.pgharness import eph_pop

DEADLOCK_TIMEOUT = "50ms"


@pytest.fixture
def connect(db_dsn: str) -> Iterator[Callable[[], psycopg.Connection]]:
    """Autocommit connections with a short deadlock_timeout, closed at the end."""
    opened: list[psycopg.Connection] = []

    def new() -> psycopg.Connection:
        conn = psycopg.connect(db_dsn, autocommit=True)
        register_arrays(conn)  # the pushes' arrays go binary, as the broker sends them
        conn.execute(f"SET deadlock_timeout = '{DEADLOCK_TIMEOUT}'")
        opened.append(conn)
        return conn

    yield new
    for conn in opened:
        conn.close()


class Call(threading.Thread):
    """One statement on its own connection and thread: its row, or the error it raised."""

    def __init__(self, conn: psycopg.Connection, sql: str, params: tuple[Any, ...]) -> None:
        super().__init__(daemon=True)
        self.conn, self.sql, self.params = conn, sql, params
        self.pid = conn.info.backend_pid
        self.row: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.row = self.conn.execute(self.sql, self.params).fetchone()
        except psycopg.Error as ex:
            self.error = ex

    def result(self) -> Any:
        self.join(20)
        assert not self.is_alive(), "the call did not finish"
        if self.error is not None:
            raise self.error
        return self.row


def wait_for_lock(watch: psycopg.Connection, call: Call, *, or_end: bool = False) -> None:
    """Returns once the call's backend waits for a lock (or, with ``or_end``, has ended)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                            (call.pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            return
        if not call.is_alive():
            assert or_end, f"the call ended before it waited: {call.error!r}"
            return
        time.sleep(0.01)
    raise AssertionError("the call never waited for a lock")


def push(conn: psycopg.Connection, tenant: uuid.UUID, queue: str, partition: str,
         n: int) -> None:
    conn.execute(ephemeral_procs.PUSH_SQL, ephemeral_procs.push_params(
        tenant.bytes, queue, partition, [str(i) for i in range(n)]))


def pop(conn: psycopg.Connection, tenant: uuid.UUID, queue: str, partition: str,
        batch: int) -> tuple[str, int, int]:
    """(epoch, seq, dlv) of the one message a pop of ``partition`` gets."""
    msgs = eph_pop(conn, tenant, queue, partition, "g", batch, False)
    assert len(msgs) == 1, msgs
    epoch, seq, dlv = msgs[0]["id"].split("-")
    return epoch, int(seq), int(dlv)


def gauges(conn: psycopg.Connection, tenant: uuid.UUID, queue: str) -> dict[str, Any]:
    row = conn.execute("SELECT queen.eph_gauges_v1(%s, %s)", (tenant, queue)).fetchone()
    assert row is not None
    return row[0]


def test_a_push_that_drops_by_ttl_then_by_bounds_and_an_ack_of_both_complete(connect):
    """The push's ttl drop and its bounds drop take their leases in one ascending order: an
    ack that holds the lower lease of the bounds drop and waits for the ttl drop's no longer
    closes a cycle with it (it did when each drop locked its own leases in turn)."""
    setup, watch, holder = connect(), connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    push(setup, tenant, q, "a", 2)
    push(setup, tenant, q, "b", 2)
    epoch, b1, d1 = pop(setup, tenant, q, "b", 1)  # the bounds drop's lease, lowest dlv
    _, a1, d2 = pop(setup, tenant, q, "a", 1)      # the ttl drop's two leases
    _, _, d3 = pop(setup, tenant, q, "a", 1)
    assert d1 < d2 < d3
    setup.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)",
                  (tenant, q, '{"ttlSeconds": 3600, "maxLength": 2, "policy": "dropOldest"}'))
    setup.execute("UPDATE queen.eph_chunks k SET created_at = k.created_at - interval '2 hours'"
                  " FROM queen.eph_partitions p WHERE p.id = k.pid AND p.tenant = %s"
                  " AND p.queue = %s AND p.partition = 'a'", (tenant, q))

    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM queen.eph_leases WHERE tenant = %s AND queue = %s AND dlv = %s"
                   " FOR UPDATE", (tenant, q, d3))
    # the push expires partition a (leases d2, d3: waits for d3), then must drop b's oldest
    # message to fit maxLength (lease d1)
    pusher = Call(connect(), ephemeral_procs.PUSH_SQL,
                  ephemeral_procs.push_params(tenant.bytes, q, "c", ["1"]))
    wait_for_lock(watch, pusher)
    # the ack takes d1, then waits for d2
    acker = Call(connect(), "SELECT outcomes FROM queen.eph_ack_v5(%s, %s, 'g', %s::text[],"
                            " array_to_string(%s::int8[], ','), %s::int8[],"
                            " '{completed,completed}'::text[])",
                 (tenant, q, [epoch, epoch], [b1, a1], [d1, d2]))
    wait_for_lock(watch, acker)
    holder.execute("COMMIT")

    assert pusher.result() == (1,)
    # the push dropped both messages the ack names before it got to them
    assert acker.result() == (["unknown", "unknown"],)
    g = gauges(setup, tenant, q)
    assert (g["depth"], g["drops"]["ttl"], g["drops"]["bounds"]) == (2, 2, 1), g


def test_a_push_that_drops_by_ttl_then_by_bounds_and_a_pop_that_expires_complete(connect):
    """The push's ttl drop and its bounds drop take their chunks in one order too: a pop whose
    ttl drop takes a chunk of the bounds drop and waits for one of the push's ttl drop no
    longer closes a cycle with it (it did when the push struck the ttl's chunks first)."""
    setup, watch, holder = connect(), connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    push(setup, tenant, q, "b", 1)  # expired for the push
    push(setup, tenant, q, "a", 1)  # expired for the pop only, dropped by the push's bounds
    push(setup, tenant, q, "c", 2)
    _, _, dc = pop(setup, tenant, q, "c", 1)
    setup.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)",
                  (tenant, q, '{"ttlSeconds": 3600, "maxLength": 2, "policy": "dropOldest"}'))
    age = ("UPDATE queen.eph_chunks k SET created_at = k.created_at - interval '2 hours'"
           " FROM queen.eph_partitions p WHERE p.id = k.pid AND p.tenant = %s"
           " AND p.queue = %s AND p.partition = %s")
    setup.execute(age, (tenant, q, "b"))

    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM queen.eph_leases WHERE tenant = %s AND queue = %s AND dlv = %s"
                   " FOR UPDATE", (tenant, q, dc))
    # the push expires b, then must drop a's message and c's first (lease dc: waits)
    pusher = Call(connect(), ephemeral_procs.PUSH_SQL,
                  ephemeral_procs.push_params(tenant.bytes, q, "d", ["1"]))
    wait_for_lock(watch, pusher)
    setup.execute(age, (tenant, q, "a"))
    # the pop expires a and b: a's chunk, then b's (the push's, when it struck it first)
    popper = Call(connect(), "SELECT claimed FROM queen.eph_pop_v5(%s, %s, NULL, 'g2', 1, true)",
                  (tenant, q))
    wait_for_lock(watch, popper, or_end=True)
    holder.execute("COMMIT")

    assert pusher.result() == (1,)
    assert popper.result() is not None
    g = gauges(setup, tenant, q)
    live = setup.execute("SELECT coalesce(sum(k.live), 0) FROM queen.eph_chunks k"
                         " JOIN queen.eph_partitions p ON p.id = k.pid"
                         " WHERE p.tenant = %s AND p.queue = %s", (tenant, q)).fetchone()
    # a's and b's messages by ttl (whoever took them), c's first by bounds, each counted once
    assert (g["drops"]["ttl"], g["drops"]["bounds"]) == (2, 1), g
    assert live is not None and g["depth"] == live[0], (g, live)


def test_a_pop_that_expires_and_waits_for_a_cursor_and_a_settling_pop_complete(connect):
    """A pop's ttl drop strikes its chunks with the rest of its settle, at its end: it holds no
    chunk while it waits for a cursor that another pop of its group holds, that pop waiting in
    its settle for one of the chunks (it did when the drop struck them at the pop's start)."""
    setup, watch, holder = connect(), connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    setup.execute("SELECT queen.eph_pop_v5(%s, %s, NULL, 'g', 1, true)", (tenant, q))  # group g
    push(setup, tenant, q, "a", 1)
    push(setup, tenant, q, "b", 1)
    setup.execute("SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)",
                  (tenant, q, '{"ttlSeconds": 3600}'))
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM queen.eph_chunks k JOIN queen.eph_partitions p ON p.id = k.pid"
                   " WHERE p.tenant = %s AND p.queue = %s AND p.partition = 'a' FOR UPDATE OF k",
                   (tenant, q))
    # the first pop takes both messages (autoAck) and waits in its settle for a's chunk
    first = Call(connect(), "SELECT claimed FROM queen.eph_pop_v5(%s, %s, NULL, 'g', 10, true)",
                 (tenant, q))
    wait_for_lock(watch, first)
    setup.execute("UPDATE queen.eph_chunks k SET created_at = k.created_at - interval '2 hours'"
                  " FROM queen.eph_partitions p WHERE p.id = k.pid AND p.tenant = %s"
                  " AND p.queue = %s AND p.partition = 'b'", (tenant, q))
    # the second expires b's chunk, finds both cursors held, and waits for the first
    second = Call(connect(), "SELECT claimed FROM queen.eph_pop_v5(%s, %s, NULL, 'g', 10, true)",
                  (tenant, q))
    wait_for_lock(watch, second)
    holder.execute("COMMIT")

    assert first.result() == (2,)
    assert second.result() == (0,)
    g = gauges(setup, tenant, q)
    # b's message: delivered by the first, and dropped by ttl or settled, counted once
    assert g["depth"] == 0, g
    assert g["drops"]["ttl"] in (0, 1), g


def test_a_push_that_waited_for_its_partition_takes_its_seqs_after_the_holder(connect):
    """A push takes its seq value in the UPDATE that locks its partition's row: when it had
    to wait for the row, it takes it again once the holder committed, so its messages come
    after the holder's (a cursor past the holder's would skip them otherwise)."""
    setup, watch, holder = connect(), connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    push(setup, tenant, q, "p", 1)
    holder.execute("BEGIN")
    holder.execute("UPDATE queen.eph_partitions SET last_seq = last_seq"
                   " WHERE tenant = %s AND queue = %s", (tenant, q))
    pusher = Call(connect(), ephemeral_procs.PUSH_SQL,
                  ephemeral_procs.push_params(tenant.bytes, q, "p", ["2"]))
    wait_for_lock(watch, pusher)  # its value was taken, below the holder's
    row = holder.execute("UPDATE queen.eph_partitions SET last_seq = nextval('queen.eph_seq')"
                         " * 16384 WHERE tenant = %s AND queue = %s RETURNING last_seq",
                         (tenant, q)).fetchone()
    holder.execute("COMMIT")
    assert pusher.result() == (1,)
    assert row is not None
    seqs = [r[0] for r in setup.execute(
        "SELECT k.base FROM queen.eph_chunks k JOIN queen.eph_partitions p ON p.id = k.pid"
        " WHERE p.tenant = %s AND p.queue = %s ORDER BY k.base", (tenant, q)).fetchall()]
    assert len(seqs) == 2 and seqs[1] > row[0], (seqs, row)


def test_two_strikes_of_the_same_messages_count_each_out_once(connect):
    """A strike that waited for a chunk row another strike held counts only what that one
    left: the first strikes five messages of ten, the second all ten, and 5 + 5 are counted."""
    first, second, watch = connect(), connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    push(first, tenant, q, "p", 10)
    row = first.execute("SELECT k.pid, k.base FROM queen.eph_chunks k JOIN queen.eph_partitions p"
                        " ON p.id = k.pid WHERE p.tenant = %s AND p.queue = %s",
                        (tenant, q)).fetchone()
    assert row is not None
    strike = ("SELECT n, bytes FROM queen.eph_strike_v1(%s::int8[], %s::int8[],"
              " %s::int4multirange[])")
    first.execute("BEGIN")
    assert first.execute(strike, ([row[0]], [row[1]], ["{[0,5)}"])).fetchone() == (5, 5)
    late = Call(second, strike, ([row[0]], [row[1]], ["{[0,10)}"]))
    wait_for_lock(watch, late)
    first.execute("COMMIT")
    assert late.result() == (5, 5)
    first.execute("SELECT queen.eph_delete_v1(%s, %s)", (tenant, q))  # no caller counted them


def delivered_ids(conn: psycopg.Connection, tenant: uuid.UUID, q: str,
                  batches: tuple[int, ...]) -> list[list[list[str]]]:
    """Group g's deliveries of partition p, one pop per batch size: each message's id split
    into its (epoch, seq, delivery) parts, as an ack sends them."""
    ids = []
    for batch in batches:
        msgs = eph_pop(conn, tenant, q, "p", "g", batch, False)
        assert len(msgs) == batch, msgs
        ids.append([m["id"].split("-") for m in msgs])
    return ids


def assert_emptied(conn: psycopg.Connection, tenant: uuid.UUID, q: str) -> None:
    """No chunk of the queue is left and its gauges count nothing."""
    left = conn.execute("SELECT count(*) FROM queen.eph_chunks k JOIN queen.eph_partitions p"
                        " ON p.id = k.pid WHERE p.tenant = %s AND p.queue = %s",
                        (tenant, q)).fetchone()
    assert left == (0,)
    g = gauges(conn, tenant, q)
    assert (g["depth"], g["bytes"]) == (0, 0), g


@pytest.mark.parametrize("each", [False, True], ids=["as-the-broker-sends", "an-item-per-id"])
@pytest.mark.parametrize("first_of", [0, 1])
def test_two_acks_that_share_a_chunk_leave_it_deleted_and_count_each_message_once(connect,
                                                                                  first_of,
                                                                                  each):
    """One group's acks of two deliveries of one chunk (4 and 6 of its 10 messages): the one
    that waited for the chunk row sees what the other left, so the last one deletes the row
    (each struck its part, and neither deleted it, when both decided on the row first read).
    Each ack as the broker sends it (one epoch, delivery and status for all its ids: the usual
    ack's path) or with an element per id (the general path)."""
    first, second, watch = connect(), connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    push(first, tenant, q, "p", 10)
    ids = delivered_ids(first, tenant, q, (4, 6))
    ack = ("SELECT outcomes FROM queen.eph_ack_v5(%s, %s, 'g', %s::text[],"
           " array_to_string(%s::int8[], ','), %s::int8[], %s::text[])")

    def params(i: int) -> tuple[Any, ...]:
        k = len(ids[i]) if each else 1
        return (tenant, q, [e for e, _, _ in ids[i]][:k], [int(s) for _, s, _ in ids[i]],
                [int(d) for _, _, d in ids[i]][:k], ["completed"] * k)

    def acked(i: int) -> tuple[list[str] | None]:
        return (["acked"] * len(ids[i]) if each else None,)

    first.execute("BEGIN")
    assert first.execute(ack, params(first_of)).fetchone() == acked(first_of)
    late = Call(second, ack, params(1 - first_of))
    wait_for_lock(watch, late)
    first.execute("COMMIT")
    assert late.result() == acked(1 - first_of)
    assert_emptied(first, tenant, q)


def test_an_ack_over_three_chunks_that_waited_for_one_deletes_what_the_other_left(connect):
    """One group's acks of two deliveries that share a chunk: the first delivery's messages
    sit in three chunks (eph_ack_v5's one-group way: a probe and lock by key each, then the
    delete or strike by ctid), the second holds the rest of the third chunk and is acked
    first. The first ack waits for that chunk's row and decides on the row as it was left:
    the chunk goes, and every message is counted out once."""
    first, second, watch = connect(), connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        push(first, tenant, q, "p", 3)
    ids = delivered_ids(first, tenant, q, (7, 2))
    ack = ("SELECT outcomes FROM queen.eph_ack_v5(%s, %s, 'g', %s::text[],"
           " array_to_string(%s::int8[], ','), %s::int8[], '{completed}'::text[])")

    def params(i: int) -> tuple[Any, ...]:
        return (tenant, q, [ids[i][0][0]], [int(s) for _, s, _ in ids[i]], [int(ids[i][0][2])])

    second.execute("BEGIN")
    assert second.execute(ack, params(1)).fetchone() == (None,)
    late = Call(first, ack, params(0))
    wait_for_lock(watch, late)
    second.execute("COMMIT")
    assert late.result() == (None,)
    assert_emptied(first, tenant, q)


def test_a_pop_that_skips_a_delivery_due_at_once_answers_it_is_0_ms_away(connect):
    """A redelivery due at once ('-infinity') that another pop holds is skipped; the pop that
    got nothing answers wake_in_ms 0 for it (subtracting -infinity failed the pop)."""
    setup, holder = connect(), connect()
    tenant, q = uuid.uuid4(), f"locks-{uuid.uuid4().hex[:8]}"
    push(setup, tenant, q, "p", 1)
    epoch, seq, dlv = pop(setup, tenant, q, "p", 1)
    setup.execute("SELECT queen.eph_ack_v5(%s, %s, 'g', %s::text[],"
                  " array_to_string(%s::int8[], ','), %s::int8[], '{failed}'::text[])",
                  (tenant, q, [epoch], [seq], [dlv]))
    holder.execute("BEGIN")
    held = holder.execute("SELECT lease_until::text FROM queen.eph_leases WHERE tenant = %s"
                          " AND queue = %s FOR UPDATE", (tenant, q)).fetchall()
    assert held == [("-infinity",)]
    row = setup.execute("SELECT claimed, wake_in_ms FROM queen.eph_pop_v5(%s, %s, NULL, 'g', 1,"
                        " false)", (tenant, q)).fetchone()
    holder.execute("COMMIT")
    assert row == (0, 0)
