"""The dead-letter queue (docs/api.md 2.8): list, replay and delete rows filed by the ack path.

=======================================================================  =======================
``GET    /api/v1/dlq?queue=&consumerGroup=&partition=&from=&to=&limit=&offset=``  ``DlqResource``
``POST   /api/v1/messages/{partitionId}/{transactionId}/retry?consumerGroup=``  ``RetryResource``
``DELETE /api/v1/messages/{partitionId}/{transactionId}?consumerGroup=``  ``MessageResource``
=======================================================================  =======================

A row keeps the payload **snapshot** exactly as the frame stored it (ciphertext on an encrypted
queue); the listing decrypts it into ``data``. A replay is a re-push, not a revival
(ack-internals "Filing the DLQ row"): the broker reads the row (``dlq_find_v1``), builds one
frame with a fresh UUIDv7 message id whose text is also the new transactionId (so dedup cannot
swallow it), keeps the row's traceId and producerSub, packs it as one zstd chunk with its
xxh3_128 hash, and ``dlq_retry_v1`` deletes the rows and pushes the segment to the tail of the
partition through the one allocator, in one transaction. Pops parked on the queue are woken.

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
from queen_mp.db.dlq_procs import DlqRow, RetryResult
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.dbcall import call_db
from queen_mp.http.errors import (
    JSON_UTF8,
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

__all__ = ["DlqResource", "MessageResource", "RetryResource"]

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


def _render(row: DlqRow, cipher: PayloadCipher | None) -> dict[str, Any]:
    return {"id": uuid_text(row.message_id), "transactionId": row.transaction_id,
            "partitionId": str(row.partition_id), "queue": row.queue,
            "partition": row.partition, "offset": row.offset,
            "consumerGroup": row.consumer_group, "errorMessage": row.error,
            "retryCount": row.retry_count, "data": _data(row, cipher),
            "producerSub": row.producer_sub, "createdAt": iso_ms(row.created_at),
            "failedAt": iso_ms(row.failed_at)}


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


# --------------------------------------------------------------------------------- resources
class DlqResource:
    """``GET /api/v1/dlq``: one page of dead letters and the total count of matches."""

    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        q = Query(req.query_string)
        queue = q.name("queue")
        group = q.name("consumerGroup")
        partition = q.name("partition", slash_ok=True)
        since, until = q.time("from"), q.time("to")
        limit = q.integer("limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
        offset = q.integer("offset", 0, minimum=0, maximum=(1 << 63) - 1)
        tenant = tenant_of(req)
        page = await call_db(self.worker.pool, lambda conn: dlq_procs.list_page(
            conn, tenant, queue=queue, group=group, partition=partition, since=since,
            until=until, limit=limit, offset=offset))
        cipher = self.worker.cipher
        body = {"messages": [_render(r, cipher) for r in page.rows], "total": page.total,
                "pagination": {"limit": limit, "offset": offset}}
        resp.data = orjson.dumps(body)
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200


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
            row = rows[0]
            message_id = uuid7()
            new_txn = uuid_text(message_id)
            payload, encrypted = _replay_payload(row, cipher)
            frame = pack_frame(message_id, new_txn.encode("ascii"), payload,
                               trace_id=row.trace_id, producer_sub=row.producer_sub,
                               encrypted=encrypted)
            res = await dlq_procs.retry(conn, tenant, pid, txn, row.offset, group,
                                        pack_chunk_zstd(frame, 1), txn_hash(new_txn))
            return message_id, res

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
