"""``FrontWorker.grant_leases``: the grant a pop posts to its partition's ack shard names the
lease the pop answered, by the lease's 16 bytes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

from queen_mp.db.pop_procs import Claim
from queen_mp.front.worker import FrontWorker
from queen_mp.wire.hashing import txn_hash_bytes
from queen_mp.wire.records import LeaseGrant, hash_set


class _Link:
    def __init__(self) -> None:
        self.posted: list[tuple[int, bytes]] = []

    def post(self, shard: int, record: bytes) -> None:
        self.posted.append((shard, record))


def test_the_grant_names_the_popped_lease() -> None:
    worker = FrontWorker.__new__(FrontWorker)
    worker.config = SimpleNamespace(ack_registry=True)  # type: ignore[assignment]
    worker.runtime = SimpleNamespace(shards=1)  # type: ignore[assignment]
    worker.link = link = _Link()  # type: ignore[assignment]
    lease = uuid.uuid4()
    expires = datetime(2026, 12, 6, 1, 2, 3, 456000, tzinfo=UTC)
    claim = Claim("q", 7, "p", 1, 2, 1, expires, False, [])
    hashes = [txn_hash_bytes(b"t-1"), txn_hash_bytes(b"t-2")]
    tenant = bytes(range(16))
    granted = worker.grant_leases(tenant, str(lease), "g", [claim], {7: hashes})
    assert granted == {7: hash_set(hashes)}
    [(shard, record)] = link.posted
    assert shard == 0
    assert LeaseGrant.unpack(record) == LeaseGrant(
        tenant, lease.bytes, 7, 2, int(expires.timestamp() * 1000), "g", "q", hash_set(hashes))
