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

``--format json`` (default) sends the JSON body; ``--format qpb1`` sends the same items as a
binary ``QPB1`` push in its frames form (api.md 3.5, the queen-mq client's ``push_compression``):
each group's frames (api.md 3.1) compressed into one zstd frame, message ids minted here as
UUIDv7, ``Content-Type: application/x-queen-push``. Consecutive items of one partition share a
group, so the answer (one result per item, wire order) lines up with the items as in JSON mode.

An answer counts as a success only if it is ``201`` and carries one ``"status":"..."`` per item;
items are counted by status (``queued`` is what the throughput figure uses). Anything else (other
HTTP status, short body, connection reset, timeout) is an error of that request, the connection
is reopened and the loop goes on. Latency is recorded for successful requests completed inside
the window; a request completing after the window is counted as ``late`` and left out.

``--ledger-dir DIR`` makes each worker process write ``DIR/push-<producer prefix>.json`` at the
end (bench/ledger.py reads it): per producer, the seq ranges answered ``queued`` with their
message ids, the seqs answered anything else, and the seqs whose outcome is unknown. Inside the
window the answers are only kept (and counted by substring, as without a ledger); they are
parsed (orjson) and filed after it, so the filing does not take the CPUs the broker is measured
on. Their bytes stay in memory until then (about 330 bytes an item), and the filing's own CPU is
reported as ``ledger_filing_cpu_s`` per worker process.

Run standalone against any broker::

    python -m bench.loadgen --url http://127.0.0.1:6632 --connections 64 --procs 2 \
        --items 1 --duration 10 [--format qpb1] [--ledger-dir /tmp/ledger]
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
import struct
import subprocess
import sys
import time
import zlib
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FORMATS", "LoadRun", "LoadSpec", "payload", "percentiles", "run_load"]

PAYLOAD_BYTES = 200
_PAD = b"x" * PAYLOAD_BYTES
FORMATS = ("json", "qpb1")
QPB1_CONTENT_TYPE = "application/x-queen-push"


def payload(producer: bytes, seq: int) -> bytes:
    """The benchmark message: exactly PAYLOAD_BYTES of JSON naming its producer and sequence."""
    head = b'{"producer":"%s","seq":%d,"pad":"' % (producer, seq)
    return head + _PAD[:PAYLOAD_BYTES - len(head) - 2] + b'"}'


class _Payloads:
    """``payload(producer, seq)`` with everything but the seq digits precomputed: it runs once
    per pushed item, on the CPUs the broker needs."""

    __slots__ = ("head", "tails")

    def __init__(self, producer: bytes) -> None:
        self.head = b'{"producer":"%s","seq":' % producer
        self.tails: dict[int, bytes] = {}

    def __call__(self, seq: int) -> bytes:
        digits = b"%d" % seq
        tail = self.tails.get(len(digits))
        if tail is None:
            pad = PAYLOAD_BYTES - len(self.head) - len(digits) - len(b',"pad":""}')
            tail = self.tails[len(digits)] = b',"pad":"' + _PAD[:max(0, pad)] + b'"}'
        return self.head + digits + tail


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
    format: str = "json"  # json, or qpb1: QPB1 frames + zstd (api.md 3.5)
    ledger_dir: str | None = None  # write push-<producer prefix>.json there (bench/ledger.py)


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


# ---------------------------------------------------------------------------------- QPB1 frames
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_TWO_U32 = struct.Struct("<II")
_HI = struct.Struct(">Q")
_LITTLE = sys.byteorder == "little"


def _str16(text: bytes) -> bytes:
    return _U16.pack(len(text)) + text


class _FrameTemplates(dict[int, bytes]):
    """One producer's api.md 3.1 frame as a ``%`` template per seq digit count: everything but
    the id (two 8-byte halves) and the seq digits (in transactionId and payload) is constant.
    The payload is always PAYLOAD_BYTES, so body_len depends on the digit count only."""

    def __init__(self, producer: bytes) -> None:
        super().__init__()
        self.producer = producer
        self.pay = _Payloads(producer)

    def __missing__(self, d: int) -> bytes:
        digits = b"1" * d
        body = self.pay(int(digits))
        head, tail = self.pay.head, body[len(self.pay.head) + d:]
        txn_len = len(self.producer) + 1 + d
        fixed = struct.pack("<IB", 1 + 16 + 2 + txn_len + len(body), 0)  # body_len | flags 0

        def esc(b: bytes) -> bytes:
            return b.replace(b"%", b"%%")

        tpl = (esc(fixed) + b"%s%s" + esc(_U16.pack(txn_len) + self.producer + b"-") + b"%s"
               + esc(head) + b"%s" + esc(tail))
        self[d] = tpl
        return tpl


class _Qpb1Encoder:
    """A QPB1 frames body (api.md 3.5): per group ``u16+str queue | u16+str partition | u32 n |
    u32 z_len | zstd(n frames of api.md 3.1)``, consecutive items of one partition in one group.

    Message ids are client-minted UUIDv7 (48-bit ms time, version 7, variant 10), cheaply: the
    12 bits of rand_a and the low 32 of rand_b are a per-process counter, the other 30 bits of
    rand_b are random per process. Unique within a process by the counter, across processes by
    the random bits; they need not sort (the broker checks only version and variant)."""

    def __init__(self, queue: str, partitions: int, rng: random.Random) -> None:
        import zstandard  # only the qpb1 format needs it

        self.compress = zstandard.ZstdCompressor(level=1, write_content_size=True).compress
        queue_b = _str16(queue.encode())
        self.parts = [queue_b + _str16(b"p-%04d" % p) for p in range(partitions)]
        self.node = (0b10 << 62) | (rng.getrandbits(30) << 32)
        self.count = rng.getrandbits(20)
        self.tpls: dict[bytes, _FrameTemplates] = {}

    def _ids(self, n: int) -> tuple[bytes, bytes]:
        """``n`` ids as their shared high half (time, version, rand_a) and the low halves."""
        c = self.count
        if (c & 0xFFFFFFFF) + n > 0xFFFFFFFF:  # the low 32 bits would wrap: carry into rand_a
            c = (c | 0xFFFFFFFF) + 1
        self.count = c + n
        hi = _HI.pack(((time.time_ns() // 1_000_000) << 16) | 0x7000 | ((c >> 32) & 0xFFF))
        base = self.node | (c & 0xFFFFFFFF)
        if n == 1:
            return hi, _HI.pack(base)
        lo = array("Q", range(base, base + n))
        if _LITTLE:
            lo.byteswap()
        return hi, lo.tobytes()

    def body(self, producer: bytes, seq: int, parts: list[int], want_ids: bool
             ) -> tuple[bytes, bytes | None]:
        """The body for items ``seq ..`` on ``parts`` (one partition per item) and, if asked,
        their ids (16 bytes each, item order)."""
        n = len(parts)
        tpls = self.tpls.get(producer)
        if tpls is None:
            tpls = self.tpls[producer] = _FrameTemplates(producer)
        hi, lo = self._ids(n)
        frames = []
        for k in range(n):
            d = b"%d" % (seq + k)
            frames.append(tpls[len(d)] % (hi, lo[8 * k:8 * k + 8], d, d))
        compress = self.compress
        if parts.count(parts[0]) == n:  # one group (--spread request)
            z = compress(b"".join(frames))
            body = b"".join((b"QPB1\x08\x01\x00\x00\x00", self.parts[parts[0]],
                             _TWO_U32.pack(n, len(z)), z))
        else:
            out = [b"QPB1\x08", b""]
            groups = 0
            i = 0
            while i < n:
                p = parts[i]
                j = i + 1
                while j < n and parts[j] == p:
                    j += 1
                z = compress(b"".join(frames[i:j]))
                out += (self.parts[p], _TWO_U32.pack(j - i, len(z)), z)
                groups += 1
                i = j
            out[1] = _U32.pack(groups)
            body = b"".join(out)
        ids = b"".join([hi + lo[8 * k:8 * k + 8] for k in range(n)]) if want_ids else None
        return body, ids


# ---------------------------------------------------------------------------------- push ledger
def _extend(ranges: list[list[int]], lo: int, hi: int) -> None:
    """Appends the seq range [lo, hi] to ``ranges``, merging with the last one when adjacent
    (a producer's seqs only grow, so ranges stay sorted and few)."""
    if ranges and ranges[-1][1] == lo - 1:
        ranges[-1][1] = hi
    else:
        ranges.append([lo, hi])


class _ProducerLedger:
    __slots__ = ("ids", "other", "queued", "unknown")

    def __init__(self) -> None:
        self.queued: list[list[int]] = []
        self.ids = bytearray()
        self.other: dict[str, list[list[int]]] = {}
        self.unknown: list[list[int]] = []

    def doc(self) -> dict:
        return {"queued": self.queued, "ids": base64.b64encode(self.ids).decode(),
                "other": self.other, "unknown": self.unknown}


# Non-201 answers known to store nothing (api.md 1.4 / 1.8: a 4xx never stores, 503 unavailable
# attempted nothing, 507 writes nothing); any other (500, 503 timeout/outcome_unknown, a 5xx
# without a known code) may or may not have stored the items.
_NOTHING_STORED_CODES = frozenset({"unavailable", "maintenance", "storage_full"})


class _Ledger:
    """What each request of each producer was answered, for the zero-loss check."""

    def __init__(self) -> None:
        import orjson  # only ledger runs parse answers

        self.loads = orjson.loads
        self.producers: dict[bytes, _ProducerLedger] = {}

    def producer(self, name: bytes) -> _ProducerLedger:
        pl = self.producers.get(name)
        if pl is None:
            pl = self.producers[name] = _ProducerLedger()
        return pl

    def unknown(self, producer: bytes, seq: int, n: int) -> None:
        _extend(self.producer(producer).unknown, seq, seq + n - 1)

    def rejected(self, producer: bytes, seq: int, n: int, status: int, body: bytes) -> None:
        """A non-201 answer: the items are filed under ``http_<status>[_<code>]`` when it
        stored nothing (4xx, 503 unavailable, 507), else as of unknown outcome."""
        code = ""
        with contextlib.suppress(Exception):
            code = str(self.loads(body).get("code") or "")
        if not (400 <= status < 500 or code in _NOTHING_STORED_CODES):
            self.unknown(producer, seq, n)
            return
        key = f"http_{status}_{code}" if code else f"http_{status}"
        _extend(self.producer(producer).other.setdefault(key, []), seq, seq + n - 1)

    def answered(self, producer: bytes, seq: int, n: int, body: bytes, ids: bytes | None
                 ) -> tuple[list[str] | None, int]:
        """A 201: files each item by its status (queued ones with their message id). Returns
        the statuses (None if the body is not one result per item: outcome unknown) and how
        many queued items carried another id than the one minted for them (QPB1)."""
        try:
            doc = self.loads(body)
        except Exception:
            doc = None
        if not isinstance(doc, list) or len(doc) != n:
            self.unknown(producer, seq, n)
            return None, 0
        pl = self.producer(producer)
        statuses = []
        mismatched = 0
        for i, it in enumerate(doc):
            st = str(it.get("status")) if isinstance(it, dict) else "?"
            statuses.append(st)
            s = seq + i
            if st == "queued":
                mid = it.get("messageId")
                try:
                    raw = bytes.fromhex(mid.replace("-", ""))
                    if len(raw) != 16:
                        raise ValueError(mid)
                except (AttributeError, ValueError):
                    # queued without a readable id: stored, but nothing to compare against
                    _extend(pl.other.setdefault("queued_without_id", []), s, s)
                    continue
                if ids is not None and raw != ids[16 * i:16 * i + 16]:
                    mismatched += 1
                _extend(pl.queued, s, s)
                pl.ids += raw
            else:
                _extend(pl.other.setdefault(st, []), s, s)
        return statuses, mismatched

    def write(self, path: str) -> None:
        import orjson

        doc = {p.decode(): pl.doc() for p, pl in self.producers.items()}
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(doc))
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------- worker side
class PushTally:
    """What a closed-loop push worker counts over its window, and its report in the shape
    ``merge`` reads: the worker of this module, and those of bench/pgclients.py and
    bench/peers.py."""

    def __init__(self) -> None:
        self.queued_all = 0  # queued items of every answer, late ones included
        self.items_ok = 0
        self.ok = 0
        self.late = 0
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []
        self.lat = array("d")

    def sample(self, what: str) -> None:
        if len(self.samples) < 5:
            self.samples.append(what[:400])

    def answered(self, t0: float, t1: float, end: float, items: int) -> None:
        """A request of ``items`` all queued, sent at ``t0`` and answered at ``t1``."""
        self.queued_all += items
        if t1 > end:
            self.late += 1
        else:
            self.ok += 1
            self.items_ok += items
            self.lat.append(t1 - t0)

    def report(self, connections: int, start_at: float, started_wall: float, window_s: float,
               ru0: resource.struct_rusage, ru1: resource.struct_rusage,
               statuses: dict[str, int] | None = None, **extra: Any) -> dict[str, Any]:
        """``statuses``: by answer status, default what ``self.statuses`` counted."""
        return {
            "pid": os.getpid(), "connections": connections, "started_at": started_wall,
            "start_skew_s": started_wall - start_at, "window_s": window_s,
            "ok_requests": self.ok, "items_ok": self.items_ok, "late_requests": self.late,
            "queued_all": self.queued_all,
            "statuses": dict(self.statuses) if statuses is None else statuses,
            "errors": dict(self.errors), "error_samples": self.samples,
            "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
            **extra,
            "latencies_b64": base64.b64encode(self.lat.tobytes()).decode(),
        }


class _Worker(PushTally):
    def __init__(self, host: str, port: int, path: str, items: int, partitions: int, queue: str,
                 spread: str, timeout: float, producer_prefix: str, seed: int,
                 fmt: str = "json", ledger_dir: str | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}: one of {FORMATS}")
        self.host, self.port = host, port
        self.items = items
        self.partitions = partitions
        self.spread = spread
        self.timeout = timeout
        self.prefix = producer_prefix
        self.rng = random.Random(seed)
        self.fmt = fmt
        ctype = QPB1_CONTENT_TYPE if fmt == "qpb1" else "application/json"
        self.head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     f"Content-Type: {ctype}\r\nContent-Length: ").encode()
        self.item_tpl = (b'{"queue":"' + queue.encode() + b'","partition":"p-%04d",'
                         b'"transactionId":"%s-%d","payload":%s}')
        self.qpb1 = _Qpb1Encoder(queue, partitions, self.rng) if fmt == "qpb1" else None
        self.ledger_path = (os.path.join(ledger_dir, f"push-{producer_prefix}.json")
                            if ledger_dir else None)
        self.ledger = _Ledger() if ledger_dir else None
        # Ledger runs: (producer, seq, status, answer, minted ids) of every request, filed
        # after the window (status -1: written, never answered). Parsing each answer inside
        # the window cost the generator 2.7 instead of 0.9 us a message under 1,000-item QPB1
        # pushes, CPU taken from the broker on a 2-core machine.
        self.unfiled: list[tuple[bytes, int, int, bytes, bytes | None]] = []
        super().__init__()
        self.end = 0.0

    def body(self, producer: bytes, seq: int, pay: _Payloads | None = None
             ) -> tuple[bytes, int, bytes | None]:
        """The next request body of ``producer`` from ``seq``: (body, next seq, the 16-byte ids
        minted for its items in QPB1 ledger runs, else None)."""
        n = self.items
        rnd = self.rng.randrange
        if pay is None:
            pay = _Payloads(producer)
        if self.spread == "item":
            parts = [rnd(self.partitions) for _ in range(n)]
        else:
            parts = [rnd(self.partitions)] * n
        if self.qpb1 is not None:
            body, ids = self.qpb1.body(producer, seq, parts, self.ledger is not None)
            return body, seq + n, ids
        tpl = self.item_tpl
        items = [tpl % (parts[i], producer, seq + i, pay(seq + i)) for i in range(n)]
        return b'{"items":[' + b",".join(items) + b"]}", seq + n, None

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

    def file(self, producer: bytes, seq: int, status: int, answer: bytes, ids: bytes | None
             ) -> None:
        """Ledger runs: files the answer of the request of items ``seq ..``."""
        assert self.ledger is not None
        if status != 201:
            self.ledger.rejected(producer, seq, self.items, status, answer)
            return
        _, mismatched = self.ledger.answered(producer, seq, self.items, answer, ids)
        if mismatched:
            # A QPB1 item's id is the client's (api.md 3.5): another id back is a broker bug.
            self.errors["id_not_echoed"] += 1
            self.sample(f"201 with {mismatched} queued ids other than the minted ones: "
                        f"{answer[:300]!r}")

    async def connection(self, index: int, start: float, end: float) -> None:
        producer = f"{self.prefix}c{index}".encode()
        pay = _Payloads(producer)
        ledger = self.ledger is not None
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
            body, seq_next, ids = self.body(producer, seq, pay)
            t0 = loop()
            ok = False
            try:
                writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
                async with asyncio.timeout(self.timeout):
                    status, answer, close = await self._read_answer(reader)
                t1 = loop()
                if ledger:
                    self.unfiled.append((producer, seq, status, answer, ids))
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
                        self.items_ok += self.items
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
                if seq != seq_next:
                    # Written, not answered: the items may or may not be stored. Their seqs are
                    # not sent again (a resend would draw another partition, where dedup on
                    # transactionId cannot see the first copy).
                    if ledger:
                        self.unfiled.append((producer, seq, -1, b"", None))
                    seq = seq_next
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
        filing_s = 0.0
        if self.ledger is not None and self.ledger_path is not None:
            t0 = time.process_time()
            for i in range(connections):  # every producer, even one that got no answer
                self.ledger.producer(f"{self.prefix}c{i}".encode())
            for producer, seq, status, answer, ids in self.unfiled:
                if status < 0:
                    self.ledger.unknown(producer, seq, self.items)
                else:
                    self.file(producer, seq, status, answer, ids)
            self.unfiled = []
            self.ledger.write(self.ledger_path)
            filing_s = time.process_time() - t0
        return self.report(connections, start_at, started_wall, duration, ru0, ru1,
                           ledger_filing_cpu_s=filing_s)


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
    ap.add_argument("--format", choices=FORMATS, default="json")
    ap.add_argument("--ledger-dir", default=None)
    a = ap.parse_args(argv)
    w = _Worker(a.host, a.port, a.path, a.items, a.partitions, a.queue, a.spread, a.timeout,
                a.producer_prefix, seed=zlib.crc32(a.producer_prefix.encode()),
                fmt=a.format, ledger_dir=a.ledger_dir)
    out = asyncio.run(w.run(a.connections, a.start_at, a.duration))
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------- parent side
def split(total: int, procs: int) -> list[int]:
    """``total`` connections (or consumers) over ``procs`` processes, as evenly as can be."""
    return [total // procs + (1 if i < total % procs else 0) for i in range(procs)]


class WorkerGroup:
    """Worker processes started together, each printing one JSON report on stdout; own
    sessions, so a Ctrl-C reaches only the benchmark, which then kills them."""

    def __init__(self, argvs: list[list[str]]) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for argv in argvs:
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

    def reports(self, deadline: float) -> list[dict]:
        """Every worker's report, waiting until ``deadline`` (wall clock) at most."""
        reports = []
        try:
            for p in self.procs:
                out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
                if p.returncode != 0:
                    raise RuntimeError(f"worker {p.pid} exited {p.returncode}: "
                                       f"{err.decode(errors='replace')[-2000:]}")
                reports.append(json.loads(out))
        finally:
            self.kill()
        return reports


class LoadRun(WorkerGroup):
    """P worker processes started together; ``wait`` merges their reports."""

    def __init__(self, spec: LoadSpec, start_delay: float = 2.0) -> None:
        self.spec = spec
        u = urlsplit(spec.url)
        host, port = u.hostname or "127.0.0.1", u.port or 80
        self.start_at = time.time() + start_delay
        self.end_at = self.start_at + spec.duration
        if spec.format not in FORMATS:
            raise ValueError(f"format {spec.format!r}: one of {FORMATS}")
        if spec.ledger_dir:
            os.makedirs(spec.ledger_dir, exist_ok=True)
        argvs = []
        for i, n in enumerate(split(spec.connections, spec.procs)):
            if n == 0:
                continue
            argv = [sys.executable, "-m", "bench.loadgen", "--worker", "--host", host,
                    "--port", str(port), "--path", spec.path, "--connections", str(n),
                    "--items", str(spec.items), "--partitions", str(spec.partitions),
                    "--queue", spec.queue, "--spread", spec.spread,
                    "--timeout", str(spec.timeout),
                    "--producer-prefix", f"{spec.tag}w{i}",
                    "--start-at", repr(self.start_at), "--duration", repr(spec.duration),
                    "--format", spec.format]
            if spec.ledger_dir:
                argv += ["--ledger-dir", os.path.abspath(spec.ledger_dir)]
            argvs.append(argv)
        super().__init__(argvs)

    def wait(self) -> dict:
        return merge(self.spec, self.reports(self.end_at + self.spec.timeout + 30))


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
        "ledger_filing_cpu_s": sum(r.get("ledger_filing_cpu_s", 0.0) for r in reports),
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
    ap.add_argument("--format", choices=FORMATS, default="json",
                    help="json body, or qpb1: QPB1 frames + zstd (api.md 3.5)")
    ap.add_argument("--ledger-dir", default=None,
                    help="write push-<producer prefix>.json per worker (bench/ledger.py)")
    a = ap.parse_args(argv)
    res = run_load(LoadSpec(url=a.url, connections=a.connections, procs=a.procs, items=a.items,
                            duration=a.duration, partitions=a.partitions, queue=a.queue,
                            spread=a.spread, format=a.format, ledger_dir=a.ledger_dir))
    res.pop("workers")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
