"""Payload encryption at rest for queues with ``encryptionEnabled`` (docs/api.md 3.1).

AES-256-GCM from ``cryptography``; the frame carries flag 4. A stored payload names the key
that encrypted it, so keys rotate (queen_mp/keyring.py)::

    keyed (written now):   "QMK1" | key id (4 bytes) | nonce (12) | ciphertext | tag (16)
    legacy (before keys):  nonce (12) | ciphertext | tag (16)

The 8-byte header is authenticated (GCM associated data). A legacy payload is told apart by
its missing magic; one whose random nonce happens to begin with the magic (1 in 2**32) fails
the keyed reading and is then read as legacy. Legacy payloads carry no key id: each key of the
ring is tried, current first (GCM's tag says which one fits). Nonces are random: with 96 bits,
collisions under one key stay negligible far beyond any realistic message count.
"""

from __future__ import annotations

import os
from typing import Any

from queen_mp.keyring import Keyring

__all__ = ["HEADER", "MAGIC", "PayloadCipher", "UndecryptablePayload", "stored_key_id"]

MAGIC = b"QMK1"
HEADER = len(MAGIC) + 4
_NONCE = 12
_TAG = 16


class UndecryptablePayload(ValueError):
    """No key of this broker decrypts the payload; the message says which key it needs."""


def stored_key_id(stored: bytes) -> str | None:
    """The key id a keyed payload names (None for a legacy or too short one)."""
    if len(stored) >= HEADER + _NONCE + _TAG and stored[:4] == MAGIC:
        return stored[4:HEADER].hex()
    return None


class PayloadCipher:
    """Encrypts with the ring's current key; decrypts under any key of the ring."""

    def __init__(self, keys: Keyring | str) -> None:
        self.ring = Keyring.single(keys) if isinstance(keys, str) else keys
        self._aeads: dict[str, Any] = {}
        current = self.ring.current
        self._header = MAGIC + bytes.fromhex(current)
        self._current = current

    def _aead(self, kid: str) -> Any:
        aead = self._aeads.get(kid)
        if aead is None:
            # PERF(crypto): imported on first use, not at module level: cryptography costs
            # ~10 MB of RSS in every process, and most processes never encrypt anything.
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            key = self.ring.get(kid)
            assert key is not None
            aead = self._aeads[kid] = AESGCM(key.secret)
        return aead

    @property
    def current_key_id(self) -> str:
        return self._current

    def encrypt(self, payload: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        header = self._header
        return header + nonce + self._aead(self._current).encrypt(nonce, payload, header)

    def decrypt(self, stored: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        kid = stored_key_id(stored)
        if kid is not None and self.ring.get(kid) is not None:
            try:
                return self._aead(kid).decrypt(stored[HEADER:HEADER + _NONCE],
                                               stored[HEADER + _NONCE:], stored[:HEADER])
            except InvalidTag:
                pass  # a legacy payload whose nonce begins with MAGIC, or a damaged one
        if len(stored) >= _NONCE + _TAG:
            for key in sorted(self.ring.keys, key=lambda k: k.id != self._current):
                try:
                    return self._aead(key.id).decrypt(stored[:_NONCE], stored[_NONCE:], None)
                except InvalidTag:
                    continue
        held = ", ".join(k.id for k in self.ring.keys)
        if kid is not None and self.ring.get(kid) is None:
            raise UndecryptablePayload(
                f"encrypted with key {kid}, which this broker does not hold (it holds {held}): "
                "add that key to its key file")
        raise UndecryptablePayload(f"no key of this broker ({held}) decrypts the payload "
                                   "(damaged, or encrypted with a key it does not hold)")
