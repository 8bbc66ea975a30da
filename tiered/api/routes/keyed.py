"""Keyed compaction on the wire: water marks in HEAD, and reads of a compacted range that skip its holes.

The rules live in ``tiered.engine.streams.keyed``; this module only puts them
on HTTP. A read of a range with holes serves the live messages in it (whole
messages: keyed streams are JSON streams) and a ``Stream-Next-Offset`` past
any hole it ends in, so a reader never waits on removed offsets.
"""

from __future__ import annotations

from tiered.core.ids import format_offset
from tiered.engine.streams.keyed import low_water_mark, read_live_chunk
from tiered.engine.streams.model import Stream


def keyed_headers(s: Stream, tail: int, headers: dict[str, str]) -> None:
    """``Stream-Low-Water-Mark`` (first readable offset), ``Stream-High-Water-Mark`` (the tail), and
    ``Stream-Compaction-Key`` for a keyed stream."""
    headers["Stream-Low-Water-Mark"] = format_offset(low_water_mark(s, tail))
    headers["Stream-High-Water-Mark"] = format_offset(tail)
    if s.compaction_key is not None:
        headers["Stream-Compaction-Key"] = s.compaction_key


__all__ = ["keyed_headers", "read_live_chunk"]
