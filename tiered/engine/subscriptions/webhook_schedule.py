"""A webhook wake's delivery: accepted, or failed and retried on a journaled schedule.

webhook wakes are delivered by the shell (``delivery``); their lease starts
when the receiver accepts the delivery (2xx). A failing receiver keeps the
wake and gets retries (capped exponential backoff with jitter, the schedule
journaled so restarts honour it) instead of a new generation per lease. A
``{"done": true}`` answer acks the wake's snapshot and ends it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.engine.subscriptions.links import first_pending
from tiered.engine.subscriptions.model import Subscription
from tiered.engine.subscriptions.records import (
    Acked,
    SubscriptionRecord,
    WebhookDelivered,
    WebhookFailed,
)
from tiered.engine.subscriptions.skips import moved_to, skips
from tiered.engine.subscriptions.streams_view import StreamsView
from tiered.engine.subscriptions.wakes import issue

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState

RETRY_BASE_MS = 1_000
RETRY_MAX_MS = 60_000
RETRY_JITTER = 0.2


def backoff_ms(attempt: int, jitter: float) -> int:
    """Delay before retry ``attempt`` (1-based): 1 s doubling to 60 s, +-20% by ``jitter`` in [-1, 1]."""
    base = min(RETRY_BASE_MS * 2 ** min(attempt - 1, 30), RETRY_MAX_MS)
    return max(0, int(round(base * (1 + RETRY_JITTER * max(-1.0, min(1.0, jitter))))))


def decide_delivered(
    state: SubscriptionState, sub_id: str, wake_id: str, done: bool, streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    """The receiver answered 2xx; ``{"done": true}`` acks the wake's snapshot and ends it."""
    sub = state.subs.get(sub_id)
    if sub is None:
        return []
    w = sub.wake
    current = w is not None and w.wake_id == wake_id and not w.delivered
    if not current:
        # Superseded meanwhile (a callback finished it, a lease ran out): only the health changes.
        if sub.status != "active" or sub.attempts:
            return [WebhookDelivered(sub_id, sub.generation, wake_id, now_ms, now_ms + sub.lease_ttl_ms)]
        return []
    assert w is not None
    records: list[SubscriptionRecord] = [
        WebhookDelivered(sub_id, w.generation, wake_id, now_ms, now_ms + sub.lease_ttl_ms)
    ]
    if not done:
        return records
    acks = {}
    for path, tail in w.snapshot.items():
        link = sub.links.get(path)
        current_tail = streams.tail(path)
        if link is not None and current_tail is not None and link.acked <= tail <= current_tail:
            acks[path] = tail
    records.append(
        Acked(
            sub_id,
            w.generation,
            wake_id,
            now_ms,
            tuple(sorted(acks.items())),
            True,
            now_ms + sub.lease_ttl_ms,
        )
    )
    skipped = skips(sub, streams, now_ms, acks)
    records += skipped
    trigger = first_pending(sub, streams, acked={**acks, **moved_to(skipped)})
    if trigger is not None:
        records.append(issue(sub, streams, now_ms, trigger))
    return records


def decide_delivery_failed(
    state: SubscriptionState, sub_id: str, wake_id: str, error: str, jitter: float, now_ms: int
) -> list[SubscriptionRecord]:
    """Schedule the next attempt (capped exponential backoff; ``jitter`` in [-1, 1] from the shell)."""
    sub = state.subs.get(sub_id)
    w = sub.wake if sub is not None else None
    if sub is None or w is None or w.wake_id != wake_id or w.delivered:
        return []
    attempts = sub.attempts + 1
    return [
        WebhookFailed(
            sub_id,
            w.generation,
            wake_id,
            now_ms,
            attempts,
            now_ms + backoff_ms(attempts, jitter),
            error[:500],
        )
    ]


# ------------------------------------------------------------------ apply


def apply_delivered(_: SubscriptionState, sub: Subscription, record: WebhookDelivered) -> None:
    sub.status, sub.attempts, sub.next_attempt_ms, sub.last_error = "active", 0, None, None
    w = sub.wake
    if w is not None and w.wake_id == record.wake_id:
        w.delivered = True
        w.lease_expires_ms = record.lease_expires_ms


def apply_failed(_: SubscriptionState, sub: Subscription, record: WebhookFailed) -> None:
    w = sub.wake
    if w is not None and w.wake_id == record.wake_id:
        sub.status = "failed"
        sub.attempts = record.attempts
        sub.next_attempt_ms = record.next_attempt_ms
        sub.last_error = record.error
