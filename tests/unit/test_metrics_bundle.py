"""``Metrics.bundle_committed`` (queen_mp/metrics.py) writes a push bundle's figures into the
process's multiprocess samples directly: the scrape must read what the client's own
``inc``/``observe`` would have left, in multiprocess mode and without it."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import os, sys
if sys.argv[2] == "multiprocess":
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from queen_mp.metrics import Metrics, render_latest
bundles = [(1, 1), (3, 5), (20, 20), (2, 300), (64, 9000), (1, 0)]
fast, slow = Metrics("fast"), Metrics("slow")
for segments, frames in bundles:
    fast.bundle_committed(segments, frames)
if sys.argv[2] == "multiprocess":
    text = render_latest(sys.argv[1]).decode()
    want = {"queen_fusion_commits_total": 6.0, "queen_fusion_segments_total": 91.0,
            "queen_batch_items_fired_total": 9326.0, "queen_fusion_items_per_batch_sum": 9326.0,
            'queen_fusion_items_per_batch_bucket{le="1.0"}': 2.0,
            'queen_fusion_items_per_batch_bucket{le="8.0"}': 3.0,
            'queen_fusion_items_per_batch_bucket{le="16384.0"}': 6.0,
            "queen_fusion_items_per_batch_count": 6.0}
    got = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
           for line in text.splitlines() if line and not line.startswith("#")}
    for name, value in want.items():
        assert got.get(name) == value, (name, got.get(name), value)
else:  # the client's own calls, the same figures
    for segments, frames in bundles:
        slow.fusion_commits.inc()
        slow.fusion_segments.inc(segments)
        slow.batch_items_fired.inc(frames)
        slow.fusion_items_per_batch.observe(frames)
    def samples(m):
        return sorted((s.name, sorted(s.labels.items()), s.value)
                      for metric in (m.fusion_commits, m.fusion_segments, m.batch_items_fired,
                                     m.fusion_items_per_batch)
                      for fam in metric.collect() for s in fam.samples
                      if not s.name.endswith("_created"))
    assert samples(fast) == samples(slow)
"""


def test_a_bundles_figures_reach_the_multiprocess_samples(tmp_path):
    subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path), "multiprocess"], check=True,
                   timeout=60)


def test_without_multiprocess_mode_they_go_through_the_client(tmp_path):
    subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path), "single"], check=True,
                   timeout=60)
