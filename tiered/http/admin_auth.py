"""The admin guard: operator routes need the admin bearer token (or loopback with none configured).

With a token configured (``--admin-token-file`` or ``TIERED_ADMIN_TOKEN``),
every guarded route needs ``Authorization: Bearer <token>`` (compared in
constant time, as the bytes sent). With none, guarded routes are allowed only
when the server listens on loopback; otherwise they are refused (403).
Refusals change nothing.
"""

from __future__ import annotations

import hmac

from tiered.errors import ErrorCode, TieredError

from .types import Handler, Request, Response


def bearer_token(request: Request) -> bytes | None:
    """The bearer token as sent (undecodable header bytes included), or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return None
    return presented.encode("utf-8", "surrogateescape")


class AdminGuard:
    def __init__(self, token: str | None, *, loopback_only: bool) -> None:
        self._token = token.encode() if token is not None else None
        self._loopback_only = loopback_only

    def check(self, request: Request) -> None:
        if self._token is None:
            if self._loopback_only:
                return
            raise TieredError(
                ErrorCode.ADMIN_DISABLED,
                "admin operations are disabled: configure an admin token (--admin-token-file or TIERED_ADMIN_TOKEN)",
            )
        presented = bearer_token(request)
        if presented is None:
            raise TieredError(ErrorCode.UNAUTHORIZED, "admin operations need Authorization: Bearer <token>")
        if not hmac.compare_digest(presented, self._token):
            raise TieredError(ErrorCode.UNAUTHORIZED, "the admin token is not valid")

    def __call__(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            self.check(request)
            return await handler(request)

        return guarded
