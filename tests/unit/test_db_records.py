"""What SQL answers reach Python as: the typed records ``queen_mp/db`` decodes them into.

The statements themselves run in the integration tests; here the decoders get the answers'
shapes (and broken ones) without a server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import pytest

from queen_mp.db import ack_procs, pop_procs
from queen_mp.db.calls import SegmentVerdict, segment_verdicts
from queen_mp.db.errors import DatabaseError

TS = 1764530000123456


def queued(i: int, pid: int, base: int, w: int = 3600) -> dict[str, Any]:
    return {"i": i, "s": "queued", "w": w, "ts": TS, "pid": pid, "base": base}


def test_segment_verdicts_by_input_ordinal() -> None:
    answer = [queued(1, 20, 7), {"i": 0, "s": "duplicate", "w": 60, "ts": TS, "pid": 10,
                                 "base": None, "dups": [{"i": 0, "off": 3}, {"i": 2, "off": 5}]},
              queued(2, 30, 1, w=0)]
    got = segment_verdicts(answer, 3)
    assert got == [
        SegmentVerdict(10, TS, False, None, 60, ((0, 3), (2, 5))),
        SegmentVerdict(20, TS, True, 7, 3600, ()),
        SegmentVerdict(30, TS, True, 1, 0, ()),
    ]
    # SQL of an older revision had no "w" key, and no "dups" on a duplicate without any
    assert segment_verdicts([{"i": 0, "s": "duplicate", "ts": TS, "pid": 1, "base": None}],
                            1) == [SegmentVerdict(1, TS, False, None, 0, ())]


def test_segment_verdicts_are_immutable_records() -> None:
    (v,) = segment_verdicts([queued(0, 1, 1)], 1)
    assert type(v) is SegmentVerdict
    assert (v.partition_id, v.queued, v.base_offset, v.window) == (1, True, 1, 3600)
    with pytest.raises(AttributeError):
        v.base_offset = 2  # type: ignore[misc]
    assert not hasattr(v, "__dict__")


@pytest.mark.parametrize("answer", [
    None,
    {"i": 0},
    [],  # fewer verdicts than segments
    [queued(0, 1, 1), queued(0, 2, 1)],  # an ordinal twice, one missing
    [queued(0, 1, 1), queued(2, 2, 1)],  # an ordinal out of range
    [{**queued(0, 1, 1), "s": "stored"}, queued(1, 2, 1)],  # an unknown status
    [{"s": "queued", "pid": 1, "ts": TS, "base": 1}, queued(1, 2, 1)],  # no ordinal
    [{"i": 0, "s": "queued", "ts": TS, "base": 1}, queued(1, 2, 1)],  # no partition id
    [{"i": 0, "s": "duplicate", "ts": TS, "pid": 1, "dups": [{"i": 0}]}, queued(1, 2, 1)],
])
def test_a_malformed_answer_fails_the_whole_bundle(answer: Any) -> None:
    with pytest.raises(DatabaseError):
        segment_verdicts(answer, 2)


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
    conn = _Conn(rows)
    lease = uuid.uuid4()
    got = asyncio.run(pop_procs.claim(conn, REQUEST, lease, 750))  # type: ignore[arg-type]
    assert got == pop_procs.ClaimResult([
        pop_procs.Claim("q", 7, "p0", 3, 5, 1, exp, False, [(1, t0, b"seg-a"), (5, t0, b"seg-b")]),
        pop_procs.Claim("q", 9, "p1", 1, 1, 2, exp, True, []),
    ], None)
    assert got.claims[0].count == 3
    # the request's claim parameters, in log_pop_v1's order, then the attempt's own
    assert conn.params == (uuid.UUID(int=0), "q", None, None, None, "g", 5, 2, False, "all",
                           None, lease, 750)


def test_nothing_claimable_carries_the_wake_hint() -> None:
    row = (None,) * 11 + (250,)
    got = asyncio.run(pop_procs.claim(_Conn([row]), REQUEST, None, 10))  # type: ignore[arg-type]
    assert got == pop_procs.ClaimResult([], 250)


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
    multi = [{"i": 1, "ok": True, "error": None, "old": 1, "new": 4, "leaseReleased": True},
             {"i": 0, "ok": False, "error": "lease_invalid", "old": 0, "new": 0,
              "leaseReleased": False}]
    got = asyncio.run(ack_procs.ack_multi(_Conn([(multi,)]), bytes(16), [1, 2],  # type: ignore[arg-type]
                                          ["g", "g"], [bytes(16)] * 2, [4, 4], [1, 1]))
    assert got == [ack_procs.Advance(False, "lease_invalid", 0, 0, False),
                   ack_procs.Advance(True, None, 1, 4, True)]
