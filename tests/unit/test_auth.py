"""JWT verification (queen_mp/auth.py) and the route roles of the edge (queen_mp/http/authz.py),
without a server: keys are made here, tokens signed with PyJWT, routes read from the app."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid

import falcon.inspect
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from queen_mp.auth import (
    DEFAULT_TENANT,
    LEEWAY_S,
    MAX_SUB_BYTES,
    TENANT_NAMESPACE,
    AuthError,
    Role,
    Verifier,
    role_from_claims,
    tenant_from_claim,
)
from queen_mp.config import Config, ConfigError
from queen_mp.http.app import create_app
from queen_mp.http.authz import required_role
from queen_mp.models.items import stamped_item
from queen_mp.wire.frames import iter_frames, pack_frame

SECRET = "unit-secret-" + "0123456789abcdef" * 4


def hs(claims: dict, secret: str = SECRET, alg: str = "HS256", **headers: str) -> str:
    return jwt.encode(claims, secret, algorithm=alg, headers=headers or None)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ed_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


# ------------------------------------------------------------------------------ claims
def test_tenant_claim_uuid_name_absent_and_invalid():
    tid = uuid.uuid4()
    assert tenant_from_claim(str(tid)) == tid.bytes
    assert tenant_from_claim(str(tid).upper()) == tid.bytes
    assert tenant_from_claim(None) == DEFAULT_TENANT == bytes(16)
    assert tenant_from_claim("acme") == uuid.uuid5(TENANT_NAMESPACE, "acme").bytes
    assert tenant_from_claim("acme") != tenant_from_claim("Acme")
    # not canonical UUID text: a name like any other
    assert tenant_from_claim(tid.hex) == uuid.uuid5(TENANT_NAMESPACE, tid.hex).bytes
    for bad in ("", 7, ["a"], {"a": 1}, True):
        with pytest.raises(AuthError):
            tenant_from_claim(bad)
    # the documented derivation of the namespace: fixed forever
    assert uuid.uuid5(uuid.NAMESPACE_URL, "urn:queen-mp:tenant") == TENANT_NAMESPACE


@pytest.mark.parametrize(("claims", "role"), [
    ({}, Role.NONE),
    ({"role": "read-only"}, Role.READ_ONLY),
    ({"role": "read-write"}, Role.READ_WRITE),
    ({"role": "admin"}, Role.ADMIN),
    ({"roles": ["read-only", "admin"]}, Role.ADMIN),
    ({"role": "read-only", "roles": ["read-write"]}, Role.READ_WRITE),
    ({"role": "superuser"}, Role.NONE),
    ({"roles": ["Admin", 3, None]}, Role.NONE),
    ({"roles": "read-write"}, Role.READ_WRITE),
])
def test_role_is_the_highest_known_name(claims, role):
    assert role_from_claims(claims) == role


# ------------------------------------------------------------------------------ HS256
def verifier(**kw) -> Verifier:
    kw.setdefault("secret", SECRET)
    return Verifier(kw.pop("algorithms", ["HS256"]), **kw)


def test_hs256_principal():
    v = verifier(tenant_claim="org")
    p = v.verify(hs({"sub": "alice", "role": "read-write", "org": "acme"}))
    assert (p.role, p.tenant, p.sub) == (Role.READ_WRITE, tenant_from_claim("acme"), "alice")
    p = v.verify_header("Bearer " + hs({"role": "admin", "tenant": "ignored"}))
    assert (p.role, p.tenant, p.sub) == (Role.ADMIN, DEFAULT_TENANT, None)


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic abc", "bearer",
                                    "Token x.y.z", "Bearer not-a-jwt", "Bearer a.b.c"])
def test_missing_or_malformed_header(header):
    with pytest.raises(AuthError):
        verifier().verify_header(header)


def test_scheme_is_case_insensitive():
    assert verifier().verify_header("bearer " + hs({"role": "admin"})).role == Role.ADMIN


def test_bad_signature_alg_none_and_unlisted_algorithms():
    v = verifier()
    with pytest.raises(AuthError, match="signature"):
        v.verify(hs({"role": "admin"}, secret="another-secret-" + "f" * 64))
    unsigned = jwt.encode({"role": "admin"}, None, algorithm="none")
    with pytest.raises(AuthError, match="algorithm"):
        v.verify(unsigned)
    with pytest.raises(AuthError, match="algorithm"):
        v.verify(hs({"role": "admin"}, alg="HS512"))
    # a token whose signature part was cut off
    head, body, _ = hs({"role": "admin"}).split(".")
    with pytest.raises(AuthError):
        v.verify(f"{head}.{body}.")


def test_expiry_with_30_seconds_of_leeway():
    v = verifier()
    now = int(time.time())
    assert v.verify(hs({"role": "admin", "exp": now - LEEWAY_S + 5})).role == Role.ADMIN
    with pytest.raises(AuthError, match="expired"):
        v.verify(hs({"role": "admin", "exp": now - LEEWAY_S - 5}))
    assert v.verify(hs({"role": "admin", "nbf": now + LEEWAY_S - 5})).role == Role.ADMIN
    with pytest.raises(AuthError, match="not yet valid"):
        v.verify(hs({"role": "admin", "nbf": now + LEEWAY_S + 60}))
    # no exp: does not expire
    assert v.verify(hs({"role": "admin"})).role == Role.ADMIN


def test_issuer_and_audience_when_configured():
    v = verifier(issuer="https://idp.test", audience=["queen", "queen-mp"])
    ok = {"role": "admin", "iss": "https://idp.test", "aud": "queen-mp"}
    assert v.verify(hs(ok)).role == Role.ADMIN
    assert v.verify(hs({**ok, "aud": ["other", "queen"]})).role == Role.ADMIN
    for bad, why in (({**ok, "aud": "other"}, "audience"), ({**ok, "iss": "https://x"}, "issuer"),
                     ({"role": "admin", "aud": "queen"}, "iss"),
                     ({"role": "admin", "iss": "https://idp.test"}, "aud")):
        with pytest.raises(AuthError, match=why):
            v.verify(hs(bad))
    # not configured: not checked
    assert verifier().verify(hs({"role": "admin", "aud": "x", "iss": "y"})).role == Role.ADMIN


def test_sub_must_be_short_text():
    v = verifier()
    assert v.verify(hs({"sub": "é" * (MAX_SUB_BYTES // 2)})).sub == "é" * (MAX_SUB_BYTES // 2)
    for bad in ("x" * (MAX_SUB_BYTES + 1), "a\x00b"):
        with pytest.raises(AuthError):
            v.verify(hs({"sub": bad}))
    with pytest.raises(AuthError):
        v.verify(hs({"sub": 42}))


def test_verdicts_are_remembered_until_the_token_expires():
    clock = [1_000_000.0]
    v = Verifier(["HS256"], secret=SECRET, clock=lambda: clock[0])
    token = hs({"role": "admin", "exp": int(time.time()) + 3600})
    assert v.verify(token).role == Role.ADMIN
    assert token in v._cache
    # a remembered token is still subject to its own expiry
    short = hs({"role": "admin", "exp": int(time.time()) + 1})
    v2 = Verifier(["HS256"], secret=SECRET)
    v2.verify(short)
    until, _ = v2._cache[short]
    assert until <= int(time.time()) + 1 + LEEWAY_S
    clock[0] += 10_000
    assert v.verify(token).role == Role.ADMIN  # re-verified, still valid


# ------------------------------------------------------------------------------ public keys
def test_rs256_public_key_and_algorithm_confusion(rsa_key):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    v = Verifier(["RS256", "HS256"], secret=SECRET,
                 public_keys=[load_pem_public_key(pem(rsa_key))])
    token = jwt.encode({"role": "read-only", "sub": "svc"}, rsa_key, algorithm="RS256")
    assert v.verify(token).role == Role.READ_ONLY
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(AuthError, match="signature"):
        v.verify(jwt.encode({"role": "admin"}, other, algorithm="RS256"))
    # HS256 signed with the public key's PEM as the secret: verified with the secret only
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(b'{"role":"admin"}')
    sig = hmac.new(pem(rsa_key), signing.encode(), hashlib.sha256).digest()
    with pytest.raises(AuthError):
        v.verify(f"{signing}.{b64(sig)}")


def test_jwks_file_eddsa_and_rsa_by_kid(tmp_path, ed_key, rsa_key):
    jwk_ed = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(ed_key.public_key()))
    jwk_rsa = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    jwk_ed["kid"], jwk_rsa["kid"] = "ed-1", "rsa-1"
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk_ed, jwk_rsa]}))
    cfg = Config.load({"QUEEN_JWT_ENABLED": "1", "QUEEN_JWT_JWKS_FILE": str(path),
                       "QUEEN_JWT_ALGORITHMS": "EdDSA,RS256"})
    v = Verifier.from_config(cfg)
    assert v is not None
    t = jwt.encode({"role": "admin", "tenant": "t1"}, ed_key, algorithm="EdDSA",
                   headers={"kid": "ed-1"})
    assert v.verify(t).tenant == tenant_from_claim("t1")
    t = jwt.encode({"role": "read-write"}, rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
    assert v.verify(t).role == Role.READ_WRITE
    # no kid: every key that fits is tried
    assert v.verify(jwt.encode({"role": "admin"}, ed_key, algorithm="EdDSA")).role == Role.ADMIN
    # the wrong kid, an unknown kid, a key not in the set
    with pytest.raises(AuthError):
        v.verify(jwt.encode({"role": "admin"}, ed_key, algorithm="EdDSA",
                            headers={"kid": "rsa-1"}))
    with pytest.raises(AuthError):
        v.verify(jwt.encode({"role": "admin"}, ed_key, algorithm="EdDSA",
                            headers={"kid": "nope"}))
    with pytest.raises(AuthError):
        v.verify(jwt.encode({"role": "admin"}, ed25519.Ed25519PrivateKey.generate(),
                            algorithm="EdDSA"))
    # an HS256 token: no secret configured, and HS256 is not listed
    with pytest.raises(AuthError):
        v.verify(hs({"role": "admin"}))


def test_config_errors(tmp_path, rsa_key):
    def load(**env: str) -> Verifier | None:
        return Verifier.from_config(Config.load({"QUEEN_JWT_ENABLED": "1", **env}))

    assert Verifier.from_config(Config.load({})) is None
    with pytest.raises(ConfigError, match="PUBLIC_KEY_FILE"):
        load(QUEEN_JWT_PUBLIC_KEY_FILE=str(tmp_path / "missing.pem"),
             QUEEN_JWT_ALGORITHMS="RS256")
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(ConfigError, match="PEM"):
        load(QUEEN_JWT_PUBLIC_KEY_FILE=str(bad), QUEEN_JWT_ALGORITHMS="RS256")
    with pytest.raises(ConfigError, match="JWKS"):
        load(QUEEN_JWT_JWKS_FILE=str(bad), QUEEN_JWT_ALGORITHMS="RS256")
    good = tmp_path / "rsa.pem"
    good.write_bytes(pem(rsa_key))
    # the default algorithm (HS256) with only a public key: said at once, not per request
    with pytest.raises(ConfigError, match="SECRET"):
        load(QUEEN_JWT_PUBLIC_KEY_FILE=str(good))
    with pytest.raises(ConfigError, match="public-key"):
        load(QUEEN_JWT_SECRET=SECRET, QUEEN_JWT_ALGORITHMS="RS256")
    with pytest.raises(ConfigError, match="unsupported"):
        load(QUEEN_JWT_SECRET=SECRET, QUEEN_JWT_ALGORITHMS="HS256,none")
    assert load(QUEEN_JWT_PUBLIC_KEY_FILE=str(good), QUEEN_JWT_ALGORITHMS="RS256") is not None


# ------------------------------------------------------------------------------ route roles
def expected_role(method: str, template: str) -> Role | None:
    """api.md 1.5 and 5, written out independently of queen_mp.http.authz."""
    if template in ("/health", "/metrics", "/metrics/prometheus", "/api/v1/openapi.json", "/",
                    "/console", "/console/{asset:path}"):
        return None
    if template.startswith("/api/v1/system/"):
        return Role.ADMIN
    if method == "DELETE" and (template.startswith("/api/v1/resources/queues/")
                               or template.startswith("/api/v1/consumer-groups/")
                               or template.startswith("/api/v1/ephemeral/queue/")):
        return Role.ADMIN
    if (method, template) == ("GET", "/api/v1/ephemeral/pop"):  # consumes, like a pop
        return Role.READ_WRITE
    if (method, template) in (("POST", "/api/v1/stats/refresh"),
                              ("POST", "/api/v1/resources/queues/{queue}/purge")):
        return Role.ADMIN
    if method == "GET" and not template.startswith("/api/v1/pop"):
        return Role.READ_ONLY
    return Role.READ_WRITE


def app_routes() -> list[tuple[str, str]]:
    cfg = Config.load({})
    from queen_mp.front.worker import FrontWorker

    app = create_app(cfg, None, FrontWorker(cfg, None))  # type: ignore[arg-type]
    return [(m.method, r.path) for r in falcon.inspect.inspect_routes(app)
            for m in r.methods if not m.internal]


def test_every_registered_route_has_the_role_api_md_gives_it():
    routes = app_routes()
    assert len(routes) >= 45
    for method, template in routes:
        want = expected_role(method, template)
        if want is None:
            continue
        assert required_role(method, template) == want, (method, template)
    # spot checks of the rules that matter most
    assert required_role("GET", "/api/v1/pop/queue/{queue}") == Role.READ_WRITE
    assert required_role("GET", "/api/v1/system/spool") == Role.ADMIN
    assert required_role("DELETE", "/api/v1/consumer-groups/lagging") == Role.ADMIN
    assert required_role("DELETE", "/api/v1/timers/{queue}/{timer_key:path}") == Role.READ_WRITE
    assert required_role("GET", None) == Role.READ_ONLY


def test_only_the_console_files_are_public_beside_the_probes():
    from queen_mp.http.authz import is_public

    for path in ("/", "/console", "/console/app.js", "/console/pages/queue.js", "/health"):
        assert is_public(path), path
    for path in ("/consoles", "/console.js", "/api/v1/console", "/api/v1/dlq", "/api/v1/system/x",
                 "//console/app.js"):
        assert not is_public(path), path


# ------------------------------------------------------------------------------ producerSub
def test_stamped_item_adds_producer_sub_and_keeps_the_rest():
    mid = uuid.uuid4().bytes
    trace = uuid.uuid4().bytes
    raw = pack_frame(mid, b"txn-1", b'{"a":1}', trace_id=trace)
    f = next(iter_frames(raw))
    it = stamped_item("q", "p", f, "alice")
    g = next(iter_frames(it.frame))
    assert (g.message_id, g.trace_id, g.transaction_id, g.producer_sub, bytes(g.payload)) == (
        mid, trace, "txn-1", "alice", b'{"a":1}')
    assert it.chunk == -1 and it.producer_sub == "alice"


def test_json_items_take_the_token_sub_never_the_body():
    from queen_mp.http.push import parse_json_push

    body = json.dumps({"items": [{"queue": "q", "payload": 1, "producerSub": "mallory"},
                                 {"queue": "q", "payload": 2}]}).encode()
    for sub in ("alice", None):
        items = parse_json_push(body, sub)
        assert [next(iter_frames(i.frame)).producer_sub for i in items] == [sub, sub]


def test_spooled_items_keep_tenant_and_producer_sub(tmp_path):
    """Push maintenance spools every leader: the record carries the caller's tenant, and the
    stamped frame and the record both carry the sub, so the drain replays them as they were."""
    import asyncio

    from queen_mp.front.ingest import Ingest
    from queen_mp.front.spoolhold import SpoolHold
    from queen_mp.http.push import parse_json_push
    from queen_mp.ipc.flags import SPOOL
    from queen_mp.spool import SpoolItem

    class Spool:
        records: list[bytes] = []

        def append(self, records: list[bytes]) -> None:
            self.records.extend(records)

    spool = Spool()
    hold = SpoolHold(tmp_path, spool, None)  # type: ignore[arg-type]
    hold.route = lambda: SPOOL
    ingest = Ingest(None, 1, hold, 1000, None, None)  # type: ignore[arg-type]
    tenant = tenant_from_claim("acme")
    body = json.dumps({"items": [{"queue": "q", "payload": 1, "producerSub": "mallory"}]})
    results = asyncio.run(ingest.push(parse_json_push(body.encode(), "alice"), tenant))
    assert [r and r.status for r in results.each] == ["buffered"]
    (item,) = [SpoolItem.decode(r) for r in spool.records]
    assert (item.tenant, item.producer_sub) == (tenant, "alice")
    assert next(iter_frames(item.payload)).producer_sub == "alice"
