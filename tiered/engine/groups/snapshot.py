"""The groups state's snapshot form (msgpack), kept apart from the rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from tiered.engine.groups.model import Group, GroupSpec, Member, Target
from tiered.engine.groups.records import PlanTarget

if TYPE_CHECKING:
    from tiered.engine.groups.state import GroupsState


class _MemberSnap(msgspec.Struct, array_like=True):
    member: str
    join_id: str
    generation: int
    joined_ms: int
    last_seen_ms: int


class _GroupSnap(msgspec.Struct, array_like=True):
    name: str
    incarnation: int
    bucket: str
    pattern: str | None
    spec_streams: tuple[str, ...]
    session_timeout_ms: int
    max_members: int
    max_streams: int
    created_ms: int
    revision: int
    explicit: tuple[str, ...]
    members: list[_MemberSnap]
    targets: list[PlanTarget]
    cursors: list[tuple[int, int]]
    retired_joins: list[str]
    recent_ops: list[tuple[str, int]]
    generation_seq: int
    # (stream uid, start, end) of cursors retention moved that no commit moved since.
    # Trailing with a default: snapshots written before it decode without it.
    skipped: list[tuple[int, int, int]] = []


class _GroupsSnap(msgspec.Struct, array_like=True):
    version: int
    next_incarnation: int
    retired: dict[str, int]
    groups: list[_GroupSnap]


def _snap(self: GroupsState, soft: bool) -> _GroupsSnap:
    groups = []
    for name, g in sorted(self.groups.items()):
        s = g.spec
        groups.append(
            _GroupSnap(
                name=name,
                incarnation=g.incarnation,
                bucket=s.bucket,
                pattern=s.pattern,
                spec_streams=s.streams,
                session_timeout_ms=s.session_timeout_ms,
                max_members=s.max_members,
                max_streams=s.max_streams,
                created_ms=g.created_ms,
                revision=g.revision,
                explicit=g.explicit,
                members=[
                    _MemberSnap(m.member, m.join_id, m.generation, m.joined_ms, m.last_seen_ms if soft else 0)
                    for _, m in sorted(g.members.items())
                ],
                targets=list(g.plan_targets()),
                cursors=sorted(g.cursors.items()),
                retired_joins=list(g.retired_joins),
                recent_ops=list(g.recent_ops.items()),
                generation_seq=g.generation_seq,
                skipped=[(uid, start, end) for uid, (start, end) in sorted(g.skipped.items())],
            )
        )
    return _GroupsSnap(1, self.next_incarnation, dict(sorted(self.retired.items())), groups)


def encode_groups(groups: GroupsState, *, soft: bool) -> bytes:
    """The snapshot; ``soft=False`` leaves out member liveness (equal after a replay)."""
    return msgspec.msgpack.encode(_snap(groups, soft))


def decode_groups(self: GroupsState, data: bytes) -> None:
    snap = msgspec.msgpack.decode(data, type=_GroupsSnap)
    self.next_incarnation = snap.next_incarnation
    self.retired = dict(snap.retired)
    self.groups = {}
    for n in snap.groups:
        spec = GroupSpec(
            n.bucket, n.pattern, n.spec_streams, n.session_timeout_ms, n.max_members, n.max_streams
        )
        g = Group(n.name, n.incarnation, spec, n.created_ms, revision=n.revision, explicit=n.explicit)
        g.members = {
            m.member: Member(m.member, m.join_id, m.generation, m.joined_ms, m.last_seen_ms)
            for m in n.members
        }
        g.targets = {t.stream_uid: Target.of(t) for t in n.targets}
        g.cursors = dict(n.cursors)
        g.retired_joins = list(n.retired_joins)
        g.recent_ops = dict(n.recent_ops)
        g.generation_seq = n.generation_seq
        g.skipped = {uid: (start, end) for uid, start, end in n.skipped}
        self.groups[n.name] = g
