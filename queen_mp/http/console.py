"""The operator's console (docs/console.md): ``GET /console``, its assets, and ``/`` to it.

The console is plain files shipped as package data under ``queen_mp/console/`` (ES modules,
one stylesheet, an icon): no build step, no Node process, nothing fetched from elsewhere. Each
front worker reads them once when it builds its app and serves them from memory. The pages call
the public HTTP API from the browser with the operator's token, so serving them needs no role
(``queen_mp.http.authz.is_public``): the files hold no data.

Answers carry a Content-Security-Policy that allows scripts, styles, images and fetches from the
broker's own origin only (no inline script, no inline style attribute, no frame), and
``Cache-Control: no-cache`` with a strong ETag: the files carry no version in their names, so a
browser revalidates each one (a ``304`` without a body) and never runs a stale module after an
upgrade.
"""

from __future__ import annotations

import hashlib
import html
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import falcon
import falcon.asgi

from queen_mp.config import Config
from queen_mp.http.errors import NotFound

__all__ = ["CONSOLE_PATH", "CSP", "Asset", "ConsoleAssetResource", "ConsoleResource",
           "RootResource", "load_assets"]

CONSOLE_PATH = "/console"
#: NOTE(console): 'self' everywhere; no 'unsafe-inline' for scripts nor styles.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_INDEX = "index.html"
#: the placeholder of index.html that becomes the broker's authentication mode
_AUTH_MARK = "{{auth}}"


@dataclass(frozen=True, slots=True)
class Asset:
    """One file as served: its bytes, media type and strong ETag."""

    body: bytes
    content_type: str
    etag: str


def _walk(folder: Traversable, prefix: str = "") -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for entry in folder.iterdir():
        name = prefix + entry.name
        if entry.is_dir():
            out.update(_walk(entry, name + "/"))
        elif "." + name.rsplit(".", 1)[-1] in _TYPES:
            out[name] = entry.read_bytes()
    return out


def load_assets(config: Config) -> dict[str, Asset]:
    """Every console file by its path under ``/console/``; index.html says whether the broker
    asks for a token (so the page knows without provoking a 401)."""
    files = _walk(resources.files("queen_mp").joinpath("console"))
    if _INDEX not in files:
        raise FileNotFoundError("queen_mp/console/index.html is missing from the package")
    mode = "jwt" if config.jwt_enabled else "off"
    files[_INDEX] = files[_INDEX].replace(_AUTH_MARK.encode(), html.escape(mode).encode())
    return {name: Asset(body, _TYPES["." + name.rsplit(".", 1)[-1]],
                        '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
            for name, body in files.items()}


def _serve(req: falcon.asgi.Request, resp: falcon.asgi.Response, asset: Asset) -> None:
    resp.set_header("Content-Security-Policy", CSP)
    resp.set_header("X-Content-Type-Options", "nosniff")
    resp.set_header("Referrer-Policy", "no-referrer")
    resp.set_header("Cache-Control", "no-cache")
    resp.set_header("ETag", asset.etag)
    resp.content_type = asset.content_type
    if asset.etag in (req.get_header("If-None-Match") or ""):
        resp.status = falcon.HTTP_304
        return
    resp.status = falcon.HTTP_200
    resp.data = asset.body


class ConsoleResource:
    """``GET /console``: the page shell; the pages themselves are routed in the browser."""

    def __init__(self, assets: dict[str, Asset]) -> None:
        self.index = assets[_INDEX]

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        _serve(req, resp, self.index)


class ConsoleAssetResource:
    """``GET /console/{asset}``: a module, the stylesheet or the icon; 404 for anything else."""

    def __init__(self, assets: dict[str, Asset]) -> None:
        self.assets = assets

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                     asset: str) -> None:
        found = self.assets.get(asset)
        if found is None:
            raise NotFound(f"no console file {asset!r}")
        _serve(req, resp, found)


class RootResource:
    """``GET /``: what a person typing the broker's address wants is the console."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.status = falcon.HTTP_302
        resp.set_header("Location", CONSOLE_PATH)
        resp.set_header("Cache-Control", "no-cache")
