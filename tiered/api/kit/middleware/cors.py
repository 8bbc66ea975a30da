"""CORS: preflight requests are answered here, for every route, without credentials.

Browsers send ``OPTIONS`` before cross-origin requests with custom headers;
the answer allows the protocol's methods and request headers. The matching
``Access-Control-*`` response headers on real requests come from
``security_headers``.
"""

from __future__ import annotations

from collections.abc import Awaitable

from tiered.api.kit.types import Handler, Request, Response

ALLOWED_METHODS = "GET, HEAD, PUT, POST, DELETE, OPTIONS"
ALLOWED_HEADERS = ", ".join(
    [
        "Content-Type",
        "Authorization",
        "If-None-Match",
        "Stream-Seq",
        "Stream-TTL",
        "Stream-Expires-At",
        "Stream-Closed",
        "Stream-Forked-From",
        "Stream-Fork-Offset",
        "Stream-Fork-Sub-Offset",
        "Producer-Id",
        "Producer-Epoch",
        "Producer-Seq",
        "X-Request-Id",
        # Stream snapshots (tiered/api/routes/snapshots.py).
        "If-Match",
        "Stream-Snapshot-Retain",
        # Issue 22: conditional appends.
        "Stream-Expected-Offset",
        "Stream-Record-Match",
        # Issue 21: keyed streams (tiered/engine/streams/header_keys.py).
        "Stream-Compaction-Key",
        "Stream-Key",
        "Stream-Key-Tombstone",
    ]
)
_PREFLIGHT = {
    "Access-Control-Allow-Methods": ALLOWED_METHODS,
    "Access-Control-Allow-Headers": ALLOWED_HEADERS,
    "Access-Control-Max-Age": "86400",
}


def cors_preflight(handler: Handler) -> Handler:
    # Not a coroutine itself: every other request goes straight to ``handler``'s
    # coroutine, without one more layer for the event loop to step through.
    def preflight(request: Request) -> Awaitable[Response]:
        if request.method == "OPTIONS":
            return _answer_preflight(request)
        return handler(request)

    return preflight


async def _answer_preflight(request: Request) -> Response:
    request.route = "preflight"
    return Response(204, dict(_PREFLIGHT))
