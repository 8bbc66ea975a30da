"""Which streams a subscription links, and the index from a stream path to the subscriptions linking it.

A link is explicit (named by the subscription), glob (selected by its
pattern: ``stream_events`` links a stream created under it before its first
byte), or both; it goes when neither holds. Explicit membership outlives the
stream: when the stream goes, the link restarts before the first byte of
whatever is created there later.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tiered.engine.subscriptions.config import invalid
from tiered.engine.subscriptions.model import BEFORE_FIRST, Link, Subscription
from tiered.engine.subscriptions.records import (
    ExplicitLinkRemoved,
    LinkSpec,
    StreamGone,
    StreamsLinked,
    SubscriptionRecord,
)
from tiered.engine.subscriptions.streams_view import StreamsView

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState


def decide_add_streams(
    state: SubscriptionState, sub_id: str, paths: Iterable[str], streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    sub = state.get(sub_id)
    specs = []
    for path in paths:
        if path == sub.wake_stream:
            raise invalid("a subscription's wake_stream cannot also be one of its streams")
        link = sub.links.get(path)
        if link is not None and link.explicit:
            continue  # already linked: idempotent
        tail = streams.tail(path)
        specs.append(LinkSpec(path, "explicit", BEFORE_FIRST if tail is None else tail))
    return [StreamsLinked(sub_id, now_ms, tuple(specs))] if specs else []


def decide_remove_stream(
    state: SubscriptionState, sub_id: str, path: str, now_ms: int
) -> list[SubscriptionRecord]:
    sub = state.get(sub_id)
    link = sub.links.get(path)
    if link is None or not link.explicit:
        return []  # absent explicit link: idempotent
    return [ExplicitLinkRemoved(sub_id, path, now_ms)]


def first_pending(
    sub: Subscription,
    streams: StreamsView,
    acked: dict[str, int] | None = None,
    extra_links: dict[str, int] | None = None,
) -> str | None:
    """The first linked path (in path order) with unprocessed data, given projected acks/links."""
    offsets = {p: link.acked for p, link in sub.links.items()}
    if extra_links:
        for p, a in extra_links.items():
            offsets.setdefault(p, a)
    if acked:
        for p, a in acked.items():
            if p in offsets:
                offsets[p] = a
    for path in sorted(offsets):
        tail = streams.tail(path)
        if tail is not None and tail > max(offsets[path], 0):
            return path
    return None


# ------------------------------------------------------------------ apply


def apply_linked(state: SubscriptionState, sub: Subscription, record: StreamsLinked) -> None:
    for spec in record.links:
        link(state, sub, spec)


def apply_unlinked(state: SubscriptionState, sub: Subscription, record: ExplicitLinkRemoved) -> None:
    found = sub.links.get(record.path)
    if found is not None:
        found.explicit = False
        if not found.glob:
            unlink(state, sub, record.path)


def apply_stream_gone(state: SubscriptionState, r: StreamGone) -> None:
    for sub_id in list(state.by_path.get(r.path, ())):
        sub = state.subs[sub_id]
        found = sub.links[r.path]
        state.dirty.add(sub_id)
        if found.explicit:
            # Explicit membership outlives the stream; a stream created later starts fresh.
            found.glob = False
            found.acked = BEFORE_FIRST
            found.skipped = None
        else:
            unlink(state, sub, r.path)


def link(state: SubscriptionState, sub: Subscription, spec: LinkSpec) -> None:
    explicit, glob = spec.link_type == "explicit", spec.link_type == "glob"
    found = sub.links.get(spec.path)
    if found is None:
        sub.links[spec.path] = Link(spec.path, explicit, glob, spec.acked)
        state.by_path.setdefault(spec.path, set()).add(sub.id)
    else:
        found.explicit = found.explicit or explicit
        found.glob = found.glob or glob


def unlink(state: SubscriptionState, sub: Subscription, path: str) -> None:
    del sub.links[path]
    ids = state.by_path.get(path)
    if ids is not None:
        ids.discard(sub.id)
        if not ids:
            del state.by_path[path]
