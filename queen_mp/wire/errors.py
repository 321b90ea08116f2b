"""Errors raised while reading bytes that came from outside or from a ring.

Exception tree::

    ValueError
     ├── WireError              a client body breaks docs/api.md §1.7 / §3 (4xx, nothing stored)
     │    ├── BadFrame          400 bad_frame: magic, lengths, zstd, frame fields, trailing bytes
     │    ├── InvalidPayload    400 invalid_payload: a payload that is not JSON text (§3.3)
     │    ├── UnsupportedFlags  400 unsupported_flags: flag bits not implemented
     │    ├── InvalidRequest    400 invalid_request: too many items, malformed UUID text
     │    ├── InvalidName       400 invalid_name: empty name, control character, '/' in a queue
     │    ├── NameTooLong       413 name_too_long: name over 255 bytes, transactionId over 1024
     │    └── BodyTooLarge      413 body_too_large: a zstd frame over the decompression limit
     └── RecordDecodeError      a ring record that does not decode: a bug, never the client's fault

The HTTP layer renders a WireError with ``to_dict()`` and ``status``; it never branches on
the message text.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "BadFrame",
    "BodyTooLarge",
    "InvalidName",
    "InvalidPayload",
    "InvalidRequest",
    "NameTooLong",
    "RecordDecodeError",
    "UnsupportedFlags",
    "WireError",
]

# NOTE(wire): enough context to debug a body from a log line without keeping a 64 MiB body alive.
RAW_EXCERPT = 64


class WireError(ValueError):
    """A client's bytes break the wire contract; the whole request is rejected unchanged.

    ``offset`` is a byte position in the buffer the message names (the request body, or the
    decompressed bytes of a zstd frame); ``raw`` is an excerpt of that buffer starting at
    ``offset`` (or at 0), at most RAW_EXCERPT bytes.
    """

    code: ClassVar[str] = "bad_frame"
    status: ClassVar[int] = 400

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        offset: int | None = None,
        limit: int | None = None,
        field: str | None = None,
        raw: bytes | bytearray | memoryview | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.index = index
        self.offset = offset
        self.limit = limit
        self.field = field
        if raw is not None:
            start = offset if offset is not None and 0 <= offset <= len(raw) else 0
            raw = bytes(raw[start : start + RAW_EXCERPT])
        self.raw: bytes | None = raw

    def to_dict(self) -> dict[str, Any]:
        """The docs/api.md §1.4 error body; optional extras only when known."""
        body: dict[str, Any] = {"error": self.message, "code": self.code}
        if self.field is not None:
            body["field"] = self.field
        if self.limit is not None:
            body["limit"] = self.limit
        if self.index is not None:
            body["index"] = self.index
        if self.offset is not None:
            body["offset"] = self.offset
        return body

    def __repr__(self) -> str:
        extras = "".join(
            f", {name}={value!r}"
            for name in ("index", "offset", "limit", "field")
            if (value := getattr(self, name)) is not None
        )
        return f"{type(self).__name__}({self.message!r}{extras})"


class BadFrame(WireError):
    code = "bad_frame"


class InvalidPayload(WireError):
    code = "invalid_payload"


class UnsupportedFlags(WireError):
    code = "unsupported_flags"


class InvalidRequest(WireError):
    code = "invalid_request"


class InvalidName(WireError):
    code = "invalid_name"


class NameTooLong(WireError):
    code = "name_too_long"
    status = 413


class BodyTooLarge(WireError):
    code = "body_too_large"
    status = 413


class RecordDecodeError(ValueError):
    """A ring record that cannot be unpacked: the peer has a bug or the ring is corrupt.

    Carries the whole record (``raw``) so the log shows exactly what crossed the ring.
    """

    def __init__(self, message: str, raw: bytes | bytearray | memoryview) -> None:
        super().__init__(message)
        self.message = message
        self.raw = bytes(raw)
