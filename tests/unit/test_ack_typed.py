"""The typed ack decoder (``decode_ack_batch``) reads a body as the exact path does
(``parse_ack_item``), or leaves it to that path: never an item it would refuse or read
otherwise."""

from __future__ import annotations

import uuid

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queen_mp.db.ack_procs import AckItem
from queen_mp.http.ack import MAX_ACKS, AckBatchResource, AckResource, _load
from queen_mp.http.errors import ApiError
from queen_mp.models import items as items_mod
from queen_mp.models.errors import RequestError
from queen_mp.models.items import decode_ack_batch
from queen_mp.wire.errors import WireError
from tests.unit.test_push_typed import dump  # three spellings of one document

LEASE = str(uuid.UUID(int=42))


def exact(body: bytes, batch: bool) -> list[AckItem]:
    resource = (AckBatchResource if batch else AckResource).__new__(
        AckBatchResource if batch else AckResource)
    return resource.items(_load(body))


def same_reading(body: bytes, batch: bool) -> list[AckItem] | None:
    decoded = decode_ack_batch(body, batch, MAX_ACKS)
    typed = decoded.items() if decoded is not None else None
    try:
        want = exact(body, batch)
    except (ApiError, RequestError, WireError):
        assert typed is None, "the typed path took a body the exact path refuses"
        return None
    if typed is not None:
        assert typed == want
    return typed


GOOD_ACK = st.fixed_dictionaries(
    {"transactionId": st.text(min_size=1, max_size=8),
     "partitionId": st.one_of(st.sampled_from(["7", "12", "007"]), st.integers(1, 99))},
    optional={"status": st.sampled_from(["completed", "success", "failed", "retry", "dlq"]),
              "consumerGroup": st.one_of(st.none(), st.sampled_from(["", "g1", "null"])),
              "leaseId": st.one_of(st.none(), st.just(""), st.just(LEASE), st.just("x")),
              "error": st.one_of(st.none(), st.text(max_size=6)), "other": st.integers()})
ANY = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.text(max_size=6),
                st.floats(allow_nan=False, allow_infinity=False), st.just([1]), st.just({}))
ANY_ACK = st.fixed_dictionaries({}, optional={
    "transactionId": ANY, "partitionId": ANY, "status": ANY, "consumerGroup": ANY,
    "leaseId": ANY, "error": ANY})
ACKS = st.one_of(st.lists(GOOD_ACK, max_size=5),
                 st.lists(st.one_of(GOOD_ACK, ANY_ACK), max_size=5))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(acks=ACKS, group=st.one_of(st.none(), st.just("g2"), ANY), style=st.integers(0, 2),
       whole=st.booleans())
def test_generated_batches_are_read_alike(acks: list[dict[str, object]], group: object,
                                          style: int, whole: bool) -> None:
    doc = {"acknowledgments": acks, "consumerGroup": group} if whole else {"acknowledgments":
                                                                              acks}
    same_reading(dump(doc, style), True)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(ack=st.one_of(GOOD_ACK, ANY_ACK), style=st.integers(0, 2))
def test_generated_single_acks_are_read_alike(ack: dict[str, object], style: int) -> None:
    same_reading(dump(ack, style), False)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.binary(max_size=60), at=st.integers(0, 150))
def test_hostile_bytes_inside_a_valid_batch_are_read_alike(body: bytes, at: int) -> None:
    base = orjson.dumps({"acknowledgments": [
        {"transactionId": "t-1", "partitionId": "7", "leaseId": LEASE}]})
    at = min(at, len(base))
    same_reading(base[:at] + body + base[at:], True)


def test_a_client_batch_takes_the_typed_path() -> None:
    body = orjson.dumps({"acknowledgments": [
        {"transactionId": f"t-{i}", "partitionId": "7", "leaseId": LEASE,
         "status": "completed" if i else "success", "consumerGroup": "g"} for i in range(50)]})
    typed = same_reading(body, True)
    assert typed is not None and len(typed) == 50
    assert {(i.partition_id, i.group, i.status) for i in typed} == {(7, "g", "completed")}


def test_number_shapes_inside_strings_keep_the_typed_path() -> None:
    # a lease id's hex holding "e" and three digits, a 19-digit transactionId: text, no number
    lease = "0194f1c2-7d3e-7e123-8a4b-1234567890ab"
    body = orjson.dumps({"acknowledgments": [
        {"transactionId": f"t-{i}-1234567890123456789", "partitionId": "7", "leaseId": lease}
        for i in range(3)]})
    typed = same_reading(body, True)
    assert typed is not None and len(typed) == 3
    # the same shapes as numbers outside the strings still leave the body to the exact path
    for number in (b"1e123", b"1234567890123456789012"):
        assert decode_ack_batch(body[:-1] + b',"x":' + number + b"}", True, MAX_ACKS) is None


@pytest.mark.parametrize("extra", [b"1e400", b"12345678901234567890123", b'"\xff"',
                                   b"[" * 1100 + b"]" * 1100])
def test_what_orjson_refuses_anywhere_goes_to_the_exact_path(extra: bytes) -> None:
    body = (b'{"acknowledgments":[{"transactionId":"t","partitionId":"7"}],"x":' + extra
            + b"}")
    assert decode_ack_batch(body, True, MAX_ACKS) is None
    same_reading(body, True)


@pytest.mark.parametrize(("txn", "typed"), [
    ("", False), ("t" * 256, True), ("t" * 257, False), ("é" * 256, True), ("é" * 300, False),
    ("é" * 513, False)])
def test_a_transaction_id_past_the_typed_bounds_goes_to_the_exact_path(txn: str,
                                                                        typed: bool) -> None:
    # msgspec bounds it at 256 characters (at most 1,024 UTF-8 bytes); a longer one may still
    # fit in 1,024 bytes ("é" * 300, taken) or not ("é" * 513, refused): the exact path says
    body = orjson.dumps({"acknowledgments": [{"transactionId": txn, "partitionId": "7"}]})
    assert (same_reading(body, True) is not None) is typed
    if txn and len(txn.encode()) <= 1024:
        assert [i.transaction_id for i in exact(body, True)] == [txn]


@pytest.mark.parametrize("status", ["completed", "success", "failed", "retry", "dlq", "done",
                                    "COMPLETED"])
def test_a_status_is_read_as_the_exact_path_reads_it(status: str) -> None:
    body = orjson.dumps({"acknowledgments": [
        {"transactionId": f"t-{i}", "partitionId": "7", "status": status} for i in range(3)]})
    read = same_reading(body, True)
    known = status in ("completed", "success", "failed", "retry", "dlq")
    assert (decode_ack_batch(body, True, MAX_ACKS) is not None) is known
    assert (read is not None) is known
    if read is not None:
        assert {i.status for i in read} == {"completed" if status == "success" else status}


REGULAR_TXN = st.text(alphabet=st.characters(max_codepoint=0x7F), min_size=0, max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(txns=st.lists(st.one_of(REGULAR_TXN, st.text(max_size=4)), min_size=1, max_size=6),
       shared=GOOD_ACK, group=st.one_of(st.none(), st.just("g2"), ANY), whole=st.booleans(),
       first=st.booleans())
def test_regular_batches_are_read_alike(txns: list[str], shared: dict[str, object],
                                        group: object, whole: bool, first: bool) -> None:
    # a client's shape: one acknowledgment's fields again with another transactionId each
    acks = [{"transactionId": t, **{k: v for k, v in shared.items() if k != "transactionId"}}
            for t in txns]
    doc = {"acknowledgments": acks}
    if whole:
        doc = {"consumerGroup": group, **doc} if first else {**doc, "consumerGroup": group}
    same_reading(dump(doc, 0), True)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.binary(max_size=40), at=st.integers(0, 400))
def test_hostile_bytes_inside_a_regular_batch_are_read_alike(body: bytes, at: int) -> None:
    base = orjson.dumps({"consumerGroup": "g", "acknowledgments": [
        {"transactionId": f"t-{i}", "partitionId": "7", "leaseId": LEASE,
         "status": "completed"} for i in range(3)]})
    at = min(at, len(base))
    same_reading(base[:at] + body + base[at:], True)


def test_a_client_batch_takes_the_regular_reading() -> None:
    body = orjson.dumps({"consumerGroup": "g", "acknowledgments": [
        {"transactionId": f"t-{i}", "partitionId": "7", "leaseId": LEASE,
         "status": "completed"} for i in range(100)]})
    assert items_mod._regular_acks(body) is not None
    typed = same_reading(body, True)
    assert typed is not None
    assert [i.transaction_id for i in typed] == [f"t-{i}" for i in range(100)]
    assert {(i.partition_id, i.group, i.status, str(i.lease_id)) for i in typed} == {
        (7, "g", "completed", LEASE)}


ONE = b'{"transactionId":"%s","partitionId":"7","leaseId":"' + LEASE.encode() + b'"}'


@pytest.mark.parametrize("body", [
    # a later "acknowledgments" wins: the items before it are not the batch
    b'{"acknowledgments":[' + ONE % b"a" + b"," + ONE % b"b" + b'],"acknowledgments":['
    + ONE % b"a" + b"]}",
    # an earlier one loses
    b'{"acknowledgments":[' + ONE % b"z" + b'],"acknowledgments":[' + ONE % b"a" + b","
    + ONE % b"b" + b"]}",
    # the first item's rest names its transactionId again (the last one wins)
    b'{"acknowledgments":[{"transactionId":"a","partitionId":"7","transactionId":"c"},'
    b'{"transactionId":"b","partitionId":"7","transactionId":"c"}]}',
    # a "}" inside the rest's text; a raw control and an escape in a transactionId
    b'{"acknowledgments":[{"transactionId":"a","partitionId":"7","error":"x}"},'
    b'{"transactionId":"b","partitionId":"7","error":"x}"}]}',
    b'{"acknowledgments":[' + ONE % b"a" + b"," + ONE % b"b\x01" + b"]}",
    b'{"acknowledgments":[' + ONE % b"a" + b"," + ONE % b'b\\"' + b"]}",
    # items that differ past their transactionId; one empty; one over the typed bound
    b'{"acknowledgments":[' + ONE % b"a" + b',{"transactionId":"b","partitionId":"8"}]}',
    b'{"acknowledgments":[' + ONE % b"a" + b"," + ONE % b"" + b"]}",
    b'{"acknowledgments":[' + ONE % b"a" + b"," + ONE % (b"t" * 257) + b"]}",
    # no array around the items, a trailing comma, another field after them
    b'{"acknowledgments":' + ONE % b"a" + b"}",
    b'{"acknowledgments":[' + ONE % b"a" + b"," + ONE % b"b" + b",]}",
    b'{"acknowledgments":[' + ONE % b"a" + b"," + ONE % b"b" + b'],"x":1}',
])
def test_irregular_lookalikes_are_read_alike(body: bytes) -> None:
    same_reading(body, True)
