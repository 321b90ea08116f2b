"""The fault matrix's load: producers that retry with the same transactionIds, consumers of two
groups (manual acks and autoAck), and what each of them saw, for the ledger.

Threads and a blocking HTTP client: the load is small (a few hundred messages a second) and
the point is what each request was answered, not speed. Every request either gets an HTTP
answer or fails at the socket; each failure is recorded by kind and the producer retries the
same body (same transactionIds, so the broker deduplicates) until an answer accepts every item
or the run's grace period ends.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["ACCEPTED", "Consumer", "Delivery", "Producer", "Pushed", "error_kind"]

PUSH = "/api/v1/push"
ACK = "/api/v1/ack/batch"
ACCEPTED = frozenset({"queued", "duplicate", "buffered"})
#: an exception that happened after the request was (maybe) sent: its outcome is unknown
_CUT = (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.WriteError)


#: answers that do not say whether the request applied (api.md 1.4): counted as cut
UNKNOWN_OUTCOME = ("503 timeout", "503 outcome_unknown")


def error_kind(ex: BaseException | None = None, response: httpx.Response | None = None) -> str:
    """A client's error as the ledger counts it: ``503 unavailable``, ``ConnectError``..."""
    if response is not None:
        try:
            code = response.json().get("code")
        except ValueError:
            code = None
        return f"{response.status_code} {code or '-'}"
    assert ex is not None
    return type(ex).__name__


@dataclass
class Pushed:
    """One item's final answer (its last attempt's), and how many requests it took."""

    producer: str
    seq: int
    partition: str
    status: str  # queued | duplicate | buffered | failed | unanswered (gave up)
    message_id: str | None
    attempts: int


@dataclass(frozen=True)
class Delivery:
    group: str
    transaction_id: str
    message_id: str
    partition_id: str
    offset: int
    attempt: int
    lease_id: str | None


class _RoundRobin:
    """One keep-alive client per broker instance, taken in turn request by request (a client
    spreading its load over several instances over one database)."""

    def __init__(self, urls: list[str], timeout: float) -> None:
        self._clients = [httpx.Client(base_url=u, timeout=timeout) for u in urls]
        self._next = 0

    def take(self) -> httpx.Client:
        client = self._clients[self._next]
        self._next = (self._next + 1) % len(self._clients)
        return client

    def close(self) -> None:
        for c in self._clients:
            c.close()


@dataclass
class _Shared:
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: Counter[str] = field(default_factory=Counter)
    #: requests whose outcome is unknown (socket cut after sending, or an answer saying so),
    #: by route
    cut: Counter[str] = field(default_factory=Counter)

    def error(self, route: str, kind: str, cut: bool) -> None:
        with self.lock:
            self.errors[f"{route} {kind}"] += 1
            if cut or kind in UNKNOWN_OUTCOME:
                self.cut[route] += 1


class Producer(threading.Thread):
    """Pushes ``items`` items a request to ``queue`` over ``partitions`` partitions until
    stopped; retries every failed request with its own body until ``give_up_at``."""

    def __init__(self, urls: list[str], queue: str, name: str, shared: _Shared, *, items: int = 3,
                 partitions: int = 50, pause_s: float = 0.01) -> None:
        super().__init__(name=f"producer-{name}", daemon=True)
        self.urls, self.queue, self.producer = urls, queue, name
        self.shared, self.items, self.partitions, self.pause_s = shared, items, partitions, pause_s
        self.pushed: list[Pushed] = []
        self.give_up_at = float("inf")
        self.first_ok_after: float | None = None  # set by the runner: a fault's start
        #: (sent, answered) of every all-queued answer sent from then on
        self.queued_answers: list[tuple[float, float]] = []

    def run(self) -> None:
        seq = 0
        http = _RoundRobin(self.urls, 30)
        try:
            while not self.shared.stop.is_set():
                batch = []
                for _ in range(self.items):
                    part = f"p{(hash((self.producer, seq)) & 0x7fffffff) % self.partitions}"
                    batch.append((seq, part))
                    seq += 1
                body = {"items": [{"queue": self.queue, "partition": p,
                                   "transactionId": f"{self.producer}-{s}",
                                   "payload": {"producer": self.producer, "seq": s}}
                                  for s, p in batch]}
                self._send(http, body, batch)
                time.sleep(self.pause_s)
        finally:
            http.close()

    def _send(self, http: _RoundRobin, body: dict[str, Any],
              batch: list[tuple[int, str]]) -> None:
        attempts = 0
        while True:
            attempts += 1
            sent = time.monotonic()
            try:
                r = http.take().post(PUSH, json=body)
            except httpx.HTTPError as ex:
                self.shared.error("push", error_kind(ex), isinstance(ex, _CUT))
                answer = None
            else:
                answer = r.json() if r.status_code == 201 else None
                if answer is None:
                    self.shared.error("push", error_kind(response=r), False)
                elif any(a["status"] not in ACCEPTED for a in answer):
                    self.shared.error("push", "201 item " + ",".join(sorted(
                        {a["status"] for a in answer if a["status"] not in ACCEPTED})), False)
                    answer = None
            if answer is not None:
                for (s, p), a in zip(batch, answer, strict=True):
                    self.pushed.append(Pushed(self.producer, s, p, a["status"],
                                              a.get("messageId"), attempts))
                if self.first_ok_after is not None and sent >= self.first_ok_after \
                        and all(a["status"] == "queued" for a in answer):
                    self.queued_answers.append((sent, time.monotonic()))
                return
            if time.monotonic() >= self.give_up_at:
                for s, p in batch:
                    self.pushed.append(Pushed(self.producer, s, p, "unanswered", None,
                                              attempts))
                return
            time.sleep(0.1)

    def recovered_at(self, struck: float) -> float | None:
        """When the first all-queued answer to a request sent at ``struck`` or later came."""
        return min((answered for sent, answered in self.queued_answers if sent >= struck),
                   default=None)


class Consumer(threading.Thread):
    """Pops ``group`` (long poll, 10 a pop) and, unless ``auto_ack``, acks each answer with one
    batch ack; records every delivery. Runs until stopped and then until ``idle_s`` passes
    without a message, counted from the drain's start at the earliest (the drain)."""

    def __init__(self, urls: list[str], queue: str, group: str, shared: _Shared, *,
                 auto_ack: bool = False, idle_s: float = 3.0) -> None:
        super().__init__(name=f"consumer-{group}", daemon=True)
        self.urls, self.queue, self.group, self.shared = urls, queue, group, shared
        self.auto_ack, self.idle_s = auto_ack, idle_s
        self.deliveries: list[Delivery] = []
        self.ack_failures: Counter[str] = Counter()
        #: (transactionId, leaseId) of every delivery whose ack answered success
        self.acked: set[tuple[str, str]] = set()
        self.draining = threading.Event()  # set once the load and the faults are over

    def run(self) -> None:
        params = {"consumerGroup": self.group, "batch": 10, "wait": "true", "timeout": 1000,
                  "autoAck": "true" if self.auto_ack else "false"}
        last_message = time.monotonic()
        drain_from: float | None = None
        http = _RoundRobin(self.urls, 15)
        try:
            while True:
                if self.draining.is_set():
                    # NOTE(queen): the drain's idle time counts from its start at the
                    # earliest: a push retried until the end may have committed a moment ago
                    # (a bundle held past its request's deadline), after this consumer's
                    # last message long before
                    if drain_from is None:
                        drain_from = time.monotonic()
                    if time.monotonic() - max(last_message, drain_from) > self.idle_s:
                        return
                try:
                    r = http.take().get(f"/api/v1/pop/queue/{self.queue}", params=params)
                except httpx.HTTPError as ex:
                    self.shared.error(f"pop/{self.group}", error_kind(ex), isinstance(ex, _CUT))
                    time.sleep(0.1)
                    continue
                if r.status_code == 204:
                    continue
                if r.status_code != 200:
                    self.shared.error(f"pop/{self.group}", error_kind(response=r), False)
                    time.sleep(0.1)
                    continue
                messages = r.json()["messages"]
                last_message = time.monotonic()
                self.deliveries.extend(
                    Delivery(self.group, m["transactionId"], m["id"], m["partitionId"],
                             m["offset"], m["deliveryAttempt"], m.get("leaseId"))
                    for m in messages)
                if not self.auto_ack and messages:
                    self._ack(http, messages)
        finally:
            http.close()

    def _ack(self, http: _RoundRobin, messages: list[dict[str, Any]]) -> None:
        """One batch ack; an instance that refuses the connection (nothing was sent) passes
        it to the next one, as a client of several instances does."""
        body = {"consumerGroup": self.group, "acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": m["leaseId"], "status": "completed"} for m in messages]}
        for attempt in range(len(self.urls)):
            try:
                r = http.take().post(ACK, json=body)
                break
            except httpx.ConnectError as ex:
                self.shared.error(f"ack/{self.group}", error_kind(ex), False)
                if attempt == len(self.urls) - 1:
                    return
            except httpx.HTTPError as ex:
                # the lease expires and the messages come again: the ledger explains it
                self.shared.error(f"ack/{self.group}", error_kind(ex), isinstance(ex, _CUT))
                return
        if r.status_code != 200:
            self.shared.error(f"ack/{self.group}", error_kind(response=r), False)
            return
        for m, res in zip(messages, r.json(), strict=True):  # one outcome per acknowledgment
            if res["success"]:
                self.acked.add((m["transactionId"], str(m["leaseId"])))
            else:
                self.ack_failures[str(res.get("error"))] += 1
