"""Consumer groups: the deterministic coordinator core (an extension of the protocol).

A group is a named set of members sharing the streams that a glob ``pattern``
(``*`` one segment, ``**`` any number) and/or an explicit stream list select in
one bucket. Each stream is processed by at most one member at a time, and each
stream's committed cursor (the next offset to process) lives in the group.

Identity and fencing:

* ``incarnation``: a group's lifetime. Deleting a group retires it; the name
  can be created again with a fresh incarnation (and no cursors). Calls that
  carry another incarnation are ``FENCED``.
* member id + ``join_id``: the application's member id and the identity of one
  processing instance. A join with a new ``join_id`` fences the previous
  instance of the same member id (its join id is retired, so a delayed retry
  of the old join is ``FENCED`` rather than fencing its successor).
* ``generation``: server-assigned per join, rising; member calls carry it.
* ``fence``: per stream activation, the plan revision that activated the
  current holder; commits and releases carry it.

Plans: every change of membership, target set or ownership is one
``GroupPlanned`` record carrying the whole plan at ``revision =
expected_revision + 1`` (compare-and-set on apply) and an operation id.
Ownership moves are intent first: a target's ``owner`` changes, the previous
``holder`` is told to release, and only once it released, left, expired or was
fenced does a later plan make the owner the holder, with a new fence. So there
is never more than one holder per stream.

Assignment is sticky and balanced: member quotas differ by at most one, the
extra streams go to the members that already own the most, each member keeps
as many of its streams as its quota allows, and only the excess moves - the
fewest moves any balanced assignment can have.

Nothing here touches a clock, disk or socket: decide methods get the
``StreamState`` (which streams exist, their tails) and ``now_ms``; they return
records (or raise ``TieredError`` having changed nothing), and ``apply`` moves
the state.

``GroupsState`` holds the data and dispatches; the rules live by concern:

* ``definitions``: create, link and unlink explicit streams, delete (the operator's calls);
* ``membership``: joins, heartbeats, leaves, liveness (``touch``, ``grant_grace``);
* ``planning``: the next plan (members expired, targets selected, owners and
  holders) and the sweep; ``assignment``: sticky balanced owners;
* ``commits``: cursors and the commits that move them, where a new cursor starts;
* ``skips``: cursors retention passed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.groups import commits, definitions, membership, planning, skips
from tiered.engine.groups.assignment import assign
from tiered.engine.groups.commits import start_of
from tiered.engine.groups.model import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_STREAMS,
    DEFAULT_SESSION_TIMEOUT_MS,
    CommitRequest,
    Group,
    GroupSpec,
    Member,
    Rejected,
    ReleaseRequest,
    Target,
    live_stream,
    normalize_paths,
    validate_group_name,
    validate_id,
    validate_pattern,
)
from tiered.engine.groups.records import (
    GROUP_RECORD_TYPES,
    GroupCommitted,
    GroupCreated,
    GroupCursorsSkipped,
    GroupDeleted,
    GroupPlanned,
)
from tiered.engine.groups.snapshot import decode_groups, encode_groups
from tiered.engine.streams.state import StreamState

__all__ = [
    "DEFAULT_MAX_MEMBERS",
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_SESSION_TIMEOUT_MS",
    "CommitRequest",
    "Group",
    "GroupSpec",
    "GroupsState",
    "Member",
    "Rejected",
    "ReleaseRequest",
    "Target",
    "assign",
    "live_stream",
    "normalize_paths",
    "start_of",
    "validate_group_name",
    "validate_id",
    "validate_pattern",
]


class GroupsState:
    """All consumer groups; a ``StateExtension`` of ``StreamState``."""

    name = "groups"
    record_types: tuple[type, ...] = GROUP_RECORD_TYPES

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.next_incarnation = 1
        self.retired: dict[str, int] = {}  # name -> last retired incarnation (idempotent deletes)

    # ------------------------------------------------------------- lookups

    def get(self, name: str) -> Group:
        g = self.groups.get(name)
        if g is None:
            raise TieredError(ErrorCode.GROUP_NOT_FOUND, f"group {name!r} does not exist")
        return g

    def check_group(self, name: str, incarnation: int | None) -> Group:
        g = self.get(name)
        if incarnation is not None and incarnation != g.incarnation:
            raise TieredError(
                ErrorCode.FENCED,
                f"incarnation {incarnation} of group {name!r} was retired",
                reason="incarnation",
                incarnation=g.incarnation,
            )
        return g

    @staticmethod
    def check_member(g: Group, member: str, generation: int) -> Member:
        return membership.check_member(g, member, generation)

    def select(
        self, g: Group, streams: StreamState, now_ms: int, explicit: tuple[str, ...] | None = None
    ) -> tuple[list[tuple[int, str]], int]:
        """(selected (uid, path) sorted by uid and capped at max_streams, uncapped count)."""
        return planning.select(g, streams, now_ms, explicit)

    # ------------------------------------------------------------- decide (see the rule modules)

    def decide_create(
        self, name: str, spec: GroupSpec, streams: StreamState, now_ms: int
    ) -> list[GroupCreated]:
        return definitions.decide_create(self, name, spec, streams, now_ms)

    def decide_join(
        self, name: str, member: str, join_id: str, streams: StreamState, now_ms: int
    ) -> list[GroupCursorsSkipped | GroupPlanned]:
        return membership.decide_join(self, name, member, join_id, streams, now_ms)

    def decide_heartbeat(
        self,
        name: str,
        incarnation: int,
        member: str,
        generation: int,
        commits: Iterable[CommitRequest],
        releases: Iterable[ReleaseRequest],
        streams: StreamState,
        now_ms: int,
        op: str | None = None,
    ) -> tuple[list[GroupCommitted | GroupCursorsSkipped | GroupPlanned], list[Rejected]]:
        return membership.decide_heartbeat(
            self, name, incarnation, member, generation, commits, releases, streams, now_ms, op
        )

    def decide_leave(
        self,
        name: str,
        incarnation: int,
        member: str,
        generation: int,
        commits: Iterable[CommitRequest],
        streams: StreamState,
        now_ms: int,
    ) -> tuple[list[GroupCommitted | GroupCursorsSkipped | GroupPlanned], list[Rejected], bool]:
        return membership.decide_leave(self, name, incarnation, member, generation, commits, streams, now_ms)

    def decide_link(
        self,
        name: str,
        paths: Iterable[str],
        streams: StreamState,
        now_ms: int,
        *,
        unlink: bool = False,
        incarnation: int | None = None,
        expected_revision: int | None = None,
        op_id: str | None = None,
    ) -> list[GroupPlanned | GroupCursorsSkipped]:
        return definitions.decide_link(
            self,
            name,
            paths,
            streams,
            now_ms,
            unlink=unlink,
            incarnation=incarnation,
            expected_revision=expected_revision,
            op_id=op_id,
        )

    def decide_delete(
        self, name: str, now_ms: int, *, incarnation: int | None = None, expected_revision: int | None = None
    ) -> list[GroupDeleted]:
        return definitions.decide_delete(
            self, name, now_ms, incarnation=incarnation, expected_revision=expected_revision
        )

    def decide_sweep(self, streams: StreamState, now_ms: int) -> list[GroupCursorsSkipped | GroupPlanned]:
        return planning.decide_sweep(self, streams, now_ms)

    def decide_skips(self, streams: StreamState, now_ms: int) -> list[GroupCursorsSkipped]:
        return skips.decide_skips(self, streams, now_ms)

    # ------------------------------------------------------------- soft state

    def touch(self, name: str, incarnation: int, member: str, generation: int, now_ms: int) -> None:
        membership.touch(self, name, incarnation, member, generation, now_ms)

    def grant_grace(self, now_ms: int) -> None:
        membership.grant_grace(self, now_ms)

    # ------------------------------------------------------------- apply

    def apply(self, record: Any) -> None:
        rule = _APPLY.get(type(record))
        if rule is None:
            raise TypeError(f"not a group record: {type(record).__name__}")
        rule(self, record)

    # ------------------------------------------------------------- snapshots

    def snapshot(self) -> bytes:
        return encode_groups(self, soft=True)

    def digest(self) -> bytes:
        """The durable state only (no liveness clocks): equal after a replay."""
        return encode_groups(self, soft=False)

    def restore(self, data: bytes) -> None:
        decode_groups(self, data)


_APPLY: dict[type, Callable[[GroupsState, Any], None]] = {
    GroupCommitted: commits.apply_committed,
    GroupCursorsSkipped: skips.apply_skipped,
    GroupPlanned: planning.apply_planned,
    GroupCreated: definitions.apply_created,
    GroupDeleted: definitions.apply_deleted,
}
