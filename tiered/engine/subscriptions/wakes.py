"""Wakes: when a subscription with pending work is woken, and how a wake ends without being done.

``generation`` counts wakes; at most one wake is recorded at a time. A new
wake supersedes (fences) the old one, and carries the tails of every link
when issued (its snapshot). A wake whose lease ran out is treated as gone at
once; the shell journals its end (``decide_expire``), and the next wake if
work is pending. After a restart every outstanding wake is fenced, since its
tokens may be anywhere (``decide_recover``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tiered.engine.subscriptions.config import PULL_WAKE, WEBHOOK
from tiered.engine.subscriptions.links import first_pending
from tiered.engine.subscriptions.model import Subscription, Wake, wake_live
from tiered.engine.subscriptions.records import (
    GenerationFenced,
    SubscriptionRecord,
    WakeEnded,
    WakeIssued,
)
from tiered.engine.subscriptions.skips import skips
from tiered.engine.subscriptions.streams_view import StreamsView

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState


def issue(
    sub: Subscription,
    streams: StreamsView,
    now_ms: int,
    trigger: str,
    extra_links: dict[str, int] | None = None,
) -> WakeIssued:
    """The next wake of ``sub``, triggered by the stream ``trigger``."""
    generation = sub.generation + 1
    digest = hashlib.sha256(f"{sub.id}\0{sub.incarnation}\0{generation}\0{now_ms}".encode()).hexdigest()
    paths = set(sub.links) | set(extra_links or ())
    snapshot = []
    for path in sorted(paths):
        tail = streams.tail(path)
        if tail is not None:
            snapshot.append((path, tail))
    return WakeIssued(sub.id, generation, "w_" + digest[:24], now_ms, trigger, tuple(snapshot))


def wake_if_pending(sub: Subscription, streams: StreamsView, now_ms: int) -> list[SubscriptionRecord] | None:
    """Links retention passed, moved, then a new wake, if ``sub`` has pending work (None if it has none)."""
    trigger = first_pending(sub, streams)
    if trigger is None:
        return None
    return [*skips(sub, streams, now_ms), issue(sub, streams, now_ms, trigger)]


def wake_idle(
    state: SubscriptionState,
    ids: list[str],
    streams: StreamsView,
    now_ms: int,
    trigger: str,
    new_links: dict[str, dict[str, int]],
) -> list[SubscriptionRecord]:
    """Wake the subscriptions of ``ids`` that have no live wake and (with ``new_links``) pending work."""
    records: list[SubscriptionRecord] = []
    for sub_id in ids:
        sub = state.subs.get(sub_id)
        if sub is None or wake_live(sub, now_ms):
            continue
        extra = new_links.get(sub_id)
        if first_pending(sub, streams, extra_links=extra) is not None:
            records += skips(sub, streams, now_ms)
            records.append(issue(sub, streams, now_ms, trigger, extra))
    return records


def decide_expire(
    state: SubscriptionState, sub_ids: Iterable[str], streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    """End wakes whose lease ran out; wake again where work is pending."""
    records: list[SubscriptionRecord] = []
    for sub_id in sorted(set(sub_ids)):
        sub = state.subs.get(sub_id)
        if sub is None or sub.wake is None or wake_live(sub, now_ms):
            continue
        woken = wake_if_pending(sub, streams, now_ms)
        if woken is not None:
            records += woken
        else:
            w = sub.wake
            records.append(WakeEnded(sub_id, w.generation, w.wake_id, now_ms, "lease-expired"))
    return records


def decide_recover(state: SubscriptionState, streams: StreamsView, now_ms: int) -> list[SubscriptionRecord]:
    """After a restart: fence every wake that was outstanding (its tokens may be anywhere), wake pending work."""
    records: list[SubscriptionRecord] = []
    for sub_id in sorted(state.subs):
        sub = state.subs[sub_id]
        woken = wake_if_pending(sub, streams, now_ms)
        if woken is not None:
            records += woken
        elif sub.wake is not None:
            records.append(GenerationFenced(sub_id, sub.generation + 1, now_ms, "restart"))
    return records


def due_work(state: SubscriptionState, sub_id: str, now_ms: int) -> tuple[str | None, int | None]:
    """What the shell should do for a subscription now, and when to look again.

    ``("deliver", _)``: POST the current webhook wake. ``("wake-event", _)``:
    write the pull-wake event (the shell remembers which it wrote).
    The deadline is the lease end or the next retry time.
    """
    sub = state.subs.get(sub_id)
    if sub is None or sub.wake is None:
        return None, None
    w = sub.wake
    if sub.type == WEBHOOK and not w.delivered:
        if sub.next_attempt_ms is not None and sub.next_attempt_ms > now_ms:
            return None, sub.next_attempt_ms
        return "deliver", None
    if sub.type == PULL_WAKE and w.holder is None:
        return "wake-event", None
    return None, w.lease_expires_ms


# ------------------------------------------------------------------ apply


def apply_issued(_: SubscriptionState, sub: Subscription, record: WakeIssued) -> None:
    sub.generation = max(sub.generation, record.generation)
    sub.wake = Wake(record.wake_id, record.generation, record.ts_ms, record.stream, dict(record.snapshot))


def apply_ended(_: SubscriptionState, sub: Subscription, record: WakeEnded) -> None:
    if sub.wake is not None and sub.wake.wake_id == record.wake_id:
        sub.wake = None


def apply_fenced(_: SubscriptionState, sub: Subscription, record: GenerationFenced) -> None:
    sub.generation = max(sub.generation, record.generation)
    sub.wake = None
