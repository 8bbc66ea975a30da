"""JSON views of consumer groups: what members and operators see (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.engine.groups.model import Group, live_stream
from tiered.engine.groups.state import GroupsState
from tiered.engine.streams.model import Stream
from tiered.engine.streams.state import StreamState


def skipped_json(g: Group, uid: int) -> dict[str, Any] | None:
    """The range retention released before the group committed it, if no commit moved the cursor since."""
    gap = g.skipped.get(uid)
    if gap is None:
        return None
    start, end = gap
    return {"from": format_offset(start), "to": format_offset(end), "bytes": end - start}


def member_view(groups: GroupsState, name: str, member: str) -> dict[str, Any]:
    """What a member sees: its streams (fence, cursor, revoked, and a ``skipped`` range if any) and pending ones."""
    g = groups.get(name)
    m = g.members.get(member)
    if m is None:
        raise TieredError(ErrorCode.NOT_MEMBER, f"{member!r} is not a member of group {name!r}; join again")
    assignments = []
    pending = []
    for t in sorted(g.targets.values(), key=lambda t: t.path):
        if t.holder == member and t.holder_generation == m.generation:
            assignment: dict[str, Any] = {
                "stream": t.path,
                "fence": t.fence,
                "cursor": format_offset(g.cursors.get(t.stream_uid, 0)),
                "revoked": t.owner != member,
            }
            gap = skipped_json(g, t.stream_uid)
            if gap is not None:
                assignment["skipped"] = gap
            assignments.append(assignment)
        elif t.owner == member:
            pending.append(t.path)
    return {
        "group": name,
        "incarnation": g.incarnation,
        "revision": g.revision,
        "member": member,
        "generation": m.generation,
        "bucket": g.spec.bucket,
        "session_timeout_ms": g.spec.session_timeout_ms,
        "assignments": assignments,
        "pending": pending,
    }


def group_view(
    groups: GroupsState, name: str, streams: StreamState, now_ms: int, tail: Callable[[Stream], int]
) -> dict[str, Any]:
    """The whole group: configuration, members, and every stream's owner, holder and cursor."""
    g = groups.get(name)
    selected, count = groups.select(g, streams, now_ms)
    rows: dict[int, dict[str, Any]] = {}
    for uid, path in selected:
        rows[uid] = {"stream": path, "linked": True, "owner": None, "holder": None, "fence": 0}
    for uid, t in g.targets.items():
        rows[uid] = {
            "stream": t.path,
            "linked": t.linked,
            "owner": t.owner,
            "holder": t.holder,
            "fence": t.fence,
        }
    targets = []
    for uid, row in sorted(rows.items(), key=lambda kv: kv[1]["stream"]):
        s = live_stream(streams, uid, now_ms)
        cursor = g.cursors.get(uid)
        if cursor is None:  # not committed yet: a stream new to the group starts at its retained offset
            cursor = s.retained_from if s is not None and uid not in g.targets else 0
        row["cursor"] = format_offset(cursor)
        row["tail"] = format_offset(tail(s)) if s is not None else None
        gap = skipped_json(g, uid)
        if gap is not None:
            row["skipped"] = gap
        targets.append(row)
    spec = g.spec
    return {
        "group": name,
        "incarnation": g.incarnation,
        "revision": g.revision,
        "bucket": spec.bucket,
        "pattern": spec.pattern,
        "streams": list(g.explicit),
        "session_timeout_ms": spec.session_timeout_ms,
        "max_members": spec.max_members,
        "max_streams": spec.max_streams,
        "created_ms": g.created_ms,
        "members": [
            {"member": m.member, "generation": m.generation, "joined_ms": m.joined_ms}
            for _, m in sorted(g.members.items())
        ],
        "targets": targets,
        "over_limit": count > spec.max_streams,
    }


def summary(groups: GroupsState) -> list[dict[str, Any]]:
    return [
        {
            "group": name,
            "bucket": g.spec.bucket,
            "incarnation": g.incarnation,
            "revision": g.revision,
            "members": len(g.members),
            "targets": len(g.targets),
        }
        for name, g in sorted(groups.groups.items())
    ]
