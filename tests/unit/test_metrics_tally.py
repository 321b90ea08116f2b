"""``Tally`` (queen_mp/metrics.py): a turn's batched updates leave the same samples as the
direct calls they stand for, and are written before the loop's next turn."""

from __future__ import annotations

import asyncio

from prometheus_client import Counter, Gauge, Histogram

from queen_mp.metrics import Tally

_BUCKETS = (0.001, 0.01, 0.1, 1.0)


def _samples(metric: object) -> list[tuple[str, list[tuple[str, str]], float]]:
    return sorted((s.name, sorted(s.labels.items()), s.value)
                  for fam in metric.collect()  # type: ignore[attr-defined]
                  for s in fam.samples if not s.name.endswith("_created"))


def test_batched_updates_leave_the_samples_of_direct_ones() -> None:
    direct = (Counter("c", "c", ["route", "status"], registry=None),
              Histogram("h", "h", ["route"], buckets=_BUCKETS, registry=None),
              Histogram("hu", "hu", buckets=_BUCKETS, registry=None),
              Gauge("g", "g", registry=None))
    batched = (Counter("c", "c", ["route", "status"], registry=None),
               Histogram("h", "h", ["route"], buckets=_BUCKETS, registry=None),
               Histogram("hu", "hu", buckets=_BUCKETS, registry=None),
               Gauge("g", "g", registry=None))
    # values on, between and beyond the bounds: the first bucket at or above each one
    values = [0.0, 0.001, 0.0011, 0.01, 0.5, 1.0, 7.0, 0.001]
    tally = Tally()

    async def turn() -> None:
        for i, v in enumerate(values):
            route = ("/a", "/b")[i % 2]
            direct[0].labels(route, "201").inc(i)
            tally.inc(batched[0], (route, "201"), i)
            direct[1].labels(route).observe(v)
            tally.observe(batched[1], (route,), v)
            direct[2].observe(v)
            tally.observe(batched[2], (), v)
            direct[3].set(i)
            tally.set(batched[3], i)
        # nothing is written during the turn, all of it right after
        assert _samples(batched[1]) == []
        await asyncio.sleep(0)

    asyncio.run(turn())
    for d, b in zip(direct, batched, strict=True):
        assert _samples(b) == _samples(d)


def test_outside_a_running_loop_an_update_is_written_at_once() -> None:
    counter = Counter("c", "c", registry=None)
    Tally().inc(counter, (), 3)
    assert _samples(counter) == [("c_total", [], 3.0)]
