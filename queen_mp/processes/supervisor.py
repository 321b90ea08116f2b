"""``queen-mp serve``: the supervisor process.

Boot order: settings -> embedded PostgreSQL when no DSN -> migrations (in a child process, so
that no connection, nor any libpq state it leaves, is ever made in the process that forks) ->
shared memory -> preload (queen_mp/processes/preload.py: the children's modules, imported once
here and shared by every fork) -> the front's arbiter, made -> shard processes, forked
(queen_mp/processes/forked.py) -> the front: gunicorn's arbiter, run in this process
(queen_mp/processes/arbiter.py), forks the front workers. Stop order is the reverse, so that
nothing accepted is lost: the arbiter stops accepting and lets in-flight requests finish, then
shards flush and exit, then shared memory is unlinked and the embedded cluster stopped.

During the boot, as in gunicorn's arbiter, signal handlers only enqueue the signal number;
the arbiter's own handlers take over when the front starts, and its loop calls
``keep_shards``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gunicorn.errors import HaltServer as FrontHalt

from queen_mp import keyring
from queen_mp.config import Config
from queen_mp.db.embedded import EmbeddedPostgres
from queen_mp.heap import fix_mmap_threshold
from queen_mp.ipc import layout
from queen_mp.ipc.heartbeat import HeartbeatBoard
from queen_mp.metrics import Metrics
from queen_mp.processes.forked import ForkedChild, exit_status
from queen_mp.processes.preload import preload
from queen_mp.runtime import Runtime

if TYPE_CHECKING:
    from queen_mp.processes.arbiter import FrontArbiter

__all__ = ["EXIT_BOOT_ERROR", "EXIT_OK", "HaltServer", "Supervisor", "sql_dir"]

log = logging.getLogger("queen_mp.supervisor")

EXIT_OK = 0
EXIT_BOOT_ERROR = 3       # a child failed before it ever served: restarting would loop

SHARD_BOOT_GRACE_S = 15.0   # a shard that has not beaten by then is murdered
SHARD_STALE_S = 10.0        # a booted shard silent this long is murdered
SHARD_FAST_FAILS = 5        # consecutive deaths within SHARD_MIN_LIFE_S halt the server
SHARD_MIN_LIFE_S = 2.0


class HaltServer(BaseException):
    """Stop the supervisor with a reason and an exit code; not swallowable by ``except
    Exception``."""

    def __init__(self, reason: str, exit_status: int = EXIT_BOOT_ERROR) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_status = exit_status


def sql_dir() -> Path:
    """The SQL tree shipped in the package (``queen_mp/sql``: a checkout or an installed
    wheel alike), read by the migration child."""
    return Path(str(resources.files("queen_mp") / "sql"))


@dataclass
class ShardProc:
    index: int
    proc: ForkedChild | None = None
    started: float = 0.0
    fast_fails: int = 0


@dataclass
class Supervisor:
    config: Config
    signals: queue.SimpleQueue[int] = field(default_factory=queue.SimpleQueue)
    runtime: Runtime | None = None
    embedded: EmbeddedPostgres | None = None
    shards: list[ShardProc] = field(default_factory=list)
    board: HeartbeatBoard | None = None
    stopping: bool = False
    front: FrontArbiter | None = None  # made by ``boot``, run by ``serve_front``
    _metrics: Metrics | None = None

    # ------------------------------------------------------------------ signals
    def signal(self, sig: int, frame: FrameType | None) -> None:
        """NO LOGGING here: only enqueue; ``run`` does the work once the boot is over."""
        self.signals.put(sig)

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, self.signal)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        self.install_signals()
        try:
            self.boot()
            while not self.signals.empty():  # what came during the boot
                name = signal.Signals(self.signals.get()).name.lower()
                getattr(self, f"handle_{name}")()
            if self.stopping:
                return EXIT_OK
            log.info("queen-mp serving on http://%s:%d (%d workers, %d shards)",
                     self.config.host, self.config.port, self.config.workers,
                     self.config.v2_fusion_shards)
            return self.serve_front()
        except HaltServer as halt:
            log.error("halting: %s", halt.reason)
            return halt.exit_status
        finally:
            self.halt()

    def boot(self) -> None:
        cfg = self.config
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        for line in cfg.describe():
            log.info("config %s=%s", *line)
        boot_keys = self.plan_keys()
        metrics_dir = cfg.data_path / f"metrics-{os.getpid()}"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        # NOTE(queen): before anything in this process or its children imports prometheus_client.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        if not cfg.pg_dsn:
            self.embedded = EmbeddedPostgres(cfg.embedded_pg_path, port=cfg.embedded_pg_port,
                                             log=log)
            dsn = self.embedded.start()
            log.info("embedded PostgreSQL running in %s", cfg.embedded_pg_path)
            cfg = self.config = cfg.replace(pg_dsn=dsn)
        applied, registration = self.migrate(boot_keys)
        log.info("migrations: %s", ", ".join(applied) if applied else "up to date")
        self.settle_keys(boot_keys, registration)
        self.runtime = Runtime.new(slots=cfg.workers * 2, shards=cfg.v2_fusion_shards,
                                   ring_bytes=cfg.ring_kb * 1024, metrics_dir=str(metrics_dir))
        layout.create_all(self.runtime)
        # Children read the resolved settings and the instance facts from the environment:
        # shards inherit it at spawn, front workers at fork.
        os.environ.update(cfg.to_env())
        os.environ.update(self.runtime.to_env())
        fix_mmap_threshold(cfg.malloc_mmap_threshold_kb)
        preload()
        self.board = HeartbeatBoard.attach(self.runtime.heartbeat, self.runtime.shards)
        # PERF(memory): the front's arbiter made before the shards fork, not after: a page
        # the supervisor writes between a shard's fork and the front workers' is the shard's
        # alone from then on, in its old version. Made after, gunicorn's settings, parser and
        # logger left a shard 1.6 MB more Private_Dirty (bench/parkmem.py, at rest: 14.7-14.8
        # -> 13.1-13.2 MB).
        from queen_mp.processes.arbiter import FrontApplication, FrontArbiter

        self.front = FrontArbiter(FrontApplication.for_config(cfg), self.keep_shards)
        self.shards = [ShardProc(i) for i in range(self.runtime.shards)]
        for shard in self.shards:
            self.spawn_shard(shard)

    def migrate(self, boot_keys: keyring.BootKeys | None = None
                ) -> tuple[list[str], keyring.Registration]:
        """Apply queen_mp/sql in a child process (queen_mp.db.migrations.main) and return what it
        applied, with the database's answer to this instance's keys (queen_mp/db/key_procs.py):
        the connections it makes, and whatever libpq keeps of them, end with it, and never exist
        in the process that forks the shards and the front workers."""
        request = ""
        if boot_keys is not None:
            ring = boot_keys.ring
            request = "\n" + json.dumps({"instance": self.config.instance_name,
                                          "create": boot_keys.source == "new",
                                          "keys": ring.facts() if ring is not None else []})
        # NOTE(queen): own process group, like the shards: a terminal's Ctrl-C must not kill a
        # migration halfway; the supervisor stops after it, as when migrating in-process.
        done = subprocess.run([sys.executable, "-m", "queen_mp.db.migrations", str(sql_dir()),
                               self.config.log_level], input=self.config.pg_dsn + request,
                              text=True, stdout=subprocess.PIPE, process_group=0, check=False)
        if done.returncode != 0:
            reason = done.stdout.strip() or f"the migration process exited with {done.returncode}"
            raise HaltServer(f"migrations failed: {reason}")
        applied, registration = [], keyring.Registration(False, ())
        for line in done.stdout.splitlines():
            if line.startswith("keys "):
                registration = keyring.Registration.from_json(json.loads(line[5:]))
            else:
                applied.append(line)
        return applied, registration

    def plan_keys(self) -> keyring.BootKeys:
        """The payload keys (queen_mp/keyring.py); a key file that exists but cannot be used
        halts the boot with its reason (a restart would not fix it)."""
        try:
            return keyring.plan_boot(self.config)
        except keyring.KeyFileError as ex:
            raise HaltServer(f"encryption key file unusable: {ex}") from ex

    def settle_keys(self, boot_keys: keyring.BootKeys,
                    registration: keyring.Registration) -> None:
        """Write a new key file if the database agreed, say what disagrees, and hand the ring to
        the children (they are forks: ``keyring.for_process``)."""
        verdict = keyring.review(boot_keys, registration, self.config.instance_name)
        for text in verdict.errors:
            log.error("%s", text)
        for text in verdict.warnings:
            log.warning("%s", text)
        ring = verdict.ring
        if verdict.write_file and ring is not None:
            try:
                keyring.write_key_file(boot_keys.path, ring, exclusive=True)
            except OSError as ex:
                raise HaltServer(f"cannot create the encryption key file {boot_keys.path}: "
                                 f"{ex}") from ex
            log.warning("encryption: created key file %s (mode 0600) with a random key, id %s. "
                        "Back it up and keep it secret: losing it loses every payload encrypted "
                        "with it", boot_keys.path, ring.current)
        elif ring is not None:
            log.info("encryption: %d key(s) from %s, current %s", len(ring.keys),
                     "QUEEN_ENCRYPTION_KEY" if boot_keys.source == "env" else boot_keys.path,
                     ring.current)
        else:
            log.info("encryption: no key; queues with encryptionEnabled are refused")
        keyring.install(ring)

    def spawn_shard(self, shard: ShardProc) -> None:
        """Fork a shard (in its own process group, so a terminal's Ctrl-C reaches only the
        supervisor, which then stops the children gracefully and in order)."""
        from queen_mp.shards.process import main as shard_main

        shard.proc = ForkedChild.start(partial(shard_main, shard.index),
                                       name=f"qmp-shard-{shard.index}")
        shard.started = time.monotonic()
        log.info("shard %d started (pid %d)", shard.index, shard.proc.pid)

    def serve_front(self) -> int:
        """Run gunicorn's arbiter here until it stops (it has stopped its workers then); its
        exit status."""
        assert self.front is not None  # made by ``boot``
        try:
            self.front.run()
        except SystemExit as done:  # the arbiter always leaves by sys.exit
            return exit_status(done.code)
        return EXIT_OK

    # ------------------------------------------------------------------ handlers
    def handle_sigterm(self) -> None:
        log.info("SIGTERM: graceful stop")
        self.stopping = True

    handle_sigint = handle_sigterm
    handle_sigquit = handle_sigterm

    def handle_sigchld(self) -> None:
        self.reap()

    # ------------------------------------------------------------------ verbs
    def _restarts(self) -> Any:
        """The shard restart counter (made on first use: after PROMETHEUS_MULTIPROC_DIR)."""
        if self._metrics is None:
            self._metrics = Metrics(self.config.instance_name)
        return self._metrics.shard_restarts

    def keep_shards(self) -> None:
        """The arbiter's hook: restart dead shards, kill silent ones. A halt becomes
        gunicorn's, so that the arbiter stops its workers before ``halt`` stops the shards."""
        try:
            self.reap()
            self.murder_shards()
        except HaltServer as halt:
            raise FrontHalt(halt.reason, halt.exit_status) from halt

    def reap(self) -> None:
        """Restart dead shards."""
        from queen_mp.metrics import mark_process_dead

        for shard in self.shards:
            if shard.proc is None or shard.proc.poll() is None:
                continue
            code = shard.proc.returncode
            mark_process_dead(shard.proc.pid)
            if self.board is not None:
                self.board.clear(shard.index)
            if self.stopping:
                continue
            lived = time.monotonic() - shard.started
            shard.fast_fails = shard.fast_fails + 1 if lived < SHARD_MIN_LIFE_S else 0
            if shard.fast_fails >= SHARD_FAST_FAILS:
                raise HaltServer(f"shard {shard.index} keeps dying at boot (exit {code})")
            log.warning("shard %d (pid %d) exited with %s after %.1fs; restarting",
                        shard.index, shard.proc.pid, code, lived)
            self._restarts().inc()
            self.spawn_shard(shard)

    def murder_shards(self) -> None:
        """SIGKILL shards that stopped beating; ``reap`` then restarts them."""
        if self.board is None or self.stopping:
            return
        now = time.monotonic()
        for shard in self.shards:
            if shard.proc is None or shard.proc.poll() is not None:
                continue
            age = self.board.age_ms(shard.index)
            silent = (age is None and now - shard.started > SHARD_BOOT_GRACE_S) or (
                age is not None and age > SHARD_STALE_S * 1000)
            if silent:
                log.error("shard %d (pid %d) stopped beating; killing it", shard.index,
                          shard.proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    shard.proc.kill()

    def halt(self) -> None:
        """Reverse boot order; every step runs even if an earlier one failed."""
        self.stopping = True
        budget = self.config.shutdown_timeout_s
        for shard in self.shards:
            if shard.proc is not None:
                _stop(shard.proc, budget, f"shard {shard.index}")
        if self.board is not None:
            self.board.close()
        if self.runtime is not None:
            layout.unlink_all(self.runtime)
            shutil.rmtree(self.runtime.metrics_dir, ignore_errors=True)
        if self.embedded is not None:
            try:
                self.embedded.stop()
            except Exception:
                log.exception("stopping the embedded PostgreSQL failed")
        log.info("stopped")


def _stop(proc: ForkedChild, timeout: float, what: str) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout)
    except TimeoutError:
        log.error("%s did not stop within %.0fs; killing it", what, timeout)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
