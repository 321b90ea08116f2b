"""queen_mp.db.prepared.pooled_rows on a real connection: prepared once, rows loaded as a
cursor loads them, errors as psycopg raises them, a cursor between calls, and a cancelled
call, which leaves the connection to be closed by the pool."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from queen_mp.db.prepared import PreparedCall, pooled_rows

ROWS = PreparedCall("test_pooled_rows", "SELECT g, $1::text, $2::bytea, $3::timestamptz, NULL::int8"
                    " FROM generate_series(1, $4::int4) g", 4, binary_result=True)
DIV = PreparedCall("test_pooled_div", "SELECT 1 / $1::int4", 1, binary_result=True)
SLEEP = PreparedCall("test_pooled_sleep", "SELECT pg_sleep($1::int4)", 1)

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
T0_BIN = ((T0 - dt.datetime(2000, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
          ).to_bytes(8, "big")


async def _connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, options="-c TimeZone=UTC")


def test_rows_come_back_typed_and_the_statement_is_prepared_once(pg_server_dsn: str) -> None:
    async def run() -> None:
        conn = await _connect(pg_server_dsn)
        try:
            params = [b"q", b"\x00\xff", T0_BIN, (2).to_bytes(4, "big")]
            rows = await pooled_rows(conn, ROWS, params)
            assert rows == [(1, "q", b"\x00\xff", T0, None), (2, "q", b"\x00\xff", T0, None)]
            channel = conn._queen_channel  # type: ignore[attr-defined]
            assert await pooled_rows(conn, ROWS, [None, None, None, (0).to_bytes(4, "big")]) == []
            assert conn._queen_channel is channel  # type: ignore[attr-defined]
            cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements"
                                     " WHERE name = 'test_pooled_rows'")
            assert await cur.fetchone() == (1,)
            # a cursor's answer on the watched socket ends the watch (or, read before the
            # watch saw it, leaves it waiting for nothing): the next call works either way
            rows = await pooled_rows(conn, ROWS, [b"r", b"", T0_BIN, (1).to_bytes(4, "big")])
            assert rows == [(1, "r", b"", T0, None)]
        finally:
            await conn.close()

    asyncio.run(run())


def test_a_failed_call_raises_psycopgs_error_and_leaves_the_connection_usable(
        pg_server_dsn: str) -> None:
    async def run() -> None:
        conn = await _connect(pg_server_dsn)
        try:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await pooled_rows(conn, DIV, [(0).to_bytes(4, "big")])
            assert conn.pgconn.transaction_status == TransactionStatus.IDLE
            assert await pooled_rows(conn, DIV, [(1).to_bytes(4, "big")]) == [(1,)]
        finally:
            await conn.close()

    asyncio.run(run())


def test_a_cancelled_call_leaves_its_statement_in_flight(pg_server_dsn: str) -> None:
    """The pool closes a connection returned with a statement in flight (ACTIVE)."""
    async def run() -> None:
        conn = await _connect(pg_server_dsn)
        try:
            call = asyncio.ensure_future(pooled_rows(conn, SLEEP, [(5).to_bytes(4, "big")]))
            await asyncio.sleep(0.2)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert conn.pgconn.transaction_status == TransactionStatus.ACTIVE
            assert conn._queen_channel.closed  # type: ignore[attr-defined]
        finally:
            await conn.close()

    asyncio.run(run())
