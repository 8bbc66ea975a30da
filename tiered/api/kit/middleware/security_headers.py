"""Headers every response carries (protocol section 12.7 and CORS), errors and SSE included."""

from __future__ import annotations

from tiered.api.kit.types import Handler, Request, Response

EXPOSED_HEADERS = ", ".join(
    [
        "Stream-Next-Offset",
        "Stream-Cursor",
        "Stream-Up-To-Date",
        "Stream-Closed",
        "Stream-TTL",
        "Stream-Expires-At",
        "Stream-Sse-Data-Encoding",
        "Stream-Retained-Offset",
        "Producer-Epoch",
        "Producer-Seq",
        "Producer-Expected-Seq",
        "Producer-Received-Seq",
        "ETag",
        "Location",
        "Content-Type",
        "Retry-After",
        "X-Request-Id",
        "WWW-Authenticate",
        # Stream snapshots (tiered/api/routes/snapshots.py).
        "Stream-Snapshot-Offset",
        "Stream-Snapshot-ETag",
        # Issue 22: record ordinals.
        "Stream-Record",
        "Stream-Record-First",
        "Stream-Record-Next",
        "Stream-Record-Count",
        # Issue 21: keyed compaction (tiered/api/routes/keyed.py).
        "Stream-Low-Water-Mark",
        "Stream-High-Water-Mark",
        "Stream-Compaction-Key",
        "Stream-Key-Offset",
        "Stream-Key",
    ]
)
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Resource-Policy": "cross-origin",
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": EXPOSED_HEADERS,
}


_SECURITY_ITEMS = tuple(SECURITY_HEADERS.items())


def add_security_headers(headers: dict[str, str]) -> None:
    """The security headers a response does not set itself (this layer's, and the fused append path's)."""
    for name, value in _SECURITY_ITEMS:
        if name not in headers:
            headers[name] = value


def security_headers(handler: Handler) -> Handler:
    async def with_headers(request: Request) -> Response:
        response = await handler(request)
        add_security_headers(response.headers)
        return response

    return with_headers
