"""Middleware (cluster mode): send each request to the engine of its shard, here or on the owner.

A request with a shard key (``tiered/cluster/routing.py``) is served by this
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

Requests without a shard key (health, readiness) are the node's own.

A bucket create or erase goes to every shard (each engine must know the
bucket before it accepts streams in it): the node the client reached sends
one sub-request per shard, targeted with ``Tiered-Shard``, and answers with
the bucket's well-known shard's answer once every shard said yes (the first
refusal otherwise; creating is idempotent, so a retry completes it).
"""

from __future__ import annotations

from collections.abc import Callable

from tiered.cluster.forward import FORWARDED_BY, REDIRECT_HEADER, Forwarder
from tiered.cluster.routing import bucket_write, is_write, route_key
from tiered.cluster.server import ClusterServer
from tiered.errors import ErrorCode, TieredError
from tiered.node import Node

from .router import normalize_path
from .types import Handler, Request, Response

__all__ = ["TARGET_SHARD", "shard_routing"]

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

    def handler_of(shard: int, engine: Node) -> Handler:
        known = handlers.get(shard)
        if known is None or known[0] is not engine:
            known = handlers[shard] = (engine, engine_handler(engine))
        return known[1]

    async def route(request: Request) -> Response:
        path = normalize_path(request.path)
        key = route_key(path)
        if key is None:
            return await node_routes(request)
        bucket = bucket_write(request.method, path)
        if bucket is not None:
            target = request.headers.get(TARGET_SHARD)
            if target is None:
                return await fan_out(request, cluster.shard_of(bucket, ""))
            if not target.isdigit() or int(target) >= cluster.shard_count():
                raise TieredError(ErrorCode.BAD_REQUEST, f"{TARGET_SHARD} must name a shard")
            return await to_shard(request, int(target))
        return await to_shard(request, cluster.shard_of(*key))

    async def fan_out(request: Request, home: int) -> Response:
        body = await request.body()
        answers: dict[int, Response] = {}
        for shard in range(cluster.shard_count()):
            headers = {**dict(request.headers.items()), TARGET_SHARD: str(shard)}

            async def read(body: bytes = body) -> bytes:
                return body

            sub = Request(
                request.method,
                request.path,
                request.query_string,
                headers,
                read,
                scheme=request.scheme,
                host=request.host,
            )
            answers[shard] = answer = await to_shard(sub, shard)
            if answer.status >= 300:
                return answer
        return answers[home]

    async def to_shard(request: Request, shard: int) -> Response:
        engine = cluster.local_engine(shard)
        if engine is not None:
            response = await handler_of(shard, engine)(request)
            if is_write(request.method) and response.status < 300:
                if cluster.object_store:
                    await cluster.durable(shard)
                cluster.check_acknowledge(shard)  # still ours: only now is the write acknowledged
            return response
        owner = cluster.owner_url(shard)
        if owner is None or owner[0] == cluster.node_id:
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard} has no serving owner right now (a takeover is in progress)",
                shard=shard,
                retry_after_s=1,
            )
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

    return route
