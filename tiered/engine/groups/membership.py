"""Members: joins, heartbeats and leaves, and the liveness that expires a member.

* member id + ``join_id``: the application's member id and the identity of one
  processing instance. A join with a new ``join_id`` fences the previous
  instance of the same member id (its join id is retired, so a delayed retry
  of the old join is ``FENCED`` rather than fencing its successor).
* ``generation``: server-assigned per join, rising; member calls carry it.
* ``fence``: per stream activation, the plan revision that activated the
  current holder; commits and releases carry it.

Member liveness (``last_seen_ms``) is soft state, like a stream's sliding
TTL: kept in memory and snapshots, refreshed by heartbeats (``touch``), and
granted a grace period after a restart (``grant_grace``). A member silent
for its group's session timeout is expired by the next plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.groups.commits import commits
from tiered.engine.groups.model import CommitRequest, Group, Member, Rejected, ReleaseRequest, validate_id
from tiered.engine.groups.planning import plan
from tiered.engine.groups.records import GroupCommitted, GroupCursorsSkipped, GroupPlanned
from tiered.engine.groups.skips import skips
from tiered.engine.streams.state import StreamState

if TYPE_CHECKING:
    from tiered.engine.groups.state import GroupsState

MemberRecords = list[GroupCommitted | GroupCursorsSkipped | GroupPlanned]


def check_member(g: Group, member: str, generation: int) -> Member:
    m = g.members.get(member)
    if m is None:
        raise TieredError(ErrorCode.NOT_MEMBER, f"{member!r} is not a member of group {g.name!r}; join again")
    if m.generation != generation:
        raise TieredError(
            ErrorCode.FENCED,
            f"generation {generation} of {member!r} was superseded by a newer join",
            reason="generation",
            generation=m.generation,
        )
    return m


def decide_join(
    state: GroupsState, name: str, member: str, join_id: str, streams: StreamState, now_ms: int
) -> list[GroupCursorsSkipped | GroupPlanned]:
    """Admit a processing instance. A retry with the same ``join_id`` changes nothing."""
    g = state.get(name)
    validate_id(member, "member")
    validate_id(join_id, "join_id")
    if join_id in g.retired_joins:
        raise TieredError(
            ErrorCode.FENCED,
            f"join {join_id!r} was superseded or ended; join with a new join_id",
            reason="join",
        )
    m = g.members.get(member)
    if m is None:
        alive = sum(1 for mid, x in g.members.items() if x.last_seen_ms + g.spec.session_timeout_ms > now_ms)
        if alive >= g.spec.max_members:
            raise TieredError(
                ErrorCode.TOO_MANY_MEMBERS,
                f"group {name!r} already has {alive} members; the limit is {g.spec.max_members}",
                limit=g.spec.max_members,
            )
    planned = plan(g, streams, now_ms, op=f"join:{join_id}", exempt=member, join=(member, join_id))
    skipped = skips(g, streams, now_ms, plan=planned)
    return [r for r in (planned, skipped) if r is not None]


def decide_heartbeat(
    state: GroupsState,
    name: str,
    incarnation: int,
    member: str,
    generation: int,
    requests: Iterable[CommitRequest],
    releases: Iterable[ReleaseRequest],
    streams: StreamState,
    now_ms: int,
    op: str | None = None,
) -> tuple[MemberRecords, list[Rejected]]:
    """Commit cursors, move the ones retention passed, release revoked streams, and replan.

    Returns (records, refused commits).
    """
    g = state.check_group(name, incarnation)
    check_member(g, member, generation)
    committed, rejected = commits(g, member, generation, requests, streams, now_ms)
    released: list[tuple[str, int]] = []
    by_path = g.targets_by_path()
    for r in releases:
        t = by_path.get(r.stream)
        # Releasing what one no longer holds is a no-op: retries are harmless.
        if t is not None and t.holder == member and t.holder_generation == generation and t.fence == r.fence:
            released.append((member, t.stream_uid))
    planned = plan(
        g,
        streams,
        now_ms,
        op=op or f"heartbeat:{member}:{generation}:{g.revision}",
        exempt=member,
        releases=released,
    )
    skipped = skips(g, streams, now_ms, committed, planned)
    records: MemberRecords = [r for r in (committed, planned, skipped) if r is not None]
    return records, rejected


def decide_leave(
    state: GroupsState,
    name: str,
    incarnation: int,
    member: str,
    generation: int,
    requests: Iterable[CommitRequest],
    streams: StreamState,
    now_ms: int,
) -> tuple[MemberRecords, list[Rejected], bool]:
    """Final commits, then leave. Leaving twice is fine: (records, refused, was a member)."""
    g = state.check_group(name, incarnation)
    if member not in g.members:
        return [], [], False
    check_member(g, member, generation)
    committed, rejected = commits(g, member, generation, requests, streams, now_ms)
    planned = plan(g, streams, now_ms, op=f"leave:{member}:{generation}", leave=member)
    skipped = skips(g, streams, now_ms, committed, planned)
    return [r for r in (committed, planned, skipped) if r is not None], rejected, True


# ------------------------------------------------------------- soft state


def touch(state: GroupsState, name: str, incarnation: int, member: str, generation: int, now_ms: int) -> None:
    """A live member was heard from (in memory only, like a sliding TTL)."""
    g = state.groups.get(name)
    if g is None or g.incarnation != incarnation:
        return
    m = g.members.get(member)
    if m is not None and m.generation == generation:
        m.last_seen_ms = max(m.last_seen_ms, now_ms)


def grant_grace(state: GroupsState, now_ms: int) -> None:
    """After a restart every member gets a full session timeout to come back."""
    for g in state.groups.values():
        for m in g.members.values():
            m.last_seen_ms = max(m.last_seen_ms, now_ms)
