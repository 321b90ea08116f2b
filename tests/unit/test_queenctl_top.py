"""``queenctl top``'s arithmetic without a broker: rates from two samples, averages since start
on the first frame, ordering and clamping (queen_mp/processes/queenctl/top.py)."""

from __future__ import annotations

from typing import Any

import pytest

from queen_mp.processes.queenctl.top import Sample, build_frame, render_frame


def sample(at: float, pushed: int, queues: dict[str, tuple[int, int]], *, uptime: int = 100,
           maintenance: bool = False, groups: list[dict[str, Any]] | None = None) -> Sample:
    """``queues``: name -> (pending, total)."""
    metrics = {"uptime": uptime, "requests": {"total": pushed * 2},
               "messages": {"pushed": pushed, "popped": pushed // 2, "acked": 0},
               "fusion": {"segmentsPerCommit": 1.5}, "spool": {"pending": 0},
               "parkedPops": 1}
    health = {"status": "healthy", "maintenanceMode": maintenance, "popMaintenanceMode": False,
              "shards": {"alive": 2, "total": 2}}
    rows = [{"name": n, "messages": {"pending": p, "processing": 0, "deadLetter": 0,
                                     "total": t}} for n, (p, t) in queues.items()]
    overview = {"queues": len(queues), "messages": {
        "pending": sum(p for p, _ in queues.values()), "deadLetter": 0}}
    return Sample(at, metrics, health, overview, rows, groups or [])


def test_first_frame_averages_since_start_then_differences():
    first = build_frame(sample(10.0, 500, {"a": (5, 5)}, uptime=50), None, 10)
    assert first.window is None
    assert first.rates == {"pushedPerSec": 10.0, "poppedPerSec": 5.0, "ackedPerSec": 0.0,
                           "requestsPerSec": 20.0}
    assert first.queues[0]["inPerSec"] is None

    before = sample(10.0, 500, {"a": (5, 5), "b": (1, 9)})
    after = sample(12.0, 540, {"a": (25, 25), "b": (0, 3), "c": (2, 2)})
    frame = build_frame(after, before, 10)
    assert frame.window == pytest.approx(2.0)
    assert frame.rates["pushedPerSec"] == pytest.approx(20.0)
    rows = {q["queue"]: q for q in frame.queues}
    assert rows["a"]["inPerSec"] == pytest.approx(10.0)
    assert rows["b"]["inPerSec"] == 0  # retention shrank it: clamped, never negative
    assert rows["c"]["inPerSec"] is None  # new since the last frame
    assert [q["queue"] for q in frame.queues] == ["a", "c", "b"]  # most pending first
    assert frame.totals == {"queues": 3, "pending": 27, "deadLetter": 0, "groupLag": 0}


def test_a_counter_reset_gives_no_negative_rate_and_top_limits_rows():
    before = sample(0.0, 1000, {f"q{i}": (i, i) for i in range(5)})
    after = sample(1.0, 10, {f"q{i}": (i, i) for i in range(5)},
                   groups=[{"name": "g", "queueName": "q1", "totalLag": 7},
                           {"name": "h", "queueName": "q1", "totalLag": 9}])
    frame = build_frame(after, before, 2)  # the broker restarted: counters went down
    assert frame.rates["pushedPerSec"] == 0
    assert [q["queue"] for q in frame.queues] == ["q4", "q3"]
    assert [g["group"] for g in frame.groups] == ["h", "g"]
    assert frame.totals["groupLag"] == 16  # totals cover every row, not only those shown


def test_render_shows_maintenance_and_empty_tables():
    text = render_frame(build_frame(sample(0.0, 0, {}, maintenance=True), None, 5), "http://b")
    lines = text.splitlines()
    assert lines[0].endswith("healthy  [MAINTENANCE]") and lines[0].startswith("queenctl top")
    assert lines[1].startswith("shards 2/2  uptime 100s  spool 0  parked pops 1")
    assert lines[-3:] == ["no queues", "", "no consumer groups"]
