"""Read planning: which hot and cold slices serve bytes ``[start, end)`` of a stream.

Forks read their source below the fork point, through the whole ancestry.
Hot copies may outlive their cold commit (hot retention): they are preferred.
A large body stored by reference (``payloads``) leaves a gap in the hot
chunks: its cold reference serves it.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from tiered.engine.streams.model import ColdSlice, HotSlice, ReadSlice, Stream

if TYPE_CHECKING:
    from tiered.engine.streams.state import StreamState


def plan_read(state: StreamState, s: Stream, start: int, end: int) -> list[ReadSlice]:
    slices: list[ReadSlice] = []
    _plan(state, s, start, end, slices)
    return slices


def _plan(state: StreamState, s: Stream, start: int, end: int, out: list[ReadSlice]) -> None:
    if start < s.fork_offset and s.fork_source is not None:
        _plan(state, state.streams[s.fork_source], start, min(end, s.fork_offset), out)
        start = s.fork_offset
    if start >= end:
        return
    hot_start = s.chunks.start
    if hot_start is None:
        hot_start = s.tail
    if start < hot_start:
        _plan_cold(s, start, min(end, hot_start), out)
        start = hot_start
    if start >= end:
        return
    c = s.chunks
    i = max(0, bisect_right(c.starts, start) - 1)
    n = len(c)
    pos = start  # read up to here
    while i < n and c.starts[i] < end:
        cs, cl = c.starts[i], c.lens[i]
        lo = max(start, cs)
        hi = min(end, cs + cl)
        if lo > pos:
            _plan_cold(s, pos, lo, out)  # a gap in the hot chunks: a large body stored by reference
        if hi > lo:
            out.append(HotSlice(c.segs[i], c.poss[i] + (lo - cs), hi - lo))
            pos = hi
        i += 1
    if pos < end:
        _plan_cold(s, pos, end, out)  # past the last hot chunk: a large body stored by reference


def _plan_cold(s: Stream, start: int, end: int, out: list[ReadSlice]) -> None:
    refs = s.cold_refs
    lo, hi = 0, len(refs)
    while lo < hi:  # first ref ending after start
        mid = (lo + hi) // 2
        if refs[mid].end <= start:
            lo = mid + 1
        else:
            hi = mid
    for ref in refs[lo:]:
        if ref.start >= end:
            break
        out.append(ColdSlice(ref.key, s.bucket, s.path, max(start, ref.start), min(end, ref.end)))
