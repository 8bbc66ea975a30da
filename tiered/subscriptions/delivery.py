"""Subscription delivery: the imperative shell around ``SubscriptionState``.

One scheduler task and a few workers, started and stopped with the service:

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
time every peer address is checked again (``tiered.webhook_policy``: resolved
names and literal IPs alike, so DNS rebinding gets nowhere), redirects are not
followed, and no proxy settings from the environment are used.
"""

from __future__ import annotations

import asyncio
import base64
import heapq
import logging
import random
import secrets
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .ids import DEFAULT_BUCKET
from .records import Record
from .state import AppendRequest, StreamError
from .subscription_records import SigningKeyAdded, SubscriptionRecord
from .subscriptions import SigningKey, StateStreams, SubscriptionState, key_id
from .webhook_policy import guarded_socket_factory

if TYPE_CHECKING:
    from .service import StreamService

log = logging.getLogger(__name__)

CONTROL_PREFIX = "/v1/stream/__ds"
MAX_RESPONSE_BYTES = 64 * 1024


def now_ms() -> int:
    return int(time.time() * 1000)


def new_signing_key(ts_ms: int) -> SigningKeyAdded:
    """A fresh Ed25519 signing key and callback-token secret, as the record that persists them."""
    private = Ed25519PrivateKey.generate()
    private_raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public_raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return SigningKeyAdded(key_id(public_raw), public_raw, private_raw, secrets.token_bytes(32), ts_ms)


_private_keys: dict[str, Ed25519PrivateKey] = {}


def signature_header(key: SigningKey, body: bytes, ts_s: int) -> str:
    """``Webhook-Signature: t=<ts>,kid=<kid>,ed25519=<base64url(sign("<ts>." + body))>``."""
    private = _private_keys.get(key.kid)
    if private is None:
        private = _private_keys[key.kid] = Ed25519PrivateKey.from_private_bytes(key.private_key)
    signature = private.sign(f"{ts_s}.".encode() + body)
    return f"t={ts_s},kid={key.kid},ed25519={base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


class SubscriptionDelivery:
    def __init__(self, service: StreamService, *, workers: int = 4, queue_size: int = 1024,
                 timeout_s: float = 10.0, rng: random.Random | None = None) -> None:
        self.service = service
        self.enabled = bool(getattr(service.config, "webhooks", True))
        self.allow_loopback = bool(getattr(service.config, "webhook_allow_loopback", False))
        self.workers = workers
        self.timeout_s = timeout_s
        self.rng = rng or random.Random()
        self._queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue(maxsize=queue_size)
        self._queued: set[tuple[str, str]] = set()  # (subscription, wake) queued or in progress
        self._events_written: dict[str, str] = {}  # subscription -> wake id of its last wake event
        self._deadlines: list[tuple[int, str]] = []  # heap of (ms, subscription) to look at again
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def subs(self) -> SubscriptionState:
        return self.service.subscriptions

    def streams(self, ts_ms: int) -> StateStreams:
        """The default bucket's streams at their durable (visible) tails."""
        return StateStreams(self.service.state, ts_ms, lambda s: self.service.view(s).tail)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.subs.listener = self._wakeup.set
        now = now_ms()
        await self._commit(self.subs.decide_recover(self.streams(now), now))
        self._tasks.append(asyncio.create_task(self._schedule(), name="subscriptions-scheduler"))
        for i in range(self.workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"subscriptions-delivery-{i}"))
        self._wakeup.set()

    async def stop(self) -> None:
        if self.subs.listener == self._wakeup.set:
            self.subs.listener = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
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

    async def ensure_signing_key(self) -> SigningKey:
        """The active signing key, journaling a new one the first time it is needed."""
        if self.subs.active_key is None:
            records: list[Record] = list(self.subs.decide_add_key(new_signing_key(now_ms())))
            await self.service.commit_records(records)
        key = self.subs.active_key
        assert key is not None
        return key

    async def _commit(self, records: list[SubscriptionRecord]) -> bool:
        if not records:
            return True
        try:
            await self.service.commit_records(list[Record](records))
            return True
        except StreamError as exc:
            log.warning("subscriptions: cannot journal %d records: %s", len(records), exc.message)
            return False

    # ------------------------------------------------------------- scheduling

    def _timeout(self) -> float:
        if not self._deadlines:
            return 5.0
        return min(5.0, max(0.0, (self._deadlines[0][0] - now_ms()) / 1000))

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
        now = now_ms()
        ids, subs.dirty = subs.dirty, set()
        while self._deadlines and self._deadlines[0][0] <= now:
            ids.add(heapq.heappop(self._deadlines)[1])
        if not ids:
            return
        expired = subs.decide_expire(ids, self.streams(now), now)
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
                self._later(sub_id, now_ms() + 1000)
                self._wakeup.set()
            finally:
                self._queued.discard((sub_id, wake_id))

    # ------------------------------------------------------------- delivery

    def _current(self, sub_id: str, wake_id: str):  # type: ignore[no-untyped-def]
        sub = self.subs.subs.get(sub_id)
        if sub is None or sub.wake is None or sub.wake.wake_id != wake_id:
            return None
        return sub

    def base_url(self, stored: str) -> str:
        configured = str(getattr(self.service.config, "public_url", "") or "")
        return configured.rstrip("/") or stored

    async def _deliver(self, sub_id: str, wake_id: str) -> None:
        await self.service.journal.flushed()  # the wake and the data it names are durable first
        sub = self._current(sub_id, wake_id)
        if sub is None or sub.wake is None or sub.wake.delivered or sub.webhook_url is None:
            return
        key = await self.ensure_signing_key()
        sub = self._current(sub_id, wake_id)
        if sub is None:
            return
        now = now_ms()
        callback_url = f"{self.base_url(sub.base_url)}{CONTROL_PREFIX}/subscriptions/{quote(sub.id, safe='')}/callback"
        body = msgspec.json.encode(self.subs.webhook_body(sub, callback_url, self.subs.token_for(sub, now)))
        headers = {"Content-Type": "application/json", "Webhook-Signature": signature_header(key, body, now // 1000)}
        error = ""
        answer: Any = None
        try:
            async with self._client().post(sub.webhook_url, data=body, headers=headers, allow_redirects=False) as resp:
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
        now = now_ms()
        if error:
            log.info("subscriptions: webhook for %s failed: %s", sub_id, error)
            records = self.subs.decide_delivery_failed(sub_id, wake_id, error, self.rng.uniform(-1, 1), now)
        else:
            done = isinstance(answer, dict) and answer.get("done") is True
            records = self.subs.decide_delivered(sub_id, wake_id, done, self.streams(now), now)
        await self._commit(records)

    async def _write_wake_event(self, sub_id: str, wake_id: str) -> None:
        await self.service.journal.flushed()
        sub = self._current(sub_id, wake_id)
        if sub is None or sub.wake is None or sub.wake_stream is None or self._events_written.get(sub_id) == wake_id:
            return
        w = sub.wake
        event = {"type": "wake", "subscription_id": sub.id, "stream": w.stream, "generation": w.generation,
                 "ts": now_ms()}
        target = self.service.state.find(DEFAULT_BUCKET, sub.wake_stream)
        if target is None:
            log.warning("subscriptions: wake stream %s of %s does not exist", sub.wake_stream, sub_id)
            self._events_written[sub_id] = wake_id
            return
        # One JSON message, stored as JSON streams store messages (a line each).
        data = msgspec.json.encode(event) + b"\n"
        try:
            await self.service.append(DEFAULT_BUCKET, sub.wake_stream,
                                      AppendRequest(content_type=target.content_type, data=data, close=False))
        except StreamError as exc:
            if exc.status == 503:
                self._later(sub_id, now_ms() + 1000)
                return
            log.warning("subscriptions: cannot write wake event of %s to %s: %s", sub_id, sub.wake_stream, exc.message)
        self._events_written[sub_id] = wake_id
