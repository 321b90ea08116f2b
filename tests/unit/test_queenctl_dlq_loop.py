"""When ``queenctl dlq retry|delete`` by filter stops calling (queen_mp/processes/queenctl/dlq.py),
on scripted broker answers: the cases a live broker does not give on demand (rows filed while
the command runs, rows no call can replay, an error after some calls). The ordinary runs are
tests/integration/test_queenctl_dlq.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from queen_mp.processes.queenctl import EXIT_ERROR, EXIT_OK, main
from queen_mp.processes.queenctl.base import Answer, Client


def run(monkeypatch: pytest.MonkeyPatch, answers: list[Answer], *args: str,
        input: str | None = None) -> tuple[Result, list[tuple[str, str, dict[str, Any]]]]:
    """The command's result and its calls, each with the query parameters it sends (the
    client leaves out those that are None)."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    script = iter(answers)

    def call(self: Client, method: str, path: str, *, query: dict[str, Any] | None = None,
             body: Any = None) -> Answer:
        calls.append((method, path, {k: v for k, v in (query or {}).items() if v is not None}))
        return next(script)

    monkeypatch.setattr(Client, "call", call)
    result = CliRunner().invoke(main, ["--url", "http://broker.test", "dlq", *args],
                                input=input, catch_exceptions=False)
    return result, calls


def retried(n: int, remaining: int, skipped: int = 0) -> Answer:
    return Answer(200, {"success": True, "replayed": n, "retried": n, "skipped": skipped,
                        "remaining": remaining})


def test_rows_filed_meanwhile_stop_it_once_as_many_as_matched_are_done(monkeypatch):
    # 5 rows match at first; a consumer dead-letters replays again, so 3 or more keep matching
    result, calls = run(monkeypatch, [retried(2, 3), retried(2, 3), retried(2, 4)],
                        "retry", "--queue", "q", "--batch", "2", "--yes")
    assert result.exit_code == EXIT_OK, result.output
    assert len(calls) == 3
    assert calls[0] == ("POST", "/api/v1/dlq/retry", {"queue": "q", "limit": 2})
    assert result.stdout.strip() == ("replayed 6 message(s), 6 dead-letter row(s), in 3 "
                                     "call(s); 4 row(s) still match")
    assert result.stderr.startswith("note: 4 dead-letter row(s) matching queue=q remain: more "
                                    "than matched when this command started")


def test_a_call_that_replays_nothing_ends_it_and_says_why(monkeypatch):
    result, calls = run(monkeypatch, [retried(1, 3, skipped=1), retried(0, 3, skipped=2)],
                        "retry", "--group", "billing", "--batch", "2", "--yes", "--json")
    assert result.exit_code == EXIT_OK, result.output
    assert [q for _, _, q in calls] == [{"consumerGroup": "billing", "limit": 2}] * 2
    assert json.loads(result.stdout) == {"success": True, "calls": 2, "replayed": 1,
                                         "retried": 1, "skipped": 3, "remaining": 3}
    assert "the last call replayed none of them: their partition is gone" in result.stderr


def test_an_error_after_some_calls_says_what_was_done(monkeypatch):
    gone = Answer(503, {"error": "PostgreSQL unreachable: connection refused",
                        "code": "unavailable"})
    result, _ = run(monkeypatch, [Answer(200, {"success": True, "deleted": 1000,
                                               "remaining": 500}), gone],
                    "delete", "--all", "--yes")
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.stderr.splitlines() == [
        "deleted 1000 dead-letter row(s) in 1 call(s) before this error",
        "error: unavailable: PostgreSQL unreachable: connection refused"]


def test_all_is_sent_as_all_true_and_the_prompt_counts_first(monkeypatch):
    listing = Answer(200, {"messages": [], "total": 1500, "pagination": {"limit": 1,
                                                                         "offset": 0}})
    done = [Answer(200, {"success": True, "deleted": 1000, "remaining": 500}),
            Answer(200, {"success": True, "deleted": 500, "remaining": 0})]
    result, calls = run(monkeypatch, [listing, *done], "delete", "--all", input="y\n")
    assert result.exit_code == EXIT_OK, result.output
    assert "Delete 1500 dead-letter row(s) of every queue?" in result.stderr
    assert calls == [("GET", "/api/v1/dlq", {"limit": 1}),
                     ("DELETE", "/api/v1/dlq", {"all": True, "limit": 1000}),
                     ("DELETE", "/api/v1/dlq", {"all": True, "limit": 1000})]
    assert result.stdout.strip() == ("deleted 1500 dead-letter row(s) in 2 call(s); 0 row(s) "
                                     "still match")
