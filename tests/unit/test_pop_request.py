"""``queen_mp.http.pop._request``: a pop's query parsed once per (query, tenant, queue,
partition) and kept, a bounded number of them; a refused query is refused every time."""

from __future__ import annotations

from typing import Any

import pytest

from queen_mp.http import pop
from queen_mp.http.errors import InvalidRequest

TENANT = bytes(16)


def test_a_repeated_pop_shares_its_parsed_request(monkeypatch: Any) -> None:
    monkeypatch.setattr(pop, "_REQUESTS", {})
    qs = "batch=100&partitions=1&consumerGroup=g&wait=true&timeout=1000"
    first = pop._request(qs, TENANT, "q", None)
    assert first == pop._parse(qs, TENANT, "q", None)
    assert pop._request(qs, TENANT, "q", None) is first
    other = pop._request(qs, bytes(range(16)), "q", None)  # another tenant's: its own
    assert other is not first and other[0].tenant == bytes(range(16))
    assert pop._request(qs, TENANT, "q", "p")[0].partition == "p"


def test_the_requests_kept_are_bounded_the_first_go_first(monkeypatch: Any) -> None:
    monkeypatch.setattr(pop, "_REQUESTS", {})
    monkeypatch.setattr(pop, "_REQUESTS_KEPT", 3)
    for batch in range(1, 6):
        pop._request(f"batch={batch}", TENANT, "q", None)
    assert [k[0] for k in pop._REQUESTS] == ["batch=3", "batch=4", "batch=5"]


def test_a_refused_query_is_not_kept(monkeypatch: Any) -> None:
    monkeypatch.setattr(pop, "_REQUESTS", {})
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            pop._request("batch=0", TENANT, "q", None)
    assert not pop._REQUESTS
