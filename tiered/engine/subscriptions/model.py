"""What the subscription state machine is made of: subscriptions, their links and their wake.

Plain data and the predicates every rule module shares; the rules live by
concern (``definitions``, ``links``, ``wakes``, ``claims``, ``webhook_schedule``,
``skips``, ``stream_events``, ``keys``) and ``state.SubscriptionState`` holds
it all together.

Per subscription:

* links: ``path -> Link(explicit, glob, acked)``. ``acked`` is the last
  processed offset (inclusive); ``-1`` (``BEFORE_FIRST``) means nothing
  processed yet. A link has pending work when the stream's tail is past
  ``max(acked, 0)``.
* ``generation`` counts wakes; at most one wake is recorded at a time. A new
  wake supersedes (fences) the old one.

These are msgspec Structs and are their snapshot form too (``snapshot``): a
field added to one is in snapshots with no other edit (added last, with a
default, so older snapshots decode without it).
"""

from __future__ import annotations

import re
from functools import cached_property

import msgspec

from tiered.core.globs import compile_glob
from tiered.engine.subscriptions.config import RESERVED_SEGMENT

BEFORE_FIRST = -1


def is_reserved(path: str) -> bool:
    return path.split("/", 1)[0] == RESERVED_SEGMENT


class Link(msgspec.Struct, array_like=True):
    path: str
    explicit: bool
    glob: bool
    acked: int
    skipped: tuple[int, int] | None = (
        None  # [start, end) retention released unprocessed; until an ack reaches end
    )

    @property
    def link_type(self) -> str:
        return "explicit" if self.explicit else "glob"


class Wake(msgspec.Struct, array_like=True):
    wake_id: str
    generation: int
    issued_ms: int
    stream: str
    snapshot: dict[str, int]
    holder: str | None = None
    lease_expires_ms: int | None = None
    delivered: bool = False


class Subscription(msgspec.Struct, array_like=True, dict=True):  # dict: where ``matcher`` is cached
    id: str
    incarnation: int
    type: str
    pattern: str | None
    streams: tuple[str, ...]
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None
    created_ms: int
    config_hash: str
    base_url: str
    links: dict[str, Link] = msgspec.field(default_factory=dict)
    generation: int = 0
    wake: Wake | None = None
    status: str = "active"  # "failed" while a webhook retry is scheduled
    attempts: int = 0  # consecutive failed deliveries
    next_attempt_ms: int | None = None
    last_error: str | None = None

    @cached_property
    def matcher(self) -> re.Pattern[str] | None:
        """The pattern compiled (derived: not in snapshots, compiled once per subscription)."""
        return compile_glob(self.pattern) if self.pattern is not None else None

    def matches(self, path: str) -> bool:
        return (
            self.matcher is not None
            and path != self.wake_stream
            and self.matcher.fullmatch("/" + path) is not None
        )


def wake_live(sub: Subscription, now_ms: int) -> bool:
    """Whether the recorded wake still stands at ``now_ms`` (its lease, if any, has not run out)."""
    w = sub.wake
    if w is None:
        return False
    if w.lease_expires_ms is None:  # pull-wake not claimed yet, webhook not delivered yet
        return True
    return now_ms < w.lease_expires_ms
