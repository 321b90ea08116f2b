"""queen_mp/models/ephemeral.py: what the ephemeral routes accept, normalise and refuse."""

from __future__ import annotations

import pytest

from queen_mp.db.ephemeral_procs import ack_params
from queen_mp.models import ephemeral as m
from queen_mp.models.errors import InvalidRequest, RequestError
from queen_mp.wire.errors import WireError


def test_options_are_normalised_and_zero_means_default_where_it_should():
    assert m.parse_options(None) == {}
    got = m.parse_options({"maxBytes": 0, "maxLength": 5, "policy": "dropOldest",
                           "ttlSeconds": 0, "leaseSeconds": 0, "retryLimit": 0,
                           "windowBuffer": {"ms": 10}})
    # 0 bytes/length/lease = the default (dropped); 0 ttl = off and 0 retries = none (kept)
    assert got == {"maxLength": 5, "ttlSeconds": 0, "retryLimit": 0, "policy": "dropOldest",
                   "windowBuffer": {"ms": 10, "count": 0}}


@pytest.mark.parametrize("options", [
    {"maxLength": -1}, {"maxLength": 10_000_001}, {"maxBytes": 1.0}, {"retryLimit": True},
    {"ttlSeconds": "5"}, {"policy": "drop_oldest"}, {"windowBuffer": []},
    {"windowBuffer": {"size": 1}}, {"windowBuffer": {"ms": 60_001}}, {"ttl_seconds": 5}, [],
])
def test_bad_options_are_refused(options):
    with pytest.raises(InvalidRequest):
        m.parse_options(options)


def test_push_keeps_payloads_as_json_text_and_defaults_the_partition():
    push = m.parse_push({"queue": "q", "messages": [{"payload": {"b": 1, "a": [None]}},
                                                    {"payload": None}]})
    assert push == m.Push("q", "Default", ('{"b":1,"a":[null]}', "null"))
    with pytest.raises(InvalidRequest):
        m.parse_push({"queue": "q", "messages": [{"payload": 1}] * (m.MAX_MESSAGES + 1)})
    with pytest.raises((RequestError, WireError)):
        m.parse_push({"queue": "a/b", "messages": []})
    deep: list = []
    for _ in range(600):  # beyond orjson's writer, within the stdlib's: stored
        deep = [deep]
    assert len(m.parse_push({"queue": "q", "messages": [{"payload": deep}]}).payloads[0]) == 1202
    for _ in range(2000):  # beyond both: a 400, never a 500 (found by tests/fuzz)
        deep = [deep]
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        m.parse_push({"queue": "q", "messages": [{"payload": deep}]})


def test_pop_parameters():
    r = m.pop_request("q", "", "", 5, True, 100, False)
    assert (r.partition, r.group) == (None, m.QUEUE_MODE)
    for batch, timeout in ((0, 0), (m.MAX_BATCH + 1, 0), (1, m.MAX_TIMEOUT_MS + 1), (1, -1)):
        with pytest.raises(InvalidRequest):
            m.pop_request("q", None, None, batch, True, timeout, False)
    with pytest.raises(InvalidRequest):
        m.pop_request(None, None, None, 1, False, 0, False)


def test_ack_ids_parse_and_statuses_default_to_completed():
    ack = m.parse_ack({"queue": "q", "acks": [
        {"id": "0123456789abcdef-42-2", "status": "retry", "error": "x"},
        {"id": "garbage"}, {"id": "0123456789ABCDEF-1-1"}, {"id": "0123456789abcdef-1-1-1"}]})
    assert ack.group == m.QUEUE_MODE
    assert ack.statuses == ("retry", "completed", "completed", "completed")
    assert (ack.epochs, ack.seqs, ack.deliveries) == (
        ("0123456789abcdef", "", "", ""), ("42", "", "", ""), ("2", "", "", ""))
    for bad in ({"id": "x\x00"}, {"id": ""}, {"id": "x" * 65}, {"id": "x", "status": "ok"},
                {"id": "x", "error": 5}, "x"):
        with pytest.raises(InvalidRequest):
            m.parse_ack({"queue": "q", "acks": [bad]})


EP = "0123456789abcdef"


@pytest.mark.parametrize("acks", [
    [{"id": f"{EP}-{s}-7"} for s in range(100, 140)],
    [{"id": f"{EP}-1-7", "status": "retry", "error": "e"}, {"id": f"{EP}-2-7"}],
    [{"id": f"{EP}-1-7", "error": None}, {"id": f"{EP}-2-7", "status": None}],
    [{"id": f"{EP}-1-7"}, {"id": f"{EP}-2-7", "status": "failed", "other": 1}],
    # two dashes in all, not two each: split together, their parts would line up as ours
    [{"id": f"{EP}-1"}, {"id": "1111111111111111-1234567890123456-5-7"}],
    [{"id": f"{EP}-1-7"}, {"id": f"{EP.upper()}-1-7"}, {"id": f"{EP}-1-"}],
    [{"id": f"{EP}-1-7"}, {"id": f"{EP}-1-1234567890123456789"}, {"id": f"{EP}-\u0661-7"}],
])
def test_ack_ids_parsed_a_list_at_a_time_as_one_by_one(acks: list[dict]):
    """``_our_acks`` (the usual acks, parsed together) answers as ``_acks`` would, or leaves
    the list to it."""
    fast = m._our_acks(acks)
    slow = m._acks(acks)
    assert fast is None or fast == slow
    assert (fast is not None) == all(m.parse_id(a["id"]) is not None for a in acks) or any(
        a.get("status", "") is None or a.get("error", "") is None for a in acks)
    assert m.parse_ack({"queue": "q", "acks": acks}) == m.Ack("q", m.QUEUE_MODE, *slow)


@pytest.mark.parametrize(("window", "held", "batch", "waited", "ready"), [
    (m.Window(), 0, 10, 0, False),
    (m.Window(), 1, 10, 0, True),  # no window: anything answers
    (m.Window(ms=100, count=3), 2, 10, 50, False),
    (m.Window(ms=100, count=3), 3, 10, 0, True),
    (m.Window(ms=100, count=3), 2, 10, 100, True),
    (m.Window(ms=0, count=5), 4, 10, 10_000, False),  # count only: until the pop's timeout
    (m.Window(ms=100, count=50), 10, 10, 0, True),  # a full batch always answers
])
def test_window_readiness(window, held, batch, waited, ready):
    assert window.ready(held, batch, waited) is ready



def test_ack_params_send_a_list_of_one_value_as_that_value() -> None:
    """eph_ack_v5 spreads a list of one element over every id; a list of several values, or
    of ids that are not ours (''), goes whole."""
    got = ack_params(b"\0" * 16, "q", "g", ("completed",) * 3, ("e" * 16,) * 3,
                     ("1", "2", "3"), ("7", "7", "7"))
    assert got[3:] == ("e" * 16, "1,2,3", "7", "completed")
    got = ack_params(b"\0" * 16, "q", "g", ("completed", "failed"), ("", ""), ("", ""),
                     ("7", "8"))
    assert got[3:] == (",", ",", "7,8", "completed,failed")
