"""Retention and expiry planning: which data the policies release now (pure).

Retention never cuts a record in half: a stream's retained offset only moves
to a record boundary (a hot append or the start of a cold range), so JSON
streams keep whole messages and every offset a reader holds stays valid or
becomes cleanly 410 Gone.
"""

from __future__ import annotations

from tiered.state import Stream, StreamState


def _units(state: StreamState, s: Stream) -> list[tuple[int, int, int]]:
    """(start, end, newest append time) of the stream's data from its retained offset on."""
    units: list[tuple[int, int, int]] = []
    if s.fork_source is not None and s.retained_from < s.fork_offset:
        units.append((s.retained_from, s.fork_offset, s.created_ms))  # inherited: one unit
    for ref in s.cold_refs:
        if ref.end > s.retained_from:
            obj = state.cold_objects.get(ref.key)
            # An object is written after every record in it: its age bounds theirs.
            units.append((ref.start, ref.end, obj.created_ms if obj else 0))
    c = s.chunks
    for i in range(len(c)):
        start, end = c.starts[i], c.starts[i] + c.lens[i]
        if end > s.retained_from and start >= s.cold_end:
            units.append((start, end, c.times[i]))
    return units


def policy_for(state: StreamState, s: Stream) -> tuple[int | None, int | None]:
    """The stream's own policy if it has one, else its bucket's."""
    if s.retention_ms is not None or s.retention_bytes is not None:
        return s.retention_ms, s.retention_bytes
    return state.bucket_retention.get(s.bucket, (None, None))


def plan_retention(state: StreamState, now_ms: int) -> list[tuple[int, int]]:
    """(uid, new retained offset) for every live stream whose policy releases data now."""
    advances = []
    for s in state.streams.values():
        if s.soft_deleted:
            continue
        retention_ms, retention_bytes = policy_for(state, s)
        if retention_ms is None and retention_bytes is None:
            continue
        units = _units(state, s)
        target = s.retained_from
        if retention_bytes is not None:
            want = s.tail - retention_bytes
            if want > target:
                # The first boundary at or past `want` keeps at most retention_bytes.
                target = next((a for a, _, _ in units if a >= want), s.tail)
        if retention_ms is not None:
            cutoff = now_ms - retention_ms
            for _, end, newest in units:
                if newest >= cutoff:
                    break
                target = max(target, end)
        if target > s.retained_from:
            advances.append((s.uid, min(target, s.tail)))
    return advances


def plan_expirations(state: StreamState, now_ms: int, limit: int) -> list[int]:
    """Uids of streams whose TTL or Expires-At has passed (not yet journaled as gone)."""
    expired = []
    for s in state.streams.values():
        if not s.soft_deleted and s.expired(now_ms):
            expired.append(s.uid)
            if len(expired) >= limit:
                break
    return expired
