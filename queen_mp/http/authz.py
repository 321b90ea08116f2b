"""Authentication and authorization at the edge (docs/api.md 1.5): a falcon ASGI middleware.

It runs right after ``EdgeMiddleware`` and before ``Admission``, in ``process_request``, so a
request that is refused here never takes admission permits nor reads its body. Every request
leaves it with ``req.context.tenant`` (16 bytes), ``req.context.sub`` (str or None) and
``req.context.role`` (``queen_mp.auth.Role``); the resources read the tenant with
``tenant_of(req)`` and never anything else.

- Authentication off: every request is the default tenant's, without a subject, with every
  role; the ``Authorization`` header is not even looked at.
- Public, whatever the setting: ``/health``, ``/metrics``, ``/metrics/prometheus``,
  ``/api/v1/openapi.json``, the console's files (``/``, ``/console``, ``/console/*``: they
  hold no data; its pages call the API with the operator's token), and every
  ``OPTIONS`` (answered ``204`` by ``EdgeMiddleware``).
- Authentication on, anything else: a missing or unacceptable token is ``401 unauthorized``
  (with ``WWW-Authenticate: Bearer``); a role below the route's is ``403 forbidden``. The
  route's role is ``required_role(method, uri_template)``, on the template the app's own
  router finds for the path, so a path spelled differently cannot reach a route under a
  weaker rule. A path that matches no route needs ``read-only`` (it then answers 404).

Roles per route (docs/api.md 1.5, 5): ``admin`` for ``/api/v1/system/*``, queue delete
(``DELETE /api/v1/resources/queues/{queue}``), ephemeral queue delete
(``DELETE /api/v1/ephemeral/queue/{queue}``), consumer group delete (every ``DELETE`` under
``/api/v1/consumer-groups/``), queue purge (``POST /api/v1/resources/queues/{queue}/purge``)
and ``POST /api/v1/stats/refresh``;
``read-only`` for every other ``GET``/``HEAD`` except pops (``/api/v1/pop...`` and
``/api/v1/ephemeral/pop``); ``read-write`` for the rest (pops, push, ack, transaction,
lease extend, configure, KV, timers, locks, trace recording, DLQ retry and delete, seek,
subscription).

Payloads of encrypted messages are a matter of role too, inside a route: ``read-only`` may
browse messages and dead letters but not read what encryption protects, so the routes that
decrypt for a JSON answer ask ``reads_encrypted(req)`` and withhold the payload otherwise
(docs/api.md 1.5, 2.8, 2.9).

Errors are the docs/api.md 1.4 body; on the KV, timer and lock routes they take that family's shape
(``error`` = code, ``reason``, ``detail``), as every other error there does.
"""

from __future__ import annotations

from typing import Any

import falcon.asgi

from queen_mp.auth import ANONYMOUS_ADMIN, DEFAULT_TENANT, AuthError, Principal, Role, Verifier
from queen_mp.http.errors import ApiError, Forbidden, Unauthorized, kv_error

__all__ = ["ADMIN_DELETE_TREES", "ADMIN_ROUTES", "PUBLIC_PATHS", "PUBLIC_TREES", "Authz",
           "is_public", "reads_encrypted", "required_role", "sub_of", "tenant_of"]

#: ``/api/v1/openapi.json`` describes the API and holds no data (queen_mp/http/openapi.py).
PUBLIC_PATHS = frozenset({"/health", "/metrics", "/metrics/prometheus", "/api/v1/openapi.json",
                          "/", "/console"})
#: Every path under these is public: the console's static files (queen_mp/http/console.py).
PUBLIC_TREES = ("/console/",)
#: (method, uri template) of the admin routes outside the ``/api/v1/system/`` tree.
ADMIN_ROUTES = frozenset({("POST", "/api/v1/stats/refresh"),
                          ("POST", "/api/v1/resources/queues/{queue}/purge")})
#: Every DELETE under these is admin: queue delete and consumer group delete. A tree, not a
#: list of templates: ``DELETE /api/v1/consumer-groups/lagging`` deletes the group named
#: "lagging" (the literal route shadows ``{group}``), and a template added later is covered.
ADMIN_DELETE_TREES = ("/api/v1/resources/queues/", "/api/v1/consumer-groups/",
                      "/api/v1/ephemeral/queue/")
_ADMIN_TREE = "/api/v1/system/"
_POP_TREE = "/api/v1/pop"
#: GETs that consume (a pop moves a cursor): read-write, like the durable pops.
_CONSUMING_GETS = frozenset({"/api/v1/ephemeral/pop"})
_KV_SHAPED = ("/api/v1/kv", "/api/v1/timers", "/api/v1/locks")
_READ_METHODS = frozenset({"GET", "HEAD"})


def required_role(method: str, template: str | None) -> Role:
    """The least role that may call ``method`` on the route ``template`` (None: no route)."""
    if template is None:
        return Role.READ_ONLY
    if template.startswith(_ADMIN_TREE) or template == _ADMIN_TREE.rstrip("/") \
            or (method, template) in ADMIN_ROUTES \
            or (method == "DELETE" and template.startswith(ADMIN_DELETE_TREES)):
        return Role.ADMIN
    if method in _READ_METHODS and not (template == _POP_TREE
                                        or template.startswith(_POP_TREE + "/")
                                        or template in _CONSUMING_GETS):
        return Role.READ_ONLY
    return Role.READ_WRITE


def is_public(path: str) -> bool:
    """Whether ``path`` (a request path or a route template) is answered without a token."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_TREES)


def tenant_of(req: falcon.asgi.Request) -> bytes:
    """The caller's tenant (16 bytes), as the middleware decided it."""
    return getattr(req.context, "tenant", DEFAULT_TENANT)


def sub_of(req: falcon.asgi.Request) -> str | None:
    """The caller's token subject (stamped as producerSub), None without one."""
    return getattr(req.context, "sub", None)


def reads_encrypted(req: falcon.asgi.Request) -> bool:
    """Whether the caller may see encrypted payloads decrypted: ``read-write`` and above, and
    everyone with authentication off. A request the middleware did not see may not."""
    return getattr(req.context, "role", Role.NONE) >= Role.READ_WRITE


def _kv_shaped(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _KV_SHAPED)


class Authz:
    """``verifier`` None = authentication off. ``bind(app)`` gives it the app's router."""

    def __init__(self, verifier: Verifier | None) -> None:
        self.verifier = verifier
        self._find: Any = None

    def bind(self, app: falcon.asgi.App) -> None:
        # NOTE(auth): the app's own compiled router, so the role follows the exact template
        # falcon will dispatch to (trailing slashes and converters included).
        self._find = app._router.find

    def template(self, req: falcon.asgi.Request) -> str | None:
        if self._find is None:
            return None
        found = self._find(req.path, req=req)
        return found[3] if found is not None else None

    async def process_request(self, req: falcon.asgi.Request,
                              resp: falcon.asgi.Response) -> None:
        if self.verifier is None:
            self._set(req, ANONYMOUS_ADMIN)
            return
        if req.method == "OPTIONS" or is_public(req.path):
            self._set(req, Principal(Role.NONE, DEFAULT_TENANT, None))
            return
        template = self.template(req)
        if template is not None:
            # a refusal is counted under its route (falcon sets this only after routing)
            req.uri_template = template
        self._set(req, self.principal(req.method, req.path, template,
                                      req.get_header("Authorization")))

    def principal(self, method: str, path: str, template: str | None,
                  authorization: str | None) -> Principal:
        """Who calls ``method`` on ``path`` (the route ``template``) with this Authorization
        header; 401 or 403 if they may not. Authentication on, not a public path."""
        assert self.verifier is not None
        try:
            principal = self.verifier.verify_header(authorization)
        except AuthError as ex:
            raise _shaped(path, Unauthorized(
                str(ex), headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})) from None
        need = required_role(method, template)
        if principal.role < need:
            raise _shaped(path, Forbidden(
                f"{method} {template or path} needs the {need.label} role; the token "
                f"has {principal.role.label}", role=principal.role.label, needed=need.label))
        return principal

    @staticmethod
    def _set(req: falcon.asgi.Request, principal: Principal) -> None:
        req.context.tenant = principal.tenant
        req.context.sub = principal.sub
        req.context.role = principal.role


def _shaped(path: str, err: ApiError) -> ApiError:
    return kv_error(err) if _kv_shaped(path) else err
