"""Creating and deleting subscriptions: what a PUT and a DELETE decide, and what their records do.

A creation carries its initial links: the explicit streams at their current
tails, and a pattern's backfill (the streams it selects now) at their
current tails too: creation does not replay history. Re-confirming an
identical configuration changes nothing; a different one is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.core.errors import ErrorCode, TieredError
from tiered.core.globs import compile_glob
from tiered.engine.subscriptions import links
from tiered.engine.subscriptions.config import SubscriptionConfig
from tiered.engine.subscriptions.model import BEFORE_FIRST, Subscription
from tiered.engine.subscriptions.records import (
    LinkSpec,
    SubscriptionCreated,
    SubscriptionDeleted,
    SubscriptionRecord,
)
from tiered.engine.subscriptions.streams_view import StreamsView

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState


def decide_create(
    state: SubscriptionState,
    sub_id: str,
    cfg: SubscriptionConfig,
    base_url: str,
    streams: StreamsView,
    now_ms: int,
) -> tuple[list[SubscriptionRecord], Subscription | None]:
    """Records creating a subscription, or ``([], existing)`` when re-confirmed identically."""
    config_hash = cfg.hash()
    existing = state.subs.get(sub_id)
    if existing is not None:
        if existing.config_hash != config_hash:
            raise TieredError(
                ErrorCode.SUBSCRIPTION_ALREADY_EXISTS,
                "Subscription already exists with different configuration",
            )
        return [], existing
    specs: list[LinkSpec] = []
    for path in cfg.streams:
        tail = streams.tail(path)
        specs.append(LinkSpec(path, "explicit", BEFORE_FIRST if tail is None else tail))
    if cfg.pattern is not None:
        matcher = compile_glob(cfg.pattern)
        for path in sorted(streams.paths()):
            if path != cfg.wake_stream and matcher.fullmatch("/" + path):
                tail = streams.tail(path)
                # Backfill at the current tail: creation does not replay history.
                specs.append(LinkSpec(path, "glob", BEFORE_FIRST if tail is None else tail))
    return [
        SubscriptionCreated(
            id=sub_id,
            incarnation=state.next_incarnation,
            ts_ms=now_ms,
            type=cfg.type,
            pattern=cfg.pattern,
            streams=cfg.streams,
            webhook_url=cfg.webhook_url,
            wake_stream=cfg.wake_stream,
            lease_ttl_ms=cfg.lease_ttl_ms,
            description=cfg.description,
            config_hash=config_hash,
            base_url=base_url,
            links=tuple(specs),
        )
    ], None


def decide_delete(state: SubscriptionState, sub_id: str, now_ms: int) -> list[SubscriptionRecord]:
    return [SubscriptionDeleted(sub_id, now_ms)] if sub_id in state.subs else []


def apply_created(state: SubscriptionState, r: SubscriptionCreated) -> None:
    old = state.subs.get(r.id)
    if old is not None:
        drop(state, old)
    sub = Subscription(
        id=r.id,
        incarnation=r.incarnation,
        type=r.type,
        pattern=r.pattern,
        streams=tuple(r.streams),
        webhook_url=r.webhook_url,
        wake_stream=r.wake_stream,
        lease_ttl_ms=r.lease_ttl_ms,
        description=r.description,
        created_ms=r.ts_ms,
        config_hash=r.config_hash,
        base_url=r.base_url,
    )
    state.subs[r.id] = sub
    state.next_incarnation = max(state.next_incarnation, r.incarnation + 1)
    for spec in r.links:
        links.link(state, sub, spec)
    state.dirty.add(r.id)


def apply_deleted(state: SubscriptionState, sub: Subscription, _: SubscriptionDeleted) -> None:
    drop(state, sub)


def drop(state: SubscriptionState, sub: Subscription) -> None:
    for path in list(sub.links):
        links.unlink(state, sub, path)
    del state.subs[sub.id]
    state.dirty.add(sub.id)
