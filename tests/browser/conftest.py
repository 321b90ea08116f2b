"""Browser tests of the console: Debian's Chromium driven by Playwright (sync API).

Playwright never downloads a browser here: it launches the system Chromium
(``QUEEN_CHROMIUM``, default ``/usr/bin/chromium``; ``ops/ensure-packages.sh chromium`` installs
it, as ``make test`` does). A missing Chromium fails the tests, it does not skip them.

Every page a test opens is watched (``Watched``): a console error, an uncaught exception, a
failed request or an answer of 400 or more fails the test at its end, whatever it asserted.

``QUEEN_CONSOLE_SHOTS=docs/console`` makes the tests write a PNG of each page they visit
there (the screenshots of docs/console.md and the README).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import playwright.sync_api as playwright_api
import pytest

from tests.brokerharness import Broker, start_broker
from tests.pgharness import drop_database, make_migrated_database

CHROMIUM = os.environ.get("QUEEN_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("QUEEN_CONSOLE_SHOTS")
TIMEOUT_MS = 15_000
VIEWPORT = {"width": 1280, "height": 860}
# NOTE(queen): expect() has a default of its own (5 s), which the context's default timeout does
# not change: on a loaded machine (the suite in two processes beside a browser) a message's
# detail, clicked, had not shown after 5 s (nothing failed in the page)
playwright_api.expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def chromium() -> Iterator[playwright_api.Browser]:
    """Per module, not per session: while Playwright's sync API runs, its event loop is the
    thread's running loop, and the in-process asyncio of later test modules would fail."""
    path = shutil.which(CHROMIUM) or CHROMIUM
    assert Path(path).exists(), (f"no Chromium at {CHROMIUM}: run ops/ensure-packages.sh chromium "
                                 "(or set QUEEN_CHROMIUM)")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path)
        try:
            yield browser
        finally:
            browser.close()


def private_broker(pg_server_dsn: str, tmp: Path, start: Callable[..., Broker] = start_broker,
                   **settings: str) -> Iterator[Broker]:
    """A broker on its own database: the console flips maintenance switches kept in PostgreSQL,
    which must not leak into the session's shared database."""
    dsn = make_migrated_database(pg_server_dsn)
    try:
        b = start(tmp, dsn, QUEEN_WORKERS="1", QUEEN_V2_FUSION_SHARDS="1", **settings)
        try:
            yield b
        finally:
            rc = b.stop()
            assert rc == 0, b.log()[-4000:]
    finally:
        drop_database(pg_server_dsn, dsn)


@dataclass
class Watched:
    """A page and everything that went wrong in it."""

    page: playwright_api.Page
    base: str
    problems: list[str] = field(default_factory=list)
    #: a reload the test asked for aborts the polls in flight: those aborts are not problems
    reloading: bool = False

    def reload(self) -> None:
        self.reloading = True
        try:
            self.page.reload()
        finally:
            self.reloading = False

    def failed(self, request: playwright_api.Request) -> None:
        if self.reloading and request.failure == "net::ERR_ABORTED":
            return
        self.problems.append(f"request failed: {request.method} {request.url}: "
                             f"{request.failure}")

    def open(self, route: str) -> playwright_api.Page:
        """``route`` is the part after ``#/`` (``queues/orders``)."""
        self.page.goto(f"{self.base}/console#/{route}")
        return self.page

    def shot(self, name: str) -> None:
        """Write ``name``.png when asked to (QUEEN_CONSOLE_SHOTS)."""
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=False)


@pytest.fixture
def console(chromium: playwright_api.Browser) -> Iterator[Callable[..., Watched]]:
    """``console(broker, token=None)``: a fresh tab (its own sessionStorage) on the broker."""
    opened: list[tuple[playwright_api.BrowserContext, Watched]] = []

    def open_tab(broker: Broker, token: str | None = None) -> Watched:
        ctx = chromium.new_context(viewport=VIEWPORT)
        ctx.set_default_timeout(TIMEOUT_MS)
        page = ctx.new_page()
        w = Watched(page, broker.url)
        page.on("console", lambda m: m.type == "error" and w.problems.append(
            f"console error: {m.text} at {m.location}"))
        page.on("pageerror", lambda e: w.problems.append(f"uncaught: {e}"))
        page.on("requestfailed", w.failed)
        page.on("response", lambda r: r.status >= 400 and w.problems.append(
            f"answer {r.status}: {r.request.method} {r.url}"))
        page.on("dialog", lambda d: d.accept())
        if token is not None:
            ctx.add_init_script(f"sessionStorage.setItem('queen-mp.token', {token!r});")
        opened.append((ctx, w))
        return w

    yield open_tab
    problems = [p for _, w in opened for p in w.problems]
    for ctx, _ in opened:
        ctx.close()
    assert not problems, "the page saw problems:\n  " + "\n  ".join(problems)


def api(broker: Broker, headers: dict[str, str] | None = None) -> httpx.Client:
    return httpx.Client(base_url=broker.url, headers=headers or {}, timeout=30)


def make_dead_letter(c: httpx.Client, queue: str, txn: str, payload: object) -> str:
    """Push one message to ``queue`` (retryLimit 0), pop it and fail it: one DLQ row. Returns
    the partition id."""
    r = c.post("/api/v1/configure", json={"queue": queue, "options": {"retryLimit": 0}})
    assert r.status_code == 200, r.text
    r = c.post("/api/v1/push", json={"items": [
        {"queue": queue, "transactionId": txn, "payload": payload}]})
    assert r.status_code == 201, r.text
    r = c.get(f"/api/v1/pop/queue/{queue}", params={"wait": "false"})
    assert r.status_code == 200, r.text
    m = r.json()["messages"][0]
    r = c.post("/api/v1/ack", json={"transactionId": txn, "partitionId": m["partitionId"],
                                    "leaseId": m["leaseId"], "status": "failed",
                                    "error": "card declined"})
    assert r.status_code == 200 and r.json()[0]["dlq"] is True, r.text
    return str(m["partitionId"])
