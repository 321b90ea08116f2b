"""bench/suite.py's memory peak: which window set it and which process held it, so a run's
report says where the broker's peak PSS came from (issue 26)."""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bench.suite import Sampler, Suite, filter_entries

_NAMED = ("import sys, time; open('/proc/self/comm', 'w').write(sys.argv[1]); "
          "print(flush=True); time.sleep(60)")


# A broker's root of its own (the test process has other children: brokers of other tests),
# with a child named as a shard and a plain one; it grows by 64 MB on "grow", and gives that
# back on "shrink".
_ROOT = """
import subprocess, sys
named = sys.argv[1]
kids = [subprocess.Popen([sys.executable, "-c", named, n], stdout=subprocess.PIPE)
        for n in ("qmp-shard-0", "python")]
for k in kids:
    k.stdout.readline()
print(*(k.pid for k in kids), flush=True)
ballast = None
for line in sys.stdin:
    if line.strip() == "grow":
        ballast = bytearray(64 << 20)
        ballast[::4096] = b"x" * len(ballast[::4096])
    else:
        ballast = None
    print("done", flush=True)
for k in kids:
    k.kill()
"""


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """A root process with a child named as a shard and a plain one."""
    root = subprocess.Popen([sys.executable, "-c", _ROOT, _NAMED], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    shard = worker = 0
    try:
        assert root.stdout is not None
        shard, worker = map(int, root.stdout.readline().split())
        yield root, shard, worker
    finally:
        root.kill()
        root.wait()
        for pid in filter(None, (shard, worker)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _tell(root: subprocess.Popen[bytes], what: bytes) -> None:
    assert root.stdin is not None and root.stdout is not None
    root.stdin.write(what + b"\n")
    root.stdin.flush()
    assert root.stdout.readline() == b"done\n"


def test_the_sample_that_sets_the_pss_peak_keeps_each_process_share(
        tree: tuple[subprocess.Popen[bytes], int, int]) -> None:
    root, _shard, worker = tree
    sampler = Sampler(postmaster=root.pid, db="none", root=root.pid)
    procs = sampler.peak_procs
    assert set(procs) == {"supervisor", "qmp-shard-0", f"worker {worker}"}
    assert all(kb > 0 for kb in procs.values())
    assert sum(procs.values()) == sampler.peak_pss
    first = sampler.peak_pss
    _tell(root, b"grow")  # the root grows: a new peak, with its new share
    sampler.sample()
    assert sampler.peak_pss > first
    assert sampler.peak_procs["supervisor"] > procs["supervisor"] + 60_000
    peak, at_peak = sampler.peak_pss, dict(sampler.peak_procs)
    _tell(root, b"shrink")
    sampler.sample()  # lower: the peak's breakdown stays
    assert sampler.peak_pss == peak
    assert sampler.peak_procs == at_peak


def test_the_run_names_the_window_that_set_its_pss_peak() -> None:
    suite = SimpleNamespace(rss_peak=0.0, pss_peak=0.0, pss_peak_window=None,
                            pss_peak_procs={}, pss_peak_filter_entries=None)
    note = Suite.note_memory
    note(suite, 300.0, 140.0, "push batch 1000 r1 [queen-mp]", {"supervisor": 30_720})
    note(suite, 310.0, 167.2, "wake (1000 parked), from probe 3 [queen-mp]",
         {"supervisor": 28_160, "qmp-shard-0": 61_440})
    note(suite, 320.0, 150.0, "e2e r1, from probe 1 [queen-mp]", {"supervisor": 25_600})
    assert suite.rss_peak == 320.0
    assert suite.pss_peak == 167.2
    assert suite.pss_peak_window == "wake (1000 parked), from probe 3 [queen-mp]"
    assert suite.pss_peak_procs == {"qmp-shard-0": 60.0, "supervisor": 27.5}


def test_a_cell_reads_the_dedup_filters_entries_from_the_metrics() -> None:
    text = (b"# HELP queen_dedup_filter_entries entries\n"
            b"queen_dedup_filter_entries 1.8345e+06\n"
            b"queen_dedup_filter_entries_other 7\n"
            b'queen_dedup_filter_entries{pid="2"} 1000.0\n'
            b"queen_dedup_read_backs_total 3.0\n")

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics/prometheus" else 404)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert filter_entries(f"http://127.0.0.1:{server.server_port}") == 1_835_500.0
    finally:
        server.shutdown()
        server.server_close()
