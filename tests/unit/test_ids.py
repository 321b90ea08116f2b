"""UUIDv7 minting and the xxh3_128 identity: order, marks, clock trouble, fork, speed."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from itertools import pairwise

import pytest
import xxhash

from queen_mp.wire import (
    ZERO_UUID,
    ZERO_UUID_TEXT,
    InvalidRequest,
    hash_blob,
    hash_hex,
    is_uuid7,
    txn_hash,
    txn_hash_bytes,
    uuid7,
    uuid7_many,
    uuid7_unix_ms,
    uuid_from_text,
    uuid_text,
    uuid_texts,
)
from queen_mp.wire import ids as ids_module


@pytest.fixture(autouse=True)
def _fresh_minter() -> Iterator[None]:
    """Tests below fake the clock; no faked millisecond may leak into the next test."""
    ids_module._reset_after_fork()
    yield
    ids_module._reset_after_fork()


def _marks_ok(raw: bytes) -> bool:
    parsed = uuid.UUID(bytes=raw)
    return parsed.version == 7 and parsed.variant == uuid.RFC_4122 and is_uuid7(raw)


def test_100k_ids_are_strictly_increasing_and_marked() -> None:
    minted = [uuid7() for _ in range(50_000)]
    for _ in range(50):
        minted += uuid7_many(1000)
    assert len(minted) == 100_000
    assert all(a < b for a, b in pairwise(minted))
    assert all(_marks_ok(raw) for raw in minted[::97])
    assert all(raw[6] >> 4 == 7 and raw[8] >> 6 == 2 for raw in minted)


def test_timestamp_is_now_in_big_endian_ms() -> None:
    before = time.time_ns() // 1_000_000
    raw = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= uuid7_unix_ms(raw) <= after + 1
    assert int.from_bytes(raw[:6], "big") == uuid7_unix_ms(raw)


def test_same_millisecond_counts_up(monkeypatch: pytest.MonkeyPatch) -> None:
    frozen = (time.time_ns() // 1_000_000 + 10_000) * 1_000_000
    monkeypatch.setattr(ids_module, "time_ns", lambda: frozen)
    minted = [uuid7() for _ in range(100)] + uuid7_many(100)
    assert len({uuid7_unix_ms(raw) for raw in minted}) == 1
    values = [int.from_bytes(raw, "big") for raw in minted]
    assert values == list(range(values[0], values[0] + 200))


def test_clock_stepping_back_keeps_order(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [(time.time_ns() // 1_000_000 + 20_000) * 1_000_000]
    monkeypatch.setattr(ids_module, "time_ns", lambda: now[0])
    first = uuid7()
    now[0] -= 5_000 * 1_000_000  # NTP steps five seconds back
    later = [uuid7() for _ in range(10)] + uuid7_many(10)
    assert all(first < raw for raw in later)
    assert all(a < b for a, b in pairwise(later))
    assert {uuid7_unix_ms(raw) for raw in later} == {uuid7_unix_ms(first)}
    now[0] += 10_000 * 1_000_000
    assert uuid7_unix_ms(uuid7()) == now[0] // 1_000_000


def _counter_near(monkeypatch: pytest.MonkeyPatch, seed: int) -> int:
    ms = time.time_ns() // 1_000_000 + 30_000
    monkeypatch.setattr(ids_module, "time_ns", lambda: ms * 1_000_000)
    monkeypatch.setattr(ids_module._rng, "getrandbits", lambda bits: seed)
    return ms


@pytest.mark.parametrize("many", [False, True])
def test_rand_b_wrap_carries_into_rand_a(monkeypatch: pytest.MonkeyPatch, many: bool) -> None:
    seed = (0x5 << 62) | ((1 << 62) - 3)  # rand_a = 5, rand_b three short of wrapping
    _counter_near(monkeypatch, seed)
    minted = uuid7_many(8) if many else [uuid7() for _ in range(8)]
    assert all(a < b for a, b in pairwise(minted))
    assert all(_marks_ok(raw) for raw in minted)
    rand_a = [int.from_bytes(raw[6:8], "big") & 0x0FFF for raw in minted]
    assert rand_a == [5, 5, 5, 6, 6, 6, 6, 6]


def test_counter_overflow_borrows_the_next_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    ms = _counter_near(monkeypatch, (1 << 73) - 1)
    top = ids_module._compose(ms, (1 << 74) - 2)
    ids_module._last, ids_module._last_ms = top, ms
    a, b = uuid7(), uuid7()
    assert uuid7_unix_ms(a) == ms and uuid7_unix_ms(b) == ms + 1
    assert a < b and _marks_ok(a) and _marks_ok(b)
    assert uuid7() > b  # the borrowed millisecond goes on counting


def test_a_forked_child_does_not_repeat_the_parent() -> None:
    uuid7()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read_end)
        os.write(write_end, b"".join(uuid7_many(50)))
        os._exit(0)
    os.close(write_end)
    parent = set(uuid7_many(50))
    data = b""
    while chunk := os.read(read_end, 4096):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    child = {data[k : k + 16] for k in range(0, len(data), 16)}
    assert len(child) == 50
    assert not parent & child


# --- text -------------------------------------------------------------------------------------


def test_text_forms() -> None:
    raw = uuid7()
    text = uuid_text(raw)
    assert text == str(uuid.UUID(bytes=raw))
    assert uuid_from_text(text) == raw
    assert uuid_from_text(text.upper()) == raw
    assert uuid_text(memoryview(raw)) == text
    assert bytes(16) == ZERO_UUID and uuid_text(ZERO_UUID) == ZERO_UUID_TEXT
    assert uuid_from_text(ZERO_UUID_TEXT) == ZERO_UUID
    assert not is_uuid7(ZERO_UUID)
    assert not is_uuid7(uuid.uuid4().bytes)
    assert not is_uuid7(raw[:15])


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0196f3a2c00070008000000000000a0a",
        "{0196f3a2-c000-7000-8000-000000000a0a}",
        "0196f3a2-c000-7000-8000-000000000a0g",
        "0196f3a2-c000-7000-8000 000000000a0a",
        "0196f3a2-c000-7000-8000-00000000 a0a",
        "0196f3a2-c000-7000-8000-000000000a0a0",
        "0196f3a2-c0007-000-8000-000000000a0a",
        "0196f3a2-c000-7000-8000-" + "\u0660" * 9 + "a0a",
    ],
)
def test_bad_uuid_text_is_invalid_request(text: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        uuid_from_text(text, field="traceId")
    assert info.value.field == "traceId" and info.value.code == "invalid_request"


# --- xxh3_128 -------------------------------------------------------------------------------------


def test_txn_hash_is_xxh3_128_big_endian() -> None:
    for text in ["", "order-1001", "é✓", "x" * 1024]:
        expected = xxhash.xxh3_128_intdigest(text.encode()).to_bytes(16, "big")
        assert txn_hash(text) == expected
        assert txn_hash_bytes(memoryview(text.encode())) == expected
        assert hash_hex(expected) == xxhash.xxh3_128_hexdigest(text.encode())
    # Known vector: XXH3_128 of the empty input.
    assert hash_hex(txn_hash("")) == "99aa06d3014798d86001c324468d497f"


def test_hash_blob_is_one_hash_per_frame_in_order() -> None:
    txns = [b"a", b"b", b"a"]
    blob = hash_blob(txns)
    assert len(blob) == 48
    assert [blob[k : k + 16] for k in (0, 16, 32)] == [txn_hash_bytes(t) for t in txns]
    assert hash_blob([]) == b""


@pytest.mark.parametrize("count", [0, 1, 2, 31, 32, 33, 100, 1000])
def test_uuid_texts_are_uuid_text_encoded(count: int) -> None:
    """Below and from the count where numpy places the digits: the same text as uuid_text,
    for random ids, the zero id and the all-ones id."""
    ids = [os.urandom(16) for _ in range(count)] + [bytes(16), b"\xff" * 16]
    assert uuid_texts(b"".join(ids)) == [uuid_text(i).encode() for i in ids]
    assert uuid_texts(b"".join(ids)) == [str(uuid.UUID(bytes=i)).encode() for i in ids]


@pytest.mark.parametrize("rand_b", [0, 12345, (1 << 62) - 100])
def test_a_bulk_block_is_the_consecutive_ids(monkeypatch: pytest.MonkeyPatch,
                                             rand_b: int) -> None:
    # from _UUID_BULK ids numpy writes the block: each id the 16 big-endian bytes of its int
    _counter_near(monkeypatch, (0xABC << 62) | rand_b)
    minted = uuid7_many(100)
    values = [int.from_bytes(raw, "big") for raw in minted]
    assert values == list(range(values[0], values[0] + 100))
    assert all(type(raw) is bytes and _marks_ok(raw) for raw in minted)
    assert values[0] & ((1 << 62) - 1) == rand_b


def test_one_id_at_a_time_counts_up_and_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    """``uuid7_many(1)`` (a 1-item push's, its own branch) continues the one sequence."""
    seed = (0x5 << 62) | ((1 << 62) - 2)  # rand_a = 5, rand_b two short of wrapping
    _counter_near(monkeypatch, seed)
    minted = [*uuid7_many(1), uuid7(), *uuid7_many(1), *uuid7_many(1), uuid7()]
    values = [int.from_bytes(raw, "big") for raw in minted]
    assert all(a < b for a, b in pairwise(values)) and all(map(_marks_ok, minted))
    rand_a = [int.from_bytes(raw[6:8], "big") & 0x0FFF for raw in minted]
    assert rand_a == [5, 5, 6, 6, 6]
    assert values[1] == values[0] + 1 and values[3:] == [values[2] + 1, values[2] + 2]
