"""Creating, relinking and deleting groups: the operator's calls, and what their records do.

* ``incarnation``: a group's lifetime. Deleting a group retires it; the name
  can be created again with a fresh incarnation (and no cursors). Calls that
  carry another incarnation are ``FENCED``.
* Admin calls may carry ``expected_revision`` (compare-and-set against the
  group's plan revision: ``STALE_REVISION``) and an operation id (a retried
  operation is recognised and not replanned).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.groups.model import Group, GroupSpec, normalize_paths, validate_group_name
from tiered.engine.groups.planning import plan, select
from tiered.engine.groups.records import GroupCreated, GroupCursorsSkipped, GroupDeleted, GroupPlanned
from tiered.engine.groups.skips import skips
from tiered.engine.streams.state import StreamState

if TYPE_CHECKING:
    from tiered.engine.groups.state import GroupsState


def too_many_streams(count: int, limit: int) -> TieredError:
    return TieredError(
        ErrorCode.TOO_MANY_STREAMS,
        f"the group would select {count} streams; the limit is {limit}",
        limit=limit,
    )


def check_admin(g: Group, expected_revision: int | None) -> None:
    if expected_revision is not None and expected_revision != g.revision:
        raise TieredError(
            ErrorCode.STALE_REVISION,
            f"group {g.name!r} is at revision {g.revision}, not {expected_revision}",
            revision=g.revision,
        )


def decide_create(
    state: GroupsState, name: str, spec: GroupSpec, streams: StreamState, now_ms: int
) -> list[GroupCreated]:
    """``[GroupCreated]``, or ``[]`` when an identical group exists (idempotent)."""
    validate_group_name(name)
    spec = spec.validated()
    existing = state.groups.get(name)
    if existing is not None:
        if existing.spec == spec:
            return []
        raise TieredError(ErrorCode.GROUP_EXISTS, f"group {name!r} exists with a different configuration")
    if spec.bucket not in streams.buckets:
        raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {spec.bucket!r} does not exist")
    probe = Group(name, state.next_incarnation, spec, now_ms, explicit=spec.streams)
    selected, count = select(probe, streams, now_ms)
    if len(spec.streams) > spec.max_streams or count > spec.max_streams:
        raise too_many_streams(max(count, len(spec.streams)), spec.max_streams)
    return [
        GroupCreated(
            name=name,
            incarnation=state.next_incarnation,
            bucket=spec.bucket,
            pattern=spec.pattern,
            streams=spec.streams,
            session_timeout_ms=spec.session_timeout_ms,
            max_members=spec.max_members,
            max_streams=spec.max_streams,
            ts_ms=now_ms,
            starts=tuple((uid, streams.streams[uid].retained_from) for uid, _ in selected),
        )
    ]


def decide_link(
    state: GroupsState,
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
    """Add (or with ``unlink`` remove) explicit streams. Idempotent; CAS with ``expected_revision``."""
    g = state.check_group(name, incarnation)
    if op_id is not None and op_id in g.recent_ops:
        return []
    check_admin(g, expected_revision)
    wanted = normalize_paths(paths)
    explicit = (
        tuple(sorted(set(g.explicit) - set(wanted)))
        if unlink
        else tuple(sorted(set(g.explicit) | set(wanted)))
    )
    if explicit == g.explicit:
        return []
    if not unlink:
        _, count = select(g, streams, now_ms, explicit)
        if len(explicit) > g.spec.max_streams or count > g.spec.max_streams:
            raise too_many_streams(max(count, len(explicit)), g.spec.max_streams)
    op = op_id or f"{'unlink' if unlink else 'link'}:{g.revision}"
    fresh = frozenset(
        uid for p in wanted if (uid := streams.paths.get((g.spec.bucket, p))) is not None and not unlink
    )
    planned = plan(g, streams, now_ms, op=op, explicit=explicit, linked_now=fresh)
    skipped = skips(g, streams, now_ms, plan=planned)
    return [r for r in (planned, skipped) if r is not None]


def decide_delete(
    state: GroupsState,
    name: str,
    now_ms: int,
    *,
    incarnation: int | None = None,
    expected_revision: int | None = None,
) -> list[GroupDeleted]:
    g = state.groups.get(name)
    if g is None and incarnation is not None and state.retired.get(name) == incarnation:
        return []  # a retried delete
    g = state.check_group(name, incarnation)
    check_admin(g, expected_revision)
    return [GroupDeleted(name, g.incarnation, g.revision, now_ms)]


# ------------------------------------------------------------------ apply


def apply_created(state: GroupsState, record: GroupCreated) -> None:
    if record.name in state.groups or record.incarnation < state.next_incarnation:
        return
    spec = GroupSpec(
        record.bucket,
        record.pattern,
        record.streams,
        record.session_timeout_ms,
        record.max_members,
        record.max_streams,
    )
    state.groups[record.name] = Group(
        record.name, record.incarnation, spec, record.ts_ms, explicit=record.streams
    )
    state.groups[record.name].cursors.update(record.starts)
    state.next_incarnation = record.incarnation + 1


def apply_deleted(state: GroupsState, record: GroupDeleted) -> None:
    g = state.groups.get(record.name)
    if g is not None and g.incarnation == record.incarnation and g.revision == record.revision:
        del state.groups[record.name]
        state.retired[record.name] = record.incarnation
