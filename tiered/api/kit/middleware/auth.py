"""Middleware: who is calling, and may they? Every data-plane request passes the one scope check.

``tiered.api.access`` says what a request touches (its row's scope in the route
table, ``tiered.api.table``, applied to its target); ``AuthService`` turns the
``Authorization`` header into a ``Principal`` (tiered token, the operator's
admin token, or a JWT), or takes a node's signed system call on a stream route for the
operator (``tiered.api.access.system_may``); ``tiered.engine.auth.credentials.authorize`` judges it:

* no credential where one is needed: 401 with ``WWW-Authenticate: Bearer``;
  a credential that is not valid (unknown, revoked, expired, forged): 401;
* no grant on the bucket (or on the stream, under a prefix): the route's own
  answer for a missing bucket or stream (404), so names do not leak;
* a grant with too low a scope: 403.

Refusals happen before the route runs, so nothing changes. Live reads get a
lease on their credential (``tiered.engine.auth.live``): they end when it expires
or is revoked. Routes may ask ``request.auth.visible(bucket)`` to filter
listings. With ``--auth none`` requests are classified (for usage) and pass.
Credentials never reach logs or error bodies: refusals name no token.
"""

from __future__ import annotations

from tiered.api.access import Access, AccessMap, Kind, fork_missing, resolve, system_may
from tiered.api.kit.types import Handler, LiveLease, Middleware, Request, Response, after_body
from tiered.engine.auth import node_call
from tiered.engine.auth.credentials import (
    Level,
    Principal,
    Verdict,
    authorize,
    forbidden,
    listing_prefixes,
    unauthenticated,
    visible,
)
from tiered.engine.auth.live import Lease
from tiered.engine.auth.service import AuthService

#: A node's system call on a stream route: the operator's authority there (``node_call.SYSTEM``).
SYSTEM = Principal(id="node", kind="node", operator=True)


class _Caller:
    """``request.auth``: the caller as routes see it."""

    __slots__ = ("principal", "lease", "_service")

    def __init__(self, principal: Principal | None, service: AuthService, lease: LiveLease | None) -> None:
        self.principal = principal
        self._service = service
        self.lease = lease

    def visible(self, bucket: str) -> bool:
        return visible(self.principal, bucket, public_read=self._service.public_read(bucket))

    def stream_prefixes(self, bucket: str) -> tuple[str, ...] | None:
        return listing_prefixes(self.principal, bucket, public_read=self._service.public_read(bucket))


def _check(service: AuthService, principal: Principal | None, access: Access) -> None:
    bucket = access.bucket
    assert bucket is not None
    verdict = authorize(
        principal,
        bucket,
        access.level,
        path=access.stream,
        whole_bucket=access.whole_bucket,
        # Public read admits reads that change nothing: streams and the bucket's description.
        public_read=access.public and service.public_read(bucket),
    )
    if verdict is Verdict.ALLOW:
        return
    if verdict is Verdict.UNAUTHENTICATED:
        raise unauthenticated()
    if verdict is Verdict.FORBIDDEN:
        raise forbidden()
    assert access.missing is not None
    raise access.missing()


def _check_fork(service: AuthService, principal: Principal | None, source: tuple[str, str]) -> None:
    bucket, path = source
    verdict = authorize(principal, bucket, Level.READ, path=path, public_read=service.public_read(bucket))
    if verdict is Verdict.FORBIDDEN:
        raise forbidden()
    if verdict is not Verdict.ALLOW:
        raise fork_missing()  # the source is as good as missing to this caller


def principal_of(service: AuthService, request: Request, access: Access) -> Principal | None:
    """Who is calling: a node's signed system call on a stream route (the operator there), or the
    ``Authorization`` header's credential (None: no header; 401 for one that is not valid)."""
    call = node_call.current()
    if call is not None and call.system and system_may(access):
        return SYSTEM  # a node's own work (signature verified by routing)
    return service.authenticate(request.headers.get("Authorization"))


def admit(
    service: AuthService, request: Request, access: Access, principal: Principal | None
) -> Lease | None:
    """The one scope check of a request whose access is known (a body's bucket resolved): refusals raise.

    Sets ``request.access`` and ``request.auth``; returns the live read's lease on its credential
    (None: not a live read, or the operator's). Shared by the middleware and the append route's fused
    path (``tiered.api.append_path``).
    """
    request.access = access
    if access.kind is Kind.ANY:
        if principal is None:
            raise unauthenticated()
    else:
        _check(service, principal, access)
        if access.fork is not None:
            _check_fork(service, principal, access.fork)
    lease: Lease | None = None
    if access.live and principal is not None and not principal.operator:
        lease = service.lease(principal)
    request.auth = _Caller(principal, service, lease)
    return lease


def auth_middleware(service: AuthService, access_map: AccessMap) -> Middleware:
    def wrap(handler: Handler) -> Handler:
        async def authorized(request: Request) -> Response:
            access = access_map.classify(request)
            kind = access.kind
            if not service.enabled:
                if kind is Kind.BODY:
                    access = await resolve(request, access)  # for its usage class
                request.access = access
                return await handler(request)
            if kind is Kind.OPEN or kind is Kind.OPERATOR or kind is Kind.SELF:
                request.access = access
                return await handler(request)
            principal = principal_of(service, request, access)
            if kind is Kind.BODY:
                if principal is None:
                    raise unauthenticated()  # before reading a body for anyone
                access = await resolve(request, access)
            lease = admit(service, request, access, principal)
            if lease is None:
                return await handler(request)
            leases, held = service.leases, lease
            try:
                response = await handler(request)
            except BaseException:
                leases.close(held)
                raise
            return after_body(response, lambda: leases.close(held))

        return authorized

    return wrap
