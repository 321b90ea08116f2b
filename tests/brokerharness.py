"""A real ``queen-mp serve`` process on a free port, talking real HTTP to a real PostgreSQL.

``broker`` (session) serves most tests; ``make_broker`` starts private ones for tests that kill
processes or need other settings. Every broker is stopped with SIGTERM at teardown, and the
harness checks it left no process and no shared-memory segment behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.pgharness import make_temp_dir

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_segments(prefix: str = "qmp") -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix)
            or p.name.startswith("sem.qmp")}


def _children(pid: int) -> list[int]:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                             check=False).stdout
    except FileNotFoundError:
        return []
    return [int(x) for x in out.split()]


def is_shard(pid: int) -> bool:
    """Whether ``pid`` is a shard (queen_mp/processes/forked.py names it ``qmp-shard-I``)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().startswith("qmp-shard-")
    except FileNotFoundError:
        return False


def process_tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


@dataclass
class Broker:
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    env: dict[str, str]
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def shard_pids(self) -> list[int]:
        """Pids of the shard processes: forks of the supervisor named ``qmp-shard-I``."""
        return [pid for pid in _children(self.proc.pid) if is_shard(pid)]

    def front_worker_pids(self) -> list[int]:
        """Pids of the front workers: the supervisor runs gunicorn's arbiter, so they are its
        forks, children with its very command line (as the shards), not named as a shard."""
        own = Path(f"/proc/{self.proc.pid}/cmdline").read_bytes()
        pids = []
        for pid in _children(self.proc.pid):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == own and not is_shard(pid):
                    pids.append(pid)
            except FileNotFoundError:
                continue
        return pids

    def wait_workers_ready(self, pids: list[int], timeout: float = 15.0) -> None:
        """Until each of ``pids`` logged that its front worker is ready: /health answered by
        one worker says nothing of the others (one still booting logs no shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(
                f"front worker {pid} ready" in self.log() for pid in pids):
            time.sleep(0.1)

    def wait_all_started(self, timeout: float = 10.0) -> None:
        """Until every front worker and shard the settings ask for runs and every worker
        logged that it is ready: /health answers once ONE worker serves, while the arbiter may
        not have forked the next one yet (a test counting processes then saw one worker)."""
        workers = int(self.env.get("QUEEN_WORKERS", "2"))
        shards = int(self.env.get("QUEEN_V2_FUSION_SHARDS", "1"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.front_worker_pids()
            if len(pids) == workers and len(self.shard_pids()) == shards:
                self.wait_workers_ready(pids, max(0.0, deadline - time.monotonic()))
                return
            time.sleep(0.05)
        print(f"wait_all_started: gave up: workers {self.front_worker_pids()} shards "
              f"{self.shard_pids()} (want {workers}, {shards})", file=sys.stderr)

    def wait_healthy(self, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = self.client.get("/health", timeout=3)
                last = r
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            # a refused connection costs nothing: a shorter poll starts each of the suite's
            # brokers 0.1 s sooner on average
            time.sleep(0.05)
        raise AssertionError(f"broker not healthy in {timeout}s: {last and last.text}\n"
                             f"{self.log()[-4000:]}")

    def stop(self, timeout: float = 60.0, sig: int = signal.SIGTERM) -> int:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for pid in reversed(process_tree(self.proc.pid)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.proc.wait()
                raise AssertionError(f"broker did not stop on {sig!r}") from None
        return self.proc.returncode


def launch(env: dict[str, str], log_path: Path, *, command: list[str] | None = None,
           cwd: Path | None = None, append: bool = True) -> subprocess.Popen[bytes]:
    """The broker process: the checkout's ``queen-mp serve`` (or ``command``), its output into
    ``log_path`` (appended: a restart keeps the log of the run before)."""
    command = command or [sys.executable, "-m", "queen_mp.processes.cli", "serve"]
    with open(log_path, "ab" if append else "wb") as out:
        return subprocess.Popen(command, cwd=cwd or REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def start_broker(tmp: Path, dsn: str | None, *, command: list[str] | None = None,
                 cwd: Path | None = None, **settings: str) -> Broker:
    """A broker process: the checkout's ``queen-mp serve``, or ``command`` (an installed one)."""
    port = free_port()
    data = tmp / f"broker-{port}"
    data.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env.update({"QUEEN_PORT": str(port), "QUEEN_DATA_DIR": str(data), "QUEEN_WORKERS": "2",
                "QUEEN_V2_FUSION_SHARDS": "2", "QUEEN_LOG_LEVEL": "info",
                "QUEEN_SHUTDOWN_TIMEOUT_S": "20"})
    if dsn is not None:
        env["QUEEN_PG_DSN"] = dsn
    env.update(settings)
    log_path = data / "broker.log"
    proc = launch(env, log_path, command=command, cwd=cwd, append=False)
    broker = Broker(f"http://127.0.0.1:{port}", proc, data, log_path, env)
    try:
        broker.wait_healthy()
        broker.wait_all_started()
    except BaseException:
        broker.stop()
        raise
    return broker


@pytest.fixture(scope="session")
def broker(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(tmp_path_factory.mktemp("broker"), db_dsn)
    yield b
    assert b.stop() == 0, b.log()[-4000:]


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator:
    """Private brokers; with no DSN the broker starts its embedded cluster, whose server user
    must be able to reach the data dir (pytest's tmp_path is 0700 under root)."""
    started: list[Broker] = []
    scratch: list[Path] = []

    def make(dsn: str | None, **settings: str) -> Broker:
        base = tmp_path
        if dsn is None:
            base = make_temp_dir("queen-broker-")
            scratch.append(base)
        b = start_broker(base, dsn, **settings)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()
    for path in scratch:
        shutil.rmtree(path, ignore_errors=True)
