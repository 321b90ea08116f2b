"""The OpenAPI document (queen_mp/http/openapi.json), docs/api.md and the app's routes agree.

- the document is a valid OpenAPI 3.1 document;
- docs/api.md is exactly what ``queen_mp.http.apidoc`` renders from it and the hand-written
  ``queen_mp/http/apidoc.md``, and the renderer refuses a route placed twice or not at all;
- every section number a comment of queen_mp/ cites (``docs/api.md 2.4``, ``api.md 3.1-3.2``,
  ``§1.7``) is a numbered heading of docs/api.md;
- the (method, path) set of the document, the one of docs/api.md and the app's own routes
  (walked with ``falcon.inspect``) are the same;
- every operation's ``x-queen-role`` is the role ``queen_mp.http.authz`` enforces, and the
  public operations are exactly the public paths;
- ``GET /api/v1/openapi.json`` serves the file byte for byte.
"""

from __future__ import annotations

import re
from pathlib import Path

import falcon.inspect
import orjson
import pytest

from queen_mp.config import Config
from queen_mp.http import apidoc
from queen_mp.http.authz import PUBLIC_PATHS, is_public, required_role
from queen_mp.http.openapi import OPENAPI_PATH, document, document_bytes

REPO = Path(__file__).resolve().parents[2]
METHODS = ("get", "post", "put", "delete", "patch", "head", "options")
_PARAM = re.compile(r"\{[^}]*\}")


def shape(path: str) -> str:
    """A path with every parameter as ``{}``: falcon's ``{lease_id}`` and ``{timer_key:path}``
    match the document's ``{leaseId}`` and ``{timerKey}``."""
    return _PARAM.sub("{}", path)


def app_routes() -> dict[tuple[str, str], str]:
    """(method, path shape) -> falcon uri template, of every responder of ``create_app``."""
    from queen_mp.front.worker import FrontWorker
    from queen_mp.http.app import create_app

    cfg = Config.load({})
    app = create_app(cfg, None, FrontWorker(cfg, None))  # type: ignore[arg-type]
    return {(m.method, shape(r.path)): r.path for r in falcon.inspect.inspect_routes(app)
            for m in r.methods if not m.internal}


def doc_operations(doc: dict) -> dict[tuple[str, str], dict]:
    return {(method.upper(), shape(path)): op for path, item in doc["paths"].items()
            for method, op in item.items() if method in METHODS}


def md_operations(text: str) -> set[tuple[str, str]]:
    return {(m, shape(p)) for m, p in re.findall(r"^#### (GET|POST|PUT|DELETE|PATCH) (/\S*)$",
                                                 text, re.M)}


def md_sections(text: str) -> set[str]:
    """The numbers of the numbered headings: ``## 1. Conventions`` -> 1, ``### 2.4 ...`` -> 2.4."""
    return {m.group(2) for line in text.splitlines()
            if (m := apidoc.SECTION.match(line)) is not None}


# A citation: ``docs/api.md`` or ``api.md``, then section numbers (1..9, optionally .N), each
# maybe with a ``§``, ``section`` or a one-word / quoted label, joined by , / ; - "and", and
# possibly wrapped onto a comment line (``#`` / ``--``). A number in 1..9 only: "(1.8, 429)"
# ends at 1.8.
_NUM = r"(?<![\d.])[1-9](?:\.\d{1,2})?(?![\d])"
_REF = rf"(?:section\s+)?§?{_NUM}(?:\s+(?:\"[^\"\n]*\"|[a-z]+))?"
_SEP = r"\s*(?:,|/|;|-|\band\b)\s*(?:(?:#|--)\s*)?"
_CITATION = re.compile(rf"(?<![\w-])(?:docs/)?api\.md\s+(?:section\s+)?({_REF}(?:{_SEP}{_REF})*)")
#: A bare ``§1.7`` in a file that cites docs/api.md, unless it follows another document's name.
_BARE = re.compile(rf"§({_NUM})")
_OTHER_DOC = re.compile(r"(?:RFC\s+\d+|[\w-]+\.md|life-of-a-[a-z]+|ack-internals|design)\s*$")


def citations(text: str) -> list[tuple[int, str]]:
    """(line, section number) of every section docs/api.md is cited for in ``text``, in order."""
    found: list[tuple[int, str]] = []  # (position, number)
    spans: list[tuple[int, int]] = []
    for m in _CITATION.finditer(text):
        spans.append(m.span())
        refs = re.sub(r'"[^"\n]*"', lambda q: " " * len(q.group()), m.group(1))
        found += [(m.start(1) + n.start(), n.group()) for n in re.finditer(_NUM, refs)]
    if "api.md" in text:
        for m in _BARE.finditer(text):
            inside = any(a <= m.start() < b for a, b in spans)
            if not inside and _OTHER_DOC.search(text[max(0, m.start() - 40):m.start()]) is None:
                found.append((m.start(1), m.group(1)))
    return [(text.count("\n", 0, pos) + 1, n) for pos, n in sorted(found)]


def cited_files() -> list[Path]:
    root = REPO / "queen_mp"
    return sorted(p for ext in ("py", "sql", "json") for p in root.rglob(f"*.{ext}"))


def test_the_document_is_valid_openapi_3_1():
    validator = pytest.importorskip("openapi_spec_validator")
    doc = document()
    assert doc["openapi"].startswith("3.1.")
    validator.validate(doc)


def test_docs_api_md_is_rendered_from_the_document():
    text = (REPO / "docs" / "api.md").read_text()
    assert text == apidoc.render(), \
        "docs/api.md is stale: run `python -m queen_mp.http.apidoc > docs/api.md`"


def test_every_cited_section_of_docs_api_md_exists():
    """Comments cite docs/api.md by section number; each number must be one of its headings."""
    sections = md_sections((REPO / "docs" / "api.md").read_text())
    assert {"1", "1.9", "2", "2.12", "3", "3.7", "4", "5", "6"} <= sections
    cited: dict[str, list[str]] = {}
    for path in cited_files():
        for line, number in citations(path.read_text(encoding="utf-8")):
            cited.setdefault(number, []).append(f"{path.relative_to(REPO)}:{line}")
    assert len(cited) >= 25 and sum(map(len, cited.values())) >= 100, cited
    dangling = {n: where for n, where in cited.items() if n not in sections}
    assert not dangling, f"cited sections that docs/api.md does not have: {dangling}"


@pytest.mark.parametrize(("text", "numbers"), [
    ("(docs/api.md 2.3, 2.4).", ["2.3", "2.4"]),
    ("docs/api.md section 1.4, one renderer", ["1.4"]),
    ('(docs/api.md 2.5 "KV ops", 2.11).', ["2.5", "2.11"]),
    ("(api.md 2.7, 4, 5: /configure", ["2.7", "4", "5"]),
    ("(docs/api.md 3.1-3.2) that", ["3.1", "3.2"]),
    ("(docs/api.md 1.6/1.7, before", ["1.6", "1.7"]),
    ("(docs/api.md §3.4 plain, §3.5 frames) and the name rules of §1.7.", ["3.4", "3.5", "1.7"]),
    ("(docs/api.md 1.8, 429) are", ["1.8"]),
    ("(docs/api.md 2.8, 2.10,\n2.12, 5).", ["2.8", "2.10", "2.12", "5"]),
    ("-- (api.md 2.5; life-of-a-step.md), docs/api.md §1.3, life-of-a-push §3", ["2.5", "1.3"]),
    ("the docs/api.md order taken literally; RFC 9562 §6.2", []),
])
def test_citations_are_read_as_section_numbers(text, numbers):
    assert [n for _, n in citations(text)] == numbers


def test_the_renderer_places_every_operation_exactly_once():
    prose = apidoc.PROSE.read_text()
    one = "<!-- @operation POST /api/v1/push -->"
    assert prose.count(one) == 1
    with pytest.raises(ValueError, match="places no section for POST /api/v1/push"):
        apidoc.render(prose=prose.replace(one, ""))
    with pytest.raises(ValueError, match="placed twice"):
        apidoc.render(prose=prose.replace(one, one + "\n" + one))
    with pytest.raises(ValueError, match="no operation"):
        apidoc.render(prose=prose.replace(one, "<!-- @operation PUT /api/v1/push -->\n" + one))


def test_the_endpoint_table_names_every_route_with_its_role_and_section():
    text = (REPO / "docs" / "api.md").read_text()
    table = text.split("## 6. Endpoint table", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (GET|POST|PUT|DELETE|PATCH) \| `(/\S*)` \| ([a-z-]+) \| .* \| "
                      r"\[(\d+\.\d+)\]\(#([\w-]+)\) \|$", table, re.M)
    ops = doc_operations(document())
    assert {(m, shape(p)) for m, p, *_ in rows} == set(ops)
    anchors = {apidoc.slug(line.lstrip("#")) for line in text.splitlines()
               if apidoc.SECTION.match(line)}
    for method, path, role, number, anchor in rows:
        assert role == ops[(method, shape(path))]["x-queen-role"], (method, path)
        assert anchor in anchors and anchor.startswith(number.replace(".", "")), (path, anchor)
        assert number.split(".")[0] in ("2", "5"), (path, number)


def test_every_queue_option_is_in_section_4():
    from queen_mp.http.configure import OPTIONS

    text = (REPO / "docs" / "api.md").read_text()
    options = text.split("## 4. Queue configuration options", 1)[1].split("\n## ", 1)[0]
    for opt in OPTIONS.values():
        alias = "" if opt.alias == opt.name else f" (`{opt.alias}`)"
        assert f"| `{opt.name}`{alias} |" in options, opt.name
    assert set(OPTIONS) == set(document()["components"]["schemas"]["QueueOptions"]["properties"])


def test_document_docs_and_app_list_the_same_routes():
    routes = app_routes()
    ops = doc_operations(document())
    md = md_operations((REPO / "docs" / "api.md").read_text())
    assert len(routes) >= 52
    assert set(ops) == set(routes), (sorted(set(ops) - set(routes)),
                                     sorted(set(routes) - set(ops)))
    assert md == set(routes), (sorted(md - set(routes)), sorted(set(routes) - md))


def test_every_operation_names_the_role_authz_enforces():
    routes = app_routes()
    for (method, path_shape), op in doc_operations(document()).items():
        template = routes[(method, path_shape)]
        if is_public(template):
            assert op["x-queen-role"] == "public", template
            assert op["security"] == [], template
            assert "401" not in op["responses"], template
            continue
        assert op["x-queen-role"] == required_role(method, template).label, (method, template)
        assert "security" not in op, template  # the document-wide bearer requirement
        assert {"401", "403"} <= set(op["responses"]), (method, template)


def test_operation_ids_are_unique_and_every_path_parameter_is_declared():
    doc = document()
    params = doc["components"]["parameters"]
    seen: set[str] = set()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op["operationId"] not in seen
            seen.add(op["operationId"])
            declared = {(params[p["$ref"].rsplit("/", 1)[-1]] if "$ref" in p else p)["name"]
                        for p in op.get("parameters", [])
                        if ("$ref" in p and params[p["$ref"].rsplit("/", 1)[-1]]["in"] == "path")
                        or p.get("in") == "path"}
            assert declared == set(re.findall(r"\{([^}]*)\}", path)), (method, path)


def test_the_route_serves_the_file_byte_for_byte():
    from tests.fuzz import targets as t

    answer = t.serve(t.request_bytes("GET", OPENAPI_PATH))
    assert answer is not None and answer.status == 200
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.body == document_bytes()
    assert orjson.loads(answer.body)["paths"]


def test_the_openapi_path_is_public():
    assert OPENAPI_PATH in PUBLIC_PATHS
