"""``FrontWorker.count_pushed`` tallies each status of a push's results once, by its count:
a 1-item push through its own short path, any other through ``PushResults.counts``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from queen_mp.front.ingest import ItemResult, PushResults, QueuedRun
from queen_mp.front.worker import FrontWorker


def tallied(results: PushResults) -> list[tuple[Any, tuple[str, ...], int]]:
    seen: list[tuple[Any, tuple[str, ...], int]] = []
    tally = SimpleNamespace(inc=lambda family, labels, n: seen.append((family, labels, n)))
    worker = SimpleNamespace(metrics=SimpleNamespace(tally=tally, messages_pushed="pushed"))
    FrontWorker.count_pushed(worker, results)  # type: ignore[arg-type]
    return seen


def result(status: str) -> ItemResult:
    return ItemResult(status, bytes(16), 7, 1, 1)


def test_one_item_counts_its_status() -> None:
    assert tallied(PushResults([result("queued")])) == [("pushed", ("queued",), 1)]
    assert tallied(PushResults([result("duplicate")])) == [("pushed", ("duplicate",), 1)]
    assert tallied(PushResults([result("buffered")])) == [("pushed", ("buffered",), 1)]


def test_many_items_count_each_status_by_its_number() -> None:
    results = PushResults([None, None, result("duplicate"), result("failed"),
                           result("duplicate")], (QueuedRun([0, 1], 7, 1, 1),))
    assert sorted(tallied(results)) == [("pushed", ("duplicate",), 2),
                                        ("pushed", ("failed",), 1), ("pushed", ("queued",), 2)]


def test_no_metrics_counts_nothing() -> None:
    FrontWorker.count_pushed(SimpleNamespace(metrics=None),  # type: ignore[arg-type]
                             PushResults([result("queued")]))
