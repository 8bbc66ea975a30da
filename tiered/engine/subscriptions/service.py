"""The subscriptions shell: requests decided by ``SubscriptionState`` and committed, with no HTTP in it.

Each operation is parse (done by the routes) -> decide (pure) -> commit (no
``await`` between deciding and committing, so a decision never acts on stale
state) -> wait for durability -> a view to answer with. Stream events reach
the state through ``StreamEvents``, a commit observer: its follow-up records
(links for new streams, wakes after appends) join the batch right after the
stream record that caused them. It also reports, once durable, every link
whose acked offset retention moved (``LinksSkipped``): a warning naming the
subscription, stream and range, and the ``skipped_bytes`` / ``skipped_ranges``
counters ``/metrics`` exposes.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from tiered.core.clock import Clock
from tiered.core.ids import format_offset
from tiered.engine.journal.committer import Committer
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import RetentionAdvanced
from tiered.engine.streams.state import StreamState
from tiered.engine.streams.visibility import Visibility
from tiered.engine.subscriptions import views
from tiered.engine.subscriptions.config import WEBHOOK, SubscriptionConfig, WakeRequest
from tiered.engine.subscriptions.records import LinksSkipped, SigningKeyAdded, WakeClaimed
from tiered.engine.subscriptions.state import SubscriptionState
from tiered.engine.subscriptions.streams_view import CombinedStreams, StateStreams, StreamsView
from tiered.engine.subscriptions.wake_tokens import TOKEN_TTL_S, SigningKey, TokenClaims, key_id, mint_token

log = logging.getLogger(__name__)


def new_signing_key(ts_ms: int) -> SigningKeyAdded:
    """A fresh Ed25519 signing key and callback-token secret, as the record that persists them."""
    private = Ed25519PrivateKey.generate()
    private_raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public_raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return SigningKeyAdded(key_id(public_raw), public_raw, private_raw, secrets.token_bytes(32), ts_ms)


class LinkSkips:
    """Acked offsets retention moved past unacked data: one warning per range, and the lifetime counters.

    Shared by the observer that reports each durable ``LinksSkipped`` and the
    service that shows the counters (``/metrics``), as journaled by this process.
    """

    def __init__(self) -> None:
        self.skipped_bytes = 0
        self.skipped_ranges = 0

    def report(self, record: LinksSkipped) -> None:
        for sk in record.skips:
            self.skipped_bytes += sk.end - sk.start
            self.skipped_ranges += 1
            log.warning(
                "subscription %r: retention passed its acked offset on stream %r: moved from %s to %s, %d bytes skipped",
                record.id,
                sk.path,
                format_offset(sk.start),
                format_offset(sk.end),
                sk.end - sk.start,
            )


class StreamEvents:
    """Commit observer: stream records become subscription follow-ups (see ``SubscriptionState.on_stream_event``).

    ``follow_retention=False`` (offline GC passes, which write GC records
    only): a retention record adds no follow-up; the server moves those links
    before it next wakes, claims or delivers. ``report`` gets every durable
    ``LinksSkipped``.
    """

    def __init__(
        self,
        state: StreamState,
        subs: SubscriptionState,
        *,
        follow_retention: bool = True,
        report: Callable[[LinksSkipped], None] | None = None,
    ) -> None:
        self.state = state
        self.subs = subs
        self.follow_retention = follow_retention
        self.report = report

    def before_apply(self, record: Any) -> object:
        uid = getattr(record, "uid", None)
        return self.state.streams.get(uid) if uid is not None else None

    def after_apply(self, record: Any, token: object) -> Sequence[Any]:
        if isinstance(record, RetentionAdvanced) and not self.follow_retention:
            return ()
        before = token if isinstance(token, Stream) else None
        return self.subs.on_stream_event(record, before, self.state)

    def on_durable(self, record: Any) -> Callable[[], None] | None:
        report = self.report
        if report is None or not isinstance(record, LinksSkipped):
            return None
        return lambda: report(record)


class SubscriptionService:
    def __init__(
        self,
        state: StreamState,
        subs: SubscriptionState,
        committer: Committer,
        visibility: Visibility,
        clock: Clock,
        *,
        webhooks: bool,
        allow_loopback: bool,
        public_url: str,
        skips: LinkSkips | None = None,
        remote_streams: StreamsView | None = None,
    ) -> None:
        self.state = state
        self.subs = subs
        self.committer = committer
        self.visibility = visibility
        self.clock = clock
        self.webhooks = webhooks
        self.allow_loopback = allow_loopback
        self.public_url = public_url.rstrip("/")
        # Cluster mode, on the subscriptions' shard: the streams other shards report (``tiered.cluster.features.sub_feed``).
        self.remote_streams = remote_streams
        #: What retention made links skip (``/metrics``), as journaled by this process.
        self.skips = skips or LinkSkips()

    def streams(self, now_ms: int) -> StreamsView:
        """The default bucket's streams at their durable (visible) tails (and other shards', in cluster mode)."""
        local = StateStreams(self.state, now_ms, lambda s: self.visibility.view(s).tail)
        return local if self.remote_streams is None else CombinedStreams(local, self.remote_streams)

    def base_url(self, from_request: str) -> str:
        return self.public_url or from_request

    async def ensure_signing_key(self) -> SigningKey:
        """The active signing key, journaling a new one the first time it is needed."""
        if self.subs.active_key is None:
            await self.committer.commit(self.subs.decide_add_key(new_signing_key(self.clock.now_ms())))
        key = self.subs.active_key
        assert key is not None
        return key

    # ------------------------------------------------------------- subscriptions

    async def put(
        self, sub_id: str, cfg: SubscriptionConfig, base_url: str, jwks_url: str
    ) -> tuple[bool, dict[str, Any]]:
        """Create (True) or re-confirm (False) a subscription; its view."""
        if cfg.type == WEBHOOK:
            await self.ensure_signing_key()
        now = self.clock.now_ms()
        records, existing = self.subs.decide_create(sub_id, cfg, base_url, self.streams(now), now)
        if existing is not None:
            await self.committer.settled()  # the matching create may still be on its way to disk
            return False, views.describe(self.subs, existing, jwks_url)
        await self.committer.commit(records)
        return True, views.describe(self.subs, self.subs.get(sub_id), jwks_url)

    def get(self, sub_id: str, jwks_url: str) -> dict[str, Any]:
        return views.describe(self.subs, self.subs.get(sub_id), jwks_url)

    async def delete(self, sub_id: str) -> None:
        await self.committer.commit(self.subs.decide_delete(sub_id, self.clock.now_ms()))

    async def add_streams(self, sub_id: str, paths: tuple[str, ...]) -> None:
        now = self.clock.now_ms()
        await self.committer.commit(self.subs.decide_add_streams(sub_id, paths, self.streams(now), now))

    async def remove_stream(self, sub_id: str, path: str) -> None:
        await self.committer.commit(self.subs.decide_remove_stream(sub_id, path, self.clock.now_ms()))

    # ------------------------------------------------------------- wakes

    async def ack(self, sub_id: str, token: str, req: WakeRequest, *, pull_only: bool) -> bool:
        """A webhook callback (``pull_only=False``) or a pull-wake ack; returns whether a next wake was issued."""
        now = self.clock.now_ms()
        records, next_wake = self.subs.decide_ack(
            sub_id, token, req, self.streams(now), now, pull_only=pull_only
        )
        await self.committer.commit(records)
        return next_wake

    async def release(self, sub_id: str, token: str, req: WakeRequest) -> None:
        now = self.clock.now_ms()
        await self.committer.commit(self.subs.decide_release(sub_id, token, req, self.streams(now), now))

    async def claim(self, sub_id: str, worker: str) -> dict[str, Any]:
        key = await self.ensure_signing_key()
        now = self.clock.now_ms()
        records = self.subs.decide_claim(sub_id, worker, self.streams(now), now)
        sub = self.subs.get(sub_id)
        await self.committer.commit(records)
        claimed = records[-1]
        assert isinstance(claimed, WakeClaimed)
        claims = TokenClaims(
            sub.id, sub.incarnation, claimed.generation, claimed.wake_id, now // 1000 + TOKEN_TTL_S
        )
        return {
            "wake_id": claimed.wake_id,
            "generation": claimed.generation,
            "token": mint_token(key.token_secret, claims),
            "streams": views.stream_infos(self.subs, sub, self.streams(self.clock.now_ms())),
            "lease_ttl_ms": sub.lease_ttl_ms,
        }

    async def jwks(self) -> dict[str, Any]:
        await self.ensure_signing_key()
        return self.subs.jwks()
