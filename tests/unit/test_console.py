"""The console's files as the broker serves them (queen_mp/http/console.py), in-process.

The browser tests (tests/browser) drive the pages; these check what a browser relies on before
any page runs: the CSP forbids inline script, every module a module imports is served, the
page names the broker's authentication mode, and revalidation answers 304.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from queen_mp.config import Config
from queen_mp.http.console import CSP, load_assets
from tests.fuzz import targets as t

ASSETS = load_assets(Config.load({}))
_IMPORT = re.compile(r"""(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)['"](\.{1,2}/[^'"]+)['"]""")


def get(path: str, headers: list[tuple[str, str]] | None = None) -> t.Answer:
    answer = t.serve(t.request_bytes("GET", path, headers=headers))
    assert answer is not None
    return answer


def test_the_page_comes_with_a_policy_that_forbids_inline_script():
    answer = get("/console")
    assert answer.status == 200
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    policy = answer.headers["content-security-policy"]
    assert policy == CSP
    assert "script-src 'self';" in policy and "unsafe" not in policy
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["cache-control"] == "no-cache"
    assert b'<meta name="queen-auth" content="off">' in answer.body


def test_the_shipped_html_has_no_inline_script_style_or_handler():
    page = ASSETS["index.html"].body.decode()
    for tag in re.findall(r"<script\b[^>]*>", page):
        assert 'src="/console/' in tag, tag
    assert not re.search(r"<script\b[^>]*>\s*[^<\s]", page)  # nothing between the tags
    assert not re.search(r"\sstyle=|\son[a-z]+=|<style", page)


def test_a_revalidation_with_the_etag_is_304_without_a_body():
    first = get("/console/app.js")
    assert first.status == 200 and first.headers["content-type"].startswith("text/javascript")
    again = get("/console/app.js", [("If-None-Match", first.headers["etag"])])
    assert again.status == 304 and again.body == b""
    changed = get("/console/app.js", [("If-None-Match", '"stale"')])
    assert changed.status == 200 and changed.body == first.body


def test_root_redirects_and_unknown_files_are_json_404s():
    root = get("/")
    assert root.status == 302 and root.headers["location"] == "/console"
    missing = get("/console/nope.js")
    assert missing.status == 404 and missing.json()["code"] == "not_found"
    assert get("/console/../api/v1/dlq").status in (400, 404)


@pytest.mark.parametrize("name", sorted(n for n in ASSETS if n.endswith(".js")))
def test_every_relative_import_of_a_module_is_served(name):
    base = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
    for target in _IMPORT.findall(ASSETS[name].body.decode()):
        parts = (base + target).split("/")
        resolved: list[str] = []
        for p in parts:
            if p == "..":
                resolved.pop()
            elif p not in (".", ""):
                resolved.append(p)
        assert "/".join(resolved) in ASSETS, (name, target)
        assert get("/console/" + "/".join(resolved)).status == 200


def test_every_file_of_the_folder_is_served_and_the_page_names_the_auth_mode():
    on_disk = {str(p).split("console/", 1)[1]
               for p in _files(resources.files("queen_mp").joinpath("console"))}
    assert on_disk == set(ASSETS)
    with_jwt = load_assets(Config.load({"QUEEN_JWT_ENABLED": "1",
                                        "QUEEN_JWT_SECRET": "s" * 64}))
    assert b'<meta name="queen-auth" content="jwt">' in with_jwt["index.html"].body
    assert with_jwt["index.html"].etag != ASSETS["index.html"].etag


def _files(folder):  # type: ignore[no-untyped-def]
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _files(entry)
        else:
            yield entry
