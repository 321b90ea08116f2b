"""The spool hold (queen_mp/front/spoolhold.py): accept times in spool records, the drain's
merge of the files by them, the flags board's push route, and the gate between appends and
the drain's closing pass."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queen_mp.front.spoolhold import SpoolHold
from queen_mp.ipc.flags import DIRECT, HOLD, PEERS_VALID_MS, SPOOL, FlagsBoard, monotonic_ms
from queen_mp.spool import SpoolItem, SpoolReader, SpoolWriter, spool_stats

pytestmark = pytest.mark.timeout(30)

TENANT = bytes(16)


def item(n: int, accepted_us: int = 0) -> SpoolItem:
    return SpoolItem(tenant=TENANT, queue="q", partition="p", message_id=n.to_bytes(16, "big"),
                     transaction_id=f"t-{n}", trace_id=None, payload=b"frame",
                     accepted_us=accepted_us)


@pytest.fixture
def board() -> Iterator[FlagsBoard]:
    name = f"/qmp-test-flags-{os.getpid()}-{time.monotonic_ns()}"
    b = FlagsBoard.create(name)
    yield b
    b.close()
    FlagsBoard.unlink(name)


def test_an_accept_time_travels_in_the_record_and_is_read_without_decoding() -> None:
    stamped = item(1, accepted_us=1_764_000_000_123_456)
    raw = stamped.encode()
    assert SpoolItem.decode(raw) == stamped
    assert SpoolItem.accepted_us_of(raw) == 1_764_000_000_123_456
    plain = item(2).encode()  # as an older build wrote it: no accept time
    assert SpoolItem.decode(plain).accepted_us == 0
    assert SpoolItem.accepted_us_of(plain) == 0
    assert SpoolItem.accepted_us_of(b"junk") == 0


def test_the_drain_reads_the_files_of_several_writers_in_accept_order(tmp_path: Path) -> None:
    # "w0" sorts first by name, but "w1" took the first item: replay follows accept time
    first, second = SpoolWriter(tmp_path, "w1", fsync=False), SpoolWriter(tmp_path, "w0",
                                                                         fsync=False)
    for n in range(6):
        writer = first if n % 2 == 0 else second
        writer.append([item(n, accepted_us=1000 + n).encode()])
    first.close()
    second.close()
    with SpoolReader(tmp_path, fsync=False) as reader:
        order = [SpoolItem.decode(raw).transaction_id for _, raw in reader.iter_pending()]
    assert order == [f"t-{n}" for n in range(6)]


def test_the_push_route_follows_maintenance_the_local_hold_and_the_peers(
        board: FlagsBoard) -> None:
    assert board.push_route() == DIRECT
    assert board.set_local_hold(5) is True        # a new hold: to be published
    assert board.set_local_hold(9) is False       # the same hold goes on
    assert board.local_oldest_us == 5
    assert board.push_route() == HOLD
    board.set_hold_blocked(True)                  # the drain cannot go on: spool at once
    assert board.push_route() == SPOOL
    assert board.set_local_hold(11) is False      # an append keeps it so
    assert board.push_route() == SPOOL
    board.set_hold_blocked(False)
    assert board.push_route() == HOLD
    board.publish(True, False, 1)
    assert board.push_route() == SPOOL            # maintenance first
    board.publish(False, False, 2)
    board.clear_local_hold()
    assert board.push_route() == DIRECT
    board.set_hold_blocked(True)                  # without a hold: nothing to block
    assert board.push_route() == DIRECT
    board.publish_peers(True, True, 7, monotonic_ms())
    assert board.push_route() == HOLD             # another instance holds records
    assert board.peers() == (True, True, 7)
    board.publish_peers(False, True, 0, monotonic_ms())
    assert board.push_route() == DIRECT           # peers, none holding, known just now
    board.publish_peers(False, True, 0, monotonic_ms() - PEERS_VALID_MS - 1)
    assert board.push_route() == HOLD             # what we know of the peers is too old
    board.publish_peers(False, False, 0, monotonic_ms() - PEERS_VALID_MS - 1)
    assert board.push_route() == DIRECT           # no peer at all: nothing to wait for


def test_an_append_waits_for_the_closing_pass_and_is_not_made_once_the_hold_ended(
        tmp_path: Path, board: FlagsBoard) -> None:
    writer = SpoolWriter(tmp_path, "w0", fsync=False)
    hold = SpoolHold(tmp_path, writer, board)

    async def append(n: int, held: bool) -> bool:
        return await hold.append([item(n)], held=held)

    assert asyncio.run(append(0, True)) is False   # route DIRECT: nothing written
    assert asyncio.run(append(1, False)) is True   # a failed bundle's items: always written
    assert board.local_hold()
    fd = hold.lock_closing()
    outcome: list[bool] = []
    blocked = threading.Thread(target=lambda: outcome.append(asyncio.run(append(2, True))))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive() and not outcome      # no append during the closing pass
    board.clear_local_hold()
    hold.unlock(fd)
    blocked.join(5)
    assert outcome == [False]                      # the hold ended: the push goes direct
    writer.close()
    with SpoolReader(tmp_path, fsync=False) as reader:
        records = [SpoolItem.decode(raw) for _, raw in reader.iter_pending()]
    assert [r.transaction_id for r in records] == ["t-1"]
    assert records[0].accepted_us > 0


def test_pushes_waiting_for_a_hold_go_on_when_it_ends_or_maintenance_begins(
        tmp_path: Path, board: FlagsBoard) -> None:
    hold = SpoolHold(tmp_path, SpoolWriter(tmp_path, "w0", fsync=False), board)
    board.set_local_hold(1)

    async def scenario() -> tuple[list[int], int]:
        waiting = [asyncio.create_task(hold.wait_hold()) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert not any(t.done() for t in waiting)  # the hold is on: they wait
        board.clear_local_hold()
        routes = list(await asyncio.gather(*waiting))
        board.set_local_hold(2)
        late = asyncio.create_task(hold.wait_hold())
        await asyncio.sleep(0.05)
        board.publish(True, False, 1)  # maintenance: to the spool at once
        return routes, await late

    routes, late = asyncio.run(scenario())
    assert routes == [DIRECT] * 3 and late == SPOOL


def test_a_drain_publishes_and_reads_the_oldest_record_per_bucket() -> None:
    from queen_mp.front.spooldrain import ORDER_BUCKETS, _Entry, _oldest_by_bucket, _peer_limits
    from queen_mp.spool import SpoolPosition

    def entry(stamp: int, bucket: int) -> _Entry:
        return _Entry(SpoolPosition("f", stamp, stamp + 1, stamp, False), b"", stamp=stamp,
                      bucket=bucket)

    mine = _oldest_by_bucket([entry(10, 3), entry(20, 5), entry(30, 3)])
    assert mine[3] == 10 and mine[5] == 20
    assert {mine[b] for b in range(ORDER_BUCKETS) if b not in (3, 5)} == {30}  # the floor
    view = {"holds": [{"instance": "me", "oldestUs": 1},
                      {"instance": "x", "oldestUs": 15},
                      {"instance": "y", "oldestUs": 12}],
            "buckets": {"x": [40] * 3 + [15] + [40] * (ORDER_BUCKETS - 4)}}
    limits = _peer_limits(view, "me")  # ours are left out; y has no buckets: 12 everywhere
    assert limits[3] == 12 and limits[0] == 12
    view["holds"] = view["holds"][:2]
    limits = _peer_limits(view, "me")
    assert limits[3] == 15 and limits[0] == 40
    assert set(_peer_limits({"holds": []}, "me")) == {1 << 62}  # nobody else: no limit


def test_without_the_hold_an_append_holds_nothing_and_only_maintenance_spools(
        board: FlagsBoard, tmp_path: Path) -> None:
    """``QUEEN_SPOOL_HOLD=false``: a buffered push sets no hold, so later pushes go straight
    to PostgreSQL, and another instance's hold or stale peers do not make them wait."""
    hold = SpoolHold(tmp_path, SpoolWriter(tmp_path, "w0", fsync=False), board,
                     keep_order=False)
    assert asyncio.run(hold.append([item(1)], held=False)) is True
    assert not board.local_hold() and hold.route() == DIRECT
    board.publish_peers(True, True, 7, monotonic_ms() - PEERS_VALID_MS - 1)
    assert board.push_route() == HOLD and hold.route() == DIRECT
    board.publish(True, False, 1)
    assert hold.route() == SPOOL
    assert spool_stats(tmp_path).pending == 1
