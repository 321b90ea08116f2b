"""The dead-letter queue (docs/api.md 2.8): list, replay and delete rows filed by the ack path.

=====================================================================  =======================
``GET    /api/v1/dlq?queue=&consumerGroup=&partition=&from=&to=&limit=&offset=``  ``DlqResource``
``DELETE /api/v1/dlq?<the filters>&all=&limit=``                         ``DlqResource``
``POST   /api/v1/dlq/retry?<the filters>&all=&limit=``                   ``DlqRetryResource``
``POST   /api/v1/messages/{partitionId}/{transactionId}/retry?consumerGroup=``  ``RetryResource``
``DELETE /api/v1/messages/{partitionId}/{transactionId}?consumerGroup=``  ``MessageResource``
=====================================================================  =======================

The by-filter routes (``DELETE /api/v1/dlq``, ``POST /api/v1/dlq/retry``) act on the rows the
listing would show with the same filters, the first ``limit`` (1..1000, default 100) in list
order per call, server side: an operator clears thousands of rows without paging through them.
No filter at all needs ``all=true`` (one mistyped call must not empty every queue's DLQ). The
answer's ``remaining`` counts the matches left; a caller repeats while it is above 0 and the
call still did something.

A row keeps the payload **snapshot** exactly as the frame stored it (ciphertext on an encrypted
queue); the listing decrypts it into ``data``, except for a ``read-only`` caller
(``authz.reads_encrypted``): an encrypted snapshot is then withheld, the row saying so with
``data: null``, ``encrypted: true`` and ``dataWithheld: true``, two keys that only such a row
carries (a plain row, or any row for ``read-write``, is rendered as it always was).

A replay is a re-push, not a revival (ack-internals "Filing the DLQ row"): the broker reads
the row (``dlq_find_v1``), builds one frame with a fresh UUIDv7 message id whose text is also
the new transactionId (so dedup cannot swallow it), keeps the row's traceId and producerSub,
packs it as one zstd chunk with its xxh3_128 hash, and ``dlq_retry_v1`` deletes the rows and
pushes the segment to the tail of the partition through the one allocator, in one transaction.
Pops parked on the queue are woken.

NOTE(dlq): routing limits. falcon's ``path`` converter must end a template, so the retry route
cannot take a transactionId containing ``/``; the ASGI server percent-decodes the path before
routing, so ``%2F`` does not help either. Such rows can be listed but not retried or deleted
through these routes. Also, falcon silently replaces the resource of a template registered
twice: the GET of docs/api.md 2.9 on ``/api/v1/messages/{partition_id}/{transaction_id}`` must be
an ``on_get`` of ``MessageResource`` (or this ``on_delete`` must move to its resource).
"""

from __future__ import annotations

import logging
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.crypto import PayloadCipher
from queen_mp.db import dlq_procs
from queen_mp.db.dlq_procs import DlqFilter, DlqRow, RetryResult
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import reads_encrypted, tenant_of
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import (
    JSON_UTF8,
    InvalidRequest,
    NotFound,
    Unavailable,
)
from queen_mp.http.query import Query
from queen_mp.ipc.wakeboard import bucket_of
from queen_mp.models.items import path_partition_id, path_transaction_id
from queen_mp.wire.frames import pack_chunk_zstd, pack_frame
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid7, uuid_text
from queen_mp.wire.times import iso_ms

__all__ = ["DlqResource", "DlqRetryResource", "MessageResource", "RetryResource"]

log = logging.getLogger("queen_mp.http.dlq")

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


# --------------------------------------------------------------------------------- helpers
def _data(row: DlqRow, cipher: PayloadCipher | None) -> orjson.Fragment | None:
    """The snapshot as JSON ``data``: decrypted, spliced verbatim (a stored payload is JSON
    text, validated at ingest); no snapshot or an empty payload is null."""
    payload = row.payload
    if not payload:
        return None
    if row.encrypted:
        if cipher is None:
            # NOTE(dlq): one undecryptable row must not fail the whole listing.
            log.warning("DLQ row %d is encrypted and this broker has no key", row.id)
            return None
        try:
            payload = cipher.decrypt(payload)
        except Exception as ex:
            log.warning("DLQ row %d does not decrypt: %r", row.id, ex)
            return None
        if not payload:
            return None
    return orjson.Fragment(payload)


def _render(row: DlqRow, cipher: PayloadCipher | None, decrypting: bool) -> dict[str, Any]:
    """One listing row; ``decrypting`` False (a read-only caller) withholds an encrypted
    snapshot instead of decrypting it."""
    withheld = row.encrypted and bool(row.payload) and not decrypting
    out: dict[str, Any] = {
        "id": uuid_text(row.message_id), "transactionId": row.transaction_id,
        "partitionId": str(row.partition_id), "queue": row.queue, "partition": row.partition,
        "offset": row.offset, "consumerGroup": row.consumer_group, "errorMessage": row.error,
        "retryCount": row.retry_count, "data": None if withheld else _data(row, cipher)}
    if withheld:
        out["encrypted"] = out["dataWithheld"] = True
    out.update(producerSub=row.producer_sub, createdAt=iso_ms(row.created_at),
               failedAt=iso_ms(row.failed_at))
    return out


def _replay_payload(row: DlqRow, cipher: PayloadCipher | None) -> tuple[bytes, bool]:
    """(payload bytes, encrypted) of the replayed frame, following the queue's flag NOW
    (``encryptionEnabled`` applies to new pushes, and a replay is one).

    An encrypted snapshot on a still encrypted queue keeps its stored ciphertext byte for byte
    (flag 4); a plain one on a queue encrypted since is encrypted (no key: 503, as a push); an
    encrypted one on a queue no longer encrypted is decrypted when the key allows, else kept as
    it is (still flag 4, still readable once the key is back). No snapshot is a null payload.
    """
    if row.payload is None:
        payload, encrypted = b"", False
    else:
        payload, encrypted = row.payload, row.encrypted
    if encrypted:
        if row.queue_encrypted or cipher is None:
            return payload, True
        try:
            return cipher.decrypt(payload), False
        except Exception as ex:
            log.warning("DLQ row %d does not decrypt; replayed as stored: %r", row.id, ex)
            return payload, True
    if row.queue_encrypted:
        if cipher is None:
            raise Unavailable(f"queue {row.queue!r} is encrypted but this broker has no key "
                              "(QUEEN_ENCRYPTION_KEY, or the key file its start log names)")
        return cipher.encrypt(payload), True
    return payload, False


def _filter(q: Query) -> DlqFilter:
    return DlqFilter(queue=q.name("queue"), group=q.name("consumerGroup"),
                     partition=q.name("partition", slash_ok=True), since=q.time("from"),
                     until=q.time("to"))


def _bulk_filter(q: Query) -> tuple[DlqFilter, int]:
    """The filter and the row limit of a by-filter retry or delete; 400 for no filter without
    ``all=true``, and for ``from`` after ``to`` (a range that can match nothing is a mistake
    here, not an empty page)."""
    where = _filter(q)
    everything = q.flag("all", False)
    if not everything and where == DlqFilter(None, None, None, None, None):
        raise InvalidRequest("no filter: give queue, consumerGroup, partition, from or to, or "
                             "all=true to act on every dead letter", field="all")
    if where.since is not None and where.until is not None and where.since > where.until:
        raise InvalidRequest("'from' must not be after 'to'", field="from")
    return where, q.integer("limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)


async def _remaining(pool: Any, tenant: bytes, where: DlqFilter) -> int:
    page = await call_db(pool, lambda conn: dlq_procs.list_page(conn, tenant, where, limit=1,
                                                                offset=0))
    return page.total


async def _replay(conn: Any, tenant: bytes, row: DlqRow, group: str | None,
                  payload: tuple[bytes, bool]) -> tuple[bytes, RetryResult]:
    """Replay ``row`` with ``payload`` (``_replay_payload``'s) at the tail of its partition
    (``dlq_retry_v1``): the rows of its (partition, transactionId, offset), of ``group`` or of
    every group, go with it."""
    message_id = uuid7()
    new_txn = uuid_text(message_id)
    payload, encrypted = payload
    frame = pack_frame(message_id, new_txn.encode("ascii"), payload, trace_id=row.trace_id,
                       producer_sub=row.producer_sub, encrypted=encrypted)
    res = await dlq_procs.retry(conn, tenant, row.partition_id, row.transaction_id, row.offset,
                                group, pack_chunk_zstd(frame, 1), txn_hash(new_txn))
    return message_id, res


def _answer(resp: falcon.asgi.Response, body: dict[str, Any]) -> None:
    resp.data = orjson.dumps(body)
    resp.content_type = JSON_UTF8
    resp.status = falcon.HTTP_200


# --------------------------------------------------------------------------------- resources
class DlqResource:
    """``GET /api/v1/dlq``: one page of dead letters and the total count of matches.
    ``DELETE /api/v1/dlq``: delete the first ``limit`` matches of the same filters."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        where = _filter(q)
        limit = q.integer("limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
        offset = q.integer("offset", 0, minimum=0, maximum=(1 << 63) - 1)
        tenant = tenant_of(req)
        page = await call_db(self.worker.pool, lambda conn: dlq_procs.list_page(
            conn, tenant, where, limit=limit, offset=offset))
        cipher, decrypting = self.worker.cipher, reads_encrypted(req)
        body = {"messages": [_render(r, cipher, decrypting) for r in page.rows],
                "total": page.total,
                "pagination": {"limit": limit, "offset": offset}}
        _answer(resp, body)

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        where, limit = _bulk_filter(Query(req.query_string))
        tenant = tenant_of(req)
        n = await call_db(self.worker.pool, lambda conn: dlq_procs.delete_matching(
            conn, tenant, where, limit))
        _answer(resp, {"success": True, "deleted": n,
                       "remaining": await _remaining(self.worker.pool, tenant, where)})


class DlqRetryResource:
    """``POST /api/v1/dlq/retry``: replay the first ``limit`` matches of the listing's filters.

    Each (partition, transactionId, offset) is one replay, its own transaction, as the single
    retry makes it: with ``consumerGroup`` the replay takes that group's row, without it every
    group's row at that offset (one message replayed, not one per group). A replay that cannot
    happen (its partition is gone, a concurrent call took it, a plain snapshot on a queue
    encrypted since and no key) is counted in ``skipped`` and the rest go on. The body, if
    any, is ignored.
    """

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        where, limit = _bulk_filter(Query(req.query_string))
        tenant = tenant_of(req)
        cipher = self.worker.cipher
        pool = self.worker.pool
        rows = await call_db(pool, lambda conn: dlq_procs.match(conn, tenant, where, limit))
        firsts: dict[tuple[int, str, int], DlqRow] = {}
        for row in rows:  # list order; a snapshot row before one filed without (dlq_find_v1)
            key = (row.partition_id, row.transaction_id, row.offset)
            if key not in firsts or (firsts[key].payload is None and row.payload is not None):
                firsts[key] = row
        retried = replayed = skipped = 0
        woken: set[str] = set()
        for row in firsts.values():
            try:
                payload = _replay_payload(row, cipher)
            except Unavailable as ex:
                log.warning("DLQ row %d not replayed: %s", row.id, ex)
                skipped += 1
                continue
            _, res = await call_db(pool, lambda conn, row=row, payload=payload: _replay(
                conn, tenant, row, where.group, payload))
            if not res.ok:
                skipped += 1
                continue
            retried += res.retried
            replayed += 1
            if res.queue:
                woken.add(res.queue)
        if self.worker.waker is not None and woken:
            self.worker.waker.wake([bucket_of(tenant, q) for q in sorted(woken)])
        _answer(resp, {"success": True, "replayed": replayed, "retried": retried,
                       "skipped": skipped, "remaining": await _remaining(pool, tenant, where)})


class RetryResource:
    """``POST /api/v1/messages/{partitionId}/{transactionId}/retry``: replay at the tail.

    The body, if any, is ignored. ``?consumerGroup=`` narrows the rows to that group's. When
    the transactionId was dead-lettered at several offsets (pushed again after its dedup
    window), one call replays the lowest one (every group's row there, or the named group's);
    the next call replays the next. ``retried`` = DLQ rows deleted. No row: ``404``.
    """

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      partition_id: str, transaction_id: str) -> None:
        pid = path_partition_id(partition_id)
        txn = path_transaction_id(transaction_id)
        group = Query(req.query_string).name("consumerGroup")
        tenant = tenant_of(req)
        cipher = self.worker.cipher

        async def replay(conn: Any) -> tuple[bytes, RetryResult] | None:
            rows = await dlq_procs.find(conn, tenant, pid, txn, group)
            if not rows:
                return None
            return await _replay(conn, tenant, rows[0], group, _replay_payload(rows[0], cipher))

        done = await call_db(self.worker.pool, replay)
        if done is None or not done[1].ok:
            why = ("its partition no longer exists"
                   if done is not None and done[1].error == "partition_not_found"
                   else "no dead-letter row matches")
            raise NotFound(f"partition {pid}, transactionId {txn!r}: {why}",
                           field="transactionId")
        message_id, res = done
        if self.worker.waker is not None and res.queue:
            self.worker.waker.wake([bucket_of(tenant, res.queue)])
        new_txn = uuid_text(message_id)
        resp.data = orjson.dumps({"success": True, "partitionId": str(pid),
                                  "transactionId": txn, "retried": res.retried,
                                  "messageId": new_txn, "newTransactionId": new_txn,
                                  "offset": res.offset})
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200


class MessageResource:
    """``DELETE /api/v1/messages/{partitionId}/{transactionId}``: drop the DLQ row(s) only.

    Every offset's rows of that transactionId (of ``?consumerGroup=`` alone if given); the log,
    cursors and leases are untouched. None: ``404``.
    """

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                        partition_id: str, transaction_id: str) -> None:
        pid = path_partition_id(partition_id)
        txn = path_transaction_id(transaction_id)
        group = Query(req.query_string).name("consumerGroup")
        tenant = tenant_of(req)
        n = await call_db(self.worker.pool, lambda conn: dlq_procs.delete(conn, tenant, pid, txn,
                                                                   group))
        if n == 0:
            raise NotFound(f"partition {pid}, transactionId {txn!r}: no dead-letter row "
                           "matches", field="transactionId")
        resp.data = orjson.dumps({"success": True, "partitionId": str(pid),
                                  "transactionId": txn, "deleted": n})
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200
