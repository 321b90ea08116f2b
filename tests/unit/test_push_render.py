"""The byte-formatted push answer says exactly what the dict renderer says; the body is
not kept while the answer is awaited."""

from __future__ import annotations

import asyncio
import gc
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import orjson

from queen_mp.front.ingest import ItemResult, PushResults, QueuedRun, group_items
from queen_mp.http.hot import HotCall, HotRoutes
from queen_mp.http.push import (
    PUSH_PATH,
    PushResource,
    parse_json_push,
    render_item,
    render_items,
)
from queen_mp.models.items import PushBatch, PushItem

MID = bytes(range(16))


def item(txn: str, trace: bytes | None = None, queue: str = "orders",
         partition: str = "p-1") -> PushItem:
    return PushItem(queue, partition, txn, MID, b"", trace)


def test_same_objects_as_the_dict_renderer() -> None:
    items = [item("a"), item('we"ird\\ \u00e9 \n txn'), item("t", trace=bytes(16)),
             item("e"), item("d", queue="q.ns/task", partition="Default"), item("n")]
    results = [ItemResult("queued", MID, 7, 41, 1_764_400_000_123_456),
               ItemResult("queued", MID, 7, 42, 1_764_400_000_123_456),
               ItemResult("queued", MID, 7, 43, 1_764_400_000_123_456),
               ItemResult("failed", MID, 0, None, 0, 'boom "quoted"'),
               ItemResult("duplicate", MID, 9, 3, 1_764_400_000_000_000),
               ItemResult("buffered", MID)]
    rendered = render_items(items, results)
    got = orjson.loads(rendered)
    want = [render_item(i, it, r) for i, (it, r) in enumerate(zip(items, results, strict=True))]
    assert got == want
    assert [list(o) for o in got] == [list(o) for o in want]  # same key order
    assert rendered == orjson.dumps(want)  # and the same bytes, from a template or a dict


def test_empty() -> None:
    assert render_items([], []) == b"[]"


def test_long_integers_take_the_exact_path() -> None:
    from queen_mp.models.items import loads_json

    big = 123456789012345678901234567890
    assert loads_json(b'{"a":%d}' % big) == {"a": big}  # orjson alone would give a float
    assert loads_json(b'{"a":1234567890123456789}') == {"a": 1234567890123456789}
    assert loads_json(b'{"a":"x123456789012345678y","b":12}') == {
        "a": "x123456789012345678y", "b": 12}


def _holders_while_awaiting(responder: Callable[[PushResource, AsyncIterator[bytes]],
                                               Awaitable[object]]) -> list[str]:
    """The coroutines of a push that refer to its body while its verdicts are awaited, with
    ``responder`` serving it (the answer is checked too)."""
    body = orjson.dumps({"items": [{"queue": "q", "payload": {"n": i}} for i in range(3)]})

    class Ingest:
        entered: asyncio.Event
        verdicts: asyncio.Future[None]

        async def push(self, items: list[PushItem], tenant: bytes, chunks: object
                       ) -> PushResults:
            self.entered.set()
            await self.verdicts
            return PushResults([ItemResult("queued", it.message_id, 1, i, 1)
                                for i, it in enumerate(items)])

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    ingest = Ingest()
    worker = SimpleNamespace(config=SimpleNamespace(max_body_mb=1), ingest=ingest,
                             count_pushed=lambda results: None)

    async def scenario() -> tuple[list[str], object]:
        ingest.entered, ingest.verdicts = asyncio.Event(), asyncio.Future()
        task = asyncio.create_task(responder(PushResource(worker), chunks()))  # type: ignore
        await ingest.entered.wait()
        holders = [r.cr_code.co_name for r in gc.get_referrers(body) if inspect.iscoroutine(r)]
        ingest.verdicts.set_result(None)
        return holders, await task

    holders, data = asyncio.run(scenario())
    assert [r["offset"] for r in orjson.loads(data)] == [0, 1, 2]  # type: ignore[arg-type]
    return holders


def test_the_body_is_not_held_while_verdicts_are_awaited() -> None:
    """Once parsed, a JSON push body is referred to by nothing of the request (NOTE(memory) in
    http/push.py and http/hot.py): its bytes are not kept for as long as the verdicts take,
    whether falcon's responder or the hot route serves it."""

    async def falcon_responder(push: PushResource, stream: AsyncIterator[bytes]) -> object:
        req = SimpleNamespace(content_length=None, stream=stream, context=SimpleNamespace(),
                              get_header=lambda name: None)
        resp = SimpleNamespace(status=None, data=None, content_type=None)
        await push.on_post(req, resp)  # type: ignore[arg-type]
        return resp.data

    async def hot_responder(push: PushResource, stream: AsyncIterator[bytes]) -> object:
        hot = HotRoutes.__new__(HotRoutes)
        hot.push = push
        call = HotCall("POST", PUSH_PATH, "", PUSH_PATH, {}, None, None, None)
        return (await hot._answer(call, stream, bytes(16), None, None)).data

    assert _holders_while_awaiting(falcon_responder) == []
    assert _holders_while_awaiting(hot_responder) == []


def _expanded(items: list[PushItem], results: PushResults) -> list[ItemResult]:
    """``results`` with a result per item of each run, as the per-item path makes them."""
    each = list(results.each)
    for run in results.runs:
        for k, i in enumerate(run.idx):
            each[i] = ItemResult("queued", items[i].message_id, run.partition_id,
                                 run.first + k, run.created_us)
    assert None not in each
    return each  # type: ignore[return-value]


def test_a_queued_run_renders_as_its_items_results_would() -> None:
    """A run is rendered at once (one template, C loops) into the same bytes as a result per
    item; so are runs interleaved with other results, a run holding a traced item and a
    run of one item."""
    ids = [bytes([i]) * 16 for i in range(9)]

    def it(i: int, txn: str, partition: str = "p-1", trace: bytes | None = None) -> PushItem:
        return PushItem("orders", partition, txn, ids[i], b"", trace)

    whole = [it(i, f"t-{i}" if i != 2 else 'we"ird\\ \u00e9') for i in range(5)]
    cases = [
        (whole, PushResults([None] * 5, (QueuedRun(list(range(5)), 7, 1_764_400_000_123_456,
                                                   41),))),
        ([it(0, "a"), it(1, "b", "p-2"), it(2, "c"), it(3, "d", "p-2"), it(4, "e", "p-3"),
          it(5, "f", "p-4", bytes(16)), it(6, "g", "p-4"), it(7, "h", "p-5")],
         PushResults([None, None, None, None, ItemResult("failed", ids[4], error="x"),
                      None, None, ItemResult("buffered", ids[7])],
                     (QueuedRun([0, 2], 7, 1_764_400_000_000_001, 1),
                      QueuedRun([1, 3], 8, 1_764_400_000_000_002, 2**40),
                      QueuedRun([5, 6], 9, 1_764_400_000_000_003, 0)))),
        ([it(0, "solo")], PushResults([None], (QueuedRun([0], 3, 1, 5),))),
    ]
    for items, results in cases:
        want = render_items(items, _expanded(items, results))
        assert render_items(items, results.each, results.runs) == want
        assert orjson.loads(want) == [render_item(i, x, r) for i, (x, r) in enumerate(
            zip(items, _expanded(items, results), strict=True))]


def test_group_items_by_set_sizes_as_by_the_loop() -> None:
    """One partition and distinct transactionIds are told apart without the loop: the same
    groups as the loop, and followers only where a transactionId repeats."""

    def it(queue: str, partition: str, txn: str) -> PushItem:
        return PushItem(queue, partition, txn, MID, b"")

    assert group_items([]) == ({}, None)
    assert group_items([it("q", "p", "a")]) == ({("q", "p"): [0]}, None)
    assert group_items([it("q", "p", "a"), it("q", "p", "b"), it("q", "p", "c")]) == (
        {("q", "p"): [0, 1, 2]}, None)
    assert group_items([it("q", "p", "a"), it("q", "p2", "a"), it("q2", "p", "a")]) == (
        {("q", "p"): [0], ("q", "p2"): [1], ("q2", "p"): [2]}, None)
    assert group_items([it("q", "p", "a"), it("q", "p", "b"), it("q", "p", "a")]) == (
        {("q", "p"): [0, 1]}, [0, 1, 0])


def test_a_runs_transaction_ids_are_json_strings_as_orjson_writes_them() -> None:
    """Plain texts are quoted as they are, anything JSON escapes (or that may be) goes
    through orjson: the answer is the per-item renderer's, byte for byte."""
    odd = ['a"b', "a\\b", "a\nb", "\x00", "\x1f", "\x7f", "\u2028", "\ud7ff", "é", "💡",
           "%s%d", '","', "", " ", "\u00a0", "a/b", "<>&'"]
    for txn in odd:
        for texts in ([txn, "t-1"], ["t-1", txn, "t-2"], [txn, txn]):
            items = [PushItem("orders", "p-1", t, bytes([i]) * 16, b"")
                     for i, t in enumerate(texts)]
            results = PushResults([None] * len(items), (QueuedRun(
                list(range(len(items))), 7, 1_764_400_000_123_456, 41),))
            want = render_items(items, _expanded(items, results))
            assert render_items(items, results.each, results.runs) == want, texts
            assert orjson.loads(want)[0]["transactionId"] == texts[0]


def test_a_batchs_transaction_ids_from_the_body_are_json_strings_as_orjson_writes_them(
        ) -> None:
    """A body read by columns (a PushBatch) lends the answer its transactionIds' UTF-8 when
    it held no backslash; escaped ones are quoted by orjson: the same bytes either way."""
    odd = ["\x7f", "\u2028", "\ud7ff", "é", "💡", "%s%d", " ", "\u00a0", "<>&'", 'a"b',
           "a\\b", "a\nb"]  # (a control character orjson writes as \u: the exact path's)
    for txn in odd:
        texts = [f"t-{i}" for i in range(30)]
        texts[3] = txn
        body = orjson.dumps({"items": [{"queue": "orders", "partition": "p-1",
                                        "transactionId": t, "payload": {"n": i}}
                                       for i, t in enumerate(texts)]})
        batch = parse_json_push(body)
        assert type(batch) is PushBatch
        assert (batch.plain_ids is None) == (b"\\" in body)
        results = PushResults([None] * len(texts), (QueuedRun(
            list(range(len(texts))), 7, 1_764_400_000_123_456, 41),))
        items = list(batch)
        want = render_items(items, _expanded(items, results))
        assert render_items(batch, results.each, results.runs) == want, txn
        assert orjson.loads(want)[3]["transactionId"] == txn


def test_a_one_item_answer_is_the_dict_renderers() -> None:
    """A 1-item answer has its own short path (``_one_row``); every result renders as the
    dict renderer words it, errors and trace ids by the general path."""
    cases = [(item("a"), ItemResult("queued", MID, 7, 41, 1_764_400_000_123_456)),
             (item('we"ird\\ \u00e9 \n txn'), ItemResult("queued", MID, 7, 0, 1)),
             (item("d", queue="q.ns/task", partition="Default"),
              ItemResult("duplicate", bytes(16), 9, None, 1_764_400_000_000_000)),
             (item("b"), ItemResult("buffered", MID)),
             (item("e"), ItemResult("failed", MID, 0, None, 0, "spool_write_failed")),
             (item("t", trace=bytes(range(16, 32))), ItemResult("queued", MID, 7, 5, 1)),
             (item("100%s %d"), ItemResult("queued", MID, 7, 5, 1))]
    for it, r in cases:
        assert render_items([it], [r]) == orjson.dumps([render_item(0, it, r)])


def test_a_runs_indexes_and_offsets_across_thousands() -> None:
    """A run's indexes and offsets, cut from tables of decimals by thousands, are the
    per-item renderer's at every edge: a thousand crossed, an offset of zero, an index past
    the table, runs of scattered indexes."""
    def items_of(n: int) -> list[PushItem]:
        return [PushItem("orders", f"p-{i % 2}" if n > 1010 else "p-1", f"t-{i}",
                         i.to_bytes(16, "big"), b"") for i in range(n)]

    cases = []
    for first in (0, 1, 998, 999, 1000, 1999, 999_999_998, 2**40 - 3):
        for n in (2, 3, 5):
            cases.append((items_of(n), PushResults([None] * n, (QueuedRun(
                list(range(n)), 7, 1_764_400_000_123_456, first),))))
    cases.append((items_of(1003), PushResults([None] * 1003, (QueuedRun(
        list(range(1003)), 7, 1_764_400_000_123_456, 997),))))
    many = items_of(2030)
    cases.append((many, PushResults([None] * 2030, (
        QueuedRun(list(range(0, 2030, 2)), 7, 1_764_400_000_123_456, 5),
        QueuedRun(list(range(1, 2030, 2)), 8, 1_764_400_000_123_457, 1990)))))
    cases.append((items_of(8), PushResults([None] * 8, (
        QueuedRun([0, 3, 7], 7, 1_764_400_000_123_456, 999),
        QueuedRun([1, 2, 4, 5, 6], 8, 1_764_400_000_123_456, 10)))))
    for items, results in cases:
        want = render_items(items, _expanded(items, results))
        assert render_items(items, results.each, results.runs) == want
