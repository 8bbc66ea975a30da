"""Claims, acks and releases: a worker's lease on a wake, and the offsets it reports processed.

pull-wake wakes wait (unleased) for a claim; a claim starts the lease. A
webhook's receiver calls back instead, with the token of the delivery.
Callback, ack and release must present a token for, and the body must name,
the current generation and wake id (else ``FENCED``). An ack moves acked
offsets forward (never back, never past the tail) and either extends the
lease or, when done, ends the wake and wakes again if work is pending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.subscriptions import keys
from tiered.engine.subscriptions.config import PULL_WAKE, WakeRequest, fenced, invalid, invalid_offset
from tiered.engine.subscriptions.links import first_pending
from tiered.engine.subscriptions.model import Subscription, Wake, wake_live
from tiered.engine.subscriptions.records import (
    Acked,
    SubscriptionRecord,
    WakeClaimed,
    WakeEnded,
)
from tiered.engine.subscriptions.skips import moved_to, skips
from tiered.engine.subscriptions.streams_view import StreamsView
from tiered.engine.subscriptions.wakes import issue, wake_if_pending

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState


def decide_claim(
    state: SubscriptionState, sub_id: str, worker: str, streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    sub = state.get(sub_id)
    if sub.type != PULL_WAKE:
        raise invalid("Subscription is not pull-wake")
    live = wake_live(sub, now_ms)
    w = sub.wake
    if live and w is not None and w.holder is not None:
        raise TieredError(
            ErrorCode.ALREADY_CLAIMED,
            "The wake is already claimed",
            current_holder=w.holder,
            generation=w.generation,
        )
    trigger = first_pending(sub, streams)
    if trigger is None:
        raise TieredError(ErrorCode.NO_PENDING_WORK, "Subscription has no pending work")
    # Data it was woken for may have been released since: the claimer reads from what is retained, told so.
    records: list[SubscriptionRecord] = skips(sub, streams, now_ms)
    if live and w is not None:
        generation, wake_id = w.generation, w.wake_id
    else:
        issued = issue(sub, streams, now_ms, trigger)
        records.append(issued)
        generation, wake_id = issued.generation, issued.wake_id
    records.append(WakeClaimed(sub_id, generation, wake_id, worker, now_ms, now_ms + sub.lease_ttl_ms))
    return records


def check_wake(
    state: SubscriptionState, sub: Subscription, token: str | None, req: WakeRequest, now_ms: int
) -> Wake:
    """The wake a callback, ack or release names, if its token and body name the current one (else FENCED)."""
    claims = keys.check_token(state, sub, token, now_ms)
    w = sub.wake
    if (
        w is None
        or not wake_live(sub, now_ms)
        or claims.generation != sub.generation
        or req.generation != sub.generation
        or claims.wake_id != w.wake_id
        or req.wake_id != w.wake_id
    ):
        raise fenced()
    return w


def checked_acks(sub: Subscription, req: WakeRequest, streams: StreamsView) -> dict[str, int]:
    """The acks of ``req`` that move a link (one inside a skipped range changes nothing), or the refusal."""
    acks: dict[str, int] = {}
    for path, offset in req.acks:
        link = sub.links.get(path)
        if link is None:
            raise invalid_offset("Ack references an unknown subscription stream")
        if offset < link.acked:
            gap = link.skipped
            if gap is not None and offset >= gap[0]:
                continue  # processed before retention moved the cursor past it: nothing to apply
            raise invalid_offset("Ack offset regresses the committed cursor")
        if offset > (streams.tail(path) or 0):
            raise invalid_offset("Ack offset is beyond stream tail")
        acks[path] = offset
    return acks


def decide_ack(
    state: SubscriptionState,
    sub_id: str,
    token: str | None,
    req: WakeRequest,
    streams: StreamsView,
    now_ms: int,
    *,
    pull_only: bool,
) -> tuple[list[SubscriptionRecord], bool]:
    """A webhook callback (``pull_only=False``) or a pull-wake ack. Returns (records, next_wake)."""
    sub = state.get(sub_id)
    if pull_only and sub.type != PULL_WAKE:
        raise invalid("Subscription is not pull-wake")
    w = check_wake(state, sub, token, req, now_ms)
    acks = checked_acks(sub, req, streams)
    records: list[SubscriptionRecord] = [
        Acked(
            sub_id,
            w.generation,
            w.wake_id,
            now_ms,
            tuple(acks.items()),
            req.done,
            now_ms + sub.lease_ttl_ms,
        )
    ]
    skipped = skips(sub, streams, now_ms, acks)
    records += skipped
    if not req.done:
        return records, False
    trigger = first_pending(sub, streams, acked={**acks, **moved_to(skipped)})
    if trigger is None:
        return records, False
    records.append(issue(sub, streams, now_ms, trigger))
    return records, True


def decide_release(
    state: SubscriptionState,
    sub_id: str,
    token: str | None,
    req: WakeRequest,
    streams: StreamsView,
    now_ms: int,
) -> list[SubscriptionRecord]:
    sub = state.get(sub_id)
    if sub.type != PULL_WAKE:
        raise invalid("Subscription is not pull-wake")
    w = check_wake(state, sub, token, req, now_ms)
    records: list[SubscriptionRecord] = [WakeEnded(sub_id, w.generation, w.wake_id, now_ms, "released")]
    return records + (wake_if_pending(sub, streams, now_ms) or [])


# ------------------------------------------------------------------ apply


def apply_claimed(_: SubscriptionState, sub: Subscription, record: WakeClaimed) -> None:
    w = sub.wake
    if w is not None and w.wake_id == record.wake_id:
        w.holder = record.worker
        w.lease_expires_ms = record.lease_expires_ms


def apply_acked(_: SubscriptionState, sub: Subscription, record: Acked) -> None:
    w = sub.wake  # before the acks: the wake the record names
    for path, offset in record.acks:
        link = sub.links.get(path)
        if link is not None:
            link.acked = max(link.acked, offset)
            if link.skipped is not None and offset >= link.skipped[1]:
                link.skipped = None  # processed from the gap on: nothing left to report
    if w is not None and w.wake_id == record.wake_id:
        if record.done:
            sub.wake = None
        else:
            w.lease_expires_ms = record.lease_expires_ms
