"""What a route answers, whoever serves it.

Falcon's responders and error handler put an ``Answer`` on their response (``apply``); the hot
routes (queen_mp/http/hot.py) send it themselves. Both must leave the same bytes on the wire,
header order included, so the answer says how falcon renders it: ``data`` with the Content-Type
and headers the responder sets (before the middleware's CORS header), or ``media`` that falcon
serialises once the middleware ran (its Content-Type then comes after the CORS header).
"""

from __future__ import annotations

from typing import Any

import falcon.asgi
import msgspec

__all__ = ["JSON_UTF8", "Answer"]

JSON_UTF8 = "application/json; charset=utf-8"  # docs/api.md 1.6


class Answer(msgspec.Struct, frozen=True):
    """PERF(http): a frozen Struct, built in C (a frozen dataclass's ``__init__`` is a Python
    call and an ``object.__setattr__`` per field): one per request."""

    status: int
    data: bytes | None = None
    content_type: str = JSON_UTF8
    headers: tuple[tuple[str, str], ...] = ()  # (lowercase name, value), after Content-Type
    media: Any = None  # a JSON document for the media handler, when ``data`` is None

    def apply(self, resp: falcon.asgi.Response) -> None:
        resp.status = self.status
        if self.data is not None:
            resp.data = self.data
            resp.content_type = self.content_type
        elif self.media is not None:
            resp.media = self.media
        for name, value in self.headers:
            resp.set_header(name, value)
