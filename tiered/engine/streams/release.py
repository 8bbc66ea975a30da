"""Retention and release: what no reader can reach any more stops holding hot bytes and cold objects.

A live stream needs everything from its retained offset on; a fork needs its
source below the fork point, from the fork's own floor; a soft-deleted source
is needed only for what its forks inherit. ``release`` lets go of cold
references and hot copies outside what a stream still needs (and
``release_chain`` does so up its fork ancestry when needs change).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.streams import integrity
from tiered.engine.streams.cold_prefix import settle
from tiered.engine.streams.model import ColdRef, Stream
from tiered.engine.streams.records import RetentionAdvanced, RetentionPolicySet

if TYPE_CHECKING:
    from tiered.engine.streams.state import StreamState


# ------------------------------------------------------------------ decide


def decide_retention_policy(
    state: StreamState,
    bucket: str,
    path: str | None,
    retention_ms: int | None,
    retention_bytes: int | None,
    now_ms: int,
) -> RetentionPolicySet:
    if bucket not in state.buckets:
        raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
    uid = state.lookup(bucket, path, now_ms).uid if path is not None else None
    return RetentionPolicySet(
        bucket=bucket, uid=uid, retention_ms=retention_ms, retention_bytes=retention_bytes, ts_ms=now_ms
    )


def decide_retain(
    state: StreamState, bucket: str, path: str, offset: int, now_ms: int
) -> list[RetentionAdvanced]:
    """Advance a stream's earliest retained offset (never backwards)."""
    s = state.lookup(bucket, path, now_ms)
    if offset > s.tail:
        raise TieredError(ErrorCode.OFFSET_BEYOND_TAIL, "the retained offset is beyond the stream's tail")
    if s.json:  # a JSON stream's offsets must stay on message boundaries
        offset = record_boundary_at_or_before(s, offset)
    if offset <= s.retained_from:
        return []
    return [RetentionAdvanced(ts_ms=now_ms, advances=((s.uid, offset),))]


def record_boundary_at_or_before(s: Stream, offset: int) -> int:
    """The greatest record boundary <= ``offset``: retention never splits a record
    (or a JSON message), so what stays is always whole."""
    if offset >= s.tail:
        return s.tail
    best = s.retained_from
    if s.fork_source is not None and s.fork_offset <= offset:
        best = max(best, s.fork_offset)
    for ref in s.cold_refs:
        for edge in (ref.start, ref.end):
            if best < edge <= offset:
                best = edge
    c = s.chunks
    i = bisect_right(c.starts, offset) - 1
    if i >= 0:
        best = max(best, c.starts[i])
    return best


# ------------------------------------------------------------------ apply


def apply_retention_advanced(state: StreamState, record: RetentionAdvanced) -> None:
    for uid, offset in record.advances:
        target = state.streams.get(uid)
        if target is not None and offset > target.retained_from:
            target.retained_from = min(offset, target.tail)
            release_chain(state, target, record.ts_ms)


def apply_policy_set(state: StreamState, record: RetentionPolicySet) -> None:
    if record.uid is None:
        state.bucket_retention[record.bucket] = (record.retention_ms, record.retention_bytes)
    elif record.uid in state.streams:
        target = state.streams[record.uid]
        target.retention_ms, target.retention_bytes = record.retention_ms, record.retention_bytes


# ------------------------------------------------------------------ what readers need


def hot_contribution(s: Stream) -> int:
    """Bytes of ``s`` held only in the hot tier and still needed."""
    hi = s.tail if s.keep_end is None else min(s.tail, s.keep_end)
    return max(0, hi - max(s.cold_end, s.keep_start))


def unref(state: StreamState, key: str, ts_ms: int) -> None:
    obj = state.cold_objects.get(key)
    if obj is not None:
        obj.refs -= 1
        if obj.refs == 0:
            obj.released_ms = ts_ms


def needed_range(state: StreamState, s: Stream) -> tuple[int, int | None]:
    """The part of ``s``'s own data that readers can still reach: [lo, hi)."""
    lo: int | None = None if s.soft_deleted else s.retained_from
    hi: int | None = None
    for child_uid in state.children.get(s.uid, ()):
        child = state.streams[child_uid]
        child_lo, child_end = _inherited(state, child)
        if child_lo < child_end:
            lo = child_lo if lo is None else min(lo, child_lo)
            hi = child_end if hi is None else max(hi, child_end)
    if lo is None:  # soft-deleted and no fork needs anything: keep nothing
        return s.tail, s.tail
    return lo, (hi if s.soft_deleted else None)


def _needed_intervals(state: StreamState, s: Stream) -> list[tuple[int, int | None]]:
    """The ranges of ``s``'s offsets some reader reaches (None: open-ended)."""
    intervals: list[tuple[int, int | None]] = [] if s.soft_deleted else [(s.retained_from, None)]
    for child_uid in state.children.get(s.uid, ()):
        child_lo, child_end = _inherited(state, state.streams[child_uid])
        if child_lo < child_end:
            intervals.append((child_lo, child_end))
    return intervals


def _inherited(state: StreamState, child: Stream) -> tuple[int, int]:
    """The part of its source's offsets that fork ``child`` still needs: [lo, end).

    Below its fork point, and below what its own readers reach: a soft-deleted
    fork needs only what its forks inherit, so its source keeps no more than that.
    """
    child_lo, child_hi = needed_range(state, child)
    end = child.fork_offset if child_hi is None else min(child.fork_offset, child_hi)
    return child_lo, end


def release(state: StreamState, s: Stream, ts_ms: int) -> None:
    """Let go of cold references and hot copies outside what ``s`` still needs."""
    lo, hi = needed_range(state, s)
    before = hot_contribution(s)
    s.keep_start = max(s.keep_start, lo)
    if hi is not None:
        s.keep_end = hi if s.keep_end is None else min(s.keep_end, hi)
    s.cold_end = max(s.cold_end, s.keep_start)
    settle(s)  # retention may reach a large body stored by reference past the prefix (``payloads``)
    needed = _needed_intervals(state, s)
    kept: list[ColdRef] = []
    for ref in s.cold_refs:
        outside = ref.end <= s.keep_start or (s.keep_end is not None and ref.start >= s.keep_end)
        # Inside the hull but in a gap no reader reaches (between a fork's
        # inheritance and the source's own retained offset) counts as outside.
        if outside or not any(
            ref.start < (b if b is not None else ref.end + 1) and ref.end > a for a, b in needed
        ):
            unref(state, ref.key, ts_ms)
        else:
            kept.append(ref)
    integrity.note_release(s, s.cold_refs, kept)
    s.cold_refs = kept
    integrity.note_hot_release(s)
    s.chunks.trim_below(s.keep_start)
    if s.keep_end is not None:
        s.chunks.trim_from(s.keep_end)
    state.hot_bytes += hot_contribution(s) - before


def release_chain(state: StreamState, s: Stream, ts_ms: int) -> None:
    """``s``'s needs changed: release in it and up its fork ancestry."""
    current: Stream | None = s
    while current is not None:
        release(state, current, ts_ms)
        current = state.streams.get(current.fork_source) if current.fork_source is not None else None
