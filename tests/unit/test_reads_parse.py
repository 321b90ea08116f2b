"""The offset-read and partition-discovery bodies (queen_mp/models/reads.py): a faulty value
of any depth is refused with a bounded message (the broker fuzz found a 500: the message held
``repr`` of a deeply nested array, a RecursionError)."""

import pytest

from queen_mp.models.errors import InvalidRequest
from queen_mp.models.reads import parse_changed, parse_fetch

DEEP = "[" * 900 + "]" * 900


@pytest.mark.parametrize("body", [
    '{"entries": [{"queue": "q", "offset": DEEP}]}',
    '{"maxBytes": DEEP, "entries": []}',
    '{"entries": [{"queue": "q", "offset": 1, "maxBytes": DEEP}]}',
])
def test_a_deep_value_in_a_fetch_is_refused_with_a_short_message(body):
    with pytest.raises(InvalidRequest) as ex:
        parse_fetch(body.replace("DEEP", DEEP).encode())
    assert len(str(ex.value)) < 200
    assert "must be an integer" in str(ex.value)


def test_a_deep_after_in_partitions_changed_is_refused_with_a_short_message():
    body = '{"entries": [{"queue": "q", "after": DEEP}]}'.replace("DEEP", DEEP)
    with pytest.raises(InvalidRequest) as ex:
        parse_changed(body.encode())
    assert len(str(ex.value)) < 200
    assert "'after'" in str(ex.value)
