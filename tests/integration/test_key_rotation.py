"""Encryption out of the box (issue 27): the key file a broker creates at its first start, key
rotation with ``queenctl keys add``, payloads under older keys and of the format before key
ids, instances over one database that do not hold the same keys, unusable key files.

The module has a database of its own: what it checks depends on the key registry
(queen.encryption_keys) being empty at its first start.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import psycopg
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from queen import Queen

from queen_mp.crypto import MAGIC, stored_key_id
from queen_mp.keyring import read_key_file
from queen_mp.processes.supervisor import EXIT_BOOT_ERROR
from queen_mp.spool import SpoolItem, SpoolWriter
from queen_mp.wire.frames import FLAG_ENCRYPTED, pack_frame
from queen_mp.wire.ids import ZERO_UUID, uuid7, uuid_text
from tests.brokerharness import REPO, Broker, start_broker
from tests.integration.test_maintenance import pop_all, wait_for
from tests.integration.test_push_json import stored_messages, uq
from tests.integration.test_timers import post_ops, sched
from tests.pgharness import drop_database, make_migrated_database


@pytest.fixture(scope="module")
def keys_db(pg_server_dsn: str) -> Iterator[str]:
    dsn = make_migrated_database(pg_server_dsn)
    try:
        yield dsn
    finally:
        drop_database(pg_server_dsn, dsn)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory of the module's first instance, kept across its restarts."""
    return tmp_path_factory.mktemp("node") / "data"


def queenctl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    return subprocess.run([sys.executable, "-m", "queen_mp.processes.queenctl", *args],
                          input=stdin, capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=60, check=False)


def encrypted_queue(b: Broker, queue: str) -> dict:
    async def go() -> dict:
        async with Queen(b.url) as client:
            return await client.queue(queue).config({"encryption_enabled": True}).create()

    return asyncio.run(go())


def client_push(b: Broker, queue: str, payloads: list[dict]) -> list[dict]:
    async def go() -> list[dict]:
        async with Queen(b.url) as client:
            return await client.queue(queue).push([{"data": p} for p in payloads])

    return asyncio.run(go())


def client_pop(b: Broker, queue: str, n: int, group: str | None = "g") -> list[dict]:
    """``n`` messages in one pop of the published client, acked (``group`` None: queue mode)."""
    async def go() -> list[dict]:
        async with Queen(b.url) as client:
            builder = client.queue(queue)
            if group is not None:
                builder = builder.group(group)
            got = await builder.batch(n).wait(True).pop()
            assert got
            await client.ack(got, True, {"group": group} if group else {})
            return got

    return asyncio.run(go())


def key_ids(dsn: str, queue: str) -> list[str | None]:
    """The key id in the header of each stored payload of ``queue`` (all encrypted)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = stored_messages(conn, queue)
    assert all(m.flags & FLAG_ENCRYPTED and b"secret" not in m.payload for m in stored)
    return [stored_key_id(m.payload) for m in stored]


@dataclass
class Rotation:
    """What the module's first instance did: first start, a push, ``queenctl keys add``, a
    restart, a push, a pop of both, a timer fired into the queue."""

    key_file: Path
    queue: str
    first_log: str
    added: subprocess.CompletedProcess[str]
    mode_after_add: int
    second_log: str
    stored_key_ids: list[str | None]
    popped: list[dict]
    read_back: list[tuple[int, object]]


@pytest.fixture(scope="module")
def rotation(keys_db: str, node: Path, tmp_path_factory: pytest.TempPathFactory) -> Rotation:
    tmp = tmp_path_factory.mktemp("rotation")
    key_file, q = node / "encryption-keys.json", uq("rot")
    b = start_broker(tmp, keys_db, QUEEN_DATA_DIR=str(node))
    try:
        assert encrypted_queue(b, q)["options"]["encryptionEnabled"] is True
        client_push(b, q, [{"secret": 1}])
    finally:
        assert b.stop() == 0, b.log()[-3000:]
    first_log = b.log()
    added = queenctl("keys", "add", "--file", str(key_file))
    mode = stat.S_IMODE(key_file.stat().st_mode)
    b = start_broker(tmp, keys_db, QUEEN_DATA_DIR=str(node))
    try:
        client_push(b, q, [{"secret": 2}])
        ids = key_ids(keys_db, q)
        got = client_pop(b, q, 2)
        # a message read by its ids decrypts under either key too
        read = [(r.status_code, r.json().get("data")) for r in (
            b.client.get(f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}")
            for m in got)]
        # a timer fires from a shard, a fork of the supervisor too: under the new key
        post_ops(b.client, [sched(q, "t", b'{"secret":3}')])
        wait_for("the timer fired", lambda: len(key_ids(keys_db, q)) == 3)
        ids = key_ids(keys_db, q)
        got += client_pop(b, q, 1)
    finally:
        assert b.stop() == 0, b.log()[-3000:]
    return Rotation(key_file, q, first_log, added, mode, b.log(), ids, got, read)


def test_first_start_creates_a_key_file_then_rotation_keeps_old_payloads(
        rotation: Rotation) -> None:
    key_file = rotation.key_file
    key1, key2 = read_key_file(key_file).keys
    created = [line for line in rotation.first_log.splitlines() if "created key file" in line]
    assert len(created) == 1 and str(key_file) in created[0]
    assert key1.id in created[0] and "losing it loses" in created[0]
    assert rotation.added.returncode == 0, rotation.added.stderr
    assert f"added key {key2.id} (current)" in rotation.added.stdout
    assert read_key_file(key_file).current == key2.id != key1.id
    assert rotation.mode_after_add == 0o600
    assert f"2 key(s) from {key_file}, current {key2.id}" in rotation.second_log
    assert rotation.stored_key_ids == [key1.id, key2.id, key2.id]
    assert [m["data"] for m in rotation.popped] == [{"secret": i} for i in (1, 2, 3)]
    assert rotation.read_back == [(200, {"secret": 1}), (200, {"secret": 2})]


def test_an_instance_without_the_database_keys_creates_none_and_says_so(
        keys_db: str, rotation: Rotation, tmp_path: Path) -> None:
    """A second instance over the same database, with a data directory of its own: no new
    key (it would encrypt what the first cannot decrypt); given the first's file, it reads
    the first's payloads, under both keys."""
    other = tmp_path / "other"
    b = start_broker(tmp_path, keys_db, QUEEN_DATA_DIR=str(other))
    try:
        assert stat.S_IMODE(rotation.key_file.stat().st_mode) == 0o600
        assert not (other / "encryption-keys.json").exists()
        log = b.log()
        assert "none was created: the database already knows key(s)" in log
        for k in read_key_file(rotation.key_file).keys:
            assert k.id in log
        r = b.client.post("/api/v1/configure", json={"queue": uq("two"), "options": {
            "encryptionEnabled": True}})
        assert r.status_code == 400 and r.json()["field"] == "encryptionEnabled", r.text
        r = b.client.post("/api/v1/push", json={"items": [{"queue": rotation.queue,
                                                           "payload": 1}]})
        assert r.status_code == 503, r.text
    finally:
        assert b.stop() == 0, b.log()[-3000:]
    b = start_broker(tmp_path, keys_db, QUEEN_DATA_DIR=str(other),
                     QUEEN_ENCRYPTION_KEY_FILE=str(rotation.key_file))
    try:
        assert "none was created" not in b.log() and "does not hold key" not in b.log()
        got = client_pop(b, rotation.queue, 2, group=None)
        assert [m["data"] for m in got] == [{"secret": 1}, {"secret": 2}]
    finally:
        assert b.stop() == 0, b.log()[-3000:]


def test_payloads_of_the_format_before_key_ids_still_decrypt(keys_db: str,
                                                            tmp_path: Path) -> None:
    """Stored as the broker stored them before key ids (nonce | ciphertext | tag, under
    QUEEN_ENCRYPTION_KEY). The operator moves that key into a key file (``keys add
    --key-stdin``) and rotates; the old payloads pop decrypted, new ones use the new key."""
    legacy = AESGCM.generate_key(bit_length=256)
    q, spool = uq("legacy"), tmp_path / "spool"
    with psycopg.connect(keys_db, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, encryption_enabled) VALUES (%s, true)",
                     (q,))
    records, ids = [], []
    for i in range(3):
        nonce = os.urandom(12)
        if i == 0:  # a nonce that begins with the new header's magic: still legacy
            nonce = MAGIC + nonce[4:]
        stored = nonce + AESGCM(legacy).encrypt(nonce, orjson.dumps({"secret": i}), None)
        mid = uuid7()
        frame = pack_frame(mid, f"old-{i}".encode(), stored, encrypted=True)
        records.append(SpoolItem(tenant=ZERO_UUID, queue=q, partition="Default",
                                 message_id=mid, transaction_id=f"old-{i}", trace_id=None,
                                 payload=frame).encode())
        ids.append(uuid_text(mid))
    with SpoolWriter(spool, "w0-1", fsync=False) as writer:  # drained as stored, flag 4 kept
        writer.append(records)
    key_file = tmp_path / "keys" / "ring.json"
    imported = queenctl("keys", "add", "--key-stdin", "--file", str(key_file),
                        stdin=legacy.hex() + "\n")
    assert imported.returncode == 0, imported.stderr
    assert queenctl("keys", "add", "--file", str(key_file)).returncode == 0
    ring = read_key_file(key_file)
    assert ring.current != ring.keys[0].id
    b = start_broker(tmp_path, keys_db, QUEEN_ENCRYPTION_KEY_FILE=str(key_file),
                     QUEEN_SPOOL_DIR=str(spool))
    try:
        wait_for("the spool drained", lambda: len(key_ids(keys_db, q)) == 3)
        old = key_ids(keys_db, q)
        assert old[1:] == [None, None]  # no header: the old format
        assert old[0] not in {k.id for k in ring.keys}  # MAGIC, then 4 random bytes
        client_push(b, q, [{"secret": 3}])
        assert key_ids(keys_db, q)[-1] == ring.current
        got = pop_all(b.client, q, 4)
        assert sorted(m["data"]["secret"] for m in got) == [0, 1, 2, 3]
        assert {m["id"] for m in got} >= set(ids)
    finally:
        assert b.stop() == 0, b.log()[-3000:]


def _serve(env_extra: dict[str, str], data: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env.update(QUEEN_DATA_DIR=str(data), QUEEN_PORT="0", QUEEN_LOG_LEVEL="info", **env_extra)
    return subprocess.run([sys.executable, "-m", "queen_mp.processes.cli", "serve"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("content", "reason"), [
    ("not json {", "not a JSON key file"),
    ('{"format": "queen-mp-keys/1", "current": "00000000", "keys": [{"id": "00000000", '
     '"key": "' + "ab" * 32 + '"}]}', "the key or its id was altered"),
    ('{"keys": []}', "not a queen-mp key file"),
], ids=["garbage", "altered", "foreign"])
def test_an_unusable_key_file_stops_the_start_once_with_its_reason(
        tmp_path: Path, content: str, reason: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    key_file = data / "encryption-keys.json"
    key_file.write_text(content)
    done = _serve({}, data)
    out = done.stdout + done.stderr
    assert done.returncode == EXIT_BOOT_ERROR, out
    assert f"encryption key file unusable: {key_file}" in out and reason in out, out
    # stopped before anything started: no PostgreSQL, no shard
    assert "embedded PostgreSQL running" not in out and "shard 0 started" not in out
    assert key_file.read_text() == content  # left as it was
    shutil.rmtree(data)


def test_the_registry_function(fresh_db_dsn: str) -> None:
    """encryption_keys_register_v1 as key_procs calls it: a new key only into an empty
    registry, current_by follows each instance's current key, a clashing fingerprint is not
    overwritten."""
    from queen_mp.db.key_procs import register

    k1, k2 = "a" * 8, "b" * 8
    facts = [{"id": k1, "fingerprint": "1" * 32, "current": True}]
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        first = register(conn, "A:1", True, facts)
        assert first == {"created": True, "known": []}
        refused = register(conn, "B:1", True, [{"id": k2, "fingerprint": "2" * 32,
                                                 "current": True}])
        assert refused["created"] is False and [k["id"] for k in refused["known"]] == [k1]
        assert conn.execute("SELECT count(*) FROM queen.encryption_keys").fetchone() == (1,)
        # A rotates: both keys recorded, only the new one names A as its user
        rotated = [{"id": k1, "fingerprint": "1" * 32, "current": False},
                   {"id": k2, "fingerprint": "2" * 32, "current": True}]
        assert register(conn, "A:1", False, rotated)["created"] is False
        rows = conn.execute("SELECT key_id, current_by FROM queen.encryption_keys "
                            "ORDER BY key_id").fetchall()
        assert rows == [(k1, None), (k2, "A:1")]
        # another key under a known id: the record is kept as it was, the caller compares
        clash = register(conn, "C:1", False, [{"id": k1, "fingerprint": "3" * 32,
                                               "current": True}])
        assert {k["id"]: k["fingerprint"] for k in clash["known"]}[k1] == "1" * 32
        assert conn.execute("SELECT fingerprint, current_by FROM queen.encryption_keys "
                            "WHERE key_id = %s", (k1,)).fetchone() == ("1" * 32, None)
        with pytest.raises(psycopg.errors.CheckViolation):
            register(conn, "D:1", False, [{"id": "nothex!!", "fingerprint": "1" * 32,
                                           "current": True}])
