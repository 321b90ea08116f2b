"""The supervisor's preload: the children's modules are imported once before the forks, and
nothing that may not cross a fork comes with them (no thread, no descriptor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = """
import gc, json, mimetypes, os, sys, threading
def fds():
    return sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}"))
before = fds()
from queen_mp.processes.preload import PRELOADED, preload
preload()
print(json.dumps({
    "threads": len(os.listdir("/proc/self/task")), "python_threads": threading.active_count(),
    "new_fds": sorted(set(fds()) - set(before)),
    "missing": [m for m in PRELOADED if m not in sys.modules],
    "heavy": sorted({"psycopg", "falcon", "uvicorn", "numpy", "prometheus_client"}
                    & {m.split(".")[0] for m in sys.modules}),
    "frozen": gc.get_freeze_count(),
    "warm": [mimetypes.inited,
             sys.modules["queen_mp.http.openapi"].document_bytes.cache_info().currsize],
    "static_types": len(sys.modules["falcon.response"].ResponseOptions().static_media_types),
    "system_tables": mimetypes._db is not None,
    "request_caches": sorted(c.__self__.__qualname__
                             for c in sys.modules["queen_mp.heap"].request_caches),
}))
"""


def test_preload_imports_the_children_modules_and_no_thread_or_descriptor(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("QUEEN_") and k != "OPENBLAS_NUM_THREADS"}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)  # as the supervisor sets it at boot
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    seen = json.loads(out.stdout)
    assert seen["missing"] == []
    assert seen["heavy"] == ["falcon", "numpy", "prometheus_client", "psycopg", "uvicorn"]
    # one thread (numpy's OpenBLAS pool would be a second one), no connection or file kept
    assert seen["threads"] == 1 and seen["python_threads"] == 1
    assert seen["new_fds"] == []
    assert seen["frozen"] > 10_000
    # what each front worker would otherwise read and build for itself is there already
    assert seen["warm"] == [True, 1]
    # falcon's response options copy mimetypes' built-in table, not the system's 1,500 types
    assert seen["static_types"] < 300 and seen["system_tables"] is False
    # the front workers' HeapTrim clears these (bounded lru caches), not the once-made document
    assert {"_item_template", "_one_template", "iso_from_us"} <= set(seen["request_caches"])
    assert "document_bytes" not in seen["request_caches"]
