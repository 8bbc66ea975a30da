"""The service's HTTP handler: every route, behind one chain of middleware.

Routes: the route table (``tiered.api.table``), one row per route, classified
once per request; its router (``TableRouter``) serves each row's handler.
Middleware, outermost first: request ids (for every log line and
response; it also hands each answer, and each client that left, to the
request metrics and the access log), security headers
(on every response), CORS preflight (open, no credentials), error mapping,
auth (who may do what: ``tiered.api.kit.middleware.auth``), usage (each admitted request
counted in its bucket, live readers held to their quota).

A single server's appends (the table's append rows) take the fused path
(``tiered.api.append_path``): the same steps, each layer's own function, from
one coroutine; every other request takes the chain.

In cluster mode (``tiered/cluster/handler.py``) the same outer layers wrap
shard routing (``tiered/cluster/gateway/shard_router.py``), which hands each
request to its shard's engine chain (``engine_chain``: auth, usage, router),
here or on the shard's owner; errors are mapped once, by the outer layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.api.access import AccessMap
from tiered.api.append_path import AppendPath
from tiered.api.kit.errors import map_errors
from tiered.api.kit.middleware.access_log import AccessLog
from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.middleware.auth import auth_middleware
from tiered.api.kit.middleware.cors import cors_preflight
from tiered.api.kit.middleware.request_id import request_ids
from tiered.api.kit.middleware.security_headers import security_headers
from tiered.api.kit.middleware.usage_count import usage_middleware
from tiered.api.kit.request_metrics import RequestCounts
from tiered.api.kit.types import Handler
from tiered.api.routes.admin import AdminRoutes
from tiered.api.routes.auth import AuthRoutes
from tiered.api.routes.buckets import BucketRoutes
from tiered.api.routes.groups import GroupRoutes
from tiered.api.routes.snapshots import SnapshotRoutes
from tiered.api.routes.streams import StreamRoutes
from tiered.api.routes.subscriptions import SubscriptionRoutes
from tiered.api.routes.tenants import TenantRoutes
from tiered.api.table import Features, TableRouter, bind
from tiered.engine.streams.locators import LOCATOR_SPAN_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable

    from tiered.core.config import Config
    from tiered.engine.engine import Engine


def access_log(config: Config, monotonic: Callable[[], float]) -> AccessLog | None:
    """The configured access log (``--access-log``), or None when it is off."""
    return None if config.access_log == "off" else AccessLog(config.access_log, monotonic)


def build_handler(engine: Engine, *, fused: bool = True) -> Handler:
    """A single server: one engine's routes behind the whole chain; ``/metrics`` adds the request counts.

    ``fused``: appends take the fused path (``tiered.api.append_path``: the same steps in one frame);
    False serves them through the chain like every other request (what the fused path is tested against).
    """
    exposition_parts: list[Callable[[], bytes]] = [engine.metrics.exposition]

    def exposition() -> bytes:
        return b"".join(part() for part in exposition_parts)

    features = build_features(engine, exposition)
    router = TableRouter(bind(features, AdminGuard.from_config(engine.config)))
    counts = RequestCounts(router.label)  # auth refusals never reach the router: it labels them anyway
    exposition_parts.append(counts.exposition)
    access = _access_map(engine)
    chain = security_headers(cors_preflight(map_errors(_guarded(engine, router, access))))
    log = access_log(engine.config, engine.clock.monotonic)
    general = request_ids(chain, metrics=counts, access_log=log)
    if not fused:
        return general
    return AppendPath(
        general,
        features.streams,
        auth=engine.auth,
        access=access,
        counter=engine.tenants.counter,
        exists=engine.state.buckets.__contains__,
        metrics=counts,
        access_log=log,
    )


def build_router(engine: Engine, exposition: Callable[[], bytes]) -> TableRouter:
    """Every route of one engine (a single server, or one shard's engine in cluster mode): the route table's.

    Each feature's handlers, bound to their rows of ``tiered.api.table``; the
    operator's routes behind the admin guard.
    """
    return TableRouter(bind(build_features(engine, exposition), AdminGuard.from_config(engine.config)))


def build_features(engine: Engine, exposition: Callable[[], bytes]) -> Features:
    """One engine's route handlers, by feature (what the route table's rows bind)."""
    c = engine.config
    return Features(
        streams=StreamRoutes(
            engine.streams,
            engine.clock,
            read_chunk_bytes=c.read_chunk_bytes,
            long_poll_timeout_s=c.long_poll_timeout_s,
            sse_max_connection_s=c.sse_max_connection_s,
            locator_valid_ms=c.locator_valid_ms,
            locator_span_bytes=LOCATOR_SPAN_BYTES,
            snapshots=SnapshotRoutes(engine.snapshots),
            large=engine.large_bodies,
        ),
        subscriptions=SubscriptionRoutes(engine.subscriptions),
        buckets=BucketRoutes(engine.streams),
        groups=GroupRoutes(engine.groups),
        admin=AdminRoutes(
            engine.streams,
            engine.gc,
            engine.readiness,
            exposition,
            lambda: engine.journal.failed is None,
            snapshots=engine.snapshots,
        ),
        auth=AuthRoutes(engine.auth),
        tenants=TenantRoutes(engine.tenants),
    )


def engine_chain(engine: Engine) -> Handler:
    """Cluster mode: one shard's engine, its routes behind its auth and usage middleware (errors unmapped:
    the node's outer chain maps them, once)."""
    return _guarded(engine, build_router(engine, engine.metrics.exposition), _access_map(engine))


def _access_map(engine: Engine) -> AccessMap:
    """What a request to one engine touches and needs (a group's bucket from its groups)."""
    groups = engine.groups.groups
    return AccessMap(lambda name: g.spec.bucket if (g := groups.groups.get(name)) is not None else None)


def _guarded(engine: Engine, router: Handler, access: AccessMap) -> Handler:
    """One engine's routes behind its auth and usage middleware."""
    buckets = engine.state.buckets
    counted = usage_middleware(engine.tenants.counter, engine.gate, buckets.__contains__)(router)
    return auth_middleware(engine.auth, access)(counted)
