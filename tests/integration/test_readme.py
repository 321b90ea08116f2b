"""README.md's first steps run as written against a live broker, and print what README shows.

The section between ``<!-- first-steps -->`` and ``<!-- /first-steps -->`` alternates code
blocks: a ``sh`` or ``python`` block, then the ``text`` block of what it prints. The test runs
each against a broker of its own on a fresh database (so partition ids and offsets are the
ones shown) and compares the output exactly, except for values that differ at every run:
UUIDs and timestamps. Those are matched in order, one-to-one, and a value README shows in an
output and then uses in a later command (a lease id) is replaced by the live one.

``python -m tests.integration.test_readme URL`` prints the live outputs of every block against
a broker at URL on a fresh database, to paste into README.md after changing a snippet.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.brokerharness import REPO, start_broker
from tests.pgharness import drop_database, make_migrated_database

README = REPO / "README.md"
README_URL = "http://127.0.0.1:6632"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
_VOLATILE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"
)


@dataclass(frozen=True)
class Step:
    language: str  # sh | python
    code: str
    shown: str  # the output README shows


def steps(text: str) -> list[Step]:
    start, end = text.index("<!-- first-steps -->"), text.index("<!-- /first-steps -->")
    blocks = [(m[1], m[2]) for m in _BLOCK.finditer(text[start:end])]
    assert len(blocks) % 2 == 0 and blocks, "first steps: a code block, then its output"
    found = []
    for (language, code), (kind, shown) in zip(blocks[::2], blocks[1::2], strict=True):
        assert language in ("sh", "python") and kind == "text", (language, kind)
        found.append(Step(language, code, shown))
    return found


def run_step(step: Step, url: str, known: dict[str, str]) -> str:
    code = step.code.replace(README_URL, url)
    for shown, live in known.items():
        code = code.replace(shown, live)
    argv = ["bash", "-euo", "pipefail", "-c", code] if step.language == "sh" else [
        sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{step.code}\nexited {done.returncode}:\n{done.stderr}"
    return done.stdout


def match(shown: str, live: str, known: dict[str, str]) -> None:
    """``live`` must be ``shown`` with each volatile value replaced one-to-one."""
    a, b = _VOLATILE.findall(shown), _VOLATILE.findall(live)
    assert len(a) == len(b), f"shown:\n{shown}\nlive:\n{live}"
    for x, y in zip(a, b, strict=True):
        assert known.setdefault(x, y) == y, f"{x} stands for two live values"
    assert len(set(known.values())) == len(known), "two shown values for one live value"
    assert _VOLATILE.sub(lambda m: known[m[0]], shown).rstrip() == live.rstrip()


@pytest.fixture
def fresh_broker(pg_server_dsn, tmp_path) -> Iterator[str]:
    dsn = make_migrated_database(pg_server_dsn)
    broker = start_broker(tmp_path, dsn, QUEEN_V2_FUSION_SHARDS="1")
    try:
        yield broker.url
    finally:
        assert broker.stop() == 0, broker.log()[-4000:]
        drop_database(pg_server_dsn, dsn)


def test_the_first_steps_print_what_readme_shows(fresh_broker):
    known: dict[str, str] = {}
    found = steps(README.read_text())
    assert [s.language for s in found].count("python") >= 1
    for step in found:
        match(step.shown, run_step(step, fresh_broker, known), known)


def test_the_check_catches_a_wrong_answer():
    known: dict[str, str] = {}
    uuid = "01a2338c-455b-759d-8a8c-c28791a58a32"
    match(f'"id": "{uuid}", "offset": 1', '"id": "01a2338c-0000-7000-8000-000000000000", '
          '"offset": 1', known)
    with pytest.raises(AssertionError):
        match('"offset": 1', '"offset": 2', {})
    with pytest.raises(AssertionError):  # one shown id cannot stand for two live ones
        match(f"{uuid} {uuid}", "01a2338c-0000-7000-8000-000000000000 "
              "01a2338c-0000-7000-8000-000000000001", {})


if __name__ == "__main__":
    known: dict[str, str] = {}
    for step in steps(README.read_text()):
        print(f"```{step.language}\n{step.code}```\n```text\n"
              f"{run_step(step, sys.argv[1], known)}```\n")
