"""Helpers for the subscription tests: a webhook receiver on 127.0.0.1 and JSON shortcuts.

``WebhookReceiver`` is an aiohttp test server running on its own event loop
in a thread, so the blocking black-box tests can use it. It records every
request (raw body, parsed JSON, headers) and answers with what ``respond``
returns for it (default: 200 ``{}``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.support.deadlines import scaled
from tests.support.http_helpers import Headers, request

Respond = Callable[[int, dict[str, Any]], tuple[int, Any]]


@dataclass
class Received:
    raw: bytes
    body: dict[str, Any]
    headers: dict[str, str]
    at: float


class WebhookReceiver:
    def __init__(self, respond: Respond | None = None) -> None:
        self.respond: Respond = respond or (lambda i, body: (200, {}))
        self.received: list[Received] = []
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: TestServer = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> TestServer:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        return server

    async def _handle(self, req: web.Request) -> web.Response:
        raw = await req.read()
        body = json.loads(raw)
        with self._cond:
            index = len(self.received)
            self.received.append(Received(raw, body, dict(req.headers), time.monotonic()))
            self._cond.notify_all()
        status, answer = self.respond(index, body)
        return web.json_response(answer, status=status)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/hook"

    def wait_for(self, count: int = 1, timeout: float = 10.0) -> Received:
        """The ``count``-th request (1-based), waiting for it."""
        deadline = time.monotonic() + scaled(timeout)
        with self._cond:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"only {len(self.received)} webhook requests arrived, wanted {count}"
                    )
                self._cond.wait(left)
            return self.received[count - 1]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def verify_signature(received: Received, jwks: dict[str, Any], window_s: int = 300) -> bool:
    """Check ``Webhook-Signature`` the way the protocol tells receivers to."""
    header = received.headers.get("Webhook-Signature", "")
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if set(fields) != {"t", "kid", "ed25519"} or abs(time.time() - int(fields["t"])) > window_s:
        return False
    key = next((k for k in jwks["keys"] if k["kid"] == fields["kid"]), None)
    if key is None:
        return False
    public = Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(key["x"] + "=="))
    signature = base64.urlsafe_b64decode(fields["ed25519"] + "=" * (-len(fields["ed25519"]) % 4))
    try:
        public.verify(signature, fields["t"].encode() + b"." + received.raw)
    except Exception:
        return False
    return True


def call(
    method: str, url: str, body: Any = None, token: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, Headers]:
    """A JSON request: (status, parsed body or None, headers (case-insensitive))."""
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    status, resp_headers, raw = request(method, url, hdrs, data)
    parsed = json.loads(raw) if raw else None
    return status, parsed, resp_headers


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        time.sleep(interval)
