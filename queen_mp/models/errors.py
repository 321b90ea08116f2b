"""Refusals of a request model, whatever carried the request: one class per stable code.

A parser raises them with the facts of the refusal (``index``, ``field``, ``limit``, and for the
KV/timer shape ``reason`` and ``detail``), in the order the answer lists them; which status a
code answers with is the HTTP layer's business (``queen_mp.http.errors.from_request``).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "BadFrame",
    "InvalidName",
    "InvalidRequest",
    "InvalidStatus",
    "NameTooLong",
    "RequestError",
    "UnsupportedFlags",
]


class RequestError(Exception):
    """A request this broker refuses, unchanged; ``extra`` keeps its fields (None dropped)
    in the order given."""

    code: ClassVar[str] = "invalid_request"

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = {k: v for k, v in extra.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """The error body of docs/api.md 1.4."""
        return {"error": self.message, "code": self.code, **self.extra}


class InvalidRequest(RequestError):
    """Malformed or contradictory."""

    code = "invalid_request"


class InvalidName(RequestError):
    """Empty or forbidden characters."""

    code = "invalid_name"


class InvalidStatus(RequestError):
    """Ack status not allowed here."""

    code = "invalid_status"


class NameTooLong(RequestError):
    """A name over its limit."""

    code = "name_too_long"


class BadFrame(RequestError):
    """Malformed binary body."""

    code = "bad_frame"


class UnsupportedFlags(RequestError):
    """Unknown flag bits."""

    code = "unsupported_flags"
