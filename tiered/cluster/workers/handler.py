"""A worker's HTTP handler: the cluster node's, with ``/metrics`` answered for the whole node.

Shard routing, forwarding to the sibling that serves a shard, fan-out and
scatter are the cluster's (``tiered/cluster/compose.py``); only the scrape
differs: ``metrics.py`` gathers every worker's families.

A request a sibling forwards in a frame (``tiered/cluster/gateway/forward_serve.py``)
takes ``build_forwarded_handler``: shard routing behind the error mapping only.
The sibling the client reached already gave it its request id, answers the
CORS preflight, adds the security headers and counts and logs it, once.
"""

from __future__ import annotations

from tiered.api.app import access_log
from tiered.api.kit.errors import map_errors
from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.middleware.cors import cors_preflight
from tiered.api.kit.middleware.request_id import request_ids
from tiered.api.kit.middleware.security_headers import security_headers
from tiered.api.kit.types import Handler, Request, Response
from tiered.api.routes.admin import METRICS_CONTENT_TYPE
from tiered.cluster.server import ClusterServer
from tiered.cluster.workers.metrics import LOCAL_ONLY, merge_workers, scrape_siblings

__all__ = ["build_forwarded_handler", "build_worker_handler", "siblings"]


def siblings(cluster: ClusterServer) -> dict[str, str]:
    """The other live workers and their advertised (Unix socket) URLs, as this worker last read them."""
    node = cluster.node
    if node is None:
        return {}
    now = cluster.clock.monotonic()
    out: dict[str, str] = {}
    for name in node.view.live_nodes(now):
        record = node.view.record(name)
        if name != cluster.node_id and record is not None and record.body.advertise_url:
            out[name] = record.body.advertise_url
    return out


def build_worker_handler(cluster: ClusterServer) -> Handler:
    """``build_cluster_handler``'s chain, with the node-wide ``/metrics`` in front of shard routing."""
    features = cluster.features
    route = features.router.route

    async def exposition(request: Request) -> Response:
        own = features.metrics.exposition()
        if request.headers.get(LOCAL_ONLY):
            return Response(200, {"Content-Type": METRICS_CONTENT_TYPE}, own)
        answers = await scrape_siblings(cluster.forwarder, siblings(cluster), request.headers)
        answers[cluster.node_id] = own
        return Response(200, {"Content-Type": METRICS_CONTENT_TYPE}, merge_workers(answers))

    guarded = AdminGuard.from_config(cluster.config)(exposition)

    async def worker_route(request: Request) -> Response:
        if request.path == "/metrics" and request.method == "GET":
            return await guarded(request)
        return await route(request)

    return request_ids(
        security_headers(cors_preflight(map_errors(worker_route))),
        metrics=features.metrics.requests,
        access_log=access_log(cluster.config, cluster.clock.monotonic),
    )


def build_forwarded_handler(cluster: ClusterServer) -> Handler:
    """What serves a request a sibling forwarded in a frame: shard routing, errors mapped to answers."""
    return map_errors(cluster.features.router.route)
