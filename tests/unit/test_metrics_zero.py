"""The metric families nothing may leave blank (issue 28): known label values exist at zero
as soon as a process builds its metrics, the per-queue gauges read from shard 0's snapshot show
their "(other)" series before it exists and drop what it no longer holds, and the database
events reach the right counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from queen_mp.db import errors as dberrors
from queen_mp.metrics import (
    FUSION_ERROR_REASONS,
    OTHER_QUEUES_LABEL,
    QUEUE_GAUGES,
    QUEUE_SNAPSHOT,
    Metrics,
    QueueGaugeCollector,
    write_queue_snapshot,
)


def samples(collector: QueueGaugeCollector) -> dict[str, dict[tuple[str, ...], float]]:
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for family in collector.collect():
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(s.labels.values())] = s.value
    return out


def test_fusion_error_reasons_are_the_database_error_classes():
    # fusion labels a failed bundle by its exception's class name (shards/fusion.py)
    for name in FUSION_ERROR_REASONS:
        assert issubclass(getattr(dberrors, name), dberrors.DatabaseError), name
    assert "StatementTimeout" in FUSION_ERROR_REASONS and "Unavailable" in FUSION_ERROR_REASONS


def test_before_any_snapshot_every_queue_family_shows_its_other_series_at_zero(tmp_path):
    got = samples(QueueGaugeCollector(str(tmp_path)))
    for name, (_, labels) in QUEUE_GAUGES.items():
        assert got[name] == {(OTHER_QUEUES_LABEL,) * len(labels): 0.0}, name
    assert got["queen_queue_gauges_timestamp_seconds"] == {(): 0.0}


def test_a_snapshot_replaces_the_previous_one_whole(tmp_path):
    d = str(tmp_path)
    write_queue_snapshot(d, [("queen_queue_depth", "orders", None, 7.0),
                             ("queen_consumer_lag_seconds", "orders", "billing", 12.5),
                             ("queen_dlq_depth", "orders", None, 2.0)], 1000.0)
    got = samples(QueueGaugeCollector(d))
    assert got["queen_queue_depth"] == {("orders",): 7.0, (OTHER_QUEUES_LABEL,): 0.0}
    assert got["queen_consumer_lag_seconds"][("orders", "billing")] == 12.5
    assert got["queen_queue_gauges_timestamp_seconds"] == {(): 1000.0}
    # the queue went away: its series goes with it (no child left behind at zero)
    write_queue_snapshot(d, [("queen_queue_depth", OTHER_QUEUES_LABEL, None, 3.0)], 1015.0)
    got = samples(QueueGaugeCollector(d))
    assert got["queen_queue_depth"] == {(OTHER_QUEUES_LABEL,): 3.0}
    assert got["queen_dlq_depth"] == {(OTHER_QUEUES_LABEL,): 0.0}
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")]


def test_a_torn_or_foreign_snapshot_reads_as_none(tmp_path):
    (tmp_path / QUEUE_SNAPSHOT).write_text('{"at": 5, "rows": [["queen_queue_depth", "a"')
    assert samples(QueueGaugeCollector(str(tmp_path)))["queen_queue_depth"] == {
        (OTHER_QUEUES_LABEL,): 0.0}
    (tmp_path / QUEUE_SNAPSHOT).write_text(json.dumps({"at": 5, "rows": [
        ["queen_unknown", "a", None, 1], ["queen_queue_depth", "a", "extra-label", 1],
        ["queen_queue_depth", "b", None, 4]]}))
    got = samples(QueueGaugeCollector(str(tmp_path)))
    assert got["queen_queue_depth"] == {("b",): 4.0, (OTHER_QUEUES_LABEL,): 0.0}
    assert "queen_unknown" not in got


def test_database_events_reach_their_counters():
    m = Metrics("t")  # no running loop: the tally writes at once
    m.db_event("statement_timeout")
    m.db_event("quarantine")
    m.db_event("cancel_sent")
    m.db_event("cancel_failed")
    m.db_event("cancel_failed")
    assert m.pg_statement_timeouts._value.get() == 1
    assert m.pg_quarantines._value.get() == 1
    assert m.pg_cancels.labels("sent")._value.get() == 1
    assert m.pg_cancels.labels("failed")._value.get() == 2


def test_a_fresh_process_writes_its_labelled_children_at_zero(tmp_path):
    """In multiprocess mode (as the broker runs) the zero children are in the process's
    file, so the scrape shows them before anything happened."""
    code = textwrap.dedent("""
        from queen_mp.metrics import Metrics, render_latest
        Metrics("fresh")
        print(render_latest().decode())
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    text = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True, timeout=60).stdout
    for line in ('queen_ack_registry_lookups_total{result="hit"} 0.0',
                 'queen_dedup_read_backs_total{result="ok"} 0.0',
                 'queen_fusion_bundle_errors_total{reason="Unavailable"} 0.0',
                 'queen_admission_rejected_total{code="storage_full"} 0.0',
                 'queen_pg_cancels_total{result="sent"} 0.0',
                 'queen_dlq_depth{queue="(other)"} 0.0',
                 'queen_http_requests_total{route="/metrics/prometheus",status="200"} 0.0',
                 'queen_http_request_duration_seconds_count{route="/metrics/prometheus"} 0.0'):
        assert line in text, line
