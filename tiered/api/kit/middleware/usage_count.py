"""Middleware: count each admitted request in its bucket's usage, and hold live readers to their quota.

Runs inside ``tiered.api.kit.middleware.auth`` (which classified the request), so only
requests the caller may make are counted: nobody can run up another
tenant's bill with refused requests. A live read (long-poll, SSE) holds one of
its bucket's ``max_live_readers`` slots until its response is finished; past
the quota it gets 429 with ``Retry-After``.
"""

from __future__ import annotations

from collections.abc import Callable

from tiered.api.access import Access
from tiered.api.kit.types import Handler, Middleware, Request, Response, after_body
from tiered.engine.auth import node_call
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.usage_counters import UsageCounter


def count_request(counter: UsageCounter, exists: Callable[[str], bool], access: object) -> str | None:
    """Count an admitted request in its bucket's usage; returns the bucket whose live-reader slot it must
    hold (None: not a live read, or nobody's usage). Shared by the middleware and the append route's fused
    path (``tiered.api.append_path``)."""
    if not isinstance(access, Access) or access.request_class is None or access.bucket is None:
        return None
    bucket = access.bucket
    if not exists(bucket):
        return None
    call = node_call.current()
    if call is None or not call.uncounted:  # a fan-out counts once, in the bucket's well-known shard
        counter.request(bucket, access.request_class)
    return bucket if access.live else None


def usage_middleware(counter: UsageCounter, gate: TenantGate, exists: Callable[[str], bool]) -> Middleware:
    """``exists``: whether a bucket exists (requests naming no bucket are not anyone's usage)."""

    def wrap(handler: Handler) -> Handler:
        async def counted(request: Request) -> Response:
            bucket = count_request(counter, exists, request.access)
            if bucket is None:
                return await handler(request)
            gate.enter_live(bucket)
            try:
                response = await handler(request)
            except BaseException:
                gate.leave_live(bucket)
                raise
            return after_body(response, lambda: gate.leave_live(bucket))

        return counted

    return wrap
