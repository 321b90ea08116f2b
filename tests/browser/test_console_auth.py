"""The console with JWT authentication on: it asks for a token before calling anything, keeps
it for the tab, shows only the buttons the token's role may use, and says so where the broker
withholds an encrypted queue's payload from a read-only token (docs/api.md 1.5)."""

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
#: a payload of the encrypted queue auth.secret, which only read-write and admin may read
CARD = "4111-1111"


@pytest.fixture(scope="module")
def broker(pg_server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    for b in private_broker(pg_server_dsn, tmp_path_factory.mktemp("console-auth"),
                            start=start_auth_broker, QUEEN_ENCRYPTION_KEY="6d" * 32):
        with api(b, bearer(token("admin"))) as c:
            make_dead_letter(c, "auth.q", "auth-1", {"secret": False})
            r = c.post("/api/v1/configure", json={"queue": "auth.secret",
                                                  "options": {"encryptionEnabled": True}})
            assert r.status_code == 200, r.text
            make_dead_letter(c, "auth.secret", "secret-1", {"card": CARD})
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


def open_message(tab, queue: str, txn: str):
    page = tab.open(f"queues/{queue}")
    page.get_by_role("button", name=txn).click()
    return page.locator('[data-testid="message-detail"]')


def open_dead_letter(tab, queue: str, txn: str):
    page = tab.open(f"dlq/{queue}")
    row = page.locator(f'tr[data-testid="dlq-row"][data-txn="{txn}"]')
    row.get_by_role("button", name="Payload").click()
    return page.locator("tr.detail")


def test_a_read_only_token_sees_an_encrypted_payload_marked_withheld(broker, console):
    tab = console(broker, token("read-only"))
    detail = open_message(tab, "auth.secret", "secret-1")
    expect(detail).to_contain_text("Payload (encrypted, withheld from this role)")
    marker = detail.locator('[data-testid="payload-withheld"]')
    expect(marker).to_contain_text("Encrypted payload withheld: the read-only role")
    expect(detail.locator("pre.payload")).to_have_count(0)
    assert CARD not in tab.page.content()
    dead = open_dead_letter(tab, "auth.secret", "secret-1")
    expect(dead.locator('[data-testid="payload-withheld"]')).to_contain_text(
        "Encrypted payload withheld")
    assert CARD not in tab.page.content()
    # a plain queue's payload shows as it does for every role
    detail = open_message(tab, "auth.q", "auth-1")
    expect(detail.locator("pre.payload")).to_contain_text('"secret": false')
    expect(detail.locator('[data-testid="payload-withheld"]')).to_have_count(0)


def test_a_read_write_token_sees_the_encrypted_payload_decrypted(broker, console):
    tab = console(broker, token("read-write"))
    detail = open_message(tab, "auth.secret", "secret-1")
    expect(detail).to_contain_text("Payload (decrypted by the broker)")
    expect(detail.locator("pre.payload")).to_contain_text(CARD)
    dead = open_dead_letter(tab, "auth.secret", "secret-1")
    expect(dead.locator("pre.payload")).to_contain_text(CARD)
    expect(tab.page.locator('[data-testid="payload-withheld"]')).to_have_count(0)
