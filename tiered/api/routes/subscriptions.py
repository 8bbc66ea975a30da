"""Routes of the reserved subscription APIs (protocol sections 6 and 7).

Everything under ``/v1/stream/__ds`` is routed here, before stream routes:

* ``PUT|GET|DELETE /v1/stream/__ds/subscriptions/{id}``
* ``POST /v1/stream/__ds/subscriptions/{id}/streams``, ``DELETE .../streams/{path}``
* ``POST /v1/stream/__ds/subscriptions/{id}/callback|claim|ack|release``
* ``GET /v1/stream/__ds/jwks.json``

Routes parse and validate, ``SubscriptionService`` decides and commits. Errors
carry the protocol's codes (an unavailable journal is ``UNAVAILABLE`` here).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from tiered.api.kit.router import Router
from tiered.api.kit.target import Family
from tiered.api.kit.types import Request, Response, json_response
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
ACTIONS = ("callback", "claim", "ack", "release")
_UNAVAILABLE = (ErrorCode.JOURNAL_FAILED, ErrorCode.STORE_UNAVAILABLE, ErrorCode.HOT_TIER_FULL)


def _not_allowed(method: str, allowed: str) -> TieredError:
    return TieredError(ErrorCode.METHOD_NOT_ALLOWED, f"method {method} is not allowed here", allow=allowed)


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise TieredError(ErrorCode.TOKEN_INVALID, "Missing or malformed Authorization header")
    return token


def _strict_unquote(raw: str, what: str) -> str:
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise invalid(f"the {what} is not valid UTF-8") from None


class SubscriptionRoutes:
    def __init__(self, service: SubscriptionService) -> None:
        self.service = service

    def install(self, router: Router) -> None:
        # Before the stream routes: __ds is never an application stream.
        router.add("*", CONTROL_PREFIX, self.dispatch)
        router.add("*", CONTROL_PREFIX + "/{tail...}", self.dispatch)

    def _base_url(self, request: Request) -> str:
        # An unsound Host header gives relative URLs rather than echoing its bytes.
        return self.service.base_url(request.origin or "")

    def _jwks_url(self, request: Request) -> str:
        return self._base_url(request) + CONTROL_PREFIX + JWKS_PATH

    async def _json(self, request: Request) -> Any:
        raw = await request.body()
        return decode_json(raw, code=ErrorCode.INVALID_REQUEST) if raw.strip() else {}

    async def dispatch(self, request: Request) -> Response:
        try:
            return await self._dispatch(request)
        except TieredError as exc:
            if exc.code in _UNAVAILABLE:
                raise TieredError(ErrorCode.UNAVAILABLE, exc.message, retry_after_s=5) from None
            raise

    async def _dispatch(self, request: Request) -> Response:
        # Segments as the request's target parsed them (``tiered.api.kit.target``), the access check's too.
        target = request.target
        if target.family is Family.JWKS:
            if request.method not in ("GET", "HEAD"):
                raise _not_allowed(request.method, "GET, HEAD")
            return json_response(
                await self.service.jwks(),
                200,
                {"Cache-Control": "public, max-age=300"},
                content_type="application/jwk-set+json",
            )
        if target.family is Family.SUBSCRIPTION and target.name is not None:
            sub_id = validate_subscription_id(target.name)
            tail = [] if target.action is None else [target.action, *target.rest]
            handler = self._route(request, tail)
            if handler is not None:
                return await handler(request, sub_id)
        raise TieredError(ErrorCode.SUBSCRIPTION_NOT_FOUND, "Durable Streams control route not found")

    def _route(
        self, request: Request, tail: list[str]
    ) -> Callable[[Request, str], Awaitable[Response]] | None:
        method = request.method
        if not tail:
            handler = {"PUT": self.put, "GET": self.get, "HEAD": self.get, "DELETE": self.delete}.get(method)
            if handler is None:
                raise _not_allowed(method, "PUT, GET, HEAD, DELETE")
            return handler
        if tail[0] == "streams" and len(tail) == 1:
            if method != "POST":
                raise _not_allowed(method, "POST")
            return self.add_streams
        if tail[0] == "streams":
            if method != "DELETE":
                raise _not_allowed(method, "DELETE")
            path = _strict_unquote("/".join(tail[1:]), "stream path").strip("/")

            async def remove(request: Request, sub_id: str) -> Response:
                return await self.remove_stream(sub_id, path)

            return remove
        if len(tail) == 1 and tail[0] in ACTIONS:
            if method != "POST":
                raise _not_allowed(method, "POST")
            action: Callable[[Request, str], Awaitable[Response]] = getattr(self, tail[0])
            return action
        return None

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
