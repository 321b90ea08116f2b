"""queen_mp.models.locks: the lock ops of ``POST /api/v1/locks`` validated and normalised
(docs/api.md 2.14), without a database."""

from __future__ import annotations

from typing import Any

import pytest

from queen_mp.models.errors import InvalidName, NameTooLong, RequestError
from queen_mp.models.locks import MAX_LOCK_OPS, parse_lock_ops


def refused(raw: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_lock_ops(raw)
    return info.value


def test_the_four_ops_normalised_with_their_defaults_and_unknown_keys_dropped():
    got = parse_lock_ops([
        {"op": "acquire", "name": "daily-report", "ttlSeconds": 30, "extra": 1},
        {"op": "acquire", "name": "gpu", "ttlSeconds": 60, "owner": "w-1", "limit": 4},
        {"op": "renew", "name": "a", "token": 7, "ttlSeconds": 30, "slot": None},
        {"op": "release", "name": "c", "token": 9, "slot": 3},
        {"op": "get", "name": "d/ü"},
    ])
    assert got == [
        {"op": "acquire", "name": "daily-report", "ttlSeconds": 30, "owner": None, "limit": 1},
        {"op": "acquire", "name": "gpu", "ttlSeconds": 60, "owner": "w-1", "limit": 4},
        {"op": "renew", "name": "a", "slot": 0, "token": 7, "ttlSeconds": 30, "owner": None},
        {"op": "release", "name": "c", "slot": 3, "token": 9},
        {"op": "get", "name": "d/ü"},
    ]
    assert parse_lock_ops([]) == []


@pytest.mark.parametrize(("raw", "reason", "cls"), [
    ({"op": "get"}, "locks_bad_request", RequestError),
    ([None], "locks_bad_request", RequestError),
    ([{"op": "steal", "name": "a"}], "locks_unknown_op", RequestError),
    ([{"op": ["get"], "name": "a"}], "locks_unknown_op", RequestError),
    ([{"op": "get", "name": "a#0"}], "locks_bad_name", InvalidName),
    ([{"op": "get", "name": "a\x85b"}], "locks_bad_name", InvalidName),
    ([{"op": "get", "name": "é" * 129}], "locks_name_too_long", NameTooLong),
    ([{"op": "get", "name": "a", "_tenant": "x"}], "locks_tenant_not_an_input", RequestError),
    ([{"op": "acquire", "name": "a", "ttlSeconds": True}], "locks_bad_ttl", RequestError),
    ([{"op": "acquire", "name": "a", "ttlSeconds": 1 << 31}], "locks_bad_ttl", RequestError),
    ([{"op": "acquire", "name": "a", "ttlSeconds": None}], "locks_bad_ttl", RequestError),
    ([{"op": "renew", "name": "a", "token": 1}], "locks_ttl_required", RequestError),
    ([{"op": "renew", "name": "a", "token": 1 << 63, "ttlSeconds": 1}], "locks_bad_token",
     RequestError),
    ([{"op": "release", "name": "a", "token": None}], "locks_bad_token", RequestError),
    ([{"op": "acquire", "name": "a", "ttlSeconds": 1, "owner": "x" * 257}], "locks_bad_owner",
     RequestError),
    ([{"op": "acquire", "name": "a", "ttlSeconds": 1, "owner": "a\tb"}], "locks_bad_owner",
     RequestError),
    ([{"op": "acquire", "name": "a", "ttlSeconds": 1, "limit": False}], "locks_bad_limit",
     RequestError),
])
def test_refusals_carry_a_stable_reason(raw, reason, cls):
    err = refused(raw)
    assert isinstance(err, cls)
    assert err.extra["reason"] == reason and err.extra["detail"] == err.message


def test_call_level_rules_and_the_index_of_the_culprit():
    err = refused([{"op": "get", "name": "a"}, {"op": "get", "name": "b"},
                   {"op": "get", "name": "a"}])
    assert err.extra["reason"] == "locks_duplicate_in_call" and err.extra["index"] == 2
    err = refused([{"op": "get", "name": "ok"}, {"op": "get", "name": ""}])
    assert err.extra["index"] == 1 and err.extra["field"] == "name"
    assert refused([{"op": "get", "name": f"n{i}"} for i in range(MAX_LOCK_OPS + 1)]
                   ).extra["reason"] == "locks_too_many_ops"
    assert len(parse_lock_ops([{"op": "get", "name": f"n{i}"} for i in range(MAX_LOCK_OPS)])) \
        == MAX_LOCK_OPS
    wide = [{"op": "acquire", "name": f"s{i}", "ttlSeconds": 1, "limit": 1024} for i in range(4)]
    assert len(parse_lock_ops(wide)) == 4  # 4096 permits: the ceiling itself
    assert refused([*wide, {"op": "get", "name": "one-more"}]).extra["reason"] == \
        "locks_too_many_keys"
