"""The consume loop on a live broker, per process role: front worker, shard, PostgreSQL, client.

bench/hotpath.py counts what the front worker's pop and ack functions cost in-process; the
suite's consume cell reports the broker's CPU per message, which on a shared 2-core machine
moves by a third between runs of the same code. This runs the consume cell's load on one real
broker (``QUEEN_WORKERS=1``, one shard, the consumers in this process: pop batch ``--batch``
from one partition with a long poll, one ``/ack/batch`` per pop, ``--consumers`` of them) after
an untimed pre-fill of ``--messages`` over 100 partitions in 1,000-item pushes, and reports, per
consumed message, each broker process's user and system CPU (``/proc``), the CPU of the
database's backends and of this process.

With ``--callgrind`` the broker runs under ``valgrind --tool=callgrind --trace-children=yes``
and the figure is instructions per message of the front worker and of the shard: each process
is zeroed, left idle ``--idle`` seconds and dumped (its idle rate: timers and housekeeping
run on wall-clock time, which valgrind stretches), zeroed again, and dumped after the drain;
the idle rate times the drain's duration is subtracted. ``callgrind_control`` gets each pid::

    PYTHONPATH=<tree> python bench/liveroles.py --callgrind /tmp/lr --messages 10000

With ``--push N`` the load is N 1-item JSON pushes instead (as the suite's 1-item push cell
sends them: ``Host``, ``Content-Type`` and ``Content-Length`` headers, one partition of
``--partitions`` per request, a 200-byte payload) from ``--consumers`` keep-alive connections,
each sending its next push once the last is answered, after an untimed push to each
partition; the figures are per push. A front worker's cost per request is mostly the HTTP
machinery around the broker's work at 1 item (bench/hotpath.py's front1 is that work alone)::

    PYTHONPATH=<tree> python bench/liveroles.py --callgrind /tmp/lr --push 5000

With ``--items K`` each push carries K items of one partition instead, the body
bench/loadgen.py writes for the suite's push cell (its template: the 200-byte payload, a
``transactionId`` of ``<--tag>w0c0-<seq>``), and the figures are per message (the
suite's push batch 100 is ``--items 100``)::

    PYTHONPATH=<tree> python bench/liveroles.py --callgrind /tmp/lr --push 2000 --items 100

``--format qpb1`` sends those items as bench/loadgen.py's QPB1 frames body (the suite's
``queen-mp-qpb1`` arm; ``--items 1000`` its batch 1000).

Run it with ``PYTHONPATH=<tree>`` from outside the tree to measure that tree's code.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import consume as cons
from bench import loadgen as lg
from bench import push as pb

SERVER = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
_HZ = os.sysconf("SC_CLK_TCK")


def _times(pid: int) -> tuple[int, int]:
    """(utime, stime) of ``pid`` in clock ticks; (0, 0) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0, 0
    return int(fields[11]), int(fields[12])


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return "gone"
    return "shard" if comm.startswith("qmp-shard") else "front/supervisor"


def _total(path: str) -> int:
    """The instruction total of one callgrind dump."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def _control(flag: str, pids: list[int]) -> None:
    for pid in pids:  # always one pid: without it callgrind_control acts on every process
        subprocess.run(["callgrind_control", flag, str(pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start(tmp: Path, dsn: str, callgrind: str | None, port: int = 0) -> pb.Server:
    port = port or pb.free_port()
    env = pb._clean_env()
    env.update({"QUEEN_PORT": str(port), "QUEEN_DATA_DIR": str(tmp), "QUEEN_WORKERS": "1",
                "QUEEN_V2_FUSION_SHARDS": "1", "QUEEN_LOG_LEVEL": "info",
                "QUEEN_SHUTDOWN_TIMEOUT_S": "20", "QUEEN_PG_DSN": dsn})
    argv = [sys.executable, "-m", "queen_mp.processes.cli", "serve"]
    if callgrind is not None:
        argv[:0] = ["valgrind", "--tool=callgrind", "--trace-children=yes",
                    f"--callgrind-out-file={callgrind}/cg.%p"]
    log = tmp / "broker.log"
    return pb.Server("queen-mp", f"http://127.0.0.1:{port}", pb._spawn(argv, env, log), log, dsn)


async def prefill(url: str, queue: str, n: int) -> None:
    http = cons.Http(url, timeout=300)
    try:
        for s in range(0, n, 1000):
            body = cons.push_body([(queue, f"p-{(s + i) % 100:03d}", f"{queue}-{s + i}",
                                    cons.payload("p", s + i)) for i in range(min(1000, n - s))])
            status, answer = await http.request("POST", "/api/v1/push", body)
            if cons.push_verdict(status, answer) != "queued":
                raise RuntimeError(f"pre-fill push answered {status}: {answer[:200]!r}")
    finally:
        http.close()


async def drain(url: str, queue: str, n: int, batch: int, consumers: int) -> float:
    """Seconds until ``n`` messages were acked."""
    acked = 0
    done = asyncio.Event()

    def on_batch(msgs: list[dict[str, Any]] | None, count: Any) -> None:
        nonlocal acked
        if msgs is None:
            acked += count
            if acked >= n:
                done.set()

    st = cons.OpStats()
    https = [cons.Http(url) for _ in range(consumers)]
    for h in https:
        await h.connect()
    t0 = time.monotonic()
    tasks = [asyncio.create_task(cons.consumer_loop(cons.Arm("queen-mp", url), h, queue, batch,
                                                    1, "tp", st, on_batch, 0.01, wait_ms=1000))
             for h in https]
    try:
        await asyncio.wait_for(done.wait(), 600)
        return time.monotonic() - t0
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for h in https:
            h.close()
        if st.errors:
            print(f"consumer errors: {dict(st.errors)}")


def push_bodies(queue: str, n: int, partitions: int, tag: str, items: int = 1,
                fmt: str = "json") -> list[bytes]:
    """``n`` JSON push bodies. One item: request ``i`` to partition ``i % partitions``. More
    (or ``fmt`` "qpb1"): bench/loadgen.py's bodies of ``items`` items of one partition each (a
    random one, seeded by ``tag``), spread over ``connections`` producers as its workers name
    them, in its ``--format fmt``."""
    if items == 1 and fmt == "json":
        return [cons.push_body([(queue, f"p-{i % partitions:04d}", f"{queue}-{tag}{i}",
                                 cons.payload(tag, i))]) for i in range(n)]
    worker = lg._Worker("127.0.0.1", 0, "/api/v1/push", items, partitions, queue, "request",
                        30.0, f"{tag}w0", seed=len(tag) + n, fmt=fmt)
    producer = f"{tag}w0c0".encode()
    bodies, seq = [], 0
    for _ in range(n):
        body, seq, _ids = worker.body(producer, seq)
        bodies.append(body)
    return bodies


async def push_load(url: str, bodies: list[bytes], connections: int) -> float:
    """Seconds until every body was pushed and answered ``queued``, ``connections`` of them
    in flight (each connection sends its next one once its last is answered)."""
    https = [cons.Http(url) for _ in range(connections)]
    for h in https:
        await h.connect()
    todo = iter(bodies)
    failed: dict[str, int] = {}

    async def producer(http: cons.Http) -> None:
        for body in todo:
            verdict = cons.push_verdict(*await http.request("POST", "/api/v1/push", body))
            if verdict != "queued":
                failed[verdict] = failed.get(verdict, 0) + 1

    t0 = time.monotonic()
    try:
        await asyncio.gather(*(producer(h) for h in https))
        return time.monotonic() - t0
    finally:
        for h in https:
            h.close()
        if failed:
            print(f"push errors: {failed}")


async def run(args: argparse.Namespace) -> None:
    rid = secrets.token_hex(3)
    name = f"{args.db_prefix}{rid}_q"
    dsn = pb.create_database(args.server_dsn, name)
    tmp = Path(tempfile.mkdtemp(prefix="queen-liveroles-"))
    if args.callgrind:
        os.makedirs(args.callgrind, exist_ok=True)
    srv = start(tmp, dsn, args.callgrind, args.port)
    mon = pb.Monitor(args.server_dsn)
    try:
        for _ in range(3000):
            try:
                if pb.http_get(srv.url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.2)
        queue = f"lr-{rid}"
        if args.push:
            # NOTE(bench): each partition made before the window (a first push creates it)
            await push_load(srv.url, push_bodies(queue, args.partitions, args.partitions, "w"),
                            args.consumers)
            bodies = push_bodies(queue, args.push, args.partitions,
                                 "m" if args.items == 1 else args.tag, args.items, args.format)
        else:
            await prefill(srv.url, queue, args.messages)
        await asyncio.sleep(2)
        broker = [p for p in pb.process_tree(srv.proc.pid) if p != srv.proc.pid]
        idle_rate: dict[int, float] = {}
        if args.callgrind:
            _control("-z", broker)
            t_idle = time.monotonic()
            await asyncio.sleep(args.idle)
            _control("-d", broker)
            t_idle = time.monotonic() - t_idle
            idle_rate = {p: _total(max(glob.glob(f"{args.callgrind}/cg.{p}.*"),
                                       key=os.path.getmtime)) / t_idle for p in broker}
            _control("-z", broker)
        backends = mon.backend_pids(name)
        before = {p: _times(p) for p in broker + backends}
        r0 = os.times()
        t = time.monotonic()
        if args.push:
            seconds = await push_load(srv.url, bodies, args.consumers)
        else:
            seconds = await drain(srv.url, queue, args.messages, args.batch, args.consumers)
        r1 = os.times()
        after = {p: _times(p) for p in broker + backends}
        if args.callgrind:
            _control("-d", broker)
        window = time.monotonic() - t
        if args.push:
            n, unit = args.push * args.items, "push" if args.items == 1 else "msg"
            print(f"{args.push} {args.items}-item pushes, {args.consumers} connections, "
                  f"{args.partitions} partitions: {seconds:.2f} s, {n / seconds:,.0f} msgs/s")
        else:
            n, unit = args.messages, "msg"
            print(f"{n} messages, batch {args.batch}, {args.consumers} consumers: "
                  f"{seconds:.2f} s, {n / seconds:,.0f} msgs/s")
        print(f"| role | pid | user us/{unit} | sys us/{unit} | instr/{unit} (idle subtracted) |")
        print("|---|---|---:|---:|---:|")
        for p in broker:
            u, s = (after[p][k] - before[p][k] for k in (0, 1))
            instr = "-"
            if args.callgrind:
                dump = max(glob.glob(f"{args.callgrind}/cg.{p}.*"), key=os.path.getmtime)
                instr = f"{(_total(dump) - idle_rate[p] * window) / n:,.0f}"
            print(f"| {_role(p)} | {p} | {u / _HZ * 1e6 / n:.2f} | {s / _HZ * 1e6 / n:.2f} | "
                  f"{instr} |")
        u = sum(after[p][0] - before[p][0] for p in backends)
        s = sum(after[p][1] - before[p][1] for p in backends)
        print(f"| PostgreSQL backends | {len(backends)} | {u / _HZ * 1e6 / n:.2f} | "
              f"{s / _HZ * 1e6 / n:.2f} | - |")
        print(f"| client (this process) | {os.getpid()} | {(r1.user - r0.user) * 1e6 / n:.2f} | "
              f"{(r1.system - r0.system) * 1e6 / n:.2f} | - |")
    finally:
        pb.kill_tree(srv.proc.pid)
        await asyncio.sleep(1)
        mon.close()
        pb.drop_database(args.server_dsn, name, args.db_prefix)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-dsn", default=SERVER)
    ap.add_argument("--db-prefix", default="queen_bench_",
                    help="the name of the database made (and dropped) for the run starts so")
    ap.add_argument("--port", type=int, default=0, help="the broker's port (0: a free one)")
    ap.add_argument("--messages", type=int, default=60_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--consumers", type=int, default=4,
                    help="concurrent connections (consumers, or producers with --push)")
    ap.add_argument("--push", type=int, default=0, metavar="N",
                    help="N 1-item JSON pushes instead of the consume loop")
    ap.add_argument("--items", type=int, default=1,
                    help="items per push of --push (one partition each); figures per message")
    ap.add_argument("--format", choices=lg.FORMATS, default="json",
                    help="the body of --push: JSON, or bench/loadgen.py's QPB1 frames (the "
                    "suite's queen-mp-qpb1 arm)")
    ap.add_argument("--tag", default="5a17c0",
                    help="the run tag in the transactionIds of --items (loadgen's is random; a "
                    "fixed one takes the same parse branches every run)")
    ap.add_argument("--partitions", type=int, default=100,
                    help="partitions the pushes of --push spread over")
    ap.add_argument("--callgrind", metavar="DIR", default=None,
                    help="run the broker under callgrind, its dumps in DIR")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle rate (callgrind)")
    asyncio.run(run(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
