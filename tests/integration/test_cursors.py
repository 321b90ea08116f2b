"""queen_mp.db.cursors on a real connection: one reused cursor per connection and format, its
result dropped after each call, and usable again after a statement failed."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from queen_mp.db import cursors


async def _connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


def test_calls_share_one_cursor_per_format_and_keep_no_result(pg_server_dsn: str) -> None:
    async def run() -> None:
        conn = await _connect(pg_server_dsn)
        try:
            row = await cursors.fetch_one(conn, "SELECT g FROM generate_series(1, %s) g",
                                          (3,), prepare=True)
            assert row == (1,)
            text_cur = conn._queen_text_cursor  # type: ignore[attr-defined]
            assert text_cur.pgresult is None  # the 3 rows are not held until the next call
            one = await cursors.fetch_one(conn, "SELECT %s::bytea", (b"\x00\xff",),
                                          binary=True)
            assert one == (b"\x00\xff",)
            bin_cur = conn._queen_binary_cursor  # type: ignore[attr-defined]
            assert bin_cur is not text_cur and bin_cur.pgresult is None
            assert await cursors.fetch_one(conn, "SELECT 1 WHERE false", ()) is None
            assert conn._queen_text_cursor is text_cur  # type: ignore[attr-defined]
        finally:
            await conn.close()

    asyncio.run(run())


def test_a_failed_statement_leaves_the_cursor_usable(pg_server_dsn: str) -> None:
    async def run() -> None:
        conn = await _connect(pg_server_dsn)
        try:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await cursors.fetch_one(conn, "SELECT 1 / %s", (0,), prepare=True)
            assert await cursors.fetch_one(conn, "SELECT 1 / %s", (1,), prepare=True) == (1,)
        finally:
            await conn.close()

    asyncio.run(run())
