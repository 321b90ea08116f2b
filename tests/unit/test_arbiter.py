"""The embedded arbiter gets the front's options from ``front_argv``, the command line the
benchmark's naive broker is served with; its exits map to the statuses ``sys.exit`` gives."""

from __future__ import annotations

import subprocess
import sys

import pytest

from queen_mp.config import Config
from queen_mp.processes.arbiter import FrontApplication, exit_status


def test_the_front_application_reads_every_option_of_front_argv():
    config = Config.load(env={"QUEEN_WORKERS": "3", "QUEEN_PORT": "6711",
                              "QUEEN_HOST": "127.0.0.2", "QUEEN_SHUTDOWN_TIMEOUT_S": "17",
                              "QUEEN_LOG_LEVEL": "warning"})
    cfg = FrontApplication.for_config(config).cfg
    assert cfg.workers == 3
    assert cfg.bind == ["127.0.0.2:6711"]
    assert cfg.graceful_timeout == 17
    assert cfg.timeout == 120 and cfg.keepalive == 75
    assert cfg.loglevel == "warning"
    assert cfg.reuse_port is True
    assert cfg.proc_name == "queen-mp"
    assert cfg.worker_class.__name__ == "BalancedUvicornWorker"
    assert not cfg.preload_app  # each worker builds its app after fork


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (-1, -1),
                                               ("halting: reason", 1), (True, True)])
def test_exit_status_is_what_sys_exit_gives(code, status):
    assert exit_status(code) == status
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.exit({code!r})"],
                          capture_output=True)
    assert done.returncode == status & 0xFF
