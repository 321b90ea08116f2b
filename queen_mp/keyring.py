"""The payload encryption keys of a broker instance: the key file, its format and its checks.

A key file holds several AES-256 keys, one of them current (docs/operations.md, "Encryption
keys"). New pushes are encrypted with the current key; a payload under any key of the file
still decrypts, because every ciphertext names its key (queen_mp/crypto.py). A key's id is
derived from the key itself (``key_id``), so the same key has the same id in every file and
every instance, and a damaged key (one flipped hex digit) no longer matches its id.

Where the keys come from, decided once by the supervisor at boot (``plan_boot``):

- ``QUEEN_ENCRYPTION_KEY`` set: that one key (as before key files existed);
- else the key file (``QUEEN_ENCRYPTION_KEY_FILE``, default ``$QUEEN_DATA_DIR/
  encryption-keys.json``); when it does not exist and ``QUEEN_ENCRYPTION_KEY_CREATE`` is on,
  a new file with one random key, written only after the database agreed (the supervisor's
  boot step: a database that already knows keys gets no new one, queen_mp/db/key_procs.py).

Only the supervisor creates the file. Its children do not read it again: every shard and front
worker is a fork of the supervisor and uses the ring it read (``install``/``for_process``), so
all the processes of an instance hold the same keys until it restarts, even while ``queenctl
keys`` edits the file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queen_mp.config import Config

__all__ = ["FORMAT", "BootKeys", "Key", "KeyFileError", "Keyring", "KnownKey",
           "Registration", "Review", "fingerprint",
           "for_process", "install", "key_file_path", "key_id", "new_key", "parse_hex_key",
           "parse_key_file", "plan_boot", "read_key_file", "render_key_file", "review",
           "write_key_file"]

FORMAT = "queen-mp-keys/1"
DEFAULT_FILE = "encryption-keys.json"
KEY_BYTES = 32
MAX_KEYS = 256            # a key file is read whole; ids are 32 bits
MAX_FILE_BYTES = 1 << 20


class KeyFileError(ValueError):
    """The key file (or the key setting) cannot be used; the message names the file and why."""


def key_id(key: bytes) -> str:
    """The key's id: 8 hex characters of a SHA-256 of the key (domain-separated). It is what a
    ciphertext header carries; it reveals nothing usable about the key."""
    import hashlib  # PERF(crypto): libcrypto only where a key exists

    return hashlib.sha256(b"queen-mp key id\0" + key).hexdigest()[:8]


def fingerprint(key: bytes) -> str:
    """A longer digest of the key (32 hex characters), what the database records of it: two
    instances with the same fingerprint hold the same key."""
    import hashlib

    return hashlib.sha256(b"queen-mp key fingerprint\0" + key).hexdigest()[:32]


@dataclass(frozen=True)
class Key:
    id: str
    secret: bytes
    created: str = ""   # ISO 8601 UTC, informative

    def __repr__(self) -> str:  # never print key material
        return f"Key(id={self.id!r}, created={self.created!r})"


def new_key() -> Key:
    secret = os.urandom(KEY_BYTES)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Key(key_id(secret), secret, now)


@dataclass(frozen=True)
class Keyring:
    """Keys by id, one of them current (the one that encrypts)."""

    keys: tuple[Key, ...]
    current: str

    def __post_init__(self) -> None:
        ids = [k.id for k in self.keys]
        if len(set(ids)) != len(ids):
            raise KeyFileError(f"duplicate key ids in {ids}")
        if self.current not in ids:
            raise KeyFileError(f"the current key {self.current!r} is not among the keys {ids}")

    @classmethod
    def single(cls, hex_key: str) -> Keyring:
        """The ring of one key given as 64 hex characters (``QUEEN_ENCRYPTION_KEY``)."""
        secret = parse_hex_key(hex_key, "QUEEN_ENCRYPTION_KEY")
        k = Key(key_id(secret), secret)
        return cls((k,), k.id)

    def get(self, kid: str) -> Key | None:
        for k in self.keys:
            if k.id == kid:
                return k
        return None

    @property
    def current_key(self) -> Key:
        key = self.get(self.current)
        assert key is not None  # __post_init__
        return key

    def with_key(self, key: Key, *, make_current: bool = True) -> Keyring:
        if self.get(key.id) is not None:
            raise KeyFileError(f"key {key.id} is already in the file")
        if len(self.keys) >= MAX_KEYS:
            raise KeyFileError(f"a key file holds at most {MAX_KEYS} keys")
        return Keyring((*self.keys, key), key.id if make_current else self.current)

    def with_current(self, kid: str) -> Keyring:
        if self.get(kid) is None:
            raise KeyFileError(f"no key {kid!r} in the file (keys: "
                               f"{', '.join(k.id for k in self.keys)})")
        return Keyring(self.keys, kid)

    def facts(self) -> list[dict[str, Any]]:
        """What the database may know of the keys: ids, fingerprints, which is current."""
        return [{"id": k.id, "fingerprint": fingerprint(k.secret), "current": k.id == self.current}
                for k in self.keys]


def parse_hex_key(text: Any, where: str) -> bytes:
    try:
        raw = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != KEY_BYTES:
        raise KeyFileError(f"{where}: a key must be {KEY_BYTES * 2} hex characters "
                           f"({KEY_BYTES} bytes)")
    return raw


# ------------------------------------------------------------------------------ the key file
def key_file_path(config: Config) -> Path:
    """``QUEEN_ENCRYPTION_KEY_FILE``, else ``encryption-keys.json`` in the data directory."""
    if config.encryption_key_file:
        return Path(config.encryption_key_file).resolve()
    return config.data_path / DEFAULT_FILE


def parse_key_file(text: str, where: str) -> Keyring:
    """A ring from the file's text; every problem a ``KeyFileError`` naming ``where``."""
    try:
        doc = json.loads(text)
    except ValueError as ex:
        raise KeyFileError(f"{where}: not a JSON key file ({ex})") from ex
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise KeyFileError(f"{where}: not a queen-mp key file (expected an object with "
                           f'"format": "{FORMAT}")')
    unknown = sorted(set(doc) - {"format", "current", "keys"})
    if unknown:
        raise KeyFileError(f"{where}: unknown fields {unknown}")
    entries = doc.get("keys")
    if not isinstance(entries, list) or not entries:
        raise KeyFileError(f"{where}: \"keys\" must be a non-empty list")
    if len(entries) > MAX_KEYS:
        raise KeyFileError(f"{where}: more than {MAX_KEYS} keys")
    keys = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"id", "key"} <= set(entry) or not set(entry) <= {
                "id", "key", "created"}:
            raise KeyFileError(f"{where}: keys[{i}] must be an object with \"id\", \"key\" "
                               "and an optional \"created\"")
        secret = parse_hex_key(entry["key"], f"{where}: keys[{i}]")
        if entry["id"] != key_id(secret):
            raise KeyFileError(f"{where}: keys[{i}] has id {entry['id']!r} but its key's id is "
                               f"{key_id(secret)!r}: the key or its id was altered")
        keys.append(Key(entry["id"], secret, str(entry.get("created", ""))))
    current = doc.get("current")
    if not isinstance(current, str):
        raise KeyFileError(f"{where}: \"current\" must name a key id")
    try:
        return Keyring(tuple(keys), current)
    except KeyFileError as ex:
        raise KeyFileError(f"{where}: {ex}") from ex


def read_key_file(path: Path) -> Keyring:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as ex:
        raise KeyFileError(f"{path}: cannot read the key file ({ex.strerror or ex})") from ex
    if len(raw) > MAX_FILE_BYTES:
        raise KeyFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes: not a key file")
    try:
        text = raw.decode()
    except UnicodeDecodeError as ex:
        raise KeyFileError(f"{path}: not a JSON key file (not UTF-8)") from ex
    return parse_key_file(text, str(path))


def render_key_file(ring: Keyring) -> str:
    doc = {"format": FORMAT, "current": ring.current,
           "keys": [{"id": k.id, "key": k.secret.hex(), "created": k.created}
                    for k in ring.keys]}
    return json.dumps(doc, indent=2) + "\n"


def write_key_file(path: Path, ring: Keyring, *, exclusive: bool = False) -> None:
    """Write the file atomically with mode 0600: a temporary file in the same directory,
    fsynced, then renamed over ``path`` (``exclusive``: linked, so an existing file is never
    replaced, ``FileExistsError``). A replaced file keeps its owner when we may set it (root
    editing the broker user's file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            with contextlib.suppress(OSError):
                old = os.stat(path)
                if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
            f.write(render_key_file(ring))
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
        dirfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def loose_mode(path: Path) -> bool:
    """Whether group or others may read the file."""
    try:
        return bool(os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO))
    except OSError:
        return False


# --------------------------------------------------------------------------------- the boot
@dataclass(frozen=True)
class BootKeys:
    """What the supervisor decided before asking the database: the ring (None: no encryption),
    where it came from (``env``, ``file``, ``new``: made now, not written yet) and the file."""

    ring: Keyring | None
    source: str
    path: Path


def plan_boot(config: Config) -> BootKeys:
    """The instance's keys from its settings; raises ``KeyFileError`` for a key file that
    exists but cannot be used (the supervisor halts: a restart would not fix it)."""
    path = key_file_path(config)
    if config.encryption_key:
        return BootKeys(Keyring.single(config.encryption_key), "env", path)
    if path.exists() or path.is_symlink():
        return BootKeys(read_key_file(path), "file", path)
    if not config.encryption_key_create:
        return BootKeys(None, "none", path)
    key = new_key()
    return BootKeys(Keyring((key,), key.id), "new", path)


_inherited: tuple[Keyring | None] | None = None


def install(ring: Keyring | None) -> None:
    """The supervisor's ring, inherited by every child it forks (``for_process``)."""
    global _inherited
    _inherited = (ring,)


def for_process(config: Config) -> Keyring | None:
    """The ring of this process: the supervisor's when it forked us, else (a process not
    started by ``queen-mp serve``: tests, tools) read from the settings, never created."""
    if _inherited is not None:
        return _inherited[0]
    if config.encryption_key:
        return Keyring.single(config.encryption_key)
    path = key_file_path(config)
    return read_key_file(path) if path.exists() else None


@dataclass(frozen=True)
class Review:
    """The supervisor's verdict on its keys against the database's registry: the ring to use
    (None: no encryption on this instance), whether to write a new key file, what to log."""

    ring: Keyring | None
    write_file: bool
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class KnownKey:
    """A key the database recorded (``encryption_keys_register_v1``): never the key itself."""

    id: str
    fingerprint: str
    registered_by: str
    registered_at: str
    current_by: str | None = None
    current_since: str | None = None

    def __str__(self) -> str:
        return f"{self.id} (recorded by {self.registered_by} at {self.registered_at})"


@dataclass(frozen=True)
class Registration:
    """The database's answer to an instance's keys: whether it may keep a new key, and the
    keys recorded before it asked."""

    created: bool
    known: tuple[KnownKey, ...]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Registration:
        return cls(bool(doc.get("created")), tuple(
            KnownKey(str(k["id"]), str(k["fingerprint"]), str(k["registeredBy"]),
                     str(k["registeredAt"]), k.get("currentBy"),
                     None if k.get("currentSince") is None else str(k["currentSince"]))
            for k in doc.get("known") or ()))


def review(boot: BootKeys, answer: Registration, instance: str) -> Review:
    """Compare this instance's keys with those the database knew before it started and say
    what disagrees, naming keys and instances, never key material."""
    known = answer.known
    where = ("QUEEN_ENCRYPTION_KEY" if boot.source == "env" else str(boot.path))
    if boot.source == "new" and not answer.created:
        return Review(None, False, errors=(
            f"encryption: no key file at {boot.path}, and none was created: the database "
            f"already knows key(s) {', '.join(map(str, known))}, so another instance "
            "(or a lost key file) holds them. Copy that instance's key file to "
            f"{boot.path} (or point QUEEN_ENCRYPTION_KEY_FILE at it) and restart; until then "
            "this instance can neither encrypt nor decrypt payloads (pushes to encrypted "
            "queues answer 503).",))
    ring = boot.ring
    errors: list[str] = []
    warnings: list[str] = []
    if ring is None:
        if known:
            errors.append(
                "encryption: this instance has no key (QUEEN_ENCRYPTION_KEY_CREATE=0 and no key "
                f"file at {boot.path}) while the database knows key(s) "
                f"{', '.join(map(str, known))}: it cannot decrypt their payloads")
        return Review(None, False, tuple(errors))
    mine = {f["id"]: f["fingerprint"] for f in ring.facts()}
    clash = [k for k in known if k.id in mine and k.fingerprint != mine[k.id]]
    for k in clash:
        errors.append(f"encryption: key {k.id} of {where} is not the key {k}: two "
                      "different keys share one id; payloads under one of them will not "
                      "decrypt here")
    missing = [k for k in known if k.id not in mine]
    if missing:
        errors.append(
            f"encryption: this instance does not hold key(s) "
            f"{', '.join(map(str, missing))}: payloads encrypted with them cannot be "
            f"decrypted here; add them to {where} (copy the key file of an instance that "
            "holds them) unless no payload under them is left")
    if known and ring.current not in {k.id for k in known}:
        warnings.append(
            f"encryption: this instance's current key {ring.current} is new to the database: "
            "an instance that does not hold it cannot decrypt what this one encrypts from now "
            "on; give every instance the same key file (docs/operations.md, Encryption keys)")
    others = sorted((k for k in known if k.current_by and k.current_by != instance
                     and k.id != ring.current), key=lambda k: str(k.current_since))
    if others:
        k = others[-1]
        warnings.append(
            f"encryption: instance {k.current_by} encrypts with key {k.id} (since "
            f"{k.current_since}), this one with {ring.current}: each can decrypt the "
            "other's payloads only if it holds the other's key")
    if boot.source == "file" and loose_mode(boot.path):
        warnings.append(f"encryption: {boot.path} may be read by group or others; "
                        f"chmod 600 it")
    return Review(ring, boot.source == "new", tuple(errors), tuple(warnings))
