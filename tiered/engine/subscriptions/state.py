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

import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from tiered.core.errors import ErrorCode, TieredError
from tiered.core.globs import compile_glob
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import (
    Appended,
    RetentionAdvanced,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
)
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions.config import (
    PULL_WAKE,
    RESERVED_SEGMENT,
    WEBHOOK,
    SubscriptionConfig,
    WakeRequest,
    fenced,
    invalid,
    invalid_offset,
    not_found,
)
from tiered.engine.subscriptions.records import (
    SUBSCRIPTION_RECORD_TYPES,
    Acked,
    ExplicitLinkRemoved,
    GenerationFenced,
    LinkSkip,
    LinkSpec,
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
from tiered.engine.subscriptions.snapshot import decode_state, encode_state
from tiered.engine.subscriptions.wake_tokens import (
    TOKEN_TTL_S,
    SigningKey,
    TokenClaims,
    mint_token,
    public_jwk,
    read_token,
)

log = logging.getLogger(__name__)

BEFORE_FIRST = -1
RETRY_BASE_MS = 1_000
RETRY_MAX_MS = 60_000
RETRY_JITTER = 0.2


def is_reserved(path: str) -> bool:
    return path.split("/", 1)[0] == RESERVED_SEGMENT


# ---------------------------------------------------------------- streams as seen from here


class StreamsView(Protocol):
    """The streams under the stream root (default bucket) that subscriptions can link."""

    def tail(self, path: str) -> int | None:
        """The stream's tail offset, or None if no live stream has that path."""
        ...

    def paths(self) -> Iterable[str]: ...

    def retained(self, path: str) -> tuple[int, int] | None:
        """(first offset, retained offset) of the live stream at ``path``, or None.

        The first offset is where a link that acked nothing yet starts, for
        what it can lose: the stream's first byte. A fork's bytes below its
        fork point are its source's, readable from the fork's retained
        offset: retention among them is no loss to the link, only retention
        of the fork's own bytes is.
        """
        ...


def retained_of(s: Stream) -> tuple[int, int]:
    """``StreamsView.retained`` of one stream (a plain stream's fork offset is its first byte)."""
    return min(s.fork_offset, s.retained_from), s.retained_from


class StateStreams:
    """A ``StreamsView`` over ``StreamState``; ``visible_tail`` (the shell's) limits tails to durable data."""

    def __init__(
        self, state: StreamState, now_ms: int, visible_tail: Callable[[Stream], int] | None = None
    ) -> None:
        self.state = state
        self.now_ms = now_ms
        self.visible_tail = visible_tail

    def _live(self, s: Stream | None) -> bool:
        return s is not None and not s.soft_deleted and not s.expired(self.now_ms)

    def tail(self, path: str) -> int | None:
        s = self.state.find(DEFAULT_BUCKET, path)
        if s is None or not self._live(s):
            return None
        return self.visible_tail(s) if self.visible_tail is not None else s.tail

    def paths(self) -> Iterable[str]:
        for (bucket, path), uid in self.state.paths.items():
            if bucket == DEFAULT_BUCKET and not is_reserved(path) and self._live(self.state.streams.get(uid)):
                yield path

    def retained(self, path: str) -> tuple[int, int] | None:
        s = self.state.find(DEFAULT_BUCKET, path)
        if s is None or not self._live(s):
            return None
        return retained_of(s)


class CombinedStreams:
    """This engine's streams, then the ones other shards reported (cluster mode: ``tiered.cluster.features.sub_feed``)."""

    def __init__(self, local: StreamsView, remote: StreamsView) -> None:
        self.local = local
        self.remote = remote

    def tail(self, path: str) -> int | None:
        tail = self.local.tail(path)
        return tail if tail is not None else self.remote.tail(path)

    def paths(self) -> Iterable[str]:
        seen = set(self.local.paths())
        yield from seen
        for path in self.remote.paths():
            if path not in seen:
                yield path

    def retained(self, path: str) -> tuple[int, int] | None:
        got = self.local.retained(path)
        return got if got is not None else self.remote.retained(path)


# ---------------------------------------------------------------- state


@dataclass(slots=True)
class Link:
    path: str
    explicit: bool
    glob: bool
    acked: int
    skipped: tuple[int, int] | None = (
        None  # [start, end) retention released unprocessed; until an ack reaches end
    )

    @property
    def link_type(self) -> str:
        return "explicit" if self.explicit else "glob"


@dataclass(slots=True)
class Wake:
    wake_id: str
    generation: int
    issued_ms: int
    stream: str
    snapshot: dict[str, int]
    holder: str | None = None
    lease_expires_ms: int | None = None
    delivered: bool = False


@dataclass(slots=True)
class Subscription:
    id: str
    incarnation: int
    type: str
    pattern: str | None
    streams: tuple[str, ...]
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None
    created_ms: int
    config_hash: str
    base_url: str
    links: dict[str, Link] = field(default_factory=dict)
    generation: int = 0
    wake: Wake | None = None
    status: str = "active"  # "failed" while a webhook retry is scheduled
    attempts: int = 0  # consecutive failed deliveries
    next_attempt_ms: int | None = None
    last_error: str | None = None
    matcher: re.Pattern[str] | None = None

    def matches(self, path: str) -> bool:
        return (
            self.matcher is not None
            and path != self.wake_stream
            and self.matcher.fullmatch("/" + path) is not None
        )


def moved_to(records: list[SubscriptionRecord]) -> dict[str, int]:
    """The acked offsets ``LinksSkipped`` records move links to."""
    return {sk.path: sk.end for r in records if isinstance(r, LinksSkipped) for sk in r.skips}


def wake_live(sub: Subscription, now_ms: int) -> bool:
    """Whether the recorded wake still stands at ``now_ms`` (its lease, if any, has not run out)."""
    w = sub.wake
    if w is None:
        return False
    if w.lease_expires_ms is None:  # pull-wake not claimed yet, webhook not delivered yet
        return True
    return now_ms < w.lease_expires_ms


def backoff_ms(attempt: int, jitter: float) -> int:
    """Delay before retry ``attempt`` (1-based): 1 s doubling to 60 s, +-20% by ``jitter`` in [-1, 1]."""
    base = min(RETRY_BASE_MS * 2 ** min(attempt - 1, 30), RETRY_MAX_MS)
    return max(0, int(round(base * (1 + RETRY_JITTER * max(-1.0, min(1.0, jitter))))))


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
        return self.keys[-1] if self.keys else None

    def jwks(self) -> dict[str, Any]:
        return {"keys": [public_jwk(k.kid, k.public_key) for k in self.keys]}

    def first_pending(
        self,
        sub: Subscription,
        streams: StreamsView,
        acked: dict[str, int] | None = None,
        extra_links: dict[str, int] | None = None,
    ) -> str | None:
        """The first linked path (in path order) with unprocessed data, given projected acks/links."""
        offsets = {p: link.acked for p, link in sub.links.items()}
        if extra_links:
            for p, a in extra_links.items():
                offsets.setdefault(p, a)
        if acked:
            for p, a in acked.items():
                if p in offsets:
                    offsets[p] = a
        for path in sorted(offsets):
            tail = streams.tail(path)
            if tail is not None and tail > max(offsets[path], 0):
                return path
        return None

    def token_for(self, sub: Subscription, now_ms: int) -> str:
        """A token for the current wake (the shell hands it to the webhook or claiming worker)."""
        key = self.active_key
        assert key is not None and sub.wake is not None, "a token needs a signing key and a wake"
        claims = TokenClaims(
            sub.id, sub.incarnation, sub.generation, sub.wake.wake_id, now_ms // 1000 + TOKEN_TTL_S
        )
        return mint_token(key.token_secret, claims)

    def check_token(self, sub: Subscription, token: str | None, now_ms: int) -> TokenClaims:
        claims = read_token((k.token_secret for k in self.keys), token) if token else None
        if claims is None or claims.sub != sub.id or claims.incarnation != sub.incarnation:
            raise TieredError(ErrorCode.TOKEN_INVALID, "Token invalid")
        if now_ms // 1000 > claims.exp_s:
            raise TieredError(ErrorCode.TOKEN_EXPIRED, "Token expired")
        return claims

    def due_work(self, sub_id: str, now_ms: int) -> tuple[str | None, int | None]:
        """What the shell should do for a subscription now, and when to look again.

        ``("deliver", _)``: POST the current webhook wake. ``("wake-event", _)``:
        write the pull-wake event (the shell remembers which it wrote).
        The deadline is the lease end or the next retry time.
        """
        sub = self.subs.get(sub_id)
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

    # ------------------------------------------------------------- decide

    def decide_add_key(self, key: SigningKeyAdded) -> list[SubscriptionRecord]:
        """Journal a signing key unless one exists (the shell made ``key``: randomness stays out)."""
        return [] if self.keys else [key]

    def decide_create(
        self, sub_id: str, cfg: SubscriptionConfig, base_url: str, streams: StreamsView, now_ms: int
    ) -> tuple[list[SubscriptionRecord], Subscription | None]:
        """Records creating a subscription, or ``([], existing)`` when re-confirmed identically."""
        config_hash = cfg.hash()
        existing = self.subs.get(sub_id)
        if existing is not None:
            if existing.config_hash != config_hash:
                raise TieredError(
                    ErrorCode.SUBSCRIPTION_ALREADY_EXISTS,
                    "Subscription already exists with different configuration",
                )
            return [], existing
        links: list[LinkSpec] = []
        for path in cfg.streams:
            tail = streams.tail(path)
            links.append(LinkSpec(path, "explicit", BEFORE_FIRST if tail is None else tail))
        if cfg.pattern is not None:
            matcher = compile_glob(cfg.pattern)
            for path in sorted(streams.paths()):
                if path != cfg.wake_stream and matcher.fullmatch("/" + path):
                    tail = streams.tail(path)
                    # Backfill at the current tail: creation does not replay history.
                    links.append(LinkSpec(path, "glob", BEFORE_FIRST if tail is None else tail))
        return [
            SubscriptionCreated(
                id=sub_id,
                incarnation=self.next_incarnation,
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
                links=tuple(links),
            )
        ], None

    def decide_delete(self, sub_id: str, now_ms: int) -> list[SubscriptionRecord]:
        return [SubscriptionDeleted(sub_id, now_ms)] if sub_id in self.subs else []

    def decide_add_streams(
        self, sub_id: str, paths: Iterable[str], streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        sub = self.get(sub_id)
        links = []
        for path in paths:
            if path == sub.wake_stream:
                raise invalid("a subscription's wake_stream cannot also be one of its streams")
            link = sub.links.get(path)
            if link is not None and link.explicit:
                continue  # already linked: idempotent
            tail = streams.tail(path)
            links.append(LinkSpec(path, "explicit", BEFORE_FIRST if tail is None else tail))
        return [StreamsLinked(sub_id, now_ms, tuple(links))] if links else []

    def decide_remove_stream(self, sub_id: str, path: str, now_ms: int) -> list[SubscriptionRecord]:
        sub = self.get(sub_id)
        link = sub.links.get(path)
        if link is None or not link.explicit:
            return []  # absent explicit link: idempotent
        return [ExplicitLinkRemoved(sub_id, path, now_ms)]

    def _issue(
        self,
        sub: Subscription,
        streams: StreamsView,
        now_ms: int,
        trigger: str,
        extra_links: dict[str, int] | None = None,
    ) -> WakeIssued:
        generation = sub.generation + 1
        digest = hashlib.sha256(f"{sub.id}\0{sub.incarnation}\0{generation}\0{now_ms}".encode()).hexdigest()
        paths = set(sub.links) | set(extra_links or ())
        snapshot = []
        for path in sorted(paths):
            tail = streams.tail(path)
            if tail is not None:
                snapshot.append((path, tail))
        return WakeIssued(sub.id, generation, "w_" + digest[:24], now_ms, trigger, tuple(snapshot))

    def decide_claim(
        self, sub_id: str, worker: str, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        sub = self.get(sub_id)
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
        trigger = self.first_pending(sub, streams)
        if trigger is None:
            raise TieredError(ErrorCode.NO_PENDING_WORK, "Subscription has no pending work")
        # Data it was woken for may have been released since: the claimer reads from what is retained, told so.
        records: list[SubscriptionRecord] = self._skips(sub, streams, now_ms)
        if live and w is not None:
            generation, wake_id = w.generation, w.wake_id
        else:
            issued = self._issue(sub, streams, now_ms, trigger)
            records.append(issued)
            generation, wake_id = issued.generation, issued.wake_id
        records.append(WakeClaimed(sub_id, generation, wake_id, worker, now_ms, now_ms + sub.lease_ttl_ms))
        return records

    def _check_wake(self, sub: Subscription, token: str | None, req: WakeRequest, now_ms: int) -> Wake:
        claims = self.check_token(sub, token, now_ms)
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
        """A webhook callback (``pull_only=False``) or a pull-wake ack. Returns (records, next_wake)."""
        sub = self.get(sub_id)
        if pull_only and sub.type != PULL_WAKE:
            raise invalid("Subscription is not pull-wake")
        w = self._check_wake(sub, token, req, now_ms)
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
        skipped = self._skips(sub, streams, now_ms, acks)
        records += skipped
        if not req.done:
            return records, False
        trigger = self.first_pending(sub, streams, acked={**acks, **moved_to(skipped)})
        if trigger is None:
            return records, False
        records.append(self._issue(sub, streams, now_ms, trigger))
        return records, True

    def decide_release(
        self, sub_id: str, token: str | None, req: WakeRequest, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        sub = self.get(sub_id)
        if sub.type != PULL_WAKE:
            raise invalid("Subscription is not pull-wake")
        w = self._check_wake(sub, token, req, now_ms)
        records: list[SubscriptionRecord] = [WakeEnded(sub_id, w.generation, w.wake_id, now_ms, "released")]
        trigger = self.first_pending(sub, streams)
        if trigger is not None:
            records += self._skips(sub, streams, now_ms)
            records.append(self._issue(sub, streams, now_ms, trigger))
        return records

    def decide_expire(
        self, sub_ids: Iterable[str], streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        """End wakes whose lease ran out; wake again where work is pending."""
        records: list[SubscriptionRecord] = []
        for sub_id in sorted(set(sub_ids)):
            sub = self.subs.get(sub_id)
            if sub is None or sub.wake is None or wake_live(sub, now_ms):
                continue
            trigger = self.first_pending(sub, streams)
            if trigger is not None:
                records += self._skips(sub, streams, now_ms)
                records.append(self._issue(sub, streams, now_ms, trigger))
            else:
                w = sub.wake
                records.append(WakeEnded(sub_id, w.generation, w.wake_id, now_ms, "lease-expired"))
        return records

    def decide_recover(self, streams: StreamsView, now_ms: int) -> list[SubscriptionRecord]:
        """After a restart: fence every wake that was outstanding (its tokens may be anywhere), wake pending work."""
        records: list[SubscriptionRecord] = []
        for sub_id in sorted(self.subs):
            sub = self.subs[sub_id]
            trigger = self.first_pending(sub, streams)
            if trigger is not None:
                records += self._skips(sub, streams, now_ms)
                records.append(self._issue(sub, streams, now_ms, trigger))
            elif sub.wake is not None:
                records.append(GenerationFenced(sub_id, sub.generation + 1, now_ms, "restart"))
        return records

    def decide_delivered(
        self, sub_id: str, wake_id: str, done: bool, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        """The receiver answered 2xx; ``{"done": true}`` acks the wake's snapshot and ends it."""
        sub = self.subs.get(sub_id)
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
        skipped = self._skips(sub, streams, now_ms, acks)
        records += skipped
        trigger = self.first_pending(sub, streams, acked={**acks, **moved_to(skipped)})
        if trigger is not None:
            records.append(self._issue(sub, streams, now_ms, trigger))
        return records

    def decide_delivery_failed(
        self, sub_id: str, wake_id: str, error: str, jitter: float, now_ms: int
    ) -> list[SubscriptionRecord]:
        """Schedule the next attempt (capped exponential backoff; ``jitter`` in [-1, 1] from the shell)."""
        sub = self.subs.get(sub_id)
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

    # ------------------------------------------------------------- stream events

    def on_stream_event(
        self, record: Any, before: Stream | None, state: StreamState
    ) -> list[SubscriptionRecord]:
        """Records that follow a stream record the service just applied (see ``StreamService._commit``).

        ``before`` is the stream the record touched, as it was before (None for a
        creation). A stream created under a pattern is linked before its first
        byte (offset -1); an append wakes idle subscriptions linking it; a
        deleted stream is unlinked. Errors are logged, never raised: the stream
        record is already journaled and must still succeed.
        """
        if not self.subs:
            return []
        try:
            if isinstance(record, Appended):
                if not record.data or before is None or before.bucket != DEFAULT_BUCKET:
                    return []
                ids = self.by_path.get(before.path)
                if not ids:
                    return []
                streams = StateStreams(state, record.ts_ms)
                return self._wake_idle(sorted(ids), streams, record.ts_ms, before.path, {})
            if isinstance(record, StreamCreated):
                if record.bucket != DEFAULT_BUCKET or is_reserved(record.path):
                    return []
                return self._on_created(record.path, StateStreams(state, record.ts_ms), record.ts_ms)
            if isinstance(record, (StreamDeleted, StreamExpired)):
                if before is None or before.bucket != DEFAULT_BUCKET or before.path not in self.by_path:
                    return []
                return [StreamGone(before.path, record.ts_ms)]
            if isinstance(record, RetentionAdvanced):
                paths = set()
                for uid, _ in record.advances:
                    s = state.streams.get(uid)
                    if s is not None and s.bucket == DEFAULT_BUCKET and s.path in self.by_path:
                        paths.add(s.path)
                return self.skips_on(paths, StateStreams(state, record.ts_ms), record.ts_ms)
        except Exception:
            log.exception("subscriptions: handling %s failed", type(record).__name__)
        return []

    def on_remote_stream(
        self, kind: str, path: str, streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        """``on_stream_event`` for a stream this state's engine does not hold (cluster mode: another shard's).

        ``kind`` is what the stream's shard reported: ``created``, ``appended``
        (its tail moved) or ``gone``; ``streams`` already shows the stream as
        reported. The same follow-ups as for a local stream: linked under a
        pattern, idle subscriptions woken, unlinked when gone.
        """
        if not self.subs or is_reserved(path):
            return []
        if kind == "gone":
            return [StreamGone(path, now_ms)] if path in self.by_path else []
        if kind == "created":
            return self._on_created(path, streams, now_ms)
        if kind == "retained":
            return self.skips_on({path}, streams, now_ms)
        ids = self.by_path.get(path)
        return self._wake_idle(sorted(ids), streams, now_ms, path, {}) if ids else []

    def _skips(
        self, sub: Subscription, streams: StreamsView, now_ms: int, acks: dict[str, int] | None = None
    ) -> list[SubscriptionRecord]:
        """``[LinksSkipped]`` moving every link retention passed (once ``acks`` applied), or ``[]``."""
        skips = []
        for path in sorted(sub.links):
            link = sub.links[path]
            acked = max(link.acked, (acks or {}).get(path, link.acked))
            got = streams.retained(path)
            if got is None:
                continue
            first, retained = got
            position = acked if acked >= 0 else first
            if position < retained:
                skips.append(LinkSkip(path, acked, position, retained))
        return [LinksSkipped(sub.id, now_ms, tuple(skips))] if skips else []

    def skips_on(self, paths: Iterable[str], streams: StreamsView, now_ms: int) -> list[SubscriptionRecord]:
        """Links of ``paths`` whose acked offset retention passed, moved (right after retention advanced)."""
        ids = sorted({sub_id for path in paths for sub_id in self.by_path.get(path, ())})
        return self.decide_skips(ids, streams, now_ms)

    def decide_skips(
        self, sub_ids: Iterable[str], streams: StreamsView, now_ms: int
    ) -> list[SubscriptionRecord]:
        """Every link of these subscriptions whose acked offset retention passed, moved (before a delivery)."""
        records: list[SubscriptionRecord] = []
        for sub_id in sorted(set(sub_ids)):
            sub = self.subs.get(sub_id)
            if sub is not None:
                records += self._skips(sub, streams, now_ms)
        return records

    def _on_created(self, path: str, streams: StreamsView, now_ms: int) -> list[SubscriptionRecord]:
        records: list[SubscriptionRecord] = []
        ids = set(self.by_path.get(path, ()))
        new_links: dict[str, dict[str, int]] = {}
        for sub in self.subs.values():
            if not sub.matches(path):
                continue
            ids.add(sub.id)
            link = sub.links.get(path)
            if link is None or not link.glob:
                records.append(StreamsLinked(sub.id, now_ms, (LinkSpec(path, "glob", BEFORE_FIRST),)))
                if link is None:
                    new_links[sub.id] = {path: BEFORE_FIRST}
        records.extend(self._wake_idle(sorted(ids), streams, now_ms, path, new_links))
        return records

    def _wake_idle(
        self,
        ids: list[str],
        streams: StreamsView,
        now_ms: int,
        trigger: str,
        new_links: dict[str, dict[str, int]],
    ) -> list[SubscriptionRecord]:
        records: list[SubscriptionRecord] = []
        for sub_id in ids:
            sub = self.subs.get(sub_id)
            if sub is None or wake_live(sub, now_ms):
                continue
            extra = new_links.get(sub_id)
            if self.first_pending(sub, streams, extra_links=extra) is not None:
                records += self._skips(sub, streams, now_ms)
                records.append(self._issue(sub, streams, now_ms, trigger, extra))
        return records

    # ------------------------------------------------------------- apply

    def apply(self, record: Any) -> None:
        if isinstance(record, SigningKeyAdded):
            self.keys.append(
                SigningKey(
                    record.kid, record.public_key, record.private_key, record.token_secret, record.ts_ms
                )
            )
        elif isinstance(record, StreamGone):
            self._apply_stream_gone(record)
        elif isinstance(record, SubscriptionCreated):
            self._apply_created(record)
        else:
            sub = self.subs.get(record.id)
            if sub is None:
                return
            self.dirty.add(sub.id)
            self._apply_to(sub, record)
        if self.listener is not None:
            self.listener()

    def _apply_created(self, r: SubscriptionCreated) -> None:
        old = self.subs.get(r.id)
        if old is not None:
            self._drop(old)
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
            matcher=compile_glob(r.pattern) if r.pattern is not None else None,
        )
        self.subs[r.id] = sub
        self.next_incarnation = max(self.next_incarnation, r.incarnation + 1)
        for spec in r.links:
            self._link(sub, spec)
        self.dirty.add(r.id)

    def _apply_to(self, sub: Subscription, record: Any) -> None:
        w = sub.wake
        if isinstance(record, SubscriptionDeleted):
            self._drop(sub)
        elif isinstance(record, StreamsLinked):
            for spec in record.links:
                self._link(sub, spec)
        elif isinstance(record, ExplicitLinkRemoved):
            link = sub.links.get(record.path)
            if link is not None:
                link.explicit = False
                if not link.glob:
                    self._unlink(sub, record.path)
        elif isinstance(record, WakeIssued):
            sub.generation = max(sub.generation, record.generation)
            sub.wake = Wake(
                record.wake_id, record.generation, record.ts_ms, record.stream, dict(record.snapshot)
            )
        elif isinstance(record, WakeClaimed):
            if w is not None and w.wake_id == record.wake_id:
                w.holder = record.worker
                w.lease_expires_ms = record.lease_expires_ms
        elif isinstance(record, LinksSkipped):
            for sk in record.skips:
                link = sub.links.get(sk.path)
                if link is None or link.acked != sk.acked or sk.end <= sk.start:
                    continue  # stale: acked (or skipped) since, or a replay
                link.acked = sk.end
                gap = link.skipped
                # Skips with no ack reaching past them between are one range.
                link.skipped = (gap[0] if gap is not None and gap[1] == sk.start else sk.start, sk.end)
        elif isinstance(record, Acked):
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
        elif isinstance(record, WakeEnded):
            if w is not None and w.wake_id == record.wake_id:
                sub.wake = None
        elif isinstance(record, GenerationFenced):
            sub.generation = max(sub.generation, record.generation)
            sub.wake = None
        elif isinstance(record, WebhookDelivered):
            sub.status, sub.attempts, sub.next_attempt_ms, sub.last_error = "active", 0, None, None
            if w is not None and w.wake_id == record.wake_id:
                w.delivered = True
                w.lease_expires_ms = record.lease_expires_ms
        elif isinstance(record, WebhookFailed):
            if w is not None and w.wake_id == record.wake_id:
                sub.status = "failed"
                sub.attempts = record.attempts
                sub.next_attempt_ms = record.next_attempt_ms
                sub.last_error = record.error
        else:
            raise TypeError(f"subscriptions cannot apply {type(record).__name__}")

    def _apply_stream_gone(self, r: StreamGone) -> None:
        for sub_id in list(self.by_path.get(r.path, ())):
            sub = self.subs[sub_id]
            link = sub.links[r.path]
            self.dirty.add(sub_id)
            if link.explicit:
                # Explicit membership outlives the stream; a stream created later starts fresh.
                link.glob = False
                link.acked = BEFORE_FIRST
                link.skipped = None
            else:
                self._unlink(sub, r.path)

    def _link(self, sub: Subscription, spec: LinkSpec) -> None:
        explicit, glob = spec.link_type == "explicit", spec.link_type == "glob"
        link = sub.links.get(spec.path)
        if link is None:
            sub.links[spec.path] = Link(spec.path, explicit, glob, spec.acked)
            self.by_path.setdefault(spec.path, set()).add(sub.id)
        else:
            link.explicit = link.explicit or explicit
            link.glob = link.glob or glob

    def _unlink(self, sub: Subscription, path: str) -> None:
        del sub.links[path]
        ids = self.by_path.get(path)
        if ids is not None:
            ids.discard(sub.id)
            if not ids:
                del self.by_path[path]

    def _drop(self, sub: Subscription) -> None:
        for path in list(sub.links):
            self._unlink(sub, path)
        del self.subs[sub.id]
        self.dirty.add(sub.id)

    # ------------------------------------------------------------- snapshots

    def snapshot(self) -> bytes:
        return encode_state(self)

    def restore(self, data: bytes) -> None:
        self.__init__()  # type: ignore[misc]
        decode_state(self, data)
