"""The console with JWT authentication on: it asks for a token before calling anything, keeps
it for the tab, and shows only the buttons the token's role may use (docs/api.md 1.5)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.brokerharness import Broker
from tests.browser.conftest import api, make_dead_letter, private_broker
from tests.integration.authkit import bearer, start_auth_broker, token

#: what each role must (True) or must not (False) see, page by page
BUTTONS = {
    "system": ["Turn on", "Drain now"],             # admin
    "queues/auth.q": ["Delete queue"],              # admin
}
WRITE_BUTTONS = {
    "dlq": ["Retry", "Delete"],                     # read-write
    "queues/auth.q": ["Save configuration"],        # read-write
}


@pytest.fixture(scope="module")
def broker(pg_server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    for b in private_broker(pg_server_dsn, tmp_path_factory.mktemp("console-auth"),
                            start=start_auth_broker):
        with api(b, bearer(token("admin"))) as c:
            make_dead_letter(c, "auth.q", "auth-1", {"secret": False})
        yield b


def visible_buttons(page, route: str, tab) -> set[str]:
    tab.open(route)
    name = "queue" if route.startswith("queues/") else route
    expect(page.locator(f'main[data-page="{name}"]')).to_be_attached()  # the old page is gone
    expect(page.locator("#page-error")).to_be_empty()
    # every page has drawn once it shows a table, a card or its empty text
    expect(page.locator("main table, main .card, main .empty").first).to_be_visible()
    return {b.strip() for b in page.locator("main button").all_inner_texts()}


def test_the_page_asks_for_a_token_and_keeps_it_for_the_tab(broker, console):
    tab = console(broker)
    page = tab.open("overview")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    tab.shot("login")
    page.fill("#token", token("read-only", sub="olivia"))
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("main h1")).to_have_text("Overview")
    expect(page.locator('[data-testid="role"]')).to_have_text("olivia · read-only")
    tab.reload()  # the same tab: the token is still there
    expect(page.locator("main h1")).to_have_text("Overview")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_a_read_only_token_sees_no_button_that_would_be_refused(broker, console):
    tab = console(broker, token("read-only"))
    page = tab.page
    for route, names in {**BUTTONS, **WRITE_BUTTONS}.items():
        seen = visible_buttons(page, route, tab)
        assert not seen & set(names), (route, seen)
    # and the queue's settings are shown but not editable
    tab.open("queues/auth.q")
    expect(page.locator('form.config input[name="retryLimit"]')).to_be_disabled()


def test_read_write_and_admin_tokens_see_their_buttons(broker, console):
    writer = console(broker, token("read-write"))
    for route, names in WRITE_BUTTONS.items():
        assert set(names) <= visible_buttons(writer.page, route, writer), route
    for route, names in BUTTONS.items():
        assert not set(names) & visible_buttons(writer.page, route, writer), route
    admin = console(broker, token("admin"))
    for route, names in {**BUTTONS, **WRITE_BUTTONS}.items():
        assert set(names) <= visible_buttons(admin.page, route, admin), route
