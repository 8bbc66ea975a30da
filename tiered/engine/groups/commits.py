"""Cursors: where each stream's processing stands, and the commits that move it.

Each stream's committed cursor (the next offset to process) lives in the
group and only moves forward. A commit counts only from the member holding
the stream with the current fence; the others are refused one by one
(``Rejected``) while the rest apply. Where a stream's cursor starts is where
the stream became the group's (``start_of``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tiered.engine.groups.model import CommitRequest, Group, Rejected, live_stream
from tiered.engine.groups.records import GroupCommitted
from tiered.engine.streams.model import Stream
from tiered.engine.streams.state import StreamState

if TYPE_CHECKING:
    from tiered.engine.groups.state import GroupsState


def start_of(g: Group, s: Stream, *, linked_now: bool) -> int:
    """Where the cursor of a stream new to ``g`` starts: where the stream became the group's.

    A stream created after the group (under its pattern or an explicit path)
    was the group's from its first byte, so retention that released some of it
    before the group planned it is a skip; one that existed already, or that
    was just linked explicitly, became the group's as it is now: at its
    retained offset. A fork's bytes below its fork point are its source's,
    readable from the fork's retained offset: it starts there.
    """
    if not linked_now and s.fork_source is None and s.created_ms >= g.created_ms:
        return s.fork_offset  # its first byte
    return s.retained_from


def commits(
    g: Group,
    member: str,
    generation: int,
    requests: Iterable[CommitRequest],
    streams: StreamState,
    now_ms: int,
) -> tuple[GroupCommitted | None, list[Rejected]]:
    """The record of the commits that move cursors (None: none does), and the refused ones."""
    rejected: list[Rejected] = []
    moved: dict[int, int] = {}
    by_path = g.targets_by_path()
    for c in requests:
        t = by_path.get(c.stream)
        if t is None or t.holder != member or t.holder_generation != generation or t.fence != c.fence:
            rejected.append(
                Rejected(c.stream, "FENCED", f"{member!r} does not hold {c.stream!r} with fence {c.fence}")
            )
            continue
        s = live_stream(streams, t.stream_uid, now_ms)
        if s is None:
            rejected.append(Rejected(c.stream, "STREAM_GONE", f"stream {c.stream!r} no longer exists"))
            continue
        if c.offset > s.tail:
            rejected.append(
                Rejected(c.stream, "OFFSET_BEYOND_TAIL", f"offset is beyond the tail of {c.stream!r}")
            )
            continue
        uid = t.stream_uid
        if c.offset > max(g.cursors.get(uid, 0), moved.get(uid, 0)):
            moved[uid] = c.offset
    if not moved:
        return None, rejected
    return GroupCommitted(g.name, g.incarnation, now_ms, tuple(sorted(moved.items()))), rejected


def apply_committed(state: GroupsState, record: GroupCommitted) -> None:
    g = state.groups.get(record.name)
    if g is None or g.incarnation != record.incarnation:
        return
    for uid, offset in record.cursors:
        if uid in g.targets and offset > g.cursors.get(uid, 0):
            g.cursors[uid] = offset
            g.skipped.pop(uid, None)  # processed past the gap: nothing left to report
