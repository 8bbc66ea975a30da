"""Cold-tier bookkeeping: copies in flight and committed, hot trims, object references, deletes.

A stream references the cold objects that serve its ranges (``ColdRef``); an
object's ``refs`` counts them, and ``released_ms`` records when it reached
zero (the GC grace delay starts there). Reference counts are derived: a
snapshot stores the refs, and loading recounts them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.engine.streams import integrity
from tiered.engine.streams.cold_prefix import settle
from tiered.engine.streams.model import ColdObject, ColdRef
from tiered.engine.streams.records import (
    ColdCopyAborted,
    ColdCopyCommitted,
    ColdCopyStarted,
    ColdDeleteFinished,
    ColdDeleteStarted,
    HotTrimmed,
)
from tiered.engine.streams.release import hot_contribution, release

if TYPE_CHECKING:
    from tiered.engine.streams.state import StreamState


def apply_copy_started(state: StreamState, record: ColdCopyStarted) -> None:
    state.copies_in_flight[record.key] = record.ts_ms


def apply_copy_aborted(state: StreamState, record: ColdCopyAborted) -> None:
    state.copies_in_flight.pop(record.key, None)


def apply_copy_committed(state: StreamState, record: ColdCopyCommitted) -> None:
    state.copies_in_flight.pop(record.key, None)
    obj = state.cold_objects.get(record.key)
    if obj is None:
        obj = ColdObject(record.key, record.size, record.crc32c, record.ts_ms, record.index)
        state.cold_objects[record.key] = obj
    for r in record.ranges:
        s = state.streams.get(r.uid)
        # A range is taken only if it extends the stream's cold prefix exactly;
        # anything else (stream gone, range already cold) leaves it unowned.
        if s is None or r.start != s.cold_end or r.end > s.tail:
            continue
        if s.keep_end is not None and r.start >= s.keep_end:
            continue
        before = hot_contribution(s)
        s.cold_refs.append(ColdRef(r.start, r.end, record.key))
        s.cold_end = r.end
        integrity.note_cold(s, r.start, r.end)
        settle(s)  # past it may lie a large body stored by reference (``payloads``)
        state.hot_bytes += hot_contribution(s) - before
        obj.refs += 1
        if s.uid in state.children and s.retained_from > s.fork_offset:
            # Retention moved into the stream's own data: the new range may lie in a gap no reader reaches.
            release(state, s, record.ts_ms)
    if obj.refs == 0 and obj.released_ms is None:
        obj.released_ms = record.ts_ms


def apply_hot_trimmed(state: StreamState, record: HotTrimmed) -> None:
    for uid, offset in record.trims:
        trimmed = state.streams.get(uid)
        if trimmed is not None:
            trimmed.chunks.trim_below(min(offset, trimmed.cold_end))


def apply_delete_started(state: StreamState, record: ColdDeleteStarted) -> None:
    for key in record.keys:
        obj = state.cold_objects.get(key)
        if obj is not None:
            obj.deleting = True


def apply_delete_finished(state: StreamState, record: ColdDeleteFinished) -> None:
    for key in record.keys:
        obj = state.cold_objects.get(key)
        if obj is not None and obj.refs == 0:
            del state.cold_objects[key]


def referenced_segments(state: StreamState) -> set[int]:
    """Hot segments some stream still reads from."""
    segs: set[int] = set()
    for s in state.hot_resident():
        segs.update(s.chunks.segs)
    return segs
