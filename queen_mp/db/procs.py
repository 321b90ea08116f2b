"""Named calls into the system procedures of ``queen_mp/sql/functions/system.sql`` (health,
queue flags, maintenance switches, wake peers) and the LISTEN/NOTIFY statements of the wake-up
connections (queen_mp/ipc/wakeup.py).

Every function takes an open psycopg connection (or pipeline-mode connection) and returns
plain Python values; psycopg errors are translated at this boundary by the callers' use of
``queen_mp.db.errors.translate`` (or ``queen_mp.db.connect.Dedicated``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["QueueSwitches", "health", "listen", "maintenance_flags", "notify", "queue_flags",
           "server_info", "set_maintenance", "spool_hold", "spool_view", "wake_peers"]


@dataclass(frozen=True, slots=True)
class QueueSwitches:
    """``queue_flags_v1``: what a front worker must know of a queue before building frames
    (an unknown queue answers a new queue's defaults)."""

    exists: bool
    encryption: bool


async def health(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    cur = await conn.execute("SELECT queen.health_v1()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def server_info(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """``queen.server_info_v1()``: the PostgreSQL server as the console's System page shows it."""
    cur = await conn.execute("SELECT queen.server_info_v1()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def queue_flags(conn: psycopg.AsyncConnection[Any], tenant: bytes,
                      queue: str) -> QueueSwitches:
    cur = await conn.execute("SELECT queen.queue_flags_v1(%s, %s)",
                             (uuid.UUID(bytes=tenant), queue))
    row = await cur.fetchone()
    assert row is not None
    doc = row[0]
    return QueueSwitches(bool(doc.get("exists")), bool(doc["encryption"]))


async def maintenance_flags(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """``queen.maintenance_flags_v1()``: ``{"maintenance", "popMaintenance", "version"}``, the
    document the maintenance routes answer as is."""
    cur = await conn.execute("SELECT queen.maintenance_flags_v1()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def set_maintenance(conn: psycopg.AsyncConnection[Any], kind: str,
                          enabled: bool) -> dict[str, Any]:
    """``queen.set_maintenance_v1``: set push (``kind="push"``) or pop maintenance; answers
    the flags after the change (the change NOTIFYs every instance at commit)."""
    cur = await conn.execute("SELECT queen.set_maintenance_v1(%s, %s)", (kind, enabled))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def spool_view(conn: psycopg.AsyncConnection[Any], instance: str) -> dict[str, Any]:
    """``queen.spool_view_v2``: the maintenance flags, the live spool holds and whether
    another instance listens, in one snapshot."""
    cur = await conn.execute("SELECT queen.spool_view_v2(%s)", (instance,))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def spool_hold(conn: psycopg.AsyncConnection[Any], holder: str, episode: int,
                     oldest_us: int | None, ttl_ms: int, instance: str,
                     buckets: list[int] | None = None) -> dict[str, Any]:
    """``queen.spool_hold_v2``: publish (``oldest_us``, and per bucket of partitions) or
    withdraw (None) the hold ``episode`` of ``holder`` (a spool directory); answers
    ``spool_view`` of ``instance`` read after the write, with the holders' buckets."""
    cur = await conn.execute("SELECT queen.spool_hold_v2(%s, %s, %s, %s, %s, %s::int8[])",
                             (holder, oldest_us, ttl_ms, instance, episode, buckets))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def wake_peers(conn: psycopg.AsyncConnection[Any], instance: str) -> bool:
    """``queen.wake_peers_v2``: does a wake listener of another instance listen on this
    database?"""
    cur = await conn.execute("SELECT queen.wake_peers_v2(%s)", (instance,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def notify(conn: psycopg.AsyncConnection[Any], channel: str, payload: str) -> None:
    await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def listen(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    """``LISTEN`` takes no parameter: the channel is quoted as an identifier, never pasted."""
    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
