"""queen_mp.models.streams: the Streams SDK's bodies, every refusal decided before anything
runs (no server)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from queen_mp.models.errors import InvalidRequest, InvalidStatus
from queen_mp.models.errors import NameTooLong as KeyTooLong
from queen_mp.models.items import QUEUE_MODE
from queen_mp.models.streams import (
    MAX_STATE_KEYS,
    parse_cycle,
    parse_register,
    parse_state_get,
)
from queen_mp.wire.errors import InvalidName, NameTooLong
from queen_mp.wire.frames import iter_frames
from queen_mp.wire.hashing import txn_hash

QID = "0196f3a2-c000-7000-8000-000000000a0a"
LEASE = "0196f3a2-c000-7000-8000-000000000a0b"


def body(**doc: Any) -> bytes:
    return orjson.dumps(doc)


def field_of(ex: Exception) -> str | None:
    """The field a refusal names (models' RequestError.extra, wire errors' .field)."""
    extra = getattr(ex, "extra", None)
    return extra.get("field") if extra is not None else getattr(ex, "field", None)


def test_register_reads_the_sdk_body():
    r = parse_register(body(name="orders.per_min", source_queue="orders",
                            sink_queue="orders.totals", config_hash="ab" * 32, reset=True))
    assert (r.name, r.source_queue, r.sink_queue, r.config_hash, r.reset) == (
        "orders.per_min", "orders", "orders.totals", "ab" * 32, True)
    bare = parse_register(body(name="n", source_queue="q", config_hash="h"))
    assert bare.sink_queue is None and bare.reset is False


@pytest.mark.parametrize(("doc", "error", "field"), [
    ({"source_queue": "q", "config_hash": "h"}, InvalidRequest, "name"),
    ({"name": "", "source_queue": "q", "config_hash": "h"}, InvalidRequest, "name"),
    ({"name": 5, "source_queue": "q", "config_hash": "h"}, InvalidRequest, "name"),
    ({"name": "a\nb", "source_queue": "q", "config_hash": "h"}, InvalidName, "name"),
    ({"name": "é" * 128, "source_queue": "q", "config_hash": "h"}, NameTooLong, "name"),
    ({"name": "n", "source_queue": "q/r", "config_hash": "h"}, InvalidName, "queue"),
    ({"name": "n", "source_queue": "q", "sink_queue": 3, "config_hash": "h"},
     InvalidRequest, "sink_queue"),
    ({"name": "n", "source_queue": "q", "config_hash": "h" * 256}, InvalidRequest,
     "config_hash"),
    ({"name": "n", "source_queue": "q", "config_hash": "a\x00"}, InvalidRequest,
     "config_hash"),
    ({"name": "n", "source_queue": "q", "config_hash": "h", "reset": 1}, InvalidRequest,
     "reset"),
])
def test_register_refusals_name_the_field(doc, error, field):
    with pytest.raises(error) as ex:
        parse_register(orjson.dumps(doc))
    assert field_of(ex.value) == field


@pytest.mark.parametrize("raw", [b"", b"[]", b"{", b'"x"', b"null"])
def test_bodies_that_are_not_objects_are_refused(raw):
    for parse in (parse_register, parse_state_get, parse_cycle):
        with pytest.raises(InvalidRequest):
            parse(raw)


def test_state_get_filters():
    s = parse_state_get(body(query_id=QID, partition_id="17", keys=["a", "b\x1fc"],
                             key_prefix="tumb:1\x1f", ripe_at_or_before=1717000000000))
    assert s.query_id == uuid.UUID(QID) and s.partition_id == 17
    assert s.keys == ("a", "b\x1fc") and s.key_prefix == "tumb:1\x1f"
    assert s.ripe_at_or_before == 1717000000000.0
    plain = parse_state_get(body(query_id=QID, partition_id=17, key_prefix=""))
    assert plain.keys == () and plain.key_prefix is None and plain.ripe_at_or_before is None


@pytest.mark.parametrize(("doc", "error", "field"), [
    ({"partition_id": "1"}, InvalidRequest, "query_id"),
    ({"query_id": "x", "partition_id": "1"}, InvalidRequest, "query_id"),
    ({"query_id": QID}, InvalidRequest, "partition_id"),
    ({"query_id": QID, "partition_id": "0"}, InvalidRequest, "partition_id"),
    ({"query_id": QID, "partition_id": True}, InvalidRequest, "partition_id"),
    ({"query_id": QID, "partition_id": "1", "keys": {}}, InvalidRequest, "keys"),
    ({"query_id": QID, "partition_id": "1", "keys": [1]}, InvalidRequest, "keys"),
    ({"query_id": QID, "partition_id": "1", "keys": [""]}, InvalidRequest, "keys"),
    ({"query_id": QID, "partition_id": "1", "keys": ["a\x00"]}, InvalidRequest, "keys"),
    ({"query_id": QID, "partition_id": "1", "keys": ["k" * 1025]}, KeyTooLong, "keys"),
    ({"query_id": QID, "partition_id": "1", "keys": ["k"] * (MAX_STATE_KEYS + 1)},
     InvalidRequest, "keys"),
    ({"query_id": QID, "partition_id": "1", "key_prefix": 3}, InvalidRequest, "key_prefix"),
    ({"query_id": QID, "partition_id": "1", "ripe_at_or_before": True}, InvalidRequest,
     "ripe_at_or_before"),
])
def test_state_get_refusals_name_the_field(doc, error, field):
    with pytest.raises(error) as ex:
        parse_state_get(orjson.dumps(doc))
    assert field_of(ex.value) == field


def test_a_cycle_as_the_sdk_sends_it():
    c = parse_cycle(body(
        query_id=QID, partition_id="17", consumer_group="streams.q",
        state_ops=[{"type": "upsert", "key": "k", "value": {"acc": 1}},
                   {"type": "upsert", "key": "bare"}, {"type": "delete", "key": "gone"}],
        push_items=[{"queue": "out", "partition": "p", "payload": {"count": 2}},
                    {"queue": "out", "payload": 3, "transactionId": "mine"}],
        ack={"transactionId": "t-9", "leaseId": LEASE, "status": "success", "count": 2},
        release_lease=False))
    assert (c.query_id, c.partition_id, c.consumer_group) == (uuid.UUID(QID), 17, "streams.q")
    assert c.state_ops == ({"type": "upsert", "key": "k", "value": {"acc": 1}},
                           {"type": "upsert", "key": "bare", "value": {}},
                           {"type": "delete", "key": "gone"})
    assert orjson.loads(c.state_ops_json) == list(c.state_ops)
    assert c.ack is not None and c.ack.transaction_id == "t-9" and c.ack.count == 2
    assert c.ack.lease_id == uuid.UUID(LEASE) and c.release_lease is False
    first, second = c.push_items
    # a leased cycle's sink items get transactionIds of their own: a repeat dedups
    assert first.transaction_id == f"qs:{QID}:17:{LEASE}:{txn_hash('t-9').hex()[:16]}:0"
    assert second.transaction_id == "mine"
    assert first.partition == "p" and second.partition == "Default"
    assert bytes(next(iter_frames(first.frame)).payload) == b'{"count":2}'


def test_a_flush_cycle_without_ack_defaults():
    c = parse_cycle(body(query_id=QID, partition_id=17, ack=None,
                         push_items=[{"queue": "out", "payload": 1}]))
    assert c.ack is None and c.release_lease is True and c.consumer_group == QUEUE_MODE
    assert c.state_ops == () and c.state_ops_json == "[]"
    # no lease to derive it from: the message id text, as a push's
    assert uuid.UUID(c.push_items[0].transaction_id)


def test_state_values_keep_big_integers():
    raw = (b'{"query_id":"' + QID.encode() + b'","partition_id":"1","state_ops":[{"type":'
           b'"upsert","key":"k","value":{"n":123456789012345678901234567890}}]}')
    c = parse_cycle(raw)
    assert "123456789012345678901234567890" in c.state_ops_json


@pytest.mark.parametrize(("doc", "error", "field"), [
    ({"state_ops": {}}, InvalidRequest, "state_ops"),
    ({"state_ops": [1]}, InvalidRequest, "state_ops"),
    ({"state_ops": [{"type": "merge", "key": "k"}]}, InvalidRequest, "type"),
    ({"state_ops": [{"type": "upsert", "key": ""}]}, InvalidRequest, "key"),
    ({"state_ops": [{"type": "upsert", "key": "k" * 1025}]}, KeyTooLong, "key"),
    ({"state_ops": [{"type": "upsert", "key": "k", "value": {"a\x00": 1}}]}, InvalidRequest,
     "value"),
    ({"state_ops": [{"type": "upsert", "key": "k", "value": ["x\x00"]}]}, InvalidRequest,
     "value"),
    ({"push_items": {}}, InvalidRequest, "push_items"),
    ({"push_items": [{"queue": "a/b", "payload": 1}]}, InvalidName, "queue"),
    ({"ack": []}, InvalidRequest, "ack"),
    ({"ack": {"leaseId": LEASE}}, InvalidRequest, "transactionId"),
    ({"ack": {"transactionId": "t" * 1025, "leaseId": LEASE}}, KeyTooLong, "transactionId"),
    ({"ack": {"transactionId": "t"}}, InvalidRequest, "leaseId"),
    ({"ack": {"transactionId": "t", "leaseId": LEASE, "status": "dlq"}}, InvalidStatus,
     "status"),
    ({"ack": {"transactionId": "t", "leaseId": LEASE, "count": -1}}, InvalidRequest, "count"),
    ({"ack": {"transactionId": "t", "leaseId": LEASE, "count": 1 << 31}}, InvalidRequest,
     "count"),
    ({"consumer_group": 1}, InvalidRequest, "consumer_group"),
    ({"consumer_group": "a/b"}, InvalidName, "consumer_group"),
    ({"release_lease": "no"}, InvalidRequest, "release_lease"),
])
def test_cycle_refusals_name_the_field(doc, error, field):
    with pytest.raises(error) as ex:
        parse_cycle(orjson.dumps({"query_id": QID, "partition_id": "1", **doc}))
    assert field_of(ex.value) == field


def test_a_lease_id_that_is_no_uuid_can_never_be_live():
    c = parse_cycle(body(query_id=QID, partition_id="1",
                         ack={"transactionId": "t", "leaseId": "not-a-lease"}))
    assert c.ack is not None and c.ack.lease_id == uuid.UUID(int=0)
