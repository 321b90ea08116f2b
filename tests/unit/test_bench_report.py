"""bench/report.py on a small hand-made suite document: every arm, section and target reaches
the markdown, the plots are written, and missing data is skipped instead of failing a run."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

from bench import report

ARMS = {"push": ["queen-mp", "queen-mp-qpb1", "naive", "pgmq", "edge"],
        "consume": ["queen-mp", "naive", "pgmq", "edge"],
        "e2e": ["queen-mp", "naive", "pgmq"], "wake": ["queen-mp"], "mixed": ["queen-mp"]}
VARIANTS = {"push": ["batch 1", "batch 1000"], "consume": ["batch 100"], "e2e": ["1000/s"],
            "wake": ["1000 parked"], "mixed": ["1 consumers", "4 consumers"]}


def row(section: str, variant: str, arm: str, rate: float | None, **kw) -> dict:
    return {"section": section, "variant": variant, "arm": arm, "rounds": 2,
            "msgs_per_s": rate, "p50_ms": 3.14159, "p99_ms": 12.5, "wal_bytes_per_msg": 2345.0,
            "commits_per_s": 1234.5, "cpu_broker_s": None, "errors": 0, **kw}


def make_doc() -> dict:
    rows = [row(s, v, a, None if s in ("e2e", "wake") else 1000.0 * (i + 1) * (j + 1))
            for s, vs in VARIANTS.items() for j, v in enumerate(vs)
            for i, a in enumerate(ARMS[s])]
    rows.append(row("push", "batch 1000", "physical", 250_000.0))
    ratios = [{"section": "push", "variant": "batch 1", "arm": "queen-mp", "vs": "physical",
               "vs_variant": "batch 1000", "msgs_per_s": 0.004, "p50_ms": None,
               "p99_ms": None, "cpu_broker_s": None, "commits_per_s": 3.0,
               "wal_bytes_per_msg": 0.5},
              {"section": "consume", "variant": "batch 100", "arm": "queen-mp", "vs": "pgmq",
               "vs_variant": "batch 100", "msgs_per_s": 2.5, "p50_ms": 0.8, "p99_ms": 1.1,
               "cpu_broker_s": None, "commits_per_s": None, "wal_bytes_per_msg": None}]
    targets = [{"target": "push 1-item JSON vs naive (x)", "value": 3.456, "threshold": 3.0,
                "op": ">=", "met": True, "edge_ceiling": 4.567},
               {"target": "e2e p99 at 1,000 msg/s (ms)", "value": 25.0, "threshold": 20.0,
                "op": "<", "met": False},
               {"target": "peak RSS of all broker processes (MB)", "value": None,
                "threshold": 300.0, "op": "<", "met": None}]
    cells = [{**r, "round": k} for r in rows for k in (1, 2)]
    rnd = random.Random(7)
    group = {"expected": 1000, "consumed": 998, "loss": 2, "duplicates": 0, "redelivered": 1,
             "id_mismatch": 0, "phantom": 0, "extra_unknown": 0, "ok": False,
             "examples": {"loss": [{"producer": "p1", "seq": 17}]}}
    return {
        "command": "python -m bench.suite --quick", "started_at": "2026-12-01T10:00:00+00:00",
        "elapsed_s": 321.0, "status": "ok", "failure": None,
        "machine": {"nproc": 2, "cpu_model": "AMD EPYC", "python": "3.11.7",
                    "postgres_version": "15.20", "postgres_settings": {"fsync": "on"},
                    "git_commit": "abc123", "loadavg_at_start": [0.5, 0.25, 0.1]},
        "pgmq_sql_version": "1.13.0", "settings": {"rounds": 2},
        "idle_commits_per_s": {"queen-mp": 2.0, "naive": 0.0},
        "summary": {"rows": rows, "ratios": ratios, "targets": targets},
        "cells": cells,
        "ledger": {"push": {"ok": False, "verdict": "ZERO-LOSS CHECK FAILED", "groups": {
            "ledger": group}, "offsets": {"ok": True, "verdict": "OFFSETS CHECK PASSED"}}},
        "ledger_ok": False,
        "e2e_samples_ms": {a: [rnd.lognormvariate(1.5, 0.6) for _ in range(500)] + [0.0, -0.2]
                           for a in ARMS["e2e"]},
        "wake_samples_ms": [rnd.uniform(1, 40) for _ in range(300)],
        "rss_peak_mb": 180.0, "pss_peak_mb": 120.0, "notes": ["a note for the reader"],
        "logs": {"queen-mp": {"warning_or_error_lines": 3, "exit_code": 0,
                              "distinct": [{"count": 3, "line": "WARNING slow commit"}]}},
    }


def test_render_has_every_part_and_writes_plots(tmp_path: Path) -> None:
    doc = make_doc()
    before = copy.deepcopy(doc)
    text = report.render(doc, tmp_path / "suite-x")
    assert doc == before  # the suite dumps nothing else, but the document stays untouched
    for arm in report.ARM_ORDER:
        assert f"| {arm} |" in text
    for section in VARIANTS:
        assert f"### {section}" in text
    for t in doc["summary"]["targets"]:
        assert t["target"] in text
    assert "**MET**" in text and "**MISSED**" in text and "not measured" in text
    assert "| edge ceiling |" in text and "| 4.57x |" in text
    assert text.index("## Targets") < text.index("## Results")
    assert "queen-mp / physical (batch 1000)" in text and "0.004x" in text and "2.50x" in text
    assert "| 250,000 |" in text and "| 3.1 |" in text and "2.3 kB" in text
    assert "**FAILED**" in text and '"seq": 17' in text  # failed ledger shows examples
    assert "## Every round" in text and "a note for the reader" in text
    for name in report.PLOTS:
        png = tmp_path / "suite-x" / name
        assert png.stat().st_size > 10_000, name
        assert f"(suite-x/{name})" in text


def test_write_docs_links_plots_relative(tmp_path: Path) -> None:
    md = tmp_path / "docs" / "benchmarks.md"
    md.parent.mkdir()
    report.write_docs(make_doc(), md)
    text = md.read_text()
    assert "`.venv/bin/python -m bench.suite --quick`" in text
    assert "2026-12-01T10:00:00+00:00" in text and "1.13.0" in text and "15.20" in text
    assert "## Every round" not in text
    for name in report.PLOTS:
        assert (tmp_path / "docs" / "benchmarks" / name).stat().st_size > 10_000
        assert f"(benchmarks/{name})" in text


@pytest.mark.parametrize("drop", ["e2e_samples_ms", "wake_samples_ms", "summary"])
def test_missing_data_skips_plots(tmp_path: Path, drop: str) -> None:
    doc = make_doc()
    doc[drop] = None
    doc["ledger"], doc["status"], doc["failure"] = {}, "interrupted", "SIGINT"
    text = report.render(doc, tmp_path)
    assert "status **interrupted**: SIGINT" in text and "No zero-loss ledger" in text
    skipped = {"e2e_samples_ms": ["e2e-latency-cdf.png"],
               "wake_samples_ms": ["wake-latency-cdf.png"],
               "summary": ["push-throughput.png", "consume-throughput.png"]}[drop]
    for name in report.PLOTS:
        assert (tmp_path / name).exists() == (name not in skipped), name
    assert "failed" not in text


def test_the_edge_ceiling_column_appears_only_when_the_edge_ran(tmp_path: Path) -> None:
    doc = make_doc()
    for t in doc["summary"]["targets"]:
        t.pop("edge_ceiling", None)
    text = report.render(doc, tmp_path)
    assert "edge ceiling" not in text
    assert "| push 1-item JSON vs naive (x) | **MET** | 3.46x | >= 3.00x |" in text
