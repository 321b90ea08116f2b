"""bench/suite.py's ratios: queen-mp over every other arm of its cell, none that divide by a
figure the arm does not have."""

from __future__ import annotations

from bench.suite import ratios


def _row(arm: str, variant: str, msgs: float, commits: float, wal: float) -> dict:
    return {"section": "push", "variant": variant, "arm": arm, "msgs_per_s": msgs,
            "p50_ms": 10.0, "p99_ms": 20.0, "cpu_broker_s": 5.0, "commits_per_s": commits,
            "wal_bytes_per_msg": wal}


def test_ratios_to_the_edge_leave_out_commits_and_wal() -> None:
    rows = [_row("queen-mp", "batch 1", 3000.0, 150.0, 650.0),
            _row("naive", "batch 1", 2500.0, 2500.0, 600.0),
            _row("edge", "batch 1", 12000.0, 0.01, 0.003),
            _row("physical", "batch 1000", 150000.0, 150.0, 460.0)]
    got = {r["vs"]: r for r in ratios(rows)}
    assert set(got) == {"naive", "edge", "physical"}
    assert got["edge"]["msgs_per_s"] == 0.25 and got["edge"]["p50_ms"] == 1.0
    assert got["edge"]["commits_per_s"] is None and got["edge"]["wal_bytes_per_msg"] is None
    assert got["naive"]["commits_per_s"] == 0.06 and got["naive"]["wal_bytes_per_msg"] == 650 / 600
    assert got["physical"]["vs_variant"] == "batch 1000"
