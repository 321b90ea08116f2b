"""Calls into ``sql/functions/keys.sql``: the registry of payload encryption keys
(schema/005_keys.sql), written once per instance start by the supervisor's boot step (the
migration child, queen_mp/db/migrations.py ``main``), never by the processes that serve.

The request and the answer cross that process boundary as JSON: the supervisor sends its keys'
ids and fingerprints (queen_mp/keyring.py ``Keyring.facts``), never the keys.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg

from queen_mp.db.connect import connect_blocking
from queen_mp.db.errors import translate

__all__ = ["register", "register_request"]


def register(conn: psycopg.Connection[Any], instance: str, create: bool,
             keys: list[dict[str, Any]]) -> dict[str, Any]:
    """``encryption_keys_register_v1``: {"created": bool, "known": [...]} (keys.sql)."""
    row = conn.execute("SELECT queen.encryption_keys_register_v1(%s, %s, %s::jsonb)",
                       (instance, create, json.dumps(keys))).fetchone()
    assert row is not None
    return row[0]


def register_request(dsn: str, request: str) -> str:
    """The boot step: ``request`` is {"instance", "create", "keys"} as JSON; the answer is
    ``register``'s, as JSON."""
    doc = json.loads(request)
    try:
        with (connect_blocking(dsn, application_name="queen-mp keys") as conn,
              conn.transaction()):
            answer = register(conn, str(doc["instance"]), bool(doc["create"]),
                              list(doc["keys"]))
    except psycopg.Error as ex:
        raise translate(ex) from ex
    return json.dumps(answer, default=str)
