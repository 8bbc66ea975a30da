"""Middleware (cluster mode): send each request to the engine of its shard, here or on the owner.

A request with a shard key (``tiered/cluster/gateway/routing.py``, from the request's
target parsed once: ``tiered.api.kit.target``) is served by this
node's engine for that shard when this node may acknowledge in it now; then,
for a write, the lease is checked again after the engine answered (and, in
object-store durability, after the write is in a WAL object): a node whose
window closed meanwhile (paused past its TTL, fenced) answers 503 with
``Retry-After`` instead of acknowledging. The write may have landed locally; a
client retry is answered by the shard's real owner (producer appends are
idempotent).

Otherwise the request goes to the shard's owner, as the lease advertises it:
proxied (the default: clients need not follow redirects), or a 307 when the
client asked for one with ``Tiered-Redirect: 307``. A request that was already
forwarded once is never forwarded again: 503, retry.

When the owner changed under a forwarded request (the owner answered 503
``SHARD_NOT_OWNED``/``SHARD_FENCED``, or could not be reached), the shard's
owner is resolved again and the request retried there, here included, at most
``FORWARD_TRIES`` times within one lease TTL + margin: but only a request safe
to send twice (reads, producer appends: ``forward.idempotent``) or one that
never left this node (the connection was refused). A plain write the old owner
may have seen is never resent: its 503 (``Retry-After``) goes to the client,
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
This node's own work on streams (wake events of the subscriptions' shard,
cross-shard fork pins, the pin sweep) is signed ``system``
(``tiered.engine.auth.node_call.SYSTEM``): no admin token needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.target import Target
from tiered.api.kit.types import UNMATCHED, Handler, Request, Response, json_response
from tiered.cluster.features.bucket_totals import add_served
from tiered.cluster.features.bucket_totals_exchange import UsageExchange
from tiered.cluster.features.sub_feed import FEED_PATH, FEED_SYNC_PATH, SubscriptionFeeds, defines_links
from tiered.cluster.features.token_install import TOKENS_PATH, ClusterTokens, is_token_path
from tiered.cluster.features.xfork import CrossShardForks
from tiered.cluster.gateway.cold_reads import CatchupReads
from tiered.cluster.gateway.forward import (
    FORWARDED_BY,
    REDIRECT_HEADER,
    Forwarder,
    ForwardFailed,
    idempotent,
    moved_away,
)
from tiered.cluster.gateway.routing import fanout_bucket, is_write, shard_key
from tiered.cluster.gateway.scatter import Answer, ScatterPlan, plan_of, refusal
from tiered.cluster.gc.pin_sweep import PinSweeper
from tiered.cluster.membership.secret import SIGNATURE_HEADER, NodeSigner, target_of
from tiered.cluster.server import ClusterServer
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.auth.credentials import invalid_credential
from tiered.engine.auth.node_call import UNCOUNTED, NodeCall, node_call
from tiered.engine.node import Node

__all__ = ["FORWARD_TRIES", "TARGET_SHARD", "shard_routing"]

#: Sends of one forwarded request at most (the first one included), after ownership changes.
FORWARD_TRIES = 3
_RESOLVE_POLL_S = 0.05

#: On a bucket create or erase sent to one shard (the fan-out's sub-requests).
TARGET_SHARD = "Tiered-Shard"


def shard_routing(
    cluster: ClusterServer,
    engine_handler: Callable[[Node], Handler],
    forwarder: Forwarder,
    node_routes: Handler,
) -> Handler:
    """``engine_handler(engine)`` is the router of one shard's engine (built once per engine)."""
    handlers: dict[int, tuple[Node, Handler]] = {}

    def sign(method: str, target: str, shard: str, body: bytes, marks: frozenset[str]) -> str | None:
        """This node's signature of one of its own requests (``secret.py``); None: no secret read yet."""
        signer: NodeSigner | None = getattr(cluster, "signer", None)  # stand-in views have none
        return signer.header(method, target, shard, body, marks) if signer is not None else None

    # Streams of every shard feed the subscriptions' shard (``tiered.cluster.features.sub_feed``).
    feeds = SubscriptionFeeds(cluster.shard_count, cluster.shard_of, cluster.config.auth not in ("", "none"))
    cluster.side_jobs.append(lambda stop: feeds.run(cluster.host.engines.copy, stop))
    # Pins of cross-shard forks whose fork is gone are deleted (``tiered.cluster.gc.pin_sweep``).
    pins = PinSweeper(cluster.host.engines.copy, cluster.shard_of, cluster.config)
    cluster.side_jobs.append(pins.run)
    feeds.sign = pins.sign = sign

    def handler_of(shard: int, engine: Node) -> Handler:
        known = handlers.get(shard)
        if known is None or known[0] is not engine:
            known = handlers[shard] = (engine, engine_handler(engine))
            # Forks of streams in other shards: pinned and copied through this routing (``xfork``).
            engine.streams.remote_forks = CrossShardForks(shard, cluster.shard_count, to_shard, sign)
        return known[1]

    async def route(request: Request) -> Response:
        parsed = request.target  # parsed once: the engine's access check and routes read this same value
        path = parsed.path
        if path == FEED_SYNC_PATH:
            return await feed_sync(request)
        if is_token_path(path):
            target = request.headers.get(TARGET_SHARD)
            if target is None:
                request.route = token_route_label(path)  # served here: no engine's router names it
                return await token_routes.serve(request, path)
            return await to_shard(request, _target(target))
        plan = plan_of(request)  # its row in the route table (``tiered.api.table``), classified once
        if plan is not None:
            target = request.headers.get(TARGET_SHARD)
            if target is None:
                return await gather(request, plan, _home(parsed))
            return await to_shard(request, _target(target))
        key = shard_key(parsed)
        bucket = fanout_bucket(request)
        if bucket is not None:
            target = request.headers.get(TARGET_SHARD)
            if target is None:
                return await fan_out(request, cluster.shard_of(bucket, ""))
            return await to_shard(request, _target(target))
        if key is None:
            return await node_routes(request)
        return await to_shard(request, cluster.shard_of(*key))

    async def feed_sync(request: Request) -> Response:
        """A subscription feed sync (``sub_feed.FEED_SYNC_PATH``) for the shard ``Tiered-Shard`` names."""
        shard = _target(request.headers.get(TARGET_SHARD) or "")
        engine = cluster.local_engine(shard)
        if engine is None:
            return await to_shard(request, shard)  # to its owner, which serves it as above
        return await feeds.sync(shard, engine, request, await _verified(request))

    def _target(target: str) -> int:
        if not target.isdigit() or int(target) >= cluster.shard_count():
            raise TieredError(ErrorCode.BAD_REQUEST, f"{TARGET_SHARD} must name a shard")
        return int(target)

    def _home(parsed: Target) -> int:
        """The shard that counts a fanned-out request in its bucket's usage: the bucket's well-known one."""
        key = shard_key(parsed)
        return cluster.shard_of(key[0] if key is not None else DEFAULT_BUCKET, "")

    def _sub(
        request: Request,
        shard: int,
        body: bytes,
        marks: frozenset[str] | None = None,
        *,
        method: str | None = None,
        path: str | None = None,
    ) -> Request:
        """``request`` aimed at one shard's engine (``Tiered-Shard``), with its body already read.

        ``marks`` not None: signed by this node with those marks (``secret.py``).
        ``method``/``path`` (no query then): another request on the client's behalf, with its headers.
        """
        headers = _Headers({k.lower(): v for k, v in request.headers.items()})
        headers.pop(SIGNATURE_HEADER.lower(), None)
        headers[TARGET_SHARD.lower()] = str(shard)
        method = method or request.method
        query = request.query_string if path is None or path == request.path else ""
        path = path or request.path
        signer: NodeSigner | None = getattr(cluster, "signer", None)  # stand-in views have none
        if marks is not None and signer is not None:
            headers[SIGNATURE_HEADER.lower()] = signer.header(
                method, target_of(path, query), str(shard), body, marks
            )

        async def read() -> bytes:
            return body

        return Request(method, path, query, headers, read, scheme=request.scheme, host=request.host)

    def _token_sub(
        request: Request, shard: int, method: str, path: str, body: bytes, signed: bool
    ) -> Request:
        return _sub(request, shard, body, frozenset() if signed else None, method=method, path=path)

    token_routes = ClusterTokens(
        cluster,
        lambda: AdminGuard.from_config(cluster.config),
        _token_sub,
        lambda sub, shard: to_shard(sub, shard),
    )

    def _marks(shard: int, home: int) -> frozenset[str] | None:
        return None if shard == home else frozenset({UNCOUNTED})

    async def gather(request: Request, plan: ScatterPlan, home: int) -> Response:
        """Ask every shard at once, then merge their answers into one (``tiered/cluster/gateway/scatter.py``)."""
        body = await request.body()
        shards = range(cluster.shard_count())
        subs = [_sub(request, shard, body, _marks(shard, home)) for shard in shards]
        got = await asyncio.gather(
            *(to_shard(sub, shard) for sub, shard in zip(subs, shards, strict=True)), return_exceptions=True
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
        status, merged = plan.merge(answers, lambda bucket: cluster.shard_of(bucket, ""))
        usage: UsageExchange | None = getattr(cluster, "usage", None)
        if plan.kind == "usage" and usage is not None and isinstance(merged, dict):
            merged = add_served(merged, usage.served_totals())  # catch-up reads served by non-owners
        return json_response(merged, status, dict(plan.headers))

    async def fan_out(request: Request, home: int) -> Response:
        body = await request.body()
        answers: dict[int, Response] = {}
        subs: list[Request] = []
        try:
            for shard in range(cluster.shard_count()):
                subs.append(sub := _sub(request, shard, body, _marks(shard, home)))
                answers[shard] = answer = await to_shard(sub, shard)
                if answer.status >= 300:
                    return answer
            return answers[home]
        finally:
            _label_from(request, subs)

    async def to_shard(request: Request, shard: int) -> Response:
        catchup: CatchupReads | None = getattr(cluster, "catchup", None)  # stand-in views have none
        if catchup is not None and cluster.local_engine(shard) is None:
            # A catch-up read below the cold frontier: answered here from the store (``cold_reads.py``).
            answer = await catchup.serve(request, shard, lambda sub: send_to_shard(sub, shard))
            if answer is not None:
                return answer
        return await send_to_shard(request, shard)

    async def send_to_shard(request: Request, shard: int) -> Response:
        clock = cluster.clock
        config = cluster.config
        deadline = clock.monotonic() + config.cluster_lease_ttl_s + config.lease_margin_s
        retry_all = idempotent(request)
        tries = 0
        while True:
            tries += 1
            owner = await _owner_or_local(shard)
            if owner is None:
                return await serve_here(request, shard)
            try:
                response = await forward_once(request, shard, owner)
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
            await _resolved_again(shard, owner, deadline)

    async def _owner_or_local(shard: int) -> tuple[str, str] | None:
        """The owner to forward to; None when this node serves ``shard`` now."""
        if cluster.local_engine(shard) is not None:
            return None
        owner = cluster.owner_url(shard)
        if owner is None or owner[0] == cluster.node_id:
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard} has no serving owner right now (a takeover is in progress)",
                shard=shard,
                retry_after_s=1,
            )
        return owner

    async def _resolved_again(shard: int, failed: tuple[str, str], deadline: float) -> None:
        """Wait (bounded by ``deadline``) until this node's view names another owner than ``failed``."""
        clock = cluster.clock
        while clock.monotonic() < deadline:
            if cluster.local_engine(shard) is not None:
                return
            owner = cluster.owner_url(shard)
            if owner is not None and owner != failed and owner[0] != cluster.node_id:
                return
            await asyncio.sleep(_RESOLVE_POLL_S)

    async def serve_here(request: Request, shard: int) -> Response:
        engine = cluster.local_engine(shard)
        if engine is None:  # lost between the check and now
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED, f"shard {shard} is not served here", shard=shard, retry_after_s=1
            )
        feeds.ensure(shard, engine)
        call = await _verified(request)
        if request.path == FEED_PATH:
            return await feeds.handle(shard, engine, request, call)
        links = defines_links(request.method, request.target.path)
        if links:
            # Other shards' recent writes reported first: the subscription links them at their tails.
            await feeds.barrier()
        with node_call(call):
            response = await handler_of(shard, engine)(request)
        if links and response.status < 300:
            await feeds.barrier()  # from now on, other shards' writes wait for their reports
        if is_write(request.method) and response.status < 300:
            if cluster.object_store:
                await cluster.durable(shard)
            cluster.check_acknowledge(shard)  # still ours: only now is the write acknowledged
            await feeds.after_write(shard, shard_key(request.target))
        return response

    async def _verified(request: Request) -> NodeCall | None:
        """The node call a signed request is (401 if its signature is not valid); None: unsigned."""
        header = request.headers.get(SIGNATURE_HEADER)
        if header is None:
            return None
        signer: NodeSigner | None = getattr(cluster, "signer", None)
        if signer is None:
            raise invalid_credential("this node cannot verify node signatures yet")
        target = target_of(request.path, request.query_string)
        return signer.verify(
            header, request.method, target, request.headers.get(TARGET_SHARD) or "", await request.body()
        )

    async def forward_once(request: Request, shard: int, owner: tuple[str, str]) -> Response:
        if request.headers.get(FORWARDED_BY):
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard} is not served by this node (forwarded here by a node with a stale view)",
                shard=shard,
                owner=owner[0],
                retry_after_s=1,
            )
        if request.headers.get(REDIRECT_HEADER, "") == "307" and request.headers.get(TARGET_SHARD) is None:
            return forwarder.redirect(request, owner[1])
        return await forwarder.forward(request, owner[1], shard)

    feeds.send = pins.send = to_shard
    return route


class _Headers(dict[str, str]):
    """A sub-request's headers: keys in lower case, looked up case-insensitively like a server's."""

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)


def _json(response: Response) -> object | None:
    """A shard's answer body decoded, or None (a streamed or non-JSON body: not mergeable)."""
    if not isinstance(response.body, bytes):
        return None
    try:
        decoded: object = msgspec.json.decode(response.body)
    except msgspec.DecodeError:
        return None
    return decoded


def token_route_label(path: str) -> str:
    """The metrics label of a token route this node serves itself (``tiered/cluster/features/token_install.py``)."""
    if path == TOKENS_PATH:
        return TOKENS_PATH
    return TOKENS_PATH + ("/{id}/rotate" if path.endswith("/rotate") else "/{id}")


def _label_from(request: Request, subs: list[Request]) -> None:
    """Label a request this node answered from its shards' answers as the engines' routers named it."""
    for sub in subs:
        if sub.route != UNMATCHED:
            request.route = sub.route
            return
