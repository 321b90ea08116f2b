"""``POST /api/v1/lease/{leaseId}/extend``: best-effort renewal, always 200 when well formed.

No body (what the 2.6 client sends), ``{}`` or ``{"seconds": 1..86400}``; without seconds each
lease is extended by its queue's leaseTime (a fixed 60 s would never extend a lease that is
renewed less often than that).
"""

from __future__ import annotations

import uuid
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db import pop_procs
from queen_mp.db.errors import DatabaseError
from queen_mp.db.pooled import connection
from queen_mp.front.worker import FrontWorker
from queen_mp.http.authz import tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.errors import InvalidRequest
from queen_mp.wire.times import iso_ms

__all__ = ["LeaseExtendResource"]

_MAX_BODY = 1 << 16
_MAX_SECONDS = 86_400


def _seconds(body: bytes) -> int | None:
    if not body.strip():
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as ex:
        raise InvalidRequest(f"malformed JSON body: {ex}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    seconds = doc.get("seconds")
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int) \
            or not 1 <= seconds <= _MAX_SECONDS:
        raise InvalidRequest(f"seconds must be an integer 1..{_MAX_SECONDS}", field="seconds")
    return seconds


class LeaseExtendResource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                      lease_id: str) -> None:
        seconds = _seconds(await read_body(req, _MAX_BODY))
        body: dict[str, Any] = {"success": False, "leaseId": lease_id, "renewed": 0,
                                "newExpiresAt": None, "expiresAt": None}
        try:
            lease = uuid.UUID(lease_id)
        except ValueError:
            body["error"] = "lease_not_found"
            resp.media = body
            return
        tenant = tenant_of(req)
        try:
            # NOTE(auth): the tenant gate and the renewal are one statement
            # (log_renew_lease_v1): another tenant's lease renews nothing and answers exactly
            # as an unknown one (design.md invariant 8).
            async with connection(self.worker.pool, commit_sent=True) as conn:
                renewed, expires = await pop_procs.renew_lease(conn, tenant, lease, seconds)
        except DatabaseError:
            body["error"] = "unavailable"
            resp.media = body
            return
        if not renewed:
            body["error"] = "lease_not_found"
        else:
            body.update(success=True, renewed=renewed, newExpiresAt=iso_ms(expires),
                        expiresAt=iso_ms(expires))
        resp.media = body
