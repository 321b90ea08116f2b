"""Named calls into the stored procedures of ``sql/``; the only place Python names them.

Every function takes an open psycopg connection (or pipeline-mode connection) and returns
plain Python values; psycopg errors are translated at this boundary by the callers' use of
``queen_mp.db.errors.translate``.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

__all__ = ["health", "queue_flags"]


async def health(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    cur = await conn.execute("SELECT queen.health_v1()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def queue_flags(conn: psycopg.AsyncConnection[Any], tenant: bytes,
                      queue: str) -> dict[str, Any]:
    cur = await conn.execute("SELECT queen.queue_flags_v1(%s, %s)",
                             (uuid.UUID(bytes=tenant), queue))
    row = await cur.fetchone()
    assert row is not None
    return row[0]
