"""Admission middleware (api.md 1.8) in process: falcon's ASGI test conductor, a fake disk.

The responders of the test app hold their permits until the test lets them go, so the order in
which requests are admitted is observable; nothing here sleeps to wait for a state, it waits
for the state itself (``_until``).
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable

import falcon
import falcon.asgi
import falcon.testing
import pytest

from queen_mp.http import errors
from queen_mp.http.admission import (
    JITTER,
    Admission,
    ByteBudget,
    Grant,
    disk_used_pct,
    rewindow,
)

pytestmark = pytest.mark.timeout(30)

MB = 1 << 20
PUSH, TXN, KV, TIMERS = "/api/v1/push", "/api/v1/transaction", "/api/v1/kv", "/api/v1/timers"


# ---------------------------------------------------------------------------------- harness
class FakeDisk:
    def __init__(self, pct: float = 10.0) -> None:
        self.pct = pct
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.pct


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Gate:
    """What the test app's responders do: record entry, wait for their release, maybe fail."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.fail: dict[str, BaseException] = {}
        self.read: dict[str, int] = {}

    def event(self, tag: str) -> asyncio.Event:
        return self.release.setdefault(tag, asyncio.Event())


class WriteResource:
    def __init__(self, gate: Gate, status: str) -> None:
        self.gate = gate
        self.status = status

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        tag = req.get_header("X-Tag") or "?"
        work = req.get_header("X-Work")  # what the body decodes to (a compressed push)
        if work is not None:
            await rewindow(req, int(work))
        self.gate.entered.append(tag)
        await self.gate.event(tag).wait()
        if tag in self.gate.fail:
            raise self.gate.fail[tag]
        self.gate.read[tag] = len(await req.stream.read())
        resp.status = self.status
        resp.media = {"tag": tag}


class PlainResource:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, **_: str
                     ) -> None:
        resp.media = {"ok": True}

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, **_: str
                      ) -> None:
        resp.media = {"ok": True}


def make_admission(budget_mb: int = 128, hold_ms: int = 200, *, max_body_mb: int = 256,
                   disk: Callable[[], float] | None = None, high_pct: float = 85,
                   clock: Callable[[], float] = time.monotonic,
                   rng: random.Random | None = None, window: int = 0) -> Admission:
    return Admission(budget_mb * MB, hold_ms, max_body_bytes=max_body_mb * MB,
                     disk_high_pct=high_pct, disk_usage=disk or FakeDisk(), clock=clock,
                     rng=rng or random.Random(7), window_bytes=window)


def make_app(adm: Admission, gate: Gate) -> falcon.asgi.App:
    app = falcon.asgi.App(middleware=[adm])
    app.add_error_handler(Exception, errors.handle_error)
    app.add_error_handler(falcon.HTTPError, errors.handle_error)
    app.add_route(PUSH, WriteResource(gate, falcon.HTTP_201))
    app.add_route(TXN, WriteResource(gate, falcon.HTTP_200))
    app.add_route(KV, WriteResource(gate, falcon.HTTP_200))
    app.add_route(TIMERS, WriteResource(gate, falcon.HTTP_200))
    plain = PlainResource()
    app.add_route("/api/v1/pop/queue/{queue}", plain)
    app.add_route("/api/v1/ack", plain)
    app.add_route("/health", plain)
    return app


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.002)


def post(c: falcon.testing.ASGIConductor, tag: str, size: int, path: str = PUSH
         ) -> asyncio.Task:
    return asyncio.ensure_future(c.simulate_post(path, body=b"x" * size,
                                                 headers={"X-Tag": tag}))


def post_work(c: falcon.testing.ASGIConductor, tag: str, size: int, work: int) -> asyncio.Task:
    return asyncio.ensure_future(c.simulate_post(PUSH, body=b"x" * size,
                                                 headers={"X-Tag": tag, "X-Work": str(work)}))


def run(coro_fn: Callable[..., object]) -> Callable[[], None]:
    """Run an async test body on a fresh loop (no async pytest plugin in this project)."""
    def wrapper() -> None:
        asyncio.run(coro_fn())  # type: ignore[arg-type]
    wrapper.__name__ = coro_fn.__name__
    return wrapper


# ------------------------------------------------------------------------- the FIFO budget
@run
async def test_budget_is_fifo_a_big_waiter_blocks_later_small_ones():
    b = ByteBudget(100)
    assert await b.acquire(60, 1)
    big = asyncio.ensure_future(b.acquire(80, 5))
    await asyncio.sleep(0)
    small = asyncio.ensure_future(b.acquire(10, 5))  # would fit (40 free) but queues behind
    await asyncio.sleep(0.01)
    assert not big.done() and not small.done()
    assert b.waiting == 2 and b.waiting_bytes == 90
    b.release(60)  # the head goes first, then whatever fits behind it
    assert await big is True
    assert await small is True
    b.release(90)
    assert b.available == 100 and b.waiting == 0 and b.waiting_bytes == 0


@run
async def test_budget_grants_the_head_and_everything_behind_that_fits():
    b = ByteBudget(100)
    assert await b.acquire(100, 1)
    waiters = [asyncio.ensure_future(b.acquire(n, 5)) for n in (30, 30, 30, 30)]
    await asyncio.sleep(0)
    b.release(100)
    await asyncio.sleep(0)
    assert [w.done() for w in waiters] == [True, True, True, False]
    b.release(30)
    assert await waiters[3]
    assert b.in_use == 90


@run
async def test_budget_timeout_and_cancellation_leave_no_trace():
    b = ByteBudget(100)
    assert await b.acquire(90, 1)
    t0 = time.monotonic()
    assert await b.acquire(50, 0.05) is False
    assert 0.04 < time.monotonic() - t0 < 10  # its 50 ms hold (10 s: a hang guard)
    assert b.waiting == 0 and b.waiting_bytes == 0 and b.available == 10
    assert await b.acquire(50, 0) is False  # no hold: refused at once
    # a timed-out head must not keep the ones behind it waiting
    head = asyncio.ensure_future(b.acquire(50, 0.05))
    await asyncio.sleep(0)
    tail = asyncio.ensure_future(b.acquire(5, 5))
    assert await head is False
    assert await tail is True
    # a cancelled waiter leaves the queue
    w = asyncio.ensure_future(b.acquire(80, 5))
    await asyncio.sleep(0)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
    assert b.waiting == 0 and b.waiting_bytes == 0
    b.release(95)
    assert b.available == 100


@run
async def test_budget_grant_then_cancel_gives_the_permits_back():
    b = ByteBudget(100)
    assert await b.acquire(100, 1)
    w = asyncio.ensure_future(b.acquire(70, 5))
    await asyncio.sleep(0)
    b.release(100)  # grants w synchronously ...
    w.cancel()  # ... but its task is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await w
    assert b.available == 100


def test_budget_never_grows_past_its_capacity():
    b = ByteBudget(100)
    b.release(10)
    assert b.available == 100
    assert b.clamp(10**12) == 100 and b.clamp(-1) == 0


def test_retry_after_is_whole_seconds_1_to_5_from_the_queue_length():
    b = ByteBudget(100)
    assert b.retry_after() == 1
    for queued, expect in ((0, 1), (99, 1), (100, 2), (250, 3), (399, 4), (400, 5),
                           (10**9, 5)):
        b.waiting_bytes = queued
        assert b.retry_after() == expect, queued


# ------------------------------------------------------------------------------ middleware
@run
async def test_fifo_through_the_middleware_big_request_is_not_starved():
    gate, adm = Gate(), make_admission(hold_ms=5000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        a = post(c, "a", 100 * MB)
        await _until(lambda: gate.entered == ["a"])
        big = post(c, "big", 60 * MB)  # waits: 28 MB free
        await _until(lambda: adm.budget.waiting == 1)
        smalls = [post(c, f"s{i}", 1 * MB) for i in range(5)]  # each fits, all queue behind
        await _until(lambda: adm.budget.waiting == 6)
        await asyncio.sleep(0.05)
        assert gate.entered == ["a"]
        gate.event("a").set()
        assert (await a).status_code == 201
        await _until(lambda: len(gate.entered) == 7)
        assert gate.entered[:2] == ["a", "big"], gate.entered
        for tag in ["big"] + [f"s{i}" for i in range(5)]:
            gate.event(tag).set()
        results = [await t for t in (big, *smalls)]
        assert {r.status_code for r in results} == {201}
        assert gate.read["big"] == 60 * MB
    assert adm.budget.available == adm.budget.capacity


@run
async def test_overloaded_is_429_with_retry_after_and_nothing_read():
    gate, adm = Gate(), make_admission(hold_ms=50)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        hog = post(c, "hog", 128 * MB)
        await _until(lambda: gate.entered == ["hog"])
        t0 = time.monotonic()
        r = await c.simulate_post(PUSH, body=b"x" * 10, headers={"X-Tag": "late"})
        waited = time.monotonic() - t0
        assert r.status_code == 429
        assert r.json["code"] == "overloaded" and r.json["error"]
        assert r.json["retryAfter"] == int(r.headers["Retry-After"])
        assert 1 <= int(r.headers["Retry-After"]) <= 5
        assert r.headers["Retry-After"].isdigit()
        assert 0.045 * (1 - JITTER) <= waited < 10  # its 50 ms hold (10 s: a hang guard)
        assert "late" not in gate.entered
        # a transaction is refused the same way; KV and timers in their own error shape
        r = await c.simulate_post(TXN, body=b"{}", headers={"X-Tag": "t"})
        assert r.status_code == 429 and r.json["code"] == "overloaded"
        for path in (KV, TIMERS):
            r = await c.simulate_post(path, body=b"{}", headers={"X-Tag": "k"})
            assert r.status_code == 429, path
            assert r.json["error"] == r.json["code"] == r.json["reason"] == "overloaded"
            assert r.json["detail"] and 1 <= int(r.headers["Retry-After"]) <= 5
        gate.event("hog").set()
        assert (await hog).status_code == 201
    assert adm.budget.available == adm.budget.capacity and adm.budget.waiting == 0


@run
async def test_retry_after_grows_with_the_queue():
    gate, adm = Gate(), make_admission(hold_ms=300)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        hog = post(c, "hog", 128 * MB)
        await _until(lambda: gate.entered == ["hog"])
        # hold 0 for the probe: it gives up at once while 5 budgets' worth stay queued
        queued = [post(c, f"q{i}", 64 * MB) for i in range(10)]
        await _until(lambda: adm.budget.waiting == 10)
        adm.hold_ms = 0
        r = await c.simulate_post(PUSH, body=b"x" * 10, headers={"X-Tag": "probe"})
        assert r.status_code == 429 and r.headers["Retry-After"] == "5"
        adm.hold_ms = 300
        results = [await t for t in queued]
        assert {x.status_code for x in results} == {429}
        r = await c.simulate_post(PUSH, body=b"x" * 10, headers={"X-Tag": "probe2"})
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        gate.event("hog").set()
        await hog
    assert adm.budget.available == adm.budget.capacity


def test_hold_jitter_stays_within_ten_percent():
    adm = make_admission(hold_ms=15000, rng=random.Random(1))
    holds = [adm.hold_s() for _ in range(5000)]
    assert min(holds) >= 15 * (1 - JITTER) and max(holds) <= 15 * (1 + JITTER)
    assert max(holds) - min(holds) > 15 * JITTER, "the hold is not jittered"
    assert len({round(h, 6) for h in holds}) > 4000
    assert make_admission(hold_ms=0).hold_s() == 0


@run
async def test_permits_come_back_when_the_responder_raises():
    gate, adm = Gate(), make_admission()
    gate.fail.update(api=errors.InvalidRequest("bad"), bug=RuntimeError("boom"),
                     http=falcon.HTTPBadRequest())
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        tasks = {tag: post(c, tag, 40 * MB) for tag in ("api", "bug", "http")}
        await _until(lambda: len(gate.entered) == 3)
        assert adm.budget.in_use == 120 * MB
        for tag in tasks:
            gate.event(tag).set()
        assert (await tasks["api"]).status_code == 400
        assert (await tasks["bug"]).status_code == 500
        assert (await tasks["http"]).status_code == 400
        assert adm.budget.available == adm.budget.capacity
        # the whole budget is usable again
        gate.event("after").set()
        r = await c.simulate_post(PUSH, body=b"x" * (128 * MB), headers={"X-Tag": "after"})
        assert r.status_code == 201
    assert adm.budget.available == adm.budget.capacity


@run
async def test_cancelled_request_is_released_by_the_backstop():
    gate, adm = Gate(), make_admission()
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        t = post(c, "doomed", 100 * MB)
        await _until(lambda: gate.entered == ["doomed"])
        assert adm.budget.in_use == 100 * MB
        t.cancel()  # process_response never runs for it
        with pytest.raises(asyncio.CancelledError):
            await t
        del t  # the cancelled task keeps the request alive through its traceback
        gc.collect()
        await _until(lambda: adm.budget.in_use == 0)


@run
async def test_request_larger_than_the_budget_is_clamped_not_stuck():
    gate, adm = Gate(), make_admission(budget_mb=128, max_body_mb=256, hold_ms=5000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        # alone: admitted at once with the whole budget
        gate.event("huge").set()
        r = await c.simulate_post(PUSH, body=b"x" * (200 * MB), headers={"X-Tag": "huge"})
        assert r.status_code == 201 and gate.read["huge"] == 200 * MB
        # behind another request: waits for the budget to drain, then goes
        small = post(c, "small", 1 * MB)
        await _until(lambda: gate.entered[-1] == "small")
        huge = post(c, "huge2", 200 * MB)
        await _until(lambda: adm.budget.waiting == 1)
        gate.event("huge2").set()
        gate.event("small").set()
        assert (await small).status_code == 201
        assert (await huge).status_code == 201
    assert adm.budget.available == adm.budget.capacity


@run
async def test_chunked_takes_the_body_limit_and_oversize_takes_nothing():
    gate, adm = Gate(), make_admission(budget_mb=128, max_body_mb=64)
    assert adm.cost(None) == 64 * MB
    assert adm.cost(65 * MB) == 0
    assert adm.cost(0) == 0 and adm.cost(5) == 5
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        t = asyncio.ensure_future(c.simulate_post(PUSH, headers={"X-Tag": "chunked"}))
        await _until(lambda: gate.entered == ["chunked"])
        assert adm.budget.in_use == 64 * MB
        gate.event("chunked").set()
        assert (await t).status_code == 201
    assert adm.budget.available == adm.budget.capacity


@run
async def test_pops_acks_and_gets_take_no_permits():
    gate, adm = Gate(), make_admission(hold_ms=0)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        hog = post(c, "hog", 128 * MB)
        await _until(lambda: gate.entered == ["hog"])
        assert (await c.simulate_post(PUSH, body=b"x", headers={"X-Tag": "n"})).status_code \
            == 429
        for method, path in (("GET", "/api/v1/pop/queue/q"), ("POST", "/api/v1/ack"),
                             ("GET", "/health"), ("GET", PUSH)):
            r = await c.simulate_request(method, path, body=b"x" * 1000)
            assert r.status_code in (200, 405), (method, path, r.status_code)
        gate.event("hog").set()
        await hog
    assert adm.budget.available == adm.budget.capacity


@run
async def test_disk_above_high_water_is_507_for_push_and_transaction_only():
    gate, disk, clock = Gate(), FakeDisk(90.0), FakeClock()
    adm = make_admission(disk=disk, high_pct=85, clock=clock)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        for path in (PUSH, TXN):
            r = await c.simulate_post(path, body=b"x" * 100, headers={"X-Tag": "full"})
            assert r.status_code == 507, path
            assert r.json["code"] == "storage_full" and "85" in r.json["error"]
        assert gate.entered == [], "a 507 reached the responder"
        assert adm.budget.in_use == 0
        for path in (KV, TIMERS):  # api.md 1.8 names push and transaction only
            gate.event(path).set()
            r = await c.simulate_post(path, body=b"{}", headers={"X-Tag": path})
            assert r.status_code == 200, path
        # exactly at the mark is not above it
        disk.pct, clock.now = 85.0, clock.now + 1
        gate.event("ok").set()
        r = await c.simulate_post(PUSH, body=b"x", headers={"X-Tag": "ok"})
        assert r.status_code == 201


@run
async def test_disk_is_sampled_at_most_once_a_second():
    gate, disk, clock = Gate(), FakeDisk(10.0), FakeClock()
    adm = make_admission(disk=disk, clock=clock)
    gate.event("a").set()
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        for _ in range(5):
            assert (await c.simulate_post(PUSH, body=b"x", headers={"X-Tag": "a"})
                    ).status_code == 201
        assert disk.calls == 1
        disk.pct = 99.0
        clock.now += 0.999  # still the cached 10 %
        assert (await c.simulate_post(PUSH, body=b"x", headers={"X-Tag": "a"})
                ).status_code == 201
        assert disk.calls == 1
        clock.now += 0.001
        r = await c.simulate_post(PUSH, body=b"x", headers={"X-Tag": "a"})
        assert r.status_code == 507 and disk.calls == 2
        disk.pct = 10.0
        r = await c.simulate_post(PUSH, body=b"x", headers={"X-Tag": "a"})
        assert r.status_code == 507 and disk.calls == 2  # until the next sample
        clock.now += 1
        r = await c.simulate_post(PUSH, body=b"x", headers={"X-Tag": "a"})
        assert r.status_code == 201 and disk.calls == 3


def test_disk_error_fails_open():
    def broken() -> float:
        raise OSError("gone")
    adm = make_admission(disk=broken)
    assert adm.disk_pct() == 0.0


def test_disk_used_pct_measures_the_real_filesystem(tmp_path):
    pct = disk_used_pct([tmp_path / "not" / "yet" / "there", tmp_path])
    assert 0.0 < pct <= 100.0
    assert disk_used_pct([]) == 0.0


@run
async def test_disk_filling_during_the_wait_is_507_and_the_permits_come_back():
    gate, disk, clock = Gate(), FakeDisk(10.0), FakeClock()
    adm = make_admission(disk=disk, clock=clock, hold_ms=5000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        hog = post(c, "hog", 100 * MB)
        await _until(lambda: gate.entered == ["hog"])
        waiter = post(c, "waiter", 50 * MB)
        await _until(lambda: adm.budget.waiting == 1)
        disk.pct, clock.now = 95.0, clock.now + 2
        gate.event("hog").set()
        assert (await hog).status_code == 201
        r = await waiter
        assert r.status_code == 507 and r.json["code"] == "storage_full"
        assert gate.entered == ["hog"]
    assert adm.budget.available == adm.budget.capacity


# ------------------------------------------------------------------------- the work window
@run
async def test_window_bounds_push_and_transaction_bodies_in_the_worker():
    gate, adm = Gate(), make_admission(hold_ms=5000, window=1000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        a = post(c, "a", 600)
        b = post(c, "b", 300, TXN)
        await _until(lambda: gate.entered == ["a", "b"])
        late = post(c, "late", 200)  # 100 bytes of the window left: it waits, unread
        await _until(lambda: adm.window is not None and adm.window.waiting == 1)
        kv = post(c, "kv", 500, KV)  # KV and timers are not windowed
        await _until(lambda: "kv" in gate.entered)
        await asyncio.sleep(0.05)
        assert "late" not in gate.entered
        assert adm.budget.in_use == 1600  # the admission budget still counts every body
        gate.event("a").set()
        assert (await a).status_code == 201
        await _until(lambda: "late" in gate.entered)
        for tag in ("b", "late", "kv"):
            gate.event(tag).set()
        assert [(await t).status_code for t in (b, late, kv)] == [200, 201, 200]
        assert gate.read["late"] == 200
    assert adm.window is not None and adm.window.in_use == 0 and adm.window.waiting == 0
    assert adm.budget.in_use == 0


@run
async def test_window_full_past_the_hold_is_429_and_gives_the_budget_back():
    gate, adm = Gate(), make_admission(hold_ms=50, window=1000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        hog = post(c, "hog", 5000)  # bigger than the window: takes all of it
        await _until(lambda: gate.entered == ["hog"])
        assert adm.window is not None and adm.window.in_use == 1000
        r = await c.simulate_post(PUSH, body=b"x" * 10, headers={"X-Tag": "late"})
        assert r.status_code == 429 and r.json["code"] == "overloaded"
        assert "push work window" in r.json["error"]
        assert 1 <= int(r.headers["Retry-After"]) <= 5
        assert "late" not in gate.entered
        assert adm.budget.in_use == 5000  # the refused request's permits came back
        gate.event("hog").set()
        assert (await hog).status_code == 201
    assert adm.window.in_use == 0 and adm.budget.in_use == 0


@run
async def test_cancelled_while_waiting_for_the_window_gives_the_budget_back():
    gate, adm = Gate(), make_admission(hold_ms=5000, window=1000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        hog = post(c, "hog", 1000)
        await _until(lambda: gate.entered == ["hog"])
        waiting = post(c, "waiting", 10)
        await _until(lambda: adm.window is not None and adm.window.waiting == 1)
        assert adm.budget.in_use == 1010
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert adm.budget.in_use == 1000 and adm.window.waiting == 0
        gate.event("hog").set()
        assert (await hog).status_code == 201
    assert adm.budget.in_use == 0 and adm.window.in_use == 0


@run
async def test_rewindow_charges_what_a_compressed_body_decodes_to():
    gate, adm = Gate(), make_admission(hold_ms=5000, window=1000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        a = post_work(c, "a", 100, 700)
        await _until(lambda: gate.entered == ["a"])
        assert adm.window is not None and adm.window.in_use == 700
        b = post_work(c, "b", 100, 700)  # admitted at 100 bytes, then waits for 700
        await _until(lambda: adm.window is not None and adm.window.waiting == 1)
        assert adm.window.in_use == 700  # it gave its 100 back while it waits
        assert adm.budget.in_use == 200  # the admission budget counts bytes received
        small = post_work(c, "small", 100, 50)  # decodes to less: keeps its 100, queues behind b
        await asyncio.sleep(0.05)
        assert gate.entered == ["a"]
        gate.event("a").set()
        assert (await a).status_code == 201
        await _until(lambda: gate.entered == ["a", "b", "small"])
        assert adm.window.in_use == 800
        for tag in ("b", "small"):
            gate.event(tag).set()
        assert [(await t).status_code for t in (b, small)] == [201, 201]
    assert adm.window.in_use == 0 and adm.window.waiting == 0 and adm.budget.in_use == 0


@run
async def test_requests_that_all_grow_do_not_wait_on_each_other():
    # Three bodies of 400 in a window of 1,000: two are admitted, then each needs 900. Had
    # they kept their 400 while asking for more, neither could ever be granted.
    gate, adm = Gate(), make_admission(hold_ms=2000, window=1000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        tasks = [post_work(c, tag, 400, 900) for tag in ("a", "b", "c")]
        for n in (1, 2, 3):
            await _until(lambda n=n: len(gate.entered) == n)
            assert adm.window is not None and adm.window.in_use == 900
            gate.event(gate.entered[-1]).set()
        assert [(await t).status_code for t in tasks] == [201, 201, 201]
    assert adm.window.in_use == 0 and adm.budget.in_use == 0


@run
async def test_rewindow_past_the_hold_is_429_and_gives_everything_back():
    gate, adm = Gate(), make_admission(hold_ms=50, window=1000)
    async with falcon.testing.ASGIConductor(make_app(adm, gate)) as c:
        hog = post(c, "hog", 600)
        await _until(lambda: gate.entered == ["hog"])
        r = await c.simulate_post(PUSH, body=b"x" * 100, headers={"X-Tag": "big", "X-Work": "900"})
        assert r.status_code == 429 and "push work window" in r.json["error"]
        assert "big" not in gate.entered
        assert adm.window is not None and adm.window.in_use == 600 and adm.window.waiting == 0
        assert adm.budget.in_use == 600
        gate.event("hog").set()
        assert (await hog).status_code == 201
    assert adm.window.in_use == 0 and adm.budget.in_use == 0


@run
async def test_rewindow_waits_only_for_what_is_left_of_the_request_hold():
    # A grant whose hold is spent (it waited it out for admission) cannot start a new one:
    # without room it answers 429 at once, not after another QUEEN_ADMIT_HOLD_MS (60 s here).
    adm = make_admission(hold_ms=60_000, window=1000)
    assert adm.window is not None
    assert await adm.budget.acquire(100, 1) and await adm.window.acquire(100, 1)
    assert await adm.window.acquire(600, 1)  # another request's share
    loop = asyncio.get_running_loop()
    grant = Grant(adm, 100, 100, loop.time() - 0.001)

    with pytest.raises(errors.Overloaded):
        await asyncio.wait_for(grant.rewindow(PUSH, 900), 5)
    assert adm.window.in_use == 600 and adm.window.waiting == 0
    grant.release()
    assert adm.budget.in_use == 0 and adm.window.in_use == 600


# ------------------------------------------------------------------ admission without a wait
@run
async def test_admit_now_takes_what_fits_and_nothing_when_it_would_wait():
    """The hot routes' plain call: a Grant as ``admit`` gives it when nothing waits, and
    False with nothing taken (budget and window as they were) when ``admit`` would wait."""
    adm = make_admission(budget_mb=1, window=64 << 10)
    grant = adm.admit_now(PUSH, 1000)
    assert isinstance(grant, Grant) and (grant.size, grant.window) == (1000, 1000)
    assert adm.budget.in_use == 1000 and adm.window is not None and adm.window.in_use == 1000
    assert adm.admit_now(KV, 0) is None  # no permits for an empty body
    # the window is full: the budget taken for it goes back
    assert adm.admit_now(PUSH, 64 << 10) is False
    assert adm.budget.in_use == 1000 and adm.window.in_use == 1000
    grant.release()
    assert adm.budget.in_use == 0 and adm.window.in_use == 0
    # the budget is full: False, and ``admit`` then queues the request behind
    held = adm.admit_now(KV, MB)
    assert isinstance(held, Grant) and adm.admit_now(KV, 10) is False
    waiting = asyncio.ensure_future(adm.admit(KV, 10))
    await _until(lambda: adm.budget.waiting == 1)
    held.release()
    late = await waiting
    assert isinstance(late, Grant) and adm.budget.in_use == 10
    late.release()


def test_admit_now_refuses_above_the_disk_mark_with_nothing_taken():
    adm = make_admission(disk=lambda: 99.0, high_pct=85)
    with pytest.raises(errors.StorageFull):
        adm.admit_now(PUSH, 1000)
    assert adm.budget.in_use == 0
