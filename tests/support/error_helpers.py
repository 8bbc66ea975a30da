"""What a core ``TieredError`` becomes on the wire (through the one mapper), for tests of the core."""

from __future__ import annotations

from tiered.api.kit.errors import STATUS, error_response
from tiered.core.errors import TieredError


def http_status(exc: TieredError) -> int:
    return STATUS[exc.code]


def protocol_headers(exc: TieredError) -> dict[str, str]:
    """The protocol headers the error carries (everything but Content-Type and Retry-After)."""
    headers = dict(error_response(exc).headers)
    headers.pop("Content-Type", None)
    headers.pop("Retry-After", None)
    return headers
