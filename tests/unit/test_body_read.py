"""``read_whole`` (a body the lean path read whole) answers as ``read_stream`` of its chunks."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import pytest

from queen_mp.http.body import read_stream, read_whole
from queen_mp.http.errors import ApiError

pytestmark = pytest.mark.timeout(20)


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(body), 7):
        yield body[i:i + 7]


def _outcome(fn: object) -> tuple[str, object]:
    try:
        return "ok", fn()  # type: ignore[operator]
    except ApiError as ex:
        return "error", (type(ex).__name__, str(ex))


@pytest.mark.parametrize(("declared", "body", "encoding", "limit"), [
    (5, b"hello", None, 100),
    (None, b"hello", "identity", 100),
    (6, b"hello", None, 100),           # truncated: Content-Length said more
    (500, b"hello", None, 100),         # declared over the limit
    (None, b"x" * 101, None, 100),      # read over the limit
    (None, gzip.compress(b"[1,2]", mtime=0), " GZIP ", 100),
    (None, gzip.compress(b"y" * 200, mtime=0), "gzip", 100),  # decodes over the limit
    (None, b"hello", "br", 100),        # unsupported encoding
])
def test_read_whole_answers_as_read_stream(declared: int | None, body: bytes,
                                           encoding: str | None, limit: int) -> None:
    whole = _outcome(lambda: read_whole(declared, body, encoding, limit))
    streamed = _outcome(lambda: asyncio.run(read_stream(declared, _chunks(body), encoding,
                                                        limit)))
    given = _outcome(lambda: asyncio.run(read_stream(declared, body, encoding, limit)))
    assert whole == streamed == given
