"""Query strings: the split without unquoting reads exactly what parse_qsl reads."""

from __future__ import annotations

from urllib.parse import parse_qsl

from hypothesis import given
from hypothesis import strategies as st

from queen_mp.http.query import Query

_CHARS = st.sampled_from([*"ab=&%+;. 0", "%20", "%3D", "%26", "\u00e9"])


def _first_values(query_string: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in parse_qsl(query_string, keep_blank_values=True):
        out.setdefault(name, value)
    return out


@given(st.lists(_CHARS, max_size=30).map("".join))
def test_every_query_string_reads_as_parse_qsl_reads_it(query_string: str) -> None:
    assert Query(query_string)._values == _first_values(query_string)


def test_a_repeated_key_keeps_its_first_value_and_a_bare_key_is_empty() -> None:
    q = Query("batch=100&wait=false&batch=5&flag&&x=")
    assert q._values == {"batch": "100", "wait": "false", "flag": "", "x": ""}
