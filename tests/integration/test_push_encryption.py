"""Queues with encryptionEnabled store AES-256-GCM payloads (frame flag 4) that name their key
(key rotation, the key file and older payloads: test_key_rotation.py)."""

from __future__ import annotations

import uuid

import orjson
import psycopg

from queen_mp.crypto import PayloadCipher, stored_key_id
from queen_mp.keyring import Keyring
from queen_mp.wire.frames import FLAG_ENCRYPTED, decode_chunk, iter_chunks, iter_frames
from queen_mp.wire.ids import uuid_text

KEY = "11" * 32


def _make_encrypted_queue(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, encryption_enabled) VALUES (%s, true)",
                     (name,))


def _stored_frames(dsn: str, queue: str) -> list:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT s.payload FROM queen.log_segments s JOIN queen.log_partitions p "
            "ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id "
            "WHERE q.name = %s ORDER BY s.base_offset", (queue,)).fetchall()
    frames = []
    for (blob,) in rows:
        for chunk in iter_chunks(blob):
            raw = decode_chunk(chunk.codec, chunk.data, max_size=1 << 30)
            frames.extend(iter_frames(bytes(raw)))
    return frames


def test_encrypted_queue_stores_ciphertext(make_broker, db_dsn):
    b = make_broker(db_dsn, QUEEN_ENCRYPTION_KEY=KEY)
    secret, plain = f"enc-{uuid.uuid4().hex[:8]}", f"plain-{uuid.uuid4().hex[:8]}"
    _make_encrypted_queue(db_dsn, secret)
    payloads = [{"card": "4111", "n": i} for i in range(3)]
    r = b.client.post("/api/v1/push", json={"items": [
        *({"queue": secret, "payload": p} for p in payloads),
        {"queue": plain, "payload": {"open": True}}]})
    assert r.status_code == 201, r.text
    assert [x["status"] for x in r.json()] == ["queued"] * 4
    frames = _stored_frames(db_dsn, secret)
    assert len(frames) == 3
    cipher = PayloadCipher(KEY)
    for f, expected, answer in zip(frames, payloads, r.json()[:3], strict=True):
        assert f.flags & FLAG_ENCRYPTED
        assert b"4111" not in bytes(f.payload)
        assert stored_key_id(bytes(f.payload)) == Keyring.single(KEY).current
        assert orjson.loads(cipher.decrypt(bytes(f.payload))) == expected
        assert uuid_text(f.message_id) == answer["messageId"]
    (open_frame,) = _stored_frames(db_dsn, plain)
    assert not open_frame.flags & FLAG_ENCRYPTED
    assert orjson.loads(bytes(open_frame.payload)) == {"open": True}


def test_encrypted_queue_without_a_key_is_503_and_stores_nothing(make_broker, db_dsn):
    b = make_broker(db_dsn, QUEEN_ENCRYPTION_KEY_CREATE="0")
    assert "encryption: no key" in b.log()
    secret = f"enc-{uuid.uuid4().hex[:8]}"
    _make_encrypted_queue(db_dsn, secret)
    r = b.client.post("/api/v1/push", json={"items": [{"queue": secret, "payload": 1}]})
    assert r.status_code == 503
    assert r.json()["code"] == "unavailable"
    assert "QUEEN_ENCRYPTION_KEY" in r.json()["error"]
    assert _stored_frames(db_dsn, secret) == []
