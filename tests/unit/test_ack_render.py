"""The answer of an ack (queen_mp/front/acks.py ``render_outcomes``): byte for byte what orjson
makes of every outcome's ``to_json``."""

from __future__ import annotations

import uuid

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from queen_mp.db.ack_procs import AckItem
from queen_mp.front.acks import AckOutcome, render_outcomes

_text = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)

outcomes = st.builds(
    AckOutcome,
    item=st.builds(AckItem, index=st.integers(0, 100_000), transaction_id=_text,
                   partition_id=st.integers(1, (1 << 63) - 1),
                   status=st.sampled_from(["completed", "failed", "retry", "dlq"]),
                   group=_text, lease_id=st.none() | st.just(uuid.UUID(int=5)),
                   error=st.none() | _text),
    success=st.booleans(), error=st.none() | _text | st.sampled_from(["timeout", "clamped"]),
    lease_released=st.booleans(), dlq=st.booleans(), noop=st.booleans())


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(outcomes, max_size=12))
def test_rendered_outcomes_are_what_orjson_makes_of_them(batch: list[AckOutcome]) -> None:
    assert render_outcomes(batch) == orjson.dumps([o.to_json() for o in batch])
