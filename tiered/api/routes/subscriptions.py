"""Routes of the reserved subscription APIs (protocol sections 6 and 7).

Everything under ``/v1/stream/__ds`` is routed here, before stream routes
(rows of the route table, ``tiered.api.table``, each bound to a ``serve_*``
handler, or to this feature's 405 or 404):

* ``PUT|GET|DELETE /v1/stream/__ds/subscriptions/{id}``
* ``POST /v1/stream/__ds/subscriptions/{id}/streams``, ``DELETE .../streams/{path}``
* ``POST /v1/stream/__ds/subscriptions/{id}/callback|claim|ack|release``
* ``GET /v1/stream/__ds/jwks.json``

Routes parse and validate (the id first, then the method), ``SubscriptionService``
decides and commits. Errors carry the protocol's codes (an unavailable journal
is ``UNAVAILABLE`` here).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from tiered.api.kit.types import Handler, Request, Response, json_response
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.parsing import decode_json
from tiered.engine.subscriptions.config import (
    invalid,
    parse_config,
    parse_streams_body,
    parse_wake_request,
    parse_worker,
    validate_subscription_id,
)
from tiered.engine.subscriptions.delivery import CONTROL_PREFIX
from tiered.engine.subscriptions.service import SubscriptionService

JWKS_PATH = "/jwks.json"
_UNAVAILABLE = (ErrorCode.JOURNAL_FAILED, ErrorCode.STORE_UNAVAILABLE, ErrorCode.HOT_TIER_FULL)
SubscriptionHandler = Callable[[Request, str], Awaitable[Response]]


def _not_allowed(method: str, allowed: str) -> TieredError:
    return TieredError(ErrorCode.METHOD_NOT_ALLOWED, f"method {method} is not allowed here", allow=allowed)


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise TieredError(ErrorCode.TOKEN_INVALID, "Missing or malformed Authorization header")
    return token


def _control_not_found() -> TieredError:
    return TieredError(ErrorCode.SUBSCRIPTION_NOT_FOUND, "Durable Streams control route not found")


def _refuse(allowed: str) -> SubscriptionHandler:
    async def refuse(request: Request, sub_id: str) -> Response:
        raise _not_allowed(request.method, allowed)

    return refuse


async def _no_such_route(request: Request, sub_id: str) -> Response:
    raise _control_not_found()


def _strict_unquote(raw: str, what: str) -> str:
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise invalid(f"the {what} is not valid UTF-8") from None


def _available(handler: Handler) -> Handler:
    """``handler`` with the store's and journal's unavailability answered as ``UNAVAILABLE`` (retry)."""

    async def serve(request: Request) -> Response:
        try:
            return await handler(request)
        except TieredError as exc:
            if exc.code in _UNAVAILABLE:
                raise TieredError(ErrorCode.UNAVAILABLE, exc.message, retry_after_s=5) from None
            raise

    return serve


def _sub_id(request: Request) -> str:
    """The subscription id, as the request's target parsed it (``tiered.api.kit.target``), validated."""
    name = request.target.name
    assert name is not None  # the table routes only subscription targets here
    return validate_subscription_id(name)


class SubscriptionRoutes:
    def __init__(self, service: SubscriptionService) -> None:
        self.service = service
        # The route table's handlers (``tiered.api.table``).
        self.serve_jwks = _available(self._jwks)
        self.serve_put = self._subscription(self.put)
        self.serve_get = self._subscription(self.get)
        self.serve_delete = self._subscription(self.delete)
        self.serve_add_streams = self._subscription(self.add_streams)
        self.serve_remove_stream = self._subscription(self._remove_stream)
        self.serve_callback = self._subscription(self.callback)
        self.serve_ack = self._subscription(self.ack)
        self.serve_release = self._subscription(self.release)
        self.serve_claim = self._subscription(self.claim)
        self.not_allowed = self._subscription(_refuse("PUT, GET, HEAD, DELETE"))
        self.only_post = self._subscription(_refuse("POST"))
        self.only_delete = self._subscription(_refuse("DELETE"))
        self.no_such_action = self._subscription(_no_such_route)

    @staticmethod
    async def jwks_not_allowed(request: Request) -> Response:
        raise _not_allowed(request.method, "GET, HEAD")

    @staticmethod
    async def not_found(request: Request) -> Response:
        """Anything else under ``/v1/stream/__ds``."""
        raise _control_not_found()

    def _subscription(self, handler: SubscriptionHandler) -> Handler:
        async def serve(request: Request) -> Response:
            return await handler(request, _sub_id(request))

        return _available(serve)

    def _base_url(self, request: Request) -> str:
        # An unsound Host header gives relative URLs rather than echoing its bytes.
        return self.service.base_url(request.origin or "")

    def _jwks_url(self, request: Request) -> str:
        return self._base_url(request) + CONTROL_PREFIX + JWKS_PATH

    async def _json(self, request: Request) -> Any:
        raw = await request.body()
        return decode_json(raw, code=ErrorCode.INVALID_REQUEST) if raw.strip() else {}

    async def _jwks(self, request: Request) -> Response:
        return json_response(
            await self.service.jwks(),
            200,
            {"Cache-Control": "public, max-age=300"},
            content_type="application/jwk-set+json",
        )

    # ------------------------------------------------------------- subscriptions

    async def put(self, request: Request, sub_id: str) -> Response:
        service = self.service
        cfg = parse_config(
            await self._json(request),
            webhooks_enabled=service.webhooks,
            allow_loopback=service.allow_loopback,
        )
        created, view = await service.put(sub_id, cfg, self._base_url(request), self._jwks_url(request))
        return json_response(view, 201 if created else 200)

    async def get(self, request: Request, sub_id: str) -> Response:
        return json_response(
            self.service.get(sub_id, self._jwks_url(request)), 200, {"Cache-Control": "no-store"}
        )

    async def delete(self, request: Request, sub_id: str) -> Response:
        await self.service.delete(sub_id)
        return Response(204)

    async def add_streams(self, request: Request, sub_id: str) -> Response:
        await self.service.add_streams(sub_id, parse_streams_body(await self._json(request)))
        return Response(204)

    async def _remove_stream(self, request: Request, sub_id: str) -> Response:
        # The stream path's raw segments, as the target split them (they may hold encoded slashes).
        path = _strict_unquote("/".join(request.target.rest), "stream path").strip("/")
        return await self.remove_stream(sub_id, path)

    async def remove_stream(self, sub_id: str, path: str) -> Response:
        if not path:
            raise invalid("the stream path is empty")
        await self.service.remove_stream(sub_id, path)
        return Response(204)

    # ------------------------------------------------------------- wakes

    async def callback(self, request: Request, sub_id: str) -> Response:
        token = _bearer(request)
        req = parse_wake_request(await self._json(request))
        next_wake = await self.service.ack(sub_id, token, req, pull_only=False)
        return json_response({"ok": True, "next_wake": next_wake})

    async def ack(self, request: Request, sub_id: str) -> Response:
        token = _bearer(request)
        req = parse_wake_request(await self._json(request))
        next_wake = await self.service.ack(sub_id, token, req, pull_only=True)
        return json_response({"ok": True, "next_wake": next_wake})

    async def release(self, request: Request, sub_id: str) -> Response:
        token = _bearer(request)
        req = parse_wake_request(await self._json(request), with_acks=False)
        await self.service.release(sub_id, token, req)
        return Response(204)

    async def claim(self, request: Request, sub_id: str) -> Response:
        worker = parse_worker(await self._json(request))
        return json_response(await self.service.claim(sub_id, worker))
