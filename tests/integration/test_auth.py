"""Issue 9, JWT authentication and roles (api.md 1.4, 1.5), against real broker processes.

The matrix takes its routes from ``create_app`` itself, so a route added later is in it without
anyone remembering to add it; the expected role of each route is written out here from api.md,
independently of the broker's own table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from tests.brokerharness import Broker
from tests.integration.authkit import (
    AUDIENCE,
    SECRET,
    app_routes,
    bearer,
    start_auth_broker,
    token,
)
from tests.integration.test_push_json import uq

PUBLIC = {"/health", "/metrics", "/metrics/prometheus", "/api/v1/openapi.json", "/", "/console",
          "/console/{asset:path}"}
RANK = {"read-only": 1, "read-write": 2, "admin": 3}
SAMPLE = {"queue": "authq", "group": "authg", "partition": "p1", "lease_id": str(uuid.uuid4()),
          "partition_id": "1", "transaction_id": "t1", "timer_key": "k1", "name": "n1",
          "asset": "app.js"}


def needed(method: str, template: str) -> str | None:
    """api.md 1.5 / 5: the least role of a route; None = public."""
    if template in PUBLIC:
        return None
    if template.startswith("/api/v1/system/"):
        return "admin"
    if method == "DELETE" and template.startswith(("/api/v1/resources/queues/",
                                                   "/api/v1/consumer-groups/",
                                                   "/api/v1/ephemeral/queue/")):
        return "admin"
    if (method, template) == ("GET", "/api/v1/ephemeral/pop"):  # consumes, like a pop
        return "read-write"
    if (method, template) in (("POST", "/api/v1/stats/refresh"),
                              ("POST", "/api/v1/resources/queues/{queue}/purge")):
        return "admin"
    if method == "GET" and not template.startswith("/api/v1/pop"):
        return "read-only"
    return "read-write"


def concrete(template: str) -> str:
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: SAMPLE[m.group(1)], template)


@pytest.fixture(scope="module")
def auth_broker(db_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_auth_broker(tmp_path_factory.mktemp("auth"), db_dsn)
    yield b
    assert b.stop() == 0, b.log()[-4000:]


def kinds() -> dict[str, dict[str, str]]:
    tenant = "matrix-" + uuid.uuid4().hex[:8]
    return {
        "none": {},
        "bad_signature": bearer(token("admin", tenant=tenant, secret="x" * 64)),
        "expired": bearer(token("admin", tenant=tenant, exp_in=-120)),
        "wrong_audience": bearer(token("admin", tenant=tenant, aud="someone-else")),
        "read-only": bearer(token("read-only", tenant=tenant)),
        "read-write": bearer(token("read-write", tenant=tenant)),
        "admin": bearer(token("admin", tenant=tenant)),
    }


def call(client: httpx.Client, method: str, path: str, headers: dict[str, str]
         ) -> httpx.Response:
    if method in ("POST", "PUT", "PATCH"):
        return client.request(method, path, content=b"{}",
                              headers={**headers, "content-type": "application/json"})
    return client.request(method, path, headers=headers)


def assert_error(r: httpx.Response, code: str, template: str) -> None:
    body = r.json()
    assert body["code"] == code, (template, r.text)
    if template.startswith(("/api/v1/kv", "/api/v1/timers", "/api/v1/locks")):
        # the KV/timer/lock error shape (api.md 2.11)
        assert body["error"] == code and body["reason"] == code and body["detail"], r.text
    else:
        assert body["error"] and body["error"] != code, r.text


def test_matrix_every_route_and_token_kind(auth_broker):
    routes = app_routes()
    templates = {t for _, t in routes}
    # the list really is the app's: a few we know, and nothing missing from it
    assert {"/api/v1/push", "/api/v1/pop/queue/{queue}", "/api/v1/system/spool/drain",
            "/api/v1/timers/{queue}/{timer_key:path}"} <= templates
    assert len(routes) >= 45
    headers = kinds()
    seen = 0
    for method, template in routes:
        path = concrete(template)
        need = needed(method, template)
        for kind, h in headers.items():
            r = call(auth_broker.client, method, path, h)
            seen += 1
            where = f"{method} {template} with {kind}: {r.status_code} {r.text[:200]}"
            assert r.status_code < 500, where
            if need is None:
                assert r.status_code not in (401, 403), where
            elif kind not in RANK:
                assert r.status_code == 401, where
                assert r.headers.get("www-authenticate", "").startswith("Bearer"), where
                assert_error(r, "unauthorized", template)
            elif RANK[kind] < RANK[need]:
                assert r.status_code == 403, where
                assert_error(r, "forbidden", template)
            else:
                assert r.status_code not in (401, 403), where
    assert seen == len(routes) * 7


def test_unknown_routes_and_options(auth_broker):
    c = auth_broker.client
    assert c.get("/api/v1/nope").status_code == 401
    r = c.get("/api/v1/nope", headers=bearer(token("read-only")))
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    # a method the route has not: the role of a write, then 405
    assert c.put("/api/v1/push", headers=bearer(token("read-only"))).status_code == 403
    assert c.put("/api/v1/push", headers=bearer(token("read-write"))).status_code == 405
    r = c.options("/api/v1/push", headers={"Access-Control-Request-Headers": "authorization"})
    assert r.status_code == 204
    # a trailing slash or a percent-encoded path reaches the same route under the same rule
    assert c.get("/api/v1/system/spool/", headers=bearer(token("read-only"))).status_code == 403
    assert c.get("/api/v1/system/spool/", headers=bearer(token("admin"))).status_code == 200
    assert c.get("/api/v1/%73ystem/spool",
                 headers=bearer(token("read-write"))).status_code in (403, 404)


def test_tokens_without_role_or_with_bad_claims(auth_broker):
    c = auth_broker.client
    r = c.get("/api/v1/resources/overview", headers=bearer(token(None)))
    assert r.status_code == 403
    assert r.json()["role"] == "none" and r.json()["needed"] == "read-only"
    for bad in (token("admin", tenant=""), token("admin", sub="a\u0000b"),
                token("admin", iss="https://elsewhere"), token("admin", exp_in=-31),
                token("admin", nbf=int(time.time()) + 3600),
                "Bearer " + token("admin")):
        r = c.get("/api/v1/resources/overview", headers=bearer(bad))
        assert r.status_code == 401, bad
    # within the 30 s clock skew: accepted
    assert c.get("/api/v1/resources/overview",
                 headers=bearer(token("read-only", exp_in=-10))).status_code == 200
    # a token without an issuer or audience, when both are configured
    bare = jwt.encode({"role": "admin"}, SECRET, algorithm="HS256")
    assert c.get("/api/v1/resources/overview", headers=bearer(bare)).status_code == 401


def test_refused_write_reads_nothing_and_stores_nothing(auth_broker, db):
    q = uq("authw")
    body = {"items": [{"queue": q, "payload": 1}]}
    for h in ({}, bearer(token("read-only"))):
        r = auth_broker.client.post("/api/v1/push", json=body, headers=h)
        assert r.status_code in (401, 403)
    assert db.execute("SELECT count(*) FROM queen.queues WHERE name = %s",
                      (q,)).fetchone() == (0,)
    r = auth_broker.client.post("/api/v1/push", json=body, headers=bearer(token("read-write")))
    assert r.status_code == 201 and r.json()[0]["status"] == "queued"


def test_auth_off_ignores_the_header(broker):
    """The session broker runs with authentication off: any header, or none, is the default
    tenant with every role."""
    q = uq("authoff")
    c = broker.client
    r = c.post("/api/v1/push", json={"items": [{"queue": q, "payload": {"a": 1}}]},
               headers={"Authorization": "Bearer garbage"})
    assert r.status_code == 201, r.text
    forged = bearer(token("read-only", tenant="someone", sub="mallory"))
    m = c.get(f"/api/v1/pop/queue/{q}", headers=forged).json()["messages"][0]
    assert m["producerSub"] is None  # no subject while auth is off, whatever the token says
    assert c.get("/api/v1/system/spool", headers=forged).status_code == 200


# ------------------------------------------------------------------------------ public keys
def _pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def test_rs256_key_file_and_eddsa_jwks(make_broker, db_dsn, tmp_path):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ed_key = ed25519.Ed25519PrivateKey.generate()
    pem_file = tmp_path / "rsa.pub.pem"
    pem_file.write_bytes(_pem(rsa_key))
    jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(ed_key.public_key()))
    jwk["kid"] = "ed-2026"
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps({"keys": [jwk]}))
    b = make_broker(db_dsn, QUEEN_JWT_ENABLED="1", QUEEN_JWT_ALGORITHMS="RS256,EdDSA",
                    QUEEN_JWT_PUBLIC_KEY_FILE=str(pem_file), QUEEN_JWT_JWKS_FILE=str(jwks_file),
                    QUEEN_JWT_AUDIENCE=AUDIENCE, QUEEN_JWT_TENANT_CLAIM="org")
    q = uq("authpk")
    claims = {"role": "read-write", "aud": AUDIENCE, "org": "pk-tenant", "sub": "svc"}
    rs = jwt.encode(claims, rsa_key, algorithm="RS256")
    ed = jwt.encode(claims, ed_key, algorithm="EdDSA", headers={"kid": "ed-2026"})
    for tok in (rs, ed):
        r = b.client.post("/api/v1/push", json={"items": [{"queue": q, "payload": 1}]},
                          headers=bearer(tok))
        assert r.status_code == 201, r.text
    popped = b.client.get(f"/api/v1/pop/queue/{q}?batch=10", headers=bearer(ed)).json()
    assert [m["producerSub"] for m in popped["messages"]] == ["svc", "svc"]
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for bad in (jwt.encode(claims, other, algorithm="RS256"),
                jwt.encode(claims, ed25519.Ed25519PrivateKey.generate(), algorithm="EdDSA",
                           headers={"kid": "ed-2026"}),
                jwt.encode(claims, "x" * 64, algorithm="HS256"),
                jwt.encode({**claims, "aud": "other"}, rsa_key, algorithm="RS256")):
        assert b.client.get("/api/v1/resources/overview",
                            headers=bearer(bad)).status_code == 401
    # another tenant (the claim is 'org' here) does not see the queue
    mine = b.client.get(f"/api/v1/resources/queues/{q}", headers=bearer(rs))
    assert mine.status_code == 200
    theirs = jwt.encode({**claims, "org": "someone-else"}, rsa_key, algorithm="RS256")
    assert b.client.get(f"/api/v1/resources/queues/{q}",
                        headers=bearer(theirs)).status_code == 404


def test_bad_key_settings_stop_the_start(tmp_path):
    env = {"QUEEN_JWT_ENABLED": "1", "QUEEN_JWT_ALGORITHMS": "RS256",
           "QUEEN_JWT_PUBLIC_KEY_FILE": str(tmp_path / "missing.pem"),
           "QUEEN_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "queen_mp.processes.cli", "serve"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out
    assert "QUEEN_JWT_PUBLIC_KEY_FILE" in out.stderr
