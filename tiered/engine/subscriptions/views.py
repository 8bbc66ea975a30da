"""JSON views of subscriptions: what GET, PUT, claims and webhook bodies show (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tiered.core.ids import format_offset
from tiered.engine.subscriptions.config import WEBHOOK
from tiered.engine.subscriptions.model import Link, Subscription
from tiered.engine.subscriptions.state import SubscriptionState
from tiered.engine.subscriptions.streams_view import StreamsView


def iso_ms(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ts_ms % 1000:03d}Z"


def format_acked(acked: int) -> str:
    return "-1" if acked < 0 else format_offset(acked)


def with_skipped(entry: dict[str, Any], link: Link) -> dict[str, Any]:
    """``entry`` with the link's ``skipped`` range (our extension of the protocol's stream entries), if any:
    bytes retention released before the worker processed them; ``acked_offset`` was moved past them."""
    if link.skipped is not None:
        start, end = link.skipped
        entry["skipped"] = {"from": format_offset(start), "to": format_offset(end), "bytes": end - start}
    return entry


def describe(subs: SubscriptionState, sub: Subscription, jwks_url: str) -> dict[str, Any]:
    """The subscription as GET (and PUT) return it."""
    webhook: dict[str, Any] | None = None
    if sub.type == WEBHOOK:
        webhook = {"url": sub.webhook_url}
        key = subs.active_key
        if key is not None:
            webhook["signing"] = {"alg": "ed25519", "kid": key.kid, "jwks_url": jwks_url}
    return {
        "id": sub.id,
        "subscription_id": sub.id,
        "type": sub.type,
        "pattern": sub.pattern,
        "streams": [
            with_skipped(
                {
                    "path": p,
                    "link_type": sub.links[p].link_type,
                    "acked_offset": format_acked(sub.links[p].acked),
                },
                sub.links[p],
            )
            for p in sorted(sub.links)
        ],
        "webhook": webhook,
        "wake_stream": sub.wake_stream,
        "lease_ttl_ms": sub.lease_ttl_ms,
        "created_at": iso_ms(sub.created_ms),
        "status": sub.status,
        "description": sub.description,
    }


def webhook_body(subs: SubscriptionState, sub: Subscription, callback_url: str, token: str) -> dict[str, Any]:
    """The wake notification: the links in the wake's snapshot, at the snapshot's tails."""
    w = sub.wake
    assert w is not None
    streams = [_info(sub.links[p], tail) for p, tail in sorted(w.snapshot.items()) if p in sub.links]
    return {
        "subscription_id": sub.id,
        "wake_id": w.wake_id,
        "generation": w.generation,
        "streams": streams,
        "callback_url": callback_url,
        "callback_token": token,
    }


def stream_infos(subs: SubscriptionState, sub: Subscription, streams: StreamsView) -> list[dict[str, Any]]:
    """Each link with its current tail (claim responses)."""
    out = []
    for path in sorted(sub.links):
        link = sub.links[path]
        tail = streams.tail(path) or 0
        out.append(_info(link, tail))
    return out


def _info(link: Link, tail: int) -> dict[str, Any]:
    return with_skipped(
        {
            "path": link.path,
            "link_type": link.link_type,
            "acked_offset": format_acked(link.acked),
            "tail_offset": format_offset(tail),
            "has_pending": tail > max(link.acked, 0),
        },
        link,
    )
