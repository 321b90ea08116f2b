"""Payload encryption at rest for queues with ``encryptionEnabled`` (docs/api.md 3.1).

AES-256-GCM from ``cryptography``; the stored payload is ``12-byte nonce | ciphertext | 16-byte
tag`` and the frame carries flag 4. Nonces are random: with 96 bits, collisions under one key
stay negligible far beyond any realistic message count.
"""

from __future__ import annotations

import os

__all__ = ["PayloadCipher"]

_NONCE = 12


class PayloadCipher:
    def __init__(self, key_hex: str) -> None:
        # PERF(crypto): imported here, not at module level: a cipher exists only when
        # QUEEN_ENCRYPTION_KEY is set, and cryptography costs ~10 MB of RSS in every process.
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(bytes.fromhex(key_hex))

    def encrypt(self, payload: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._aead.encrypt(nonce, payload, None)

    def decrypt(self, stored: bytes) -> bytes:
        return self._aead.decrypt(stored[:_NONCE], stored[_NONCE:], None)
