"""The byte-formatted push answer says exactly what the dict renderer says."""

from __future__ import annotations

import orjson

from queen_mp.front.ingest import ItemResult
from queen_mp.http.push import render_item, render_items
from queen_mp.models.items import PushItem

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
