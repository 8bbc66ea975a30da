"""Subscription delivery: the imperative shell around ``SubscriptionState``.

One scheduler task and a few workers, started and stopped by the node:

* the scheduler wakes when a subscription record is applied (the state's
  ``listener``) or a deadline passes (a lease ends, a retry is due). It
  journals lease expiries and puts due work on a bounded queue; if the queue
  is full the work stays due in the state and is picked up on a later pass,
  so an append never waits for a delivery;
* workers POST signed webhook wakes (Ed25519 over ``<t>.<body>``; the
  receiver's answer is journaled: delivered, ``{"done": true}`` auto-ack, or
  a failure with the next attempt time: 1 s doubling to 60 s, +-20% jitter)
  and append pull-wake events to wake streams.

Nothing is sent before the records it describes are durable: workers wait
for the journal first. At start, every wake outstanding before the restart is
fenced (``SubscriptionState.decide_recover``): its tokens may be anywhere.

Webhook targets were checked when the subscription was created; at connect
time every peer address is checked again (``webhook_policy``: resolved
names and literal IPs alike, so DNS rebinding gets nowhere), redirects are not
followed, and no proxy settings from the environment are used.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.streams.model import AppendRequest
from tiered.engine.streams.service import StreamService
from tiered.engine.subscriptions import views
from tiered.engine.subscriptions.model import Subscription
from tiered.engine.subscriptions.records import SubscriptionRecord
from tiered.engine.subscriptions.service import SubscriptionService
from tiered.engine.subscriptions.state import SubscriptionState
from tiered.engine.subscriptions.wake_tokens import SigningKey
from tiered.engine.subscriptions.webhook_policy import guarded_socket_factory

log = logging.getLogger(__name__)

CONTROL_PREFIX = "/v1/stream/__ds"
MAX_RESPONSE_BYTES = 64 * 1024

_private_keys: dict[str, Ed25519PrivateKey] = {}


def signature_header(key: SigningKey, body: bytes, ts_s: int) -> str:
    """``Webhook-Signature: t=<ts>,kid=<kid>,ed25519=<base64url(sign("<ts>." + body))>``."""
    private = _private_keys.get(key.kid)
    if private is None:
        private = _private_keys[key.kid] = Ed25519PrivateKey.from_private_bytes(key.private_key)
    signature = private.sign(f"{ts_s}.".encode() + body)
    return f"t={ts_s},kid={key.kid},ed25519={base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


class SubscriptionDelivery:
    """Webhook deliveries and pull-wake events, driven by a scheduler task and a few worker tasks.

    The node starts the coroutines ``jobs()`` names (after ``recover``) and stops them.
    """

    def __init__(
        self,
        subscriptions: SubscriptionService,
        streams: StreamService,
        clock: Clock,
        *,
        workers: int = 4,
        queue_size: int = 1024,
        timeout_s: float = 10.0,
        rng: random.Random | None = None,
        remote_append: Callable[[str, bytes], Awaitable[bool]] | None = None,
    ) -> None:
        self.service = subscriptions
        self.streams_service = streams
        self.clock = clock
        self.enabled = subscriptions.webhooks
        self.allow_loopback = subscriptions.allow_loopback
        self.workers = workers
        self.timeout_s = timeout_s
        self.rng = rng or random.Random()
        self._queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue(maxsize=queue_size)
        self._queued: set[tuple[str, str]] = set()  # (subscription, wake) queued or in progress
        self._events_written: dict[str, str] = {}  # subscription -> wake id of its last wake event
        self._deadlines: list[tuple[int, str]] = []  # heap of (ms, subscription) to look at again
        self._wakeup = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        # Cluster mode: append a wake event (one JSON message) to another shard's stream; False: retry later.
        self.remote_append = remote_append

    @property
    def subs(self) -> SubscriptionState:
        return self.service.subs

    # ------------------------------------------------------------- lifecycle

    async def recover(self) -> None:
        """Fence every wake outstanding before a restart (its tokens may be anywhere), wake pending work."""
        self.subs.listener = self._wakeup.set
        now = self.clock.now_ms()
        await self._commit(self.subs.decide_recover(self.service.streams(now), now))
        self._wakeup.set()

    def jobs(self) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
        """The background coroutines to run (named), for the node to start and stop."""
        jobs: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = [
            ("subscriptions-scheduler", self._schedule)
        ]
        jobs += [(f"subscriptions-delivery-{i}", self._work) for i in range(self.workers)]
        return jobs

    async def close(self) -> None:
        if self.subs.listener == self._wakeup.set:
            self.subs.listener = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        """The HTTP client, made on first use (a server without webhooks never opens one)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # Every address is checked as the socket is made: resolved names and literal IPs alike.
                connector=aiohttp.TCPConnector(
                    limit=64, socket_factory=guarded_socket_factory(allow_loopback=self.allow_loopback)
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers={"User-Agent": "tiered-webhooks"},
                trust_env=False,
            )
        return self._session

    async def _commit(self, records: list[SubscriptionRecord]) -> bool:
        if not records:
            return True
        try:
            await self.service.committer.commit(records)
            return True
        except TieredError as exc:
            log.warning("subscriptions: cannot journal %d records: %s", len(records), exc.message)
            return False

    # ------------------------------------------------------------- scheduling

    def _timeout(self) -> float:
        if not self._deadlines:
            return 5.0
        return min(5.0, max(0.0, (self._deadlines[0][0] - self.clock.now_ms()) / 1000))

    async def _schedule(self) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel.
                async with asyncio.timeout(self._timeout()):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
            self._wakeup.clear()
            try:
                await self._sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("subscriptions: scheduling pass failed")
                await asyncio.sleep(1)

    def _later(self, sub_id: str, at_ms: int) -> None:
        heapq.heappush(self._deadlines, (at_ms, sub_id))

    async def _sweep(self) -> None:
        subs = self.subs
        now = self.clock.now_ms()
        ids, subs.dirty = subs.dirty, set()
        while self._deadlines and self._deadlines[0][0] <= now:
            ids.add(heapq.heappop(self._deadlines)[1])
        if not ids:
            return
        expired = subs.decide_expire(ids, self.service.streams(now), now)
        if expired and not await self._commit(expired):
            for sub_id in ids:
                self._later(sub_id, now + 1000)
            return
        for sub_id in ids:
            sub = subs.subs.get(sub_id)
            if sub is None:
                self._events_written.pop(sub_id, None)
                continue
            kind, deadline = subs.due_work(sub_id, now)
            if deadline is not None:
                self._later(sub_id, deadline)
            if kind is None or sub.wake is None:
                continue
            wake_id = sub.wake.wake_id
            if kind == "wake-event" and self._events_written.get(sub_id) == wake_id:
                continue
            if kind == "deliver" and not self.enabled:
                continue
            if (sub_id, wake_id) in self._queued:
                continue
            try:
                self._queue.put_nowait((kind, sub_id, wake_id))
                self._queued.add((sub_id, wake_id))
            except asyncio.QueueFull:
                self._later(sub_id, now + 1000)  # still due in the state: try again shortly

    async def _work(self) -> None:
        while True:
            kind, sub_id, wake_id = await self._queue.get()
            try:
                if kind == "deliver":
                    await self._deliver(sub_id, wake_id)
                else:
                    await self._write_wake_event(sub_id, wake_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("subscriptions: %s for %s failed", kind, sub_id)
                self._later(sub_id, self.clock.now_ms() + 1000)
                self._wakeup.set()
            finally:
                self._queued.discard((sub_id, wake_id))

    # ------------------------------------------------------------- delivery

    def _current(self, sub_id: str, wake_id: str) -> Subscription | None:
        sub = self.subs.subs.get(sub_id)
        if sub is None or sub.wake is None or sub.wake.wake_id != wake_id:
            return None
        return sub

    async def _deliver(self, sub_id: str, wake_id: str) -> None:
        await self.service.committer.settled()  # the wake and the data it names are durable first
        sub = self._current(sub_id, wake_id)
        if sub is None or sub.wake is None or sub.wake.delivered or sub.webhook_url is None:
            return
        key = await self.service.ensure_signing_key()
        now = self.clock.now_ms()
        # Retention may have passed an acked offset since the wake: the body shows the links as they are now.
        if not await self._commit(self.subs.decide_skips([sub_id], self.service.streams(now), now)):
            self._later(sub_id, now + 1000)
            return
        sub = self._current(sub_id, wake_id)
        if sub is None:
            return
        now = self.clock.now_ms()
        callback_url = f"{self.service.base_url(sub.base_url)}{CONTROL_PREFIX}/subscriptions/{quote(sub.id, safe='')}/callback"
        body = msgspec.json.encode(
            views.webhook_body(self.subs, sub, callback_url, self.subs.token_for(sub, now))
        )
        headers = {
            "Content-Type": "application/json",
            "Webhook-Signature": signature_header(key, body, now // 1000),
        }
        error = ""
        answer: Any = None
        url = sub.webhook_url
        if url is None:
            return
        try:
            async with self._client().post(url, data=body, headers=headers, allow_redirects=False) as resp:
                raw = await resp.content.read(MAX_RESPONSE_BYTES)
                if 200 <= resp.status < 300:
                    try:
                        answer = msgspec.json.decode(raw) if raw.strip() else {}
                    except msgspec.DecodeError:
                        answer = {}
                else:
                    error = f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        now = self.clock.now_ms()
        if error:
            log.info("subscriptions: webhook for %s failed: %s", sub_id, error)
            records = self.subs.decide_delivery_failed(sub_id, wake_id, error, self.rng.uniform(-1, 1), now)
        else:
            done = isinstance(answer, dict) and answer.get("done") is True
            records = self.subs.decide_delivered(sub_id, wake_id, done, self.service.streams(now), now)
        await self._commit(records)

    async def _write_wake_event(self, sub_id: str, wake_id: str) -> None:
        await self.service.committer.settled()
        sub = self._current(sub_id, wake_id)
        if (
            sub is None
            or sub.wake is None
            or sub.wake_stream is None
            or self._events_written.get(sub_id) == wake_id
        ):
            return
        w = sub.wake
        event = {
            "type": "wake",
            "subscription_id": sub.id,
            "stream": w.stream,
            "generation": w.generation,
            "ts": self.clock.now_ms(),
        }
        target = self.service.state.find(DEFAULT_BUCKET, sub.wake_stream)
        if target is None and self.remote_append is not None:
            # Cluster mode: the wake stream is another shard's; append through routing, as a client would.
            if not await self.remote_append(sub.wake_stream, msgspec.json.encode(event)):
                self._later(sub_id, self.clock.now_ms() + 1000)
                return
            self._events_written[sub_id] = wake_id
            return
        if target is None:
            log.warning("subscriptions: wake stream %s of %s does not exist", sub.wake_stream, sub_id)
            self._events_written[sub_id] = wake_id
            return
        # One JSON message, stored as JSON streams store messages (a line each).
        data = msgspec.json.encode(event) + b"\n"
        try:
            # Stored bytes as they are: the event is already one JSON message with its newline.
            await self.streams_service.append(
                DEFAULT_BUCKET, sub.wake_stream, AppendRequest(content_type=None, data=data, close=False)
            )
        except TieredError as exc:
            if exc.code in (ErrorCode.JOURNAL_FAILED, ErrorCode.HOT_TIER_FULL):
                self._later(sub_id, self.clock.now_ms() + 1000)
                return
            log.warning(
                "subscriptions: cannot write wake event of %s to %s: %s", sub_id, sub.wake_stream, exc.message
            )
        self._events_written[sub_id] = wake_id
