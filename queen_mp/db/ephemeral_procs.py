"""Named calls into sql/functions/ephemeral.sql (docs/api.md "Ephemeral queues").

Each call is one autocommit statement, so one transaction on the UNLOGGED tables of
schema/008 (no WAL flush at commit). Inputs are the validated records of
``queen_mp.models.ephemeral``. Failures: ``QueueFull`` (SQLSTATE QE001: the queue is at its
bounds and its policy is ``reject``; nothing was written), otherwise the
``queen_mp.db.errors`` tree (a lost connection during a write is ``OutcomeUnknown``).
psycopg errors do not leave this module.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from queen_mp.db.errors import translate

__all__ = ["SQLSTATE_QUEUE_FULL", "AckOutcome", "PopOutcome", "QueueFull", "ack", "configure",
           "delete", "depth", "list_queues", "options", "pop", "push", "reset"]

Conn = psycopg.AsyncConnection[Any]

SQLSTATE_QUEUE_FULL = "QE001"


class QueueFull(Exception):
    """The push was refused whole: the queue is full (policy reject) or the push is larger
    than the queue's bounds."""


@dataclass(frozen=True, slots=True)
class PopOutcome:
    messages: bytes  # the JSON array of the answer's messages, payloads verbatim
    claimed: int
    wake_in_ms: int | None  # nothing claimed: when a lease of the group expires (None: none)


@dataclass(frozen=True, slots=True)
class AckOutcome:
    results: list[dict[str, Any]]  # [{id, outcome}] in input order
    redelivered: int  # how many became claimable again (wake parked pops)


async def _one(conn: Conn, sql: str, params: tuple[Any, ...], *, writes: bool) -> Any:
    try:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    except psycopg.Error as ex:
        if ex.sqlstate == SQLSTATE_QUEUE_FULL:
            raise QueueFull(ex.diag.message_detail or "queue_full") from None
        raise translate(ex, commit_sent=writes) from ex
    assert row is not None
    return row


def _tenant(tenant: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=tenant)


async def configure(conn: Conn, tenant: bytes, queue: str, opts: dict[str, Any]
                    ) -> dict[str, Any]:
    row = await _one(conn, "SELECT queen.eph_configure_v1(%s, %s, %s::jsonb)::text",
                     (_tenant(tenant), queue, orjson.dumps(opts).decode()), writes=True)
    return orjson.loads(row[0])


async def options(conn: Conn, tenant: bytes, queue: str) -> dict[str, Any]:
    """The effective options of a queue (defaults and its declaration)."""
    row = await _one(conn, "SELECT queen.eph_options_v1(%s, %s)::text",
                     (_tenant(tenant), queue), writes=False)
    return orjson.loads(row[0])


async def push(conn: Conn, tenant: bytes, queue: str, partition: str,
               payloads: tuple[str, ...]) -> int:
    row = await _one(conn, "SELECT queen.eph_push_v1(%s, %s, %s, %s)",
                     (_tenant(tenant), queue, partition, list(payloads)), writes=True)
    return int(row[0])


async def pop(conn: Conn, tenant: bytes, queue: str, partition: str | None, group: str,
              batch: int, auto_ack: bool) -> PopOutcome:
    row = await _one(conn, "SELECT messages, claimed, wake_in_ms "
                           "FROM queen.eph_pop_v1(%s, %s, %s, %s, %s, %s)",
                     (_tenant(tenant), queue, partition, group, batch, auto_ack), writes=True)
    return PopOutcome(row[0].encode(), int(row[1]), row[2])


async def ack(conn: Conn, tenant: bytes, queue: str, group: str, ids: tuple[str, ...],
              statuses: tuple[str, ...], epochs: list[str | None], seqs: list[int | None],
              deliveries: list[int | None]) -> AckOutcome:
    """``ids`` parsed by ``models.ephemeral.parse_id`` into ``epochs``, ``seqs``,
    ``deliveries``."""
    row = await _one(conn, "SELECT outcomes, redelivered "
                           "FROM queen.eph_ack_v2(%s, %s, %s, %s, %s, %s::int8[], %s)",
                     (_tenant(tenant), queue, group, epochs, seqs, deliveries, list(statuses)),
                     writes=True)
    return AckOutcome([{"id": i, "outcome": o} for i, o in zip(ids, row[0], strict=True)],
                      int(row[1]))


async def reset(conn: Conn, tenant: bytes, queue: str) -> int:
    row = await _one(conn, "SELECT queen.eph_reset_v1(%s, %s)", (_tenant(tenant), queue),
                     writes=True)
    return int(row[0])


async def delete(conn: Conn, tenant: bytes, queue: str) -> dict[str, Any]:
    row = await _one(conn, "SELECT queen.eph_delete_v1(%s, %s)::text",
                     (_tenant(tenant), queue), writes=True)
    return orjson.loads(row[0])


async def list_queues(conn: Conn, tenant: bytes, limit: int) -> dict[str, Any]:
    row = await _one(conn, "SELECT queen.eph_list_v1(%s, %s)::text", (_tenant(tenant), limit),
                     writes=False)
    return orjson.loads(row[0])


async def depth(conn: Conn, tenant: bytes, queue: str, limit: int) -> dict[str, Any] | None:
    row = await _one(conn, "SELECT queen.eph_depth_v1(%s, %s, %s)::text",
                     (_tenant(tenant), queue, limit), writes=False)
    return None if row[0] is None else orjson.loads(row[0])
