"""What the consumer-group state machine is made of: groups, members, targets, and the requests members send.

Plain data, names and limits, and the predicates every rule module shares;
the rules live by concern (``definitions``, ``membership``, ``planning`` with
``assignment``, ``commits``, ``skips``) and ``state.GroupsState`` holds it
all together.

``GroupSpec``, ``Member``, ``Target`` and ``Group`` are msgspec Structs and
are their snapshot form too (``snapshot``): a field added to one is in
snapshots with no other edit (added last, with a default, so older snapshots
decode without it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import msgspec

from tiered.core.errors import TieredError, bad_request
from tiered.core.globs import validate_glob
from tiered.core.ids import DEFAULT_BUCKET, validate_bucket, validate_stream_path
from tiered.engine.groups.records import PlanMember, PlanTarget
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


def normalize_paths(paths: Iterable[str]) -> tuple[str, ...]:
    out = set()
    for p in paths:
        try:
            out.add(validate_stream_path(p))
        except TieredError as exc:
            raise bad_request(f"invalid stream path {p!r}: {exc.message}") from None
    return tuple(sorted(out))


# --------------------------------------------------------------------------- state


class GroupSpec(msgspec.Struct, frozen=True, array_like=True):
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


class Member(msgspec.Struct, array_like=True):
    member: str
    join_id: str
    generation: int
    joined_ms: int
    last_seen_ms: int  # soft: refreshed in memory by heartbeats

    # Not journal state: liveness is kept in memory (and granted anew after a restart).
    SOFT_STATE: ClassVar[tuple[str, ...]] = ("last_seen_ms",)


class Target(msgspec.Struct, array_like=True):
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


class Group(msgspec.Struct, array_like=True):
    name: str
    incarnation: int
    spec: GroupSpec
    created_ms: int
    revision: int = 0
    explicit: tuple[str, ...] = ()
    members: dict[str, Member] = msgspec.field(default_factory=dict)
    targets: dict[int, Target] = msgspec.field(default_factory=dict)  # by stream uid
    cursors: dict[int, int] = msgspec.field(default_factory=dict)  # stream uid -> next offset to process
    # stream uid -> (start, end): retention moved the cursor from start to end (== the cursor) and no
    # commit moved it since; members and operators are shown it until then.
    skipped: dict[int, tuple[int, int]] = msgspec.field(default_factory=dict)
    retired_joins: list[str] = msgspec.field(default_factory=list)
    recent_ops: dict[str, int] = msgspec.field(default_factory=dict)  # op id -> revision it produced
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
