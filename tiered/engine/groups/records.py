"""Journal records of consumer groups (see ``tiered.engine.groups``).

They share the metadata journal with stream records, so they use the same
encoding: msgpack arrays tagged ``t`` with a versioned name. This module
depends only on msgspec so ``tiered.records`` can put these types in its
``Record`` union without an import cycle.

A ``GroupPlanned`` record is the group's complete, bounded intent at one
revision (members, every target stream's owner, holder and fence, the explicit
stream list): applying it replaces the previous plan wholesale, but only if
its ``expected_revision`` is the group's current revision (compare-and-set),
so a replayed or duplicated plan changes nothing.

Retention can release data a group has not committed yet. The coordinator
then moves the cursor to the stream's retained offset with a
``GroupCursorsSkipped`` record naming the range, so the move is journaled
and the skip can be reported (member and group views, a metric, a log line);
and a stream that joins a group after retention already released its start
begins at its retained offset (``GroupPlanned.starts``), which is no skip.
"""

from __future__ import annotations

import msgspec


class _GroupRecord(msgspec.Struct, array_like=True, frozen=True, tag_field="t"):
    pass


class PlanMember(msgspec.Struct, array_like=True, frozen=True):
    """One processing instance: application id, its join identity and generation."""

    member: str
    join_id: str  # the instance's join identity (client-chosen, retried verbatim)
    generation: int  # server-assigned, rises with every join in the group
    joined_ms: int


class PlanTarget(msgspec.Struct, array_like=True, frozen=True):
    """One stream of the group: who should own it, and who may process it now."""

    stream_uid: int
    path: str
    linked: bool  # selected by the pattern or explicit list (False: draining a leftover)
    owner: str | None  # intended member id
    holder: str | None  # the one active member id (may differ from owner while it drains)
    holder_generation: int
    fence: int  # revision that activated the holder; rises with every activation


class GroupCreated(_GroupRecord, frozen=True, tag="group.create.v1"):
    name: str
    incarnation: int  # never reused, even for the same name
    bucket: str
    pattern: str | None
    streams: tuple[str, ...]  # explicit paths as created (sorted)
    session_timeout_ms: int
    max_members: int
    max_streams: int
    ts_ms: int
    # (stream uid, retained offset) of the streams selected at creation whose retained offset is past 0:
    # their cursors start there. A trailing field with a default: older records decode without it.
    starts: tuple[tuple[int, int], ...] = ()


class GroupPlanned(_GroupRecord, frozen=True, tag="group.plan.v1"):
    name: str
    incarnation: int
    expected_revision: int
    revision: int  # expected_revision + 1
    op: str  # operation id: a retried operation is recognised and not replanned
    ts_ms: int
    explicit: tuple[str, ...]
    members: tuple[PlanMember, ...]  # sorted by member id
    targets: tuple[PlanTarget, ...]  # sorted by stream uid
    retired_joins: tuple[str, ...]  # join identities fenced by this plan
    dropped_cursors: tuple[int, ...]  # stream uids that no longer exist
    # (stream uid, offset) of streams new to the group whose cursor starts past 0 (``state.start_of``).
    # A trailing field with a default: older records decode without it.
    starts: tuple[tuple[int, int], ...] = ()


class GroupCommitted(_GroupRecord, frozen=True, tag="group.commit.v1"):
    """Cursor commits (stream uid, next offset); a cursor only moves forward."""

    name: str
    incarnation: int
    ts_ms: int
    cursors: tuple[tuple[int, int], ...]


class SkippedRange(msgspec.Struct, array_like=True, frozen=True):
    """Bytes ``[start, end)`` of one stream that retention released before the group committed them."""

    stream_uid: int
    path: str
    start: int  # the committed cursor it moved from
    end: int  # the stream's retained offset: the cursor's new value


class GroupCursorsSkipped(_GroupRecord, frozen=True, tag="group.skip.v1"):
    """Retention passed committed cursors: each moves to its stream's retained offset.

    Applied only where the cursor is still at ``start`` (a commit or another
    skip in between makes it stale), so a replayed record changes nothing.
    """

    name: str
    incarnation: int
    ts_ms: int
    skips: tuple[SkippedRange, ...]


class GroupDeleted(_GroupRecord, frozen=True, tag="group.delete.v1"):
    """Retire an incarnation: its name is free, its cursors are gone."""

    name: str
    incarnation: int
    revision: int
    ts_ms: int


GroupRecord = GroupCreated | GroupPlanned | GroupCommitted | GroupCursorsSkipped | GroupDeleted
GROUP_RECORD_TYPES: tuple[type, ...] = (
    GroupCreated,
    GroupPlanned,
    GroupCommitted,
    GroupCursorsSkipped,
    GroupDeleted,
)
