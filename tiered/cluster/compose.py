"""The cluster's features, built once with their dependencies, and what they plug into each shard's engine.

``ClusterFeatures`` is built by ``ClusterServer`` (``server.py``) once the
object store is open and the cluster secret read, before anything is served:

* the node's signer (``membership/secret.py``) and catch-up reads of other
  nodes' streams from the store (``gateway/cold_reads.py``);
* bucket totals (``features/bucket_totals_exchange.py``): every shard's usage,
  so quotas hold bucket-wide;
* the subscription feeds (``features/sub_feed.py``) and the token routes
  (``features/token_install.py``);
* the node's own routes (health, readiness, metrics, a shard's streams for
  other nodes' group coordinators) and its metrics (``node_metrics.py``);
* shard routing (``gateway/shard_router.py``), which every feature sends through.

``engine(shard, ...)`` builds a shard's engine with its ``EngineHooks``
(``tiered/engine/hooks.py``): cross-shard forks, the feeds' parts, the other
shards' usage for quotas, the group directory, and its GC tasks (fork pins,
and in object-store durability its WAL objects, whose shipper's loop is one of
its jobs). Nothing is set on a part afterwards.

The features send through routing and routing serves through the features'
parts (the feeds' write barrier, the token routes): ``send`` is this object's
method, and calls the router built last in the constructor.

``build_cluster_handler`` is the node's HTTP handler: the same outer
middleware as a single server's (request ids, security headers, CORS
preflight, the one error mapping) around shard routing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tiered.api.app import access_log, engine_chain
from tiered.api.kit.errors import map_errors
from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.middleware.cors import cors_preflight
from tiered.api.kit.middleware.request_id import request_ids
from tiered.api.kit.middleware.security_headers import security_headers
from tiered.api.kit.router import Router
from tiered.api.kit.types import Handler, Request, Response, json_response
from tiered.api.routes.admin import METRICS_CONTENT_TYPE
from tiered.cluster.features.bucket_totals import add_served
from tiered.cluster.features.bucket_totals_exchange import UsageExchange
from tiered.cluster.features.directory import Listing, ShardDirectory
from tiered.cluster.features.shard_streams import STREAMS_ROUTE, ask_shard, serve_streams
from tiered.cluster.features.sub_feed import SubscriptionFeeds
from tiered.cluster.features.token_install import ClusterTokens
from tiered.cluster.features.xfork import CrossShardForks
from tiered.cluster.gateway.cold_reads import CatchupReads
from tiered.cluster.gateway.forward import Forwarder
from tiered.cluster.gateway.shard_router import ShardRouter, ShardView
from tiered.cluster.gateway.subrequest import shard_request
from tiered.cluster.gc.pin_sweep import PinSweep
from tiered.cluster.gc.wal_gc import WalGarbage, wal_gc_period_s
from tiered.cluster.membership.cas import CasStore
from tiered.cluster.membership.secret import NodeSigner
from tiered.cluster.node_metrics import ClusterMetrics
from tiered.cluster.node_metrics import Source as MetricsSource
from tiered.cluster.shards.wal import WalShipper
from tiered.cold.objects.store import ObjectStore
from tiered.core.clock import Clock
from tiered.core.config import Config
from tiered.engine.engine import Engine
from tiered.engine.hooks import EngineHooks, EngineView, Extension
from tiered.gc.context import GcTask

__all__ = ["ClusterFeatures", "NodeView", "build_cluster_handler"]


class NodeView(ShardView, MetricsSource, Protocol):
    """What the features read of the node (``ClusterServer``): where shards are, and its own status."""

    config: Config
    started: bool

    def readiness(self) -> tuple[bool, dict[str, Any]]: ...

    def authenticate(self, header: str | None) -> None:
        """Raise (401) unless ``header`` is a credential valid now, as any served engine judges it."""
        ...


class ClusterFeatures:
    def __init__(
        self,
        view: NodeView,
        *,
        store: ObjectStore,
        cas: CasStore,
        signer: NodeSigner,
        forwarder: Forwarder,
    ) -> None:
        c, clock = view.config, view.clock
        self.view = view
        self.config = c
        self.clock: Clock = clock
        self.signer = signer
        self.forwarder = forwarder
        self.usage = UsageExchange(
            cas,
            view.node_id,
            clock,
            view.served_engines,
            lambda shard: view.local_engine(shard) is not None,
            interval_s=c.cluster_usage_interval_s,
        )
        self.catchup = CatchupReads(
            store,
            clock,
            view.node_id,
            max_valid_s=c.locator_valid_ms / 1000,
            cache_bytes=c.read_cache_bytes,
            read_timeout_s=c.cold_read_timeout_s,
            authenticate=view.authenticate,
            on_served=self.usage.count_served,  # the owner never sees these reads
        )
        self.feeds = SubscriptionFeeds(
            view.shard_count, view.shard_of, c.auth not in ("", "none"), self.send, self.sign
        )
        self.tokens = ClusterTokens(view, lambda: AdminGuard.from_config(c), self._token_request, self.send)
        self.metrics = ClusterMetrics(view, self.usage)
        self.router = ShardRouter(
            view,
            forwarder,
            node_routes=self._node_routes(),
            engine_handler=engine_chain,
            retry_window_s=c.cluster_lease_ttl_s + c.lease_margin_s,
            object_store=c.durability == "object-store",
            feeds=self.feeds,
            tokens=self.tokens,
            catchup=self.catchup,
            signer=signer,
            add_usage=lambda merged: add_served(merged, self.usage.served_totals()),
        )

    # -- what every feature sends through ----------------------------------------------

    async def send(self, request: Request, shard: int) -> Response:
        """A request to ``shard``'s engine, through shard routing (served here or forwarded)."""
        return await self.router.send(request, shard)

    def sign(self, method: str, target: str, shard: str, body: bytes, marks: frozenset[str]) -> str:
        """This node's signature of one of its own requests (``membership/secret.py``)."""
        return self.signer.header(method, target, shard, body, marks)

    def _token_request(
        self, request: Request, shard: int, method: str, path: str, body: bytes, signed: bool
    ) -> Request:
        marks = frozenset[str]() if signed else None
        return shard_request(request, shard, body, self.signer, marks, method=method, path=path)

    # -- each shard's engine -------------------------------------------------------------

    def engine(self, shard: int, config: Config, clock: Clock, shipper: WalShipper | None) -> Engine:
        """``shard``'s engine, with the cluster's hooks (``ShardHost``'s engine factory)."""
        return Engine(config, clock, hooks=self.hooks(shard, shipper))

    def hooks(self, shard: int, shipper: WalShipper | None = None) -> EngineHooks:
        view, c = self.view, self.config
        feed = self.feeds.hooks(shard)
        gc_tasks: list[GcTask] = [PinSweep(shard, view.shard_of, c, self.send, self.sign)]
        extensions = list(feed.extensions)
        if shipper is not None:
            gc_tasks.append(WalGarbage(shipper, wal_gc_period_s(shipper.interval_s, c.gc_grace_s)))
            extensions.append(_shipping(shipper))

        async def ask(other: int, bucket: str) -> Listing:
            return await ask_shard(view, self.forwarder, self.signer, other, bucket)

        return EngineHooks(
            remote_forks=CrossShardForks(shard, view.shard_count, self.send, self.sign),
            remote_streams=feed.remote_streams,
            remote_append=feed.remote_append,
            quota_others=self.usage.others_of(shard),
            stream_directory=ShardDirectory(shard, view.shard_count, ask, self.clock),
            gc_tasks=gc_tasks,
            extensions=extensions,
        )

    # -- the node's own routes -----------------------------------------------------------

    def _node_routes(self) -> Handler:
        """Requests without a shard key: health, readiness, ``/metrics``, a shard's streams (nodes only)."""
        view, metrics = self.view, self.metrics
        router = Router()

        async def health(request: Request) -> Response:
            # 503 until the node joined and took its first shards, so start-up scripts wait for that.
            return json_response({"ok": view.started, "node": view.node_id}, 200 if view.started else 503)

        async def ready(request: Request) -> Response:
            ok, checks = view.readiness()
            return json_response({"ready": ok, "checks": checks}, 200 if ok else 503)

        async def exposition(request: Request) -> Response:
            return Response(200, {"Content-Type": METRICS_CONTENT_TYPE}, metrics.exposition())

        async def shard_streams(request: Request) -> Response:
            return await serve_streams(view, self.signer, request)

        router.add("GET", "/healthz", health)
        router.add("GET", "/readyz", ready)
        router.add("GET", "/metrics", AdminGuard.from_config(self.config)(exposition))
        router.add("GET", STREAMS_ROUTE, shard_streams)  # nodes only: signed (``membership/secret.py``)
        return router


def _shipping(shipper: WalShipper) -> Callable[[EngineView], Extension]:
    """The shard's WAL shipper loop, as a job of its engine (it stops with the engine)."""

    def extension(view: EngineView) -> Extension:
        return Extension(jobs={"wal-shipper": shipper.run})

    return extension


class Handled(Protocol):
    config: Config
    clock: Clock
    features: ClusterFeatures


def build_cluster_handler(cluster: Handled) -> Handler:
    """A cluster node's handler: shard routing behind the outer middleware, errors mapped once."""
    features = cluster.features
    return request_ids(
        security_headers(cors_preflight(map_errors(features.router.route))),
        metrics=features.metrics.requests,
        access_log=access_log(cluster.config, cluster.clock.monotonic),
    )
