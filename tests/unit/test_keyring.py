"""Key files, key ids in ciphertexts, payloads of the format before key ids, the boot review
against the database's registry, and ``queenctl keys`` (queen_mp/keyring.py, queen_mp/crypto.py).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from queen_mp import keyring
from queen_mp.config import Config, ConfigError
from queen_mp.crypto import HEADER, MAGIC, PayloadCipher, UndecryptablePayload, stored_key_id
from queen_mp.keyring import BootKeys, Key, KeyFileError, Keyring
from queen_mp.processes.queenctl import main as queenctl


def ring_of(*keys: Key, current: int = -1) -> Keyring:
    return Keyring(keys, keys[current].id)


def legacy_encrypt(secret: bytes, payload: bytes, nonce: bytes | None = None) -> bytes:
    """What PayloadCipher stored before key ids: nonce | ciphertext | tag, no associated data."""
    nonce = nonce or os.urandom(12)
    return nonce + AESGCM(secret).encrypt(nonce, payload, None)


# ---------------------------------------------------------------------------------- ciphers
def test_a_payload_names_its_key_and_decrypts_after_rotation() -> None:
    k1, k2 = keyring.new_key(), keyring.new_key()
    before = PayloadCipher(ring_of(k1))
    after = PayloadCipher(ring_of(k1, k2))
    old, new = before.encrypt(b'{"n":1}'), after.encrypt(b'{"n":2}')
    assert old[:4] == new[:4] == MAGIC
    assert stored_key_id(old) == k1.id and stored_key_id(new) == k2.id
    assert len(new) == HEADER + 12 + len(b'{"n":2}') + 16
    assert after.decrypt(old) == b'{"n":1}' and after.decrypt(new) == b'{"n":2}'
    with pytest.raises(UndecryptablePayload, match=f"key {k2.id}, which this broker does not"):
        before.decrypt(new)


def test_the_header_is_authenticated() -> None:
    k1, k2 = keyring.new_key(), keyring.new_key()
    cipher = PayloadCipher(ring_of(k1, k2, current=0))
    stored = bytearray(cipher.encrypt(b"{}"))
    stored[4:8] = bytes.fromhex(k2.id)  # claims the other key of the ring
    with pytest.raises(UndecryptablePayload, match="no key of this broker"):
        cipher.decrypt(bytes(stored))
    stored = bytearray(cipher.encrypt(b"{}"))
    stored[-1] ^= 1
    with pytest.raises(UndecryptablePayload):
        cipher.decrypt(bytes(stored))


def test_payloads_of_the_format_before_key_ids_decrypt_under_any_key() -> None:
    k1, k2, k3 = keyring.new_key(), keyring.new_key(), keyring.new_key()
    cipher = PayloadCipher(ring_of(k1, k2, k3, current=2))
    assert cipher.decrypt(legacy_encrypt(k1.secret, b'"one"')) == b'"one"'
    assert cipher.decrypt(legacy_encrypt(k3.secret, b'"three"')) == b'"three"'
    # a random nonce that begins with the magic (1 in 2**32) is read as legacy after all
    odd = legacy_encrypt(k2.secret, b'"odd"', MAGIC + os.urandom(8))
    assert cipher.decrypt(odd) == b'"odd"'
    with pytest.raises(UndecryptablePayload):
        cipher.decrypt(legacy_encrypt(keyring.new_key().secret, b"{}"))
    with pytest.raises(UndecryptablePayload):
        cipher.decrypt(b"short")


def test_a_hex_key_is_a_ring_of_one_with_a_stable_id() -> None:
    hexkey = "11" * 32
    a, b = PayloadCipher(hexkey), PayloadCipher(Keyring.single(hexkey))
    assert a.current_key_id == b.current_key_id == keyring.key_id(bytes.fromhex(hexkey))
    assert b.decrypt(a.encrypt(b"x")) == b"x"
    assert "11" * 32 not in repr(a.ring)  # no key material in reprs
    with pytest.raises(KeyFileError, match="64 hex characters"):
        Keyring.single("abcd")


# -------------------------------------------------------------------------------- key files
def test_key_file_round_trip_mode_and_exclusive_create(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "keys.json"
    ring = ring_of(keyring.new_key())
    old = os.umask(0)
    try:
        keyring.write_key_file(path, ring, exclusive=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keyring.read_key_file(path) == ring
    with pytest.raises(FileExistsError):
        keyring.write_key_file(path, ring_of(keyring.new_key()), exclusive=True)
    assert keyring.read_key_file(path) == ring
    two = ring.with_key(keyring.new_key())
    keyring.write_key_file(path, two)
    assert keyring.read_key_file(path) == two
    assert [p.name for p in path.parent.iterdir()] == ["keys.json"]  # no temporary left


def _doc(ring: Keyring) -> dict:
    return json.loads(keyring.render_key_file(ring))


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda d: d.update(format="other/1"), "not a queen-mp key file"),
    (lambda d: d.update(extra=1), "unknown fields ['extra']"),
    (lambda d: d.update(keys=[]), "must be a non-empty list"),
    (lambda d: d.update(current="deadbeef"), "the current key 'deadbeef' is not among"),
    (lambda d: d.update(current=7), '"current" must name a key id'),
    (lambda d: d["keys"][0].update(key="zz" * 32), "64 hex characters"),
    (lambda d: d["keys"][0].update(key="ab" * 16), "64 hex characters"),
    (lambda d: d["keys"][0].update(key=d["keys"][0]["key"][:-1] + "0"
                                   if d["keys"][0]["key"][-1] != "0" else
                                   d["keys"][0]["key"][:-1] + "1"), "its id was altered"),
    (lambda d: d["keys"][0].pop("id"), 'must be an object with "id", "key"'),
    (lambda d: d["keys"].append(dict(d["keys"][0])), "duplicate key ids"),
], ids=["format", "unknown", "empty", "current", "current-type", "hex", "short", "altered",
        "no-id", "duplicate"])
def test_unusable_key_files_name_the_file_and_the_problem(edit, reason) -> None:
    doc = _doc(ring_of(keyring.new_key()))
    edit(doc)
    with pytest.raises(KeyFileError) as caught:
        keyring.parse_key_file(json.dumps(doc), "/etc/k.json")
    assert str(caught.value).startswith("/etc/k.json: ") and reason in str(caught.value)


def test_unreadable_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        keyring.read_key_file(tmp_path)  # a directory
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(KeyFileError, match="not UTF-8"):
        keyring.read_key_file(tmp_path / "bin")
    with pytest.raises(KeyFileError, match="not a JSON key file"):
        keyring.parse_key_file("", "f")


# ------------------------------------------------------------------------------- boot plans
def _config(tmp_path: Path, **env: str) -> Config:
    return Config.load(env={"QUEEN_DATA_DIR": str(tmp_path), **env})


def test_boot_plans(tmp_path: Path) -> None:
    plan = keyring.plan_boot(_config(tmp_path))
    assert plan.source == "new" and plan.path == tmp_path.resolve() / "encryption-keys.json"
    assert plan.ring is not None and not plan.path.exists()  # written after the database
    assert keyring.plan_boot(_config(tmp_path, QUEEN_ENCRYPTION_KEY_CREATE="0")) == BootKeys(
        None, "none", plan.path)
    env = keyring.plan_boot(_config(tmp_path, QUEEN_ENCRYPTION_KEY="22" * 32))
    assert env.source == "env" and env.ring == Keyring.single("22" * 32)
    other = tmp_path / "other.json"
    keyring.write_key_file(other, plan.ring)
    got = keyring.plan_boot(_config(tmp_path, QUEEN_ENCRYPTION_KEY_FILE=str(other)))
    assert got == BootKeys(plan.ring, "file", other)
    other.write_text("{")
    with pytest.raises(KeyFileError, match="not a JSON key file"):
        keyring.plan_boot(_config(tmp_path, QUEEN_ENCRYPTION_KEY_FILE=str(other)))
    with pytest.raises(ConfigError, match="exclude each other"):
        _config(tmp_path, QUEEN_ENCRYPTION_KEY="22" * 32, QUEEN_ENCRYPTION_KEY_FILE="x")


def _known(key: Key, by: str = "a:1", current: bool = False, fp: str | None = None) -> dict:
    return {"id": key.id, "fingerprint": fp or keyring.fingerprint(key.secret),
            "registeredBy": by, "registeredAt": "2026-01-01", "currentBy": by if current
            else None, "currentSince": "2026-01-01" if current else None}


def reg(doc: dict) -> keyring.Registration:
    """The registry's answer as the migration child prints it (JSON), parsed."""
    return keyring.Registration.from_json(json.loads(json.dumps(doc)))


def test_review_against_the_registry(tmp_path: Path) -> None:
    k1, k2, k3 = keyring.new_key(), keyring.new_key(), keyring.new_key()
    path = tmp_path / "k.json"
    new = BootKeys(ring_of(k2), "new", path)
    # an empty database: the new key is kept and written
    ok = keyring.review(new, reg({"created": True, "known": []}), "me:1")
    assert ok == keyring.Review(new.ring, True)
    # keys known already: no new key, and the error names them and who recorded them
    refused = keyring.review(new, reg({"created": False, "known": [_known(k1)]}), "me:1")
    assert refused.ring is None and not refused.write_file
    (error,) = refused.errors
    assert "none was created" in error and f"{k1.id} (recorded by a:1" in error
    assert str(path) in error
    # a file lacking a known key, with a current key the database does not know yet
    mine = BootKeys(ring_of(k1, k3), "file", path)
    v = keyring.review(mine, reg({"known": [_known(k1), _known(k2, "b:2", current=True)]}),
                       "me:1")
    assert v.ring == mine.ring and not v.write_file
    (error,) = v.errors
    assert f"does not hold key(s) {k2.id} (recorded by b:2" in error
    assert any(f"current key {k3.id} is new to the database" in w for w in v.warnings)
    assert any(f"instance b:2 encrypts with key {k2.id}" in w for w in v.warnings)
    # the same id under another fingerprint
    clash = keyring.review(mine, reg({"known": [_known(k1, fp="0" * 32)]}), "me:1")
    assert any("two different keys share one id" in e for e in clash.errors)
    # in agreement: nothing to say
    same = keyring.review(mine, reg({"known": [_known(k1, "me:1"), _known(k3, "me:1", True)]}),
                          "me:1")
    assert same.errors == same.warnings == ()
    # no key on this instance while the database has some
    none = keyring.review(BootKeys(None, "none", path), reg({"known": [_known(k1)]}), "me:1")
    assert none.ring is None and "has no key" in none.errors[0]


def test_a_readable_key_file_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    ring = ring_of(keyring.new_key())
    keyring.write_key_file(path, ring)
    path.chmod(0o644)
    v = keyring.review(BootKeys(ring, "file", path), reg({"known": []}), "me")
    assert any("chmod 600" in w for w in v.warnings)


def test_for_process_prefers_the_inherited_ring(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(keyring, "_inherited", None)
    assert keyring.for_process(_config(tmp_path)) is None  # never creates
    assert not (tmp_path / "encryption-keys.json").exists()
    ring = ring_of(keyring.new_key())
    keyring.install(ring)
    assert keyring.for_process(_config(tmp_path, QUEEN_ENCRYPTION_KEY="33" * 32)) is ring
    keyring.install(None)
    assert keyring.for_process(_config(tmp_path, QUEEN_ENCRYPTION_KEY="33" * 32)) is None


# ---------------------------------------------------------------------------- queenctl keys
def _ctl(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(queenctl, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_queenctl_keys_add_use_list(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    code, out, _ = _ctl("keys", "list", "--file", str(path))
    assert code == 4
    code, out, err = _ctl("keys", "add", "--file", str(path))
    assert code == 0, err
    first = keyring.read_key_file(path)
    assert f"added key {first.current} (current)" in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    code, out, err = _ctl("keys", "add", "--standby", "--file", str(path))
    assert code == 0, err
    ring = keyring.read_key_file(path)
    standby = ring.keys[1]
    assert ring.current == first.current and "(standby)" in out
    code, out, err = _ctl("keys", "use", standby.id, "--file", str(path))
    assert code == 0 and f"key {standby.id} is now current" in out, err
    code, out, _ = _ctl("--json", "keys", "list", "--file", str(path))
    doc = json.loads(out)
    assert code == 0 and doc["current"] == standby.id
    assert [(k["id"], k["current"]) for k in doc["keys"]] == [
        (first.current, False), (standby.id, True)]
    assert ring.keys[0].secret.hex() not in out  # ids, never keys
    code, out, _ = _ctl("keys", "list", "--file", str(path))
    assert standby.id in out and "CURRENT" in out
    code, _, err = _ctl("keys", "use", "00000000", "--file", str(path))
    assert code == 1 and "error: key_file: no key '00000000'" in err


def test_queenctl_keys_imports_a_key_and_refuses_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    hexkey = "44" * 32
    code, _, err = _ctl("keys", "add", "--key-stdin", "--file", str(path), stdin=hexkey + "\n")
    assert code == 0, err
    (key,) = keyring.read_key_file(path).keys
    assert (key.id, key.secret) == (Keyring.single(hexkey).current, bytes.fromhex(hexkey))
    code, _, err = _ctl("keys", "add", "--key-stdin", "--file", str(path), stdin=hexkey)
    assert code == 1 and "already in the file" in err
    code, _, err = _ctl("keys", "add", "--key-stdin", "--file", str(path), stdin="abc")
    assert code == 1 and "64 hex characters" in err
    path.write_text("garbage")
    code, _, err = _ctl("keys", "add", "--file", str(path))
    assert code == 1 and "not a JSON key file" in err
    assert path.read_text() == "garbage"


def test_queenctl_keys_default_file_follows_the_broker_settings(tmp_path: Path,
                                                                 monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("QUEEN_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("QUEEN_DATA_DIR", str(tmp_path / "data"))
    code, _, err = _ctl("keys", "add")
    assert code == 0, err
    assert (tmp_path / "data" / "encryption-keys.json").exists()
    monkeypatch.setenv("QUEEN_ENCRYPTION_KEY_FILE", str(tmp_path / "elsewhere.json"))
    assert _ctl("keys", "add")[0] == 0
    assert (tmp_path / "elsewhere.json").exists()
