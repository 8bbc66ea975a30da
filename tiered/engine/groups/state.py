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
the state. Member liveness (``last_seen_ms``) is soft state, like a stream's
sliding TTL: kept in memory and snapshots, refreshed by heartbeats, and
granted a grace period after a restart (``grant_grace``).

Retention: a committed cursor behind its stream's retained offset points at
data nobody can read any more. The coordinator moves it to the retained
offset and records the skipped range (``GroupCursorsSkipped``), wherever it
looks at the group: when retention is applied (``decide_skips``, called by
the shell right after a retention record), at joins, heartbeats (after their
commits), leaves and sweeps. The range stays on the target (``skipped``,
shown in member and group views) until a commit moves the cursor again, so
the member that processes the stream next is told what it will never see.
Where a stream's cursor starts is where the stream became the group's: its
retained offset when the group is created (``GroupCreated.starts``) or when
it is linked explicitly; its first byte when it is created later under the
group's pattern or an explicit path (``GroupPlanned.starts``; a fork, whose
inherited bytes come from its source, starts at its retained offset). What
retention released before that was never the group's and is no skip.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.globs import glob_match, validate_glob
from tiered.core.ids import DEFAULT_BUCKET, validate_bucket, validate_stream_path
from tiered.engine.groups.records import (
    GROUP_RECORD_TYPES,
    GroupCommitted,
    GroupCreated,
    GroupCursorsSkipped,
    GroupDeleted,
    GroupPlanned,
    PlanMember,
    PlanTarget,
    SkippedRange,
)
from tiered.engine.groups.snapshot import decode_groups, encode_groups
from tiered.engine.streams.model import Stream
from tiered.engine.streams.state import StreamState

MAX_MEMBERS_LIMIT = 256
MAX_STREAMS_LIMIT = 4096
DEFAULT_MAX_MEMBERS = 64
DEFAULT_MAX_STREAMS = 1024
DEFAULT_SESSION_TIMEOUT_MS = 10_000
MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 600_000
RETIRED_JOINS_KEPT = 256
RECENT_OPS_KEPT = 64
MAX_ID_LENGTH = 128

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ID_RE = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,128}")


# --------------------------------------------------------------------------- names and globs


def validate_group_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise bad_request(
            "group names are 1-128 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    return name


def validate_id(value: str, what: str) -> str:
    if not _ID_RE.fullmatch(value):
        raise bad_request(f"{what} must be 1-{MAX_ID_LENGTH} characters without control characters")
    return value


def validate_pattern(pattern: str) -> str:
    """The one glob rule (``tiered.core.globs``), shared with subscriptions."""
    return validate_glob(pattern)


# --------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group's configuration as created (what an idempotent PUT compares)."""

    bucket: str = DEFAULT_BUCKET
    pattern: str | None = None
    streams: tuple[str, ...] = ()
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    max_members: int = DEFAULT_MAX_MEMBERS
    max_streams: int = DEFAULT_MAX_STREAMS

    def validated(self) -> GroupSpec:
        validate_bucket(self.bucket)
        if self.pattern is None and not self.streams:
            raise bad_request("a group needs a pattern, streams, or both")
        pattern = validate_pattern(self.pattern) if self.pattern is not None else None
        streams = normalize_paths(self.streams)
        if not MIN_SESSION_TIMEOUT_MS <= self.session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise bad_request(
                f"session_timeout_ms must be between {MIN_SESSION_TIMEOUT_MS} and {MAX_SESSION_TIMEOUT_MS}"
            )
        if not 1 <= self.max_members <= MAX_MEMBERS_LIMIT:
            raise bad_request(f"max_members must be between 1 and {MAX_MEMBERS_LIMIT}")
        if not 1 <= self.max_streams <= MAX_STREAMS_LIMIT:
            raise bad_request(f"max_streams must be between 1 and {MAX_STREAMS_LIMIT}")
        return GroupSpec(
            self.bucket, pattern, streams, self.session_timeout_ms, self.max_members, self.max_streams
        )


def normalize_paths(paths: Iterable[str]) -> tuple[str, ...]:
    out = set()
    for p in paths:
        try:
            out.add(validate_stream_path(p))
        except TieredError as exc:
            raise bad_request(f"invalid stream path {p!r}: {exc.message}") from None
    return tuple(sorted(out))


@dataclass(slots=True)
class Member:
    member: str
    join_id: str
    generation: int
    joined_ms: int
    last_seen_ms: int  # soft: refreshed in memory by heartbeats

    # Not journal state: liveness is kept in memory (and granted anew after a restart).
    SOFT_STATE: ClassVar[tuple[str, ...]] = ("last_seen_ms",)


@dataclass(slots=True)
class Target:
    stream_uid: int
    path: str
    linked: bool
    owner: str | None
    holder: str | None
    holder_generation: int
    fence: int

    def plan(self) -> PlanTarget:
        return PlanTarget(
            self.stream_uid,
            self.path,
            self.linked,
            self.owner,
            self.holder,
            self.holder_generation,
            self.fence,
        )

    @classmethod
    def of(cls, t: PlanTarget) -> Target:
        return cls(t.stream_uid, t.path, t.linked, t.owner, t.holder, t.holder_generation, t.fence)


@dataclass(slots=True)
class Group:
    name: str
    incarnation: int
    spec: GroupSpec
    created_ms: int
    revision: int = 0
    explicit: tuple[str, ...] = ()
    members: dict[str, Member] = field(default_factory=dict)
    targets: dict[int, Target] = field(default_factory=dict)  # by stream uid
    cursors: dict[int, int] = field(default_factory=dict)  # stream uid -> next offset to process
    # stream uid -> (start, end): retention moved the cursor from start to end (== the cursor) and no
    # commit moved it since; members and operators are shown it until then.
    skipped: dict[int, tuple[int, int]] = field(default_factory=dict)
    retired_joins: list[str] = field(default_factory=list)
    recent_ops: dict[str, int] = field(default_factory=dict)  # op id -> revision it produced
    generation_seq: int = 0

    def plan_members(self) -> tuple[PlanMember, ...]:
        return tuple(
            PlanMember(m.member, m.join_id, m.generation, m.joined_ms)
            for _, m in sorted(self.members.items())
        )

    def plan_targets(self) -> tuple[PlanTarget, ...]:
        return tuple(t.plan() for _, t in sorted(self.targets.items()))

    def targets_by_path(self) -> dict[str, Target]:
        """Targets by stream path (a recreated path maps to its newest stream)."""
        return {t.path: t for _, t in sorted(self.targets.items())}


@dataclass(frozen=True, slots=True)
class Rejected:
    """One commit of a heartbeat or leave that was refused (the rest still apply)."""

    stream: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class CommitRequest:
    stream: str
    fence: int
    offset: int


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    stream: str
    fence: int


def live_stream(streams: StreamState, uid: int, now_ms: int) -> Stream | None:
    """The stream with this uid if a client can still read it."""
    s = streams.streams.get(uid)
    if s is None or s.soft_deleted or s.expired(now_ms) or streams.paths.get((s.bucket, s.path)) != uid:
        return None
    return s


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


def assign(
    members: Sequence[str],
    linked: Sequence[int],
    previous: dict[int, str | None],
    holders: dict[int, str | None],
) -> dict[int, str | None]:
    """Sticky balanced owners for ``linked`` streams among ``members`` (both sorted).

    Quotas differ by at most one; the larger ones go to the members that own
    the most already; members keep their streams up to their quota (actively
    held ones first) and only the excess moves, which is the fewest moves any
    balanced assignment can make. Freed streams go back to their current holder
    when it has room, so a drain in progress can be cancelled.
    """
    if not members:
        return {u: None for u in linked}
    current: dict[str, list[int]] = {m: [] for m in members}
    for u in linked:
        o = previous.get(u)
        if o is not None and o in current:
            current[o].append(u)
    base, extra = divmod(len(linked), len(members))
    order = sorted(members, key=lambda m: (-len(current[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    result: dict[int, str | None] = {}
    count = dict.fromkeys(members, 0)
    for m in members:
        mine = sorted(current[m], key=lambda u: (holders.get(u) != m, u))
        for u in mine[: quota[m]]:
            result[u] = m
        count[m] = min(len(mine), quota[m])
    free = [u for u in linked if u not in result]
    rest = []
    for u in free:
        h = holders.get(u)
        if h is not None and h in count and count[h] < quota[h]:
            result[u] = h
            count[h] += 1
        else:
            rest.append(u)
    it = iter(rest)
    for m in members:
        while count[m] < quota[m]:
            result[next(it)] = m
            count[m] += 1
    return result


# --------------------------------------------------------------------------- the core


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
        m = g.members.get(member)
        if m is None:
            raise TieredError(
                ErrorCode.NOT_MEMBER, f"{member!r} is not a member of group {g.name!r}; join again"
            )
        if m.generation != generation:
            raise TieredError(
                ErrorCode.FENCED,
                f"generation {generation} of {member!r} was superseded by a newer join",
                reason="generation",
                generation=m.generation,
            )
        return m

    def select(
        self, g: Group, streams: StreamState, now_ms: int, explicit: tuple[str, ...] | None = None
    ) -> tuple[list[tuple[int, str]], int]:
        """(selected (uid, path) sorted by uid and capped at max_streams, uncapped count)."""
        explicit = g.explicit if explicit is None else explicit
        bucket, pattern = g.spec.bucket, g.spec.pattern
        found: dict[int, str] = {}
        if pattern is not None:
            for (b, path), uid in streams.paths.items():
                if (
                    b == bucket
                    and glob_match(pattern, path)
                    and live_stream(streams, uid, now_ms) is not None
                ):
                    found[uid] = path
        for path in explicit:
            found_uid = streams.paths.get((bucket, path))
            if found_uid is not None and live_stream(streams, found_uid, now_ms) is not None:
                found[found_uid] = path
        ordered = sorted(found.items())
        return ordered[: g.spec.max_streams], len(ordered)

    # ------------------------------------------------------------- planning

    def _plan(
        self,
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
        """The next plan after expiring members and applying one operation, or None if unchanged."""
        members: dict[str, tuple[str, int, int]] = {
            mid: (m.join_id, m.generation, m.joined_ms) for mid, m in g.members.items()
        }
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
        new_explicit = g.explicit if explicit is None else explicit

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

        selected, _ = self.select(g, streams, now_ms, new_explicit)
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
        linked = sorted(selected_uids)
        owners = assign(
            sorted(members),
            linked,
            {u: new_targets[u].owner for u in linked},
            {u: new_targets[u].holder for u in linked},
        )
        revision = g.revision + 1
        for uid in linked:
            t = new_targets[uid]
            t.owner = owners[uid]
            if t.holder is None and t.owner is not None:
                t.holder, t.holder_generation, t.fence = t.owner, members[t.owner][1], revision
        for t in new_targets.values():
            if t.holder is None:
                t.holder_generation = 0
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

    def _skips(
        self,
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
        skips = []
        for uid, path in sorted(paths.items()):
            s = live_stream(streams, uid, now_ms)
            if s is None:
                continue
            cursor = cursors.get(uid, 0)
            if cursor < s.retained_from:
                skips.append(SkippedRange(uid, path, cursor, s.retained_from))
        if not skips:
            return None
        return GroupCursorsSkipped(g.name, g.incarnation, now_ms, tuple(skips))

    # ------------------------------------------------------------- decide

    def decide_create(
        self, name: str, spec: GroupSpec, streams: StreamState, now_ms: int
    ) -> list[GroupCreated]:
        """``[GroupCreated]``, or ``[]`` when an identical group exists (idempotent)."""
        validate_group_name(name)
        spec = spec.validated()
        existing = self.groups.get(name)
        if existing is not None:
            if existing.spec == spec:
                return []
            raise TieredError(ErrorCode.GROUP_EXISTS, f"group {name!r} exists with a different configuration")
        if spec.bucket not in streams.buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {spec.bucket!r} does not exist")
        probe = Group(name, self.next_incarnation, spec, now_ms, explicit=spec.streams)
        selected, count = self.select(probe, streams, now_ms)
        if len(spec.streams) > spec.max_streams or count > spec.max_streams:
            raise TieredError(
                ErrorCode.TOO_MANY_STREAMS,
                f"the group would select {max(count, len(spec.streams))} streams; the limit is {spec.max_streams}",
                limit=spec.max_streams,
            )
        return [
            GroupCreated(
                name=name,
                incarnation=self.next_incarnation,
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

    def decide_join(
        self, name: str, member: str, join_id: str, streams: StreamState, now_ms: int
    ) -> list[GroupCursorsSkipped | GroupPlanned]:
        """Admit a processing instance. A retry with the same ``join_id`` changes nothing."""
        g = self.get(name)
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
            alive = sum(
                1 for mid, x in g.members.items() if x.last_seen_ms + g.spec.session_timeout_ms > now_ms
            )
            if alive >= g.spec.max_members:
                raise TieredError(
                    ErrorCode.TOO_MANY_MEMBERS,
                    f"group {name!r} already has {alive} members; the limit is {g.spec.max_members}",
                    limit=g.spec.max_members,
                )
        plan = self._plan(g, streams, now_ms, op=f"join:{join_id}", exempt=member, join=(member, join_id))
        skipped = self._skips(g, streams, now_ms, plan=plan)
        return [r for r in (plan, skipped) if r is not None]

    def _commits(
        self,
        g: Group,
        member: str,
        generation: int,
        commits: Iterable[CommitRequest],
        streams: StreamState,
        now_ms: int,
    ) -> tuple[GroupCommitted | None, list[Rejected]]:
        rejected: list[Rejected] = []
        moved: dict[int, int] = {}
        by_path = g.targets_by_path()
        for c in commits:
            t = by_path.get(c.stream)
            if t is None or t.holder != member or t.holder_generation != generation or t.fence != c.fence:
                rejected.append(
                    Rejected(
                        c.stream, "FENCED", f"{member!r} does not hold {c.stream!r} with fence {c.fence}"
                    )
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
        """Commit cursors, move the ones retention passed, release revoked streams, and replan.

        Returns (records, refused commits).
        """
        g = self.check_group(name, incarnation)
        self.check_member(g, member, generation)
        committed, rejected = self._commits(g, member, generation, commits, streams, now_ms)
        released: list[tuple[str, int]] = []
        by_path = g.targets_by_path()
        for r in releases:
            t = by_path.get(r.stream)
            # Releasing what one no longer holds is a no-op: retries are harmless.
            if (
                t is not None
                and t.holder == member
                and t.holder_generation == generation
                and t.fence == r.fence
            ):
                released.append((member, t.stream_uid))
        plan = self._plan(
            g,
            streams,
            now_ms,
            op=op or f"heartbeat:{member}:{generation}:{g.revision}",
            exempt=member,
            releases=released,
        )
        skipped = self._skips(g, streams, now_ms, committed, plan)
        records: list[GroupCommitted | GroupCursorsSkipped | GroupPlanned] = [
            r for r in (committed, plan, skipped) if r is not None
        ]
        return records, rejected

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
        """Final commits, then leave. Leaving twice is fine: (records, refused, was a member)."""
        g = self.check_group(name, incarnation)
        if member not in g.members:
            return [], [], False
        self.check_member(g, member, generation)
        committed, rejected = self._commits(g, member, generation, commits, streams, now_ms)
        plan = self._plan(g, streams, now_ms, op=f"leave:{member}:{generation}", leave=member)
        skipped = self._skips(g, streams, now_ms, committed, plan)
        return [r for r in (committed, plan, skipped) if r is not None], rejected, True

    def _check_admin(self, g: Group, expected_revision: int | None) -> None:
        if expected_revision is not None and expected_revision != g.revision:
            raise TieredError(
                ErrorCode.STALE_REVISION,
                f"group {g.name!r} is at revision {g.revision}, not {expected_revision}",
                revision=g.revision,
            )

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
        """Add (or with ``unlink`` remove) explicit streams. Idempotent; CAS with ``expected_revision``."""
        g = self.check_group(name, incarnation)
        if op_id is not None and op_id in g.recent_ops:
            return []
        self._check_admin(g, expected_revision)
        wanted = normalize_paths(paths)
        explicit = (
            tuple(sorted(set(g.explicit) - set(wanted)))
            if unlink
            else tuple(sorted(set(g.explicit) | set(wanted)))
        )
        if explicit == g.explicit:
            return []
        if not unlink:
            _, count = self.select(g, streams, now_ms, explicit)
            if len(explicit) > g.spec.max_streams or count > g.spec.max_streams:
                raise TieredError(
                    ErrorCode.TOO_MANY_STREAMS,
                    f"the group would select {max(count, len(explicit))} streams; the limit is {g.spec.max_streams}",
                    limit=g.spec.max_streams,
                )
        op = op_id or f"{'unlink' if unlink else 'link'}:{g.revision}"
        fresh = frozenset(
            uid for p in wanted if (uid := streams.paths.get((g.spec.bucket, p))) is not None and not unlink
        )
        plan = self._plan(g, streams, now_ms, op=op, explicit=explicit, linked_now=fresh)
        skipped = self._skips(g, streams, now_ms, plan=plan)
        return [r for r in (plan, skipped) if r is not None]

    def decide_delete(
        self, name: str, now_ms: int, *, incarnation: int | None = None, expected_revision: int | None = None
    ) -> list[GroupDeleted]:
        g = self.groups.get(name)
        if g is None and incarnation is not None and self.retired.get(name) == incarnation:
            return []  # a retried delete
        g = self.check_group(name, incarnation)
        self._check_admin(g, expected_revision)
        return [GroupDeleted(name, g.incarnation, g.revision, now_ms)]

    def decide_sweep(self, streams: StreamState, now_ms: int) -> list[GroupCursorsSkipped | GroupPlanned]:
        """Cursors retention passed, and plans for groups whose members expired or whose streams came or went."""
        out: list[GroupCursorsSkipped | GroupPlanned] = []
        for name in sorted(self.groups):
            g = self.groups[name]
            plan = self._plan(g, streams, now_ms, op=f"sweep:{g.revision}")
            skipped = self._skips(g, streams, now_ms, plan=plan)
            out.extend(r for r in (plan, skipped) if r is not None)
        return out

    def decide_skips(self, streams: StreamState, now_ms: int) -> list[GroupCursorsSkipped]:
        """Every group's cursors retention passed, moved (run right after retention is applied)."""
        out = []
        for name in sorted(self.groups):
            skipped = self._skips(self.groups[name], streams, now_ms)
            if skipped is not None:
                out.append(skipped)
        return out

    # ------------------------------------------------------------- soft state

    def touch(self, name: str, incarnation: int, member: str, generation: int, now_ms: int) -> None:
        """A live member was heard from (in memory only, like a sliding TTL)."""
        g = self.groups.get(name)
        if g is None or g.incarnation != incarnation:
            return
        m = g.members.get(member)
        if m is not None and m.generation == generation:
            m.last_seen_ms = max(m.last_seen_ms, now_ms)

    def grant_grace(self, now_ms: int) -> None:
        """After a restart every member gets a full session timeout to come back."""
        for g in self.groups.values():
            for m in g.members.values():
                m.last_seen_ms = max(m.last_seen_ms, now_ms)

    # ------------------------------------------------------------- apply

    def apply(self, record: Any) -> None:
        if isinstance(record, GroupCommitted):
            g = self.groups.get(record.name)
            if g is None or g.incarnation != record.incarnation:
                return
            for uid, offset in record.cursors:
                if uid in g.targets and offset > g.cursors.get(uid, 0):
                    g.cursors[uid] = offset
                    g.skipped.pop(uid, None)  # processed past the gap: nothing left to report
        elif isinstance(record, GroupCursorsSkipped):
            g = self.groups.get(record.name)
            if g is None or g.incarnation != record.incarnation:
                return
            for r in record.skips:
                uid = r.stream_uid
                if uid not in g.targets or g.cursors.get(uid, 0) != r.start or r.end <= r.start:
                    continue  # stale: the cursor moved since (or a replay)
                g.cursors[uid] = r.end
                before = g.skipped.get(uid)
                # Two skips with no commit between are one gap.
                g.skipped[uid] = (
                    before[0] if before is not None and before[1] == r.start else r.start,
                    r.end,
                )
        elif isinstance(record, GroupPlanned):
            g = self.groups.get(record.name)
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
                seen = (
                    prev.last_seen_ms
                    if prev is not None and prev.generation == pm.generation
                    else record.ts_ms
                )
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
        elif isinstance(record, GroupCreated):
            if record.name in self.groups or record.incarnation < self.next_incarnation:
                return
            spec = GroupSpec(
                record.bucket,
                record.pattern,
                record.streams,
                record.session_timeout_ms,
                record.max_members,
                record.max_streams,
            )
            self.groups[record.name] = Group(
                record.name, record.incarnation, spec, record.ts_ms, explicit=record.streams
            )
            self.groups[record.name].cursors.update(record.starts)
            self.next_incarnation = record.incarnation + 1
        elif isinstance(record, GroupDeleted):
            g = self.groups.get(record.name)
            if g is not None and g.incarnation == record.incarnation and g.revision == record.revision:
                del self.groups[record.name]
                self.retired[record.name] = record.incarnation
        else:
            raise TypeError(f"not a group record: {type(record).__name__}")

    # ------------------------------------------------------------- snapshots

    def snapshot(self) -> bytes:
        return encode_groups(self, soft=True)

    def digest(self) -> bytes:
        """The durable state only (no liveness clocks): equal after a replay."""
        return encode_groups(self, soft=False)

    def restore(self, data: bytes) -> None:
        decode_groups(self, data)
