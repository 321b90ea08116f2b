"""The ack answer's body (``queen_mp.http.ack.render_acks``) is byte for byte what orjson makes of
each item's ``_item_json``, whatever the transactionIds hold; a verdict with a commit error
leaves the answer to the 503 path."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queen_mp.db.ack_procs import AckBatch, AckItem
from queen_mp.front.acks import Verdict
from queen_mp.http import ack
from queen_mp.http.ack import _item_json, render_acks

LEASE = uuid.UUID(int=42)
# quotes, backslashes, the `","` the renderer splits at, controls, non-ASCII
TXN = st.one_of(st.text(min_size=1, max_size=12),
                st.text(alphabet='",\\\x00\x1f\u2028é😀ab', min_size=1, max_size=12))
ERRORS = st.sampled_from([None, "lease_invalid", "already_committed", "unresolvable",
                          "clamped", "partition_not_found", 'odd "error"'])
OUTCOME = st.tuples(TXN, st.integers(1, (1 << 63) - 1), st.booleans(), ERRORS, st.booleans(),
                    st.booleans(), st.booleans())


Rows = list[tuple[str, int, bool, str | None, bool, bool, bool]]


def _batch(rows: Rows) -> tuple[AckBatch, list[Verdict]]:
    batch = AckBatch.of([AckItem(i, txn, pid, "completed", "__QUEUE_MODE__", LEASE, None)
                         for i, (txn, pid, *_) in enumerate(rows)])
    return batch, [(success, error, released, dlq, noop)
                   for _, _, success, error, released, dlq, noop in rows]


def _dicts(rows: Rows) -> bytes:
    batch, verdicts = _batch(rows)
    return orjson.dumps([_item_json(batch, i, v) for i, v in enumerate(verdicts)])


def _body(rows: Rows) -> bytes | None:
    return render_acks(*_batch(rows))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.lists(OUTCOME, max_size=8))
def test_rendered_as_orjson_renders_the_dicts(rows: Rows) -> None:
    assert _body(rows) == _dicts(rows)


def test_a_batch_of_one_lease_is_rendered_as_the_dicts() -> None:
    rows: Rows = [(f"t-{i}", 7, True, None, True, False, False) for i in range(100)]
    assert _body(rows) == _dicts(rows)
    assert orjson.loads(_dicts(rows))[99] == {
        "index": 99, "transactionId": "t-99", "partitionId": "7", "success": True,
        "error": None, "leaseReleased": True, "dlq": False, "noop": False}


def test_a_commit_error_is_left_to_the_503_path() -> None:
    for code in ("timeout", "outcome_unknown", "unavailable"):
        assert _body([("a", 7, True, None, True, False, False),
                      ("b", 7, False, code, False, False, False)]) is None
        assert _body([("a", 7, False, code, False, False, False)] * 2) is None


def test_item_heads_past_those_kept_are_rendered_alike(monkeypatch: Any) -> None:
    """The heads kept per index stop at ``_HEADS_KEPT``; longer batches make the rest."""
    monkeypatch.setattr(ack, "_HEADS", [])
    monkeypatch.setattr(ack, "_HEADS_KEPT", 3)
    for n in (2, 5, 1, 7, 3, 4):
        rows: Rows = [(f"t-{i}", 7 + i % 2, True, None, True, False, False) for i in range(n)]
        assert _body(rows) == _dicts(rows)
    assert len(ack._HEADS) == 3
