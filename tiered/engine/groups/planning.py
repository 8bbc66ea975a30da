"""Plans: the whole intent of a group at one revision, and how the next one is made.

Every change of membership, target set or ownership is one ``GroupPlanned``
record carrying the whole plan at ``revision = expected_revision + 1``
(compare-and-set on apply) and an operation id. Ownership moves are intent
first: a target's ``owner`` changes, the previous ``holder`` is told to
release, and only once it released, left, expired or was fenced does a later
plan make the owner the holder, with a new fence. So there is never more
than one holder per stream. Owners come from ``assignment``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tiered.core.globs import glob_match
from tiered.engine.groups.assignment import assign
from tiered.engine.groups.commits import start_of
from tiered.engine.groups.model import RECENT_OPS_KEPT, RETIRED_JOINS_KEPT, Group, Member, Target, live_stream
from tiered.engine.groups.records import GroupCursorsSkipped, GroupPlanned, PlanMember
from tiered.engine.groups.skips import skips
from tiered.engine.streams.state import StreamState

if TYPE_CHECKING:
    from tiered.engine.groups.state import GroupsState

# member id -> (join id, generation, joined at) as the next plan will have them
PlannedMembers = dict[str, tuple[str, int, int]]


def select(
    g: Group, streams: StreamState, now_ms: int, explicit: tuple[str, ...] | None = None
) -> tuple[list[tuple[int, str]], int]:
    """(selected (uid, path) sorted by uid and capped at max_streams, uncapped count)."""
    explicit = g.explicit if explicit is None else explicit
    bucket, pattern = g.spec.bucket, g.spec.pattern
    found: dict[int, str] = {}
    if pattern is not None:
        for (b, path), uid in streams.paths.items():
            if b == bucket and glob_match(pattern, path) and live_stream(streams, uid, now_ms) is not None:
                found[uid] = path
    for path in explicit:
        found_uid = streams.paths.get((bucket, path))
        if found_uid is not None and live_stream(streams, found_uid, now_ms) is not None:
            found[found_uid] = path
    ordered = sorted(found.items())
    return ordered[: g.spec.max_streams], len(ordered)


def plan(
    g: Group,
    streams: StreamState,
    now_ms: int,
    *,
    op: str,
    exempt: str | None = None,
    join: tuple[str, str] | None = None,
    leave: str | None = None,
    releases: Iterable[tuple[str, int]] = (),
    explicit: tuple[str, ...] | None = None,
    linked_now: frozenset[int] = frozenset(),
) -> GroupPlanned | None:
    """The next plan after expiring members and applying one operation, or None if unchanged.

    ``exempt``: the member calling (it is alive, whatever its last heartbeat);
    ``join``/``leave``: (member, join id) joining, member leaving; ``releases``:
    (member, stream uid) let go; ``explicit``: the new explicit stream list;
    ``linked_now``: streams linked explicitly by this very operation.
    """
    members, retired = _members_after(g, now_ms, exempt, join, leave)
    new_explicit = g.explicit if explicit is None else explicit
    targets = _carried_targets(g, members, releases)
    selected, _ = select(g, streams, now_ms, new_explicit)
    new_targets, starts = _targets_for(g, streams, now_ms, targets, selected, linked_now)
    revision = g.revision + 1
    _assign_owners(new_targets, members, sorted(uid for uid, _ in selected), revision)
    dropped = tuple(sorted(uid for uid in g.cursors if live_stream(streams, uid, now_ms) is None))

    plan_members = tuple(PlanMember(mid, j, gen, at) for mid, (j, gen, at) in sorted(members.items()))
    plan_targets = tuple(t.plan() for _, t in sorted(new_targets.items()))
    if (
        not dropped
        and new_explicit == g.explicit
        and plan_members == g.plan_members()
        and plan_targets == g.plan_targets()
    ):
        return None
    return GroupPlanned(
        name=g.name,
        incarnation=g.incarnation,
        expected_revision=g.revision,
        revision=revision,
        op=op,
        ts_ms=now_ms,
        explicit=new_explicit,
        members=plan_members,
        targets=plan_targets,
        retired_joins=tuple(retired),
        dropped_cursors=dropped,
        starts=tuple(starts),
    )


def _members_after(
    g: Group, now_ms: int, exempt: str | None, join: tuple[str, str] | None, leave: str | None
) -> tuple[PlannedMembers, list[str]]:
    """The members once the expired are gone, ``leave`` left and ``join`` joined; the join ids retired.

    A new join's generation is the group's next (``generation_seq`` + 1).
    """
    members: PlannedMembers = {mid: (m.join_id, m.generation, m.joined_ms) for mid, m in g.members.items()}
    retired: list[str] = []
    for mid, m in sorted(g.members.items()):
        if mid != exempt and m.last_seen_ms + g.spec.session_timeout_ms <= now_ms:
            retired.append(members.pop(mid)[0])
    if leave is not None and leave in members:
        retired.append(members.pop(leave)[0])
    generation_seq = g.generation_seq
    if join is not None:
        mid, join_id = join
        old = members.get(mid)
        if old is None or old[0] != join_id:
            if old is not None:
                retired.append(old[0])
            generation_seq += 1
            members[mid] = (join_id, generation_seq, now_ms)
    return members, retired


def _carried_targets(
    g: Group, members: PlannedMembers, releases: Iterable[tuple[str, int]]
) -> dict[int, Target]:
    """Copies of the current targets, without the holders that left, expired, were fenced or released."""
    targets = {uid: Target.of(t.plan()) for uid, t in g.targets.items()}
    for t in targets.values():  # holders that left, expired or were fenced let go at once
        if t.holder is not None:
            hm = members.get(t.holder)
            if hm is None or hm[1] != t.holder_generation:
                t.holder = None
    for mid, uid in releases:
        released = targets.get(uid)
        if released is not None and released.holder == mid and released.owner != mid:
            released.holder = None
    return targets


def _targets_for(
    g: Group,
    streams: StreamState,
    now_ms: int,
    targets: dict[int, Target],
    selected: list[tuple[int, str]],
    linked_now: frozenset[int],
) -> tuple[dict[int, Target], list[tuple[int, int]]]:
    """The selected streams as targets, plus unselected ones still draining; where new cursors start."""
    selected_uids = {uid for uid, _ in selected}
    new_targets: dict[int, Target] = {}
    starts: list[tuple[int, int]] = []
    for uid, path in selected:
        known = targets.get(uid)
        if known is None and uid not in g.cursors:  # new to the group (no cursor: 0)
            start = start_of(g, streams.streams[uid], linked_now=uid in linked_now)
            if start > 0:
                starts.append((uid, start))
        t = known or Target(uid, path, True, None, None, 0, 0)
        t.linked = True
        new_targets[uid] = t
    for uid, t in targets.items():
        if (
            uid not in selected_uids
            and t.holder is not None
            and live_stream(streams, uid, now_ms) is not None
        ):
            t.linked, t.owner = False, None  # still draining: the holder must release it
            new_targets[uid] = t
    return new_targets, starts


def _assign_owners(
    new_targets: dict[int, Target], members: PlannedMembers, linked: list[int], revision: int
) -> None:
    """Owners for the linked targets; a free target's owner becomes its holder, fenced at ``revision``."""
    owners = assign(
        sorted(members),
        linked,
        {u: new_targets[u].owner for u in linked},
        {u: new_targets[u].holder for u in linked},
    )
    for uid in linked:
        t = new_targets[uid]
        t.owner = owners[uid]
        if t.holder is None and t.owner is not None:
            t.holder, t.holder_generation, t.fence = t.owner, members[t.owner][1], revision
    for t in new_targets.values():
        if t.holder is None:
            t.holder_generation = 0


def decide_sweep(
    state: GroupsState, streams: StreamState, now_ms: int
) -> list[GroupCursorsSkipped | GroupPlanned]:
    """Cursors retention passed, and plans for groups whose members expired or whose streams came or went."""
    out: list[GroupCursorsSkipped | GroupPlanned] = []
    for name in sorted(state.groups):
        g = state.groups[name]
        planned = plan(g, streams, now_ms, op=f"sweep:{g.revision}")
        skipped = skips(g, streams, now_ms, plan=planned)
        out.extend(r for r in (planned, skipped) if r is not None)
    return out


# ------------------------------------------------------------------ apply


def apply_planned(state: GroupsState, record: GroupPlanned) -> None:
    g = state.groups.get(record.name)
    if (
        g is None
        or g.incarnation != record.incarnation
        or g.revision != record.expected_revision
        or record.revision != record.expected_revision + 1
    ):
        return  # compare-and-set: a stale or replayed plan changes nothing
    old = g.members
    g.members = {}
    for pm in record.members:
        prev = old.get(pm.member)
        seen = prev.last_seen_ms if prev is not None and prev.generation == pm.generation else record.ts_ms
        g.members[pm.member] = Member(pm.member, pm.join_id, pm.generation, pm.joined_ms, seen)
        g.generation_seq = max(g.generation_seq, pm.generation)
    g.targets = {t.stream_uid: Target.of(t) for t in record.targets}
    g.explicit = record.explicit
    g.retired_joins.extend(record.retired_joins)
    del g.retired_joins[:-RETIRED_JOINS_KEPT]
    for uid in record.dropped_cursors:
        g.cursors.pop(uid, None)
        g.skipped.pop(uid, None)
    for uid, offset in record.starts:
        g.cursors.setdefault(uid, offset)
    g.revision = record.revision
    g.recent_ops[record.op] = record.revision
    while len(g.recent_ops) > RECENT_OPS_KEPT:
        del g.recent_ops[next(iter(g.recent_ops))]
