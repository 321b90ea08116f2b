"""bench/consume.py's e2e breakdown (each message's time from its push answer to the pop
answer that carried it, laid on the one consumer's timeline of pops and acks) and the names
its PostgreSQL wait sampler gives roles and statements."""

from __future__ import annotations

import pytest

from bench.consume import _role, _statement, e2e_breakdown


def test_a_message_caught_by_a_waiting_pop_is_all_that_pop() -> None:
    # the pop went out at 0.0 (long poll), the push was answered at 1.0, the pop at 1.004
    ops = [("pop", 0.0, 1.004), ("ack", 1.005, 1.008)]
    got = e2e_breakdown({"a": (0.99, 1.0)}, {"a": 1.004}, ops)
    assert got is not None and got["messages"] == 1
    assert got["all_ms"]["caught"] == pytest.approx(4.0)
    assert got["all_ms"]["caught_share"] == 1.0
    assert got["all_ms"]["ack"] == 0.0 and got["all_ms"]["carrying_pop"] == 0.0


def test_a_message_that_waited_for_the_consumer_is_split_by_hop() -> None:
    # answered at 1.001 while a pop that did not carry it ran (until 1.003), then the ack of
    # that pop (1.0035 .. 1.007), 0.5 ms of client gap each time, then the carrying pop
    ops = [("pop", 0.99, 1.003), ("ack", 1.0035, 1.007), ("pop", 1.0075, 1.010)]
    got = e2e_breakdown({"b": (0.995, 1.001), "lost": (0.995, 1.001)}, {"b": 1.010}, ops)
    assert got is not None and got["messages"] == 1
    part = got["all_ms"]
    assert part["earlier_pop"] == pytest.approx(2.0)
    assert part["ack"] == pytest.approx(3.5)
    assert part["client_gap"] == pytest.approx(1.0)
    assert part["carrying_pop"] == pytest.approx(2.5)
    assert part["caught"] == 0.0 and part["caught_share"] == 0.0
    assert sum(v for k, v in part.items() if k != "caught_share") == pytest.approx(9.0)
    assert got["pop_ms"] == {"p50": pytest.approx(2.5), "p99": pytest.approx(13.0),
                             "max": pytest.approx(13.0)}
    assert got["ack_ms"]["p50"] == pytest.approx(3.5)


def test_the_slowest_one_percent_is_the_tail_only() -> None:
    ops = [("pop", 0.0, 2.0)]
    sent = {f"m{i}": (0.0, 2.0 - 0.001) for i in range(99)} | {"slow": (0.0, 1.95)}
    recv = dict.fromkeys(sent, 2.0)
    got = e2e_breakdown(sent, recv, ops)
    assert got is not None and got["messages"] == 100
    assert got["slowest_1pct_ms"]["caught"] == pytest.approx(50.0)
    assert got["all_ms"]["caught"] == pytest.approx((99 * 1.0 + 50.0) / 100)


def test_no_delivered_message_no_breakdown() -> None:
    assert e2e_breakdown({"a": (0.0, 1.0)}, {}, [("pop", 0.0, 2.0)]) is None


def test_pg_waits_name_roles_and_statements() -> None:
    assert _role("queen-mp shard 0 acks") == "shard acks"
    assert _role("queen-mp front-12345") == "front"
    assert _role("bench-baseline") == "bench-baseline"
    assert _statement("SELECT * FROM queen.log_pop_v1($1, $2)") == "log_pop_v1"
    assert _statement("WITH x AS (DELETE ...)") == "with"
    assert _statement("") == "?"
