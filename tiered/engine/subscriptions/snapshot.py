"""The subscription state's snapshot form (msgpack): its own types, as they are.

Version 2 holds the ``SubscriptionState``'s durable data: the next
incarnation, the signing keys and the subscriptions, each the model's
Struct (``model``: links and wake included). What a restore rebuilds rather
than reads: the path index (``by_path``, from the links) and the compiled
patterns. Version 1 (servers up to e092d99) listed links and wake snapshots
as arrays; it is still read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from tiered.engine.subscriptions.model import Link, Subscription, Wake
from tiered.engine.subscriptions.wake_tokens import SigningKey

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState

SNAPSHOT_VERSION = 2


class SubscriptionsSnap(msgspec.Struct, array_like=True):
    version: int
    next_incarnation: int
    keys: list[SigningKey]
    subscriptions: list[Subscription]


class _Version(msgspec.Struct, array_like=True):
    version: int


def encode_state(state: SubscriptionState) -> bytes:
    return msgspec.msgpack.encode(
        SubscriptionsSnap(SNAPSHOT_VERSION, state.next_incarnation, state.keys, list(state.subs.values()))
    )


def decode_state(state: SubscriptionState, data: bytes) -> None:
    """Load a snapshot into an empty ``state``."""
    version = msgspec.msgpack.decode(data, type=_Version).version
    if version == SNAPSHOT_VERSION:
        snap = msgspec.msgpack.decode(data, type=SubscriptionsSnap)
    elif version == 1:
        snap = _from_version_1(msgspec.msgpack.decode(data, type=_StateV1))
    else:
        raise ValueError(f"subscriptions snapshot version {version} is not one of 1, {SNAPSHOT_VERSION}")
    state.next_incarnation = snap.next_incarnation
    state.keys = snap.keys
    for sub in snap.subscriptions:
        state.subs[sub.id] = sub
        for path in sub.links:
            state.by_path.setdefault(path, set()).add(sub.id)
        state.dirty.add(sub.id)


# ------------------------------------------------------------------ version 1 (read only)


class _WakeV1(msgspec.Struct, array_like=True):
    wake_id: str
    generation: int
    issued_ms: int
    stream: str
    snapshot: list[tuple[str, int]]
    holder: str | None
    lease_expires_ms: int | None
    delivered: bool


class _SubV1(msgspec.Struct, array_like=True):
    id: str
    incarnation: int
    type: str
    pattern: str | None
    streams: list[str]
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None
    created_ms: int
    config_hash: str
    base_url: str
    links: list[Link]
    generation: int
    wake: _WakeV1 | None
    status: str
    attempts: int
    next_attempt_ms: int | None
    last_error: str | None


class _StateV1(msgspec.Struct, array_like=True):
    version: int
    next_incarnation: int
    keys: list[SigningKey]
    subscriptions: list[_SubV1]


def _from_version_1(old: _StateV1) -> SubscriptionsSnap:
    subs = []
    for n in old.subscriptions:
        x = n.wake
        wake = None
        if x is not None:
            snapshot = dict(x.snapshot)
            wake = Wake(
                x.wake_id,
                x.generation,
                x.issued_ms,
                x.stream,
                snapshot,
                x.holder,
                x.lease_expires_ms,
                x.delivered,
            )
        subs.append(
            Subscription(
                n.id,
                n.incarnation,
                n.type,
                n.pattern,
                tuple(n.streams),
                n.webhook_url,
                n.wake_stream,
                n.lease_ttl_ms,
                n.description,
                n.created_ms,
                n.config_hash,
                n.base_url,
                {link.path: link for link in n.links},
                n.generation,
                wake,
                n.status,
                n.attempts,
                n.next_attempt_ms,
                n.last_error,
            )
        )
    return SubscriptionsSnap(SNAPSHOT_VERSION, old.next_incarnation, old.keys, subs)
