"""The append route's fused path: what the middleware chain does for an append, in one coroutine.

An append is the hottest request, and the general chain (``tiered.api.app``: request ids → security
headers → CORS → error mapping → auth → usage → the table's router → the stream routes' header
checks) gives it one coroutine frame per layer, each stepped through on every suspension (the body
read, the group commit's fsync). ``AppendPath`` serves the route table's append rows (the rows whose
handler is ``streams.serve_append``) with the very same steps, calling the same functions the layers
call, in the same order, from one frame:

1. the request id (``request_id_of``), the access log's clock;
2. the access the row's scope gives the target (``AccessMap.access``), the caller and the one scope
   check (``principal_of``, ``admit``), or with auth off the access alone;
3. usage (``count_request``);
4. what the router sets (normalized path, parameters, the row's label);
5. the stream routes' header checks (``check_stream_headers``), then ``StreamRoutes.append``;
6. a ``TieredError`` mapped (``error_response``), any other exception a logged 500
   (``internal_error``), ``ClientDisconnected`` passed on;
7. the security headers (``add_security_headers``), then the id echoed, the answer counted and logged
   (``answered``); a client that left is counted as the layer counts it (``client_left``).

Everything else (other methods, other rows, a target that does not parse: the general path answers
its 4xx) goes to the general chain unchanged. ``tests/api/test_append_path.py`` sends the same
requests through both and compares status, headers, bodies, metrics and usage, refusals included.

The rows it may serve are checked when it is built: a ``BUCKET`` scope (no body to resolve), not live
(no lease, no live-reader slot to hold). A table change that breaks that fails at start-up rather than
serving appends differently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from tiered.api.access import AccessMap
from tiered.api.kit.errors import ClientDisconnected, error_response, internal_error
from tiered.api.kit.middleware.access_log import AccessLog
from tiered.api.kit.middleware.auth import admit, principal_of
from tiered.api.kit.middleware.request_id import RequestMetrics, answered, client_left, request_id_of
from tiered.api.kit.middleware.security_headers import add_security_headers
from tiered.api.kit.middleware.usage_count import count_request
from tiered.api.kit.types import Handler, Request, Response
from tiered.api.routes.streams import StreamRoutes, check_stream_headers
from tiered.api.table import ROUTES, Kind, Routed, RouteSpec, route_of
from tiered.core.errors import TieredError
from tiered.engine.auth.service import AuthService
from tiered.engine.tenants.usage_counters import UsageCounter

__all__ = ["APPEND_HANDLER", "AppendPath", "append_rows"]

#: The route table's handler name of the rows this path serves.
APPEND_HANDLER = "streams.serve_append"


def append_rows(routes: tuple[RouteSpec, ...] = ROUTES) -> frozenset[RouteSpec]:
    """The table's append rows, checked to be what the fused path reproduces exactly."""
    rows = frozenset(spec for spec in routes if spec.handler == APPEND_HANDLER)
    for spec in rows:
        scope = spec.scope
        if scope.kind is not Kind.BUCKET or spec.usage == "read" or spec.methods != ("POST",):
            raise AssertionError(f"the fused append path cannot serve {spec.methods} {spec.pattern}")
    return rows


class AppendPath:
    """A handler: the append rows on the fused path, every other request through ``general``.

    Not a coroutine itself: a request that is not an append goes straight to ``general``'s coroutine.
    """

    def __init__(
        self,
        general: Handler,
        streams: StreamRoutes,
        *,
        auth: AuthService,
        access: AccessMap,
        counter: UsageCounter,
        exists: Callable[[str], bool],
        metrics: RequestMetrics | None,
        access_log: AccessLog | None,
    ) -> None:
        self.general = general
        self._append = streams.append
        self._auth = auth
        self._access = access
        self._counter = counter
        self._exists = exists
        self._metrics = metrics
        self._access_log = access_log
        self._monotonic = access_log.monotonic if access_log is not None else None
        self.rows = append_rows()

    def __call__(self, request: Request) -> Awaitable[Response]:
        if request.method == "POST":
            try:
                routed: Routed = route_of(request)
            except TieredError:
                return self.general(request)  # its 4xx, answered where every layer sees it
            spec, params = routed
            if spec in self.rows:
                return self._serve(request, spec, params)
        return self.general(request)

    async def _serve(self, request: Request, spec: RouteSpec, params: Mapping[str, str]) -> Response:
        request_id = request_id_of(request)
        monotonic = self._monotonic
        started = monotonic() if monotonic is not None else 0.0
        try:
            try:
                target = request.target
                access = self._access.access(spec, target)
                auth = self._auth
                if auth.enabled:
                    admit(auth, request, access, principal_of(auth, request, access))
                else:
                    request.access = access
                count_request(self._counter, self._exists, access)
                request.path = target.path  # what the router sets
                request.params = params
                request.route = spec.label
                check_stream_headers(request.headers)
                bucket, path = target.bucket, target.stream
                assert bucket is not None and path is not None
                response = await self._append(request, bucket, path)
            except TieredError as exc:
                response = error_response(exc)
            except ClientDisconnected:
                raise  # nobody to answer: counted below
            except Exception:
                response = internal_error(request)
            add_security_headers(response.headers)
        except (ClientDisconnected, asyncio.CancelledError):
            client_left(request, "request", started, self._metrics, self._access_log)
            raise
        return answered(request, response, request_id, started, self._metrics, self._access_log)
