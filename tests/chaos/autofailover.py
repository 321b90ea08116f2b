"""A pg_auto_failover formation of the fault matrix's own (issue 29, fault 4): a monitor, a
primary and a secondary on 127.0.0.1, each a ``pg_autoctl`` service on a private port and
directory, run as the ``postgres`` user when we are root (PostgreSQL refuses root).

The engine decides everything a failover needs (health checks, promotion, the synchronous
standby names, the old primary's rejoin with pg_rewind); this class only starts the services,
reads the monitor's view (``pg_autoctl show state --json``) and plays the part of a host that
dies and comes back. The monitor's timings are the package's defaults, so a fault shows what an
operator gets out of the box (docs/operations.md explains which monitor settings shorten it).
``ops/ensure-pg-auto-failover.sh`` installs the Debian package when it is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from queen_mp.db.embedded import find_pg_binaries
from tests.brokerharness import REPO, free_port, process_tree

__all__ = ["DATABASE", "Formation", "Node"]

DATABASE = "queen"
ENSURE = REPO / "ops" / "ensure-pg-auto-failover.sh"
#: what a node's postgresql.conf adds to pg_autoctl's own settings (postgresql.conf includes
#: postgresql-auto-failover.conf on its first line, so these win): pg_autoctl sizes
#: shared_buffers from the machine's memory, too much for a test machine shared by many
NODE_SETTINGS = "shared_buffers = '128MB'\neffective_cache_size = '1GB'\n"


@dataclass
class Node:
    """One pg_autoctl service: the monitor or a PostgreSQL node, with its running service."""

    name: str
    pgdata: Path
    port: int
    service: subprocess.Popen[bytes] | None = None


class Formation:
    """A monitor and two nodes of formation ``default`` with database :data:`DATABASE`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.monitor = Node("monitor", base / "monitor", free_port())
        self.nodes = [Node(f"node{k}", base / f"node{k}", free_port()) for k in (1, 2)]
        self.primary = self.nodes[0]  # as of the last wait_settled
        entry = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._user = {"user": entry.pw_uid, "group": entry.pw_gid} if entry else {}
        bin_dir = find_pg_binaries().bin_dir
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {
            # pg_autoctl keeps its configuration and state under XDG dirs of the user it runs
            # as: ours, owned by that user, so nothing lands in postgres's home
            "XDG_CONFIG_HOME": str(base / "config"), "XDG_DATA_HOME": str(base / "share"),
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            # initdb takes the encoding from the locale: UTF8, not SQL_ASCII (under which
            # psycopg hands text over as bytes)
            "LC_ALL": "C.UTF-8"}
        self._pg_ctl = str(bin_dir / "pg_ctl")

    # ------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        done = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True)
        assert done.returncode == 0, f"{ENSURE}: {done.stderr}"
        self.base.mkdir(mode=0o755, exist_ok=True)
        if self._user:
            os.chown(self.base, self._user["user"], self._user["group"])
        self._autoctl("create", "monitor", "--pgdata", str(self.monitor.pgdata), "--pgport",
                      str(self.monitor.port), "--hostname", "127.0.0.1", "--auth", "trust",
                      "--no-ssl", "--pgctl", self._pg_ctl, timeout=120)
        self._run_service(self.monitor)
        first, second = self.nodes
        self._create_node(first)  # created stopped: its settings go in before it serves
        (first.pgdata / "postgresql.conf").open("a").write(NODE_SETTINGS)
        self._run_service(first)
        self._wait("the first node to be a single primary",
                   lambda s: [n["current_group_state"] for n in s] == ["single"])
        # the second one is a pg_basebackup of the first (NODE_SETTINGS included)
        self._run_service(second, "create", "postgres", *self._node_args(second))
        self.wait_settled(timeout=180)

    def close(self) -> None:
        """Every service stopped (immediately), every process gone, the directory removed."""
        try:
            for node in (*self.nodes, self.monitor):
                if node.service is not None and node.service.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired, AssertionError):
                        self._autoctl("stop", "--immediate", "--pgdata", str(node.pgdata),
                                      timeout=30)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        node.service.wait(30)
                    self._kill(node)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------------ what it says
    def state(self) -> list[dict[str, Any]]:
        """The monitor's view of the nodes, by node name."""
        out = self._autoctl("show", "state", "--json", "--pgdata", str(self.monitor.pgdata))
        return sorted(json.loads(out), key=lambda n: n["nodename"])

    def uri(self) -> str:
        """The formation's multi-host URI, as an application gets it, with the user."""
        out = self._autoctl("show", "uri", "--formation", "default", "--pgdata",
                            str(self.monitor.pgdata))
        return make_conninfo(out.strip(), user="postgres", connect_timeout="2")

    def wait_settled(self, timeout: float = 120) -> Node:
        """A primary and a secondary, each in the state the monitor assigned (synchronous
        replication on again); returns the primary, so a fault strikes without asking."""
        state = self._wait("a primary and a synchronous secondary", lambda s: sorted(
            (n["current_group_state"], n["assigned_group_state"]) for n in s
        ) == [("primary", "primary"), ("secondary", "secondary")], timeout)
        self.primary = next(node for node in self.nodes for n in state
                            if n["nodename"] == node.name and n["current_group_state"] == "primary")
        return self.primary

    def wait_promoted(self, old: Node, timeout: float = 180) -> None:
        """The engine promoted another node than ``old``."""
        self._wait(f"a node other than {old.name} to be promoted", lambda s: any(
            n["nodename"] != old.name and n["current_group_state"] in ("wait_primary", "primary")
            for n in s), timeout)

    # ------------------------------------------------------------------------ faults
    def crash(self, node: Node) -> None:
        """The host dies: SIGKILL of the node's pg_autoctl service and everything under it,
        its postmaster included (no shutdown checkpoint, no goodbye to the monitor)."""
        self._kill(node)

    def stop_service(self, node: Node) -> None:
        """``pg_autoctl stop --immediate``: the service stops PostgreSQL in immediate mode."""
        self._autoctl("stop", "--immediate", "--pgdata", str(node.pgdata), timeout=60)
        assert node.service is not None
        node.service.wait(60)

    def rejoin(self, node: Node) -> None:
        """The host is back: its service again, which the monitor turns into a secondary."""
        self._run_service(node)

    # ------------------------------------------------------------------------ internals
    def _node_args(self, node: Node) -> list[str]:
        return ["--pgdata", str(node.pgdata), "--pgport", str(node.port), "--hostname",
                "127.0.0.1", "--listen", "127.0.0.1", "--name", node.name, "--dbname", DATABASE,
                "--auth", "trust", "--no-ssl", "--pgctl", self._pg_ctl, "--monitor",
                self._monitor_uri()]

    def _monitor_uri(self) -> str:
        return self._autoctl("show", "uri", "--formation", "monitor", "--pgdata",
                             str(self.monitor.pgdata)).strip()

    def _create_node(self, node: Node) -> None:
        self._autoctl("create", "postgres", *self._node_args(node), timeout=180)

    def _run_service(self, node: Node, *command: str) -> None:
        """``pg_autoctl run`` (or ``command`` ending in ``--run``) in a session of its own."""
        args = [*command, "--run"] if command else ["run", "--pgdata", str(node.pgdata)]
        log = (self.base / f"{node.name}.log").open("ab")
        node.service = subprocess.Popen(
            ["pg_autoctl", *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=self._env, cwd=self.base, start_new_session=True, **self._user)
        log.close()
        if node is self.monitor:
            self._wait_answers(node)

    def _wait_answers(self, node: Node, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._monitor_uri()
                return
            except AssertionError:
                assert time.monotonic() < deadline, self._log_tail(node)
                time.sleep(0.5)

    def _kill(self, node: Node) -> None:
        if node.service is None:
            return
        for pid in process_tree(node.service.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        node.service.wait(30)

    def _autoctl(self, *args: str, timeout: float = 30) -> str:
        done = subprocess.run(["pg_autoctl", *args], capture_output=True, text=True,
                              env=self._env, cwd=self.base, timeout=timeout, **self._user)
        assert done.returncode == 0, f"pg_autoctl {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    def _wait(self, what: str, done: Any, timeout: float = 120) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(AssertionError, json.JSONDecodeError):
                last = self.state()
                if done(last):
                    return last
            time.sleep(0.5)
        raise AssertionError(f"no {what} after {timeout}s: {last}\n"
                             + "\n".join(self._log_tail(n) for n in self.nodes))

    def _log_tail(self, node: Node) -> str:
        with contextlib.suppress(OSError):
            return f"{node.name}: " + (self.base / f"{node.name}.log").read_text()[-2000:]
        return f"{node.name}: no log"
