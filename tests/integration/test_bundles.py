"""The shard's bundle writer (queen_mp/db/bundles.py) against PostgreSQL: the arrays it builds
in binary form are the arrays psycopg's own dumpers send, a bundle it writes is stored as
given, a bundle past its deadline is cancelled, and a connection the server ended is
replaced."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from queen_mp.db import errors as dberrors
from queen_mp.db.binarrays import Array, register_arrays
from queen_mp.db.bundles import BundleWriter, PushBundle, bundle_params
from queen_mp.db.errors import DatabaseError
from queen_mp.metrics import Metrics
from queen_mp.shards.fusion import PushFusion
from queen_mp.wire.frames import pack_frame
from queen_mp.wire.records import PIECE_RAW, Piece, PushGroup, PushVerdict
from tests.pgharness import module_db_dsn

db_dsn = module_db_dsn  # placeholder payloads no route can decode: a database of its own

_TYPES = ("int8[]", "text[]", "text[]", "int4[]", "bytea[]", "int8[]", "bytea[]", "uuid[]")


def _bundle(tag: str, n: int) -> PushBundle:
    return PushBundle(
        queues=[f"bq-{tag}-é{i % 2}" for i in range(n)],
        partitions=[f"p-{i}-ü" if i % 3 else "" for i in range(n)],
        counts=[1 + i % 3 for i in range(n)],
        hashes=[bytes([i, 255 - i]) * 8 for i in range(n)],
        verified=[0, -1, 2**63 - 1, 7][:n] + [i for i in range(4, n)],
        blobs=[bytes(range(i % 7)) * 40 for i in range(n)],
        tenants=[uuid.UUID(int=i % 2).bytes for i in range(n)],
        pids=[0, 1, 2**63 - 1][:n] + [i for i in range(3, n)])


@pytest.mark.parametrize("n", [1, 4, 19])
def test_binary_arrays_equal_what_psycopg_sends(db, n):
    bundle = _bundle("eq", n)
    mine = [Array(data) for data in bundle_params(bundle)]  # the bytes, sent as is
    theirs = (list(bundle.pids), list(bundle.queues), list(bundle.partitions),
              list(bundle.counts),
              list(bundle.hashes), list(bundle.verified), list(bundle.blobs),
              [uuid.UUID(bytes=t) for t in bundle.tenants])
    register_arrays(db)  # as the writer's connections do
    for k, typ in enumerate(_TYPES):
        row = db.execute(f"SELECT %b::{typ} = %s::{typ}, %b::{typ}",
                         (mine[k], theirs[k], mine[k])).fetchone()
        assert row is not None
        assert row[0] is True, (typ, row[2], theirs[k])


def test_push_multi_stores_the_bundle_as_given(db, db_dsn):
    bundle = _bundle(uuid.uuid4().hex[:8], 5)
    bundle = PushBundle(bundle.queues, [f"{p}x{i}" for i, p in enumerate(bundle.partitions)],
                        [1] * 5, [uuid.uuid4().bytes for _ in range(5)], [0] * 5,
                        bundle.blobs, bundle.tenants)  # no pids: by name

    async def push() -> list:
        writer = BundleWriter(db_dsn, 1, 10_000, "test bundles")
        try:
            return await writer.push_multi(bundle)
        finally:
            await writer.close()

    verdicts = asyncio.run(push())
    assert [v.queued for v in verdicts] == [True] * 5
    for i, v in enumerate(verdicts):
        row = db.execute(
            "SELECT q.tenant, q.name, lp.name, s.msg_count, s.payload, t.hashes"
            " FROM queen.log_segments s JOIN queen.log_txns t USING (partition_id, base_offset)"
            " JOIN queen.log_partitions lp ON lp.id = s.partition_id"
            " JOIN queen.queues q ON q.id = lp.queue_id"
            " WHERE s.partition_id = %s AND s.base_offset = %s",
            (v.partition_id, v.base_offset)).fetchone()
        assert row == (uuid.UUID(bytes=bundle.tenants[i]), bundle.queues[i],
                       bundle.partitions[i], 1, bundle.blobs[i], bundle.hashes[i])


def test_a_misaligned_bundle_is_refused_by_the_database(db_dsn):
    bundle = _bundle("mis", 3)
    bundle = PushBundle(bundle.queues, bundle.partitions, bundle.counts, bundle.hashes[:2],
                        bundle.verified, bundle.blobs, bundle.tenants)

    async def push() -> None:
        writer = BundleWriter(db_dsn, 1, 10_000, "test bundles")
        try:
            await writer.push_multi(bundle)
        finally:
            await writer.close()

    with pytest.raises(DatabaseError, match="misaligned"):
        asyncio.run(push())


def _one(tag: str) -> PushBundle:
    return PushBundle([f"bq-{tag}"], ["p"], [1], [uuid.uuid4().bytes], [0], [b"x" * 40],
                      [bytes(16)])


def test_a_bundle_past_its_deadline_is_cancelled_and_the_writer_goes_on(db, db_dsn):
    """The writer's one watchdog keeps every bundle's deadline: a bundle stuck on a row lock
    fails with StatementTimeout after its connection is cancelled and quarantined; the next
    bundle gets a new connection and commits."""
    tag = uuid.uuid4().hex[:8]
    events: list[str] = []
    dberrors.on_event(events.append)

    async def run() -> tuple[BaseException, list]:
        writer = BundleWriter(db_dsn, 1, 400, "test bundles deadline")
        try:
            first = await writer.push_multi(_one(tag))  # provisions the partition
            with psycopg.connect(db_dsn) as holder:  # a transaction holding its row lock
                holder.execute("SELECT 1 FROM queen.log_partitions WHERE id = %s FOR UPDATE",
                               (first[0].partition_id,))
                with pytest.raises(dberrors.StatementTimeout) as stuck:
                    await writer.push_multi(_one(tag))
            return stuck.value, await writer.push_multi(_one(tag))
        finally:
            await writer.close()

    try:
        error, after = asyncio.run(run())
    finally:
        dberrors.on_event(None)
    assert "exceeded 0.4s" in str(error)
    assert events == ["quarantine", "cancel_sent", "statement_timeout"]
    assert [v.queued for v in after] == [True]
    # the cancelled bundle wrote nothing: offsets 1 (first) and 2 (after)
    assert after[0].base_offset == 2


def test_a_connection_the_server_ended_while_idle_is_replaced(db, db_dsn):
    """A bundle connection terminated by the server between bundles (a restart, a failover)
    is noticed before the next bundle, which goes on a new connection."""
    tag = uuid.uuid4().hex[:8]

    async def run() -> list:
        name = "test bundles idle end"
        writer = BundleWriter(db_dsn, 1, 10_000, name)
        try:
            await writer.push_multi(_one(tag))
            gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                       " WHERE application_name = %s", (name,))
            while db.execute(gone, (name,)).fetchone() != (0,):
                await asyncio.sleep(0.01)  # until the backend has exited (and closed)
            return await writer.push_multi(_one(tag))
        finally:
            await writer.close()

    assert [v.queued for v in asyncio.run(run())] == [True]


def test_an_answer_the_loop_does_not_report_is_read_by_the_watchdog(db, db_dsn):
    """A bundle whose socket input the loop never reports (its watch dropped here, as a
    PostgreSQL restart was seen to leave one) is read by the watchdog's probe about a second
    later, not left until the statement deadline (20 s here: wait_for gives up at 10)."""
    tag = uuid.uuid4().hex[:8]

    async def run() -> list:
        writer = BundleWriter(db_dsn, 1, 20_000, "test bundles probe")
        try:
            await writer.push_multi(_one(tag))  # connects and prepares: the fast path next
            loop = asyncio.get_running_loop()
            got: asyncio.Future[list] = loop.create_future()
            writer.push(_one(tag), got.set_result)  # sent at once: the connection is idle
            (channel,) = writer._channels.values()
            assert channel.gen is not None  # in flight on the watched socket
            loop.remove_reader(channel.fd)
            return await asyncio.wait_for(got, 10)
        finally:
            await writer.close()

    result = asyncio.run(run())
    assert [v.queued for v in result] == [True], result
    assert result[0].base_offset == 2


def test_the_shard_names_partitions_by_cached_ids_and_by_name_once_one_is_gone(db, db_dsn):
    """Push fusion sends the ids its verdicts gave; a partition deleted and recreated under
    its name makes the bundle fail with nothing written (STALE_IDS), and fusion sends it
    again at once by name: every group answered queued, offsets gapless in the new
    partition, the new id cached."""
    tag = uuid.uuid4().hex[:8]
    queue = f"bq-{tag}"
    replies: list[PushVerdict] = []

    def group(n: int) -> PushGroup:
        frame = pack_frame(uuid.uuid4().bytes, f"t-{n}".encode(), b"{}")
        return PushGroup(1, 0, n, 0, bytes(16), queue, "p", uuid.uuid4().bytes, 1,
                         (Piece(PIECE_RAW, 1, frame),), 0)

    async def answered(fusion: PushFusion, n: int) -> PushVerdict:
        before = len(replies)
        fusion.add(0, group(n))
        while len(replies) == before:
            await asyncio.sleep(0.005)
        return replies[-1]

    async def run() -> list[PushVerdict]:
        writer = BundleWriter(db_dsn, 1, 10_000, "test bundles ids")
        fusion = PushFusion(writer, lambda slot, rec: replies.append(PushVerdict.unpack(rec)),
                            Metrics(), bundle_max=8, max_inflight=1, hold_ms=5,
                            dedup_entries=64)
        try:
            first = await answered(fusion, 1)
            sent: list[PushBundle] = []
            push = writer.push
            writer.push = lambda bundle, done: (sent.append(bundle), push(bundle, done))
            second = await answered(fusion, 2)
            db.execute("DELETE FROM queen.log_partitions WHERE id = %s", (first.partition_id,))
            third = await answered(fusion, 3)
            assert [list(b.pids) for b in sent] == [[first.partition_id]] * 2 + [[]]
            assert fusion.pids == {(bytes(16), queue, "p"): third.partition_id}
            return [first, second, third]
        finally:
            await writer.close()

    first, second, third = asyncio.run(run())
    assert [v.status for v in (first, second, third)] == [0, 0, 0]
    assert second.partition_id == first.partition_id != third.partition_id
    assert [v.queued_run for v in (first, second, third)] == [None] * 3
    assert [v.items[0].offset for v in (first, second, third)] == [1, 2, 1]
    rows = db.execute("SELECT base_offset FROM queen.log_segments WHERE partition_id = %s",
                      (third.partition_id,)).fetchall()
    assert rows == [(1,)]


_NAMES = "SELECT name FROM pg_prepared_statements ORDER BY name"


async def _statements(writer: BundleWriter) -> list[str]:
    """The prepared statements of the writer's one connection, read on it."""
    async def work(conn) -> list[str]:
        cur = await conn.execute(_NAMES, prepare=False)
        return [r[0] for r in await cur.fetchall()]
    return await writer._run(work)


def test_the_shards_own_paths_leave_the_bundles_statement_prepared(db, db_dsn):
    """Every statement the shard runs on a bundle connection besides the bundle (the dedup
    read-backs, pipelined or not, which psycopg prepares itself: prepare_threshold=0), and a
    bundle the database refuses, leave ``qmp_push_multi_v3`` prepared: none of them makes
    psycopg send DEALLOCATE ALL (it does after a ROLLBACK, DROP, ALTER or DISCARD ALL it ran
    while holding statements of its own)."""
    tag = uuid.uuid4().hex[:8]

    async def run() -> tuple[list[str], list, list]:
        writer = BundleWriter(db_dsn, 1, 10_000, "test bundles own paths")
        try:
            first = await writer.push_multi(_one(tag))
            pid = first[0].partition_id
            for _ in range(2):
                assert (await writer.segments_at([(pid, 1), (pid, 99)]))[1] is None
                await writer.txn_hashes([(pid, 1, 2, 60)])
            bad = _bundle("mis", 2)
            with pytest.raises(DatabaseError, match="misaligned"):
                await writer.push_multi(bad._replace(hashes=bad.hashes[:1]))
            gone = _one(tag)._replace(pids=[2**62])  # a cached id that is gone: QM002
            with pytest.raises(DatabaseError) as stale:
                await writer.push_multi(gone)
            assert stale.value.sqlstate == "QM002"
            names = await _statements(writer)
            (conn,) = [db_.usable() for db_ in writer._all]
            held = list(conn._prepared._names.values())  # psycopg's own, besides ours
            return names, held, await writer.push_multi(_one(tag))
        finally:
            await writer.close()

    names, held, verdicts = asyncio.run(run())
    assert len(held) >= 2  # psycopg holds statements: a clear would have deallocated all
    assert "qmp_push_multi_v3" in names
    assert [v.queued for v in verdicts] == [True]


@pytest.mark.parametrize("statement", ["ROLLBACK", "DROP TABLE IF EXISTS qmp_no_such_table",
                                       "DISCARD ALL"])
def test_a_bundle_after_the_connections_statements_were_deallocated_prepares_again(
        db, db_dsn, statement):
    """Provoked (no shard path runs these on a bundle connection): psycopg, holding statements
    of its own, runs a ROLLBACK or a DROP and sends DEALLOCATE ALL after it (DISCARD ALL
    deallocates by itself). ``qmp_push_multi_v3`` is gone while the connection's flag says
    prepared; the next bundle prepares it again and commits."""
    tag = uuid.uuid4().hex[:8]

    async def run() -> tuple[list[str], list]:
        writer = BundleWriter(db_dsn, 1, 10_000, "test bundles deallocated")
        try:
            first = await writer.push_multi(_one(tag))
            await writer.segments_at([(first[0].partition_id, 1)])  # psycopg prepares its own

            async def run_it(conn) -> None:
                await conn.execute(statement)
            await writer._run(run_it)
            names = await _statements(writer)
            return names, [await writer.push_multi(_one(tag)) for _ in range(2)]
        finally:
            await writer.close()

    names, pushed = asyncio.run(run())
    assert "qmp_push_multi_v3" not in names  # deallocated behind the flag's back
    assert [[v.queued for v in verdicts] for verdicts in pushed] == [[True], [True]]
    assert [verdicts[0].base_offset for verdicts in pushed] == [2, 3]
