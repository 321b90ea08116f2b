"""A QPB1 frames body read by columns (``binary_push.frame_columns``; one group of distinct
transactionIds: a ``PushBatch`` carrying the client's zstd frame) is answered, sent to the
shard, spooled and counted exactly as the same body read frame by frame."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace
from typing import Any

import pytest

from queen_mp.front import ingest as ingest_module
from queen_mp.front.ingest import Ingest
from queen_mp.http.push import PushResource, parse_binary
from queen_mp.ipc.flags import DIRECT, SPOOL
from queen_mp.ipc.shardlink import ShardGone
from queen_mp.models.items import PushBatch
from queen_mp.wire import binary_push
from queen_mp.wire.errors import WireError
from queen_mp.wire.frames import pack_frame, zstd_compress
from queen_mp.wire.records import ItemVerdict, PushVerdict, pack_queued_run, unpack_record
from tests.unit.test_push_batch import _Cipher, _Flags, _Hold
from tests.unit.test_push_batch import _Link as _BatchLink

TENANT = bytes(range(16))
TRACE = bytes(range(100, 116))


def mid(i: int) -> bytes:
    """A UUIDv7 (version 7, variant 0b10), the i-th."""
    return bytes.fromhex("0196f3a2c000") + b"\x70\x00\x80" + i.to_bytes(7, "big")


def frame(i: int, txn: str, payload: bytes = b'{"n":1,"s":"x y"}',
          trace: bytes | None = None) -> bytes:
    return pack_frame(mid(i), txn.encode(), payload, trace_id=trace)


def group(queue: str, partition: str, frames: list[bytes]) -> bytes:
    z = zstd_compress(b"".join(frames))
    q, p = queue.encode(), partition.encode()
    return (struct.pack("<H", len(q)) + q + struct.pack("<H", len(p)) + p
            + struct.pack("<II", len(frames), len(z)) + z)


def body(*groups: bytes, counts: bool = False) -> bytes:
    return b"QPB1" + bytes([8 | (2 if counts else 0)]) + struct.pack("<I", len(groups)) \
        + b"".join(groups)


ODD_TXNS = ['q"uote', "back\\slash", "é\u2603", "ctl\x01", "nul\x00", "del\x7f", "\u2028"]
BODIES = {
    "one group": body(group("orders", "p-1", [frame(i, f"t-{i}") for i in range(30)])),
    "one group, txns JSON escapes": body(group("orders", "p-1", [
        frame(i, t) for i, t in enumerate(ODD_TXNS)])),
    "one group, non-ASCII txns": body(group("orders", "p-1", [
        frame(i, f"é-{i}") for i in range(5)])),
    "one group, null payloads": body(group("orders", "", [
        frame(i, f"t-{i}", b"" if i % 2 else b"[1]") for i in range(6)])),
    "a follower": body(group("orders", "p-1", [
        frame(i, f"t-{i % 4}") for i in range(9)])),
    "several groups": body(group("orders", "p-1", [frame(i, f"a-{i}") for i in range(8)]),
                           group("orders", "p-2", [frame(10 + i, f"b-{i}") for i in range(3)]),
                           group("other", "p-1", [frame(20, "c-0")]),
                           group("orders", "p-1", [frame(30 + i, f"d-{i}") for i in range(4)])),
    "a follower across groups": body(
        group("orders", "p-1", [frame(i, f"a-{i}") for i in range(5)]),
        group("orders", "p-1", [frame(10 + i, f"a-{i + 3}") for i in range(4)])),
    "a trace id": body(
        group("orders", "p-1", [frame(i, f"a-{i}", trace=TRACE if i == 2 else None)
                                for i in range(5)]),
        group("orders", "p-2", [frame(10 + i, f"b-{i}") for i in range(5)])),
    "counts only": body(group("orders", "p-1", [frame(i, f"t-{i}") for i in range(12)]),
                        counts=True),
}


class _Link(_BatchLink):
    """Answers each group at once, all queued (``mode`` "queued"), every other frame a
    duplicate ("duplicates"), or fails it (an exception)."""

    def __init__(self, mode: Any) -> None:
        super().__init__(mode)
        self.mode = mode

    def submit(self, shard: int, request_id: int, group_index: int, record: bytes,
               deadline: float) -> asyncio.Future[PushVerdict]:
        count = unpack_record(record).count  # type: ignore[union-attr]
        if self.mode == "queued":
            self.outcome = PushVerdict.unpack(pack_queued_run(
                1, 0, request_id, group_index, 7 + group_index, 1_764_000_000_000_000,
                41 + 100 * group_index, count))
        elif self.mode == "duplicates":
            items = tuple(ItemVerdict(k % 2, 60 + k, mid(900 + k) if k % 2 else b"")
                          for k in range(count))
            self.outcome = PushVerdict.unpack(PushVerdict(
                1, 0, request_id, group_index, 0, 9, 1_764_000_000_000_001,
                items=items).pack())
        return super().submit(shard, request_id, group_index, record, deadline)


def _answer(raw: bytes, sub: str | None, mode: Any, route: int, encrypted: bool
            ) -> tuple[Any, ...]:
    """Everything a push of ``raw`` shows: its answer, the shard's records, the spool's
    items and the counted results."""
    link, hold, counted = _Link(mode), _Hold(route), []
    ingest = Ingest(link, 1, hold, 5000, _Flags(encrypted), _Cipher())  # type: ignore[arg-type]
    worker = SimpleNamespace(
        config=SimpleNamespace(max_decompressed_mb=64), ingest=ingest,
        count_pushed=lambda results: counted.append(
            (results.counts(), [None if r is None else r.status for r in results.each])))
    answer = link.loop.run_until_complete(
        PushResource(worker).answer(raw, TENANT, sub, None))  # type: ignore[arg-type]
    link.loop.close()
    return answer.status, answer.data, answer.media, link.records, hold.spooled, counted


CASES = [("queued", DIRECT, False), ("duplicates", DIRECT, False), ("queued", DIRECT, True),
         ("queued", SPOOL, False), (ShardGone("restarted"), DIRECT, False)]


@pytest.mark.parametrize("name", list(BODIES))
@pytest.mark.parametrize("sub", [None, "alice"])
@pytest.mark.parametrize(("mode", "route", "encrypted"), CASES)
def test_columns_answer_as_frames_do(monkeypatch: pytest.MonkeyPatch, name: str,
                                     sub: str | None, mode: Any, route: int,
                                     encrypted: bool) -> None:
    monkeypatch.setattr(ingest_module.time, "time", lambda: 1_764_000_000.5)
    raw = BODIES[name]
    got = _answer(raw, sub, mode, route, encrypted)
    with monkeypatch.context() as frames_only:
        frames_only.setattr(binary_push, "frame_columns", lambda raw, count: None)
        want = _answer(raw, sub, mode, route, encrypted)
    assert got == want
    assert got[0] == 201


def test_one_group_of_distinct_txns_is_a_batch_with_the_clients_chunk() -> None:
    items, chunks, _ = parse_binary(BODIES["one group"], 1 << 20)
    assert type(items) is PushBatch and chunks == []
    assert items.chunk is not None and bytes(items.chunk) in BODIES["one group"]
    assert items.plain_ids == [f"t-{i}".encode() for i in range(30)]
    escaped, _, _ = parse_binary(BODIES["one group, txns JSON escapes"], 1 << 20)
    assert type(escaped) is PushBatch and escaped.plain_ids is None
    assert escaped.transaction_ids == ODD_TXNS
    for name in ("a follower", "several groups", "a trace id"):
        assert type(parse_binary(BODIES[name], 1 << 20)[0]) is list, name
    assert type(parse_binary(BODIES["one group"], 1 << 20, "alice")[0]) is list


def _bad_bodies() -> dict[str, bytes]:
    good = [frame(i, f"t-{i}") for i in range(4)]
    v4 = bytearray(good[2])
    v4[4 + 1 + 6] = 0x40  # its id's version 4
    stamped = pack_frame(mid(1), b"t-1", b"1", producer_sub="mallory")  # a client's flag 2
    return {
        "bad payload": body(group("q", "p", [*good[:3], frame(3, "t-3", b"{nope")])),
        "not a UUIDv7": body(group("q", "p", [*good[:2], bytes(v4), good[3]])),
        "client flags": body(group("q", "p", [good[0], stamped, *good[2:]])),
        "one frame too many": body(group("q", "p", good)).replace(
            struct.pack("<I", 4), struct.pack("<I", 3), 1),
        "one frame too few": body(group("q", "p", good)).replace(
            struct.pack("<I", 4), struct.pack("<I", 5), 1),
        "trailing bytes": body(group("q", "p", [*good[:3], good[3] + b"\x00" * 30])),
        "second group bad": body(group("q", "p", good),
                                 group("q", "r", [*good[:3], frame(9, "t-9", b"nope")])),
    }


@pytest.mark.parametrize("name", list(_bad_bodies()))
def test_a_bad_body_is_refused_as_frame_by_frame(name: str) -> None:
    raw = _bad_bodies()[name]
    with pytest.raises(WireError) as columns:
        binary_push.parse_binary_push(raw, columns=True)
    with pytest.raises(WireError) as frames:
        binary_push.parse_binary_push(raw)
    assert columns.value.to_dict() == frames.value.to_dict()
    assert (columns.value.offset, columns.value.index) == (frames.value.offset,
                                                             frames.value.index)
