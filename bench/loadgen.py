"""Closed-loop push load: P worker processes x C keep-alive HTTP/1.1 connections each.

Every connection sends one ``POST /api/v1/push`` at a time (closed loop: the next request leaves
when the previous answer has been read), for a fixed window that starts at the same wall-clock
instant in every process. Requests are written by hand on raw asyncio streams: a bytes template
filled with ``%`` per item, one ``write`` per request, the answer read with ``readuntil`` /
``readexactly``. That is several times cheaper per request than an HTTP client library, which
matters on a 2-core machine where the broker and PostgreSQL need the same CPUs (see
bench/README.md).

Each item carries a 200-byte JSON payload ``{"producer":..,"seq":..,"pad":".."}`` (producer id
and per-producer sequence number), a unique ``transactionId`` (``<producer>-<seq>``, the run tag
is part of the producer id so rounds never collide on deduplication) and a partition drawn
uniformly from ``p-0000`` .. ``p-0999``; by default all items of one request share a partition
(``--spread request``: a client batch), ``--spread item`` draws one per item.

An answer counts as a success only if it is ``201`` and carries one ``"status":"..."`` per item;
items are counted by status (``queued`` is what the throughput figure uses). Anything else (other
HTTP status, short body, connection reset, timeout) is an error of that request, the connection
is reopened and the loop goes on. Latency is recorded for successful requests completed inside
the window; a request completing after the window is counted as ``late`` and left out.

Run standalone against any broker::

    python -m bench.loadgen --url http://127.0.0.1:6632 --connections 64 --procs 2 \
        --items 1 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import resource
import secrets
import subprocess
import sys
import time
import zlib
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

__all__ = ["LoadRun", "LoadSpec", "payload", "percentiles", "run_load"]

PAYLOAD_BYTES = 200
_PAD = b"x" * PAYLOAD_BYTES


def payload(producer: bytes, seq: int) -> bytes:
    """The benchmark message: exactly PAYLOAD_BYTES of JSON naming its producer and sequence."""
    head = b'{"producer":"%s","seq":%d,"pad":"' % (producer, seq)
    return head + _PAD[:PAYLOAD_BYTES - len(head) - 2] + b'"}'


@dataclass
class LoadSpec:
    url: str
    connections: int = 64
    procs: int = 2
    items: int = 1
    duration: float = 30.0
    partitions: int = 1000
    queue: str = "bench"
    spread: str = "request"  # request: one partition per request; item: one per item
    timeout: float = 30.0
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    path: str = "/api/v1/push"


def percentiles(values: list[float] | array, qs: tuple[float, ...] = (50, 90, 99, 99.9)
                ) -> dict[str, float | None]:
    """Nearest-rank percentiles (and mean/max) of ``values`` in seconds, returned in ms."""
    data = sorted(values)
    n = len(data)
    out: dict[str, float | None] = {}
    for q in qs:
        key = f"p{q:g}".replace(".", "_")
        out[key] = None if n == 0 else data[min(n - 1, max(0, int(q / 100 * n + 0.5) - 1))] * 1e3
    out["mean"] = None if n == 0 else sum(data) / n * 1e3
    out["max"] = None if n == 0 else data[-1] * 1e3
    return out


# ---------------------------------------------------------------------------------- worker side
class _Worker:
    def __init__(self, host: str, port: int, path: str, items: int, partitions: int, queue: str,
                 spread: str, timeout: float, producer_prefix: str, seed: int) -> None:
        self.host, self.port = host, port
        self.items = items
        self.partitions = partitions
        self.spread = spread
        self.timeout = timeout
        self.prefix = producer_prefix
        self.rng = random.Random(seed)
        self.head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     "Content-Type: application/json\r\nContent-Length: ").encode()
        self.item_tpl = (b'{"queue":"' + queue.encode() + b'","partition":"p-%04d",'
                         b'"transactionId":"%s-%d","payload":%s}')
        self.queued_all = 0  # queued items of every 201, late ones included (integrity check)
        self.items_sent = 0
        self.ok = 0
        self.late = 0
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []
        self.lat = array("d")
        self.end = 0.0

    def body(self, producer: bytes, seq: int) -> tuple[bytes, int]:
        n = self.items
        rnd = self.rng.randrange
        tpl = self.item_tpl
        if self.spread == "item":
            parts = [tpl % (rnd(self.partitions), producer, seq + i,
                            payload(producer, seq + i)) for i in range(n)]
        else:
            p = rnd(self.partitions)
            parts = [tpl % (p, producer, seq + i, payload(producer, seq + i))
                     for i in range(n)]
        return b'{"items":[' + b",".join(parts) + b"]}", seq + n

    def sample(self, what: str) -> None:
        if len(self.samples) < 5:
            self.samples.append(what[:400])

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, limit=1 << 20)

    async def _read_answer(self, reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        low = head.lower()
        close = b"\r\nconnection: close" in low
        if b"\r\ntransfer-encoding: chunked" in low:
            chunks = []
            while True:
                size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                chunks.append(await reader.readexactly(size + 2))
            return status, b"".join(c[:-2] for c in chunks), close
        at = low.find(b"\r\ncontent-length:")
        if at < 0:
            raise ValueError("answer without content-length")
        length = int(low[at + 17:low.index(b"\r\n", at + 17)])
        return status, await reader.readexactly(length), close

    def account(self, status: int, body: bytes) -> bool:
        """True when the answer is a 201 with one verdict per item (counted by status)."""
        if status != 201:
            self.errors[f"http_{status}"] += 1
            self.sample(f"{status} {body[:300]!r}")
            return False
        n = self.items
        queued = body.count(b'"status":"queued"')
        if queued == n and body.count(b'"status":"') == n:
            self.statuses["queued"] += n
            self.queued_all += n
            return True
        try:  # rare path: name every verdict
            import orjson

            doc = orjson.loads(body)
            got = [str(x.get("status")) for x in doc] if isinstance(doc, list) else []
        except Exception:
            got = []
        if len(got) != n:
            self.errors["bad_body"] += 1
            self.sample(f"201 with {len(got)} verdicts for {n} items: {body[:300]!r}")
            return False
        self.statuses.update(got)
        self.queued_all += got.count("queued")
        self.sample(f"201 with statuses {dict(Counter(got))}")
        return True

    async def connection(self, index: int, start: float, end: float) -> None:
        producer = f"{self.prefix}c{index}".encode()
        seq = 0
        rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        loop = time.perf_counter
        while loop() < end:
            if rw is None:
                try:
                    rw = await asyncio.wait_for(self.open(), self.timeout)
                except (OSError, TimeoutError) as ex:
                    self.errors[f"connect_{type(ex).__name__}"] += 1
                    await asyncio.sleep(0.05)
                    continue
            reader, writer = rw
            body, seq_next = self.body(producer, seq)
            t0 = loop()
            ok = False
            try:
                writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
                async with asyncio.timeout(self.timeout):
                    status, answer, close = await self._read_answer(reader)
                t1 = loop()
                seq = seq_next
                if t1 > end:
                    self.late += 1
                    ok = status == 201
                    if ok:
                        self.queued_all += answer.count(b'"status":"queued"')
                    else:
                        self.errors[f"late_http_{status}"] += 1
                else:
                    ok = self.account(status, answer)
                    if ok:
                        self.ok += 1
                        self.items_sent += self.items
                        self.lat.append(t1 - t0)
                if close or not ok:
                    writer.close()
                    rw = None
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError,
                    asyncio.LimitOverrunError) as ex:
                self.errors[type(ex).__name__] += 1
                self.sample(f"{type(ex).__name__}: {ex}")
                writer.close()
                rw = None
        if rw is not None:
            rw[1].close()

    async def run(self, connections: int, start_at: float, duration: float) -> dict:
        # Connect before the window so that connection setup is not measured.
        opened = await asyncio.gather(*(self.open() for _ in range(connections)),
                                      return_exceptions=True)
        for c in opened:
            if isinstance(c, BaseException):
                self.errors[f"connect_{type(c).__name__}"] += 1
            else:
                c[1].close()
        await asyncio.sleep(max(0.0, start_at - time.time()))
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        started_wall = time.time()
        end = start + duration
        await asyncio.gather(*(self.connection(i, start, end) for i in range(connections)))
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "pid": os.getpid(), "connections": connections, "started_at": started_wall,
            "start_skew_s": started_wall - start_at, "window_s": duration,
            "ok_requests": self.ok, "items_ok": self.items_sent, "late_requests": self.late,
            "queued_all": self.queued_all,
            "statuses": dict(self.statuses), "errors": dict(self.errors),
            "error_samples": self.samples,
            "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
            "latencies_b64": base64.b64encode(self.lat.tobytes()).decode(),
        }


def _worker_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench.loadgen --worker")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/api/v1/push")
    ap.add_argument("--connections", type=int, required=True)
    ap.add_argument("--items", type=int, required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--spread", choices=["request", "item"], required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--producer-prefix", required=True)
    ap.add_argument("--start-at", type=float, required=True)
    ap.add_argument("--duration", type=float, required=True)
    a = ap.parse_args(argv)
    w = _Worker(a.host, a.port, a.path, a.items, a.partitions, a.queue, a.spread, a.timeout,
                a.producer_prefix, seed=zlib.crc32(a.producer_prefix.encode()))
    out = asyncio.run(w.run(a.connections, a.start_at, a.duration))
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------- parent side
class LoadRun:
    """P worker processes started together; ``wait`` merges their reports."""

    def __init__(self, spec: LoadSpec, start_delay: float = 2.0) -> None:
        self.spec = spec
        u = urlsplit(spec.url)
        host, port = u.hostname or "127.0.0.1", u.port or 80
        self.start_at = time.time() + start_delay
        self.end_at = self.start_at + spec.duration
        per = [spec.connections // spec.procs + (1 if i < spec.connections % spec.procs else 0)
               for i in range(spec.procs)]
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for i, n in enumerate(per):
                if n == 0:
                    continue
                argv = [sys.executable, "-m", "bench.loadgen", "--worker", "--host", host,
                        "--port", str(port), "--path", spec.path, "--connections", str(n),
                        "--items", str(spec.items), "--partitions", str(spec.partitions),
                        "--queue", spec.queue, "--spread", spec.spread,
                        "--timeout", str(spec.timeout),
                        "--producer-prefix", f"{spec.tag}w{i}",
                        "--start-at", repr(self.start_at), "--duration", repr(spec.duration)]
                self.procs.append(subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        except BaseException:
            self.kill()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.communicate(timeout=5)

    def wait(self) -> dict:
        budget = max(0.0, self.end_at - time.time()) + self.spec.timeout + 30
        reports = []
        try:
            for p in self.procs:
                out, err = p.communicate(timeout=budget)
                if p.returncode != 0:
                    raise RuntimeError(f"load worker {p.pid} exited {p.returncode}: "
                                       f"{err.decode(errors='replace')[-2000:]}")
                reports.append(json.loads(out))
        finally:
            self.kill()
        return merge(self.spec, reports)


def merge(spec: LoadSpec, reports: list[dict]) -> dict:
    lat = array("d")
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    samples: list[str] = []
    for r in reports:
        lat.frombytes(base64.b64decode(r.pop("latencies_b64")))
        statuses.update(r["statuses"])
        errors.update(r["errors"])
        samples.extend(r["error_samples"])
    window = spec.duration
    ok = sum(r["ok_requests"] for r in reports)
    queued = statuses.get("queued", 0)
    return {
        "spec": asdict(spec),
        "window_s": window,
        "ok_requests": ok,
        "error_requests": sum(errors.values()),
        "late_requests": sum(r["late_requests"] for r in reports),
        "items_queued": queued,
        "items_queued_incl_late": sum(r["queued_all"] for r in reports),
        "statuses": dict(statuses),
        "errors": dict(errors),
        "error_samples": samples[:10],
        "msgs_per_s": queued / window,
        "requests_per_s": ok / window,
        "latency_ms": percentiles(lat),
        "loadgen_cpu_s": sum(r["cpu_s"] for r in reports),
        "max_start_skew_s": max((abs(r["start_skew_s"]) for r in reports), default=0.0),
        "workers": reports,
    }


def run_load(spec: LoadSpec) -> dict:
    run = LoadRun(spec)
    return run.wait()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker_main(argv[1:])
        return
    ap = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--queue", default="bench")
    ap.add_argument("--spread", choices=["request", "item"], default="request")
    a = ap.parse_args(argv)
    res = run_load(LoadSpec(url=a.url, connections=a.connections, procs=a.procs, items=a.items,
                            duration=a.duration, partitions=a.partitions, queue=a.queue,
                            spread=a.spread))
    res.pop("workers")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
