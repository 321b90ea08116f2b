"""Reading request bodies within the limits of docs/api.md 1.6/1.7, before any parsing.

The declared Content-Length is checked before a byte is read; a body without one is read up to
the limit and no further. ``gzip`` and ``zstd`` request encodings are decoded with the decoded
size bounded by the same limit (a decompression bomb costs us at most the limit), any other
encoding is ``415``.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterable

import falcon.asgi
import zstandard

from queen_mp.http.errors import ApiError, BodyTooLarge, InvalidRequest, UnsupportedEncoding

__all__ = ["read_body", "read_chunks", "read_stream", "read_whole"]

_READ_CHUNK = 1 << 16


async def read_body(req: falcon.asgi.Request, limit: int) -> bytes:
    """The body of a falcon request (``read_stream`` of its stream)."""
    return await read_stream(req.content_length, req.stream, req.get_header("Content-Encoding"),
                             limit)


async def read_stream(declared: int | None, chunks: bytes | AsyncIterable[bytes],
                      encoding: str | None, limit: int) -> bytes:
    """A body of ``declared`` bytes (the Content-Length, None without one) from its chunks (or
    whole, as the front's lean path read it), decoded per its Content-Encoding, within
    ``limit``."""
    if not isinstance(chunks, bytes):
        chunks = await read_chunks(declared, chunks, limit)
    return read_whole(declared, chunks, encoding, limit)


async def read_chunks(declared: int | None, chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """A body's chunks joined as they came (not decoded), within ``limit``: what
    ``read_whole`` takes."""
    if declared is not None and declared > limit:
        raise _declared_over(declared, limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body is over the {limit} byte limit", limit=limit)
        parts.append(chunk)
    return b"".join(parts)


def read_whole(declared: int | None, body: bytes, encoding: str | None, limit: int) -> bytes:
    """``read_stream`` of a body read whole (the front's lean path), with no coroutine.

    PERF(http): an identity body is checked inline, with no call beyond this one."""
    if declared is not None and declared > limit:
        raise _declared_over(declared, limit)
    size = len(body)
    if size > limit:
        raise BodyTooLarge(f"body is over the {limit} byte limit", limit=limit)
    if encoding is None and (declared is None or size == declared):
        return body
    return _decoded(declared, body, size, encoding, limit)


def _declared_over(declared: int, limit: int) -> ApiError:
    return BodyTooLarge(f"body of {declared} bytes is over the {limit} byte limit", limit=limit)


def _decoded(declared: int | None, body: bytes, size: int, encoding: str | None,
             limit: int) -> bytes:
    """``body`` (``size`` bytes read of ``declared``) decoded per its Content-Encoding."""
    if declared is not None and size != declared:
        # NOTE(queen): the client went away mid-body (the ASGI stream just ends): never act
        # on a truncated body as if it were whole.
        raise InvalidRequest(f"body of {size} bytes, but Content-Length said {declared}",
                             field="Content-Length")
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return _gunzip(body, limit)
    if encoding == "zstd":
        return _unzstd(body, limit)
    raise UnsupportedEncoding(f"Content-Encoding {encoding!r} is not supported "
                              "(identity, gzip, zstd)")


def _gunzip(body: bytes, limit: int) -> bytes:
    """Every member of a (possibly multi-member, RFC 1952) gzip body, bounded in total."""
    out: list[bytes] = []
    size = 0
    rest = body
    while True:
        d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            part = d.decompress(rest, limit + 1 - size)
        except zlib.error as ex:
            raise InvalidRequest(f"gzip body does not decode: {ex}") from ex
        size += len(part)
        if size > limit or d.unconsumed_tail:
            raise BodyTooLarge(f"decoded body is over the {limit} byte limit", limit=limit)
        if not d.eof:
            raise InvalidRequest("gzip body is truncated")
        out.append(part)
        rest = d.unused_data
        if not rest:
            return b"".join(out)


def _unzstd(body: bytes, limit: int) -> bytes:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
        out = reader.read(limit + 1)
    except zstandard.ZstdError as ex:
        raise InvalidRequest(f"zstd body does not decode: {ex}") from ex
    if len(out) > limit:
        raise BodyTooLarge(f"decoded body is over the {limit} byte limit", limit=limit)
    return out
