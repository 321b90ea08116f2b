"""Zero-loss ledger: what the producers were told, against what the consumers got.

The benchmark's throughput figures mean nothing if the broker loses, duplicates or invents
messages under load, so after a workload (broker still running) the orchestrator:

1. ``load_push_ledger(dir)``: merges the ``push-*.json`` files bench/loadgen.py writes with
   ``ledger_dir`` set: per producer, the seq ranges answered ``queued`` and their message ids,
   the seqs answered anything else, the seqs whose outcome is unknown (no answer, 503 timeout);
2. ``drain(url, queue, groups)``: pops every group to exhaustion (long poll, one
   ``/ack/batch`` per pop answer) and records each first delivery compactly (producer, seq,
   message id, partition id, delivery attempt) and each redelivery with why it happened;
3. ``check(pushed, consumed)``: per group, LOSS (queued, never consumed), DUPLICATE (consumed
   twice without a redelivery to explain it), ID_MISMATCH (another id than the push answer's),
   TXN_MISMATCH (transactionId is not ``<producer>-<seq>``), PHANTOM (consumed, never pushed or
   pushed and refused) are failures; EXTRA_UNKNOWN (consumed, push outcome unknown) is not;
4. ``check_offsets(dsn, queue)``: straight on the broker's tables, each partition's segments
   tile ``[log_start_offset, last_offset]`` without gap or overlap, and their message count
   matches what the ledger allows.

Consumption is matched on the payload's ``producer``/``seq`` (bench/loadgen.py's ``payload``),
not on transactionIds, so a broker that mixes up frames is caught too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import glob
import os
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from bench.consume import Http, HttpError

__all__ = [
    "Consumed",
    "ProducerPush",
    "PushLedger",
    "Redelivery",
    "check",
    "check_offsets",
    "drain",
    "load_push_ledger",
]

EXAMPLES = 5
_QUEUED, _UNKNOWN = 1, 2  # seq kinds in check(); other statuses get 3, 4, ...

LEGEND = {
    "expected": "items answered 'queued' by the broker (inside the window or late)",
    "consumed": "messages delivered to the group, redeliveries of one message not counted",
    "loss": "FAILURE: queued items never delivered to the group",
    "duplicates": "FAILURE: items delivered again without a failed ack or an expired lease to "
                  "explain it, or stored twice (same producer/seq at two offsets)",
    "id_mismatch": "FAILURE: delivered with another message id than the push answer gave",
    "txn_mismatch": "FAILURE: delivered transactionId is not '<producer>-<seq>' of its payload",
    "phantom": "FAILURE: delivered but never pushed, or pushed and answered as not stored",
    "ledger_conflicts": "FAILURE (harness): a seq filed under two outcomes in the push ledger",
    "redelivered": "deliveries of an already delivered message explained by a failed/unknown "
                   "ack or an expired lease (not a failure)",
    "extra_unknown": "delivered items whose push outcome was unknown (not a failure)",
    "extra_buffered": "delivered items answered 'buffered' (spooled, replayed; not a failure)",
    "pending_after_drain": "the broker's own backlog of the group after the drain (depth API): "
                           "> 0 with LOSS means the drain could not get them (stuck lease?)",
    "examples": "the first 5 of each kind (redelivered: not failures, for reading)",
}


def _id_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _id_bytes(text: str) -> bytes:
    raw = bytes.fromhex(text.replace("-", ""))
    if len(raw) != 16:
        raise ValueError(f"not a UUID: {text!r}")
    return raw


# ------------------------------------------------------------------------------ push side
Ranges = list[tuple[int, int]]


def _ranges(doc: Any) -> Ranges:
    return [(int(lo), int(hi)) for lo, hi in doc]


def _count(ranges: Ranges) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


@dataclass
class ProducerPush:
    """One producer's push outcomes; ``ids`` holds 16 bytes per queued item, in seq order."""

    queued: Ranges = field(default_factory=list)
    ids: bytes = b""
    other: dict[str, Ranges] = field(default_factory=dict)
    unknown: Ranges = field(default_factory=list)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> ProducerPush:
        pp = cls(_ranges(doc.get("queued", [])), base64.b64decode(doc.get("ids", "")),
                 {k: sorted(_ranges(v)) for k, v in doc.get("other", {}).items()},
                 sorted(_ranges(doc.get("unknown", []))))
        if len(pp.ids) != 16 * pp.queued_count:
            raise ValueError(f"{len(pp.ids)} id bytes for {pp.queued_count} queued items")
        return pp

    @property
    def queued_count(self) -> int:
        return _count(self.queued)

    def merge(self, more: ProducerPush) -> None:
        """Both files' ranges (a producer split over files; loadgen never does it)."""
        spans = [(lo, hi, self.ids[16 * k:16 * (k + hi - lo + 1)])
                 for (lo, hi), k in zip(self.queued, _starts(self.queued), strict=True)]
        spans += [(lo, hi, more.ids[16 * k:16 * (k + hi - lo + 1)])
                  for (lo, hi), k in zip(more.queued, _starts(more.queued), strict=True)]
        spans.sort()
        self.queued = [(lo, hi) for lo, hi, _ in spans]
        self.ids = b"".join(ids for _, _, ids in spans)
        for k, v in more.other.items():
            self.other[k] = sorted(self.other.get(k, []) + v)
        self.unknown = sorted(self.unknown + more.unknown)


def _starts(ranges: Ranges) -> list[int]:
    """Index of each range's first item among all the ranges' items."""
    out, k = [], 0
    for lo, hi in ranges:
        out.append(k)
        k += hi - lo + 1
    return out


@dataclass
class PushLedger:
    producers: dict[str, ProducerPush] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> PushLedger:
        """A ledger from one ``push-*.json`` document (tests build these by hand)."""
        led = cls()
        led.add_doc(doc)
        return led

    def add_doc(self, doc: dict[str, Any]) -> None:
        for name, pdoc in doc.items():
            pp = ProducerPush.from_doc(pdoc)
            if name in self.producers:
                self.producers[name].merge(pp)
            else:
                self.producers[name] = pp

    def selected(self, ignore_prefix: str | None) -> dict[str, ProducerPush]:
        if not ignore_prefix:
            return self.producers
        return {k: v for k, v in self.producers.items() if not k.startswith(ignore_prefix)}

    def totals(self, ignore_prefix: str | None = None) -> dict[str, Any]:
        sel = self.selected(ignore_prefix)
        other: Counter[str] = Counter()
        for pp in sel.values():
            for k, v in pp.other.items():
                other[k] += _count(v)
        return {"producers": len(sel), "queued": sum(p.queued_count for p in sel.values()),
                "unknown": sum(_count(p.unknown) for p in sel.values()), "other": dict(other),
                "ignored_producers": len(self.producers) - len(sel), "files": len(self.files)}


def load_push_ledger(ledger_dir: str) -> PushLedger:
    """Merges every ``push-*.json`` of ``ledger_dir``; none at all is an error (a run without
    a ledger must not pass the zero-loss check by having nothing to check)."""
    files = sorted(glob.glob(os.path.join(ledger_dir, "push-*.json")))
    if not files:
        raise FileNotFoundError(f"no push-*.json ledger file in {ledger_dir}")
    led = PushLedger()
    for path in files:
        with open(path, "rb") as f:
            led.add_doc(orjson.loads(f.read()))
        led.files.append(path)
    return led


# ------------------------------------------------------------------------------ consume side
@dataclass
class Redelivery:
    """A message delivered again to the same group. ``first_ack``: what the earlier delivery's
    ack got (``ok``, ``failed:<error>``, ``unknown:<why>``, ``pending`` if never answered);
    ``lease_expired``: redelivered after the earlier delivery's ``leaseExpiresAt``."""

    message_id: str
    partition_id: int
    offset: int
    attempt: int
    producer: str | None
    seq: int | None
    first_ack: str
    lease_expired: bool

    @property
    def explained(self) -> bool:
        return self.first_ack != "ok" or self.lease_expired

    @property
    def reason(self) -> str:
        """``ack_<fate>`` and/or ``lease_expired``, or ``unexplained`` (a DUPLICATE)."""
        parts = [] if self.first_ack == "ok" else ["ack_" + self.first_ack.split(":")[0]]
        if self.lease_expired:
            parts.append("lease_expired")
        return "+".join(parts) or "unexplained"


@dataclass
class Consumed:
    """One group's deliveries. First deliveries are kept columnar per producer (a run has
    millions): seq, 16-byte id, partition id, delivery attempt. A delivered transactionId is
    compared with ``<producer>-<seq>`` on arrival and only mismatches are kept."""

    group: str
    seqs: dict[str, array] = field(default_factory=dict)
    ids: dict[str, bytearray] = field(default_factory=dict)
    partitions: dict[str, array] = field(default_factory=dict)
    attempts: dict[str, array] = field(default_factory=dict)
    txn_mismatches: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[dict[str, Any]] = field(default_factory=list)
    redeliveries: list[Redelivery] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def add(self, producer: str, seq: int, message_id: bytes | str, *,
            transaction_id: str | None = None, partition_id: int = 0, attempt: int = 1) -> None:
        """A first delivery (tests call it directly)."""
        mid = _id_bytes(message_id) if isinstance(message_id, str) else message_id
        seqs = self.seqs.get(producer)
        if seqs is None:
            seqs = self.seqs[producer] = array("q")
            self.ids[producer] = bytearray()
            self.partitions[producer] = array("q")
            self.attempts[producer] = array("l")
        seqs.append(seq)
        self.ids[producer] += mid
        self.partitions[producer].append(partition_id)
        self.attempts[producer].append(attempt)
        if transaction_id is not None and transaction_id != f"{producer}-{seq}":
            self.txn_mismatches.append({"producer": producer, "seq": seq,
                                        "message_id": _id_text(mid),
                                        "transaction_id": transaction_id,
                                        "partition_id": partition_id})

    @property
    def first_deliveries(self) -> int:
        return sum(len(s) for s in self.seqs.values()) + len(self.foreign)


@dataclass
class _Delivery:
    """One partition's part of one pop answer, until its ack is known to have succeeded."""

    lo: int
    hi: int
    lease_expires: float
    state: str = "pending"


def _wall(iso: Any) -> float:
    if not isinstance(iso, str):
        return float("inf")
    try:
        return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("inf")


class _GroupDrain:
    def __init__(self, url: str, queue: str, group: str, batch: int, partitions: int,
                 idle_stop: float) -> None:
        self.url = url
        self.queue = queue
        self.group = group
        self.idle_stop = idle_stop
        self.path = (f"/api/v1/pop/queue/{quote(queue, safe='')}?batch={batch}&wait=true"
                     f"&timeout=1000&consumerGroup={quote(group, safe='')}"
                     f"&partitions={partitions}")
        self.out = Consumed(group)
        self.high: dict[int, int] = {}  # partition -> highest offset delivered
        self.open: dict[int, list[_Delivery]] = {}  # partition -> deliveries not acked ok
        self.redelivered: list[tuple[Redelivery, _Delivery | None, float]] = []
        self.last_msg = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []

    def error(self, key: str, what: str) -> None:
        self.errors[key] += 1
        if len(self.samples) < EXAMPLES:
            self.samples.append(what[:300])

    def take(self, doc: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[int, _Delivery]]:
        """Files one pop answer's messages; returns them and this answer's deliveries."""
        now = time.time()
        lease_expires = _wall(doc.get("leaseExpiresAt"))
        msgs: list[dict[str, Any]] = doc.get("messages") or []
        mine: dict[int, _Delivery] = {}
        out = self.out
        for m in msgs:
            pid = int(m["partitionId"])
            off = int(m["offset"])
            d = mine.get(pid)
            if d is None:
                d = mine[pid] = _Delivery(off, off, lease_expires)
            d.lo, d.hi = min(d.lo, off), max(d.hi, off)
            mid = _id_bytes(m["id"])
            data = m.get("data")
            producer = seq = None
            if isinstance(data, dict) and isinstance(data.get("producer"), str) \
                    and isinstance(data.get("seq"), int):
                producer, seq = data["producer"], data["seq"]
            attempt = int(m.get("deliveryAttempt") or 0)
            if off <= self.high.get(pid, 0):
                self.counts["redeliveries"] += 1
                earlier = next((e for e in reversed(self.open.get(pid, []))
                                if e.lo <= off <= e.hi), None)
                rd = Redelivery(_id_text(mid), pid, off, attempt, producer, seq, "ok", False)
                self.redelivered.append((rd, earlier, now))
                continue
            self.high[pid] = off
            if producer is None or seq is None:
                out.foreign.append({"message_id": _id_text(mid), "partition_id": pid,
                                    "offset": off, "transaction_id": m.get("transactionId"),
                                    "data": orjson.dumps(data)[:120].decode(errors="replace")})
                continue
            out.add(producer, seq, mid, transaction_id=m.get("transactionId"),
                    partition_id=pid, attempt=attempt)
        for pid, d in mine.items():
            self.open.setdefault(pid, []).append(d)
        return msgs, mine

    async def ack(self, http: Http, msgs: list[dict[str, Any]], mine: dict[int, _Delivery]
                  ) -> None:
        """One /ack/batch for the whole answer, retried on an uncertain outcome (api.md 2.4:
        a repeat is answered as the first); each partition's delivery gets its ack's fate."""
        g = self.group
        body = orjson.dumps({"consumerGroup": g, "acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m.get("leaseId"), "consumerGroup": g, "status": "completed"}
            for m in msgs]})
        why = "no answer"
        for attempt in range(5):
            if attempt:
                await asyncio.sleep(0.2 * attempt)
            try:
                status, answer = await http.request("POST", "/api/v1/ack/batch", body)
            except HttpError as ex:
                why = str(ex).split(":")[0]
                self.error("ack_" + why, str(ex))
                continue
            if status != 200:
                why = f"http_{status}"
                self.error(f"ack_http_{status}", f"ack {status} {answer[:200]!r}")
                if status in (429, 500, 503):
                    continue
                break
            try:
                results = orjson.loads(answer)
            except orjson.JSONDecodeError:
                results = None
            if not isinstance(results, list) or len(results) != len(msgs):
                why = "bad_answer"
                self.error("ack_bad_answer", f"ack 200 {answer[:200]!r}")
                break
            for m, r in zip(msgs, results, strict=True):
                d = mine[int(m["partitionId"])]
                if r.get("success") is True:
                    self.counts["acked"] += 1
                    if d.state == "pending":
                        d.state = "ok"
                else:
                    err = str(r.get("error"))
                    self.counts["ack_failed"] += 1
                    self.error(f"ack_item_{err}", f"ack item {r}")
                    d.state = f"failed:{err}"
            for pid, d in mine.items():
                if d.state == "ok":
                    self.open[pid].remove(d)
            return
        for d in mine.values():
            d.state = f"unknown:{why}"
        self.counts["ack_lost"] += len(msgs)

    async def consumer(self) -> None:
        http = Http(self.url, timeout=30.0)
        try:
            while time.monotonic() - self.last_msg < self.idle_stop:
                try:
                    status, body = await http.request("GET", self.path, timeout=31.0)
                except HttpError as ex:
                    self.error("pop_" + str(ex).split(":")[0], str(ex))
                    await asyncio.sleep(0.1)
                    continue
                self.counts["pops"] += 1
                if status == 204:
                    self.counts["empty_pops"] += 1
                    continue
                if status != 200:
                    self.error(f"pop_http_{status}", f"pop {status} {body[:200]!r}")
                    await asyncio.sleep(0.1)
                    continue
                msgs, mine = self.take(orjson.loads(body))
                if not msgs:
                    self.counts["empty_pops"] += 1
                    continue
                self.last_msg = time.monotonic()
                self.counts["delivered"] += len(msgs)
                await self.ack(http, msgs, mine)
        finally:
            http.close()

    async def pending(self) -> int | None:
        """The broker's backlog for the group after the drain: tells a message the drain could
        not get (a stuck lease) from one the broker no longer has."""
        http = Http(self.url, timeout=30.0)
        try:
            status, body = await http.request(
                "GET", f"/api/v1/resources/queues/{quote(self.queue, safe='')}/depth"
                       f"?group={quote(self.group, safe='')}")
            if status == 200:
                value = orjson.loads(body).get("pending")
                return int(value) if value is not None else None
            self.error(f"depth_http_{status}", f"depth {status} {body[:200]!r}")
        except (HttpError, ValueError, TypeError) as ex:
            self.error("depth_error", str(ex))
        finally:
            http.close()
        return None

    async def run(self, consumers: int) -> Consumed:
        t0 = time.monotonic()
        await asyncio.gather(*(self.consumer() for _ in range(consumers)))
        for rd, earlier, when in self.redelivered:
            if earlier is not None:
                rd.first_ack = earlier.state
                rd.lease_expired = when > earlier.lease_expires
            self.out.redeliveries.append(rd)
        out = self.out
        out.stats = {"seconds": round(time.monotonic() - t0, 3),
                     "pops": self.counts["pops"], "empty_pops": self.counts["empty_pops"],
                     "delivered": self.counts["delivered"],
                     "first_deliveries": out.first_deliveries,
                     "redeliveries": self.counts["redeliveries"],
                     "acked": self.counts["acked"], "ack_failed": self.counts["ack_failed"],
                     "ack_lost": self.counts["ack_lost"],
                     "pending_after_drain": await self.pending(),
                     "errors": dict(self.errors), "error_samples": self.samples}
        return out


async def drain(url: str, queue: str, groups: list[str], *, batch: int = 1000,
                consumers: int = 4, idle_stop: float = 5.0, partitions: int = 10
                ) -> dict[str, Consumed]:
    """Pops ``queue`` for every group (concurrently, ``consumers`` long-polling connections
    each) and acks every answer, until no message came for ``idle_stop`` seconds."""
    drains = [_GroupDrain(url, queue, g, batch, partitions, idle_stop) for g in groups]
    done = await asyncio.gather(*(d.run(consumers) for d in drains))
    return {c.group: c for c in done}


# ------------------------------------------------------------------------------ the check
class _Examples(dict[str, list[dict[str, Any]]]):
    def add(self, kind: str, what: dict[str, Any]) -> None:
        lst = self.setdefault(kind, [])
        if len(lst) < EXAMPLES:
            lst.append(what)


def _check_group(pushed: dict[str, ProducerPush], c: Consumed,
                 ignore_prefix: str | None) -> dict[str, Any]:
    n: Counter[str] = Counter()
    ex = _Examples()
    statuses: list[str] = ["", "queued", "unknown"]
    expected = 0
    for name in sorted(set(pushed) | set(c.seqs)):
        if ignore_prefix and name.startswith(ignore_prefix):
            n["ignored"] += len(c.seqs.get(name, ()))
            continue
        pp = pushed.get(name) or ProducerPush()
        expected += pp.queued_count
        filed: list[tuple[int, Ranges]] = [(_QUEUED, pp.queued), (_UNKNOWN, pp.unknown)]
        for st, rs in pp.other.items():
            if st not in statuses:
                statuses.append(st)
            filed.append((statuses.index(st), rs))
        size = 1 + max((hi for _, rs in filed for _, hi in rs), default=-1)
        kind = bytearray(size)
        for code, rs in filed:
            for lo, hi in rs:
                if kind[lo:hi + 1].count(0) != hi - lo + 1:
                    n["ledger_conflicts"] += 1
                    ex.add("ledger_conflicts", {"producer": name, "seqs": [lo, hi]})
                kind[lo:hi + 1] = bytes((code,)) * (hi - lo + 1)
        want = bytearray(16 * size)  # the push answer's id per queued seq
        for (lo, hi), k in zip(pp.queued, _starts(pp.queued), strict=True):
            want[16 * lo:16 * (hi + 1)] = pp.ids[16 * k:16 * (k + hi - lo + 1)]
        seen = bytearray(size)
        seqs = c.seqs.get(name, array("q"))
        ids = c.ids.get(name, bytearray())
        parts = c.partitions.get(name, array("q"))
        for i, s in enumerate(seqs):
            n["consumed"] += 1
            mid = bytes(ids[16 * i:16 * i + 16])
            if not 0 <= s < size:
                n["phantom"] += 1
                ex.add("phantom", {"producer": name, "seq": s, "message_id": _id_text(mid),
                                   "partition_id": parts[i], "why": "never pushed"})
                continue
            if seen[s]:
                n["duplicates"] += 1
                ex.add("duplicates", {"producer": name, "seq": s, "message_id": _id_text(mid),
                                      "partition_id": parts[i],
                                      "why": "delivered again as a new message (another "
                                             "offset): stored twice"})
            else:
                seen[s] = 1
            k = kind[s]
            if k == _QUEUED:
                if want[16 * s:16 * s + 16] != mid:
                    n["id_mismatch"] += 1
                    ex.add("id_mismatch", {"producer": name, "seq": s,
                                           "pushed_id": _id_text(bytes(want[16 * s:16 * s + 16])),
                                           "consumed_id": _id_text(mid),
                                           "partition_id": parts[i]})
            elif k == _UNKNOWN:
                n["extra_unknown"] += 1
            elif k and statuses[k] == "buffered":
                n["extra_buffered"] += 1
            else:
                n["phantom"] += 1
                why = "never pushed" if k == 0 else f"push answered {statuses[k]!r}"
                ex.add("phantom", {"producer": name, "seq": s, "message_id": _id_text(mid),
                                   "partition_id": parts[i], "why": why})
        for (lo, hi), k in zip(pp.queued, _starts(pp.queued), strict=True):
            missing = seen[lo:hi + 1].count(0)
            if not missing:
                continue
            n["loss"] += missing
            if len(ex.get("loss", ())) < EXAMPLES:
                for s in range(lo, hi + 1):
                    if not seen[s]:
                        j = k + s - lo
                        ex.add("loss", {"producer": name, "seq": s,
                                        "message_id": _id_text(pp.ids[16 * j:16 * j + 16])})
    for f in c.foreign:
        n["phantom"] += 1
        ex.add("phantom", {**f, "why": "payload is not a bench message (producer/seq)"})
    for t in c.txn_mismatches:
        if not (ignore_prefix and t["producer"].startswith(ignore_prefix)):
            n["txn_mismatch"] += 1
            ex.add("txn_mismatch", t)
    reasons: Counter[str] = Counter()
    for rd in c.redeliveries:
        if ignore_prefix and rd.producer and rd.producer.startswith(ignore_prefix):
            continue
        reasons[rd.reason] += 1
        if rd.explained:
            n["redelivered"] += 1
            ex.add("redelivered", {"producer": rd.producer, "seq": rd.seq,
                                   "message_id": rd.message_id, "offset": rd.offset,
                                   "attempt": rd.attempt, "first_ack": rd.first_ack,
                                   "lease_expired": rd.lease_expired})
        else:
            n["duplicates"] += 1
            ex.add("duplicates", {"producer": rd.producer, "seq": rd.seq,
                                  "message_id": rd.message_id, "partition_id": rd.partition_id,
                                  "offset": rd.offset, "attempt": rd.attempt,
                                  "why": "redelivered although the earlier delivery was acked "
                                         "successfully within its lease"})
    kinds = ("loss", "duplicates", "id_mismatch", "txn_mismatch", "phantom", "ledger_conflicts")
    failures = [f"{k.upper()}: {n[k]} ({LEGEND[k].split(': ', 1)[1]})" for k in kinds if n[k]]
    return {"ok": not failures, "expected": expected, "consumed": n["consumed"] + len(c.foreign),
            "loss": n["loss"], "duplicates": n["duplicates"], "redelivered": n["redelivered"],
            "redelivery_reasons": dict(reasons), "id_mismatch": n["id_mismatch"],
            "txn_mismatch": n["txn_mismatch"], "phantom": n["phantom"],
            "extra_unknown": n["extra_unknown"], "extra_buffered": n["extra_buffered"],
            "ledger_conflicts": n["ledger_conflicts"], "ignored": n["ignored"],
            "pending_after_drain": c.stats.get("pending_after_drain"),
            "failures": failures, "examples": dict(ex), "drain": c.stats}


def check(pushed: PushLedger, consumed: dict[str, Consumed], *,
          ignore_producers_prefix: str | None = None) -> dict[str, Any]:
    """Every group against the push ledger (see LEGEND). ``ok`` is false on any failure kind,
    on a ledger with nothing queued, or on no group at all: a check that checked nothing must
    not pass."""
    totals = pushed.totals(ignore_producers_prefix)
    selected = pushed.selected(ignore_producers_prefix)
    groups = {g: _check_group(selected, c, ignore_producers_prefix)
              for g, c in consumed.items()}
    failures = [f"group {g!r}: {f}" for g, r in groups.items() for f in r["failures"]]
    if not totals["queued"]:
        failures.append("EMPTY: the push ledger has no queued item: nothing was checked")
    if not groups:
        failures.append("NO GROUP: nothing was drained: nothing was checked")
    ok = not failures
    lines = [f"{g!r}: {r['consumed']} consumed of {r['expected']} queued, loss {r['loss']}, "
             f"duplicates {r['duplicates']}, redelivered {r['redelivered']}, id_mismatch "
             f"{r['id_mismatch']}, txn_mismatch {r['txn_mismatch']}, phantom {r['phantom']}, "
             f"extra_unknown {r['extra_unknown']}" for g, r in groups.items()]
    verdict = ("ZERO-LOSS CHECK PASSED" if ok else "ZERO-LOSS CHECK FAILED: " + "; ".join(failures))
    return {"ok": ok, "verdict": verdict, "summary": lines, "failures": failures,
            "pushed": totals, "groups": groups, "legend": LEGEND}


# ------------------------------------------------------------------------------ the log itself
_OFFSETS_SQL = """
WITH p AS (
    SELECT lp.id, lp.name, q.tenant, lp.log_start_offset, lp.last_offset
      FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
     WHERE q.name = %s),
s AS (
    SELECT s.partition_id, s.base_offset, s.msg_count,
           lag(s.base_offset + s.msg_count) OVER w AS want_base
      FROM queen.log_segments s
     WHERE s.partition_id IN (SELECT id FROM p)
    WINDOW w AS (PARTITION BY s.partition_id ORDER BY s.base_offset))
SELECT p.id, p.name, p.tenant::text, p.log_start_offset, p.last_offset,
       count(s.base_offset), coalesce(sum(s.msg_count), 0)::int8,
       min(s.base_offset), max(s.base_offset + s.msg_count - 1),
       count(*) FILTER (WHERE s.base_offset > s.want_base),
       count(*) FILTER (WHERE s.base_offset < s.want_base),
       (array_agg(s.base_offset ORDER BY s.base_offset)
            FILTER (WHERE s.base_offset <> s.want_base))[1:3]
  FROM p LEFT JOIN s ON s.partition_id = p.id
 GROUP BY 1, 2, 3, 4, 5
 ORDER BY 2, 1
"""


def check_offsets(dsn: str, queue: str, *, pushed: PushLedger | None = None,
                  ignore_producers_prefix: str | None = None) -> dict[str, Any]:
    """Reads queen.log_partitions/log_segments of ``queue`` (every tenant): per partition the
    segments' ``[base_offset, base_offset + msg_count - 1]`` must tile ``[log_start_offset,
    last_offset]`` exactly (an empty log has ``log_start_offset = last_offset + 1``). With
    ``pushed``, the total must lie in [queued, queued + unknown + buffered] of the ledger
    (all its producers are assumed to have pushed to ``queue``)."""
    import psycopg  # only this check needs a database driver

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(_OFFSETS_SQL, (queue,)).fetchall()
    problems: list[dict[str, Any]] = []
    total = segments = 0
    for (pid, name, tenant, start, last, nseg, msgs, lo, hi, gaps, overlaps, where) in rows:
        total += msgs
        segments += nseg
        where_ = {"partition_id": pid, "partition": name, "tenant": tenant,
                  "log_start_offset": start, "last_offset": last}
        if nseg == 0:
            if last != start - 1:
                problems.append({**where_, "problem": "no segment, but the log is not empty"})
            continue
        if gaps:
            problems.append({**where_, "problem": f"{gaps} gap(s) between segments",
                             "first_bad_segments_at": where})
        if overlaps:
            problems.append({**where_, "problem": f"{overlaps} overlapping segment(s)",
                             "first_bad_segments_at": where})
        if lo != start:
            problems.append({**where_, "problem": f"first segment starts at {lo}, not at "
                                                  f"log_start_offset"})
        if hi != last:
            problems.append({**where_, "problem": f"last segment ends at {hi}, not at "
                                                  f"last_offset"})
        if not gaps and not overlaps and msgs != last - start + 1:
            problems.append({**where_, "problem": f"{msgs} messages in segments for "
                                                  f"{last - start + 1} offsets"})
    out: dict[str, Any] = {"queue": queue, "partitions": len(rows), "segments": segments,
                           "messages": total}
    if not rows:
        problems.append({"problem": f"queue {queue!r} has no partition"})
    if pushed is not None:
        t = pushed.totals(ignore_producers_prefix)
        lo_n = t["queued"]
        hi_n = lo_n + t["unknown"] + t["other"].get("buffered", 0)
        out["expected"] = {"min": lo_n, "max": hi_n,
                           "why": "queued items, plus those of unknown outcome or buffered"}
        if not lo_n <= total <= hi_n:
            what = "fewer" if total < lo_n else "more"
            problems.append({"problem": f"{total} messages stored: {what} than the ledger "
                                        f"allows [{lo_n}, {hi_n}]"})
    out["ok"] = not problems
    out["problem_count"] = len(problems)
    out["problems"] = problems[:20]
    out["verdict"] = ("OFFSETS CHECK PASSED" if not problems else
                      f"OFFSETS CHECK FAILED: {len(problems)} problem(s), first: "
                      f"{problems[0]['problem']}")
    return out


def _main() -> None:
    """``python -m bench.ledger --url U --queue Q --ledger-dir D --group g [--dsn DSN]``: the
    same check by hand after a loadgen run."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="python -m bench.ledger")
    ap.add_argument("--url", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--ledger-dir", required=True)
    ap.add_argument("--group", action="append", required=True)
    ap.add_argument("--dsn", default=None)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--idle-stop", type=float, default=5.0)
    a = ap.parse_args()
    pushed = load_push_ledger(a.ledger_dir)
    consumed = asyncio.run(drain(a.url, a.queue, a.group, partitions=a.partitions,
                                 idle_stop=a.idle_stop))
    res = check(pushed, consumed)
    if a.dsn:
        res["offsets"] = check_offsets(a.dsn, a.queue, pushed=pushed)
        res["ok"] = res["ok"] and res["offsets"]["ok"]
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(res, indent=2, default=str))
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    _main()
