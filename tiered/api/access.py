"""What a request touches and what it needs: its bucket, the scope, the stream path, its usage class.

Derived from the request's row in the route table (``tiered.api.table``:
``route_of``, classified once) and its parsed target (``tiered.api.kit.target``):
the row says what kind of grant the route needs (its ``Scope``) and in which
usage class it counts; the target says on what: the decoded bucket, stream,
query (``live``) and fork source the routes serve, never raw strings. A target
that does not parse was refused (its 4xx) before this runs, so no spelling
reaches a route unchecked. The routes themselves know nothing of auth.

The table's rows, as the access check reads them:

| route | bucket | scope | usage class | public read |
| --- | --- | --- | --- | --- |
| ``GET/HEAD`` a stream (``live=`` or not) | the stream's | read | read, or live | yes |
| ``PUT`` a stream (a fork also needs read on its source) | the stream's | write | append | |
| ``POST`` a stream | the stream's | write | append | |
| ``DELETE`` a stream | the stream's | write | admin | |
| ``GET/HEAD /v1/buckets/{b}`` | b | read (any grant on b) | admin | yes |
| ``PUT /v1/buckets/{b}`` | b | admin, whole bucket | admin | |
| ``GET/HEAD`` a subscription, ``claim`` | default | read, whole bucket | admin | |
| ``PUT/DELETE`` a subscription, its ``streams`` | default | admin, whole bucket | admin | |
| a subscription's ``callback``, ``ack``, ``release`` | its own wake token (unchanged) | | | |
| ``GET`` a group, ``join``, ``heartbeat``, ``leave`` | the group's | read, whole bucket | admin | |
| ``PUT`` a group (the body's bucket), ``DELETE``, its ``streams`` | the group's | admin, whole bucket | admin | |
| ``GET /v1/buckets``, ``GET /v1/groups`` | any credential; the answer lists what it may see | | | |
| ``/v1/admin/...``, ``/metrics``, ``DELETE /v1/buckets/{b}`` | the operator's admin token | | | |
| ``/healthz``, ``/readyz``, the webhook JWKS, unknown routes | open | | | |

*Public read* (``PUT /v1/admin/access/{b}``) admits anyone, with or without a
credential, to what the last column marks: reading the bucket's streams
(catch-up and live; a fork's source counts as a read) and describing the
bucket. Nothing that changes state: a group's join, heartbeat (commits) and
leave, a subscription's claim and everything else still need a grant.

A node's signed *system* call (``tiered.engine.auth.node_call.SYSTEM``: a wake
event, a fork pin, the pin sweep) is the operator on the stream routes
(``system_may``) and nothing more: the bucket, subscription, group, admin,
token and metrics routes judge it as the request it otherwise is.

``missing`` is what the route answers when the thing does not exist, which is
exactly what a caller without a grant on the bucket gets (404), so bucket and
stream names do not leak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tiered.api.kit.target import StreamAddress, Target
from tiered.api.kit.types import Request
from tiered.api.table import Kind, Missing, Routed, RouteSpec, Where, route_of
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.core.parsing import decode_json
from tiered.engine.auth.credentials import Level

__all__ = [
    "ANY",
    "OPEN",
    "OPERATOR",
    "SELF",
    "Access",
    "AccessMap",
    "Kind",
    "fork_missing",
    "resolve",
    "system_may",
]


@dataclass(slots=True)
class Access:
    kind: Kind
    bucket: str | None = None
    level: Level = Level.READ
    stream: str | None = None  # the stream a stream route names (grants with a prefix must cover it)
    whole_bucket: bool = False  # reaches every stream of the bucket (only grants without a prefix)
    request_class: str | None = None  # usage: append, read, live, admin
    live: bool = False
    missing: Callable[[], TieredError] | None = None  # the route's own answer for "no such thing"
    fork: StreamAddress | None = None  # a fork's source (bucket, path): read is needed there too
    public: bool = False  # a public-read bucket admits it from anyone: a read that changes nothing


OPEN = Access(Kind.OPEN)
OPERATOR = Access(Kind.OPERATOR)
SELF = Access(Kind.SELF)
ANY = Access(Kind.ANY)


def _stream_missing() -> TieredError:
    return TieredError(ErrorCode.STREAM_NOT_FOUND, "stream not found")


def _bucket_missing(bucket: str) -> TieredError:
    return TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")


def _subscription_missing() -> TieredError:
    return TieredError(ErrorCode.SUBSCRIPTION_NOT_FOUND, "Subscription not found")


def fork_missing() -> TieredError:
    return TieredError(ErrorCode.FORK_SOURCE_NOT_FOUND, "fork source stream not found")


def system_may(access: Access) -> bool:
    """Whether a node's system call may act as the operator here: on a stream route, nowhere else."""
    return access.kind is Kind.BUCKET and access.stream is not None


_CONSTANT = {Kind.OPEN: OPEN, Kind.OPERATOR: OPERATOR, Kind.SELF: SELF, Kind.ANY: ANY}


class AccessMap:
    """Judges a request by its row in the route table (``route_of``) and its parsed target."""

    def __init__(self, group_bucket: Callable[[str], str | None]) -> None:
        self._group_bucket = group_bucket  # a group's bucket, None when there is no such group

    def classify(self, request: Request) -> Access:
        routed: Routed | None = request.routed
        return self.access((routed if routed is not None else route_of(request)).spec, request.target)

    def access(self, spec: RouteSpec, target: Target) -> Access:
        """What a request to ``target`` by the route ``spec`` touches and needs."""
        scope = spec.scope
        kind = scope.kind
        if kind is not _BUCKET:
            if kind is _BODY:
                return Access(Kind.BODY, request_class=spec.usage)
            return _CONSTANT[kind]
        where = scope.where
        if where is _TARGET:
            bucket = target.bucket
            assert bucket is not None
        elif where is _DEFAULT:
            bucket = DEFAULT_BUCKET
        else:
            name = target.name
            assert name is not None
            found = self._group_bucket(name)
            if found is None:
                return ANY  # no such group (or a body the route refuses): nothing to hide, the route answers
            bucket = found
        usage: str | None = spec.usage
        live = target.live is not None and usage == "read"
        missing = scope.missing
        return Access(
            _BUCKET,
            bucket,
            scope.level,
            target.stream if scope.stream else None,
            scope.whole_bucket,
            "live" if live else usage,
            live,
            _stream_missing if missing is _STREAM_MISSING else _missing(missing, bucket, target),
            target.fork,
            scope.public,
        )


# Enum members as module names: the access of every request is built from them.
_BUCKET, _BODY, _TARGET, _DEFAULT, _STREAM_MISSING = (
    Kind.BUCKET,
    Kind.BODY,
    Where.TARGET,
    Where.DEFAULT,
    Missing.STREAM,
)


def _missing(missing: Missing, bucket: str, target: Target) -> Callable[[], TieredError] | None:
    if missing is Missing.STREAM:
        return _stream_missing
    if missing is Missing.SUBSCRIPTION:
        return _subscription_missing
    if missing is Missing.BUCKET:
        return lambda: _bucket_missing(bucket)
    if missing is Missing.GROUP:
        name = target.name

        def group_missing() -> TieredError:
            return TieredError(ErrorCode.GROUP_NOT_FOUND, f"group {name!r} does not exist")

        return group_missing
    return None


async def resolve(request: Request, access: Access) -> Access:
    """A ``BODY`` access made concrete: the group creation's bucket, from its body.

    A body the route will refuse (not JSON, no object, a bucket that is not a
    string) has nothing to protect: ``ANY``, and the route answers 400.
    """
    raw = await request.body()  # kept: the route reads the same bytes
    try:
        body = decode_json(raw)
    except TieredError:
        return ANY
    bucket = body.get("bucket", DEFAULT_BUCKET) if isinstance(body, dict) else None
    if not isinstance(bucket, str):
        return ANY
    return Access(
        Kind.BUCKET,
        bucket,
        Level.ADMIN,
        whole_bucket=True,
        request_class=access.request_class,
        missing=lambda: _bucket_missing(bucket),
    )
