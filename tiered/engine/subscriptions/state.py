"""Subscriptions: durable cursors over streams that wake workers (protocol sections 6 and 7).

The deterministic core, in the same style as ``tiered.engine.streams.state``:
requests are *decided* against the current state (producing journal records
from ``records``, or a ``TieredError`` that changes nothing) and records are
*applied*. Time, randomness (retry jitter) and key material come in as
arguments; nothing here does I/O. The shell is ``service`` (requests) and
``delivery`` (webhooks, wake events, timers); routes are in ``http``.

Model, per subscription:

* links: ``path -> Link(explicit, glob, acked)``. ``acked`` is the last
  processed offset (inclusive); ``-1`` means nothing processed yet. A link has
  pending work when the stream's tail is past ``max(acked, 0)``.
* ``generation`` counts wakes; at most one wake is recorded at a time. A new
  wake supersedes (fences) the old one. Callback/ack/release must present a
  token for, and the body must name, the current generation and wake id.
* webhook wakes are delivered by the shell; their lease starts when the
  receiver accepts the delivery (a failing receiver keeps the wake and gets
  retries on a journaled schedule instead of a new generation per lease).
  pull-wake wakes wait (unleased) for a claim; a claim starts the lease.
  A wake whose lease ran out is treated as gone at once, and the shell
  journals its end (and the next wake, if work is pending).

Stream events reach ``on_stream_event`` from the committer, right after a
stream record is applied: new streams matching a pattern are linked before
their first byte, appends wake idle subscriptions, deleted streams unlink.

``SubscriptionState`` holds the data and dispatches; the rules live by concern:

* ``definitions``: create and delete;
* ``links``: explicit and glob links, the path index, pending work;
* ``wakes``: issuing wakes, their expiry, the fence after a restart, what the shell does next;
* ``claims``: claims, callbacks, acks and releases (leases and fencing);
* ``webhook_schedule``: webhook deliveries accepted or failed, the retry schedule;
* ``skips``: links whose acked offset retention passed;
* ``stream_events``: follow-ups of stream records (local, or another shard's);
* ``keys``: signing keys and wake tokens.

Retention (issue 18, defect 9): a link whose acked offset retention passed
would send its worker to released data. Its acked offset moves to the
stream's retained offset with a ``LinksSkipped`` record naming the range
(for a link that acked nothing yet, from the stream's first byte; a fork's
inherited bytes, readable from its retained offset, are no loss): right after
a retention record (``on_stream_event``), and before every wake, claim,
delivery and ack looks at the links. The range stays on the link
(``skipped``, shown in wake bodies, claims and GET) until an ack reaches its
end; an ack inside it (work done before retention moved the cursor) is no
error and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from tiered.engine.streams.model import Stream
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions import (
    claims,
    definitions,
    keys,
    links,
    skips,
    stream_events,
    wakes,
    webhook_schedule,
)
from tiered.engine.subscriptions.config import SubscriptionConfig, WakeRequest, not_found
from tiered.engine.subscriptions.model import BEFORE_FIRST, Link, Subscription, Wake, is_reserved, wake_live
from tiered.engine.subscriptions.records import (
    SUBSCRIPTION_RECORD_TYPES,
    Acked,
    ExplicitLinkRemoved,
    GenerationFenced,
    LinksSkipped,
    SigningKeyAdded,
    StreamGone,
    StreamsLinked,
    SubscriptionCreated,
    SubscriptionDeleted,
    SubscriptionRecord,
    WakeClaimed,
    WakeEnded,
    WakeIssued,
    WebhookDelivered,
    WebhookFailed,
)
from tiered.engine.subscriptions.skips import moved_to
from tiered.engine.subscriptions.snapshot import decode_state, encode_state
from tiered.engine.subscriptions.streams_view import CombinedStreams, StateStreams, StreamsView, retained_of
from tiered.engine.subscriptions.wake_tokens import SigningKey, TokenClaims
from tiered.engine.subscriptions.webhook_schedule import backoff_ms

__all__ = [
    "BEFORE_FIRST",
    "CombinedStreams",
    "Link",
    "StateStreams",
    "StreamsView",
    "Subscription",
    "SubscriptionState",
    "Wake",
    "backoff_ms",
    "is_reserved",
    "moved_to",
    "retained_of",
    "wake_live",
]


class SubscriptionState:
    """All subscriptions and the webhook signing keys: a ``StateExtension`` of ``StreamState``."""

    name = "subscriptions"
    record_types: tuple[type, ...] = SUBSCRIPTION_RECORD_TYPES
    # Not journal state: the shell's bookkeeping (what changed since it looked, whom to tell).
    SOFT_STATE: ClassVar[tuple[str, ...]] = ("dirty", "listener")

    def __init__(self) -> None:
        self.subs: dict[str, Subscription] = {}
        self.by_path: dict[str, set[str]] = {}  # stream path -> ids of subscriptions linking it
        self.keys: list[SigningKey] = []
        self.next_incarnation = 1
        # Bookkeeping for the shell, never snapshotted: ids changed since it last looked,
        # and a callback to tell it that something changed.
        self.dirty: set[str] = set()
        self.listener: Callable[[], None] | None = None

    # ------------------------------------------------------------- lookups

    def get(self, sub_id: str) -> Subscription:
        sub = self.subs.get(sub_id)
        if sub is None:
            raise not_found()
        return sub

    @property
    def active_key(self) -> SigningKey | None:
        return keys.active_key(self)

    def jwks(self) -> dict[str, Any]:
        return keys.jwks(self)

    def first_pending(
        self,
        sub: Subscription,
        streams: StreamsView,
        acked: dict[str, int] | None = None,
        extra_links: dict[str, int] | None = None,
    ) -> str | None:
        return links.first_pending(sub, streams, acked, extra_links)

    def token_for(self, sub: Subscription, now_ms: int) -> str:
        return keys.token_for(self, sub, now_ms)

    def check_token(self, sub: Subscription, token: str | None, now_ms: int) -> TokenClaims:
        return keys.check_token(self, sub, token, now_ms)

    def due_work(self, sub_id: str, now_ms: int) -> tuple[str | None, int | None]:
        return wakes.due_work(self, sub_id, now_ms)

    # ------------------------------------------------------------- decide (see the rule modules)

    def decide_add_key(self, key: SigningKeyAdded) -> list[SubscriptionRecord]:
        return keys.decide_add_key(self, key)

    def decide_create(
        self, sub_id: str, cfg: SubscriptionConfig, base_url: str, streams: StreamsView, now_ms: int
    ) -> tuple[list[SubscriptionRecord], Subscription | None]:
        return definitions.decide_create(self, sub_id, cfg, base_url, streams, now_ms)

    def decide_delete(self, sub_id: str, now_ms: int) -> list[SubscriptionRecord]:
        return definitions.decide_delete(self, sub_id, now_ms)

    def decide_add_streams(
        self, sub_id: str, paths: Iterable[str], streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        return links.decide_add_streams(self, sub_id, paths, streams, now_ms)

    def decide_remove_stream(self, sub_id: str, path: str, now_ms: int) -> list[SubscriptionRecord]:
        return links.decide_remove_stream(self, sub_id, path, now_ms)

    def decide_claim(
        self, sub_id: str, worker: str, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        return claims.decide_claim(self, sub_id, worker, streams, now_ms)

    def decide_ack(
        self,
        sub_id: str,
        token: str | None,
        req: WakeRequest,
        streams: StreamsView,
        now_ms: int,
        *,
        pull_only: bool,
    ) -> tuple[list[SubscriptionRecord], bool]:
        return claims.decide_ack(self, sub_id, token, req, streams, now_ms, pull_only=pull_only)

    def decide_release(
        self, sub_id: str, token: str | None, req: WakeRequest, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        return claims.decide_release(self, sub_id, token, req, streams, now_ms)

    def decide_expire(
        self, sub_ids: Iterable[str], streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        return wakes.decide_expire(self, sub_ids, streams, now_ms)

    def decide_recover(self, streams: StreamsView, now_ms: int) -> list[SubscriptionRecord]:
        return wakes.decide_recover(self, streams, now_ms)

    def decide_delivered(
        self, sub_id: str, wake_id: str, done: bool, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        return webhook_schedule.decide_delivered(self, sub_id, wake_id, done, streams, now_ms)

    def decide_delivery_failed(
        self, sub_id: str, wake_id: str, error: str, jitter: float, now_ms: int
    ) -> list[SubscriptionRecord]:
        return webhook_schedule.decide_delivery_failed(self, sub_id, wake_id, error, jitter, now_ms)

    def decide_skips(
        self, sub_ids: Iterable[str], streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        return skips.decide_skips(self, sub_ids, streams, now_ms)

    def skips_on(self, paths: Iterable[str], streams: StreamsView, now_ms: int) -> list[SubscriptionRecord]:
        return skips.skips_on(self, paths, streams, now_ms)

    # ------------------------------------------------------------- stream events

    def on_stream_event(
        self, record: Any, before: Stream | None, state: StreamState
    ) -> list[SubscriptionRecord]:
        return stream_events.on_stream_event(self, record, before, state)

    def on_remote_stream(
        self, kind: str, path: str, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        return stream_events.on_remote_stream(self, kind, path, streams, now_ms)

    # ------------------------------------------------------------- apply

    def apply(self, record: Any) -> None:
        rule = _APPLY.get(type(record))
        if rule is not None:
            rule(self, record)
        else:
            sub_rule = _APPLY_TO_SUB.get(type(record))
            if sub_rule is None:
                raise TypeError(f"subscriptions cannot apply {type(record).__name__}")
            sub = self.subs.get(record.id)
            if sub is None:
                return  # a record of a subscription deleted since: nothing to change, nobody to tell
            self.dirty.add(sub.id)
            sub_rule(self, sub, record)
        if self.listener is not None:
            self.listener()

    # ------------------------------------------------------------- snapshots

    def snapshot(self) -> bytes:
        return encode_state(self)

    def restore(self, data: bytes) -> None:
        self.__init__()  # type: ignore[misc]
        decode_state(self, data)


# Records about the whole state (or that create a subscription).
_APPLY: dict[type, Callable[[SubscriptionState, Any], None]] = {
    SigningKeyAdded: keys.apply_key_added,
    StreamGone: links.apply_stream_gone,
    SubscriptionCreated: definitions.apply_created,
}
# Records about one subscription (by ``id``): ignored once it is gone.
_APPLY_TO_SUB: dict[type, Callable[[SubscriptionState, Subscription, Any], None]] = {
    SubscriptionDeleted: definitions.apply_deleted,
    StreamsLinked: links.apply_linked,
    ExplicitLinkRemoved: links.apply_unlinked,
    WakeIssued: wakes.apply_issued,
    WakeClaimed: claims.apply_claimed,
    LinksSkipped: skips.apply_skipped,
    Acked: claims.apply_acked,
    WakeEnded: wakes.apply_ended,
    GenerationFenced: wakes.apply_fenced,
    WebhookDelivered: webhook_schedule.apply_delivered,
    WebhookFailed: webhook_schedule.apply_failed,
}
