"""The groups state's snapshot form (msgpack): its own types, as they are.

Version 2 holds the ``GroupsState``: the next incarnation, the retired
incarnations and the groups, each the model's Struct (``model``: spec,
members, targets, cursors and skipped ranges included). Member liveness is
in snapshots (it is granted anew after a restart anyway); ``soft=False``
leaves it out, for a digest that is equal after a replay. Version 1 (servers
up to e092d99) flattened the spec and listed the maps as arrays; it is still
read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from tiered.engine.groups.model import Group, GroupSpec, Member, Target
from tiered.engine.groups.records import PlanTarget

if TYPE_CHECKING:
    from tiered.engine.groups.state import GroupsState

SNAPSHOT_VERSION = 2


class GroupsSnap(msgspec.Struct, array_like=True):
    version: int
    next_incarnation: int
    retired: dict[str, int]
    groups: list[Group]


class _Version(msgspec.Struct, array_like=True):
    version: int


def encode_groups(state: GroupsState, *, soft: bool) -> bytes:
    """The snapshot; ``soft=False`` leaves out member liveness (equal after a replay)."""
    groups = list(state.groups.values())
    if not soft:
        groups = [
            msgspec.structs.replace(
                g, members={k: msgspec.structs.replace(m, last_seen_ms=0) for k, m in g.members.items()}
            )
            for g in groups
        ]
    return msgspec.msgpack.encode(GroupsSnap(SNAPSHOT_VERSION, state.next_incarnation, state.retired, groups))


def decode_groups(state: GroupsState, data: bytes) -> None:
    version = msgspec.msgpack.decode(data, type=_Version).version
    if version == SNAPSHOT_VERSION:
        snap = msgspec.msgpack.decode(data, type=GroupsSnap)
    elif version == 1:
        snap = _from_version_1(msgspec.msgpack.decode(data, type=_GroupsV1))
    else:
        raise ValueError(f"groups snapshot version {version} is not one of 1, {SNAPSHOT_VERSION}")
    state.next_incarnation = snap.next_incarnation
    state.retired = snap.retired
    state.groups = {g.name: g for g in snap.groups}


# ------------------------------------------------------------------ version 1 (read only)


class _GroupV1(msgspec.Struct, array_like=True):
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
    members: list[Member]
    targets: list[PlanTarget]
    cursors: list[tuple[int, int]]
    retired_joins: list[str]
    recent_ops: list[tuple[str, int]]
    generation_seq: int
    skipped: list[tuple[int, int, int]] = []


class _GroupsV1(msgspec.Struct, array_like=True):
    version: int
    next_incarnation: int
    retired: dict[str, int]
    groups: list[_GroupV1]


def _from_version_1(old: _GroupsV1) -> GroupsSnap:
    groups = []
    for n in old.groups:
        spec = GroupSpec(
            n.bucket, n.pattern, n.spec_streams, n.session_timeout_ms, n.max_members, n.max_streams
        )
        groups.append(
            Group(
                n.name,
                n.incarnation,
                spec,
                n.created_ms,
                revision=n.revision,
                explicit=n.explicit,
                members={m.member: m for m in n.members},
                targets={t.stream_uid: Target.of(t) for t in n.targets},
                cursors=dict(n.cursors),
                skipped={uid: (start, end) for uid, start, end in n.skipped},
                retired_joins=n.retired_joins,
                recent_ops=dict(n.recent_ops),
                generation_seq=n.generation_seq,
            )
        )
    return GroupsSnap(SNAPSHOT_VERSION, old.next_incarnation, old.retired, groups)
