"""Shard routing (cluster mode): send each request to the engine of its shard, here or on the owner.

``ShardRouter`` only routes. What it routes to is handed to its constructor:
where shards are served (a ``ShardView``: ``tiered/cluster/server.py``), the
forwarder, the node's own routes, each engine's handler, and the features
that sit on the request path (the subscription feeds, the token routes,
catch-up reads, the signer); ``tiered/cluster/compose.py`` builds them.

A request with a shard key (``tiered/cluster/gateway/routing.py``, from the request's
target parsed once: ``tiered.api.kit.target``) is served by this
node's engine for that shard when this node may acknowledge in it now; then,
for a write, the lease is checked again after the engine answered (and, in
object-store durability, after the write is in a WAL object): a node whose
window closed meanwhile (paused past its TTL, fenced) answers 503 with a
retry hint instead of acknowledging. The write may have landed locally; a
client retry is answered by the shard's real owner (producer appends are
idempotent).

Otherwise the request goes to the shard's owner, as the lease advertises it:
proxied (the default: clients need not follow redirects), or a 307 when the
client asked for one with ``Tiered-Redirect: 307``. A request that was already
forwarded once is never forwarded again: 503, retry.

When the owner changed under a forwarded request (the owner answered 503
``SHARD_NOT_OWNED``/``SHARD_FENCED``, or could not be reached), the shard's
owner is resolved again and the request retried there, here included, at most
``FORWARD_TRIES`` times within one lease TTL + margin (``retry_window_s``): but
only a request safe to send twice (reads, producer appends: ``forward.idempotent``)
or one that never left this node (the connection was refused). A plain write
the old owner may have seen is never resent: its 503 goes to the client,
whose retry decides.

Requests without a shard key (health, readiness, ``/metrics``) are the node's own.

A catch-up read of a stream owned elsewhere may be answered here from the
object store, with cold locators the owner gave (``tiered/cluster/gateway/cold_reads.py``).

A bucket create or erase goes to every shard (each engine must know the
bucket before it accepts streams in it): the node the client reached sends
one sub-request per shard, targeted with ``Tiered-Shard``, and answers with
the bucket's well-known shard's answer once every shard said yes (the first
refusal otherwise; creating is idempotent, so a retry completes it). So do
a bucket's quotas, access and retention (``PUT``): every shard enforces them.

Listings, a bucket's description and usage, and GC runs are answered by
every shard at once (``Tiered-Shard`` sub-requests, concurrently) and merged
into a single server's body (``tiered/cluster/gateway/scatter.py``).

Issued tokens (``/v1/admin/tokens...``) are served by this node: minted here,
installed on every shard (``tiered/cluster/features/token_install.py``).

Node signatures (``tiered/cluster/membership/secret.py``): a request that carries one is
verified before its shard's engine sees it (401 if it is not valid), and the
engine serves it as a node's call (``tiered.engine.auth.node_call``). Sub-requests
of a fan-out or scatter to shards other than the bucket's well-known one are
signed ``uncounted``: the client's request is counted once, in that shard.

Errors: a client's request routed to one shard lets its engine's errors
through, to the node's one error mapping (``tiered.api.kit.errors.map_errors``
in ``tiered/cluster/handler.py``); a sub-request (``send``: fan-out, scatter,
the features' own calls) gets the engine's refusal as a response, as it would
from another node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from tiered.api.kit.errors import map_errors
from tiered.api.kit.target import Target
from tiered.api.kit.types import UNMATCHED, Handler, Request, Response, json_response
from tiered.cluster.gateway.cold_reads import CatchupReads
from tiered.cluster.gateway.forward import (
    FORWARDED_BY,
    REDIRECT_HEADER,
    Forwarder,
    ForwardFailed,
    idempotent,
    moved_away,
    unix_socket_of,
)
from tiered.cluster.gateway.routing import fanout_bucket, is_write, shard_key
from tiered.cluster.gateway.scatter import Answer, ScatterPlan, plan_of, refusal
from tiered.cluster.gateway.subrequest import TARGET_SHARD, shard_request
from tiered.cluster.membership.secret import SIGNATURE_HEADER, NodeSigner, target_of
from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.auth.credentials import invalid_credential
from tiered.engine.auth.node_call import UNCOUNTED, NodeCall, node_call
from tiered.engine.engine import Engine

__all__ = ["FORWARD_TRIES", "Feeds", "ShardRouter", "ShardView", "TokenRoutes"]

#: Sends of one forwarded request at most (the first one included), after ownership changes.
FORWARD_TRIES = 3
_RESOLVE_POLL_S = 0.05


class ShardView(Protocol):
    """Where shards are served, as this node knows it now (``ClusterServer``)."""

    node_id: str
    clock: Clock

    def shard_of(self, bucket: str, name: str) -> int: ...

    def shard_count(self) -> int: ...

    def local_engine(self, shard: int) -> Engine | None:
        """The engine serving ``shard`` here, if this node may acknowledge in it now."""
        ...

    def owner_url(self, shard: int) -> tuple[str, str] | None: ...

    def check_acknowledge(self, shard: int) -> None:
        """Raise unless this node may still acknowledge a write in ``shard``."""
        ...

    async def durable(self, shard: int) -> None:
        """Object-store durability: wait until the shard's acknowledged writes are in a WAL object."""
        ...


class Feeds(Protocol):
    """The subscription feeds, where they sit on the request path (``tiered/cluster/features/sub_feed.py``)."""

    feed_path: str  # a shard's report, served by the subscriptions' shard
    sync_path: str  # "post now", served by the shard it names

    async def handle(
        self, shard: int, engine: Engine, request: Request, call: NodeCall | None
    ) -> Response: ...

    async def sync(self, shard: int, engine: Engine, request: Request, call: NodeCall | None) -> Response: ...

    def defines_links(self, method: str, path: str) -> bool: ...

    async def barrier(self) -> None: ...

    async def after_write(self, shard: int, engine: Engine, key: tuple[str, str] | None) -> None: ...


class TokenRoutes(Protocol):
    """Issued tokens, served by the node the client reached (``tiered/cluster/features/token_install.py``)."""

    def owns(self, path: str) -> bool: ...

    def label(self, path: str) -> str: ...

    async def serve(self, request: Request, path: str) -> Response: ...


class ShardRouter:
    def __init__(
        self,
        view: ShardView,
        forwarder: Forwarder,
        *,
        node_routes: Handler,
        engine_handler: Callable[[Engine], Handler],
        retry_window_s: float,
        object_store: bool = False,
        feeds: Feeds | None = None,
        tokens: TokenRoutes | None = None,
        catchup: CatchupReads | None = None,
        signer: NodeSigner | None = None,
        add_usage: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """``engine_handler(engine)``: one shard's engine chain (built once per engine);
        ``retry_window_s``: how long a forwarded request follows its shard (a lease TTL + margin);
        ``object_store``: writes are acknowledged once in a WAL object (``view.durable``);
        ``add_usage``: what a merged usage answer adds (catch-up reads other nodes served)."""
        self.view = view
        self.forwarder = forwarder
        self.node_routes = node_routes
        self.engine_handler = engine_handler
        self.retry_window_s = retry_window_s
        self.object_store = object_store
        self.feeds = feeds
        self.tokens = tokens
        self.catchup = catchup
        self.signer = signer
        self.add_usage = add_usage
        self._handlers: dict[int, tuple[Engine, Handler, Handler]] = {}  # shard -> (engine, raw, mapped)

    # -- a client's request ---------------------------------------------------------------

    async def route(self, request: Request) -> Response:
        parsed = request.target  # parsed once: the engine's access check and routes read this same value
        path = parsed.path
        target = request.headers.get(TARGET_SHARD)
        if self.feeds is not None and path == self.feeds.sync_path:
            return await self._feed_sync(request)
        if self.tokens is not None and self.tokens.owns(path):
            if target is None:
                request.route = self.tokens.label(path)  # served here: no engine's router names it
                return await self.tokens.serve(request, path)
            return await self.send(request, self._target(target))
        plan = plan_of(request)  # its row in the route table (``tiered.api.table``), classified once
        if plan is not None:
            if target is None:
                return await self._gather(request, plan, self._home(parsed))
            return await self.send(request, self._target(target))
        bucket = fanout_bucket(request)
        if bucket is not None:
            if target is None:
                return await self._fan_out(request, self.view.shard_of(bucket, ""))
            return await self.send(request, self._target(target))
        key = shard_key(parsed)
        if key is None:
            return await self.node_routes(request)
        return await self._to_shard(request, self.view.shard_of(*key), answer_errors=False)

    async def send(self, request: Request, shard: int) -> Response:
        """``request`` to ``shard``'s engine, here or on its owner; the engine's refusals come back as answers.

        What the features send through (forks, feeds, pins, tokens) and every sub-request.
        """
        return await self._to_shard(request, shard, answer_errors=True)

    # -- one shard ------------------------------------------------------------------------

    async def _to_shard(self, request: Request, shard: int, *, answer_errors: bool) -> Response:
        catchup = self.catchup
        if catchup is not None and self.view.local_engine(shard) is None:
            # A catch-up read below the cold frontier: answered here from the store (``cold_reads.py``).
            answer = await catchup.serve(request, shard, lambda sub: self._send_to_shard(sub, shard, True))
            if answer is not None:
                return answer
        return await self._send_to_shard(request, shard, answer_errors)

    async def _send_to_shard(self, request: Request, shard: int, answer_errors: bool) -> Response:
        clock = self.view.clock
        deadline = clock.monotonic() + self.retry_window_s
        retry_all = idempotent(request)
        tries = 0
        while True:
            tries += 1
            owner = await self._owner_or_local(shard)
            if owner is None:
                return await self._serve_here(request, shard, answer_errors)
            try:
                response = await self._forward_once(request, shard, owner)
            except ForwardFailed as failed:
                if tries >= FORWARD_TRIES or clock.monotonic() >= deadline:
                    raise
                if failed.sent and not retry_all:
                    raise
            else:
                if not (retry_all and moved_away(response)):
                    return response
                if tries >= FORWARD_TRIES or clock.monotonic() >= deadline:
                    return response
            await self._resolved_again(shard, owner, deadline)

    async def _owner_or_local(self, shard: int) -> tuple[str, str] | None:
        """The owner to forward to; None when this node serves ``shard`` now."""
        view = self.view
        if view.local_engine(shard) is not None:
            return None
        owner = view.owner_url(shard)
        if owner is None or owner[0] == view.node_id:
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard} has no serving owner right now (a takeover is in progress)",
                shard=shard,
                retry_after_s=1,
            )
        return owner

    async def _resolved_again(self, shard: int, failed: tuple[str, str], deadline: float) -> None:
        """Wait (bounded by ``deadline``) until this node's view names another owner than ``failed``."""
        view = self.view
        while view.clock.monotonic() < deadline:
            if view.local_engine(shard) is not None:
                return
            owner = view.owner_url(shard)
            if owner is not None and owner != failed and owner[0] != view.node_id:
                return
            await asyncio.sleep(_RESOLVE_POLL_S)

    async def _serve_here(self, request: Request, shard: int, answer_errors: bool) -> Response:
        view, feeds = self.view, self.feeds
        engine = view.local_engine(shard)
        if engine is None:  # lost between the check and now
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED, f"shard {shard} is not served here", shard=shard, retry_after_s=1
            )
        call = await self._verified(request)
        if feeds is not None and request.path == feeds.feed_path:
            return await feeds.handle(shard, engine, request, call)
        links = feeds is not None and feeds.defines_links(request.method, request.target.path)
        if feeds is not None and links:
            # Other shards' recent writes reported first: the subscription links them at their tails.
            await feeds.barrier()
        with node_call(call):
            response = await self._handler_of(shard, engine, answer_errors)(request)
        if feeds is not None and links and response.status < 300:
            await feeds.barrier()  # from now on, other shards' writes wait for their reports
        if is_write(request.method) and response.status < 300:
            if self.object_store:
                await view.durable(shard)
            view.check_acknowledge(shard)  # still ours: only now is the write acknowledged
            if feeds is not None:
                await feeds.after_write(shard, engine, shard_key(request.target))
        return response

    def _handler_of(self, shard: int, engine: Engine, answer_errors: bool) -> Handler:
        known = self._handlers.get(shard)
        if known is None or known[0] is not engine:
            raw = self.engine_handler(engine)
            known = self._handlers[shard] = (engine, raw, map_errors(raw))
        return known[2] if answer_errors else known[1]

    async def _verified(self, request: Request) -> NodeCall | None:
        """The node call a signed request is (401 if its signature is not valid); None: unsigned."""
        header = request.headers.get(SIGNATURE_HEADER)
        if header is None:
            return None
        if self.signer is None:
            raise invalid_credential("this node cannot verify node signatures yet")
        target = target_of(request.path, request.query_string)
        return self.signer.verify(
            header, request.method, target, request.headers.get(TARGET_SHARD) or "", await request.body()
        )

    async def _forward_once(self, request: Request, shard: int, owner: tuple[str, str]) -> Response:
        if request.headers.get(FORWARDED_BY):
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard} is not served by this node (forwarded here by a node with a stale view)",
                shard=shard,
                owner=owner[0],
                retry_after_s=1,
            )
        if (
            request.headers.get(REDIRECT_HEADER, "") == "307"
            and request.headers.get(TARGET_SHARD) is None
            and unix_socket_of(owner[1]) is None  # a sibling worker's socket is no place to send a client
        ):
            return self.forwarder.redirect(request, owner[1])
        return await self.forwarder.forward(request, owner[1], shard)

    async def _feed_sync(self, request: Request) -> Response:
        """A subscription feed sync (``Feeds.sync_path``) for the shard ``Tiered-Shard`` names."""
        assert self.feeds is not None
        shard = self._target(request.headers.get(TARGET_SHARD) or "")
        engine = self.view.local_engine(shard)
        if engine is None:
            return await self.send(request, shard)  # to its owner, which serves it as above
        return await self.feeds.sync(shard, engine, request, await self._verified(request))

    # -- every shard ----------------------------------------------------------------------

    def _target(self, target: str) -> int:
        if not target.isdigit() or int(target) >= self.view.shard_count():
            raise TieredError(ErrorCode.BAD_REQUEST, f"{TARGET_SHARD} must name a shard")
        return int(target)

    def _home(self, parsed: Target) -> int:
        """The shard that counts a fanned-out request in its bucket's usage: the bucket's well-known one."""
        key = shard_key(parsed)
        return self.view.shard_of(key[0] if key is not None else DEFAULT_BUCKET, "")

    def _sub(self, request: Request, shard: int, home: int, body: bytes) -> Request:
        """One shard's sub-request; signed ``uncounted`` but in the home shard (the client's counted once)."""
        marks = None if shard == home else frozenset({UNCOUNTED})
        return shard_request(request, shard, body, self.signer, marks)

    async def _gather(self, request: Request, plan: ScatterPlan, home: int) -> Response:
        """Ask every shard at once, then merge their answers into one (``tiered/cluster/gateway/scatter.py``)."""
        body = await request.body()
        shards = range(self.view.shard_count())
        subs = [self._sub(request, shard, home, body) for shard in shards]
        got = await asyncio.gather(
            *(self.send(sub, shard) for sub, shard in zip(subs, shards, strict=True)), return_exceptions=True
        )
        _label_from(request, subs)
        for outcome in got:
            if isinstance(outcome, BaseException):
                raise outcome
        responses = [r for r in got if isinstance(r, Response)]
        answers = [Answer(shard, r.status, _json(r)) for shard, r in zip(shards, responses, strict=True)]
        refused = refusal(answers, plan)
        if refused is not None:
            return responses[refused.shard]
        if any(a.body is None for a in answers):
            raise TieredError(
                ErrorCode.UNAVAILABLE, "a shard answered without a JSON body; retry", retry_after_s=1
            )
        status, merged = plan.merge(answers, lambda bucket: self.view.shard_of(bucket, ""))
        if plan.kind == "usage" and self.add_usage is not None and isinstance(merged, dict):
            merged = self.add_usage(merged)  # catch-up reads served by non-owners
        return json_response(merged, status, dict(plan.headers))

    async def _fan_out(self, request: Request, home: int) -> Response:
        body = await request.body()
        answers: dict[int, Response] = {}
        subs: list[Request] = []
        try:
            for shard in range(self.view.shard_count()):
                subs.append(sub := self._sub(request, shard, home, body))
                answers[shard] = answer = await self.send(sub, shard)
                if answer.status >= 300:
                    return answer
            return answers[home]
        finally:
            _label_from(request, subs)


def _json(response: Response) -> object | None:
    """A shard's answer body decoded, or None (a streamed or non-JSON body: not mergeable)."""
    if not isinstance(response.body, bytes):
        return None
    try:
        decoded: object = msgspec.json.decode(response.body)
    except msgspec.DecodeError:
        return None
    return decoded


def _label_from(request: Request, subs: list[Request]) -> None:
    """Label a request this node answered from its shards' answers as the engines' routers named it."""
    for sub in subs:
        if sub.route != UNMATCHED:
            request.route = sub.route
            return
