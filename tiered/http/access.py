"""What a request touches and what it needs: its bucket, the scope, the stream path, its usage class.

One table for every route (the routes themselves know nothing of auth):

| route | bucket | scope | usage class |
| --- | --- | --- | --- |
| ``GET/HEAD`` a stream (``live=`` or not) | the stream's | read | read, or live |
| ``PUT`` a stream (a fork also needs read on its source) | the stream's | write | append |
| ``POST`` a stream | the stream's | write | append |
| ``DELETE`` a stream | the stream's | write | admin |
| ``GET /v1/buckets/{b}`` | b | read (any grant on b) | admin |
| ``PUT /v1/buckets/{b}`` | b | admin, whole bucket | admin |
| ``GET/HEAD`` a subscription, ``claim`` | default | read, whole bucket | admin |
| ``PUT/DELETE`` a subscription, its ``streams`` | default | admin, whole bucket | admin |
| a subscription's ``callback``, ``ack``, ``release`` | its own wake token (unchanged) | | |
| ``GET`` a group, ``join``, ``heartbeat``, ``leave`` | the group's | read, whole bucket | admin |
| ``PUT`` a group (the body's bucket), ``DELETE``, its ``streams`` | the group's | admin, whole bucket | admin |
| ``GET /v1/buckets``, ``GET /v1/groups`` | any credential; the answer lists what it may see | | |
| ``/v1/admin/...``, ``/metrics``, ``DELETE /v1/buckets/{b}`` | the operator's admin token | | |
| ``/healthz``, ``/readyz``, the webhook JWKS, unknown routes | open | | |

A node's signed *system* call (``tiered.auth.node_call.SYSTEM``: a wake
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
from urllib.parse import unquote

from tiered.auth.credentials import Level
from tiered.errors import ErrorCode, TieredError
from tiered.ids import DEFAULT_BUCKET
from tiered.parsing import decode_json
from tiered.streams.http import BUCKETS_PREFIX, RESERVED_SEGMENT, STREAM_PREFIX, decode_path, stream_address

from .router import normalize_path
from .types import Request

CONTROL_PREFIX = STREAM_PREFIX + RESERVED_SEGMENT  # /v1/stream/__ds
SELF_AUTHENTICATED = ("callback", "ack", "release")  # carry a subscription wake token


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
    raw_path: str | None = None  # the request path of a stream route: ``stream_path`` decodes it
    whole_bucket: bool = False  # reaches every stream of the bucket (only grants without a prefix)
    request_class: str | None = None  # usage: append, read, live, admin
    live: bool = False
    missing: Callable[[], TieredError] | None = None  # the route's own answer for "no such thing"
    fork: tuple[str, str] | None = None  # a fork's source (bucket, path): read is needed there too

    def stream_path(self) -> str | None:
        """The stream the request names (grants with a prefix must cover it); None if it names none validly.

        Decoded only when a prefix needs it: most requests never pay for it.
        """
        if self.raw_path is None:
            return None
        try:
            return stream_address(decode_path(self.raw_path))[1]
        except TieredError:  # a bad name: the route answers 400 to whoever may use the bucket
            return None


OPEN = Access(Kind.OPEN)
OPERATOR = Access(Kind.OPERATOR)
SELF = Access(Kind.SELF)
ANY = Access(Kind.ANY)


def _stream_missing() -> TieredError:
    return TieredError(ErrorCode.STREAM_NOT_FOUND, "stream not found")


def _bucket_missing(bucket: str) -> TieredError:
    return TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")


def fork_missing() -> TieredError:
    return TieredError(ErrorCode.FORK_SOURCE_NOT_FOUND, "fork source stream not found")


def system_may(access: Access) -> bool:
    """Whether a node's system call may act as the operator here: on a stream route, nowhere else."""
    return access.kind is Kind.BUCKET and access.raw_path is not None


class AccessMap:
    def __init__(self, group_bucket: Callable[[str], str | None]) -> None:
        self._group_bucket = group_bucket

    def classify(self, request: Request) -> Access:
        path = normalize_path(request.path)
        if path.startswith(STREAM_PREFIX):
            if path.startswith(CONTROL_PREFIX) and path[len(CONTROL_PREFIX) : len(CONTROL_PREFIX) + 1] in (
                "",
                "/",
            ):
                return self._subscription(request, path)
            return self._stream(request, path, DEFAULT_BUCKET)
        if path.startswith(BUCKETS_PREFIX):
            rest = path[len(BUCKETS_PREFIX) :]
            bucket, sep, tail = rest.partition("/")
            if not sep:
                return self._bucket(request, bucket)
            if tail.startswith("stream/"):
                return self._stream(request, path, bucket)
            return OPEN  # no such route
        if path == "/v1/buckets" or path == "/v1/groups":
            return ANY
        if path.startswith("/v1/groups/"):
            return self._group(request, path[len("/v1/groups/") :])
        if path.startswith("/v1/admin/") or path == "/metrics":
            return OPERATOR
        return OPEN

    # ------------------------------------------------------------- streams and buckets

    def _stream(self, request: Request, path: str, bucket: str) -> Access:
        method = request.method
        stream = path  # decoded lazily (Access.stream_path)
        if method in ("GET", "HEAD"):
            live = _live(request)
            return Access(
                Kind.BUCKET,
                bucket,
                Level.READ,
                stream,
                request_class="live" if live else "read",
                live=live,
                missing=_stream_missing,
            )
        if method == "PUT":
            return Access(
                Kind.BUCKET,
                bucket,
                Level.WRITE,
                stream,
                request_class="append",
                missing=lambda: _bucket_missing(bucket),
                fork=_fork_source(request),
            )
        if method == "POST":
            return Access(
                Kind.BUCKET, bucket, Level.WRITE, stream, request_class="append", missing=_stream_missing
            )
        if method == "DELETE":
            return Access(
                Kind.BUCKET, bucket, Level.WRITE, stream, request_class="admin", missing=_stream_missing
            )
        return Access(Kind.BUCKET, bucket, Level.READ, stream, missing=_stream_missing)  # 405 from the route

    def _bucket(self, request: Request, bucket: str) -> Access:
        method = request.method
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
            Kind.BUCKET, bucket, Level.READ, request_class="admin", missing=lambda: _bucket_missing(bucket)
        )

    # ------------------------------------------------------------- subscriptions and groups

    def _subscription(self, request: Request, path: str) -> Access:
        parts = path.split("/")[4:]
        first = unquote(parts[0]) if parts else ""
        if first == "jwks.json" and len(parts) == 1:
            return OPEN
        tail = [unquote(p) for p in parts[2:3]] if first == "subscriptions" else []
        method = request.method
        if tail and tail[0] in SELF_AUTHENTICATED and len(parts) == 3:
            return SELF
        if not tail:
            level = Level.READ if method in ("GET", "HEAD") else Level.ADMIN
        elif tail[0] == "claim":
            level = Level.READ
        else:
            level = Level.ADMIN
        return Access(
            Kind.BUCKET,
            DEFAULT_BUCKET,
            level,
            whole_bucket=True,
            request_class="admin",
            missing=lambda: TieredError(ErrorCode.SUBSCRIPTION_NOT_FOUND, "Subscription not found"),
        )

    def _group(self, request: Request, rest: str) -> Access:
        name, _, action = rest.partition("/")
        method = request.method
        if method == "PUT" and not action:
            # Creating a group: its bucket is in the body, read only for a caller that authenticated.
            return Access(Kind.BODY, request_class="admin")
        bucket = self._group_bucket(name)
        if bucket is None:
            return ANY  # no such group (or a body the route refuses): nothing to hide, the route answers
        reads = (method in ("GET", "HEAD") and not action) or action in ("join", "heartbeat", "leave")

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


def _live(request: Request) -> bool:
    if "live=" not in request.query_string:
        return False
    try:
        return request.query.get("live") in ("long-poll", "sse")
    except TieredError:
        return False


def _fork_source(request: Request) -> tuple[str, str] | None:
    source = request.headers.get("Stream-Forked-From")
    if source is None:
        return None
    try:
        return stream_address(decode_path(normalize_path(source.split("?", 1)[0])))
    except (TieredError, UnicodeEncodeError):
        return None  # the route answers FORK_SOURCE_NOT_FOUND itself


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
