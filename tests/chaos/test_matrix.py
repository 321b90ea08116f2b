"""The reduced fault matrix of `make test` (issue 29): one round of faults 1, 2, 3 and 8 at a
small load, each judged by the per-message ledger; `make chaos` runs the full matrix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.matrix import QUICK, Rig, rig, run_fault


@pytest.fixture(scope="module")
def chaos_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with rig(Path(tmp_path_factory.mktemp("chaos"))) as r:
        yield r


@pytest.mark.parametrize("fault", QUICK)
def test_nothing_is_lost_or_delivered_twice(chaos_rig: Rig, fault: str) -> None:
    row = run_fault(chaos_rig, fault)
    v = row.verdict
    print(f"\n{fault}: {v.summary()}; recovery {row.recovery_s}")
    assert v.accepted > 0, v.summary()
    assert all(g.delivered > 0 for g in v.groups), v.summary()
    assert v.ok, v.summary()
    assert v.unanswered == 0, v.summary()
    if fault == "sigterm":  # a graceful stop answers every push in flight
        assert "push" not in v.cut, v.summary()

