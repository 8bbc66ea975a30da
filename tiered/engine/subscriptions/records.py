"""Journal records of the subscription state machine (``tiered.engine.subscriptions``).

They live in the same journal as stream records and join ``records.Record``:
msgpack arrays whose first element is a versioned tag (``sub.<what>.vN``).
This module depends on msgspec only, so ``records`` can import it without a
cycle. Every value ``apply`` needs (times, generations, wake ids, lease
deadlines, acked offsets) is decided up front and carried in the record.

None of these records has a ``uid`` field: the stream service reads ``uid``
off records to find the stream a record touches.
"""

from __future__ import annotations

import msgspec


class _SubRecord(msgspec.Struct, array_like=True, frozen=True, tag_field="t"):
    pass


class LinkSpec(msgspec.Struct, array_like=True, frozen=True):
    """A stream link as a record carries it."""

    path: str
    link_type: str  # "explicit" or "glob"
    acked: int  # last processed offset; -1: nothing processed yet (before the stream's first byte)


class SigningKeyAdded(_SubRecord, frozen=True, tag="sub.key.v1"):
    """The webhook signing key (Ed25519, raw 32-byte keys) and the callback-token HMAC secret.

    Kept in the journal so keys survive restarts with the same durability and
    snapshots as everything else; the newest key is the active one.
    """

    kid: str
    public_key: bytes
    private_key: bytes
    token_secret: bytes
    ts_ms: int


class SubscriptionCreated(_SubRecord, frozen=True, tag="sub.create.v1"):
    id: str
    incarnation: int  # unique per creation: tokens of a deleted namesake never validate
    ts_ms: int
    type: str  # "webhook" or "pull-wake"
    pattern: str | None
    streams: tuple[str, ...]  # normalized explicit streams (sorted, unique)
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None
    config_hash: str
    base_url: str  # where callback URLs in webhook bodies point
    links: tuple[LinkSpec, ...]  # initial links: explicit streams and the glob backfill


class SubscriptionDeleted(_SubRecord, frozen=True, tag="sub.delete.v1"):
    id: str
    ts_ms: int


class StreamsLinked(_SubRecord, frozen=True, tag="sub.link.v1"):
    """Links added (explicit, or glob for a newly created stream). Existing links keep their offset."""

    id: str
    ts_ms: int
    links: tuple[LinkSpec, ...]


class ExplicitLinkRemoved(_SubRecord, frozen=True, tag="sub.unlink.v1"):
    id: str
    path: str
    ts_ms: int


class StreamGone(_SubRecord, frozen=True, tag="sub.stream-gone.v1"):
    """A stream was deleted or expired: glob links go, explicit links restart before the first byte."""

    path: str
    ts_ms: int


class LinkSkip(msgspec.Struct, array_like=True, frozen=True):
    """One link whose unprocessed bytes ``[start, end)`` retention released: its acked offset moves to ``end``."""

    path: str
    acked: int  # the link's acked offset when decided (-1: nothing acked yet); applied only if still so
    start: int  # the first released byte it had not processed (its acked offset, or the stream's first byte)
    end: int  # the stream's retained offset: the new acked offset


class LinksSkipped(_SubRecord, frozen=True, tag="sub.skip.v1"):
    """Retention passed links' acked offsets: each moves to its stream's retained offset, the range reported."""

    id: str
    ts_ms: int
    skips: tuple[LinkSkip, ...]


class WakeIssued(_SubRecord, frozen=True, tag="sub.wake.v1"):
    """A new wake (generation). It supersedes, and so fences, any wake still recorded."""

    id: str
    generation: int
    wake_id: str
    ts_ms: int
    stream: str  # the stream that triggered it
    snapshot: tuple[tuple[str, int], ...]  # (path, tail) of every link when issued


class WakeClaimed(_SubRecord, frozen=True, tag="sub.claim.v1"):
    id: str
    generation: int
    wake_id: str
    worker: str
    ts_ms: int
    lease_expires_ms: int


class Acked(_SubRecord, frozen=True, tag="sub.ack.v1"):
    """A callback or ack: offsets applied; ``done`` ends the wake, else the lease is extended."""

    id: str
    generation: int
    wake_id: str
    ts_ms: int
    acks: tuple[tuple[str, int], ...]
    done: bool
    lease_expires_ms: int


class WakeEnded(_SubRecord, frozen=True, tag="sub.wake-end.v1"):
    """A wake ended without being done: ``released`` by its worker or its lease ``expired``."""

    id: str
    generation: int
    wake_id: str
    ts_ms: int
    reason: str


class GenerationFenced(_SubRecord, frozen=True, tag="sub.fence.v1"):
    """The generation moves on with no new wake (after a restart): every outstanding token is stale."""

    id: str
    generation: int
    ts_ms: int
    reason: str


class WebhookDelivered(_SubRecord, frozen=True, tag="sub.delivered.v1"):
    """The receiver accepted the wake (2xx); its lease runs from here."""

    id: str
    generation: int
    wake_id: str
    ts_ms: int
    lease_expires_ms: int


class WebhookFailed(_SubRecord, frozen=True, tag="sub.delivery-failed.v1"):
    """A delivery attempt failed; the retry schedule is journaled so restarts honour it."""

    id: str
    generation: int
    wake_id: str
    ts_ms: int
    attempts: int
    next_attempt_ms: int
    error: str


SubscriptionRecord = (
    SigningKeyAdded
    | SubscriptionCreated
    | SubscriptionDeleted
    | StreamsLinked
    | ExplicitLinkRemoved
    | StreamGone
    | LinksSkipped
    | WakeIssued
    | WakeClaimed
    | Acked
    | WakeEnded
    | GenerationFenced
    | WebhookDelivered
    | WebhookFailed
)

SUBSCRIPTION_RECORD_TYPES: tuple[type, ...] = (
    SigningKeyAdded,
    SubscriptionCreated,
    SubscriptionDeleted,
    StreamsLinked,
    ExplicitLinkRemoved,
    StreamGone,
    LinksSkipped,
    WakeIssued,
    WakeClaimed,
    Acked,
    WakeEnded,
    GenerationFenced,
    WebhookDelivered,
    WebhookFailed,
)
