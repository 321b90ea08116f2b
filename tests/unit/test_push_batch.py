"""A regular body of one queue and one partition decodes to a ``PushBatch`` (columns, its
frames joined): the shard gets the records, the spool the items and the client the answer
that the same body's PushItems would give."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from queen_mp.front.ingest import Ingest, PushResults
from queen_mp.http.push import exact_json_push, render_items
from queen_mp.ipc.flags import DIRECT, SPOOL
from queen_mp.ipc.shardlink import ShardGone
from queen_mp.models import items as items_module
from queen_mp.models.items import PushBatch, PushItem, decode_push_items
from queen_mp.wire.records import PushVerdict, pack_queued_run

TENANT = bytes(range(16))


def ids(n: int) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in range(1, n + 1)]


def body(n: int, partition: object = "p-1") -> bytes:
    return orjson.dumps({"items": [
        {"queue": "orders", "partition": partition, "transactionId": f"t-{i}" if i % 3 else
         f"é\u2603-{i}", "payload": {"n": i, "s": "x y" * (i % 4)}} for i in range(n)]})


@pytest.mark.parametrize("partition", ["p-1", None, ""])
def test_a_regular_body_of_one_partition_is_a_batch_of_the_exact_items(
        partition: object) -> None:
    raw = body(items_module._COLUMNS_FROM + 5, partition)
    batch = decode_push_items(raw, None, ids)
    assert type(batch) is PushBatch
    exact = exact_json_push(raw, None, ids)
    assert list(batch) == exact and batch[3] == exact[3] and len(batch) == len(exact)
    assert batch.frames == b"".join(bytes(it.frame) for it in exact)
    assert batch.transaction_ids == [it.transaction_id for it in exact]


def test_what_a_batch_is_not_reads_item_by_item() -> None:
    """Two partitions, a repeated transactionId, a producerSub: PushItems, as before."""
    n = items_module._COLUMNS_FROM + 2
    two = orjson.loads(body(n))
    two["items"][5]["partition"] = "p-2"
    again = orjson.loads(body(n))
    again["items"][5]["transactionId"] = again["items"][4]["transactionId"]
    for raw, sub in ((orjson.dumps(two), None), (orjson.dumps(again), None), (body(n), "al")):
        typed = decode_push_items(raw, sub, ids)
        assert type(typed) is list
        assert typed == exact_json_push(raw, sub, ids)


class _Link:
    generation, slot = 1, 0

    def __init__(self, outcome: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.outcome = outcome
        self.records: list[bytes] = []

    def next_request_id(self) -> int:
        return 7

    def submit(self, shard: int, request_id: int, group_index: int, record: bytes,
               deadline: float) -> asyncio.Future[PushVerdict]:
        self.records.append(record)
        future: asyncio.Future[PushVerdict] = self.loop.create_future()
        if isinstance(self.outcome, BaseException):
            future.set_exception(self.outcome)
        else:
            future.set_result(self.outcome)
        return future


class _Hold:
    def __init__(self, route: int) -> None:
        self._route = route
        self.spooled: list[tuple[str, bytes]] = []

    def route(self) -> int:
        return self._route

    async def append(self, records: list[Any], *, held: bool) -> bool:
        self.spooled.extend((r.transaction_id, r.payload) for r in records)
        return True


class _Flags:
    def __init__(self, encrypted: bool) -> None:
        self.secret = encrypted

    def known_encrypted(self, tenant: bytes, queue: str) -> bool:
        return self.secret

    async def encrypted(self, tenant: bytes, queue: str) -> bool:
        return self.secret


class _Cipher:
    def encrypt(self, data: bytes) -> bytes:
        return b"sealed:" + data


def _push(items: Any, outcome: Any, route: int, encrypted: bool
          ) -> tuple[PushResults, list[bytes], list[tuple[str, bytes]], bytes]:
    link, hold = _Link(outcome), _Hold(route)
    ingest = Ingest(link, 1, hold, 5000, _Flags(encrypted), _Cipher())  # type: ignore[arg-type]
    results = link.loop.run_until_complete(ingest.push(items, TENANT))
    link.loop.close()
    return results, link.records, hold.spooled, render_items(items, results.each, results.runs)


@pytest.mark.parametrize(("outcome", "route", "encrypted"), [
    ("queued", DIRECT, False), ("queued", DIRECT, True), ("queued", SPOOL, False),
    (ShardGone("restarted"), DIRECT, False)])
def test_a_batch_is_pushed_and_answered_as_its_items(monkeypatch: pytest.MonkeyPatch,
                                                     outcome: Any, route: int,
                                                     encrypted: bool) -> None:
    from queen_mp.front import ingest as ingest_module
    monkeypatch.setattr(ingest_module.time, "time", lambda: 1_764_000_000.5)
    raw = body(items_module._COLUMNS_FROM + 6)
    n = items_module._COLUMNS_FROM + 6
    if outcome == "queued":
        outcome = PushVerdict.unpack(pack_queued_run(1, 0, 7, 0, 11, 1_764_000_000_000_000,
                                                     41, n))
    batch = decode_push_items(raw, None, ids)
    assert type(batch) is PushBatch
    items: list[PushItem] = exact_json_push(raw, None, ids)
    got = _push(batch, outcome, route, encrypted)
    want = _push(items, outcome, route, encrypted)
    assert got == want
    assert bool(got[1]) == (route == DIRECT)
    if encrypted:
        assert b"sealed:" in got[1][0]
