"""The shard's connections to PostgreSQL for push bundles.

A shard keeps a few connections, one per bundle in flight (the adaptive in-flight cap never
exceeds their number). A bundle is a single prepared call of ``log_push_multi_v3``, so it is one
round trip and one commit; it names each partition by the id its caller cached (0: unknown,
the names are resolved), and fails with ``STALE_IDS`` when a cached id is gone. The dedup
filter's read-backs of stored hashes share the same connections (one at a time, so bundles
keep the others). Duplicate-id lookups, which come several at a time, go through psycopg's
pipeline mode: N ``log_segment_at_v1`` calls in one round trip.

Each connection is a ``queen_mp.db.connect.Dedicated``: pinned to ``synchronous_commit=on``,
replaced before use when the server closed it while it sat idle (restart, failover), a new one
following the DSN (a multi-host DSN with ``target_session_attrs=read-write`` finds the current
primary). Connecting counts against the statement deadline. A statement past its deadline is
cancelled server-side (out-of-band cancel request) and its connection quarantined: closed and
replaced, never reused while the server may still be running the abandoned statement and
holding its locks.

A bundle's parameters go as arrays already in PostgreSQL's binary form
(``queen_mp.db.binarrays``).

A bundle's answer, one int8[] asked in binary, is decoded into one ``SegmentVerdict`` per segment
(``queen_mp.db.calls``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, NamedTuple, TypeVar

import psycopg

from queen_mp.db.binarrays import (
    bytea_data,
    int4_array,
    int4_data,
    int8_array,
    int8_data,
    int8_values,
    register_arrays,
    text_data,
    uuid_data,
)
from queen_mp.db.calls import Segment, SegmentVerdict, segment_verdicts
from queen_mp.db.connect import Conn, Dedicated
from queen_mp.db.errors import DatabaseError, translate
from queen_mp.db.prepared import Channel, PreparedCall, first_value

__all__ = ["STALE_IDS", "BundleWriter", "PushBundle", "Segment", "SegmentVerdict",
           "StoredHashes", "bundle_params"]

T = TypeVar("T")

log = logging.getLogger("queen_mp.bundles")

_SEGMENT_AT = "SELECT * FROM queen.log_segment_at_v1(%s::int8, %s::int8)"
_TXN_HASHES = ("SELECT * FROM queen.log_txn_hashes_v1(%b::int8[], %b::int8[], %b::int8[],"
               " %b::int4[])")

# PERF(queen): the bundle's statement through libpq's prepared call (queen_mp/db/prepared.py),
# not a cursor; the timer firer's (calls.PUSH_MULTI) with the cached partition ids in front.
# Its int8[] answer comes in binary: struct unpacks it, no text to parse.
_PUSH = PreparedCall("qmp_push_multi_v3",
                     "SELECT queen.log_push_multi_v3($1::int8[], $2::text[], $3::text[],"
                     " $4::int4[], $5::bytea[], $6::int8[], $7::bytea[], $8::uuid[])",
                     8, binary_result=True)
#: SQLSTATE of a bundle that named a partition by a cached id that is gone (deleted, perhaps
#: recreated under its name): nothing was written; name the bundle's partitions again.
STALE_IDS = "QM002"

#: a bundle in flight this long has its socket probed by the watchdog (``Channel.probe``)
_PROBE_S = 1.0

StoredHashes = list[tuple[int, float, bytes]]  # (base_offset, age in seconds, hashes)
Done = Callable[[Any], None]  # a bundle's verdicts (list[SegmentVerdict]) or its exception


class PushBundle(NamedTuple):
    """Parallel arrays, one element per segment (= per partition) of the bundle.

    PERF(queen): a NamedTuple, one a bundle: a frozen dataclass set its seven fields through
    ``object.__setattr__``."""

    queues: Sequence[str]
    partitions: Sequence[str]
    counts: Sequence[int]
    hashes: Sequence[bytes]
    verified: Sequence[int]
    blobs: Sequence[bytes]
    tenants: Sequence[bytes]  # 16 bytes each
    # each partition's id as an earlier verdict gave it, 0 if unknown (any 0: all by name)
    pids: Sequence[int] = ()


_NO_TEXT = text_data(())
_NO_UUID = uuid_data(())


def bundle_params(bundle: PushBundle) -> list[bytes]:
    """The eight arrays of ``log_push_multi_v3`` in binary form, in its parameter order (no
    ``pids``: zeros).

    PERF(queen): a bundle whose every partition has its id goes without names and tenants
    (empty arrays; the statement resolves none): three arrays less to build and parse."""
    pids = bundle.pids
    if pids and 0 not in pids:
        return [int8_data(pids), _NO_TEXT, _NO_TEXT, int4_data(bundle.counts),
                bytea_data(bundle.hashes), int8_data(bundle.verified),
                bytea_data(bundle.blobs), _NO_UUID]
    return [int8_data(pids or [0] * len(bundle.queues)),
            text_data(bundle.queues), text_data(bundle.partitions),
            int4_data(bundle.counts), bytea_data(bundle.hashes),
            int8_data(bundle.verified), bytea_data(bundle.blobs),
            uuid_data(bundle.tenants)]


def _configure(conn: Conn) -> None:
    # PERF(queen): the read-back's arrays, built by binarrays (psycopg's dumpers of lists ran
    # Python per element). The bundle's own arrays go as bytes through ``_PUSH``.
    register_arrays(conn)


class BundleWriter:
    """A fixed set of autocommit connections handed out one per bundle.

    PERF(queen): a bundle is sent by ``push`` and answered through a callback, from the
    loop's watch of its connection's socket (``queen_mp.db.prepared.Channel``, made once per
    connection): no Task, no future and no timer of its own. The statement deadline of every
    bundle in flight is kept by one watchdog timer, armed for the oldest bundle's deadline
    (``_PROBE_S`` from then at the latest, to probe sockets the loop left unreported) when
    none is armed (an ``asyncio.timeout`` cost 27k instructions a bundle, a Task 19k).
    A connection that must (re)connect or prepare first takes the coroutine path, under
    ``Dedicated.run``.
    """

    def __init__(self, dsn: str, size: int, statement_timeout_ms: int,
                 application_name: str) -> None:
        self.dsn = dsn
        self.size = size
        self.timeout_s = statement_timeout_ms / 1000
        self.application_name = application_name
        self._all = [Dedicated(dsn, application_name=application_name,
                               statement_timeout_ms=statement_timeout_ms, prepare_threshold=0,
                               configure=_configure)
                     for _ in range(size)]  # each connects on first use
        self._idle = list(reversed(self._all))  # popped from the end: the first one first
        self._wanting: deque[Callable[[Dedicated], None]] = deque()
        self._flights: dict[_Bundle, None] = {}  # in flight, oldest (first deadline) first
        self._channels: dict[Dedicated, Channel] = {}
        self._watchdog: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ connections
    def _acquire(self, use: Callable[[Dedicated], None]) -> None:
        if self._idle:
            use(self._idle.pop())
        else:
            self._wanting.append(use)

    def _release(self, db: Dedicated) -> None:
        if self._wanting:
            self._wanting.popleft()(db)
        else:
            self._idle.append(db)

    async def _run(self, work: Callable[[Conn], Awaitable[T]]) -> T:
        loop = asyncio.get_running_loop()
        got: asyncio.Future[Dedicated] = loop.create_future()

        def use(db: Dedicated) -> None:
            if got.cancelled():
                self._release(db)
            else:
                got.set_result(db)

        self._acquire(use)
        db = await got
        try:
            return await db.run(work)
        finally:
            self._release(db)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ bundles
    def push(self, bundle: PushBundle, done: Done) -> None:
        """Send one bundle (one transaction for every segment); ``done`` gets one verdict per
        segment in input order, or the exception it failed with (a ``DatabaseError``, or
        anything else for a bug), once, from a loop callback."""
        params = bundle_params(bundle)
        n = len(bundle.queues)
        self._acquire(lambda db: self._start(db, params, n, done))

    async def push_multi(self, bundle: PushBundle) -> list[SegmentVerdict]:
        """``push``, awaited."""
        got: asyncio.Future[list[SegmentVerdict]] = asyncio.get_running_loop().create_future()

        def done(result: list[SegmentVerdict] | Exception) -> None:
            if not got.done():
                if isinstance(result, list):
                    got.set_result(result)
                else:
                    got.set_exception(result)

        self.push(bundle, done)
        return await got

    def _start(self, db: Dedicated, params: list[bytes], n: int, done: Done) -> None:
        conn = db.usable()
        channel = self._channels.get(db)
        if channel is not None and (channel.closed or channel.conn is not conn):
            channel.close()  # its connection was replaced, or spoke while idle
            del self._channels[db]
            channel = None
        if conn is None or not _PUSH.prepared(conn):
            self._spawn(self._push_slowly(db, params, n, done))
            return
        loop = asyncio.get_running_loop()
        try:
            if channel is None:
                channel = self._channels[db] = Channel(loop, conn)
            _PUSH.send(conn, params)
        except Exception as ex:  # the connection is given back whatever failed here
            self._release(db)
            loop.call_soon(done, db.failed(ex) if isinstance(ex, psycopg.Error)
                           else translate(ex) if isinstance(ex, OSError) else ex)
            return
        now = loop.time()
        call = _Bundle(self, db, channel, params, n, done, now + self.timeout_s)
        self._flights[call] = None
        if self._watchdog is None:
            self._watchdog = loop.call_at(min(call.deadline, now + _PROBE_S), self._expire)
        channel.call(call.landed)

    async def _push_slowly(self, db: Dedicated, params: list[bytes], n: int,
                           done: Done) -> None:
        """The first bundle of a connection, or one whose statement was deallocated behind
        its flag (``PreparedCall.lost``): connect and prepare, under ``Dedicated.run``."""
        try:
            answer = await db.run(lambda conn: _PUSH.first(conn, params))
            result: list[SegmentVerdict] | Exception = _verdicts(answer, n)
        except Exception as ex:
            result = ex
        finally:
            self._release(db)
        done(result)

    def _landed(self, call: _Bundle, results: Any) -> None:
        if call not in self._flights:
            return  # past its deadline: quarantined and answered
        del self._flights[call]
        db = call.db
        result: list[SegmentVerdict] | Exception
        try:
            if isinstance(results, BaseException):
                raise results
            result = _verdicts(first_value(results, call.channel.conn.pgconn), call.n)
        except psycopg.Error as ex:
            if _PUSH.lost(call.channel.conn, ex):
                # NOTE(db): nothing ran: the same bundle again, prepared first
                self._spawn(self._push_slowly(db, call.params, call.n, call.done))
                return
            result = db.failed(ex)
        except DatabaseError as ex:
            result = ex
        except OSError as ex:
            # NOTE(db): as Dedicated.run: the socket failed, the connection is not reused
            self._spawn(db.drop())
            result = translate(ex)
        except Exception as ex:  # a bug: the caller logs it
            result = ex
        self._release(db)
        call.done(result)

    def _expire(self) -> None:
        """Quarantine the connection of every bundle past its deadline; probe the sockets of
        those in flight for ``_PROBE_S`` or more (``Channel.probe``); re-arm for the oldest
        one left, ``_PROBE_S`` from now at the latest."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        flights = self._flights
        while flights:
            call = next(iter(flights))
            if call.deadline > now:
                break
            del flights[call]
            call.channel.abandon()
            self._spawn(self._overrun(call))
        sent_before = now - _PROBE_S + self.timeout_s  # deadline = sent + timeout_s
        for call in [c for c in flights if c.deadline <= sent_before]:
            if call.channel.probe():
                log.warning("a push bundle's answer waited %.1f s for the loop to report "
                            "its socket readable; read by the watchdog",
                            now - call.deadline + self.timeout_s)
        if flights:
            oldest = next(iter(flights)).deadline
            self._watchdog = loop.call_at(min(oldest, now + _PROBE_S), self._expire)

    async def _overrun(self, call: _Bundle) -> None:
        try:
            error: Exception = await call.db.overrun()
        except Exception as ex:
            error = ex
        finally:
            self._release(call.db)
        call.done(error)

    async def segments_at(self, lookups: Sequence[tuple[int, int]]) -> list[Segment | None]:
        """Covering segment of each (partition_id, offset); None where retention removed it."""

        async def work(conn: Conn) -> list[Segment | None]:
            async with conn.pipeline():
                cursors = [await conn.execute(_SEGMENT_AT, (pid, off)) for pid, off in lookups]
            out: list[Segment | None] = []
            for cur in cursors:
                row = await cur.fetchone()
                out.append(None if row is None
                           else Segment(row[0], row[1], row[2], bytes(row[3])))
            return out

        return await self._run(work)

    async def txn_hashes(self, asks: Sequence[tuple[int, int, int, int]]
                         ) -> list[StoredHashes]:
        """Per (partition_id, lo, below, seconds): the stored hash blobs of offsets ``lo ..
        below - 1`` committed in the last ``seconds``, ascending offset."""
        params = (int8_array([a[0] for a in asks]), int8_array([a[1] for a in asks]),
                  int8_array([a[2] for a in asks]), int4_array([a[3] for a in asks]))

        async def work(conn: Conn) -> list[StoredHashes]:
            # binary: the blobs come as they are stored, not hex-encoded
            cur = await conn.execute(_TXN_HASHES, params, binary=True)
            out: list[StoredHashes] = [[] for _ in asks]
            for k, base, age, hashes in await cur.fetchall():
                out[k - 1].append((base, age, bytes(hashes)))
            return out

        return await self._run(work)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        for db in self._all:
            await db.drop()


class _Bundle:
    """One bundle in flight on a connection of the writer."""

    __slots__ = ("channel", "db", "deadline", "done", "n", "params", "writer")

    def __init__(self, writer: BundleWriter, db: Dedicated, channel: Channel,
                 params: list[bytes], n: int, done: Done, deadline: float) -> None:
        self.writer = writer
        self.db = db
        self.channel = channel
        self.params = params  # sent again if the statement was deallocated (``_PUSH.lost``)
        self.n = n
        self.done = done
        self.deadline = deadline

    def landed(self, results: Any) -> None:
        self.writer._landed(self, results)


def _verdicts(answer: bytes | None, n: int) -> list[SegmentVerdict]:
    if answer is None:
        raise DatabaseError("log_push_multi_v3 returned no row")
    try:
        values = int8_values(answer)
    except ValueError as ex:
        raise DatabaseError(f"log_push_multi_v3: {ex}") from ex
    return segment_verdicts(values, n)
