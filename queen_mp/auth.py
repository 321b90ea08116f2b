"""JWT verification (docs/api.md 1.5): who is calling, with which role, for which tenant.

``Verifier.from_config`` builds the keys once per process from the ``QUEEN_JWT_*`` settings;
``Verifier.verify`` turns the value of an ``Authorization`` header into a ``Principal`` or
raises ``AuthError`` (answered ``401 unauthorized`` by ``queen_mp.http.authz``).

Keys and algorithms. ``QUEEN_JWT_ALGORITHMS`` (comma separated) lists what a token's ``alg``
may be; ``none`` is never accepted. An HMAC algorithm (``HS256``/``HS384``/``HS512``) verifies
with ``QUEEN_JWT_SECRET`` only; an asymmetric one (``RS*``, ``PS*``, ``ES*``, ``EdDSA``) with
the PEM public key of ``QUEEN_JWT_PUBLIC_KEY_FILE`` and the keys of ``QUEEN_JWT_JWKS_FILE``
(PyJWT's ``PyJWKSet``), never with the secret, so a token signed with a public key as an HMAC
secret (algorithm confusion) cannot pass. A token whose header names a ``kid`` is verified
with that JWKS key only; without ``kid`` every asymmetric key that fits the algorithm is tried.

Claims. ``exp``, ``nbf`` and ``iat`` are checked when present, with 30 s of leeway (clock
skew); ``iss`` and ``aud`` are required and checked when ``QUEEN_JWT_ISSUER`` /
``QUEEN_JWT_AUDIENCE`` are set (the audience may list several values, comma separated: any one
of them must be in the token's ``aud``). A token without ``exp`` does not expire.

Role. Claim ``role`` (a string) or ``roles`` (an array of strings); the highest known of
``read-only`` < ``read-write`` < ``admin`` wins, unknown names are ignored. A valid token
without a known role is authenticated but may do nothing (``403`` on every non-public route).

Tenant. Claim ``QUEEN_JWT_TENANT_CLAIM`` (``tenant``): a UUID in its canonical text form
(8-4-4-4-12 hex digits, any case) is the tenant itself; any other non-empty string names the
tenant ``uuid5(TENANT_NAMESPACE, value)``; absent (or JSON null) is the default tenant, the
zero UUID, which is also every request's tenant while authentication is off. An empty string or
a non-string value makes the token invalid (it would otherwise silently mean some tenant).

Subject. ``sub`` is kept (stamped as ``producerSub`` on pushed messages); it must be a string of
at most ``MAX_SUB_BYTES`` UTF-8 bytes without NUL, else the token is invalid.
"""

from __future__ import annotations

import enum
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from queen_mp.config import Config, ConfigError

if TYPE_CHECKING:
    # PERF(auth): PyJWT pulls in cryptography and urllib.request (12 MB of RSS per process);
    # it is imported where keys are loaded and tokens decoded, i.e. only with JWT enabled.
    import jwt

__all__ = [
    "DEFAULT_TENANT",
    "LEEWAY_S",
    "MAX_SUB_BYTES",
    "TENANT_NAMESPACE",
    "AuthError",
    "Principal",
    "Role",
    "Verifier",
    "tenant_from_claim",
]

#: The tenant of requests without a tenant claim, and of every request while auth is off:
#: the zero UUID (``queen_mp.wire.ids.ZERO_UUID``; auth sits below wire, so it is spelt here).
DEFAULT_TENANT = bytes(16)
#: Namespace of tenant names that are not UUIDs: uuid5(NAMESPACE_URL, "urn:queen-mp:tenant").
#: Fixed forever: changing it would move every named tenant's data out of its reach.
TENANT_NAMESPACE = uuid.UUID("80163fa7-7eee-510b-9661-189299c29414")
LEEWAY_S = 30
MAX_SUB_BYTES = 1024
#: Verified tokens are remembered this long at most (and never past their own ``exp``).
CACHE_TTL_S = 60.0
CACHE_MAX = 4096
CACHE_TOKEN_MAX = 8192  # longer tokens are verified every time, never remembered

_HMAC = frozenset({"HS256", "HS384", "HS512"})
_ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                         "ES256", "ES256K", "ES384", "ES512", "EdDSA", "Ed25519"})
_UUID_TEXT = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}"
                        r"-[0-9a-fA-F]{12}$")


class Role(enum.IntEnum):
    """Ordered: a higher role may do everything a lower one may."""

    NONE = 0
    READ_ONLY = 1
    READ_WRITE = 2
    ADMIN = 3

    @classmethod
    def named(cls, name: str) -> Role | None:
        return _ROLE_NAMES.get(name)

    @property
    def label(self) -> str:
        return {Role.NONE: "none", Role.READ_ONLY: "read-only", Role.READ_WRITE: "read-write",
                Role.ADMIN: "admin"}[self]


_ROLE_NAMES = {"read-only": Role.READ_ONLY, "read-write": Role.READ_WRITE, "admin": Role.ADMIN}


class AuthError(Exception):
    """The token is missing or not acceptable; the message says why (no secret in it)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: its role, its tenant (16 bytes) and its subject."""

    role: Role
    tenant: bytes
    sub: str | None


#: Auth off: everyone is an admin of the default tenant, without a subject.
ANONYMOUS_ADMIN = Principal(Role.ADMIN, DEFAULT_TENANT, None)


def tenant_from_claim(value: Any) -> bytes:
    """The 16-byte tenant a claim value names (module docstring); raises AuthError."""
    if value is None:
        return DEFAULT_TENANT
    if not isinstance(value, str) or not value:
        raise AuthError("the tenant claim must be a non-empty string")
    if _UUID_TEXT.match(value):
        return uuid.UUID(value).bytes
    return uuid.uuid5(TENANT_NAMESPACE, value).bytes


def role_from_claims(claims: dict[str, Any]) -> Role:
    names: list[Any] = []
    if isinstance(claims.get("role"), str):
        names.append(claims["role"])
    roles = claims.get("roles")
    if isinstance(roles, list):
        names.extend(roles)
    elif isinstance(roles, str):
        names.append(roles)
    best = Role.NONE
    for name in names:
        role = Role.named(name) if isinstance(name, str) else None
        if role is not None and role > best:
            best = role
    return best


def _sub(claims: dict[str, Any]) -> str | None:
    sub = claims.get("sub")
    if sub is None:
        return None
    if not isinstance(sub, str):
        raise AuthError("the sub claim must be a string")
    if "\x00" in sub:
        raise AuthError("the sub claim contains a NUL character")
    try:
        size = len(sub.encode("utf-8"))
    except UnicodeEncodeError:
        raise AuthError("the sub claim is not valid UTF-8 text") from None
    if size > MAX_SUB_BYTES:
        raise AuthError(f"the sub claim is over {MAX_SUB_BYTES} bytes")
    return sub or None


def _split(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


class Verifier:
    """Verifies bearer tokens against the configured keys; one per process."""

    def __init__(self, algorithms: Sequence[str], *, secret: str = "",
                 public_keys: Sequence[Any] = (), jwks: jwt.PyJWKSet | None = None,
                 issuer: str = "", audience: Sequence[str] = (), tenant_claim: str = "tenant",
                 clock: Any = time.time) -> None:
        unknown = [a for a in algorithms if a not in _HMAC | _ASYMMETRIC]
        if unknown:
            raise ConfigError(f"QUEEN_JWT_ALGORITHMS: unsupported {', '.join(unknown)} (use "
                              "HS256/384/512, RS*, PS*, ES*, EdDSA)")
        if not algorithms:
            raise ConfigError("QUEEN_JWT_ALGORITHMS: at least one algorithm is needed")
        self.algorithms = tuple(algorithms)
        self.secret = secret
        self.public_keys = tuple(public_keys)
        self.jwks = jwks
        if any(a in _HMAC for a in algorithms) and not secret and not (
                any(a in _ASYMMETRIC for a in algorithms) and (public_keys or jwks)):
            raise ConfigError("QUEEN_JWT_ALGORITHMS lists an HMAC algorithm but "
                              "QUEEN_JWT_SECRET is empty")
        if any(a in _ASYMMETRIC for a in algorithms) and not (public_keys or jwks) and not (
                any(a in _HMAC for a in algorithms) and secret):
            raise ConfigError("QUEEN_JWT_ALGORITHMS lists a public-key algorithm but neither "
                              "QUEEN_JWT_PUBLIC_KEY_FILE nor QUEEN_JWT_JWKS_FILE is set")
        self.issuer = issuer
        self.audience = tuple(audience)
        self.tenant_claim = tenant_claim
        self._clock = clock
        self._cache: dict[str, tuple[float, Principal]] = {}

    @classmethod
    def from_config(cls, config: Config) -> Verifier | None:
        """None while authentication is off; raises ConfigError for unusable settings."""
        if not config.jwt_enabled:
            return None
        public_keys: list[Any] = []
        if config.jwt_public_key_file:
            pem = _read(config.jwt_public_key_file, "QUEEN_JWT_PUBLIC_KEY_FILE")
            try:
                from cryptography.hazmat.primitives.serialization import load_pem_public_key

                public_keys.append(load_pem_public_key(pem))
            except ValueError as ex:
                raise ConfigError(f"QUEEN_JWT_PUBLIC_KEY_FILE: not a PEM public key ({ex})"
                                  ) from None
        jwks = None
        if config.jwt_jwks_file:
            import jwt

            raw = _read(config.jwt_jwks_file, "QUEEN_JWT_JWKS_FILE")
            try:
                jwks = jwt.PyJWKSet.from_json(raw.decode("utf-8"))
            except (jwt.PyJWTError, ValueError, KeyError, TypeError) as ex:
                raise ConfigError(f"QUEEN_JWT_JWKS_FILE: not a usable JWKS ({ex})") from None
        return cls(_split(config.jwt_algorithms), secret=config.jwt_secret,
                   public_keys=public_keys, jwks=jwks, issuer=config.jwt_issuer,
                   audience=_split(config.jwt_audience), tenant_claim=config.jwt_tenant_claim)

    # --- verification
    def verify_header(self, header: str | None) -> Principal:
        """The principal of an ``Authorization`` header value; raises AuthError."""
        if not header:
            raise AuthError("missing bearer token (Authorization: Bearer <JWT>)")
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError("the Authorization header must be 'Bearer <JWT>'")
        return self.verify(token)

    def verify(self, token: str) -> Principal:
        now = self._clock()
        hit = self._cache.get(token)
        if hit is not None:
            if hit[0] > now:
                return hit[1]
            del self._cache[token]
        claims = self._decode(token)
        principal = Principal(role_from_claims(claims),
                              tenant_from_claim(claims.get(self.tenant_claim)), _sub(claims))
        # PERF(auth): a client sends the same token on every request; remember the verdict
        # until the token expires (at most CACHE_TTL_S), so steady traffic skips the signature.
        until = now + CACHE_TTL_S
        exp = claims.get("exp")
        if isinstance(exp, int | float):
            until = min(until, float(exp) + LEEWAY_S)
        if len(token) <= CACHE_TOKEN_MAX:
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[token] = (until, principal)
        return principal

    def _decode(self, token: str) -> dict[str, Any]:
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as ex:
            raise AuthError(f"malformed token: {ex}") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise AuthError(f"token algorithm {alg!r} is not accepted")
        options: dict[str, Any] = {"require": []}
        if self.issuer:
            options["require"].append("iss")
        if self.audience:
            options["require"].append("aud")
        else:
            options["verify_aud"] = False
        last: Exception | None = None
        for key in self._keys(alg, header.get("kid")):
            try:
                claims = jwt.decode(token, key, algorithms=[alg], options=options,
                                    audience=list(self.audience) or None,
                                    issuer=self.issuer or None, leeway=LEEWAY_S)
            except jwt.InvalidSignatureError as ex:
                last = ex
                continue  # another key may fit
            except (jwt.PyJWTError, ValueError, TypeError) as ex:
                raise AuthError(_reason(ex)) from None
            if not isinstance(claims, dict):
                raise AuthError("the token's payload is not a JSON object")
            return claims
        if last is None:
            raise AuthError("no configured key can verify this token")
        raise AuthError("bad token signature")

    def _keys(self, alg: str, kid: Any) -> list[Any]:
        if alg in _HMAC:
            return [self.secret] if self.secret else []
        if kid is not None and self.jwks is not None:
            try:
                return [self.jwks[str(kid)].key]
            except KeyError:
                return []
        keys = list(self.public_keys)
        if self.jwks is not None:
            keys.extend(k.key for k in self.jwks.keys
                        if k.algorithm_name in (alg, None) or _same_family(k, alg))
        return keys


def _same_family(key: jwt.PyJWK, alg: str) -> bool:
    return (key.key_type == "OKP" and alg in ("EdDSA", "Ed25519")) or \
        (key.key_type == "RSA" and alg[:2] in ("RS", "PS")) or \
        (key.key_type == "EC" and alg.startswith("ES"))


def _reason(ex: Exception) -> str:
    import jwt

    if isinstance(ex, jwt.ExpiredSignatureError):
        return "token expired"
    if isinstance(ex, jwt.ImmatureSignatureError):
        return "token not yet valid"
    if isinstance(ex, jwt.InvalidAudienceError):
        return "token audience not accepted"
    if isinstance(ex, jwt.InvalidIssuerError):
        return "token issuer not accepted"
    if isinstance(ex, jwt.MissingRequiredClaimError):
        return f"token lacks the {ex.claim} claim"
    return f"invalid token: {type(ex).__name__}"


def _read(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as ex:
        raise ConfigError(f"{setting}={path!r}: unreadable ({ex.strerror})") from None
