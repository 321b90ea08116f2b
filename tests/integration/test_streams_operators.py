"""Issue 27 item 1: every windowing and gating operator of the published client's Stream DSL
(queen-mq 2.6 ``queen.streams``) against a real broker: sliding, session and cron windows,
event time with watermarks (late events dropped, the watermark kept in state), the token-bucket
gate (partial acks, FIFO redelivery) and a keyed join of two event kinds.

Event-time tests use fixed timestamps in the payloads, so their windows and counts are exact
whatever the batching; a final event far ahead moves the watermark past every window.
"""

from __future__ import annotations

from typing import Any

from queen import Queen, Stream, token_bucket_gate

from tests.integration.test_push_json import uq
from tests.integration.test_streams import cursor, drain, push, run_stream, state_rows, stored


def ts_of(m: dict) -> int:
    return m["data"]["ts"]


def with_window(v: Any, ctx: dict) -> dict:
    return {**v, "start": ctx["windowStart"], "key": ctx["key"]}


def test_sliding_window_counts_each_event_in_every_window_it_falls_in(broker, db):
    src, sink, query = uq("ss"), uq("sk"), uq("q")
    push(broker.client, src, "p1", [{"ts": t} for t in (10500, 11500, 12500, 13500, 99000)])
    run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .window_sliding(size=2, slide=1, event_time=ts_of, idle_flush_ms=200)
        .aggregate({"count": lambda m: 1})
        .map(with_window)
        .to(q.queue(sink)),
        query, lambda: cursor(db, src, f"streams.{query}") == 5 and stored(db, sink) == 5)
    got = sorted((m["data"]["start"], m["data"]["count"]) for m in drain(broker.client, sink))
    assert got == [(9000, 1), (10000, 2), (11000, 2), (12000, 2), (13000, 1)]


def test_event_time_drops_late_events_and_keeps_the_watermark(broker, db):
    src, sink, query = uq("ss"), uq("sk"), uq("q")
    c = broker.client
    push(c, src, "p1", [{"ts": t} for t in (10500, 11500, 12500)])

    def build(q: Queen) -> Stream:
        return (Stream.from_(q.queue(src))
                .window_tumbling(seconds=1, event_time=ts_of, idle_flush_ms=200)
                .aggregate({"count": lambda m: 1})
                .map(with_window)
                .to(q.queue(sink)))

    group = f"streams.{query}"
    run_stream(broker, build, query,
               lambda: cursor(db, src, group) == 3 and stored(db, sink) == 2)
    # the watermark (12500) outlives the consumer: it is state
    assert state_rows(db, query)["__wm__"] == {"eventTimeMs": 12500}
    # a new consumer: 10700 is behind the watermark (late, dropped); 20000 closes 12000
    push(c, src, "p1", [{"ts": 10700}, {"ts": 20000}])
    metrics = run_stream(broker, build, query,
                         lambda: cursor(db, src, group) == 5 and stored(db, sink) == 3)
    assert metrics["lateEventsTotal"] == 1
    got = sorted((m["data"]["start"], m["data"]["count"]) for m in drain(c, sink))
    assert got == [(10000, 1), (11000, 1), (12000, 1)]
    assert state_rows(db, query)["__wm__"] == {"eventTimeMs": 20000}


def test_session_windows_close_on_the_gap(broker, db):
    src, sink, query = uq("ss"), uq("sk"), uq("q")
    events = [("u1", 10000), ("u2", 10200), ("u1", 10500), ("u1", 11000), ("u2", 11100),
              ("u1", 13000), ("zz", 60000)]
    push(broker.client, src, "p1", [{"user": u, "ts": t} for u, t in events])
    run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .key_by(lambda m: m["data"]["user"])
        .window_session(gap=1, event_time=ts_of, idle_flush_ms=200)
        .reduce(lambda acc, v: acc + 1, 0)
        .map(lambda v, ctx: {"n": v, "key": ctx["key"], "start": ctx["windowStart"],
                             "end": ctx["windowEnd"]})
        .to(q.queue(sink)),
        query, lambda: cursor(db, src, f"streams.{query}") == 7 and stored(db, sink) == 3)
    got = sorted((m["data"]["key"], m["data"]["start"], m["data"]["end"], m["data"]["n"])
                 for m in drain(broker.client, sink))
    assert got == [("u1", 10000, 12000, 3), ("u1", 13000, 14000, 1), ("u2", 10200, 12100, 2)]
    open_sessions = [k for k in state_rows(db, query) if "\x1fopen\x1f" in k]
    assert [k.rsplit("\x1f", 1)[1] for k in open_sessions] == ["zz"]


def test_cron_windows_align_to_the_clock(broker, db):
    src, sink, query = uq("ss"), uq("sk"), uq("q")
    push(broker.client, src, "p1", [{"ts": t} for t in (60_100, 60_900, 61_300, 125_000)])
    run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .window_cron(every="second", event_time=ts_of, idle_flush_ms=200)
        .aggregate({"count": lambda m: 1, "sum": lambda m: m["ts"]})
        .map(with_window)
        .to(q.queue(sink)),
        query, lambda: cursor(db, src, f"streams.{query}") == 4 and stored(db, sink) == 2)
    got = sorted((m["data"]["start"], m["data"]["count"], m["data"]["sum"])
                 for m in drain(broker.client, sink))
    assert got == [(60_000, 2, 121_000), (61_000, 1, 61_300)]


def test_token_bucket_gate_passes_everything_once_in_order(broker, db):
    """Five tokens, five a second: each delivery passes what the bucket allows and acks that
    prefix keeping the lease (release_lease false); the rest is redelivered in order when the
    lease expires. Nothing is lost, nothing passes twice, the order holds."""
    c, src, sink, query = broker.client, uq("ss"), uq("sk"), uq("q")
    assert c.post("/api/v1/configure",
                  json={"queue": src, "options": {"leaseTime": 1}}).status_code == 200
    push(c, src, "p1", [{"n": n} for n in range(12)])
    metrics = run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .gate(token_bucket_gate(capacity=5, refill_per_sec=5))
        .to(q.queue(sink)),
        query, lambda: cursor(db, src, f"streams.{query}") == 12, timeout=30)
    assert [m["data"]["n"] for m in drain(c, sink)] == list(range(12))
    assert metrics["gateAllowsTotal"] == 12 and metrics["gateDenialsTotal"] >= 1
    bucket = next(iter(state_rows(db, query).values()))
    assert bucket["allowedTotal"] == 12 and bucket["tokens"] <= 5


def test_a_keyed_join_of_two_event_kinds(broker, db):
    """The DSL has no join operator; a join is key_by + a window + a reduce that merges the
    two sides (orders and payments on one queue, joined by order id)."""
    src, sink, query = uq("ss"), uq("sk"), uq("q")
    events = [{"kind": "order", "id": "o1", "ts": 10000, "amount": 30},
              {"kind": "order", "id": "o2", "ts": 10100, "amount": 12},
              {"kind": "payment", "id": "o1", "ts": 10300, "paid": 30},
              {"kind": "payment", "id": "o2", "ts": 10600, "paid": 10},
              {"kind": "order", "id": "o3", "ts": 10700, "amount": 5},
              {"kind": "tick", "id": "zz", "ts": 90000}]
    push(broker.client, src, "p1", events)

    def merge(acc: dict, v: dict) -> dict:
        return {**acc, v["kind"]: v}

    run_stream(
        broker,
        lambda q: Stream.from_(q.queue(src))
        .key_by(lambda m: m["data"]["id"])
        .window_session(gap=2, event_time=ts_of, idle_flush_ms=200)
        .reduce(merge, {})
        .filter(lambda v: "order" in v and "payment" in v)
        .map(lambda v: {"id": v["order"]["id"], "due": v["order"]["amount"] - v["payment"]["paid"]})
        .to(q.queue(sink)),
        query, lambda: cursor(db, src, f"streams.{query}") == 6 and stored(db, sink) == 2)
    got = sorted((m["data"]["id"], m["data"]["due"]) for m in drain(broker.client, sink))
    assert got == [("o1", 0), ("o2", 2)]
