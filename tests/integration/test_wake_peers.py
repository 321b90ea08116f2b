"""Whom a Waker's NOTIFY can reach (queen.wake_peers_v2, queen_mp/ipc/wakeup.py): a wake
listener of another instance on the same database, never one connected to another database of
the same server (NOTIFY stays in its database). The front workers' listener learns the same
from spool_view_v2's "peers"."""

from __future__ import annotations

import asyncio

import psycopg

from queen_mp.db import procs
from tests.pgharness import migrated_database


def _peers(dsn: str, instance: str) -> bool:
    async def ask() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await procs.wake_peers(conn, instance)

    return asyncio.run(ask())


def _view_peers(dsn: str, instance: str) -> bool:
    async def ask() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return bool((await procs.spool_view(conn, instance))["peers"])

    return asyncio.run(ask())


def test_only_listeners_of_this_database_are_wake_peers(pg_server_dsn, fresh_db_dsn):
    with migrated_database(pg_server_dsn) as other_dsn, psycopg.connect(
            other_dsn, autocommit=True,
            application_name="queen-mp wake listener elsewhere") as listener:
        listener.execute("LISTEN queen_wake")
        # another database's broker listens: nobody here does
        for ask in (_peers, _view_peers):
            assert not ask(fresh_db_dsn, "me")
            assert ask(other_dsn, "me")
            # its own listener is no peer of an instance
            assert not ask(other_dsn, "elsewhere")
        with psycopg.connect(fresh_db_dsn, application_name="queen-mp wake listener here"):
            for ask in (_peers, _view_peers):
                assert ask(fresh_db_dsn, "me")
                assert not ask(fresh_db_dsn, "here")
