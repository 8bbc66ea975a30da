"""The route table (``tiered.api.table``): every row complete, and every layer reading one classification.

Every route is one ``RouteSpec``; the router, the access check, the usage
class and, in cluster mode, the shard key, the bucket-wide fan-out and the
scatter plan are derived from it. So for any request (drawn by the encoding
property tests' strategy, ``tests/api/test_http_target.py``, in any spelling, and
the edge cases of every family: trailing slashes, unknown actions, methods no
route serves):

* the request is classified exactly once, however many layers ask
  (auth, usage, the router, and cluster routing's questions after them);
* the router calls the handler bound to the request's row, or answers the
  row's 405 (``Allow``: the pattern's methods) or 404, and labels it as the row;
* the access check grants what the row's scope says, counted in its usage class;
* cluster routing keys it by the row's shard rule and fans it out as the row says;
* every spelling of one request takes the same row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.api.test_http_target import GROUPS, _Auth, shapes
from tests.support.encodings import Shape, canonical, spelled
from tiered.api import table
from tiered.api.access import Access, AccessMap
from tiered.api.kit.errors import map_errors
from tiered.api.kit.middleware.auth import auth_middleware
from tiered.api.kit.target import Family, Target
from tiered.api.kit.types import UNMATCHED, Handler, Request, Response
from tiered.api.routes.admin import AdminRoutes
from tiered.api.routes.auth import AuthRoutes
from tiered.api.routes.buckets import BucketRoutes
from tiered.api.routes.groups import GroupRoutes
from tiered.api.routes.streams import StreamRoutes
from tiered.api.routes.subscriptions import SubscriptionRoutes
from tiered.api.routes.tenants import TenantRoutes
from tiered.api.table import (
    ROUTES,
    SUBSCRIPTIONS_KEY,
    UNROUTED,
    Fanout,
    Features,
    Kind,
    Routed,
    RouteSpec,
    Scope,
    Shard,
    TableRouter,
    bind,
    route_of,
)
from tiered.cluster.gateway.routing import fanout_bucket, shard_key
from tiered.cluster.gateway.scatter import PLANS, plan_of
from tiered.cluster.gateway.subrequest import internal_request
from tiered.core.errors import TieredError
from tiered.core.ids import DEFAULT_BUCKET

METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH")
FEATURES = {f.name for f in dataclasses.fields(Features)}

# ----------------------------------------------------------------- every row complete


@pytest.mark.parametrize("spec", ROUTES, ids=lambda s: f"{' '.join(s.methods)} {s.pattern}")
def test_every_route_has_every_field(spec: RouteSpec) -> None:
    assert isinstance(spec.family, Family)
    assert spec.methods and all(m in (*METHODS, "*") for m in spec.methods)
    assert spec.methods == ("*",) or "*" not in spec.methods
    assert isinstance(spec.pattern, str) and spec.pattern.startswith("/")
    if spec.handler is None:  # the router's own answer: only for the methods no other row serves
        assert spec.methods == ("*",)
    else:
        feature, _, name = spec.handler.partition(".")
        assert feature in FEATURES and name, spec.handler
    assert isinstance(spec.scope, Scope) and isinstance(spec.scope.kind, Kind)
    assert spec.usage in ("append", "read", "admin", None)
    if spec.scope.kind is Kind.BUCKET:
        assert spec.usage is not None or spec.scope.stream, "counted in a usage class (or a stream's 405)"
    else:
        assert spec.usage is None or spec.scope.kind is Kind.BODY
    assert isinstance(spec.shard, Shard) and isinstance(spec.fanout, Fanout)
    assert (spec.fanout is Fanout.SCATTER) == (spec.scatter is not None)
    assert spec.scatter is None or spec.scatter in PLANS
    # A pattern of the table or an operation's name: never anything the client sent.
    assert spec.label in {r.pattern for r in ROUTES} or spec.label.isalpha(), spec.label


def test_every_pattern_answers_every_method_once() -> None:
    by_pattern: dict[str, list[RouteSpec]] = {}
    for spec in ROUTES:
        assert spec.pattern is not None
        by_pattern.setdefault(spec.pattern, []).append(spec)
    for pattern, rows in by_pattern.items():
        methods = [m for r in rows for m in r.methods]
        assert len(methods) == len(set(methods)), pattern
        assert methods.count("*") == 1, f"{pattern}: one * row judges and answers the other methods"
        assert len({r.family for r in rows}) == 1 and len({r.shard for r in rows}) == 1, pattern


def test_a_request_no_route_serves_has_a_spec_without_a_handler() -> None:
    for spec in UNROUTED:
        assert (spec.pattern, spec.handler, spec.label, spec.methods) == (None, None, UNMATCHED, ("*",))


def test_each_family_has_one_shard_rule() -> None:
    """A key from what the target names, never from the method: every request about a thing meets in its shard."""
    rules: dict[Family, set[Shard]] = {}
    for spec in (*ROUTES, *UNROUTED):
        rules.setdefault(spec.family, set()).add(spec.shard)
    assert all(len(r) == 1 for r in rules.values()), rules
    assert set(rules) == set(Family)


def test_fanouts() -> None:
    for spec in ROUTES:
        if spec.fanout is Fanout.BUCKET_WIDE:  # a bucket's create, erase and settings: every shard
            assert spec.methods in (("PUT",), ("DELETE",)) and spec.pattern is not None
            assert spec.pattern.endswith("/{bucket}"), spec.pattern
        if spec.fanout is Fanout.SCATTER:
            assert spec.methods in (("GET",), ("POST",)), spec
        if spec.shard is Shard.NODE:
            assert spec.fanout in (Fanout.NODE, Fanout.SCATTER), spec
    assert {s.scatter for s in ROUTES if s.scatter} == set(PLANS)  # every merge is some route's


class _Guard:
    def __init__(self) -> None:
        self.guarded: set[int] = set()

    def __call__(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            return await handler(request)

        self.guarded.add(id(guarded))
        return guarded


def features() -> Features:
    """Every feature's routes over no service: enough to bind (``__init__`` only keeps what it is given)."""
    none: Any = None
    return Features(
        streams=StreamRoutes(none, none, read_chunk_bytes=1, long_poll_timeout_s=1, sse_max_connection_s=1),
        subscriptions=SubscriptionRoutes(none),
        buckets=BucketRoutes(none),
        groups=GroupRoutes(none),
        admin=AdminRoutes(none, none, none, none, none),
        auth=AuthRoutes(none),
        tenants=TenantRoutes(none),
    )


def test_every_handler_binds_and_the_operators_routes_are_guarded() -> None:
    guard = _Guard()
    handlers = bind(features(), guard)
    assert set(handlers) == {s for s in ROUTES if s.handler is not None}
    for spec, handler in handlers.items():
        assert asyncio.iscoroutinefunction(handler), spec.handler
        assert (id(handler) in guard.guarded) == (spec.scope.kind is Kind.OPERATOR), spec.handler


# ----------------------------------------------------------------- every layer reads the table


class Layers:
    """A single engine's chain (auth with the operator, usage-free, the table's router) over recording handlers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.called: list[RouteSpec] = []
        handlers = {spec: self._recorder(spec) for spec in ROUTES if spec.handler is not None}
        self.router = TableRouter(handlers)
        self.chain = map_errors(auth_middleware(_Auth(), AccessMap(GROUPS.get))(self.router))  # type: ignore[arg-type]

    def _recorder(self, spec: RouteSpec) -> Handler:
        async def handler(request: Request) -> Response:
            self.called.append(spec)
            return Response(200)

        return handler

    def check(
        self, method: str, path: str, query: str = "", headers: dict[str, str] | None = None
    ) -> RouteSpec:
        """Send one request through every layer; assert each agrees with its row; return the row."""
        request = internal_request(
            method, path, {**(headers or {}), "Authorization": "Bearer operator"}, b"{}", query
        )
        try:
            target = request.target
        except TieredError:
            assume(False)  # refused before anything is classified (tests/api/test_http_target.py)
        self.called.clear()
        classify = table.classify
        with mock.patch.object(table, "classify", wraps=classify) as counted:
            response = self.loop.run_until_complete(self.chain(request))
            # What cluster routing asks of the same request afterwards.
            plan, key, wide = plan_of(request), shard_key(target), fanout_bucket(request)
        assert counted.call_count == 1, "classified once, whatever asks"
        routed = request.routed
        assert isinstance(routed, Routed) and route_of(request) is routed
        spec = routed.spec
        # As the table's patterns match it, within its family (the stream routes take a shortcut).
        found = table._BY_FAMILY[target.family].match(method, target.path)
        if found is not None and found[0] is not None:
            assert (spec, dict(routed.params)) == (found[0], found[1])
        else:
            assert spec in UNROUTED
        self._router(spec, request, response)
        self._access(spec, target, request.access)
        self._cluster(spec, method, target, plan, key, wide)
        return spec

    def _router(self, spec: RouteSpec, request: Request, response: Response) -> None:
        assert request.route == spec.label
        if spec.handler is not None:
            assert (response.status, self.called) == (200, [spec])
            return
        assert self.called == []
        code = json.loads(response.body)["error"]["code"]  # type: ignore[arg-type]
        if spec.pattern is None:
            assert (response.status, code) == (404, "NOT_FOUND")
        else:
            allowed = sorted(m for r in ROUTES if r.pattern == spec.pattern for m in r.methods if m != "*")
            assert (response.status, code, response.headers["Allow"]) == (
                405,
                "METHOD_NOT_ALLOWED",
                ", ".join(allowed),
            )

    def _access(self, spec: RouteSpec, target: Target, access: object) -> None:
        assert isinstance(access, Access)
        scope = spec.scope
        if scope.kind is Kind.BODY:  # resolved from the body ("{}": the default bucket)
            assert (access.kind, access.bucket, access.level) == (Kind.BUCKET, DEFAULT_BUCKET, scope.level)
            return
        if scope.kind is Kind.BUCKET and target.family is Family.GROUP and target.name not in GROUPS:
            assert access.kind is Kind.ANY  # no such group: the route answers
            return
        assert access.kind is scope.kind
        if scope.kind is not Kind.BUCKET:
            assert access.request_class is None
            return
        live = spec.usage == "read" and target.live is not None
        assert (access.level, access.whole_bucket, access.public, access.live) == (
            scope.level,
            scope.whole_bucket,
            scope.public,
            live,
        )
        assert access.request_class == ("live" if live else spec.usage)
        assert access.stream == (target.stream if scope.stream else None)
        assert access.missing is not None

    def _cluster(
        self, spec: RouteSpec, method: str, target: Target, plan: Any, key: Any, wide: str | None
    ) -> None:
        expected = {
            Shard.NAMED: None if target.bucket is None else (target.bucket, target.stream or ""),
            Shard.GROUP: (DEFAULT_BUCKET, f"__groups/{target.name}"),
            Shard.SUBSCRIPTIONS: SUBSCRIPTIONS_KEY,
            Shard.NODE: None,
        }[spec.shard]
        assert key == expected
        serves = method in spec.methods  # a HEAD served as GET is not scattered
        assert plan is (PLANS[spec.scatter] if spec.scatter is not None and serves else None)
        assert wide == (target.bucket if spec.fanout is Fanout.BUCKET_WIDE and serves else None)
        if spec.fanout is Fanout.NODE:
            assert key is None
        if spec.fanout is Fanout.SHARD and spec.pattern is not None:
            assert key is not None


@pytest.fixture(scope="module")
def layers() -> Iterator[Layers]:
    checked = Layers()
    yield checked
    checked.loop.close()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes(), data=st.data())
def test_router_access_and_cluster_routing_agree_with_the_table(
    layers: Layers, shape: Shape, data: st.DataObject
) -> None:
    plain = canonical(shape)
    spec = layers.check(shape.method, plain.path, plain.query, plain.headers)
    other = data.draw(spelled(shape), label="spelling")
    assert layers.check(shape.method, other.path, other.query, other.headers) is spec


EDGES = [
    "/v1/stream/a",
    "/v1/buckets/acme/stream/a%2Fb",
    "/v1/stream/__ds",
    "/v1/stream/__ds/",
    "/v1/stream/__ds/jwks.json",
    "/v1/stream/__ds/jwks.json/x",
    "/v1/stream/__ds/subscriptions",
    "/v1/stream/__ds/subscriptions/s1/",
    "/v1/stream/__ds/subscriptions/s1/streams/",
    "/v1/stream/__ds/subscriptions/s1/streams%2Fx",
    "/v1/stream/__ds/subscriptions/s1/claim/x",
    "/v1/stream/__ds/subscriptions/s1/callback/",
    "/v1/stream/__ds/_cluster/feed",
    "/v1/buckets",
    "/v1/buckets/acme",
    "/v1/groups",
    "/v1/groups/g-acme",
    "/v1/groups/ghost",
    "/v1/groups/g-acme/",
    "/v1/groups/g-acme//x",
    "/v1/groups/g-acme/join/x",
    "/v1/groups/g-acme/streams/",
    "/v1/groups/g-acme/bogus",
    "/v1/admin",
    "/v1/admin/nothing",
    "/v1/admin/gc",
    "/v1/admin/usage",
    "/v1/admin/tokens/t1/rotate",
    "/v1/admin/retention/acme/",
    "/v1/admin/retain/acme",
    "/v1/admin/quotas/acme/x",
    "/metrics",
    "/metrics/x",
    "/healthz",
    "/",
]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("path", EDGES)
def test_edges_of_every_family_agree_with_the_table(layers: Layers, method: str, path: str) -> None:
    layers.check(method, path)
