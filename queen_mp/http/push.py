"""``POST /api/v1/push``: parse (JSON or QPB1), hand to ``Ingest``, render per-item results.

Everything a 4xx can be about is checked before the first group leaves for a shard, so a 4xx
never stores an item of its body.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.front.ingest import QUEUED, EncryptionUnavailable, ItemResult, PushResults, QueuedRun
from queen_mp.front.worker import FrontWorker
from queen_mp.http.admission import Grant
from queen_mp.http.answer import Answer
from queen_mp.http.authz import sub_of, tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.errors import BadFrame, InvalidRequest, Timeout, Unavailable
from queen_mp.models.items import (
    DEFAULT_PARTITION,
    MAX_ITEMS,
    ClientChunk,
    PushBatch,
    PushItem,
    decode_push_items,
    frame_items,
    frame_sizes,
    json_item,
    loads_json,
    parse_json_item,
    stamped_item,
)
from queen_mp.wire.binary_push import (
    QPB1_MAGIC,
    FramesGroup,
    decoded_size,
    parse_binary_push,
)
from queen_mp.wire.ids import uuid7_many, uuid_text, uuid_texts
from queen_mp.wire.times import iso_from_us

__all__ = ["PUSH_PATH", "PushResource", "exact_json_push", "parse_json_push"]

PUSH_PATH = "/api/v1/push"


def parse_json_push(body: bytes, producer_sub: str | None = None,
                    message_ids: Callable[[int], list[bytes]] = uuid7_many
                    ) -> Sequence[PushItem]:
    """docs/api.md 2.1 items, validated completely before anything is routed; ``producer_sub``
    (the token's sub) is stamped on every item, whatever the body says. ``message_ids`` mints
    a body's ids (the ids of a whole body under one clock read and one lock, not one each)."""
    typed = decode_push_items(body, producer_sub, message_ids)
    if typed is not None:
        return typed
    return exact_json_push(body, producer_sub, message_ids)


def exact_json_push(body: bytes, producer_sub: str | None,
                    message_ids: Callable[[int], list[bytes]]) -> list[PushItem]:
    """The body through ``loads_json`` and ``parse_json_item``: the path that words every
    refusal, and reads what ``decode_push_items`` leaves to it."""
    try:
        doc = loads_json(body) if body else None
    except (orjson.JSONDecodeError, ValueError) as ex:
        raise InvalidRequest(f"body is not valid JSON: {ex}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise InvalidRequest("body must be an object with an 'items' array", field="items")
    raw_items = doc["items"]
    if len(raw_items) > MAX_ITEMS:
        raise InvalidRequest(f"{len(raw_items)} items, over the {MAX_ITEMS} limit",
                             limit=MAX_ITEMS)
    ids = message_ids(len(raw_items))
    items = [parse_json_item(it, i, producer_sub, ids[i]) for i, it in enumerate(raw_items)]
    # NOTE(memory): one str per distinct queue and partition name, not one per item, for as
    # long as the request waits for its verdicts.
    names: dict[str, str] = {}
    for it in items:
        it.queue = names.setdefault(it.queue, it.queue)
        it.partition = names.setdefault(it.partition, it.partition)
    return items


def parse_binary(body: bytes, max_decompressed: int, producer_sub: str | None = None
                 ) -> tuple[Sequence[PushItem], list[ClientChunk], bool]:
    """QPB1 plain or frames; with ``producer_sub`` every frame is stamped, so client chunks
    are rebuilt rather than kept byte for byte (docs/api.md 3.2).

    PERF(http): without it, a group of plain frames is read by columns (no Frame per
    frame), and a body of one such group whose transactionIds do not repeat (what a client
    batching one partition sends) is a ``PushBatch`` carrying the client's zstd frame: no
    PushItem per frame either."""
    parsed = parse_binary_push(body, max_items=MAX_ITEMS, max_decompressed=max_decompressed,
                               columns=producer_sub is None)
    groups = parsed.groups
    if len(groups) == 1 and isinstance(groups[0], FramesGroup) \
            and groups[0].columns is not None:
        cols = groups[0].columns
        if len(set(cols.transaction_ids)) == len(cols.transaction_ids):
            texts, plain = _texts_of(cols.transaction_ids)
            return PushBatch(groups[0].queue, groups[0].partition, texts, cols.message_ids,
                             cols.raw, None, plain, groups[0].chunk), [], parsed.counts_only
    items: list[PushItem] = []
    chunks: list[ClientChunk] = []
    for group in groups:
        partition = group.partition or DEFAULT_PARTITION
        if isinstance(group, FramesGroup) and producer_sub is not None:
            items.extend(stamped_item(group.queue, partition, f, producer_sub)
                         for f in group.frames)
            continue
        if isinstance(group, FramesGroup):
            chunks.append(ClientChunk(group.chunk, len(items), group.count))
            queue, at, columns = group.queue, len(chunks) - 1, group.columns
            if columns is not None:
                items += frame_items(queue, partition, _texts_of(columns.transaction_ids)[0],
                                     columns.message_ids, columns.raw,
                                     frame_sizes(columns.raw, group.count), at)
                continue
            items.extend([PushItem(queue, partition, f.transaction_id, f.message_id, f.raw,
                                   f.trace_id, at) for f in group.frames])
            continue
        ids = uuid7_many(len(group.items))
        items.extend([json_item(group.queue, partition, p.transaction_id, bytes(p.payload),
                                None, mid, producer_sub)
                      for p, mid in zip(group.items, ids, strict=True)])
    return items, chunks, parsed.counts_only


def _texts_of(txns: list[bytes]) -> tuple[list[str], list[bytes] | None]:
    """TransactionIds (checked UTF-8) as str, and ``txns`` again when each one's JSON string
    is its text in quotes (``PushBatch.plain_ids``), else None.

    PERF(http): one join, decode and split for all when they are plain (the common case)."""
    joined = _TEXTS_APART_RAW.join(txns)
    text = joined.decode()
    # PERF(http): what orjson escapes (a control character, a quote, a backslash) counted by
    # one byte deletion, the separators' quotes aside: str.isprintable was 4x dearer
    if len(joined.translate(None, _ESCAPED)) == len(joined) - 2 * (len(txns) - 1):
        return text.split(_TEXTS_APART), txns
    return list(map(str, txns, repeat("utf-8"))), None


def render_item(i: int, item: PushItem, r: ItemResult) -> dict[str, Any]:
    mid = uuid_text(r.message_id)
    pid = str(r.partition_id) if r.partition_id else None
    trace = uuid_text(item.trace_id) if item.trace_id else None
    return {"index": i, "status": r.status, "messageId": mid,
            "transactionId": item.transaction_id, "queue": item.queue,
            "partition": item.partition, "partitionId": pid, "offset": r.offset,
            "createdAt": iso_from_us(r.created_us), "traceId": trace, "error": r.error,
            "message_id": mid, "transaction_id": item.transaction_id, "partition_id": pid,
            "trace_id": trace, "queueName": item.queue}


# PERF(http): the common answer item (no error, no trace id) is formatted straight to bytes;
# building a 16-key dict per item and serialising it was a fifth of a 1,000-item push's CPU.
# What a group's items share (status, queue, partition, partition id) is baked into constant
# pieces, so an item fills only its index, id, transactionId, offset and createdAt.
# Same keys, same order and same values as render_item (tests/unit/test_push_render.py).
Shared = tuple[str, str, str, int]  # status, queue, partition, partition id


@functools.lru_cache(maxsize=1024)
def _item_pieces(shared: Shared) -> tuple[bytes, ...]:
    """The constant text of an answer item of ``shared``'s group, around its seven slots: the
    index, the id text, the transactionId JSON, the offset, the createdAt JSON, the id text
    and the transactionId JSON again.

    PERF(http): cached, as a producer pushes to the same partitions over and over.
    NOTE(memory): some 400 bytes a group."""
    status, queue, partition, partition_id = shared
    pid = b'"%d"' % partition_id if partition_id else b"null"
    q = orjson.dumps(queue)
    return (b'{"index":', b',"status":"' + status.encode() + b'","messageId":"',
            b'","transactionId":',
            b',"queue":' + q + b',"partition":' + orjson.dumps(partition) + b',"partitionId":'
            + pid + b',"offset":',
            b',"createdAt":', b',"traceId":null,"error":null,"message_id":"',
            b'","transaction_id":',
            b',"partition_id":' + pid + b',"trace_id":null,"queueName":' + q + b"}")


@functools.lru_cache(maxsize=1024)
def _item_template(shared: Shared) -> bytes:
    """``_item_pieces(shared)`` as one %-template: the index %d, the rest %s of their bytes.

    PERF(http): a 1-item answer fills a template (built for 25k instructions, found for 1k)
    instead of rendering a 16-key dict."""
    slots = (b"%d", b"%s", b"%s", b"%s", b"%s", b"%s", b"%s", b"")
    return b"".join(piece.replace(b"%", b"%%") + slot
                    for piece, slot in zip(_item_pieces(shared), slots, strict=True))


def _created_json(created_us: int) -> bytes:
    """createdAt of ``created_us`` as its JSON value, for an answer item's template."""
    created = iso_from_us(created_us)
    return b'"%s"' % created.encode() if created else b"null"


_TRACE = attrgetter("trace_id")
_MID = attrgetter("message_id")
_TXN = attrgetter("transaction_id")
_ROW = 14  # the parts of an answer item in _runs_answer: eight slots, six pieces between


def _runs_answer(items: Sequence[PushItem], runs: Sequence[QueuedRun]) -> bytes | None:
    """The answer of a push whose every item is in one of ``runs``, as ``render_items``
    words it; None when an item has a trace id (``render_item`` words those) or the push is
    of one item.

    PERF(http): the whole answer is one join of its parts: the pieces every item shares
    laid out once by a list repeat, each slot's column put in place by one slice assignment,
    ids to text and transactionIds to JSON by C loops over the whole body, indexes and
    offsets cut from a table of decimals: no %-template and no int formatted per item (a
    100-item answer of one partition 635k -> 467k instructions, of 10 partitions 1,163k ->
    753k, callgrind)."""
    n = len(items)
    if type(items) is PushBatch:  # PERF(http): its columns, no PushItem made
        texts, ids = items.transaction_ids, uuid_texts(b"".join(items.message_ids))
        # PERF(http): the body's own UTF-8 of them, when their JSON needs no escape
        # (bench.hotpath front100 68k instructions less)
        plain = items.plain_ids
    elif n < 2 or any(map(_TRACE, items)):
        return None
    else:
        texts, ids = list(map(_TXN, items)), uuid_texts(b"".join(map(_MID, items)))
        plain = None
    if plain is None:
        plain = _plain_texts(texts)
    txns = list(map(orjson.dumps, texts)) if plain is None else plain
    q = b"" if plain is None else b'"'
    run = runs[0]
    p = _item_pieces((QUEUED, *_names_of(items, run), run.partition_id))
    parts: list[bytes] = [p[0], b"", p[1], b"", p[2] + q, b"", q + p[3], b"", b"",
                          p[4] + _created_json(run.created_us) + p[5], b"", p[6] + q, b"",
                          q + p[7] + b","] * n
    if len(runs) == 1:
        parts[7::_ROW], parts[8::_ROW] = _consecutive_decimals(run.first, n)
    else:  # what differs between runs, item by item
        heads, tails, queues, created, ends = ([b""] * n for _ in range(5))
        for run in runs:
            p = _item_pieces((QUEUED, *_names_of(items, run), run.partition_id))
            queue, at, end = q + p[3], p[4] + _created_json(run.created_us) + p[5], \
                q + p[7] + b","
            for i, head, tail in zip(run.idx, *_consecutive_decimals(run.first, len(run.idx)),
                                     strict=True):
                heads[i], tails[i], queues[i], created[i], ends[i] = head, tail, queue, at, end
        parts[6::_ROW], parts[7::_ROW], parts[8::_ROW] = queues, heads, tails
        parts[9::_ROW], parts[13::_ROW] = created, ends
    parts[1::_ROW] = _decimal_tables()[0][:n] if n <= _DECIMALS else \
        str(list(range(n)))[1:-1].encode().split(b", ")  # one repr, cut: C loops
    parts[3::_ROW] = parts[10::_ROW] = ids
    parts[5::_ROW] = parts[12::_ROW] = txns
    parts[0] = b"[" + parts[0]
    parts[-1] = parts[-1][:-1] + b"]"
    return b"".join(parts)


def _names_of(items: Sequence[PushItem], run: QueuedRun) -> tuple[str, str]:
    """The queue and partition of ``run``'s items."""
    if type(items) is PushBatch:
        return items.queue, items.partition
    first = items[run.idx[0]]
    return first.queue, first.partition


_DECIMALS = 1000  # the numbers of the decimal tables (_decimal_tables)


@functools.cache
def _decimal_tables() -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """0 .. _DECIMALS - 1 as decimal ASCII, and zero-padded to three digits.

    PERF(http): a run's indexes and offsets are cut from these: formatting an int cost 1.1k
    instructions, two per answer item. NOTE(memory): some 90 KB, made on a worker's first
    answer of a run."""
    return (tuple(b"%d" % i for i in range(_DECIMALS)),
            tuple(b"%03d" % i for i in range(_DECIMALS)))


def _consecutive_decimals(first: int, n: int) -> tuple[list[bytes], list[bytes]]:
    """``first`` .. ``first + n - 1`` (not negative) as decimal ASCII, each cut in two: its
    thousands and its last three digits (an answer item's two parts of its offset)."""
    plain, padded = _decimal_tables()
    heads: list[bytes] = []
    tails: list[bytes] = []
    at, end = first, first + n
    while at < end:  # one step per thousand
        thousands, low = divmod(at, _DECIMALS)
        count = min(end - at, _DECIMALS - low)
        heads += [b"%d" % thousands if thousands else b""] * count
        tails += (padded if thousands else plain)[low:low + count]
        at += count
    return heads, tails


def _plain_texts(texts: list[str]) -> list[bytes] | None:
    """Each of ``texts`` UTF-8 encoded, when none holds what JSON escapes (a quote, a
    backslash, a control character: its JSON string is then its text in quotes); else None.

    PERF(http): one join, one check and one encode for all (``str.isprintable`` is False for
    every character orjson escapes, and for some it does not, which then take orjson): an
    ``orjson.dumps`` per transactionId cost 1.3k instructions."""
    joined = _TEXTS_APART.join(texts)
    if joined.count('"') != 2 * (len(texts) - 1) or "\\" in joined \
            or not joined.isprintable():
        return None
    return joined.encode().split(_TEXTS_APART_RAW)


_TEXTS_APART = '","'  # no text it joins holds a quote, so each one found separates two
_TEXTS_APART_RAW = _TEXTS_APART.encode()
_ESCAPED = bytes(range(32)) + b'"\\'  # the bytes orjson writes escaped in a JSON string


def _json_array(rows: list[bytes]) -> bytes:
    """The JSON array of ``rows`` (each a JSON value), in one copy of them.

    PERF(http): ``b"[" + b",".join(rows) + b"]"`` copied a 1,000-item answer (some 400 KB)
    three times, each copy a fresh mapping of its own; the brackets go on the end rows."""
    if not rows:
        return b"[]"
    rows[0] = b"[" + rows[0]
    rows[-1] += b"]"
    return b",".join(rows)


def render_items(items: Sequence[PushItem], results: list[ItemResult | None],
                 runs: Sequence[QueuedRun] = ()) -> bytes:
    """The JSON answer of a push: one object per item, in request order; ``results`` is
    None where one of ``runs`` holds the item (``PushResults``)."""
    if len(items) == 1 and not runs:
        one = _one_row(items[0], results[0])
        if one is not None:
            return one
    if runs:
        if results.count(None) == len(items):
            whole = _runs_answer(items, runs)
            if whole is not None:
                return whole
        results = list(results)
        for run in runs:
            run.expand(items, results)
    rows: list[bytes] = []
    append = rows.append
    templates: dict[tuple[str, str, str, int, int], tuple[bytes, bytes]] = {}
    dumps = orjson.dumps
    # every result is in place: the runs expanded
    for i, (item, r) in enumerate(zip(items, results, strict=True)):  # type: ignore[misc]
        if r.error is not None or item.trace_id:
            append(dumps(render_item(i, item, r)))
            continue
        key = (r.status, item.queue, item.partition, r.partition_id, r.created_us)
        filled = templates.get(key)
        if filled is None:
            filled = templates[key] = (
                _item_template((r.status, item.queue, item.partition, r.partition_id)),
                _created_json(r.created_us))
        template, created = filled
        mid = uuid_text(r.message_id).encode()
        txn = dumps(item.transaction_id)
        append(template % (i, mid, txn, b"null" if r.offset is None else b"%d" % r.offset,
                           created, mid, txn))
    if len(rows) == 1:  # PERF(http): a 1-item answer skips the call
        return b"[" + rows[0] + b"]"
    return _json_array(rows)


@functools.lru_cache(maxsize=1024)
def _one_template(shared: Shared) -> bytes:
    """``_item_template(shared)`` as a whole 1-item answer (in its array's brackets)."""
    return b"[" + _item_template(shared) + b"]"


def _one_row(item: PushItem, r: ItemResult | None) -> bytes | None:
    """The answer to a 1-item push, when its item has no error and no trace id; else None
    (``render_items``' general path words it).

    PERF(http): one cached template filled once, its id's text cut by ``uuid_texts``: no
    template table, loop or brackets joined on (26k instructions, now 16k)."""
    if r is None or r.error is not None or item.trace_id:
        return None
    mid = uuid_texts(r.message_id)[0]
    txn = orjson.dumps(item.transaction_id)
    return _one_template((r.status, item.queue, item.partition, r.partition_id)) % (
        0, mid, txn, b"null" if r.offset is None else b"%d" % r.offset,
        _created_json(r.created_us), mid, txn)


def render_counts(results: PushResults) -> dict[str, int]:
    counts = results.counts()
    return {"count": len(results.each), **counts,
            "error": counts["buffered"] + counts["failed"]}


class PushResource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        # NOTE(memory): the body goes straight into ``answer`` (no local here), which drops
        # it once parsed: a local would keep it until every verdict is in.
        answer = await self.answer(await read_body(req, self.worker.config.max_body_mb << 20),
                                   tenant_of(req), sub_of(req),
                                   getattr(req.context, "admission", None))
        answer.apply(resp)

    async def answer(self, body: bytes, tenant: bytes, sub: str | None,
                     grant: Grant | None) -> Answer:
        """The answer to a push of ``body`` by ``tenant`` (token subject ``sub``) that
        admission granted ``grant``."""
        cfg = self.worker.config
        chunks: list[ClientChunk] = []
        counts_only = False
        if body[:4] == QPB1_MAGIC:
            if grant is not None:
                await grant.rewindow(PUSH_PATH, decoded_size(body))
            items, chunks, counts_only = parse_binary(body, cfg.max_decompressed_mb << 20, sub)
        elif body[:4] == b"QTB1":
            raise BadFrame("a QTB1 body belongs to /api/v1/transaction", offset=0,
                           field="magic")
        else:
            items = parse_json_push(body, sub)
        # NOTE(memory): nothing parsed refers to the body but QPB1 client chunks (copied
        # into the shard records); drop it rather than hold it until every verdict is in.
        del body
        try:
            results = await self.worker.ingest.push(items, tenant, chunks)
        except EncryptionUnavailable as ex:
            raise Unavailable(str(ex)) from None
        except TimeoutError:
            raise Timeout("push deadline passed before every verdict; outcome unknown, "
                          "retry is safe (deduplicated on transactionId)") from None
        self.worker.count_pushed(results)
        if counts_only:
            return Answer(201, media=render_counts(results))
        return Answer(201, render_items(items, results.each, results.runs))
