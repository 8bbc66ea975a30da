"""Keyed compaction on the wire: water marks in HEAD, and reads of a compacted range that skip its holes.

The rules live in ``tiered.engine.streams.keyed``; this module only puts them
on HTTP. A read of a range with holes serves the live messages in it (whole
messages: keyed streams are JSON streams) and a ``Stream-Next-Offset`` past
any hole it ends in, so a reader never waits on removed offsets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from tiered.core.ids import format_offset
from tiered.engine.streams.keyed import live_pieces, low_water_mark, skip_hole
from tiered.engine.streams.model import Stream

ReadBytes = Callable[[int, int], Awaitable[bytes]]


def keyed_headers(s: Stream, tail: int, headers: dict[str, str]) -> None:
    """``Stream-Low-Water-Mark`` (first readable offset), ``Stream-High-Water-Mark`` (the tail), and
    ``Stream-Compaction-Key`` for a keyed stream."""
    headers["Stream-Low-Water-Mark"] = format_offset(low_water_mark(s, tail))
    headers["Stream-High-Water-Mark"] = format_offset(tail)
    if s.compaction_key is not None:
        headers["Stream-Compaction-Key"] = s.compaction_key


async def read_live_chunk(
    read: ReadBytes, holes: Sequence[tuple[int, int]], offset: int, tail: int, chunk_bytes: int
) -> tuple[bytes, int, bool]:
    """(stored messages, next offset, up to date) of a read at ``offset`` of a stream with holes."""
    offset = min(tail, skip_hole(holes, offset))
    end = min(tail, offset + chunk_bytes)
    pieces = live_pieces(holes, offset, end)
    parts = [await read(a, b) for a, b in pieces]
    if end < tail and pieces and pieces[-1][1] == end:
        a, _ = pieces[-1]
        last = parts[-1]
        cut = last.rfind(b"\n") + 1
        if cut == 0 and len(parts) > 1:  # the last message does not fit: the next read starts with it
            parts.pop()
            end = a
        elif cut == 0:  # one message larger than a chunk: send it whole (it cannot span a hole)
            stop = min(tail, next((h for h, _ in holes if h > a), tail))
            rest = await read(end, stop)
            parts[-1] = last + rest[: rest.find(b"\n") + 1]
            end = a + len(parts[-1])
        else:
            parts[-1] = last[:cut]
            end = a + cut
    end = min(tail, skip_hole(holes, end))
    return b"".join(parts), end, end >= tail
