"""HTTP routes of the reserved subscription APIs (protocol sections 6 and 7).

Everything under ``/v1/stream/__ds`` is routed here, before stream routes:

* ``PUT|GET|DELETE /v1/stream/__ds/subscriptions/{id}``
* ``POST /v1/stream/__ds/subscriptions/{id}/streams``, ``DELETE .../streams/{path}``
* ``POST /v1/stream/__ds/subscriptions/{id}/callback|claim|ack|release``
* ``GET /v1/stream/__ds/jwks.json``

Errors are ``{"error": {"code": ..., "message": ...}}`` with the protocol's
codes. Handlers parse, call the pure ``SubscriptionState.decide_*`` and
journal the result through ``StreamService.commit_records`` (no ``await``
between deciding and committing, so decisions never act on stale state).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import msgspec
from aiohttp import web

from .service import StreamService, now_ms
from .state import StreamError
from .subscription_records import WakeClaimed
from .subscriptions import (
    TOKEN_TTL_S,
    WEBHOOK,
    StateStreams,
    SubscriptionError,
    SubscriptionState,
    TokenClaims,
    mint_token,
    parse_config,
    parse_streams_body,
    parse_wake_request,
    parse_worker,
    validate_subscription_id,
)
from .webhooks import CONTROL_PREFIX, SubscriptionDelivery

JWKS_PATH = "/jwks.json"
ACTIONS = ("callback", "claim", "ack", "release")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(body), content_type=content_type, headers=headers)


def subscription_error(exc: SubscriptionError, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(exc.body(), exc.status, headers)


def _not_allowed(method: str, allowed: str) -> web.Response:
    exc = SubscriptionError(405, "METHOD_NOT_ALLOWED", f"method {method} is not allowed here")
    return subscription_error(exc, {"Allow": allowed})


def _bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class SubscriptionsApi:
    def __init__(self, service: StreamService) -> None:
        self.service = service
        self.config = service.config

    def routes(self) -> list[web.RouteDef]:
        # Registered before the stream routes: __ds is never an application stream.
        return [web.route("*", CONTROL_PREFIX + "{tail:(?:/[\\s\\S]*)?}", self.dispatch)]

    # ------------------------------------------------------------- plumbing

    @property
    def subs(self) -> SubscriptionState:
        return self.service.subscriptions

    @property
    def delivery(self) -> SubscriptionDelivery:
        delivery = self.service.deliveries
        assert delivery is not None, "the service is not started"
        return delivery

    def _streams(self, ts_ms: int) -> StateStreams:
        return StateStreams(self.service.state, ts_ms, lambda s: self.service.view(s).tail)

    def _base_url(self, request: web.Request) -> str:
        configured = str(getattr(self.config, "public_url", "") or "")
        return configured.rstrip("/") or f"{request.scheme}://{request.host}"

    def _jwks_url(self, request: web.Request) -> str:
        return self._base_url(request) + CONTROL_PREFIX + JWKS_PATH

    async def _json(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw.strip():
            return {}
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise SubscriptionError(400, "INVALID_REQUEST", "Invalid JSON body") from None

    async def _commit(self, records: list[Any]) -> None:
        if records:
            await self.service.commit_records(records)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        # Raw segments after /v1/stream/__ds: ids and stream paths may hold encoded slashes.
        parts = request.raw_path.split("?", 1)[0].split("/")[4:]
        words = [unquote(p) for p in parts[:1]]
        try:
            if words == ["jwks.json"] and len(parts) == 1:
                return await self.jwks(request)
            if words == ["subscriptions"] and len(parts) > 1 and parts[1]:
                try:
                    sub_id = validate_subscription_id(unquote(parts[1], errors="strict"))
                except UnicodeDecodeError:
                    raise SubscriptionError(400, "INVALID_REQUEST", "the subscription id is not valid UTF-8") from None
                tail = [unquote(p) for p in parts[2:3]] + parts[3:]
                response = await self._route(request, sub_id, tail)
                if response is not None:
                    return response
            raise SubscriptionError(404, "SUBSCRIPTION_NOT_FOUND", "Durable Streams control route not found")
        except SubscriptionError as exc:
            return subscription_error(exc)
        except StreamError as exc:  # the journal cannot write
            code = "UNAVAILABLE" if exc.status == 503 else "INVALID_REQUEST"
            return subscription_error(SubscriptionError(exc.status, code, exc.message), exc.headers)

    async def _route(self, request: web.Request, sub_id: str, tail: list[str]) -> web.StreamResponse | None:
        method = request.method
        if not tail:
            handler = {"PUT": self.put, "GET": self.get, "HEAD": self.get, "DELETE": self.delete}.get(method)
            return await handler(request, sub_id) if handler else _not_allowed(method, "PUT, GET, HEAD, DELETE")
        if tail[0] == "streams" and len(tail) == 1:
            return await self.add_streams(request, sub_id) if method == "POST" else _not_allowed(method, "POST")
        if tail[0] == "streams":
            if method != "DELETE":
                return _not_allowed(method, "DELETE")
            try:
                path = unquote("/".join(tail[1:]), errors="strict").strip("/")
            except UnicodeDecodeError:
                raise SubscriptionError(400, "INVALID_REQUEST", "the stream path is not valid UTF-8") from None
            return await self.remove_stream(sub_id, path)
        if len(tail) == 1 and tail[0] in ACTIONS:
            if method != "POST":
                return _not_allowed(method, "POST")
            return await getattr(self, tail[0])(request, sub_id)
        return None

    # ------------------------------------------------------------- subscriptions

    async def put(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        cfg = parse_config(
            await self._json(request),
            webhooks_enabled=self.config.webhooks,
            allow_loopback=self.config.webhook_allow_loopback,
        )
        if cfg.type == WEBHOOK:
            await self.delivery.ensure_signing_key()
        now = now_ms()
        records, existing = self.subs.decide_create(sub_id, cfg, self._base_url(request), self._streams(now), now)
        if existing is not None:
            await self.service.journal.flushed()  # the matching create may still be on its way to disk
            return json_response(self.subs.describe(existing, self._jwks_url(request)), 200)
        await self._commit(records)
        sub = self.subs.get(sub_id)
        return json_response(self.subs.describe(sub, self._jwks_url(request)), 201)

    async def get(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        sub = self.subs.get(sub_id)
        return json_response(self.subs.describe(sub, self._jwks_url(request)), 200, {"Cache-Control": "no-store"})

    async def delete(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        await self._commit(self.subs.decide_delete(sub_id, now_ms()))
        return web.Response(status=204)

    async def add_streams(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        paths = parse_streams_body(await self._json(request))
        now = now_ms()
        await self._commit(self.subs.decide_add_streams(sub_id, paths, self._streams(now), now))
        return web.Response(status=204)

    async def remove_stream(self, sub_id: str, path: str) -> web.StreamResponse:
        if not path:
            raise SubscriptionError(400, "INVALID_REQUEST", "the stream path is empty")
        await self._commit(self.subs.decide_remove_stream(sub_id, path, now_ms()))
        return web.Response(status=204)

    # ------------------------------------------------------------- delivery

    async def _wake_request(self, request: web.Request, *, with_acks: bool = True) -> tuple[str, Any]:
        token = _bearer(request)
        if token is None:
            raise SubscriptionError(401, "TOKEN_INVALID", "Missing or malformed Authorization header")
        return token, parse_wake_request(await self._json(request), with_acks=with_acks)

    async def callback(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        token, req = await self._wake_request(request)
        now = now_ms()
        records, next_wake = self.subs.decide_ack(sub_id, token, req, self._streams(now), now, pull_only=False)
        await self._commit(records)
        return json_response({"ok": True, "next_wake": next_wake})

    async def ack(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        token, req = await self._wake_request(request)
        now = now_ms()
        records, next_wake = self.subs.decide_ack(sub_id, token, req, self._streams(now), now, pull_only=True)
        await self._commit(records)
        return json_response({"ok": True, "next_wake": next_wake})

    async def release(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        token, req = await self._wake_request(request, with_acks=False)
        now = now_ms()
        await self._commit(self.subs.decide_release(sub_id, token, req, self._streams(now), now))
        return web.Response(status=204)

    async def claim(self, request: web.Request, sub_id: str) -> web.StreamResponse:
        worker = parse_worker(await self._json(request))
        key = await self.delivery.ensure_signing_key()
        now = now_ms()
        streams = self._streams(now)
        records = self.subs.decide_claim(sub_id, worker, streams, now)
        sub = self.subs.get(sub_id)
        await self._commit(records)
        claimed = records[-1]
        assert isinstance(claimed, WakeClaimed)
        claims = TokenClaims(sub.id, sub.incarnation, claimed.generation, claimed.wake_id, now // 1000 + TOKEN_TTL_S)
        return json_response({
            "wake_id": claimed.wake_id,
            "generation": claimed.generation,
            "token": mint_token(key.token_secret, claims),
            "streams": self.subs.stream_infos(sub, self._streams(now_ms())),
            "lease_ttl_ms": sub.lease_ttl_ms,
        })

    # ------------------------------------------------------------- keys

    async def jwks(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return _not_allowed(request.method, "GET, HEAD")
        await self.delivery.ensure_signing_key()
        return json_response(self.subs.jwks(), 200, {"Cache-Control": "public, max-age=300"},
                             content_type="application/jwk-set+json")
