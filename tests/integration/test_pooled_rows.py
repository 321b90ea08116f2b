"""queen_mp.db.prepared.pooled_rows on a real connection: prepared once, rows loaded as a
cursor loads them, errors as psycopg raises them, a cursor between calls, a cancelled call,
which leaves the connection to be closed by the pool, and the pop's claim on a pooled
connection whose statements psycopg deallocated (DEALLOCATE ALL after a ROLLBACK or DROP)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from queen_mp.db import pop_procs
from queen_mp.db.bundles import BundleWriter, PushBundle
from queen_mp.db.connect import make_pool
from queen_mp.db.prepared import PreparedCall, pooled_rows
from tests.pgharness import module_db_dsn

db_dsn = module_db_dsn  # placeholder payloads no route can decode: a database of its own

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


_NAMES = "SELECT name FROM pg_prepared_statements ORDER BY name"


async def _names(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(_NAMES, prepare=False)
    return [r[0] for r in await cur.fetchall()]


@pytest.mark.parametrize("statement", ["ROLLBACK", "DROP TABLE IF EXISTS qmp_no_such_table",
                                       "DISCARD ALL", None])
def test_a_claim_after_psycopg_deallocated_the_connections_statements(
        db_dsn: str, statement: str | None) -> None:
    """A pooled connection claims (``queen_log_pop_v3`` prepared by hand), psycopg prepares a
    statement of its own there, then a ``transaction()`` left by an exception (ROLLBACK) or a
    DROP makes psycopg send DEALLOCATE ALL (a DISCARD ALL deallocates by itself; None: no
    such statement, the claim's statement stays): the next claims prepare again and claim."""
    queue = f"pr-{uuid.uuid4().hex[:8]}"
    request = pop_procs.PopRequest(
        tenant=bytes(16), queue=queue, partition=None, namespace=None, task=None,
        group="__QUEUE_MODE__", batch=1, partitions=1, wait=False, timeout_ms=0,
        auto_ack=True, sub_mode="all", sub_from=None)

    async def run() -> tuple[list[str], list[str], list[pop_procs.ClaimResult]]:
        writer = BundleWriter(db_dsn, 1, 10_000, "test pooled push")
        try:
            for k in range(3):
                await writer.push_multi(PushBundle([queue], ["p"], [1], [uuid.uuid4().bytes],
                                                   [0], [b"m%d" % k], [bytes(16)]))
        finally:
            await writer.close()
        pool = make_pool(db_dsn, application_name="test pooled claim", min_size=1,
                         max_size=1, name="test-pooled-claim", timeout=10,
                         reconnect_timeout=10)
        await pool.open(wait=True)
        try:
            async with pool.connection() as conn:
                claims = [await pop_procs.claim(conn, request, None, 30_000)]
                await (await conn.execute("SELECT %s::int4", (1,), prepare=True)).fetchone()
                if statement == "ROLLBACK":
                    with pytest.raises(ZeroDivisionError):
                        async with conn.transaction():
                            await conn.execute("SELECT 1")
                            raise ZeroDivisionError
                elif statement is not None:
                    await conn.execute(statement)
                after = await _names(conn)
                claims += [await pop_procs.claim(conn, request, None, 30_000) for _ in (1, 2)]
                return after, await _names(conn), claims
        finally:
            await pool.close()

    after, again, claims = asyncio.run(run())
    if statement is None:
        assert "queen_log_pop_v3" in after and len(after) >= 2
    else:
        assert "queen_log_pop_v3" not in after  # deallocated behind the flag's back
    assert "queen_log_pop_v3" in again
    assert [[(c.start, c.end) for c in r.claims] for r in claims] == [[(1, 1)], [(2, 2)],
                                                                       [(3, 3)]]
    assert [r.claims[0].segments[0][2] for r in claims] == [b"m0", b"m1", b"m2"]
