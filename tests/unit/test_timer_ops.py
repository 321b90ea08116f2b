"""Timer op validation and minting (api.md 2.5 "Timer ops", 1.7 limits;
queen_mp/models/timers.py)."""

from __future__ import annotations

import base64

import orjson
import pytest
import zstandard

from queen_mp.models import timers
from queen_mp.wire import errors as we
from queen_mp.wire.ids import is_uuid7, uuid_from_text


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sched(**kw):
    op = {"op": "schedule", "queue": "reminders", "timerKey": "order-1", "delayMs": 1000,
          "payload": b64(b'{"a":1}')}
    op.update(kw)
    return op


def parse_one(op):
    (out,) = timers.parse_timer_ops([op])
    return out


def error_of(ops, cls=we.WireError):
    with pytest.raises(cls) as info:
        timers.parse_timer_ops(ops)
    return info.value


# ------------------------------------------------------------------------------ normal form
def test_schedule_is_normalised_with_defaults():
    assert parse_one(sched()) == {
        "op": "schedule", "queue": "reminders", "timerKey": "order-1", "partition": "Default",
        "payload": b64(b'{"a":1}'), "payloadZstd": False, "delayMs": 1000, "txn": None}


def test_all_fields_and_unknown_keys_ignored():
    op = parse_one(sched(op="reschedule", partition="p/1", txn="rem-1", payloadZstd=False,
                         whatever=3))
    assert op["op"] == "reschedule" and op["partition"] == "p/1" and op["txn"] == "rem-1"
    assert "whatever" not in op


def test_cancel_keeps_only_its_fields():
    op = parse_one({"op": "cancel", "queue": "q", "timerKey": "k", "payload": "!!",
                    "delayMs": "x"})
    assert op == {"op": "cancel", "queue": "q", "timerKey": "k", "txn": None}
    assert parse_one({"op": "cancel", "queue": "q", "timerKey": "k", "txn": "t"})["txn"] == "t"


def test_negative_delay_means_now_and_empty_txn_means_mint():
    op = parse_one(sched(delayMs=-5000, txn="", partition=""))
    assert op["delayMs"] == 0 and op["txn"] is None and op["partition"] == "Default"


def test_payload_is_canonicalised_and_empty_is_null():
    assert parse_one(sched(payload=""))["payload"] == ""
    # the null JSON text and a string are JSON too
    assert parse_one(sched(payload=b64(b"null")))["payload"] == b64(b"null")
    assert parse_one(sched(payload=b64(b'"x"')))["payload"] == b64(b'"x"')


def test_zstd_payload_must_be_a_zstd_frame_of_json():
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b'{"big":[1,2,3]}')
    op = parse_one(sched(payload=b64(frame), payloadZstd=True))
    assert op["payloadZstd"] is True and base64.b64decode(op["payload"]) == frame
    # plain JSON flagged as zstd, and a zstd frame of non-JSON
    assert error_of([sched(payloadZstd=True)]).reason == "invalid_zstd"
    bad = zstandard.ZstdCompressor(write_content_size=True).compress(b"not json")
    assert error_of([sched(payload=b64(bad), payloadZstd=True)]).reason == "invalid_payload"
    # a frame without its content size cannot be bounded
    nosize = zstandard.ZstdCompressor(write_content_size=False).compress(b'{"a":1}')
    assert error_of([sched(payload=b64(nosize), payloadZstd=True)]).reason == "invalid_zstd"


def test_zstd_payload_decompression_is_bounded():
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"[" + b"0," * 5000
                                                                       + b"0]")
    with pytest.raises(we.BodyTooLarge) as info:
        timers.parse_timer_ops([sched(payload=b64(frame), payloadZstd=True)],
                               max_decompressed=1000)
    assert info.value.status == 413 and info.value.index == 0


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("field", ["producerSub", "messageId", "deliverAt", "attempts", "tenant",
                                   "tenantId", "_internal", "_"])
def test_server_owned_fields_are_400(field):
    err = error_of([sched(), sched(**{field: "x"})], we.InvalidRequest)
    assert err.status == 400 and err.code == "invalid_request"
    assert err.index == 1 and err.field == field and err.reason == "server_owned_field"
    # also on a cancel
    err = error_of([{"op": "cancel", "queue": "q", "timerKey": "k", field: 1}])
    assert err.reason == "server_owned_field"


@pytest.mark.parametrize(("op", "reason", "field"), [
    (sched(op="fire"), "unknown_op", "op"),
    ({"queue": "q", "timerKey": "k"}, "unknown_op", "op"),
    (sched(queue=None), "missing_field", "queue"),
    (sched(queue=5), "wrong_type", "queue"),
    (sched(timerKey=None), "missing_field", "timerKey"),
    (sched(timerKey=""), "missing_field", "timerKey"),
    (sched(timerKey=7), "wrong_type", "timerKey"),
    (sched(timerKey="a\x00b"), "invalid_text", "timerKey"),
    (sched(timerKey="\ud800"), "invalid_text", "timerKey"),
    (sched(delayMs=None), "missing_field", "delayMs"),
    (sched(delayMs=1.5), "wrong_type", "delayMs"),
    (sched(delayMs=True), "wrong_type", "delayMs"),
    (sched(delayMs="1000"), "wrong_type", "delayMs"),
    (sched(delayMs=timers.MAX_DELAY_MS + 1), "out_of_range", "delayMs"),
    (sched(payload=None), "missing_field", "payload"),
    (sched(payload={"a": 1}), "wrong_type", "payload"),
    (sched(payload="not base64!"), "invalid_base64", "payload"),
    (sched(payload="eyJhIjoxfQ"), "invalid_base64", "payload"),  # padding missing
    (sched(payload=b64(b"{nope")), "invalid_payload", "payload"),
    (sched(payloadZstd="yes"), "wrong_type", "payloadZstd"),
    (sched(txn=12), "wrong_type", "txn"),
    (sched(partition=3), "wrong_type", "partition"),
    ("schedule", "not_an_object", None),
])
def test_invalid_ops_are_400_with_index_and_reason(op, reason, field):
    err = error_of([sched(), op])
    assert err.status == 400 and err.index == 1
    assert err.reason == reason and err.field == field
    body = err.to_dict()
    assert body["reason"] == reason and body["detail"] == err.message and body["index"] == 1


@pytest.mark.parametrize(("op", "field", "code"), [
    (sched(queue=""), "queue", "invalid_name"),
    (sched(queue="a/b"), "queue", "invalid_name"),
    (sched(queue="a\x01"), "queue", "invalid_name"),
    (sched(partition="p\x7f"), "partition", "invalid_name"),
])
def test_bad_names_are_invalid_name(op, field, code):
    err = error_of([op])
    assert err.code == code and err.status == 400 and err.field == field and err.index == 0


@pytest.mark.parametrize(("op", "field", "limit"), [
    (sched(timerKey="k" * 1025), "timerKey", 1024),
    (sched(timerKey="é" * 513), "timerKey", 1024),
    (sched(txn="t" * 1025), "txn", 1024),
    (sched(queue="q" * 256), "queue", 255),
    (sched(partition="p" * 256), "partition", 255),
    ({"op": "cancel", "queue": "q", "timerKey": "k" * 1025}, "timerKey", 1024),
])
def test_over_the_limits_is_413_name_too_long(op, field, limit):
    err = error_of([op], we.NameTooLong)
    assert err.status == 413 and err.code == "name_too_long"
    assert err.field == field and err.limit == limit and err.index == 0


def test_limits_are_inclusive():
    op = parse_one(sched(timerKey="k" * 1024, txn="t" * 1024, queue="q" * 255))
    assert len(op["timerKey"]) == 1024


def test_the_array_itself():
    assert timers.parse_timer_ops([]) == []
    assert error_of({"op": "schedule"}).reason == "wrong_type"
    err = error_of([{"op": "cancel", "queue": "q", "timerKey": "k"}] * (timers.MAX_OPS + 1))
    assert err.reason == "too_many_ops" and err.status == 400


def test_route_helpers():
    assert timers.check_timer_key("a/b/c") == "a/b/c"
    assert timers.check_queue("q") == "q"
    with pytest.raises(we.NameTooLong) as info:
        timers.check_timer_key("x" * 1025)
    assert info.value.index is None
    with pytest.raises(we.InvalidName):
        timers.check_queue("a/b")


# ------------------------------------------------------------------------------ minting
def test_mint_fills_message_id_and_default_txn():
    ops = timers.parse_timer_ops([sched(), sched(txn="mine", timerKey="b"),
                                  {"op": "cancel", "queue": "q", "timerKey": "k"}])
    minted = timers.mint(ops)
    assert ops[0]["txn"] is None and "messageId" not in ops[0]  # inputs untouched
    a, b, c = minted
    assert is_uuid7(uuid_from_text(a["messageId"])) and a["txn"] == a["messageId"]
    assert is_uuid7(uuid_from_text(b["messageId"])) and b["txn"] == "mine"
    assert a["messageId"] != b["messageId"]
    assert c == {"op": "cancel", "queue": "q", "timerKey": "k", "txn": None}
    orjson.dumps(minted)  # JSON-serialisable as is


def test_queues_to_provision_are_those_of_schedule_ops():
    ops = timers.parse_timer_ops([sched(queue="b"), sched(queue="a"), sched(queue="b"),
                                  sched(op="reschedule", queue="c"),
                                  {"op": "cancel", "queue": "d", "timerKey": "k"}])
    assert timers.queues_to_provision(ops) == ["a", "b"]


def test_payload_json_round_trip():
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b'{"x":true}')
    assert timers.payload_json(frame, True, 1 << 20) == b'{"x":true}'
    assert timers.payload_json(b"", False, 1 << 20) == b""
