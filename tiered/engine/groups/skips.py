"""Retention past a committed cursor: the cursor moves on, and the range the group lost is reported.

A committed cursor behind its stream's retained offset points at data nobody
can read any more. The coordinator moves it to the retained offset and
records the skipped range (``GroupCursorsSkipped``), wherever it looks at the
group: when retention is applied (``decide_skips``, called by the shell right
after a retention record), at joins, heartbeats (after their commits), leaves
and sweeps. The range stays on the target (``skipped``, shown in member and
group views) until a commit moves the cursor again, so the member that
processes the stream next is told what it will never see. What retention
released before a stream became the group's was never the group's and is no
skip (``commits.start_of``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.engine.groups.model import Group, live_stream
from tiered.engine.groups.records import GroupCommitted, GroupCursorsSkipped, GroupPlanned, SkippedRange
from tiered.engine.streams.state import StreamState

if TYPE_CHECKING:
    from tiered.engine.groups.state import GroupsState


def skips(
    g: Group,
    streams: StreamState,
    now_ms: int,
    committed: GroupCommitted | None = None,
    plan: GroupPlanned | None = None,
) -> GroupCursorsSkipped | None:
    """Move every cursor retention passed to its stream's retained offset.

    As the group will be once ``committed`` and ``plan`` (decided in the
    same step, applied before this) are: a stream the plan brings in is
    covered at once, from where it starts.
    """
    cursors = dict(g.cursors)
    if committed is not None:
        for uid, offset in committed.cursors:
            cursors[uid] = max(cursors.get(uid, 0), offset)
    paths = {uid: t.path for uid, t in g.targets.items()}
    if plan is not None:
        for uid in plan.dropped_cursors:
            cursors.pop(uid, None)
        for uid, offset in plan.starts:
            cursors.setdefault(uid, offset)
        paths = {t.stream_uid: t.path for t in plan.targets}
    found = []
    for uid, path in sorted(paths.items()):
        s = live_stream(streams, uid, now_ms)
        if s is None:
            continue
        cursor = cursors.get(uid, 0)
        if cursor < s.retained_from:
            found.append(SkippedRange(uid, path, cursor, s.retained_from))
    if not found:
        return None
    return GroupCursorsSkipped(g.name, g.incarnation, now_ms, tuple(found))


def decide_skips(state: GroupsState, streams: StreamState, now_ms: int) -> list[GroupCursorsSkipped]:
    """Every group's cursors retention passed, moved (run right after retention is applied)."""
    out = []
    for name in sorted(state.groups):
        skipped = skips(state.groups[name], streams, now_ms)
        if skipped is not None:
            out.append(skipped)
    return out


def apply_skipped(state: GroupsState, record: GroupCursorsSkipped) -> None:
    g = state.groups.get(record.name)
    if g is None or g.incarnation != record.incarnation:
        return
    for r in record.skips:
        uid = r.stream_uid
        if uid not in g.targets or g.cursors.get(uid, 0) != r.start or r.end <= r.start:
            continue  # stale: the cursor moved since (or a replay)
        g.cursors[uid] = r.end
        before = g.skipped.get(uid)
        # Two skips with no commit between are one gap.
        g.skipped[uid] = (before[0] if before is not None and before[1] == r.start else r.start, r.end)
