"""The instance's shared-memory objects: reply rings are sized from the request rings."""

from __future__ import annotations

import os

from queen_mp.ipc import layout
from queen_mp.ipc.ring import Ring
from queen_mp.runtime import Runtime


def test_reply_rings_are_an_eighth_of_the_request_rings_and_at_least_64_kib(tmp_path) -> None:
    assert layout.reply_ring_bytes(4096 * 1024) == 512 * 1024
    assert layout.reply_ring_bytes(64 * 1024) == 64 * 1024
    rt = Runtime(f"/qmpt{os.getpid():x}", 2, 1, 1 << 20, 0.0, str(tmp_path))
    layout.create_all(rt)
    try:
        request, reply = Ring.attach(rt.request_ring(1, 0)), Ring.attach(rt.reply_ring(1, 0))
        try:
            # an eighth, give or take the ring's own header
            assert request.capacity // 8 - 4096 <= reply.capacity <= request.capacity // 8
        finally:
            request.close()
            reply.close()
    finally:
        layout.unlink_all(rt)
