"""The typed push decoder (``decode_push_items``) reads a body as the exact path does, or
leaves it to that path: never an item the exact path would refuse or read otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queen_mp.http.errors import ApiError
from queen_mp.http.push import exact_json_push
from queen_mp.models import items as items_module
from queen_mp.models.errors import RequestError
from queen_mp.models.items import PushItem, decode_push_items
from queen_mp.wire.errors import WireError
from queen_mp.wire.frames import iter_frames


def ids(n: int) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in range(1, n + 1)]


def frame_fields(it: PushItem, canonical: bool = False) -> tuple[object, ...]:
    """The frame's fields; ``canonical``: the payload as the exact path writes it (orjson's
    spelling of its numbers), after checking that it is compact JSON text."""
    f = next(iter_frames(it.frame))
    payload = bytes(f.payload)
    if canonical and payload:
        assert msgspec.json.format(payload, indent=-1) == payload
        payload = orjson.dumps(orjson.loads(payload))
    return (f.message_id, f.trace_id, f.transaction_id, f.producer_sub, f.flags, payload)


def item_fields(it: PushItem, canonical: bool = False) -> tuple[object, ...]:
    return (it.queue, it.partition, it.transaction_id, it.message_id, it.trace_id, it.chunk,
            it.producer_sub, frame_fields(it, canonical))


def same_reading(body: bytes, sub: str | None = None) -> list[PushItem] | None:
    """The typed items of ``body`` (None: left to the exact path), checked against it."""
    typed = decode_push_items(body, sub, ids)
    try:
        exact = exact_json_push(body, sub, ids)
    except (ApiError, RequestError, WireError):
        assert typed is None, "the typed path took a body the exact path refuses"
        return None
    if typed is not None:
        assert [item_fields(i, True) for i in typed] == [item_fields(i) for i in exact]
    return typed


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=12)
NAME = st.one_of(st.sampled_from(["orders", "q.ns/task", "", "p-1", "a" * 300, "é", "x\x01"]),
                 st.text(max_size=8), st.integers(), st.none())
TRACE = st.one_of(st.none(), st.just(str(uuid.UUID(int=7))), st.text(max_size=40),
                  st.integers())
GOOD_NAME = st.sampled_from(["orders", "q.ns", "é", "Default"])
GOOD_ITEM = st.fixed_dictionaries({"queue": GOOD_NAME}, optional={
    "partition": st.one_of(GOOD_NAME, st.just(""), st.none()),
    "transactionId": st.one_of(st.text(max_size=8), st.none()),
    "traceId": st.one_of(st.none(), st.just(str(uuid.UUID(int=7)))),
    "payload": JSON, "data": JSON, "producerSub": st.text(max_size=4)})
ANY_ITEM = st.fixed_dictionaries({}, optional={
    "queue": NAME, "partition": NAME, "transactionId": st.one_of(NAME, st.just("t" * 1100)),
    "traceId": TRACE, "payload": JSON, "data": JSON, "producerSub": st.text(max_size=4)})
# bodies of valid items (most take the typed path) and bodies that mix in anything
ITEMS = st.one_of(st.lists(GOOD_ITEM, max_size=6),
                  st.lists(st.one_of(GOOD_ITEM, ANY_ITEM), max_size=6))


def dump(doc: object, style: int) -> bytes:
    """Three spellings of one document: orjson's, Python's default, Python's UTF-8 one."""
    if style == 0:
        try:
            return orjson.dumps(doc)
        except TypeError:  # an integer beyond 64 bits
            return json.dumps(doc, separators=(",", ":")).encode()
    return json.dumps(doc, ensure_ascii=style == 1).encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(items=ITEMS, style=st.integers(0, 2),
       sub=st.one_of(st.none(), st.just("alice")))
def test_generated_bodies_are_read_alike(items: list[dict[str, object]], style: int,
                                         sub: str | None) -> None:
    same_reading(dump({"items": items}, style), sub)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.binary(max_size=80), at=st.integers(0, 200))
def test_hostile_bytes_inside_a_valid_body_are_read_alike(body: bytes, at: int) -> None:
    base = orjson.dumps({"items": [{"queue": "orders", "payload": {"a": [1, 2.5, "x"]}}]})
    at = min(at, len(base))
    same_reading(base[:at] + body + base[at:])


def test_common_bodies_take_the_typed_path() -> None:
    doc = {"items": [{"queue": "orders", "partition": "p-1", "transactionId": "t-1",
                      "payload": {"producer": "p", "seq": 12, "x": [1.5, None, True]}},
                     {"queue": "orders", "data": "text"},
                     {"queue": "orders", "traceId": str(uuid.UUID(int=9)), "payload": None},
                     {"queue": "orders", "partition": "", "payload": "é \u2603"}]}
    for style in (0, 1, 2):
        typed = same_reading(dump(doc, style), "alice")
        assert (typed is not None) == (style != 1), style  # Python's default writes \\u00e9
        if typed is None:
            continue
        assert [i.partition for i in typed] == ["p-1", "Default", "Default", "Default"]
        assert typed[0].queue is typed[1].queue  # one str per distinct name


def test_a_body_of_mixed_items_is_read_alike_item_by_item() -> None:
    # the typed path reads by columns: an item unlike its neighbours (traced, without a
    # transactionId, its payload as data, null or absent, another queue or partition) keeps
    # its own fields wherever it stands, in a body big enough for the bulk number scan
    shapes = [{"queue": "orders", "partition": "p-1", "transactionId": "t", "payload": {"n": 1}},
              {"queue": "orders", "traceId": str(uuid.UUID(int=9)), "payload": [1, 2]},
              {"queue": "audit", "partition": "", "data": "text"},
              {"queue": "orders", "partition": None, "transactionId": "", "payload": None},
              {"queue": "orders", "partition": "p-2", "transactionId": "é"},
              {"queue": "audit", "payload": {"pad": "x" * 100}, "data": 5}]
    doc = {"items": [dict(shapes[k % 6] | {"transactionId": f"t-{k}"}) if k % 4 == 0
                     else shapes[k % 6] for k in range(60)]}
    for sub in (None, "alice"):
        typed = same_reading(orjson.dumps(doc), sub)
        assert typed is not None and len(typed) == 60
        assert [i.trace_id is not None for i in typed] == [k % 6 == 1 for k in range(60)]


REGULAR_ITEM = st.fixed_dictionaries(
    {"queue": GOOD_NAME, "transactionId": st.text(min_size=1, max_size=8), "payload": JSON},
    optional={"partition": st.one_of(GOOD_NAME, st.just(""), st.none()),
              "producerSub": st.text(max_size=4)})


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(items=st.lists(REGULAR_ITEM, min_size=1, max_size=5),
       odd=st.one_of(st.none(), GOOD_ITEM, ANY_ITEM), at=st.integers(0, 40),
       size=st.integers(items_module._COLUMNS_FROM, 40), style=st.integers(0, 2),
       sub=st.one_of(st.none(), st.just("alice")))
def test_bodies_read_by_columns_are_read_alike(items: list[dict[str, object]],
                                               odd: dict[str, object] | None, at: int,
                                               size: int, style: int, sub: str | None) -> None:
    # a body big enough for the columns, of regular items and maybe one of any kind
    body_items = (items * size)[:size]
    if odd is not None:
        body_items.insert(at % size, odd)
    same_reading(dump({"items": body_items}, style), sub)


def test_a_regular_body_is_read_by_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body of items with a transactionId and a payload each, and nothing else, takes the
    columns (no frame packed item by item), in one partition or several."""
    def not_called(*args: object) -> None:
        raise AssertionError("read item by item")

    n = items_module._COLUMNS_FROM
    one = [{"queue": "orders", "partition": "p-1", "transactionId": f"t-{i}",
            "payload": {"n": i, "s": "é\u2603"}} for i in range(n)]
    mixed = [{"queue": ["orders", "audit"][i % 2], "partition": [None, "", "p-1", "p-2"][i % 4],
              "transactionId": "💡" * (i + 1), "payload": [i, 1.5, False, "x y"][i % 4]}
             for i in range(n)]
    for doc in (one, mixed):
        body = orjson.dumps({"items": doc})
        exact = [item_fields(i) for i in exact_json_push(body, None, ids)]
        with monkeypatch.context() as patch:
            patch.setattr(items_module, "pack_plain_frame", not_called)
            typed = decode_push_items(body, None, ids)
        assert typed is not None and [item_fields(i, True) for i in typed] == exact
        assert len({id(i.queue) for i in typed}) == len({i.queue for i in typed})
    # one item of another kind: item by item, read alike
    for odd in ({"queue": "orders", "payload": 1}, {"queue": "orders", "transactionId": "t"},
                {"queue": "orders", "transactionId": "t", "payload": None},
                {"queue": "orders", "transactionId": "t", "data": 1},
                {"queue": "orders", "transactionId": "t", "payload": 1,
                 "traceId": str(uuid.UUID(int=9))}):
        typed = same_reading(orjson.dumps({"items": [*one, odd]}))
        assert typed is not None and len(typed) == n + 1
    for bad in ({"queue": "a/b", "transactionId": "t", "payload": 1},
                {"queue": "q", "transactionId": "t" * 1100, "payload": 1},
                {"queue": "q", "partition": "x" * 300, "transactionId": "t", "payload": 1}):
        assert same_reading(orjson.dumps({"items": [*one, bad]})) is None


def test_a_payload_is_stored_compact_with_its_numbers_as_written() -> None:
    body = b'{"items":[{"queue":"q","payload": {"a": 2.50, "b": [1E2, "x y"]} }]}'
    typed = decode_push_items(body, None, ids)
    assert typed is not None
    assert bytes(next(iter_frames(typed[0].frame)).payload) == b'{"a":2.50,"b":[1E2,"x y"]}'


@pytest.mark.parametrize("payload", [
    b"1e400", b"-2E+308", b"1.5e0309", b"12345678901234567890", b"123456789012345678901.5",
    b'"\\ud800"', b'"\\u00e9"', b'"a\\/b"', b'"\xff"', b'"\xed\xa0\x80"', b"NaN",
    b"[" * 1100 + b"]" * 1100, b"[" * 600 + b"{}" * 500 + b"]" * 600])
def test_what_may_not_fit_or_is_not_json_goes_to_the_exact_path(payload: bytes) -> None:
    body = b'{"items":[{"queue":"q","payload":' + payload + b"}]}"
    assert decode_push_items(body, None, ids) is None
    same_reading(body)


def test_many_shallow_payloads_take_the_typed_path() -> None:
    body = orjson.dumps({"items": [{"queue": "q", "payload": [[{"a": [1]}]]}] * 400})
    typed = same_reading(body)
    assert typed is not None and len(typed) == 400


def test_refusals_are_the_exact_paths() -> None:
    for body in (b"", b"[]", b'{"items":{}}', b'{"items":[1]}', b'{"items":[{"queue":1}]}',
                 b'{"items":[{"queue":"a/b"}]}',
                 b'{"items":[{"queue":"q","partition":"a/b"},{"queue":"a/b"}]}',
                 b'{"items":[{"queue":"q","traceId":"x"}]}',
                 b'{"items":[{"queue":"q","transactionId":"' + b"t" * 1100 + b'"}]}'):
        assert decode_push_items(body, None, ids) is None
        with pytest.raises((ApiError, RequestError, WireError)):
            exact_json_push(body, None, ids)


def test_under_a_raised_recursion_limit_a_payload_deeper_than_orjson_reads_is_refused() -> None:
    # msgspec reads as deep as Python's recursion limit allows, orjson 1,024 levels: where a
    # harness raised the limit, the typed decoders must leave such a body to the exact path,
    # which refuses it; a shallower one is read by both.
    probe = textwrap.dedent("""
        import sys
        sys.setrecursionlimit(20_000)
        from queen_mp.models.items import decode_push_items, decode_ack_batch
        from queen_mp.http.push import parse_json_push
        from queen_mp.http.errors import ApiError
        ids = lambda n: [i.to_bytes(16, "big") for i in range(1, n + 1)]
        for depth in (1_000, 1_100):
            payload = b"[" * depth + b"]" * depth
            body = b'{"items":[{"queue":"q","payload":' + payload + b'}]}'
            typed = decode_push_items(body, None, ids)
            try:
                parse_json_push(body, None, ids)
                exact = "read"
            except ApiError as ex:
                exact = "refused" if "depth limit exceeded" in str(ex) else repr(ex)
            ack = (b'{"acknowledgments":[{"transactionId":"t","partitionId":"1","x":'
                   + payload + b'}]}')
            print(depth, typed is None, exact, decode_ack_batch(ack, True, 100) is None)
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "1000 False read False"
    assert out[1] == "1100 True refused True"


def _translated(text: bytes) -> bool:
    shapes = text.translate(items_module._NUMBER_SHAPES)
    return shapes.find(items_module._LONG_RUN) < 0 and shapes.find(items_module._BIG_EXPONENT) < 0


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(pieces=st.lists(st.one_of(st.binary(max_size=30),
                                 st.sampled_from([b"e123", b"E+308", b"+999", b"e-400", b"e12",
                                                  b"1" * 18, b"9" * 19, b"x1e99", b"12345"]),
                                 st.integers(0, 10 ** 25).map(lambda v: str(v).encode())),
                       max_size=40),
       at=st.integers(0, 1 << 13))
def test_the_bulk_number_scan_sees_what_translate_sees(pieces: list[bytes], at: int) -> None:
    # the shapes anywhere in a body big enough for numpy's scan, the edges included
    text = b"".join(pieces)
    filler = b'{"a":"x"},' * (items_module._SCAN_BULK // 10 + 1)
    for body in (filler[:at] + text + filler, text + filler, filler + text):
        assert len(body) >= items_module._SCAN_BULK
        assert items_module._no_long_number(body) == _translated(body)


_SHAPES = st.one_of(st.binary(max_size=30).map(lambda b: b.replace(b'"', b"").replace(b"\\", b"")),
                    st.sampled_from([b"e123", b"E+308", b"+999", b"e-400", b"e12", b"1" * 18,
                                     b"9" * 19, b"x1e99", b"12345", b"1" * 40]),
                    st.integers(0, 10 ** 25).map(lambda v: str(v).encode()))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(pieces=st.lists(st.tuples(_SHAPES, _SHAPES), max_size=30),
       pad=st.integers(0, 1 << 13))
def test_the_bulk_scan_outside_strings_sees_what_the_cut_strings_show(
        pieces: list[tuple[bytes, bytes]], pad: int) -> None:
    """The second look of a big body (no backslash) finds a number shape outside its strings
    exactly when the body with its strings cut out shows one (the cut was the former way;
    the outside pieces are kept apart by commas, as JSON's numbers are)."""
    body = b'{"a":"' + b"x" * pad + b'"' + b"".join(
        b"," + outside + b',"' + inside + b'"' for outside, inside in pieces) + b"}"
    body += b' ,"' + b"y" * items_module._SCAN_BULK + b'"'  # big enough for numpy's scan
    cut = b"".join(body.split(b'"')[::2])
    assert (items_module._no_long_number_bulk(body, strings=False)
            == items_module._no_long_number(cut))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(pieces=st.lists(st.tuples(_SHAPES, _SHAPES, st.booleans()), max_size=30),
       pad=st.integers(0, 1 << 13))
def test_the_bulk_scan_reads_the_known_strings_as_the_quotes_do(
        pieces: list[tuple[bytes, bytes, bool]], pad: int) -> None:
    """Given the text of some of the body's strings (``known``: a push's transactionIds), the
    scan answers what its look among the quotes answers, shapes outside strings included."""
    body = b'{"a":"' + b"x" * pad + b'"' + b"".join(
        b"," + outside + b',"' + inside + b'"' for outside, inside, _ in pieces) + b"}"
    body += b' ,"' + b"y" * items_module._SCAN_BULK + b'"'
    known = b"\0".join(inside for _, inside, taken in pieces if taken)
    assert (items_module._no_long_number_bulk(body, strings=False, known=lambda: known)
            == items_module._no_long_number_bulk(body, strings=False))


def test_uuid_transaction_ids_that_look_like_exponents_take_the_typed_path() -> None:
    txns = [f"{i:08x}-e123-4{i % 10}00-8000-00000000000{i % 10}" for i in range(60)]
    items = [{"queue": "q", "transactionId": t, "payload": {"n": i, "s": "x" * 50}}
             for i, t in enumerate(txns)]
    typed = same_reading(orjson.dumps({"items": items}))
    assert typed is not None and [i.transaction_id for i in typed] == txns
    # a number that may not fit still goes to the exact path, the known strings or not
    items[7]["payload"] = {"n": 1}
    body = orjson.dumps({"items": items}).replace(b'{"n":1}', b'{"n":1e400}')
    assert decode_push_items(body, None, ids) is None
    same_reading(body)
    # and a shape in a payload's string is still found to be text (by the quotes)
    items[7]["payload"] = {"s": "ab-e999-cd"}
    assert same_reading(orjson.dumps({"items": items})) is not None
