"""Admission of write requests (docs/api.md 1.8): a per-worker byte budget, 429 and 507 at the edge.

``POST /api/v1/push``, ``/transaction``, ``/kv``, ``/timers`` and ``/ephemeral/push`` take permits
worth their ``Content-Length`` from the front worker's budget (``QUEEN_ADMIT_MAX_MB``) in
``process_request``,
before the responder reads a byte of the body, and give them back in ``process_response``.
Falcon calls ``process_response`` of every middleware also when a responder (or a
``process_request``) raised, so the permits come back on every error; a finalizer on the
request context is the backstop for the one path that skips it, a task cancelled mid-request.
Every other route (pops, acks, GETs, admin) takes no permits.

Work window. Push and transaction bodies become items that stay in the worker (and the
shard) until their verdicts; 64 connections pushing 1,000 items each kept 64 bodies' worth in
flight. So these two routes also take permits from a second, small FIFO budget, the work window
(``QUEEN_PUSH_WINDOW_KB``), after the admission budget and within the same hold: a request
beyond the window waits unread, like one beyond the budget, and answers the same 429 when the
hold runs out. A body larger than the window takes all of it. A compressed body (QPB1 push,
QTB1 transaction) weighs less than it becomes: once read, its grant is re-sized to what its zstd
frame headers say it decodes to (``Grant.rewindow``), before anything is decompressed.

Sizing. A request with ``Content-Length: n`` takes ``n`` bytes; one without (chunked) takes the
body limit's worth (``QUEEN_MAX_BODY_MB``), as it may be that big; one declaring more than the
body limit takes nothing, because ``read_body`` answers it ``413`` before reading. Any size is
clamped to the whole budget, so a request bigger than the budget waits for the budget to drain
(and holds all of it) instead of waiting forever. An empty body takes nothing and never waits.

Fairness. The budget is FIFO: a request is granted only when every request queued before it has
been, so a big request waits for room while the small ones behind it wait too, and cannot be
starved by a stream of them. Waiters are futures in a deque, granted from ``release``; nothing
polls.

Waiting. A request not granted within ``QUEEN_ADMIT_HOLD_MS`` x uniform(0.9, 1.1) (jitter, so a
burst that queued together does not give up together) leaves the queue and answers
``429 overloaded``, ``Retry-After: n``, n in 1..5: one second, plus one per budget's worth of
bytes still queued when it gives up (capped at 5). ``QUEEN_ADMIT_HOLD_MS=0`` answers
429 at once when the request does not fit. Nothing happened on a 429: the body was never read.
While a request waits, its bytes stay in the socket (the front worker stops reading a connection
at the end of a big body's headers until the app asks for the body: queen_mp/processes/uvworker.py
``CorkedHttpToolsProtocol.on_headers_complete``), but for what came with its headers: one read of
the connection's receive buffer (``QUEEN_RECV_BUFFER_KB``, ``limit_receive_buffers``).

Disk. Push and transaction answer ``507 storage_full`` when the filesystem of the spool, or of
the embedded PostgreSQL data directory when there is one, is more than ``QUEEN_DISK_HIGH_PCT``
used. The check runs before admission (and again after a wait) and before the body is read; the
usage is sampled (``os.statvfs``) at most once a second. KV and timer writes are not refused
for the disk: docs/api.md 1.8 names push and transaction only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import falcon.asgi

from queen_mp.http.errors import ApiError, Overloaded, StorageFull
from queen_mp.http.kv import kv_error

if TYPE_CHECKING:
    from queen_mp.front.worker import FrontWorker
    from queen_mp.metrics import Metrics

__all__ = [
    "ADMITTED_PATHS",
    "DISK_CHECKED_PATHS",
    "WINDOWED_PATHS",
    "Admission",
    "ByteBudget",
    "Grant",
    "disk_used_pct",
    "rewindow",
]

log = logging.getLogger("queen_mp.http.admission")

ADMITTED_PATHS = frozenset({"/api/v1/push", "/api/v1/transaction", "/api/v1/kv",
                            "/api/v1/timers", "/api/v1/ephemeral/push"})
DISK_CHECKED_PATHS = frozenset({"/api/v1/push", "/api/v1/transaction"})
WINDOWED_PATHS = DISK_CHECKED_PATHS  # bodies that become items awaiting verdicts
_KV_SHAPED = frozenset({"/api/v1/kv", "/api/v1/timers"})  # docs/api.md 2.11 error shape

JITTER = 0.1  # the hold is QUEEN_ADMIT_HOLD_MS x uniform(1 - JITTER, 1 + JITTER)
DISK_SAMPLE_S = 1.0
RETRY_AFTER_MAX_S = 5


# ------------------------------------------------------------------------------ the budget
@dataclass(eq=False)
class _Waiter:
    size: int
    future: asyncio.Future[bool]


@dataclass(eq=False)
class ByteBudget:
    """A FIFO byte semaphore of one event loop (one front worker)."""

    capacity: int
    available: int = field(init=False)
    waiting_bytes: int = field(init=False, default=0)
    _waiters: deque[_Waiter] = field(init=False, default_factory=deque)

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError("capacity must be positive")
        self.available = self.capacity

    @property
    def in_use(self) -> int:
        return self.capacity - self.available

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def clamp(self, size: int) -> int:
        return max(0, min(size, self.capacity))

    def try_acquire(self, size: int) -> bool:
        """Take ``size`` (already clamped) bytes if that needs no wait."""
        if size == 0 or (not self._waiters and size <= self.available):
            self.available -= size
            return True
        return False

    async def acquire(self, size: int, timeout_s: float) -> bool:
        """Take ``size`` (already clamped) bytes; False if not granted within ``timeout_s``.

        A task cancelled while waiting leaves the queue (or gives back what it was granted).
        """
        if self.try_acquire(size):
            return True
        if timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        waiter = _Waiter(size, loop.create_future())
        self._waiters.append(waiter)
        self.waiting_bytes += size
        # The timer resolves the future on the loop, like a grant does: exactly one of them
        # wins, with no cancellation race between a grant and the deadline.
        timer = loop.call_later(timeout_s, self._expire, waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.result():
                self.release(size)
            else:
                self._drop(waiter)
            raise
        finally:
            timer.cancel()

    def release(self, size: int) -> None:
        self.available += size
        if self.available > self.capacity:  # a bug; never let the budget grow
            log.error("admission budget over-released by %d bytes",
                      self.available - self.capacity)
            self.available = self.capacity
        if self._waiters:  # PERF(http): no call when nobody waits (nearly every release)
            self._grant()

    def retry_after(self) -> int:
        """Whole seconds 1..5: one, plus one per budget's worth of bytes still queued."""
        return 1 + min(RETRY_AFTER_MAX_S - 1, self.waiting_bytes // self.capacity)

    def _expire(self, waiter: _Waiter) -> None:
        if not waiter.future.done():
            self._drop(waiter)
            waiter.future.set_result(False)

    def _drop(self, waiter: _Waiter) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            return
        self.waiting_bytes -= waiter.size
        self._grant()  # it may have been the head that held the others back

    def _grant(self) -> None:
        while self._waiters and self._waiters[0].size <= self.available:
            waiter = self._waiters.popleft()
            self.waiting_bytes -= waiter.size
            if waiter.future.done():  # its task was cancelled
                continue
            self.available -= waiter.size
            waiter.future.set_result(True)


class Grant:
    """Permits held by one request (admission budget and work window); released once, by
    process_response or the backstop."""

    __slots__ = ("_admission", "_admitted", "_deadline", "_finalizer", "size", "window")

    def __init__(self, admission: Admission, size: int, window: int,
                 deadline: float | None = None) -> None:
        self._admission = admission
        self.size = size
        self.window = window
        self._admitted = time.monotonic()
        self._deadline = deadline
        self._finalizer: weakref.finalize | None = None

    @property
    def deadline(self) -> float:
        """Monotonic time at which the request's one hold ends.

        PERF(http): drawn (with its jitter) when first needed: a request that never waits
        for permits, nearly every one, draws none."""
        deadline = self._deadline
        if deadline is None:
            deadline = self._deadline = self._admitted + self._admission.hold_s()
        return deadline

    def guard(self, owner: object) -> None:
        """Release when ``owner`` is collected without an explicit release."""
        loop = asyncio.get_running_loop()
        self._finalizer = weakref.finalize(owner, _release_later, loop, self)
        self._finalizer.atexit = False

    async def rewindow(self, path: str, work: int) -> None:
        """Hold ``work`` bytes of the work window instead of the body's length, once the body
        says it becomes more than it weighs (compressed frames); a 429 past the request's hold
        (the one it was admitted under: a request never waits longer than one hold in all).

        What the request holds goes back first and it queues again like a new one: two
        requests that both grow never wait for each other's permits.
        """
        admission, window = self._admission, self._admission.window
        if window is None or self.window <= 0 or self.size < 0:
            return  # not a windowed request, or already released
        size = window.clamp(work)
        if size <= self.window:
            return
        window.release(self.window)
        self.window = 0
        if not await window.acquire(size, self.deadline - time.monotonic()):
            admission._reject(path, admission._overloaded(window))
        self.window = size

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self.size >= 0:
            size, self.size = self.size, -1
            self._admission._released(size, self.window)


async def rewindow(req: falcon.asgi.Request, work: int) -> None:
    """``Grant.rewindow`` of the request's grant: a compressed body (QPB1 push, QTB1
    transaction) holds the work window for ``work``, what it decodes to. Nothing when the
    request holds no grant (admission took no permits for it)."""
    grant: Grant | None = getattr(req.context, "admission", None)
    if grant is not None:
        await grant.rewindow(req.path, work)


def _release_later(loop: asyncio.AbstractEventLoop, grant: Grant) -> None:
    # the finalizer may run from any thread's garbage collection
    if grant.size >= 0:
        log.warning("admission permits of %d bytes released by the backstop", grant.size)
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(grant.release)


# ------------------------------------------------------------------------------ the disk
def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def disk_used_pct(paths: Iterable[Path | str]) -> float:
    """The highest use (percent, as ``df`` computes it) of the filesystems holding ``paths``;
    a path that does not exist yet is measured at its nearest existing ancestor."""
    worst = 0.0
    for p in paths:
        st = os.statvfs(_existing(Path(p)))
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        avail = st.f_bavail * st.f_frsize
        if used + avail > 0:
            worst = max(worst, 100.0 * used / (used + avail))
    return worst


# ------------------------------------------------------------------------------ middleware
class Admission:
    """Falcon ASGI middleware: byte-budget admission and the disk high-water mark.

    ``disk_usage`` returns the percent used of the storage to protect; ``clock`` (monotonic
    seconds) paces its sampling; ``rng`` draws the hold jitter; ``metrics`` returns the
    worker's ``Metrics`` (or None before start). All injectable for tests.
    """

    def __init__(self, budget_bytes: int, hold_ms: int, *, max_body_bytes: int,
                 disk_high_pct: float, disk_usage: Callable[[], float],
                 window_bytes: int = 0,
                 metrics: Callable[[], Metrics | None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.budget = ByteBudget(budget_bytes)
        #: the work window of push and transaction bodies; 0 = none
        self.window = ByteBudget(window_bytes) if window_bytes > 0 else None
        self.hold_ms = hold_ms
        self.max_body_bytes = max_body_bytes
        self.disk_high_pct = disk_high_pct
        self._disk_usage = disk_usage
        self._metrics = metrics
        self._clock = clock
        self._rng = rng or random.Random()
        self._disk_pct = 0.0
        self._disk_at: float | None = None
        self._sampled = False  # the gauge of bytes in flight is sampled by the metrics' tally

    @classmethod
    def for_worker(cls, worker: FrontWorker) -> Admission:
        cfg = worker.config
        paths = [cfg.spool_path]
        if not cfg.pg_dsn:
            paths.append(cfg.embedded_pg_path)
        return cls(cfg.admit_max_mb << 20, cfg.admit_hold_ms,
                   max_body_bytes=cfg.max_body_mb << 20, disk_high_pct=cfg.disk_high_pct,
                   disk_usage=lambda: disk_used_pct(paths), window_bytes=cfg.push_window_kb << 10,
                   metrics=lambda: worker.metrics)

    # --- sizing and timing
    def cost(self, content_length: int | None) -> int:
        if content_length is None:
            return self.budget.clamp(self.max_body_bytes)
        if content_length > self.max_body_bytes:
            return 0  # read_body answers 413 before reading a byte
        if 0 <= content_length <= self.budget.capacity:  # PERF(http): no clamp call
            return content_length
        return self.budget.clamp(content_length)

    def hold_s(self) -> float:
        return self.hold_ms / 1000 * self._rng.uniform(1 - JITTER, 1 + JITTER)

    def disk_pct(self) -> float:
        """The sampled disk use, refreshed at most every DISK_SAMPLE_S."""
        now = self._clock()
        if self._disk_at is None or now - self._disk_at >= DISK_SAMPLE_S:
            try:
                self._disk_pct = float(self._disk_usage())
            except OSError as ex:  # cannot measure: do not refuse writes for it
                log.warning("disk usage not measurable: %s", ex)
                self._disk_pct = 0.0
            self._disk_at = now
        return self._disk_pct

    # --- falcon hooks
    async def process_request(self, req: falcon.asgi.Request,
                              resp: falcon.asgi.Response) -> None:
        if req.method != "POST" or req.path not in ADMITTED_PATHS:
            return
        # a 429/507 raised here happens before routing; label it with its route anyway
        req.uri_template = req.path
        grant = await self.admit(req.path, req.content_length)
        if grant is not None:
            req.context.admission = grant
            grant.guard(req.context)

    def admit_now(self, path: str, content_length: int | None) -> Grant | bool | None:
        """``admit``'s answer when it needs no wait, else False (and nothing taken): the
        caller then awaits ``admit``.

        PERF(http): what fits is admitted by a plain call, with no coroutine made and run
        (nearly every request), and the budgets' ``try_acquire`` taken inline: a Python call
        costs some 1k instructions, and admission made a dozen a request."""
        if path in DISK_CHECKED_PATHS:
            at = self._disk_at  # the sample, unless it is due again (``disk_pct``)
            pct = (self._disk_pct if at is not None and self._clock() - at < DISK_SAMPLE_S
                   else self.disk_pct())
            if pct > self.disk_high_pct:
                self._check_disk(path)  # raises
        budget = self.budget
        size = self.cost(content_length)
        if size and (budget._waiters or size > budget.available):
            return False
        budget.available -= size
        window = 0
        pool = self.window
        if pool is not None and path in WINDOWED_PATHS:
            window = size if size <= pool.capacity else pool.capacity
            if window and (pool._waiters or window > pool.available):
                budget.release(size)
                return False
            pool.available -= window
        if not size:
            return None
        grant = Grant(self, size, window)
        if not self._sampled:
            self._sample()
        return grant

    async def admit(self, path: str, content_length: int | None) -> Grant | None:
        """Permits for a POST to ``path`` (one of ADMITTED_PATHS) declaring ``content_length``
        bytes, or a 429/507 refusal; None when it takes none. The caller releases them."""
        self._check_disk(path)
        size = self.cost(content_length)
        # PERF(http): what fits takes its permits without a coroutine, a clock or a jitter
        # draw; only a wait awaits
        deadline: float | None = None
        waited = not self.budget.try_acquire(size)
        if waited:
            deadline = time.monotonic() + self.hold_s()
            if not await self.budget.acquire(size, deadline - time.monotonic()):
                self._reject(path, self._overloaded(self.budget))
        window = 0
        if self.window is not None and path in WINDOWED_PATHS:
            window = self.window.clamp(size)
            if not self.window.try_acquire(window):
                waited = True
                if deadline is None:
                    deadline = time.monotonic() + self.hold_s()
                try:
                    admitted = await self.window.acquire(window, deadline - time.monotonic())
                except BaseException:  # cancelled while waiting: no grant holds ``size`` yet
                    self._released(size, 0)
                    raise
                if not admitted:
                    self._released(size, 0)
                    self._reject(path, self._overloaded(self.window))
        grant = None
        if size:
            grant = Grant(self, size, window, deadline)
            if not self._sampled:
                self._sample()
        if waited:
            try:
                self._check_disk(path)  # it may have filled while we waited (sampled: cheap)
            except ApiError:
                if grant is not None:
                    grant.release()
                raise
        return grant

    async def process_response(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                               resource: object, req_succeeded: bool) -> None:
        grant: Grant | None = getattr(req.context, "admission", None)
        if grant is not None:
            req.context.admission = None
            grant.release()

    # --- helpers
    def _released(self, size: int, window: int) -> None:
        if window and self.window is not None:
            self.window.release(window)
        self.budget.release(size)

    def _check_disk(self, path: str) -> None:
        if path not in DISK_CHECKED_PATHS:
            return
        pct = self.disk_pct()
        if pct > self.disk_high_pct:
            self._reject(path, StorageFull(
                f"storage is {pct:.1f}% used, above the {self.disk_high_pct:g}% high-water "
                "mark (QUEEN_DISK_HIGH_PCT); nothing was written"))

    def _overloaded(self, budget: ByteBudget) -> ApiError:
        seconds = budget.retry_after()
        what = "admission budget" if budget is self.budget else "push work window"
        return Overloaded(
            f"{what} of this worker stayed full for {self.hold_ms} ms; nothing "
            f"happened, retry after {seconds} s", headers={"Retry-After": str(seconds)},
            retryAfter=seconds)

    def _reject(self, path: str, err: ApiError) -> None:
        metrics = self._metrics()
        if metrics is not None:
            metrics.admission_rejected.labels(err.code).inc()
        raise kv_error(err) if path in _KV_SHAPED else err

    def _sample(self) -> None:
        """The admission gauge follows the budget: read at the end of every metrics turn
        (``Tally.sample``), not written by each grant and release."""
        metrics = self._metrics()
        if metrics is not None:
            budget = self.budget
            metrics.tally.sample(metrics.admission_bytes, lambda: budget.in_use)
            self._sampled = True
