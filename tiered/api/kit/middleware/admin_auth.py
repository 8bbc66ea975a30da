"""The admin guard: operator routes need the admin bearer token.

With a token configured (``--admin-token-file`` or ``TIERED_ADMIN_TOKEN``),
every guarded route needs ``Authorization: Bearer <token>`` (compared in
constant time, as the bytes sent). With none, guarded routes are refused
(403 ``ADMIN_DISABLED``), with one exception for local development: auth off
(``--auth none`` or unset) on a loopback address. With auth on (``tokens``,
``jwt``) loopback is no exception: a local reverse proxy or sidecar would
otherwise hand the admin API (minting tokens for any bucket) to whoever can
reach it (``Config.admin_open_without_token``). Refusals change nothing.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from tiered.api.kit.types import Handler, Request, Response
from tiered.core.errors import ErrorCode, TieredError

if TYPE_CHECKING:
    from tiered.core.config import Config

DISABLED = (
    "admin operations are disabled: configure an admin token (--admin-token-file or TIERED_ADMIN_TOKEN)"
)


def bearer_token(request: Request) -> bytes | None:
    """The bearer token as sent (undecodable header bytes included), or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return None
    return presented.encode("utf-8", "surrogateescape")


class AdminGuard:
    """``token``: the admin token (None: none configured); ``open_without_token``: allow all when there is none."""

    def __init__(self, token: str | None, *, open_without_token: bool) -> None:
        self._token = token.encode() if token is not None else None
        self._open = open_without_token

    @classmethod
    def from_config(cls, config: Config) -> AdminGuard:
        return cls(config.admin_token(), open_without_token=config.admin_open_without_token)

    def check(self, request: Request) -> None:
        if self._token is None:
            if self._open:
                return
            raise TieredError(ErrorCode.ADMIN_DISABLED, DISABLED)
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
