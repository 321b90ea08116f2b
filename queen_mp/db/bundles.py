"""The shard's connections to PostgreSQL for push bundles.

A shard keeps a few connections, one per bundle in flight (the adaptive in-flight cap never
exceeds their number). A bundle is a single prepared call of ``log_push_multi_v1``, so it is one
round trip and one commit. The dedup filter's read-backs of stored hashes share the same
connections (one at a time, so bundles keep the others). Duplicate-id lookups, which come
several at a time, go through psycopg's pipeline mode: N ``log_segment_at_v1`` calls in one
round trip.

A connection the server closed while it sat idle (restart, failover) is replaced before use;
a new one follows the DSN (a multi-host DSN with ``target_session_attrs=read-write`` finds the
current primary). Connecting counts against the statement deadline.

A statement past its deadline is cancelled server-side (out-of-band cancel request) and its
connection quarantined: closed and replaced, never reused while the server may still be running
the abandoned statement and holding its locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from queen_mp.db.calls import PUSH_MULTI
from queen_mp.db.errors import DatabaseError, StatementTimeout, translate
from queen_mp.db.pooled import quiet

__all__ = ["BundleWriter", "PushBundle", "SegmentRow", "StoredHashes"]

log = logging.getLogger("queen_mp.db.bundles")

_SEGMENT_AT = "SELECT * FROM queen.log_segment_at_v1(%s::int8, %s::int8)"
_TXN_HASHES = ("SELECT * FROM queen.log_txn_hashes_v1(%b::int8[], %b::int8[], %b::int8[],"
               " %b::int4[])")

StoredHashes = list[tuple[int, float, bytes]]  # (base_offset, age in seconds, hashes)


@dataclass(frozen=True)
class PushBundle:
    """Parallel arrays, one element per segment (= per partition) of the bundle."""

    queues: Sequence[str]
    partitions: Sequence[str]
    counts: Sequence[int]
    hashes: Sequence[bytes]
    verified: Sequence[int]
    blobs: Sequence[bytes]
    tenants: Sequence[uuid.UUID]


@dataclass(frozen=True)
class SegmentRow:
    base_offset: int
    msg_count: int
    payload: bytes


class BundleWriter:
    """A fixed set of autocommit connections handed out one per bundle."""

    def __init__(self, dsn: str, size: int, statement_timeout_ms: int,
                 application_name: str) -> None:
        self.dsn = dsn
        self.size = size
        self.timeout_s = statement_timeout_ms / 1000
        self.application_name = application_name
        self._idle: asyncio.Queue[psycopg.AsyncConnection[Any] | None] = asyncio.Queue()
        for _ in range(size):
            self._idle.put_nowait(None)  # None = connect on first use

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        # NOTE(queen): the server-side statement_timeout is a backstop a little past ours, so a
        # statement whose cancel request got lost still ends.
        backstop = int(self.timeout_s * 1000) + 5000
        return await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, application_name=self.application_name,
            options=f"-c statement_timeout={backstop} -c synchronous_commit=on",
            prepare_threshold=0)

    async def _run(self, work: Any) -> Any:
        conn = await self._idle.get()
        try:
            async with asyncio.timeout(self.timeout_s):
                if conn is not None and not quiet(conn):
                    # NOTE(db): the server closed it while idle (restart, failover): reconnect
                    # now rather than fail a bundle on it.
                    with contextlib.suppress(Exception):
                        await conn.close()
                    conn = None
                if conn is None:
                    conn = await self._connect()
                result = await work(conn)
        except TimeoutError as ex:
            await _quarantine(conn)
            conn = None
            raise StatementTimeout(f"statement exceeded {self.timeout_s:.1f}s") from ex
        except psycopg.Error as ex:
            if conn is not None and (conn.closed or conn.broken):
                conn = None
            raise translate(ex) from ex
        except OSError as ex:
            conn = None
            raise translate(ex) from ex
        finally:
            self._idle.put_nowait(conn)
        return result

    async def push_multi(self, bundle: PushBundle) -> list[dict[str, Any]]:
        """One transaction for every segment; results in input order."""
        params = (list(bundle.queues), list(bundle.partitions), list(bundle.counts),
                  list(bundle.hashes), list(bundle.verified), list(bundle.blobs),
                  list(bundle.tenants))

        async def work(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
            cur = await conn.execute(PUSH_MULTI, params, prepare=True)
            row = await cur.fetchone()
            if row is None or not isinstance(row[0], list):
                raise DatabaseError(f"log_push_multi_v1 returned {row!r}")
            return row[0]

        return await self._run(work)

    async def segments_at(self, lookups: Sequence[tuple[int, int]]) -> list[SegmentRow | None]:
        """Covering segment of each (partition_id, offset); None where retention removed it."""

        async def work(conn: psycopg.AsyncConnection[Any]) -> list[SegmentRow | None]:
            async with conn.pipeline():
                cursors = [await conn.execute(_SEGMENT_AT, (pid, off)) for pid, off in lookups]
            out: list[SegmentRow | None] = []
            for cur in cursors:
                row = await cur.fetchone()
                out.append(None if row is None else SegmentRow(row[0], row[1], bytes(row[3])))
            return out

        return await self._run(work)

    async def txn_hashes(self, asks: Sequence[tuple[int, int, int, int]]
                         ) -> list[StoredHashes]:
        """Per (partition_id, lo, below, seconds): the stored hash blobs of offsets ``lo ..
        below - 1`` committed in the last ``seconds``, ascending offset."""
        params = tuple([a[k] for a in asks] for k in range(4))

        async def work(conn: psycopg.AsyncConnection[Any]) -> list[StoredHashes]:
            # binary: the blobs come as they are stored, not hex-encoded
            cur = await conn.execute(_TXN_HASHES, params, binary=True)
            out: list[StoredHashes] = [[] for _ in asks]
            for k, base, age, hashes in await cur.fetchall():
                out[k - 1].append((base, age, bytes(hashes)))
            return out

        return await self._run(work)

    async def close(self) -> None:
        while not self._idle.empty():
            conn = self._idle.get_nowait()
            if conn is not None:
                await conn.close()


async def _quarantine(conn: psycopg.AsyncConnection[Any] | None) -> None:
    """Cancel whatever the server still runs for ``conn``, then drop the connection."""
    if conn is None:
        return
    try:
        await asyncio.wait_for(conn.cancel_safe(), 5)
    except Exception as ex:
        log.warning("cancel request failed: %s", ex)
    with contextlib.suppress(Exception):
        await conn.close()
