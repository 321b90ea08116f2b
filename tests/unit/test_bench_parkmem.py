"""bench/parkmem.py's two instruments: the per-process memory sample, and the diagnostics a
forked child of the broker takes when asked (its sitecustomize: tracemalloc and gc counts)."""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import pickle
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from bench.parkmem import Diag, big_mappings, sample

# a "supervisor" that forks one child, which lives until told to go
_FORKER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    keep = [[i] for i in range(1000)]
    time.sleep(30)
    os._exit(0)
print(pid, flush=True)
os.waitpid(pid, 0)
"""


def test_sample_names_the_root_and_reads_its_memory():
    mem = sample(os.getpid())
    me = mem["supervisor"]
    assert me["Pss"] > 0 and me["Rss"] >= me["Private_Dirty"] > 0
    assert me["Rss"] >= me["Private_Clean"] >= 0  # USS is Private_Clean + Private_Dirty


def test_a_forked_child_dumps_its_snapshot_and_counts_when_asked(tmp_path: Path):
    diag = Diag(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(diag.site), os.environ.get(
        "PYTHONPATH", ""))), "PARKMEM_DIAG": str(tmp_path)}
    child = 0
    root = subprocess.Popen([sys.executable, "-c", _FORKER], env=env, stdout=subprocess.PIPE)
    try:
        assert root.stdout is not None
        child = int(root.stdout.readline())
        time.sleep(0.5)  # the child's watcher is up
        asyncio.run(asyncio.wait_for(diag.ask("t", [child]), 20))
        counts = json.loads((tmp_path / f"{child}-t.json").read_text())
        assert counts["list"] >= 1000
        with open(tmp_path / f"{child}-t.tm", "rb") as f:
            assert isinstance(pickle.load(f), tracemalloc.Snapshot)
        assert not list(tmp_path.glob(f"{root.pid}-*"))  # the root is not traced
        # glibc's heap beside pymalloc's arenas (mallinfo2): bytes in use and free
        assert "glibc heap" in diag.arenas(child, "t")
    finally:
        if child:
            os.kill(child, 9)
        root.kill()
        root.wait()


def test_big_mappings_lists_the_private_dirty_ones_of_a_process():
    with mmap.mmap(-1, 4 << 20) as held:  # an anonymous mapping of its own, all written
        held.write(b"x" * (4 << 20))
        rows = big_mappings(os.getpid(), min_kb=2048)
    # rows read "<size>k/<private dirty>k <name>"
    assert any(r.endswith("[anon]") and int(r.split("/")[1].split("k")[0]) >= 4096
               for r in rows), rows


def test_arenas_reads_a_childs_debugmallocstats(tmp_path: Path):
    diag = Diag(tmp_path)
    err = subprocess.run([sys.executable, "-c", "import sys; sys._debugmallocstats()"],
                         capture_output=True, text=True, env={**os.environ,
                                                              "PYTHONMALLOC": "pymalloc"})
    (tmp_path / "7-t.arenas").write_text(err.stderr)
    line = diag.arenas(7, "t")
    arenas = int(line.split()[0])
    assert arenas > 0 and "live blocks" in line and "empty pools" in line
    # without glibc's lines (another C library) its figures read 0
    assert "glibc heap 0.0 MB" in line
