"""Multiprocess metric values use a cached process id (queen_mp/metrics.py): a forked child
must still write its own file, never the parent's."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from queen_mp.metrics import Metrics, render_latest
from prometheus_client import values
m = Metrics("parent")
assert values.ValueClass.queen_cached_pid
m.messages_popped.inc(3)
child = os.fork()
if child == 0:
    m.messages_popped.inc(5)  # the values notice the fork and move to the child's file
    os._exit(0)
os.waitpid(child, 0)
m.messages_popped.inc(1)
files = sorted(f for f in os.listdir(sys.argv[1]) if f.startswith("counter_"))
assert files == sorted([f"counter_{os.getpid()}.db", f"counter_{child}.db"]), files
text = render_latest(sys.argv[1]).decode()
assert "queen_messages_popped_total 9.0" in text.splitlines(), text
"""


def test_a_forked_child_writes_its_own_file_with_the_cached_pid(tmp_path):
    subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], check=True, timeout=60)


_BUNDLES = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from queen_mp.metrics import Metrics, render_latest
m = Metrics("bundles")
m.push_bundle(2, 3)
m.batch_items_fired.inc(100)  # a public update between two of push_bundle's stays counted
m.push_bundle(1, 20000)
child = os.fork()
if child == 0:
    m.push_bundle(5, 7)  # written to the child's own file, not the parent's
    os._exit(0)
os.waitpid(child, 0)
m.push_bundle(1, 1)
lines = set(render_latest(sys.argv[1]).decode().splitlines())
want = {"queen_fusion_commits_total 4.0", "queen_fusion_segments_total 9.0",
        "queen_batch_items_fired_total 20111.0", "queen_fusion_items_per_batch_sum 20011.0",
        'queen_fusion_items_per_batch_bucket{le="1.0"} 1.0',
        'queen_fusion_items_per_batch_bucket{le="4.0"} 2.0',
        'queen_fusion_items_per_batch_bucket{le="8.0"} 3.0',
        'queen_fusion_items_per_batch_bucket{le="16384.0"} 3.0',
        'queen_fusion_items_per_batch_bucket{le="+Inf"} 4.0',
        "queen_fusion_items_per_batch_count 4.0"}
assert want <= lines, sorted(want - lines)
files = sorted(f for f in os.listdir(sys.argv[1]) if f.startswith("counter_"))
assert files == sorted([f"counter_{os.getpid()}.db", f"counter_{child}.db"]), files
"""


def test_push_bundle_writes_the_samples_of_its_own_process(tmp_path):
    """``Metrics.push_bundle`` writes its samples into the process's file itself: what a
    scrape reads adds up with the public updates, and a forked child writes its own file."""
    subprocess.run([sys.executable, "-c", _BUNDLES, str(tmp_path)], check=True, timeout=60)
