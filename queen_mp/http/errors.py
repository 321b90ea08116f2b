"""API errors: one base class, one subclass per row of docs/api.md section 1.4, one renderer.

The one place where a failure becomes an HTTP answer. Responders raise; ``error_of`` maps
every failure to the ``ApiError`` rendered as ``{"error", "code", ...}`` JSON (by
``handle_error`` in falcon, by queen_mp/http/hot.py on the hot routes): an ``ApiError`` as it
is, a domain refusal of the request models (``queen_mp.models.errors.RequestError``) or of the
wire decoders (``queen_mp.wire.errors.WireError``) as the ``ApiError`` of its code. Anything
else (but a falcon routing error) is a bug: it is logged and answered ``500 internal``, and
the worker goes on serving.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import falcon
import orjson

from queen_mp.http.answer import JSON_UTF8, Answer
from queen_mp.models.errors import RequestError
from queen_mp.wire.errors import WireError

__all__ = [
    "JSON_UTF8",
    "ApiError",
    "BadFrame",
    "BodyTooLarge",
    "Conflict",
    "Forbidden",
    "Internal",
    "InvalidName",
    "InvalidPayload",
    "InvalidRequest",
    "InvalidStatus",
    "Maintenance",
    "MethodNotAllowed",
    "NameTooLong",
    "NotFound",
    "OutcomeUnknown",
    "Overloaded",
    "StorageFull",
    "Timeout",
    "Unauthorized",
    "Unavailable",
    "Unsupported",
    "UnsupportedEncoding",
    "UnsupportedFlags",
    "error_answer",
    "error_of",
    "from_request",
    "from_wire",
    "handle_error",
    "kv_error",
]

log = logging.getLogger("queen_mp.http")


class ApiError(Exception):
    """A client-visible failure with its HTTP status and stable API code."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, **self.extra}


def _error(name: str, status: int, code: str, doc: str) -> type[ApiError]:
    return type(name, (ApiError,), {"status": status, "code": code, "__doc__": doc})


InvalidRequest = _error("InvalidRequest", 400, "invalid_request", "Malformed or contradictory.")
InvalidName = _error("InvalidName", 400, "invalid_name", "Empty or forbidden characters.")
InvalidStatus = _error("InvalidStatus", 400, "invalid_status", "Ack status not allowed here.")
InvalidPayload = _error("InvalidPayload", 400, "invalid_payload", "Binary payload not JSON.")
BadFrame = _error("BadFrame", 400, "bad_frame", "Malformed binary body.")
UnsupportedFlags = _error("UnsupportedFlags", 400, "unsupported_flags", "Unknown flag bits.")
Unsupported = _error("Unsupported", 400, "unsupported", "Unimplemented feature parameter.")
Unauthorized = _error("Unauthorized", 401, "unauthorized", "Token missing or invalid.")
Forbidden = _error("Forbidden", 403, "forbidden", "Role too low.")
NotFound = _error("NotFound", 404, "not_found", "Unknown route or absent resource.")
MethodNotAllowed = _error("MethodNotAllowed", 405, "method_not_allowed", "Wrong method.")
Conflict = _error("Conflict", 409, "conflict", "Contradicts current state.")
NameTooLong = _error("NameTooLong", 413, "name_too_long", "A name over its limit.")
BodyTooLarge = _error("BodyTooLarge", 413, "body_too_large", "A body over its limit.")
UnsupportedEncoding = _error("UnsupportedEncoding", 415, "unsupported_encoding",
                             "Content-Encoding other than identity, gzip, zstd.")
Overloaded = _error("Overloaded", 429, "overloaded", "Admission budget full too long.")
Internal = _error("Internal", 500, "internal", "A bug; effect unknown.")
Unavailable = _error("Unavailable", 503, "unavailable",
                     "PostgreSQL unreachable or a shard down; nothing attempted.")
Timeout = _error("Timeout", 503, "timeout", "Deadline passed, outcome not known.")
OutcomeUnknown = _error("OutcomeUnknown", 503, "outcome_unknown", "Commit sent, result lost.")
Maintenance = _error("Maintenance", 503, "maintenance", "Write refused in push maintenance.")
StorageFull = _error("StorageFull", 507, "storage_full", "Disk above the high-water mark.")

_WIRE_STATUS = {"body_too_large": BodyTooLarge, "name_too_long": NameTooLong,
                "invalid_payload": InvalidPayload, "unsupported_flags": UnsupportedFlags,
                "invalid_name": InvalidName, "invalid_request": InvalidRequest}
_REQUEST_STATUS = {"invalid_request": InvalidRequest, "invalid_name": InvalidName,
                   "invalid_status": InvalidStatus, "name_too_long": NameTooLong,
                   "bad_frame": BadFrame, "unsupported_flags": UnsupportedFlags}


def kv_error(ex: ApiError) -> ApiError:
    """The same error in the KV/timer shape: ``error`` is the code, the text is ``detail``."""
    extra = {**ex.extra, "reason": ex.extra.get("reason") or ex.code,
             "detail": ex.extra.get("detail") or ex.message}
    return type(ex)(ex.code, headers=ex.headers, **extra)


def from_wire(ex: WireError) -> ApiError:
    """Wire decoding errors carry their API code; keep their position details."""
    cls = _WIRE_STATUS.get(ex.code, BadFrame)
    return cls(ex.message, index=ex.index, offset=ex.offset, limit=ex.limit, field=ex.field)


def from_request(ex: ApiError | RequestError) -> ApiError:
    """A request model's refusal as the API error of its code, fields in the same order."""
    if isinstance(ex, ApiError):
        return ex
    return _REQUEST_STATUS.get(ex.code, InvalidRequest)(ex.message, **ex.extra)


def _from_falcon(ex: falcon.HTTPError) -> ApiError:
    if ex.status_code == 404:
        return NotFound(ex.description or "not found")
    if ex.status_code == 405:
        allow = (ex.headers or {}).get("Allow", "")
        return MethodNotAllowed("method not allowed", headers={"Allow": allow} if allow else None)
    if ex.status_code == 413:
        return BodyTooLarge(ex.description or "body too large")
    if ex.status_code == 415:
        return UnsupportedEncoding(ex.description or "unsupported encoding")
    if 400 <= ex.status_code < 500:
        return InvalidRequest(ex.description or ex.title or "invalid request")
    return Internal(ex.description or ex.title or "internal error")


def error_answer(err: ApiError) -> Answer:
    """The answer of an API error: its JSON, then its own headers."""
    return Answer(err.status, orjson.dumps(err.to_dict()), JSON_UTF8,
                  tuple((name.lower(), str(value)) for name, value in err.headers.items()))


def error_of(ex: BaseException, method: str, path: str) -> ApiError:
    """API errors as they are, the rest mapped, or logged (a bug on ``method path``) as 500."""
    if isinstance(ex, ApiError):
        return ex
    if isinstance(ex, RequestError):
        return from_request(ex)
    if isinstance(ex, WireError):
        return from_wire(ex)
    if isinstance(ex, falcon.HTTPError):
        return _from_falcon(ex)
    log.exception("unhandled error on %s %s", method, path, exc_info=ex)
    return Internal(f"internal error: {type(ex).__name__}")


async def handle_error(req: falcon.asgi.Request, resp: falcon.asgi.Response,
                       ex: BaseException, params: dict[str, Any]) -> None:
    """The one error handler of the falcon app (``error_of``, rendered)."""
    error_answer(error_of(ex, req.method, req.path)).apply(resp)
