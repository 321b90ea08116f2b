"""What SQL answers reach Python as: the typed records ``queen_mp/db`` decodes them into.

The statements themselves run in the integration tests; here the decoders get the answers'
shapes (and broken ones) without a server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import struct
import uuid
from typing import Any

import msgspec
import pytest

from queen_mp.db import ack_procs, bundles, pop_procs
from queen_mp.db.binarrays import int4_array, int4_data, int8_array, int8_data, int8_values
from queen_mp.db.calls import SegmentVerdict, segment_verdicts
from queen_mp.db.errors import DatabaseError

TS = 1764530000123456


def answer(pids: list[int], bases: list[int], windows: list[int],
           dups: tuple[tuple[int, int, int], ...] = ()) -> list[int]:
    """log_push_multi_v3's int8[]: ids, bases (0 = duplicate), stamps, windows, dup triples."""
    return [*pids, *bases, *[TS] * len(pids), *windows, *(x for d in dups for x in d)]


def test_segment_verdicts_by_input_ordinal() -> None:
    got = segment_verdicts(answer([10, 20, 30], [0, 7, 1], [60, 3600, 0],
                                  ((0, 0, 3), (0, 2, 5))), 3)
    assert got == [
        SegmentVerdict(10, TS, False, None, 60, ((0, 3), (2, 5))),
        SegmentVerdict(20, TS, True, 7, 3600, ()),
        SegmentVerdict(30, TS, True, 1, 0, ()),
    ]


def test_segment_verdicts_are_immutable_records() -> None:
    (v,) = segment_verdicts(answer([1], [1], [3600]), 1)
    assert type(v) is SegmentVerdict
    assert (v.partition_id, v.queued, v.base_offset, v.window) == (1, True, 1, 3600)
    with pytest.raises(AttributeError):
        v.base_offset = 2  # type: ignore[misc]
    assert not hasattr(v, "__dict__")


@pytest.mark.parametrize("got", [
    None,
    [],  # fewer verdicts than segments
    answer([1, 2], [1, 1], [0, 0])[:-1],  # an element short
    answer([1, 2], [1, 0], [0, 0]),  # a duplicate without its frames
    answer([1, 2], [1, -3], [0, 0], ((1, 0, 1),)),  # a negative base
    answer([1, 2], [1, 5], [0, 0], ((1, 0, 1),)),  # frames of a queued segment
    answer([1, 2], [1, 0], [0, 0], ((2, 0, 1),)),  # frames of an ordinal out of range
    answer([1, 2], [1, 0], [0, 0], ((1, 0, 1),))[:-1],  # a triple cut short
])
def test_a_malformed_answer_fails_the_whole_bundle(got: Any) -> None:
    with pytest.raises(DatabaseError):
        segment_verdicts(got, 2)


def test_int8_values_reads_array_send() -> None:
    assert int8_values(int8_array([5, -1, 2**62]).data) == (5, -1, 2**62)
    assert int8_values(b"\0\0\0\0\0\0\0\0\0\0\0\x14") == ()  # '{}'
    with pytest.raises(ValueError):
        int8_values(int4_array([1]).data)  # not int8
    with pytest.raises(ValueError):
        int8_values(int8_array([1, 2]).data[:-1])  # cut short
    null = bytearray(int8_array([1, 2]).data)
    null[4:8] = (1).to_bytes(4, "big")  # has-nulls, the second element NULL (length -1)
    null[32:] = (-1).to_bytes(4, "big", signed=True)
    with pytest.raises(ValueError):
        int8_values(bytes(null))


@pytest.mark.parametrize("n", [0, 1, 2, 10, 101, 256, 257, 1000])
def test_int_arrays_are_array_recv_form(n: int) -> None:
    # element by element: ndim 1, no NULLs, the element oid, (n, lower bound 1), then each
    # element's length word and its big-endian value; both ends of the range included
    for data, oid, code, size, low in ((int4_data, 23, "i", 4, -(1 << 31)),
                                       (int8_data, 20, "q", 8, -(1 << 63))):
        values = [(low + i, -low - 1 - i, i, -i, 7 << (size * 4))[i % 5] for i in range(n)]
        want = struct.pack(">iiIii", 1, 0, oid, n, 1) + b"".join(
            struct.pack(f">i{code}", size, v) for v in values)
        assert data(values) == want
        assert data(tuple(values)) == want
    with pytest.raises(struct.error):
        int4_data([1 << 31] * n + [1 << 31])


def test_bundle_answer_in_binary_decodes_to_verdicts() -> None:
    data = int8_array(answer([10, 20], [0, 4], [60, 0], ((0, 1, 9),))).data
    assert bundles._verdicts(data, 2) == [SegmentVerdict(10, TS, False, None, 60, ((1, 9),)),
                                          SegmentVerdict(20, TS, True, 4, 0, ())]
    with pytest.raises(DatabaseError):
        bundles._verdicts(int4_array([1, 2, 3, 4]).data, 1)
    with pytest.raises(DatabaseError):
        bundles._verdicts(None, 1)


class _Cursor:
    """The part of a psycopg cursor that queen_mp.db.cursors uses."""

    closed = False

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn

    async def execute(self, query: str, params: Any = (), **kw: Any) -> None:
        self.conn.params = params

    async def fetchall(self) -> list[tuple[Any, ...]]:
        return self.conn.rows

    async def fetchone(self) -> tuple[Any, ...] | None:
        return self.conn.rows[0] if self.conn.rows else None

    def _reset(self) -> None:
        pass


class _Conn:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows
        self.params: Any = None

    def cursor(self, binary: bool = False) -> _Cursor:
        return _Cursor(self)


REQUEST = pop_procs.PopRequest(
    tenant=bytes(16), queue="q", partition=None, namespace=None, task=None, group="g", batch=5,
    partitions=2, wait=True, timeout_ms=1000, auto_ack=False, sub_mode="all", sub_from=None)


def test_log_pop_rows_become_one_claim_per_partition_with_its_segments() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    exp = t0 + dt.timedelta(seconds=30)
    rows = [
        ("q", 7, "p0", 3, 5, 1, exp, False, 1, t0, b"seg-a", None),
        ("q", 7, "p0", 3, 5, 1, exp, False, 5, t0, b"seg-b", None),
        ("q", 9, "p1", 1, 1, 2, exp, True, None, None, None, None),  # retained away
    ]
    got = pop_procs.claim_result(rows)
    assert got == pop_procs.ClaimResult([
        pop_procs.Claim("q", 7, "p0", 3, 5, 1, exp, False, [(1, t0, b"seg-a"), (5, t0, b"seg-b")]),
        pop_procs.Claim("q", 9, "p1", 1, 1, 2, exp, True, []),
    ], None)
    assert got.claims[0].count == 3


def test_log_pop_parameters_go_in_binary_in_its_order() -> None:
    """the request's claim parameters, in log_pop_v3's order, then the attempt's own"""
    lease = uuid.uuid4()
    assert pop_procs.claim_params(REQUEST, lease, 750) == [
        bytes(16), b"q", None, None, None, b"g", b"\0\0\0\x05", b"\0\0\0\x02", b"\0", b"all",
        None, lease.bytes, b"\0\0\x02\xee"]
    since = msgspec.structs.replace(
        REQUEST, partition="p", auto_ack=True, sub_mode="timestamp",
        sub_from=dt.datetime(2000, 1, 1, 0, 0, 1, 5, tzinfo=dt.UTC))
    got = pop_procs.claim_params(since, None, 10)
    assert got[2] == b"p" and got[8] == b"\x01" and got[11] is None
    assert got[10] == (1_000_005).to_bytes(8, "big")  # microseconds since 2000-01-01 UTC
    naive = msgspec.structs.replace(since, sub_from=dt.datetime(2000, 1, 1, 0, 0, 1, 5))
    assert pop_procs.claim_params(naive, None, 10)[10] == got[10]  # read as UTC


def test_log_pop_rows_without_claim_columns_continue_the_claim_above() -> None:
    """log_pop_v3's lone claim: a first row with the claim's columns and no segment, then one
    row per segment with NULL claim columns; the next claim starts at its own first row."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    exp = t0 + dt.timedelta(seconds=30)
    none8 = (None,) * 8
    rows = [
        ("q", 7, "p0", 3, 12, 1, exp, False, None, None, None, None),
        (*none8, 1, t0, b"seg-a", None),
        (*none8, 5, t0, b"seg-b", None),
        ("q", 9, "p1", 1, 1, 2, exp, True, 1, t0, b"seg-c", None),
        (*none8, 2, t0, b"seg-d", None),
        ("q", 11, "p2", 4, 4, 1, exp, True, None, None, None, None),  # retained away
    ]
    got = pop_procs.claim_result(rows)
    assert got == pop_procs.ClaimResult([
        pop_procs.Claim("q", 7, "p0", 3, 12, 1, exp, False,
                        [(1, t0, b"seg-a"), (5, t0, b"seg-b")]),
        pop_procs.Claim("q", 9, "p1", 1, 1, 2, exp, True, [(1, t0, b"seg-c"), (2, t0, b"seg-d")]),
        pop_procs.Claim("q", 11, "p2", 4, 4, 1, exp, True, []),
    ], None)


def test_nothing_claimable_carries_the_wake_hint() -> None:
    row = (None,) * 11 + (250,)
    assert pop_procs.claim_result([row]) == pop_procs.ClaimResult([], 250)


def test_ack_answers() -> None:
    doc = {"ok": True, "error": None, "old": 3, "new": 5, "acked": 2, "leaseReleased": True,
           "dlq": False, "poison": None, "signalIndex": None, "signal": None, "dropped": False,
           "retryCount": None, "noop": [1], "stale": [], "unresolved": [2], "clamped": [],
           "invalid": [], "queue": "q"}
    got = asyncio.run(ack_procs.ack_by_hash(_Conn([(doc,)]), bytes(16), 1, "g",  # type: ignore[arg-type]
                                            None, [], []))
    assert got == ack_procs.GroupAck(True, None, 2, True, False, None, None, (1,), (), (2,),
                                     (), (), "q")
    bad = {"ok": False, "error": "partition_not_found", "old": None, "new": None,
           "leaseReleased": False}
    got = asyncio.run(ack_procs.ack_at(_Conn([(bad,)]), bytes(16), 1, "g",  # type: ignore[arg-type]
                                       bytes(16), 4, 1))
    assert got == ack_procs.Advance(False, "partition_not_found", 0, 0, False)
    multi = [1, 0, 0, 0, 1, 4, 2, None, None]  # log_ack_multi_v3: (code, old, new) per row
    got = asyncio.run(ack_procs.ack_multi(_Conn([(multi,)]), bytes(16), [1, 2, 3],  # type: ignore[arg-type]
                                          ["g"] * 3, [bytes(16)] * 3, [4] * 3, [1] * 3))
    assert got == [ack_procs.Advance(False, "lease_invalid", 0, 0, False),
                   ack_procs.Advance(True, None, 1, 4, True),
                   ack_procs.Advance(False, "partition_not_found", 0, 0, False)]
    for bad_answer in (None, [0, 1], [5, 0, 0], [None, 0, 0]):
        with pytest.raises(DatabaseError):
            ack_procs.advances(bad_answer, 1)
