"""The suite's cluster CPU counts backends that came and went between two samples."""

from __future__ import annotations

import subprocess
import sys

from bench.push import CLK_TCK, reaped_ticks
from bench.suite import cluster_cpu_s

BURN = """
import os, time
pid = os.fork()
if pid == 0:
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    os._exit(0)
os.waitpid(pid, 0)
print("reaped", flush=True)
time.sleep(30)
"""


def test_a_waited_for_child_is_in_its_parents_reaped_ticks() -> None:
    parent = subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"reaped\n"
        assert reaped_ticks(parent.pid) / CLK_TCK >= 0.25
    finally:
        parent.kill()
        parent.wait()


def test_cluster_cpu_adds_what_was_reaped_and_drops_what_it_already_held() -> None:
    hz = CLK_TCK
    c0 = {"pg_live": {1: 5 * hz, 10: 2 * hz, 11: 3 * hz}, "pg_reaped": {1: 100 * hz}}
    # 10 lived on (+1 s); 11 exited after 4 s in all (1 s in the window); 12 was born and
    # reaped inside the window (7 s); 13 was born and is alive (0.5 s); the postmaster +0
    c1 = {"pg_live": {1: 5 * hz, 10: 3 * hz, 13: hz // 2}, "pg_reaped": {1: 111 * hz}}
    assert cluster_cpu_s(c0, c1) == 1 + 1 + 7 + 0.5


def test_no_reaping_is_the_live_delta() -> None:
    c0 = {"pg_live": {1: 10, 2: 20}, "pg_reaped": {1: 0}}
    c1 = {"pg_live": {1: 10, 2: 20 + CLK_TCK}, "pg_reaped": {1: 0}}
    assert cluster_cpu_s(c0, c1) == 1.0


def test_a_databases_processes_are_those_whose_title_names_it() -> None:
    """The suite's and bench.partitions' PostgreSQL figure of a database: the processes whose
    title names it, not a shared server's other sessions (nor a database whose name only
    starts alike)."""
    from bench.push import database_pids

    # each says so once it runs: before its exec a child's command line is still pytest's
    sleep = "import time; print('up', flush=True); time.sleep(30)"
    ours, other = (subprocess.Popen([sys.executable, "-c", sleep, "postgres", name, "idle"],
                                    stdout=subprocess.PIPE)
                   for name in ("queen_db_a", "queen_db_ab"))
    try:
        for p in (ours, other):
            assert p.stdout is not None and p.stdout.readline() == b"up\n"
        assert database_pids([ours.pid, other.pid, 2 ** 22 + 1], "queen_db_a") == [ours.pid]
    finally:
        for p in (ours, other):
            p.kill()
            p.communicate()
