"""The ephemeral pop's answer rendered from eph_pop_v5's runs (front/ephemeral.py)."""

from __future__ import annotations

import orjson
import pytest

from queen_mp.db.ephemeral_procs import PopOutcome
from queen_mp.front.ephemeral import render_messages
from queen_mp.models.items import dumps_json


def outcome(runs: list[tuple[str, int, int, int, list[object]]]) -> PopOutcome:
    """Runs of (partition, dlv, attempts, first seq, payloads), as eph_pop_v5 joins them."""
    blob = b"\x1f".join(b"\x1e".join(dumps_json(p) for p in payloads)
                        for *_, payloads in runs)
    return PopOutcome("0123456789abcdef", [r[0] for r in runs], [r[1] for r in runs],
                      [r[2] for r in runs], [r[3] for r in runs], [len(r[4]) for r in runs],
                      blob, sum(len(r[4]) for r in runs), None, 0, 0)


def test_nothing_claimed_is_an_empty_array():
    assert render_messages(outcome([])) == b"[]"


def test_runs_render_as_v3_did_byte_for_byte():
    """Key order, ids and payloads verbatim, as eph_pop_v3 built the JSON in SQL."""
    out = render_messages(outcome([("p", 7, 1, 16384, [{"a": 1}, "x", 3]),
                                   ("q", 7, 1, 16390, [None])]))
    assert out == (b'[{"id":"0123456789abcdef-16384-7","partition":"p","attempts":1,'
                   b'"payload":{"a":1}},'
                   b'{"id":"0123456789abcdef-16385-7","partition":"p","attempts":1,"payload":"x"},'
                   b'{"id":"0123456789abcdef-16386-7","partition":"p","attempts":1,"payload":3},'
                   b'{"id":"0123456789abcdef-16390-7","partition":"q","attempts":1,'
                   b'"payload":null}]')


@pytest.mark.parametrize("payload", ["100%", "%d %s %%", {"%b": "%(x)s"}, "é\u2028\x1e\x1f\x00",
                                     "", [], "}," * 3])
def test_any_payload_and_partition_comes_back_as_it_was(payload):
    runs = [("p%d%%", 0, 1, 5, [payload, "z"]), ('q"\\é', 9, 3, 12, [payload])]
    got = orjson.loads(render_messages(outcome(runs)))
    assert got == [
        {"id": "0123456789abcdef-5-0", "partition": "p%d%%", "attempts": 1, "payload": payload},
        {"id": "0123456789abcdef-6-0", "partition": "p%d%%", "attempts": 1, "payload": "z"},
        {"id": "0123456789abcdef-12-9", "partition": 'q"\\é', "attempts": 3,
         "payload": payload}]


def test_a_run_whose_payloads_do_not_match_its_count_is_refused():
    bad = outcome([("p", 1, 1, 0, ["a", "b"])])
    short = PopOutcome(bad.epoch, bad.parts, bad.dlvs, bad.atts, bad.firsts, [3], bad.payloads,
                       3, None, 0, 0)
    with pytest.raises(ValueError, match="does not hold"):
        render_messages(short)
