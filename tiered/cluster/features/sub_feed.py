"""Subscriptions fed by every shard (cluster mode): each shard reports its streams to the subscriptions' shard.

Subscriptions live in one shard, the one of ``(default, "__ds")``, and their
state machine (``tiered.engine.subscriptions.state``) sees streams only through a
``StreamsView``: a tail per path and the list of paths. Streams of other
shards reach it through a *feed*, so the state machine and its journal stay
as they are:

* **Sender** (``FeedSender``, one per served shard other than the
  subscriptions' shard, built with its engine as an ``Extension``: its loop is
  one of the engine's supervised jobs, ``subscription-feed``): a commit observer marks the default bucket's paths
  whose streams changed (created, appended, retained, deleted, expired); a
  loop posts them, coalesced, with each one's uid and *visible*
  (acknowledged) tail, its first and retained offsets when retention moved
  them from 0 (``retained``), or as gone, to
  ``POST /v1/stream/__ds/_cluster/feed``, which shard routing
  sends to the subscriptions' shard like any request. The first post after
  the sender starts, and after the receiver says it is a new instance (its
  node restarted or the shard moved), is a full snapshot of the shard's
  streams. An idle sender still posts every ``HEARTBEAT_S``, so a new
  receiver learns every shard's streams within that. While no subscription
  exists, posts are coalesced over ``IDLE_COALESCE_S`` (about one post per
  shard per 100 ms under load, instead of one per append).
* **Receiver** (``FeedTable``, the ``remote_streams`` hook of the subscriptions' shard's engine): the
  reported streams, in memory (every fact in it is durable in its own shard
  and reported again after a restart). It is the remote half of the
  ``CombinedStreams`` the subscription service reads, and each change it
  learns becomes ``SubscriptionState.on_remote_stream`` follow-ups (links
  under patterns, wakes, unlinks), committed in that shard's journal like
  the ones of a local stream.
* **Acknowledgement**: while the receiver has subscriptions (its answer says
  so), a write in another shard is acknowledged only after a feed post that
  started after it was answered: a client that appended and then claims a
  pull-wake (or reads the subscription) sees its append, as on one node. The
  wait is bounded (``NOTIFY_TIMEOUT_S``): a receiver that cannot be reached
  delays writes by that much at most, and learns the append from a later post.

Wake events of pull-wake subscriptions whose wake stream is in another shard
are appended through routing too (``remote_append``), signed by this node as
a *system* call (``subrequest.system_request``): the wake stream's engine
authorizes it as the operator on that stream, with or without an admin token
and whatever the subscription's creator's credential (it needed admin on the
default bucket to name the wake stream).

The feed post and the barrier's syncs are signed by the sending node
(``tiered/cluster/membership/secret.py``, verified by shard routing before they are served); nothing
else is accepted when authentication is on (no admin token needed).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import quote

import msgspec

from tiered.api.kit.types import Request, Response, json_response
from tiered.cluster.gateway.routing import SUBSCRIPTIONS_KEY
from tiered.cluster.gateway.subrequest import TARGET_SHARD, Sign, internal_request, system_request
from tiered.cluster.membership.secret import SIGNATURE_HEADER, target_of
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.engine import Engine
from tiered.engine.hooks import EngineHooks, EngineView, Extension
from tiered.engine.streams.records import (
    Appended,
    BucketErased,
    RetentionAdvanced,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
)
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions.state import is_reserved, retained_of

__all__ = ["FEED_PATH", "FEED_SYNC_PATH", "FeedSender", "FeedTable", "SubscriptionFeeds", "defines_links"]

log = logging.getLogger(__name__)

FEED_PATH = "/v1/stream/__ds/_cluster/feed"
#: ``POST`` with ``Tiered-Shard: <n>``: shard n's sender posts now (and waits for writes again), answered after.
FEED_SYNC_PATH = "/v1/_cluster/feed-sync"
_SUBSCRIPTIONS = "/v1/stream/__ds/subscriptions/"
HEARTBEAT_S = 1.0
IDLE_COALESCE_S = 0.1
NOTIFY_TIMEOUT_S = 2.0
_RETRY_S = 0.5

Send = Callable[[Request, int], Awaitable[Response]]


def _signed(
    headers: dict[str, str], sign: Sign | None, method: str, path: str, shard: int, body: bytes
) -> dict[str, str]:
    """``headers`` aimed at ``shard`` and signed by this node when it can (verified by the serving node)."""
    out = {**headers, TARGET_SHARD: str(shard)}
    header = sign(method, target_of(path, ""), str(shard), body, frozenset()) if sign is not None else None
    if header is not None:
        out[SIGNATURE_HEADER] = header
    return out


class FeedBatch(msgspec.Struct, frozen=True):
    shard: int
    instance: str | None  # the receiver instance the sender last heard from
    full: bool  # every stream of the shard (paths not in it are gone)
    streams: list[tuple[str, int, int]]  # (path, uid, visible tail)
    gone: list[str]
    # (path, first offset, retained offset) of the streams above whose retained offset is past 0
    # (``StreamsView.retained``; others: (0, 0)). With a default: a sender without it still posts.
    retained: list[tuple[str, int, int]] = []


class FeedAnswer(msgspec.Struct, frozen=True):
    instance: str
    active: bool  # the receiver has subscriptions: writes wait for their post


_decode_batch = msgspec.json.Decoder(FeedBatch).decode
_decode_answer = msgspec.json.Decoder(FeedAnswer).decode


# ---------------------------------------------------------------- receiver


class FeedTable:
    """The streams other shards reported, as a ``StreamsView``; ``apply`` says what changed."""

    def __init__(self) -> None:
        self.instance = secrets.token_hex(8)
        self.entries: dict[str, tuple[int, int, int]] = {}  # path -> (shard, uid, tail)
        self.retention: dict[str, tuple[int, int]] = {}  # path -> (first, retained) when not (0, 0)

    def tail(self, path: str) -> int | None:
        entry = self.entries.get(path)
        return entry[2] if entry is not None else None

    def paths(self) -> Iterable[str]:
        return list(self.entries)

    def retained(self, path: str) -> tuple[int, int] | None:
        if path not in self.entries:
            return None
        return self.retention.get(path, (0, 0))

    def apply(self, batch: FeedBatch) -> list[tuple[str, str]]:
        """Take a batch in; the changes as ``(kind, path)``: ``created``, ``appended``, ``retained``, ``gone``."""
        changes: list[tuple[str, str]] = []
        gone = list(batch.gone)
        if batch.full:
            reported = {path for path, _, _ in batch.streams}
            gone += [p for p, e in self.entries.items() if e[0] == batch.shard and p not in reported]
        for path in gone:
            entry = self.entries.get(path)
            if entry is not None and entry[0] == batch.shard:
                del self.entries[path]
                self.retention.pop(path, None)
                changes.append(("gone", path))
        retention = {path: (first, retained) for path, first, retained in batch.retained}
        for path, uid, tail in batch.streams:
            entry = self.entries.get(path)
            kept = retention.get(path, (0, 0))
            if entry is not None and entry[1] == uid:
                if tail > entry[2]:  # tails only grow: an older report arriving late changes nothing
                    self.entries[path] = (batch.shard, uid, tail)
                    changes.append(("appended", path))
                if kept[1] > self.retention.get(path, (0, 0))[1]:  # retained offsets only grow, too
                    self.retention[path] = kept
                    changes.append(("retained", path))
                continue
            if entry is not None:
                changes.append(("gone", path))  # deleted and created again
            self.entries[path] = (batch.shard, uid, tail)
            if kept != (0, 0):
                self.retention[path] = kept
            else:
                self.retention.pop(path, None)
            changes.append(("created", path))
        return changes


async def receive(engine: Engine, table: FeedTable, batch: FeedBatch) -> FeedAnswer:
    """Apply a batch on the subscriptions' shard: each change decided and committed in turn."""
    subs = engine.subscriptions
    future: asyncio.Future[None] | None = None
    for kind, path in table.apply(batch):
        now = engine.clock.now_ms()
        records = subs.subs.on_remote_stream(kind, path, subs.streams(now), now)
        if records:
            engine.committer.check_writable()
            future = engine.committer.commit_nowait(records) or future
    await engine.committer.durable(future)
    return FeedAnswer(table.instance, bool(subs.subs.subs))


# ---------------------------------------------------------------- sender


def _watched(path: str) -> bool:
    return not is_reserved(path)


class FeedObserver:
    """Commit observer on a shard's engine: marks the default bucket's paths whose streams changed."""

    def __init__(self, state: StreamState, mark: Callable[[str | None], None]) -> None:
        self.state = state
        self.mark = mark

    def before_apply(self, record: Any) -> object:
        if isinstance(record, (Appended, StreamDeleted, StreamExpired)):
            s = self.state.streams.get(record.uid)
            return (s.bucket, s.path) if s is not None else None
        return None

    def after_apply(self, record: Any, token: object) -> Sequence[Any]:
        if isinstance(record, StreamCreated):
            if record.bucket == DEFAULT_BUCKET and _watched(record.path):
                self.mark(record.path)
        elif isinstance(record, RetentionAdvanced):  # retained offsets moved: links may have to follow
            for uid, _ in record.advances:
                s = self.state.streams.get(uid)
                if s is not None and s.bucket == DEFAULT_BUCKET and _watched(s.path):
                    self.mark(s.path)
        elif isinstance(token, tuple):
            bucket, path = token
            # A removal may cascade to soft-deleted sources, which were reported gone when soft-deleted.
            if bucket == DEFAULT_BUCKET and _watched(path):
                self.mark(path)
        elif isinstance(record, BucketErased) and record.name == DEFAULT_BUCKET:
            self.mark(None)
        return ()

    def on_durable(self, record: Any) -> Callable[[], None] | None:
        """Mark an appended (or created) path again once durable: its *visible* tail moved only now.

        A post built between the apply and durability reports the tail readers
        saw before the write; without this mark the new tail would wait for
        the stream's next change, and so would the wakes it owes.
        """
        path: str | None = None
        if isinstance(record, Appended):
            s = self.state.streams.get(record.uid)
            if s is not None and s.bucket == DEFAULT_BUCKET:
                path = s.path
        elif isinstance(record, StreamCreated) and record.bucket == DEFAULT_BUCKET and record.data:
            path = record.path
        if path is None or not _watched(path):
            return None
        mark, marked = self.mark, path
        return lambda: mark(marked)


class FeedSender:
    """Reports one shard's streams to the subscriptions' shard (see the module docstring).

    Built with the shard's engine (``engine`` is what it sees of it); ``observer``
    goes into the engine's committer and ``run`` is a job of the engine's supervisor.
    """

    def __init__(
        self,
        shard: int,
        engine: EngineView,
        send: Send,
        target: Callable[[], int],
        sign: Sign | None = None,
    ) -> None:
        self.shard = shard
        self.engine = engine
        self.send = send
        self.target = target
        self.sign = sign
        self.dirty: set[str] = set()
        self.full = True
        self.instance: str | None = None
        self.active = True  # until the receiver says otherwise
        self.running = False  # while ``run`` loops (no post can start otherwise: nobody waits for one)
        self._kick = asyncio.Event()
        self._next: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.observer = FeedObserver(engine.state, self.mark)

    def mark(self, path: str | None) -> None:
        if path is None:
            self.full = True
        else:
            self.dirty.add(path)
        self._kick.set()

    async def notified(self) -> None:
        """Wait (bounded) for a post that starts after now, if the receiver has subscriptions."""
        if not self.active or not self.running:
            return
        waiting = self._next
        self._kick.set()
        try:
            await asyncio.wait_for(asyncio.shield(waiting), NOTIFY_TIMEOUT_S)
        except (TimeoutError, Exception):
            return

    async def run(self) -> None:
        """Post until cancelled (the engine stops); a waiting write is released when it ends."""
        self.running = True
        try:
            await self._loop()
        finally:
            self.running = False
            if not self._next.done():
                self._next.set_result(None)

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), HEARTBEAT_S)
            except TimeoutError:
                pass
            if not self.active:
                # Nobody waits and no subscription exists: coalesce, so a busy shard posts ~10 times a second.
                await asyncio.sleep(IDLE_COALESCE_S)
            self._kick.clear()
            round_done, self._next = self._next, asyncio.get_running_loop().create_future()
            try:
                again = await self._post()
            except asyncio.CancelledError:
                round_done.set_result(None)
                raise
            except Exception as exc:  # the receiver may be moving: keep the marks, try again soon
                log.debug("shard %d: subscription feed post failed: %s", self.shard, exc)
                again = False
                await asyncio.sleep(_RETRY_S)
            round_done.set_result(None)
            if again:
                self._kick.set()

    def _batch(self) -> tuple[FeedBatch, set[str], bool]:
        state, now = self.engine.state, self.engine.clock.now_ms()
        full, dirty = self.full, self.dirty
        self.full, self.dirty = False, set()
        if full:
            dirty = {p for (b, p) in state.paths if b == DEFAULT_BUCKET and _watched(p)}
        streams: list[tuple[str, int, int]] = []
        retained: list[tuple[str, int, int]] = []
        gone: list[str] = []
        for path in sorted(dirty):
            s = state.find(DEFAULT_BUCKET, path)
            if s is None or s.soft_deleted or s.expired(now):
                gone.append(path)
            else:
                streams.append((path, s.uid, self.engine.visible_tail(s)))
                if s.retained_from > 0:
                    retained.append((path, *retained_of(s)))
        return FeedBatch(self.shard, self.instance, full, streams, gone, retained), dirty, full

    async def _post(self) -> bool:
        """One post; True when a full snapshot must follow at once (a new receiver)."""
        batch, dirty, full = self._batch()
        headers = {"Content-Type": "application/json"}
        body = msgspec.json.encode(batch)
        try:
            target = self.target()
            headers = _signed(headers, self.sign, "POST", FEED_PATH, target, body)
            response = await self.send(internal_request("POST", FEED_PATH, headers, body), target)
            if response.status in (401, 403):
                self.active = False  # refused for good: writes must not wait for it
            if response.status != 200 or not isinstance(response.body, bytes):
                raise TieredError(
                    ErrorCode.UNAVAILABLE, f"the subscriptions' shard answered {response.status}"
                )
            answer = _decode_answer(response.body)
        except BaseException:
            self.dirty |= dirty
            self.full = self.full or full
            raise
        self.active = answer.active
        if answer.instance != self.instance:
            self.instance = answer.instance
            if not full:
                self.full = True
                return True
        return False


# ---------------------------------------------------------------- the node's feeds


def defines_links(method: str, path: str) -> bool:
    """A subscription created (``PUT``) or given streams (``POST .../streams``): links from the current tails."""
    if not path.startswith(_SUBSCRIPTIONS):
        return False
    rest = path[len(_SUBSCRIPTIONS) :]
    if method == "PUT":
        return "/" not in rest
    return method == "POST" and rest.count("/") == 1 and rest.endswith("/streams")


class SubscriptionFeeds:
    """Every feed of this node: a sender per served shard, a table on the subscriptions' shard.

    ``hooks(shard)`` is what each shard's engine gets at construction (the
    receiver's table and wake appends on the subscriptions' shard, a sender on
    every other); ``send`` is shard routing's (``ShardRouter.send``).
    """

    feed_path = FEED_PATH
    sync_path = FEED_SYNC_PATH

    def __init__(
        self,
        shard_count: Callable[[], int],
        shard_of: Callable[[str, str], int],
        auth_required: bool,
        send: Send,
        sign: Sign | None,
    ) -> None:
        self.shard_count = shard_count
        self.shard_of = shard_of
        self.auth_required = auth_required
        self.send = send
        self.sign = sign  # this node's signature (``tiered/cluster/membership/secret.py``)
        self.senders: dict[int, FeedSender] = {}  # the latest engine's sender of each shard

    def target(self) -> int:
        return self.shard_of(*SUBSCRIPTIONS_KEY)

    def hooks(self, shard: int) -> EngineHooks:
        """The feed's part of ``shard``'s engine, given to the engine's constructor."""
        if shard == self.target():
            return EngineHooks(remote_streams=FeedTable(), remote_append=self.remote_append)
        return EngineHooks(extensions=(lambda view: self._sender(shard, view),))

    def _sender(self, shard: int, view: EngineView) -> Extension:
        sender = self.senders[shard] = FeedSender(shard, view, self.send, self.target, self.sign)
        return Extension(observers=(sender.observer,), jobs={"subscription-feed": sender.run})

    def _sender_of(self, shard: int, engine: Engine) -> FeedSender | None:
        sender = self.senders.get(shard)
        return sender if sender is not None and sender.engine.state is engine.state else None

    def defines_links(self, method: str, path: str) -> bool:
        return defines_links(method, path)

    async def after_write(self, shard: int, engine: Engine, key: tuple[str, str] | None) -> None:
        """A write in ``shard`` was acknowledged: wait (bounded) until the subscriptions' shard heard of it.

        ``key``: the write's shard key (``routing.shard_key`` of its parsed target).
        """
        sender = self._sender_of(shard, engine)
        if sender is None:
            return
        if key is None or key[0] != DEFAULT_BUCKET or not _watched(key[1]):
            return
        await sender.notified()

    def _authorized(self, call: object | None) -> bool:
        """A node's signed call (``call``), or anyone when auth is off."""
        return call is not None or not self.auth_required

    async def handle(self, shard: int, engine: Engine, request: Request, call: object | None) -> Response:
        """``POST FEED_PATH`` on the subscriptions' shard (served here)."""
        if request.method != "POST":
            raise TieredError(ErrorCode.METHOD_NOT_ALLOWED, "the feed takes POST", allow="POST")
        if not self._authorized(call):
            raise TieredError(ErrorCode.FORBIDDEN, "the subscription feed is for the cluster's nodes")
        try:
            batch = _decode_batch(await request.body())
        except msgspec.ValidationError as exc:
            raise TieredError(ErrorCode.BAD_REQUEST, f"bad feed batch: {exc}") from None
        except msgspec.DecodeError as exc:
            raise TieredError(ErrorCode.BAD_REQUEST, f"bad feed batch: {exc}") from None
        table = engine.hooks.remote_streams
        if not isinstance(table, FeedTable):
            raise TieredError(ErrorCode.SHARD_NOT_OWNED, "not the subscriptions' shard", retry_after_s=1)
        answer = await receive(engine, table, batch)
        return json_response(msgspec.to_builtins(answer))

    async def barrier(self) -> None:
        """Every other shard posts its changes now and learns whether subscriptions exist (bounded).

        Run around a subscription's creation on the subscriptions' shard:
        before, so it links what clients wrote before it at their tails;
        after, so the other shards' writes wait for their reports from then on.
        """
        send, target = self.send, self.target()
        headers = {"Content-Type": "application/json"}

        async def one(shard: int) -> None:
            request = internal_request(
                "POST", FEED_SYNC_PATH, _signed(headers, self.sign, "POST", FEED_SYNC_PATH, shard, b"")
            )
            try:
                await asyncio.wait_for(send(request, shard), NOTIFY_TIMEOUT_S)
            except (TieredError, TimeoutError) as exc:
                log.info("subscription feed of shard %d not synced: %r", shard, exc)

        shards = [s for s in range(self.shard_count()) if s != target]
        await asyncio.gather(*(one(s) for s in shards))

    async def sync(self, shard: int, engine: Engine, request: Request, call: object | None) -> Response:
        """``POST FEED_SYNC_PATH`` for ``shard``, served here: post now, then answer."""
        if not self._authorized(call):
            raise TieredError(ErrorCode.FORBIDDEN, "the subscription feed is for the cluster's nodes")
        sender = self._sender_of(shard, engine)
        if sender is not None:
            sender.active = True  # until the post's answer says whether subscriptions exist
            await sender.notified()
        return Response(204, {}, b"")

    async def remote_append(self, path: str, event: bytes) -> bool:
        """Append a wake event to another shard's stream; False: try again later."""
        url = "/v1/stream/" + quote(path, safe="/")
        try:
            response = await self.send(
                system_request(self.sign, "POST", url, {"Content-Type": "application/json"}, event),
                self.shard_of(DEFAULT_BUCKET, path),
            )
        except TieredError as exc:
            log.info("subscriptions: wake event to %s not written yet: %s", path, exc.message)
            return False
        if response.status >= 500:
            return False
        if response.status >= 300:
            log.warning("subscriptions: cannot write a wake event to %s: %d", path, response.status)
        return True
