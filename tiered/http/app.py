"""The service's HTTP handler: every route, behind one chain of middleware.

Order of routes (first match wins): the reserved subscription APIs
(``/v1/stream/__ds``) before streams, then buckets, groups, admin and
operations. Middleware, outermost first: security headers (on every
response), CORS preflight, error mapping; in cluster mode then shard routing
(``shard_routing.py``: each request to its shard's engine, here or forwarded
to the shard's owner), in front of one router per served shard's engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.admin.http import AdminRoutes
from tiered.admin.metrics import render_metrics
from tiered.buckets.http import BucketRoutes
from tiered.groups.http import GroupRoutes
from tiered.streams.http import StreamRoutes
from tiered.subscriptions.http import SubscriptionRoutes

from .admin_auth import AdminGuard
from .cors import cors_preflight
from .errors import map_errors
from .router import Router
from .security_headers import security_headers
from .shard_routing import shard_routing
from .types import Handler, Request, Response, json_response

if TYPE_CHECKING:
    from tiered.cluster.server import ClusterServer
    from tiered.node import Node


def build_handler(node: Node) -> Handler:
    return security_headers(cors_preflight(map_errors(build_router(node))))


def build_cluster_handler(cluster: ClusterServer) -> Handler:
    """Cluster mode: the same middleware around shard routing; one router per served shard's engine."""
    node_router = Router()

    async def health(request: Request) -> Response:
        # 503 until the node joined and took its first shards, so start-up scripts wait for that.
        return json_response(
            {"ok": cluster.started, "node": cluster.node_id}, 200 if cluster.started else 503
        )

    async def ready(request: Request) -> Response:
        ok, checks = cluster.readiness()
        return json_response({"ready": ok, "checks": checks}, 200 if ok else 503)

    node_router.add("GET", "/healthz", health)
    node_router.add("GET", "/readyz", ready)
    return security_headers(
        cors_preflight(map_errors(shard_routing(cluster, build_router, cluster.forwarder, node_router)))
    )


def build_router(node: Node) -> Router:
    """Every route of one engine (a single server, or one shard's engine in cluster mode)."""
    c = node.config
    guard = AdminGuard(c.admin_token(), loopback_only=c.loopback_only)
    router = Router()
    SubscriptionRoutes(node.subscriptions).install(router)
    StreamRoutes(
        node.streams,
        node.clock,
        read_chunk_bytes=c.read_chunk_bytes,
        long_poll_timeout_s=c.long_poll_timeout_s,
        sse_max_connection_s=c.sse_max_connection_s,
    ).install(router)
    BucketRoutes(node.streams, guard).install(router)
    GroupRoutes(node.groups).install(router)
    AdminRoutes(
        node.streams,
        node.gc,
        guard,
        node.readiness,
        lambda: render_metrics(node),
        lambda: node.journal.failed is None,
    ).install(router)
    return router
