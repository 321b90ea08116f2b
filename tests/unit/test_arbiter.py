"""The embedded arbiter gets the front's options from ``front_argv``, the command line the
benchmark's naive broker is served with."""

from __future__ import annotations

from queen_mp.config import Config
from queen_mp.processes.arbiter import FrontApplication


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

