"""Calls into ``sql/functions/transaction.sql``: one ``log_transaction_wire_v1`` per transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from queen_mp.db.ack_procs import AckItem
from queen_mp.db.errors import translate
from queen_mp.wire.hashing import txn_hash

__all__ = ["Segments", "transaction_wire"]

_WIRE = ("SELECT queen.log_transaction_wire_v1(%s, %b::text[], %b::text[], %b::int4[],"
         " %b::bytea[], %b::bytea[], %b::int8[], %b::text[], %b::uuid[], %b::bytea[],"
         " %b::text[], %b::int4[], %b::text[], %s::jsonb, %b::uuid[], %s::jsonb, %s::jsonb,"
         " %b::text[])")


@dataclass(frozen=True)
class Segments:
    """One segment per (queue, partition), as log_push_multi_v1 takes them."""

    queues: list[str]
    partitions: list[str]
    counts: list[int]
    hashes: list[bytes]
    blobs: list[bytes]


async def transaction_wire(conn: psycopg.AsyncConnection[Any], tenant: bytes, seg: Segments,
                           acks: list[AckItem], ack_flat: list[int],
                           snapshots: list[dict[str, Any]], required: list[uuid.UUID],
                           kv: list[dict[str, Any]], timers: list[dict[str, Any]],
                           timer_queues: list[str]) -> dict[str, Any]:
    """The SQL verdict (success, or a rollback reason); errors leave as queen_mp.db.errors."""
    params = (
        uuid.UUID(bytes=tenant), seg.queues, seg.partitions, seg.counts, seg.hashes, seg.blobs,
        [a.partition_id for a in acks], [a.group for a in acks], [a.lease_id for a in acks],
        [txn_hash(a.transaction_id) for a in acks], [a.status for a in acks], ack_flat,
        [a.error for a in acks], orjson.dumps(snapshots).decode(), required,
        orjson.dumps(kv).decode(), orjson.dumps(timers).decode(), timer_queues)
    try:
        cur = await conn.execute(_WIRE, params)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        raise translate(ex, commit_sent=True) from ex
    assert row is not None
    return row[0]
