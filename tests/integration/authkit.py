"""Shared by the auth and tenancy tests: a broker with JWT authentication on, and tokens."""

from __future__ import annotations

import time
from pathlib import Path

import falcon.inspect
import jwt

from queen_mp.config import Config
from queen_mp.front.worker import FrontWorker
from queen_mp.http.app import create_app
from tests.brokerharness import Broker, start_broker

SECRET = "integration-secret-" + "0123456789abcdef" * 4
ISSUER = "https://issuer.queen-mp.test"
AUDIENCE = "queen-mp-test"


def start_auth_broker(tmp: Path, dsn: str, **settings: str) -> Broker:
    return start_broker(tmp, dsn, QUEEN_JWT_ENABLED="1", QUEEN_JWT_SECRET=SECRET,
                        QUEEN_JWT_ISSUER=ISSUER, QUEEN_JWT_AUDIENCE=AUDIENCE, **settings)


def token(role: str | None = None, *, tenant: str | None = None, sub: str | None = None,
          exp_in: float = 600, aud: str = AUDIENCE, iss: str = ISSUER, secret: str = SECRET,
          **extra: object) -> str:
    claims: dict[str, object] = {"iss": iss, "aud": aud, "exp": int(time.time() + exp_in),
                                 **extra}
    if role is not None:
        claims["role"] = role
    if tenant is not None:
        claims["tenant"] = tenant
    if sub is not None:
        claims["sub"] = sub
    return jwt.encode(claims, secret, algorithm="HS256")


def bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def app_routes() -> list[tuple[str, str]]:
    """(method, uri template) of every responder registered by ``create_app``."""
    cfg = Config.load({})
    app = create_app(cfg, None, FrontWorker(cfg, None))  # type: ignore[arg-type]
    return [(m.method, r.path) for r in falcon.inspect.inspect_routes(app)
            for m in r.methods if not m.internal]
