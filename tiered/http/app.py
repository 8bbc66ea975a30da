"""The service's HTTP handler: every route, behind one chain of middleware.

Order of routes (first match wins): the reserved subscription APIs
(``/v1/stream/__ds``) before streams, then buckets, groups, admin and
operations. Middleware, outermost first: request ids (for every log line and
response; it also hands each answer to the request metrics), security headers
(on every response), CORS preflight (open, no credentials), error mapping,
auth (who may do what: ``tiered.http.auth``), usage (each admitted request
counted in its bucket, live readers held to their quota).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.admin.http import AdminRoutes
from tiered.auth.http import AuthRoutes
from tiered.buckets.http import BucketRoutes
from tiered.groups.http import GroupRoutes
from tiered.streams.http import StreamRoutes
from tiered.subscriptions.http import SubscriptionRoutes
from tiered.tenants.http import TenantRoutes

from .access import AccessMap
from .admin_auth import AdminGuard
from .auth import auth_middleware
from .cors import cors_preflight
from .errors import map_errors
from .request_id import request_ids
from .router import Router
from .security_headers import security_headers
from .types import Handler
from .usage import usage_middleware

if TYPE_CHECKING:
    from tiered.node import Node


def build_handler(node: Node) -> Handler:
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
        node.metrics.exposition,
        lambda: node.journal.failed is None,
    ).install(router)
    AuthRoutes(node.auth, guard).install(router)
    TenantRoutes(node.tenants, guard).install(router)
    groups = node.groups.groups
    access = AccessMap(lambda name: g.spec.bucket if (g := groups.groups.get(name)) is not None else None)
    buckets = node.state.buckets
    counted = usage_middleware(node.tenants.counter, node.gate, buckets.__contains__)(router)
    chain = security_headers(cors_preflight(map_errors(auth_middleware(node.auth, access)(counted))))
    node.metrics.label_unrouted = router.label  # auth refusals never reach the router
    return request_ids(chain, on_answer=node.metrics.count_answer)
