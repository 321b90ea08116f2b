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
