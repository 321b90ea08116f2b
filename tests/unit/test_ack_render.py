"""The ack answer's body (``queen_mp.http.ack._render``) is byte for byte what orjson makes of
each outcome's ``to_json``, whatever the transactionIds hold; an outcome with a commit error
leaves the answer to the 503 path."""

from __future__ import annotations

import uuid

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queen_mp.db.ack_procs import AckItem
from queen_mp.front.acks import AckOutcome
from queen_mp.http.ack import _render

LEASE = uuid.UUID(int=42)
# quotes, backslashes, the `","` the renderer splits at, controls, non-ASCII
TXN = st.one_of(st.text(min_size=1, max_size=12),
                st.text(alphabet='",\\\x00\x1f\u2028é😀ab', min_size=1, max_size=12))
ERRORS = st.sampled_from([None, "lease_invalid", "already_committed", "unresolvable",
                          "clamped", "partition_not_found", 'odd "error"'])
OUTCOME = st.tuples(TXN, st.integers(1, (1 << 63) - 1), st.booleans(), ERRORS, st.booleans(),
                    st.booleans(), st.booleans())


def _outcomes(rows: list[tuple[str, int, bool, str | None, bool, bool, bool]]
              ) -> list[AckOutcome]:
    return [AckOutcome(AckItem(i, txn, pid, "completed", "__QUEUE_MODE__", LEASE, None),
                       success, error, released, dlq, noop)
            for i, (txn, pid, success, error, released, dlq, noop) in enumerate(rows)]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.lists(OUTCOME, max_size=8))
def test_rendered_as_orjson_renders_the_dicts(
        rows: list[tuple[str, int, bool, str | None, bool, bool, bool]]) -> None:
    outcomes = _outcomes(rows)
    assert _render(outcomes) == orjson.dumps([o.to_json() for o in outcomes])


def test_a_batch_of_one_lease_is_rendered_as_the_dicts() -> None:
    outcomes = _outcomes([(f"t-{i}", 7, True, None, True, False, False) for i in range(100)])
    assert _render(outcomes) == orjson.dumps([o.to_json() for o in outcomes])


def test_a_commit_error_is_left_to_the_503_path() -> None:
    for code in ("timeout", "outcome_unknown", "unavailable"):
        outcomes = _outcomes([("a", 7, True, None, True, False, False),
                              ("b", 7, False, code, False, False, False)])
        assert _render(outcomes) is None
