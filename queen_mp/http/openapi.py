"""``GET /api/v1/openapi.json``: the OpenAPI 3.1 description of the API (docs/api.md is the
human reference of the same routes).

The document is package data (``queen_mp/http/openapi.json``), read once when the front
worker builds its app and served byte for byte. It describes the API and holds no data, so
it is public like ``/health`` (``queen_mp.http.authz.PUBLIC_PATHS``).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.http.errors import JSON_UTF8

__all__ = ["OPENAPI_PATH", "OpenApiResource", "document", "document_bytes"]

OPENAPI_PATH = "/api/v1/openapi.json"
_RESOURCE = "openapi.json"


@functools.cache
def document_bytes() -> bytes:
    """The document as shipped; a file that is not a JSON object fails loudly, at start."""
    raw = resources.files("queen_mp.http").joinpath(_RESOURCE).read_bytes()
    if not isinstance(orjson.loads(raw), dict):
        raise ValueError(f"queen_mp/http/{_RESOURCE} is not a JSON object")
    return raw


def document() -> dict[str, Any]:
    """A fresh parsed copy of the document (for tests and tools)."""
    return orjson.loads(document_bytes())


class OpenApiResource:
    def __init__(self) -> None:
        self.body = document_bytes()

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.data = self.body
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200
