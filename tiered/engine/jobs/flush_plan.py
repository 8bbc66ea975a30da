"""Flush planning (pure): which durable hot bytes go into which cold object, and which hot copies may go.

``plan_flush`` groups the not-yet-cold data of every stream into objects;
``plan_hot_trims`` names the hot copies that are cold and past the hot
retention. Both read the state only; the flusher (``flusher``) does the I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tiered.engine.streams.model import Stream
from tiered.engine.streams.state import StreamState


@dataclass(frozen=True, slots=True)
class PieceToCopy:
    """One stream's range in a planned object, with where its records live."""

    stream: Stream
    start: int
    end: int
    chunks: list[tuple[int, int, int, int, int]]  # (start, length, segment, position, ts_ms)


def plan_flush(
    state: StreamState,
    visible_tail: Callable[[Stream], int],
    *,
    target_bytes: int,
    max_pass_bytes: int,
    damaged: Mapping[int, int] | None = None,
) -> list[list[PieceToCopy]]:
    """Group not-yet-cold durable data into objects (pure; reads state only).

    Streams with at least half a target of data get objects of their own (cut
    at record boundaries); the rest are packed together, so a thousand quiet
    streams cost one PUT. ``damaged`` maps uids to the offset of a hot record
    that failed its checksum: nothing from there on is copied.
    """
    big: list[list[PieceToCopy]] = []
    small: list[PieceToCopy] = []
    budget = max_pass_bytes
    for s in state.hot_resident():  # by uid; streams without hot chunks have nothing to copy
        if budget <= 0:
            break
        end = visible_tail(s)
        if s.keep_end is not None:
            end = min(end, s.keep_end)  # past it no reader can reach: never copy it
        bad = damaged.get(s.uid) if damaged else None
        if bad is not None and bad >= s.cold_end:
            end = min(end, bad)  # damage never travels to the cold tier
        if end <= s.cold_end:
            continue
        chunks, size = _chunks_to_copy(s, end, budget)
        if not chunks or chunks[0][0] != s.cold_end:
            continue  # hot copies of the next range are not where they should be; skip
        budget -= size
        if size >= target_bytes // 2:
            piece: list[tuple[int, int, int, int, int]] = []
            piece_bytes = 0
            for ch in chunks:
                if piece and piece_bytes + ch[1] > target_bytes:
                    big.append([_piece(s, piece)])
                    piece, piece_bytes = [], 0
                piece.append(ch)
                piece_bytes += ch[1]
            if piece:
                big.append([_piece(s, piece)])
        else:
            small.append(_piece(s, chunks))
    objects = big
    current: list[PieceToCopy] = []
    current_bytes = 0
    names: set[tuple[str, str]] = set()
    for p in small:
        size = p.end - p.start
        name = (p.stream.bucket, p.stream.path)
        # An object names streams by (bucket, path); a soft-deleted source and
        # the new stream at its path must not share one.
        if current and (current_bytes + size > target_bytes or name in names):
            objects.append(current)
            current, current_bytes, names = [], 0, set()
        current.append(p)
        current_bytes += size
        names.add(name)
    if current:
        objects.append(current)
    return objects


def _chunks_to_copy(s: Stream, end: int, budget: int) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """The hot records of ``s`` from its cold end up to ``end``, while fewer than ``budget`` bytes are taken,
    up to the first gap (a large body stored by reference, cold already): ``(start, length, segment,
    position, ts_ms)`` each, a record cut where retention released its front; and their bytes.

    This runs on the loop for every record of a pass (a second's appends): the usual case (the cold end on
    a record boundary, no gap, within the budget) is taken as array slices; anything else record by record.
    """
    c = s.chunks
    starts, lens = c.starts, c.lens
    cold_end = s.cold_end
    i = max(0, bisect_right(starts, cold_end) - 1)
    j = bisect_left(starts, end, i)  # the records that start before ``end``
    if i < j and starts[i] == cold_end:
        taken = sum(lens[i:j])
        if starts[j - 1] + lens[j - 1] - cold_end == taken and taken - lens[j - 1] < budget:
            return list(
                zip(starts[i:j], lens[i:j], c.segs[i:j], c.poss[i:j], c.times[i:j], strict=True)
            ), taken
    chunks: list[tuple[int, int, int, int, int]] = []
    size = 0
    while i < len(c) and starts[i] < end and size < budget:
        start, length, pos = starts[i], lens[i], c.poss[i]
        if start < cold_end < start + length:
            # Retention released the front of this record: copy only the rest.
            pos += cold_end - start
            length -= cold_end - start
            start = cold_end
        if chunks and start != chunks[-1][0] + chunks[-1][1]:
            break  # a gap: a large body stored by reference, cold already (``payloads``)
        if start >= cold_end:
            chunks.append((start, length, c.segs[i], pos, c.times[i]))
            size += length
        i += 1
    return chunks, size


def _piece(s: Stream, chunks: list[tuple[int, int, int, int, int]]) -> PieceToCopy:
    return PieceToCopy(s, chunks[0][0], chunks[-1][0] + chunks[-1][1], chunks)


def plan_hot_trims(state: StreamState, now_ms: int, retention_ms: int) -> list[tuple[int, int]]:
    """(uid, offset) pairs: hot copies below offset are cold and past retention."""
    trims = []
    for s in state.hot_resident():
        c = s.chunks
        if not c.starts or c.starts[0] >= s.cold_end:
            continue
        upto = None
        for i in range(len(c)):
            chunk_end = c.starts[i] + c.lens[i]
            if chunk_end > s.cold_end or c.times[i] + retention_ms > now_ms:
                break
            upto = chunk_end
        if upto is not None:
            trims.append((s.uid, upto))
    return trims
