"""The subscription state's snapshot form (msgpack), kept apart from the rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from tiered.core.globs import compile_glob
from tiered.engine.subscriptions.model import Link, Subscription, Wake
from tiered.engine.subscriptions.wake_tokens import SigningKey

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState

SNAPSHOT_VERSION = 1


class _LinkSnap(msgspec.Struct, array_like=True):
    path: str
    explicit: bool
    glob: bool
    acked: int
    # [start, end) retention released before it was acked, until an ack reaches end.
    # Trailing with a default: snapshots written before it decode without it.
    skipped: tuple[int, int] | None = None


class _WakeSnap(msgspec.Struct, array_like=True):
    wake_id: str
    generation: int
    issued_ms: int
    stream: str
    snapshot: list[tuple[str, int]]
    holder: str | None
    lease_expires_ms: int | None
    delivered: bool


class _SubSnap(msgspec.Struct, array_like=True):
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
    links: list[_LinkSnap]
    generation: int
    wake: _WakeSnap | None
    status: str
    attempts: int
    next_attempt_ms: int | None
    last_error: str | None


class _KeySnap(msgspec.Struct, array_like=True):
    kid: str
    public_key: bytes
    private_key: bytes
    token_secret: bytes
    created_ms: int


class _StateSnap(msgspec.Struct, array_like=True):
    version: int
    next_incarnation: int
    keys: list[_KeySnap]
    subscriptions: list[_SubSnap]


SNAPSHOT_VERSION = 1


def encode_state(state: SubscriptionState) -> bytes:
    subs = []
    for s in state.subs.values():
        w = s.wake
        wake = None
        if w is not None:
            wake = _WakeSnap(
                w.wake_id,
                w.generation,
                w.issued_ms,
                w.stream,
                list(w.snapshot.items()),
                w.holder,
                w.lease_expires_ms,
                w.delivered,
            )
        subs.append(
            _SubSnap(
                s.id,
                s.incarnation,
                s.type,
                s.pattern,
                list(s.streams),
                s.webhook_url,
                s.wake_stream,
                s.lease_ttl_ms,
                s.description,
                s.created_ms,
                s.config_hash,
                s.base_url,
                [
                    _LinkSnap(link.path, link.explicit, link.glob, link.acked, link.skipped)
                    for link in s.links.values()
                ],
                s.generation,
                wake,
                s.status,
                s.attempts,
                s.next_attempt_ms,
                s.last_error,
            )
        )
    keys = [_KeySnap(k.kid, k.public_key, k.private_key, k.token_secret, k.created_ms) for k in state.keys]
    return msgspec.msgpack.encode(_StateSnap(SNAPSHOT_VERSION, state.next_incarnation, keys, subs))


def decode_state(state: SubscriptionState, data: bytes) -> None:
    """Load a snapshot into an empty ``state``."""
    snap = msgspec.msgpack.decode(data, type=_StateSnap)
    if snap.version != SNAPSHOT_VERSION:
        raise ValueError(f"subscriptions snapshot version {snap.version} is not {SNAPSHOT_VERSION}")
    state.next_incarnation = snap.next_incarnation
    state.keys = [
        SigningKey(k.kid, k.public_key, k.private_key, k.token_secret, k.created_ms) for k in snap.keys
    ]
    for n in snap.subscriptions:
        wake = None
        if n.wake is not None:
            x = n.wake
            wake = Wake(
                x.wake_id,
                x.generation,
                x.issued_ms,
                x.stream,
                dict(x.snapshot),
                x.holder,
                x.lease_expires_ms,
                x.delivered,
            )
        sub = Subscription(
            id=n.id,
            incarnation=n.incarnation,
            type=n.type,
            pattern=n.pattern,
            streams=tuple(n.streams),
            webhook_url=n.webhook_url,
            wake_stream=n.wake_stream,
            lease_ttl_ms=n.lease_ttl_ms,
            description=n.description,
            created_ms=n.created_ms,
            config_hash=n.config_hash,
            base_url=n.base_url,
            generation=n.generation,
            wake=wake,
            status=n.status,
            attempts=n.attempts,
            next_attempt_ms=n.next_attempt_ms,
            last_error=n.last_error,
            matcher=compile_glob(n.pattern) if n.pattern is not None else None,
        )
        state.subs[sub.id] = sub
        for ln in n.links:
            sub.links[ln.path] = Link(ln.path, ln.explicit, ln.glob, ln.acked, ln.skipped)
            state.by_path.setdefault(ln.path, set()).add(sub.id)
        state.dirty.add(sub.id)
