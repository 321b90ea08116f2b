"""unpack_messages: a claim's offsets out of stored segments, whatever their chunking."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from queen_mp.front.delivery import Claim, unpack_messages
from queen_mp.wire import pack_chunk_raw, pack_chunk_zstd, pack_frame

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def _segment(base: int, sizes: list[int], zstd: bool) -> tuple[int, datetime, bytes]:
    """Chunks of ``sizes`` frames; the frame at offset o has transactionId ``t<o>``."""
    chunks, offset = [], base
    for n in sizes:
        frames = b"".join(pack_frame(offset.to_bytes(16, "big"), f"t{offset}".encode(),
                                     b'{"o":%d}' % offset)
                          for offset in range(offset, offset + n))
        chunks.append(pack_chunk_zstd(frames, n) if zstd else pack_chunk_raw(frames, n))
        offset += n
    return base, T0, b"".join(chunks)


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=4), min_size=1,
                         max_size=3),
       zstd=st.booleans(), data=st.data())
def test_a_claim_gets_exactly_its_offsets_in_order(segments: list[list[int]], zstd: bool,
                                                   data: st.DataObject) -> None:
    stored, base = [], 1
    for sizes in segments:
        stored.append(_segment(base, sizes, zstd))
        base += sum(sizes)
    last = base - 1
    start = data.draw(st.integers(1, last))
    end = data.draw(st.integers(start, last))
    claim = Claim("q", 7, "p", start, end, 1, None, False, stored)
    got = list(unpack_messages(claim, None, 1 << 20))
    assert [m.offset for m in got] == list(range(start, end + 1))
    assert [m.transaction_id for m in got] == [f"t{o}" for o in range(start, end + 1)]
    assert [m.payload for m in got] == [b'{"o":%d}' % o for o in range(start, end + 1)]
