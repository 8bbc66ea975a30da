"""The service's HTTP handler: every route, behind one chain of middleware.

Routes: the route table (``tiered.api.table``), one row per route, classified
once per request; its router (``TableRouter``) serves each row's handler.
Middleware, outermost first: request ids (for every log line and
response; it also hands each answer, and each client that left, to the
request metrics and the access log), security headers
(on every response), CORS preflight (open, no credentials), error mapping,
auth (who may do what: ``tiered.api.kit.middleware.auth``), usage (each admitted request
counted in its bucket, live readers held to their quota).

In cluster mode (``build_cluster_handler``) shard routing
(``tiered/cluster/gateway/shard_routing.py``) comes after error mapping: each request goes to its
shard's engine, here (through that engine's auth and usage middleware and
router) or forwarded to the shard's owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.api.access import AccessMap
from tiered.api.kit.errors import map_errors
from tiered.api.kit.middleware.access_log import AccessLog
from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.middleware.auth import auth_middleware
from tiered.api.kit.middleware.cors import cors_preflight
from tiered.api.kit.middleware.request_id import request_ids
from tiered.api.kit.middleware.security_headers import security_headers
from tiered.api.kit.middleware.usage_count import usage_middleware
from tiered.api.kit.router import Router
from tiered.api.kit.types import Handler, Request, Response, json_response
from tiered.api.routes.admin import METRICS_CONTENT_TYPE, AdminRoutes
from tiered.api.routes.auth import AuthRoutes
from tiered.api.routes.buckets import BucketRoutes
from tiered.api.routes.groups import GroupRoutes
from tiered.api.routes.streams import StreamRoutes
from tiered.api.routes.subscriptions import SubscriptionRoutes
from tiered.api.routes.tenants import TenantRoutes
from tiered.api.table import Features, TableRouter, bind
from tiered.cluster.features.group_engine import STREAMS_ROUTE, serve_streams
from tiered.cluster.gateway.shard_routing import shard_routing
from tiered.cluster.node_metrics import ClusterMetrics
from tiered.engine.streams.locators import LOCATOR_SPAN_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable

    from tiered.cluster.server import ClusterServer
    from tiered.core.config import Config
    from tiered.engine.node import Node


def access_log(config: Config, monotonic: Callable[[], float]) -> AccessLog | None:
    """The configured access log (``--access-log``), or None when it is off."""
    return None if config.access_log == "off" else AccessLog(config.access_log, monotonic)


def build_handler(node: Node) -> Handler:
    chain = security_headers(cors_preflight(map_errors(_engine_chain(node))))
    return request_ids(chain, metrics=node.metrics, access_log=access_log(node.config, node.clock.monotonic))


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

    metrics = ClusterMetrics(cluster)
    guard = AdminGuard.from_config(cluster.config)

    async def exposition(request: Request) -> Response:
        return Response(200, {"Content-Type": METRICS_CONTENT_TYPE}, metrics.exposition())

    node_router.add("GET", "/healthz", health)
    node_router.add("GET", "/readyz", ready)

    async def shard_streams(request: Request) -> Response:
        return await serve_streams(cluster, request)

    node_router.add("GET", "/metrics", guard(exposition))
    node_router.add(
        "GET", STREAMS_ROUTE, shard_streams
    )  # nodes only: signed (tiered/cluster/membership/secret.py)
    routed = shard_routing(cluster, build_engine_handler, cluster.forwarder, node_router)
    return request_ids(
        security_headers(cors_preflight(map_errors(routed))),
        metrics=metrics,
        access_log=access_log(cluster.config, cluster.clock.monotonic),
    )


def build_router(node: Node) -> TableRouter:
    """Every route of one engine (a single server, or one shard's engine in cluster mode): the route table's.

    Each feature's handlers, bound to their rows of ``tiered.api.table``; the
    operator's routes behind the admin guard.
    """
    c = node.config
    features = Features(
        streams=StreamRoutes(
            node.streams,
            node.clock,
            read_chunk_bytes=c.read_chunk_bytes,
            long_poll_timeout_s=c.long_poll_timeout_s,
            sse_max_connection_s=c.sse_max_connection_s,
            locator_valid_ms=c.locator_valid_ms,
            locator_span_bytes=LOCATOR_SPAN_BYTES,
        ),
        subscriptions=SubscriptionRoutes(node.subscriptions),
        buckets=BucketRoutes(node.streams),
        groups=GroupRoutes(node.groups),
        admin=AdminRoutes(
            node.streams,
            node.gc,
            node.readiness,
            node.metrics.exposition,
            lambda: node.journal.failed is None,
        ),
        auth=AuthRoutes(node.auth),
        tenants=TenantRoutes(node.tenants),
    )
    return TableRouter(bind(features, AdminGuard.from_config(c)))


def _engine_chain(node: Node) -> Handler:
    """One engine's routes behind its auth and usage middleware."""
    router = build_router(node)
    groups = node.groups.groups
    access = AccessMap(lambda name: g.spec.bucket if (g := groups.groups.get(name)) is not None else None)
    buckets = node.state.buckets
    counted = usage_middleware(node.tenants.counter, node.gate, buckets.__contains__)(router)
    node.metrics.label_unrouted = router.label  # auth refusals never reach the router
    return auth_middleware(node.auth, access)(counted)


def build_engine_handler(node: Node) -> Handler:
    """Cluster mode: one shard's engine (errors mapped here too, so its metrics see the real status)."""
    return map_errors(_engine_chain(node))
