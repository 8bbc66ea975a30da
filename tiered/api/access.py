"""What a request touches and what it needs: its bucket, the scope, the stream path, its usage class.

Judged from the request's parsed target (``request.target``, ``tiered.api.kit.target``):
the decoded bucket, stream, query (``live``) and fork source the routes serve,
never raw strings. A target that does not parse was refused (its 4xx) before
this runs, so no spelling reaches a route unchecked.

One table for every route (the routes themselves know nothing of auth):

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
from enum import Enum

from tiered.api.kit.target import Family, StreamAddress, Target
from tiered.api.kit.types import Request
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.core.parsing import decode_json
from tiered.engine.auth.credentials import Level

SELF_AUTHENTICATED = ("callback", "ack", "release")  # carry a subscription wake token
_SAFE = ("GET", "HEAD")


class Kind(Enum):
    OPEN = "open"  # anyone
    OPERATOR = "operator"  # the route checks the admin token itself
    SELF = "self"  # the route checks a token of its own (subscription wakes)
    ANY = "any"  # any valid credential; the answer shows only what it may see
    BUCKET = "bucket"  # a scope on a bucket
    BODY = "body"  # a scope on the bucket the body names (``resolve``, once the caller is known)


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


class AccessMap:
    """Classifies a request from its parsed target (``request.target``), never from raw strings."""

    def __init__(self, group_bucket: Callable[[str], str | None]) -> None:
        self._group_bucket = group_bucket

    def classify(self, request: Request) -> Access:
        target = request.target  # a target that does not parse is refused here, before any check
        family = target.family
        if family is Family.STREAM:
            return _stream(request.method, target)
        if family is Family.SUBSCRIPTION or family is Family.CONTROL:
            return _control(request.method, target)
        if family is Family.BUCKET:
            return _bucket(request.method, target)
        if family is Family.GROUP:
            return self._group(request.method, target)
        if family is Family.BUCKETS or family is Family.GROUPS:
            return ANY
        if family is Family.ADMIN or family is Family.METRICS:
            return OPERATOR
        return OPEN  # the JWKS, health, and no such route

    def _group(self, method: str, target: Target) -> Access:
        name, action = target.name, target.action
        assert name is not None
        if method == "PUT" and not action:
            # Creating a group: its bucket is in the body, read only for a caller that authenticated.
            return Access(Kind.BODY, request_class="admin")
        bucket = self._group_bucket(name)
        if bucket is None:
            return ANY  # no such group (or a body the route refuses): nothing to hide, the route answers
        reads = (method in _SAFE and not action) or action in ("join", "heartbeat", "leave")

        def missing() -> TieredError:
            return TieredError(ErrorCode.GROUP_NOT_FOUND, f"group {name!r} does not exist")

        return Access(
            Kind.BUCKET,
            bucket,
            Level.READ if reads else Level.ADMIN,
            whole_bucket=True,
            request_class="admin",
            missing=missing,
        )


def _stream(method: str, target: Target) -> Access:
    bucket, stream = target.bucket, target.stream
    assert bucket is not None
    if method == "POST":
        return Access(
            Kind.BUCKET, bucket, Level.WRITE, stream, request_class="append", missing=_stream_missing
        )
    if method in _SAFE:
        live = target.live is not None
        return Access(
            Kind.BUCKET,
            bucket,
            Level.READ,
            stream,
            request_class="live" if live else "read",
            live=live,
            missing=_stream_missing,
            public=True,
        )
    if method == "PUT":
        return Access(
            Kind.BUCKET,
            bucket,
            Level.WRITE,
            stream,
            request_class="append",
            missing=lambda: _bucket_missing(bucket),
            fork=target.fork,
        )
    if method == "DELETE":
        return Access(
            Kind.BUCKET, bucket, Level.WRITE, stream, request_class="admin", missing=_stream_missing
        )
    return Access(Kind.BUCKET, bucket, Level.READ, stream, missing=_stream_missing)  # 405 from the route


def _bucket(method: str, target: Target) -> Access:
    bucket = target.bucket
    assert bucket is not None
    if method == "DELETE":
        return OPERATOR
    if method == "PUT":
        return Access(
            Kind.BUCKET,
            bucket,
            Level.ADMIN,
            whole_bucket=True,
            request_class="admin",
            missing=lambda: _bucket_missing(bucket),
        )
    return Access(
        Kind.BUCKET,
        bucket,
        Level.READ,
        request_class="admin",
        missing=lambda: _bucket_missing(bucket),
        public=method in _SAFE,
    )


def _control(method: str, target: Target) -> Access:
    """The subscription APIs: in the default bucket, whole-bucket; wakes carry their own token."""
    action = target.action
    if action is None:
        level = Level.READ if method in _SAFE else Level.ADMIN
    elif not target.rest and action in SELF_AUTHENTICATED:
        return SELF
    elif not target.rest and action == "claim":
        level = Level.READ
    else:
        level = Level.ADMIN
    return Access(
        Kind.BUCKET,
        DEFAULT_BUCKET,
        level,
        whole_bucket=True,
        request_class="admin",
        missing=_subscription_missing,
    )


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
