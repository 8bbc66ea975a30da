"""The service's HTTP handler: every route, behind one chain of middleware.

Order of routes (first match wins): the reserved subscription APIs
(``/v1/stream/__ds``) before streams, then buckets, groups, admin and
operations. Middleware, outermost first: request ids (for every log line and
response; it also hands each answer to the request metrics), security headers
(on every response), CORS preflight, error mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.admin.http import AdminRoutes
from tiered.buckets.http import BucketRoutes
from tiered.groups.http import GroupRoutes
from tiered.streams.http import StreamRoutes
from tiered.subscriptions.http import SubscriptionRoutes

from .admin_auth import AdminGuard
from .cors import cors_preflight
from .errors import map_errors
from .request_id import request_ids
from .router import Router
from .security_headers import security_headers
from .types import Handler

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
    chain = security_headers(cors_preflight(map_errors(router)))
    return request_ids(chain, on_answer=node.metrics.count_answer)
