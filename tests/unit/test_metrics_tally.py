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
        level = [0.0]
        tally.sample(batched[3], lambda: level[0])
        for i in range(3):
            level[0] = i
            direct[3].set(i)
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


def test_a_sampled_gauge_is_written_at_flushes_where_it_changed() -> None:
    written: list[float] = []

    class Recorder:
        def set(self, value: float) -> None:
            written.append(value)

    level = [5.0]
    counter = Counter("c", "c", registry=None)

    async def turns() -> None:
        tally = Tally()
        tally.sample(Recorder(), lambda: level[0])
        await asyncio.sleep(0)  # the first value, at the end of the turn it was sampled in
        level[0] = 7.0
        tally.inc(counter)  # any update flushes at the turn's end: the gauge is read then
        await asyncio.sleep(0)
        tally.inc(counter)  # unchanged: not written again
        await asyncio.sleep(0)
        level[0] = 0.0
        await asyncio.sleep(0)  # no update, no flush: nothing read
        assert written == [5.0, 7.0]
        tally.inc(counter)
        await asyncio.sleep(0)

    asyncio.run(turns())
    assert written == [5.0, 7.0, 0.0]
    assert _samples(counter) == [("c_total", [], 3.0)]


def test_push_bundle_leaves_the_samples_of_the_public_updates() -> None:
    """``Metrics.push_bundle`` writes through the samples' values: the same samples as
    ``inc`` and ``observe``, for frame counts on, between and beyond the bucket bounds."""
    from queen_mp.metrics import Metrics

    direct, fast = Metrics("direct"), Metrics("fast")
    for segments, frames in [(1, 1), (3, 0), (2, 3), (20, 20), (5, 16384), (1, 20000)]:
        direct.fusion_commits.inc()
        direct.fusion_segments.inc(segments)
        direct.batch_items_fired.inc(frames)
        direct.fusion_items_per_batch.observe(frames)
        fast.push_bundle(segments, frames)
    for name in ("fusion_commits", "fusion_segments", "batch_items_fired",
                 "fusion_items_per_batch"):
        assert _samples(getattr(fast, name)) == _samples(getattr(direct, name)), name
