"""A 1-item push takes ``Ingest._push_one``: the record it sends, the results it answers and
the errors it raises are those of the general path, which a 2-item body of two partitions (a
group of one item each) still takes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from queen_mp.front import ingest as ingest_module
from queen_mp.front.ingest import Ingest, PushResults
from queen_mp.ipc.flags import DIRECT, SPOOL
from queen_mp.ipc.shardlink import ShardGone
from queen_mp.models.items import PushItem, json_item
from queen_mp.spool import SpoolWriteError
from queen_mp.wire.hashing import txn_hashes
from queen_mp.wire.records import (
    ITEM_DUPLICATE,
    VERDICT_ERROR,
    VERDICT_OK,
    ItemVerdict,
    PushGroup,
    PushVerdict,
    pack_queued_run,
)

TENANT = bytes(range(16))
ORIGINAL = bytes(range(16, 32))


def _items(n: int) -> list[PushItem]:
    return [
        json_item("orders", f"p-{i}", f"t-{i}", b'{"n":%d}' % i, None, bytes([i + 1]) * 16)
        for i in range(n)
    ]


def _queued(group_index: int) -> PushVerdict:
    return PushVerdict.unpack(
        pack_queued_run(1, 0, 7, group_index, 11, 1_764_000_000_000_000, 41, 1)
    )


def _duplicate(offset: int) -> Callable[[int], PushVerdict]:
    def verdict(group_index: int) -> PushVerdict:
        return PushVerdict.unpack(
            PushVerdict(
                1,
                0,
                7,
                group_index,
                VERDICT_OK,
                11,
                1_764_000_000_000_000,
                items=(ItemVerdict(ITEM_DUPLICATE, offset, ORIGINAL),),
            ).pack()
        )

    return verdict


def _failed(group_index: int) -> PushVerdict:
    return PushVerdict(1, 0, 7, group_index, VERDICT_ERROR, error="bundle failed")


class _Link:
    """Answers each record with ``outcome(group_index)`` (a verdict, or an exception to
    raise), and keeps the records it was given."""

    generation, slot = 1, 0

    def __init__(self, outcome: Callable[[int], Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.outcome = outcome
        self.records: list[bytes] = []

    def next_request_id(self) -> int:
        return 7

    def submit(
        self, shard: int, request_id: int, group_index: int, record: bytes, deadline: float
    ) -> asyncio.Future[PushVerdict]:
        self.records.append(record)
        future: asyncio.Future[PushVerdict] = self.loop.create_future()
        outcome = self.outcome(group_index)
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        return future


class _Hold:
    def __init__(self, route: int, spool_error: bool) -> None:
        self._route = route
        self.spool_error = spool_error
        self.spooled: list[str] = []

    def route(self) -> int:
        return self._route

    async def append(self, records: list[Any], *, held: bool) -> bool:
        if self.spool_error:
            raise SpoolWriteError("disk full")
        self.spooled.extend(r.transaction_id for r in records)
        return True


def _push(
    n: int, outcome: Callable[[int], Any], route: int = DIRECT, spool_error: bool = False
) -> tuple[PushResults | BaseException, _Link, _Hold]:
    link, hold = _Link(outcome), _Hold(route, spool_error)
    ingest = Ingest(
        link,
        1,
        hold,
        5000,  # type: ignore[arg-type]
        SimpleNamespace(known_encrypted=lambda t, q: False),  # type: ignore[arg-type]
        None,
    )
    try:
        got: PushResults | BaseException = link.loop.run_until_complete(
            ingest.push(_items(n), TENANT)
        )
    except Exception as ex:
        got = ex
    link.loop.close()
    return got, link, hold


@pytest.mark.parametrize(
    ("outcome", "route", "spool_error"),
    [
        (_queued, DIRECT, False),
        (_duplicate(3), DIRECT, False),
        (_duplicate(-1), DIRECT, False),  # retention removed the original
        (_failed, DIRECT, False),
        (lambda gi: ShardGone("restarted"), DIRECT, False),
        (lambda gi: RuntimeError("bug"), DIRECT, False),
        (lambda gi: ShardGone("restarted"), DIRECT, True),
        (_queued, SPOOL, False),
        (_queued, SPOOL, True),
    ],
)
def test_one_item_as_the_general_path(
    monkeypatch: pytest.MonkeyPatch, outcome: Callable[[int], Any], route: int, spool_error: bool
) -> None:
    monkeypatch.setattr(ingest_module.time, "time", lambda: 1_764_000_000.5)
    one, one_link, one_hold = _push(1, outcome, route, spool_error)
    two, two_link, two_hold = _push(2, outcome, route, spool_error)
    assert isinstance(one, PushResults) and isinstance(two, PushResults)
    assert one.runs == two.runs == ()
    assert one.each == two.each[:1]
    assert one.counts() == {k: v // 2 for k, v in two.counts().items()}
    assert one_link.records == two_link.records[:1]  # the same record, byte for byte
    assert one_hold.spooled == two_hold.spooled[:1]


def test_one_item_past_its_deadline_raises_as_the_general_path() -> None:
    one, _, _ = _push(1, lambda gi: TimeoutError("no verdict"))
    two, _, _ = _push(2, lambda gi: TimeoutError("no verdict"))
    assert isinstance(one, TimeoutError) and isinstance(two, TimeoutError)
    assert str(one) == str(two) == "no verdict"


@pytest.mark.parametrize("n", [1, 3])
def test_the_records_hashes_are_the_transaction_ids_utf8_hashes(n: int) -> None:
    """The hashes are taken from each transactionId str itself (not its encoded bytes): they
    must be ``txn_hash``'s, of the UTF-8, for ASCII and other text alike."""
    texts = ["t-0", "é\u2603💡", "\x00" + "x" * 1000][:n]
    items = [json_item("orders", "p", t, b"1", None, bytes([i + 1]) * 16)
             for i, t in enumerate(texts)]
    link = _Link(lambda gi: PushVerdict.unpack(
        pack_queued_run(1, 0, 7, gi, 11, 1_764_000_000_000_000, 41, n)))
    ingest = Ingest(link, 1, _Hold(DIRECT, False), 5000,  # type: ignore[arg-type]
                    SimpleNamespace(known_encrypted=lambda t, q: False),  # type: ignore[arg-type]
                    None)
    link.loop.run_until_complete(ingest.push(items, TENANT))
    link.loop.close()
    (record,) = link.records
    assert PushGroup.unpack(record).hashes == b"".join(txn_hashes(texts))
