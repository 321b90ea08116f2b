"""What the named calls of queen_mp/db share: the tenant as the uuid the procedures take, a
set-returning procedure's answer as dict rows, with psycopg errors translated at this boundary,
and the push bundle statement that both the shards and the timer firer send.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from queen_mp.db.errors import translate

__all__ = ["PUSH_MULTI", "fetch_rows", "tenant_uuid"]

# PERF(queen): arrays go in binary (%b): psycopg's text form hex-escapes every bytea element
# and runs a quoting regex over the result, 47 ms per MB of segment blobs against 0.9 ms.
PUSH_MULTI = ("SELECT queen.log_push_multi_v1(%b::text[], %b::text[], %b::int4[], %b::bytea[],"
              " %b::int8[], %b::bytea[], %b::uuid[])")


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
