"""What the named calls of queen_mp/db share: the tenant as the uuid the procedures take, and a
set-returning procedure's answer as dict rows, with psycopg errors translated at this boundary.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from queen_mp.db.errors import translate

__all__ = ["fetch_rows", "tenant_uuid"]


def tenant_uuid(tenant: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=tenant)


async def fetch_rows(conn: psycopg.AsyncConnection[Any], query: str,
                     params: Sequence[Any]) -> list[dict[str, Any]]:
    try:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchall()
    except psycopg.Error as ex:
        raise translate(ex) from ex
