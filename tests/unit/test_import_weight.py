"""Heavy libraries stay out of the processes that do not need them at idle.

Each process's start is replayed in a fresh interpreter with default settings (no ``QUEEN_*``
variable set): ``jwt`` and ``cryptography`` cost 12 MB and more of resident memory per process
and are only needed with JWT auth or an encryption key. Loading the supervisor brings no
``psycopg``: its migrations run in a short-lived child process, and psycopg comes with the
preload (queen_mp/processes/preload.py), imported once for all the children it then forks.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# What ``queen-mp serve`` does before it boots: check the JWT settings, load the supervisor;
# then what its front loads before forking workers: gunicorn's settings and worker class.
_SUPERVISOR = """
from queen_mp.auth import Verifier
from queen_mp.config import Config
import queen_mp.processes.cli, queen_mp.processes.supervisor
assert Verifier.from_config(Config.load()) is None
from queen_mp.processes.arbiter import FrontApplication
assert FrontApplication.for_config(Config.load()).cfg.worker_class.__name__ == (
    "BalancedUvicornWorker")
"""


@pytest.mark.parametrize(("start", "banned"), [
    (_SUPERVISOR, ("jwt", "cryptography", "psycopg")),
    ("import queen_mp.shards.process", ("jwt", "cryptography")),
    ("import queen_mp.http.app", ("jwt", "cryptography")),
], ids=["supervisor", "shard", "front-worker"])
def test_idle_processes_do_not_import_heavy_libraries(start, banned):
    probe = f"{start}\nimport sys\nprint(sorted({{m.split('.')[0] for m in sys.modules}}" \
            f" & {set(banned)!r}))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("value", ["/tmp/q", "/tmp/a b", "o'k", "back\\slash", "", "t\tab"])
def test_embedded_dsn_is_quoted_as_psycopg_does(value):
    # the supervisor builds the embedded cluster's DSN without psycopg's make_conninfo
    from psycopg.conninfo import make_conninfo

    from queen_mp.db.embedded import _conninfo

    params = {"host": value, "port": "5432", "user": value, "dbname": "postgres"}
    assert _conninfo(**params) == make_conninfo("", **params)
