"""queen_mp.models.kv.parse_kv_ops: every validation rule of api.md 2.5 "KV ops" and the normalised
form handed to queen.kv_apply_v1. No server needed."""

from __future__ import annotations

from typing import Any

import pytest

from queen_mp.http.errors import ApiError, InvalidName, InvalidRequest, NameTooLong, from_request
from queen_mp.models.errors import RequestError
from queen_mp.models.kv import MAX_KV_OPS, MAX_TTL_SECONDS, parse_kv_ops

INT64_MAX = (1 << 63) - 1


def one(op: dict[str, Any], *, in_transaction: bool = False) -> dict[str, Any]:
    [out] = parse_kv_ops([op], in_transaction=in_transaction)
    return out


def refused(raw: Any, *, in_transaction: bool = False) -> ApiError:
    """The refusal as the API answers it (queen_mp.http.errors maps the model's error)."""
    with pytest.raises(RequestError) as info:
        parse_kv_ops(raw, in_transaction=in_transaction)
    return from_request(info.value)


def refused_op(op: Any, cls: type[ApiError] = InvalidRequest, *, reason: str,
               field: str | None = None, in_transaction: bool = False) -> ApiError:
    """The op at index 1 (after a good one) is refused with this class, reason and field."""
    good = {"op": "get", "ns": "n", "key": "k"}
    err = refused([good, op], in_transaction=in_transaction)
    assert type(err) is cls, (err, err.to_dict())
    body = err.to_dict()
    assert body["reason"] == reason, body
    assert body["index"] == 1, body
    assert body["detail"] == err.message
    if field is not None:
        assert body["field"] == field, body
    return err


# ------------------------------------------------------------------------ normalised forms
def test_normalised_forms_of_every_kind():
    ops = parse_kv_ops([
        {"op": "get", "ns": "n", "key": "k", "extra": 1},
        {"op": "getMany", "ns": "n", "keys": ["a", "b"]},
        {"op": "getPrefix", "ns": "n", "prefix": "p"},
        {"op": "put", "ns": "n", "key": "k", "value": {"x": 1}, "ttlSeconds": 60},
        {"op": "putIfAbsent", "ns": "n", "key": "k", "value": None, "forever": True},
        {"op": "delete", "ns": "n", "key": "k"},
        {"op": "check", "ns": "n", "key": "k", "expect": 0, "required": True},
        {"op": "incr", "ns": "n", "key": "c", "delta": -2, "min": 0, "max": 9, "forever": True},
    ], in_transaction=False)
    assert ops == [
        {"op": "get", "ns": "n", "key": "k"},
        {"op": "getMany", "ns": "n", "keys": ["a", "b"]},
        {"op": "getPrefix", "ns": "n", "prefix": "p", "after": None, "limit": 100,
         "keysOnly": False},
        {"op": "put", "ns": "n", "key": "k", "value": {"x": 1}, "ttlSeconds": 60,
         "expect": None, "required": False},
        {"op": "putIfAbsent", "ns": "n", "key": "k", "value": None, "ttlSeconds": None,
         "required": False},
        {"op": "delete", "ns": "n", "key": "k", "expect": None, "required": False},
        {"op": "check", "ns": "n", "key": "k", "expect": 0, "required": True},
        {"op": "incr", "ns": "n", "key": "c", "delta": -2, "min": 0, "max": 9,
         "ttlSeconds": None, "required": False},
    ]


def test_empty_array_is_fine():
    assert parse_kv_ops([], in_transaction=False) == []


def test_put_with_expect_and_required():
    op = one({"op": "put", "ns": "n", "key": "k", "value": 1, "forever": True, "expect": 3,
              "required": True})
    assert op["expect"] == 3 and op["required"] is True and op["ttlSeconds"] is None


def test_delete_takes_expect_and_ignores_expiry_fields():
    op = one({"op": "delete", "ns": "n", "key": "k", "expect": 0, "ttlSeconds": 5})
    assert op == {"op": "delete", "ns": "n", "key": "k", "expect": 0, "required": False}


def test_nulls_read_as_not_given():
    op = one({"op": "incr", "ns": "n", "key": "c", "delta": 1, "min": None, "max": None,
              "ttlSeconds": None, "forever": True, "required": None})
    assert op["min"] is None and op["max"] is None and op["ttlSeconds"] is None
    assert op["required"] is False
    page = one({"op": "getPrefix", "ns": "n", "prefix": "", "after": None, "limit": None,
                "keysOnly": None})
    assert page == {"op": "getPrefix", "ns": "n", "prefix": "", "after": None, "limit": 100,
                    "keysOnly": False}


def test_names_may_hold_slashes_and_unicode():
    op = one({"op": "get", "ns": "a/b", "key": "order/9f1/items/\u00e9\u20ac"})
    assert op["ns"] == "a/b" and op["key"].endswith("\u20ac")


# ------------------------------------------------------------------------ shape of the array
@pytest.mark.parametrize("raw", [None, {}, "ops", 3, {"op": "get"}])
def test_operations_must_be_an_array(raw):
    err = refused(raw)
    assert isinstance(err, InvalidRequest) and err.to_dict()["reason"] == "kv_bad_request"


def test_too_many_ops():
    err = refused([{"op": "get", "ns": "n", "key": "k"}] * (MAX_KV_OPS + 1))
    assert isinstance(err, InvalidRequest) and err.to_dict()["reason"] == "kv_too_many_ops"


@pytest.mark.parametrize("op", [None, 1, "get", ["get"]])
def test_an_op_must_be_an_object(op):
    refused_op(op, reason="kv_bad_request")


@pytest.mark.parametrize("kind", [None, "GET", "set", "list", 1, "putifabsent", ["get"],
                                  {"op": "get"}])
def test_unknown_op(kind):
    op = {"ns": "n", "key": "k"} if kind is None else {"op": kind, "ns": "n", "key": "k"}
    refused_op(op, reason="kv_unknown_op", field="op")


# ------------------------------------------------------------------------ names
@pytest.mark.parametrize("op,field", [
    ({"op": "get", "key": "k"}, "ns"),
    ({"op": "get", "ns": "n"}, "key"),
    ({"op": "get", "ns": 1, "key": "k"}, "ns"),
    ({"op": "get", "ns": "n", "key": 5}, "key"),
    ({"op": "get", "ns": None, "key": "k"}, "ns"),
    ({"op": "getPrefix", "ns": "n"}, "prefix"),
    ({"op": "getPrefix", "ns": "n", "prefix": 3}, "prefix"),
])
def test_missing_or_non_string_names(op, field):
    refused_op(op, reason="kv_bad_request", field=field)


def test_empty_ns_and_key():
    refused_op({"op": "get", "ns": "", "key": "k"}, InvalidName, reason="kv_bad_namespace",
               field="ns")
    refused_op({"op": "get", "ns": "n", "key": ""}, InvalidName, reason="kv_bad_key",
               field="key")
    refused_op({"op": "getMany", "ns": "n", "keys": ["a", ""]}, InvalidName,
               reason="kv_bad_key", field="keys")


@pytest.mark.parametrize("bad", ["a\x00b", "tab\there", "nl\n", "del\x7f", "\x1f"])
def test_control_characters(bad):
    refused_op({"op": "get", "ns": bad, "key": "k"}, InvalidName, reason="kv_bad_namespace")
    refused_op({"op": "get", "ns": "n", "key": bad}, InvalidName, reason="kv_bad_key")
    refused_op({"op": "getPrefix", "ns": "n", "prefix": bad}, InvalidName, reason="kv_bad_key")


def test_name_limits_in_utf8_bytes():
    assert one({"op": "get", "ns": "n" * 255, "key": "k" * 1024})["key"] == "k" * 1024
    assert one({"op": "get", "ns": "\u20ac" * 85, "key": "\u20ac" * 341})  # 255 / 1023 bytes
    err = refused_op({"op": "get", "ns": "n" * 256, "key": "k"}, NameTooLong,
                     reason="kv_namespace_too_long", field="ns")
    assert err.status == 413 and err.to_dict()["limit"] == 255
    err = refused_op({"op": "get", "ns": "n", "key": "k" * 1025}, NameTooLong,
                     reason="kv_key_too_long", field="key")
    assert err.status == 413 and err.to_dict()["code"] == "name_too_long"
    assert err.to_dict()["limit"] == 1024
    refused_op({"op": "get", "ns": "\u20ac" * 86, "key": "k"}, NameTooLong,
               reason="kv_namespace_too_long")  # 258 bytes in 86 characters
    refused_op({"op": "put", "ns": "n", "key": "\u20ac" * 342, "value": 1, "forever": True},
               NameTooLong, reason="kv_key_too_long")
    refused_op({"op": "getMany", "ns": "n", "keys": ["k" * 1025]}, NameTooLong,
               reason="kv_key_too_long")
    refused_op({"op": "getPrefix", "ns": "n", "prefix": "p" * 1025}, NameTooLong,
               reason="kv_key_too_long")


# ------------------------------------------------------------------------ expiry
@pytest.mark.parametrize("kind", ["put", "putIfAbsent", "incr"])
def test_writes_need_exactly_one_expiry(kind):
    base = {"op": kind, "ns": "n", "key": "k", "value": 1, "delta": 1}
    refused_op(base, reason="kv_expiry_not_specified")
    refused_op({**base, "ttlSeconds": 5, "forever": True}, reason="kv_expiry_not_specified")
    refused_op({**base, "forever": False}, reason="kv_expiry_not_specified")
    refused_op({**base, "forever": "yes"}, reason="kv_expiry_not_specified", field="forever")
    assert one({**base, "ttlSeconds": 5, "forever": False})["ttlSeconds"] == 5
    assert one({**base, "forever": True})["ttlSeconds"] is None


@pytest.mark.parametrize("ttl", [0, -1, 1.5, "60", True, MAX_TTL_SECONDS + 1, 60.0])
def test_bad_ttl(ttl):
    refused_op({"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": ttl},
               reason="kv_bad_ttl", field="ttlSeconds")


def test_ttl_bounds_accepted():
    assert one({"op": "put", "ns": "n", "key": "k", "value": 1, "ttlSeconds": 1})
    assert one({"op": "put", "ns": "n", "key": "k", "value": 1,
                "ttlSeconds": MAX_TTL_SECONDS})["ttlSeconds"] == MAX_TTL_SECONDS


# ------------------------------------------------------------------------ values, expect
@pytest.mark.parametrize("kind", ["put", "putIfAbsent"])
def test_put_needs_a_value_but_null_is_one(kind):
    refused_op({"op": kind, "ns": "n", "key": "k", "forever": True}, reason="kv_bad_request",
               field="value")
    assert one({"op": kind, "ns": "n", "key": "k", "value": None, "forever": True})[
        "value"] is None


@pytest.mark.parametrize("expect", [-1, 1.0, "3", True, None, INT64_MAX + 1, [1]])
@pytest.mark.parametrize("kind", ["put", "delete", "check"])
def test_bad_expect(kind, expect):
    refused_op({"op": kind, "ns": "n", "key": "k", "value": 1, "forever": True,
                "expect": expect}, reason="kv_bad_expect", field="expect")


def test_check_needs_expect():
    refused_op({"op": "check", "ns": "n", "key": "k"}, reason="kv_bad_expect", field="expect")
    assert one({"op": "check", "ns": "n", "key": "k", "expect": INT64_MAX})["expect"] \
        == INT64_MAX


def test_put_if_absent_is_expect_zero():
    base = {"op": "putIfAbsent", "ns": "n", "key": "k", "value": 1, "forever": True}
    assert "expect" not in one({**base, "expect": 0})
    refused_op({**base, "expect": 2}, reason="kv_bad_expect", field="expect")


@pytest.mark.parametrize("required", [1, "true", 0])
def test_required_is_a_boolean(required):
    refused_op({"op": "delete", "ns": "n", "key": "k", "required": required},
               reason="kv_bad_request", field="required")


def test_required_is_ignored_on_reads():
    assert one({"op": "get", "ns": "n", "key": "k", "required": True}) == {
        "op": "get", "ns": "n", "key": "k"}


# ------------------------------------------------------------------------ getMany
def test_get_many_keys():
    refused_op({"op": "getMany", "ns": "n"}, reason="kv_bad_request", field="keys")
    refused_op({"op": "getMany", "ns": "n", "keys": "a"}, reason="kv_bad_request",
               field="keys")
    refused_op({"op": "getMany", "ns": "n", "keys": ["a", 1]}, reason="kv_bad_request",
               field="keys")
    refused_op({"op": "getMany", "ns": "n", "keys": ["a", None]}, reason="kv_bad_request",
               field="keys")
    assert len(one({"op": "getMany", "ns": "n", "keys": ["k"] * 1000})["keys"]) == 1000
    assert one({"op": "getMany", "ns": "n", "keys": []})["keys"] == []
    refused_op({"op": "getMany", "ns": "n", "keys": ["k"] * 1001}, reason="kv_too_many_keys",
               field="keys")


# ------------------------------------------------------------------------ getPrefix
def test_get_prefix_limit_default_clamp_and_floor():
    base = {"op": "getPrefix", "ns": "n", "prefix": "p"}
    assert one(base)["limit"] == 100
    assert one({**base, "limit": 1})["limit"] == 1
    assert one({**base, "limit": 1000})["limit"] == 1000
    assert one({**base, "limit": 5000})["limit"] == 1000
    for bad in (0, -5, 2.5, "10", True):
        refused_op({**base, "limit": bad}, reason="kv_bad_limit", field="limit")


def test_get_prefix_after_and_keys_only():
    base = {"op": "getPrefix", "ns": "n", "prefix": "p"}
    op = one({**base, "after": "p1", "keysOnly": True})
    assert op["after"] == "p1" and op["keysOnly"] is True
    assert one({**base, "after": ""})["after"] is None
    refused_op({**base, "after": 3}, reason="kv_bad_request", field="after")
    refused_op({**base, "keysOnly": "yes"}, reason="kv_bad_request", field="keysOnly")


def test_get_prefix_refused_in_a_transaction():
    op = {"op": "getPrefix", "ns": "n", "prefix": "p"}
    refused_op(op, reason="kv_get_prefix_not_allowed_in_transaction", field="op",
               in_transaction=True)
    # every other kind is fine inside a transaction
    ops = parse_kv_ops([{"op": "get", "ns": "n", "key": "k"},
                        {"op": "getMany", "ns": "n", "keys": ["k"]},
                        {"op": "incr", "ns": "n", "key": "k", "delta": 1, "forever": True}],
                       in_transaction=True)
    assert [o["op"] for o in ops] == ["get", "getMany", "incr"]


# ------------------------------------------------------------------------ incr
@pytest.mark.parametrize("delta", [1.5, "1", True, None, INT64_MAX + 1, -(1 << 63) - 1, 2.0])
def test_incr_delta_must_be_an_int64(delta):
    refused_op({"op": "incr", "ns": "n", "key": "k", "delta": delta, "forever": True},
               reason="kv_bad_delta", field="delta")


def test_incr_needs_a_delta():
    refused_op({"op": "incr", "ns": "n", "key": "k", "forever": True}, reason="kv_bad_delta",
               field="delta")


def test_incr_bounds():
    base = {"op": "incr", "ns": "n", "key": "k", "delta": 1, "forever": True}
    refused_op({**base, "min": 5, "max": 4}, reason="kv_bad_bounds", field="min")
    refused_op({**base, "min": 0.5}, reason="kv_bad_bounds", field="min")
    refused_op({**base, "max": "9"}, reason="kv_bad_bounds", field="max")
    refused_op({**base, "max": False}, reason="kv_bad_bounds", field="max")
    op = one({**base, "min": 4, "max": 4})
    assert (op["min"], op["max"]) == (4, 4)
    assert one({**base, "min": -3})["max"] is None


def test_first_bad_op_wins_and_reports_its_index():
    err = refused([{"op": "get", "ns": "n", "key": "k"},
                   {"op": "get", "ns": "n", "key": "k"},
                   {"op": "nope"},
                   {"op": "get", "ns": "", "key": "k"}])
    assert err.to_dict()["index"] == 2 and err.to_dict()["reason"] == "kv_unknown_op"
