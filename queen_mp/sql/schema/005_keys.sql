-- 005_keys.sql: what the database knows of the payload encryption keys of its broker
-- instances, so that instances over one database can tell when they do not hold the same keys.
--
-- Tables: queen.encryption_keys, one row per key id any instance started with. Never the key:
--   its id (8 hex characters, the one every ciphertext header carries; queen_mp/crypto.py) and
--   a longer fingerprint (32 hex characters of a domain-separated SHA-256 of the key), which
--   tells two different keys with the same 32-bit id apart.
--
-- Why: each instance reads its keys from its own key file (queen_mp/keyring.py). Two instances
-- with different keys would each encrypt what the other cannot decrypt. At boot every instance
-- records its keys here (functions/keys.sql, encryption_keys_register_v1); an instance about to
-- create a new random key does not when keys are already recorded, and an instance that lacks
-- a recorded key says which one, and which instance recorded it.

CREATE TABLE queen.encryption_keys (
    key_id         text        PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{8}$'),
    fingerprint    text        NOT NULL CHECK (fingerprint ~ '^[0-9a-f]{32}$'),
    registered_by  text        NOT NULL,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    current_by     text,
    current_since  timestamptz,
    last_seen_by   text        NOT NULL,
    last_seen_at   timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE queen.encryption_keys IS
    'Payload encryption keys instances started with (ids and fingerprints, never keys).';
COMMENT ON COLUMN queen.encryption_keys.current_by IS
    'The last instance that started with this key as its current (encrypting) key.';
