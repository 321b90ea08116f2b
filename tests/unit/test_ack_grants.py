"""``Acker.granted``: the ack of exactly the delivered transactionIds reuses its grant's hash
set; any other ack hashes its own ids, so what it sends is always ``hash_set`` of its ids."""

from __future__ import annotations

import uuid

import pytest

from queen_mp.front import acks
from queen_mp.front.acks import Acker
from queen_mp.wire.hashing import txn_hashes
from queen_mp.wire.records import hash_set

LEASE = uuid.UUID(int=42)
DELIVERED = [f"t-{i}".encode() for i in range(100)]


def _acker(*ids: list[bytes]) -> Acker:
    acker = Acker(None, 1 << 20)  # type: ignore[arg-type]
    for pid, delivered in enumerate(ids, 7):
        acker.granted(str(LEASE), pid, delivered, hash_set(txn_hashes(
            [t.decode() for t in delivered])))
    return acker


def test_the_ack_of_the_delivered_ids_takes_the_granted_set_once() -> None:
    acker = _acker(DELIVERED)
    ids = [t.decode() for t in DELIVERED]
    granted = acker._granted[(str(LEASE), 7)][2]
    got = acker._hash_set(LEASE, 7, ids)
    assert got is granted and got == hash_set(txn_hashes(ids))
    assert not acker._granted  # taken: a second ack of the lease hashes its own


@pytest.mark.parametrize("ids", [
    ["t-0t", "-1"] + [f"t-{i}" for i in range(2, 100)],  # the same bytes cut elsewhere
    [f"t-{i}" for i in range(99)],  # fewer
    [f"t-{i}" for i in range(1, 100)] + ["t-0"],  # another order: the same set
    [f"t-{i}" for i in range(99)] + ["u-99"],
    ["t-0\0t-1"] + [f"t-{i}" for i in range(2, 100)],  # joins alike, one id fewer
])
def test_an_ack_of_other_ids_hashes_its_own(ids: list[str]) -> None:
    acker = _acker(DELIVERED)
    granted = acker._granted[(str(LEASE), 7)][2]
    got = acker._hash_set(LEASE, 7, ids)
    assert got is not granted and got == hash_set(txn_hashes(ids))


def test_another_lease_or_partition_misses() -> None:
    acker = _acker(DELIVERED)
    ids = [t.decode() for t in DELIVERED]
    granted = acker._granted[(str(LEASE), 7)][2]
    assert acker._hash_set(uuid.UUID(int=43), 7, ids) is not granted
    assert acker._hash_set(LEASE, 8, ids) is not granted
    assert acker._hash_set(LEASE, 7, ids) is granted


def test_ids_holding_a_nul_are_not_kept() -> None:
    acker = _acker([b"a\0b", b"c"])
    assert not acker._granted
    assert acker._hash_set(LEASE, 7, ["a", "b\0c"]) == hash_set(txn_hashes(["a", "b\0c"]))


def test_utf8_ids_are_kept() -> None:
    acker = _acker(["é".encode(), b"x"])
    granted = acker._granted[(str(LEASE), 7)][2]
    assert acker._hash_set(LEASE, 7, ["é", "x"]) is granted


def test_the_oldest_grant_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acks, "_GRANTS_KEPT", 2)
    acker = _acker([b"a"], [b"b"], [b"c"])
    assert list(acker._granted) == [(str(LEASE), 8), (str(LEASE), 9)]


def test_the_grants_kept_hold_a_bounded_number_of_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # each grant here: 100 ids of 3-4 characters joined (489) and a set of 100 hashes (1,600)
    monkeypatch.setattr(acks, "_GRANT_BYTES", 5_000)
    acker = _acker(DELIVERED, DELIVERED, DELIVERED, DELIVERED)
    assert list(acker._granted) == [(str(LEASE), 9), (str(LEASE), 10)]
    assert acker._granted_bytes == sum(len(t) + len(s) for t, _, s in acker._granted.values())
    acker._hash_set(LEASE, 10, [t.decode() for t in DELIVERED])  # taken by its ack
    assert list(acker._granted) == [(str(LEASE), 9)]
    assert acker._granted_bytes == sum(len(t) + len(s) for t, _, s in acker._granted.values())
    monkeypatch.setattr(acks, "_GRANT_BYTES", 1_000)
    acker.granted(str(LEASE), 11, DELIVERED, acker._granted[(str(LEASE), 9)][2])
    assert list(acker._granted) == [(str(LEASE), 9)]  # one alone over the budget: not kept
