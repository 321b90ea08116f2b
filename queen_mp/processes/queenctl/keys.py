"""``queenctl keys``: the broker's encryption key file on this machine (queen_mp/keyring.py),
edited locally, not through the API; a broker uses a change from its next start."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from queen_mp import keyring
from queen_mp.config import Config, ConfigError
from queen_mp.processes.queenctl.base import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    Client,
    command,
    emit,
    subgroup,
    table,
)

# --- keys (the key file on this machine, not the API)
keys = subgroup("keys", "Encryption keys: the broker's key file on this machine (several keys, "
                        "one current). A broker reads the file when it starts: restart it "
                        "(every instance, with the same file) to use a change.")
_KEY_FILE = click.option(
    "--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="The key file [default: QUEEN_ENCRYPTION_KEY_FILE, else "
         "$QUEEN_DATA_DIR/encryption-keys.json, as the broker resolves it].")


def _key_file(path: Path | None) -> Path:
    if path is not None:
        return path.resolve()
    try:
        return keyring.key_file_path(Config.load())
    except ConfigError as ex:
        raise click.UsageError(str(ex)) from ex


def _key_error(ex: keyring.KeyFileError) -> NoReturn:
    click.echo(f"error: key_file: {ex}", err=True)
    sys.exit(EXIT_ERROR)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer of the key file at a time (a lock file beside it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ring_doc(path: Path, ring: keyring.Keyring | None) -> dict[str, Any]:
    return {"file": str(path), "current": ring.current if ring else None,
            "keys": [{"id": k.id, "created": k.created or None, "current": k.id == ring.current}
                     for k in ring.keys] if ring else []}


def _render_ring(doc: dict[str, Any]) -> str:
    rows = [[k["id"], "yes" if k["current"] else "", k["created"]] for k in doc["keys"]]
    return f"{doc['file']}\n" + table(["ID", "CURRENT", "CREATED"], rows)


@command(keys, "list")
@_KEY_FILE
def keys_list(obj: Client, path: Path | None) -> None:
    """The keys of the file (ids and dates, never the keys); exit 4 if there is no file."""
    path = _key_file(path)
    if not path.exists():
        click.echo(f"error: not_found: no key file at {path}", err=True)
        sys.exit(EXIT_NOT_FOUND)
    try:
        ring = keyring.read_key_file(path)
    except keyring.KeyFileError as ex:
        _key_error(ex)
    emit(obj, _ring_doc(path, ring), _render_ring)


@command(keys, "add")
@_KEY_FILE
@click.option("--standby", is_flag=True,
              help="Add the key without making it current: every instance can then decrypt "
                   "with it before any encrypts with it (`keys use` later).")
@click.option("--key-stdin", is_flag=True,
              help="Read the key (64 hex characters) from stdin instead of making a random "
                   "one, e.g. a former QUEEN_ENCRYPTION_KEY.")
def keys_add(obj: Client, path: Path | None, standby: bool, key_stdin: bool) -> None:
    """Add a key (random unless --key-stdin) and make it current; creates the file (mode
    0600) when there is none. Payloads under the older keys still decrypt."""
    path = _key_file(path)
    try:
        if key_stdin:
            secret = keyring.parse_hex_key(sys.stdin.read().strip(), "stdin")
            key = keyring.Key(keyring.key_id(secret), secret, keyring.new_key().created)
        else:
            key = keyring.new_key()
        with _locked(path):
            if path.exists():
                ring = keyring.read_key_file(path).with_key(key, make_current=not standby)
            else:
                ring = keyring.Keyring((key,), key.id)
            keyring.write_key_file(path, ring)
    except keyring.KeyFileError as ex:
        _key_error(ex)
    state = "current" if ring.current == key.id else "standby"
    emit(obj, _ring_doc(path, ring), lambda _: (
        f"added key {key.id} ({state}) to {path}\nrestart the broker to use it (every "
        "instance over the same database, with this same file)"))


@command(keys, "use")
@_KEY_FILE
@click.argument("key_id")
def keys_use(obj: Client, path: Path | None, key_id: str) -> None:
    """Make KEY_ID (a key of the file) the current key, the one new payloads are encrypted
    with."""
    path = _key_file(path)
    try:
        with _locked(path):
            ring = keyring.read_key_file(path).with_current(key_id)
            keyring.write_key_file(path, ring)
    except keyring.KeyFileError as ex:
        _key_error(ex)
    emit(obj, _ring_doc(path, ring), lambda _: (
        f"key {key_id} is now current in {path}\nrestart the broker to use it"))
