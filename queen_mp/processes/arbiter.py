"""The front: gunicorn's arbiter run inside the supervisor process, forking the front workers.

Why in-process: a gunicorn master of its own was a second idle interpreter beside the
supervisor (28 MB of RSS for the master, 20 MB for the supervisor, neither carrying traffic).
Embedding the arbiter (gunicorn's documented custom-application pattern) keeps one of them;
the supervisor hands it ``keep_shards``, which the arbiter's loop calls on every SIGCHLD and
every turn (at least once a second), so shard supervision needs no loop of its own.

The command-line form (``front_argv``) stays the one definition of the front's gunicorn
options: the benchmark's naive broker is served by ``python -m gunicorn`` with it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from queen_mp.config import Config
from queen_mp.heap import before_fork
from queen_mp.processes.forked import exit_now

__all__ = ["FRONT_WORKER_ARGS", "FrontApplication", "FrontArbiter", "front_argv"]

log = logging.getLogger("queen_mp.front")

# The front's gunicorn worker: uvicorn's, plus a SO_REUSEPORT listener of its own so that the
# kernel spreads connections over the workers (queen_mp/processes/uvworker.py).
FRONT_WORKER_ARGS = ("--worker-class", "queen_mp.processes.uvworker.BalancedUvicornWorker",
                     "--reuse-port")


def front_argv(workers: int, bind: str, graceful_timeout_s: int, log_level: str,
               name: str) -> list[str]:
    """gunicorn options of the front (no application argument)."""
    return [*FRONT_WORKER_ARGS, "--workers", str(workers), "--bind", bind,
            "--graceful-timeout", str(graceful_timeout_s), "--timeout", "120",
            "--keep-alive", "75", "--log-level", log_level, "--name", name]


class FrontApplication(BaseApplication):  # type: ignore[misc]
    """gunicorn settings from ``front_argv``; each worker builds the app from its environment
    after fork (``queen_mp.http.app.app_from_env``), as with ``python -m gunicorn``."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        super().__init__()

    def load_config(self) -> None:
        args = self.cfg.parser().parse_args(self.argv)
        for key, value in vars(args).items():
            if value is not None and key in self.cfg.settings:
                self.cfg.set(key.lower(), value)

    def load(self) -> Any:
        from queen_mp.http.app import app_from_env

        return app_from_env()

    @classmethod
    def for_config(cls, config: Config) -> FrontApplication:
        return cls(front_argv(config.workers, f"{config.host}:{config.port}",
                              config.shutdown_timeout_s, config.log_level, "queen-mp"))


class FrontArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's arbiter that also runs ``keep_shards`` and stops gracefully on every stop
    signal.

    ``keep_shards`` reaps its own children (``Popen.poll``) before gunicorn's
    ``waitpid(-1)`` runs; a shard dying in between is reaped by gunicorn, which logs it as a
    worker and ignores it, and ``poll`` then reports it dead with status 0: it is restarted
    all the same. To stop the server it raises gunicorn's ``HaltServer``, so the arbiter
    stops its workers first.
    """

    def __init__(self, app: FrontApplication, keep_shards: Callable[[], None]) -> None:
        self.keep_shards = keep_shards
        super().__init__(app)

    def spawn_worker(self) -> int:
        """gunicorn's fork, with the child's exit kept out of the supervisor's code.

        gunicorn's child leaves ``spawn_worker`` by ``SystemExit``; in-process, that would
        unwind through ``Supervisor.run`` and its ``finally: halt()``, so a worker ending on
        its own (a reload, a graceful stop, a failed boot) would stop the shards, unlink the
        shared memory and remove the metrics directory of the broker it belongs to.

        What the arbiter made since the preload is frozen first, as before a shard's fork
        (``ForkedChild.start``): the worker's collections leave those pages shared; and the
        free blocks of its pymalloc pools are filled (``seal_free_blocks``) and the small free
        chunks of its C heap taken (``seal_free_chunks``).
        """
        before_fork()
        arbiter = os.getpid()
        try:
            return int(super().spawn_worker())
        except BaseException as ex:
            if os.getpid() == arbiter:
                raise
            exit_now(ex.code if isinstance(ex, SystemExit) else 1)

    def reap_workers(self) -> None:
        self.keep_shards()
        super().reap_workers()

    def murder_workers(self) -> None:
        super().murder_workers()
        self.keep_shards()

    def handle_int(self) -> None:
        """Ctrl-C stops as SIGTERM does: in-flight requests finish (gunicorn's is quick)."""
        self.handle_term()

    handle_quit = handle_int

    def handle_usr2(self) -> None:
        """No re-exec: a second supervisor would boot its own shards and shared memory."""
        log.warning("SIGUSR2 ignored: restart the service to upgrade it")

    def handle_ttin(self) -> None:
        """The worker count is fixed: the slot table is sized for it at boot."""
        log.warning("SIGTTIN/SIGTTOU ignored: the worker count is QUEEN_WORKERS")

    handle_ttou = handle_ttin
