"""The forwarder after an ownership change: reads and producer appends follow the shard to its new owner.

In process: a ``ShardRouter`` alone (no feature) with a stand-in cluster view and two
loopback aiohttp servers as the old and the new owner. The old owner answers
503 ``SHARD_NOT_OWNED`` (and, answering, the view moves the shard to the new
owner, as a lease read would). A GET and a producer append are retried onto the
new owner; a plain POST the old owner saw is not (503 + ``Retry-After`` to the
client), but one that never left this node (connection refused) is.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from tiered.api.kit.errors import map_errors
from tiered.api.kit.types import Request, Response
from tiered.cluster.gateway.forward import FORWARDED_BY, Forwarder
from tiered.cluster.gateway.shard_router import FORWARD_TRIES, ShardRouter
from tiered.core.clock import SystemClock

pytestmark = pytest.mark.timeout(30)

_MOVED = json.dumps({"error": {"code": "SHARD_NOT_OWNED", "message": "not mine"}})


class View:
    """What a ``ShardRouter`` asks of ``ClusterServer`` (a ``ShardView``); every shard's owner is ``owner``."""

    def __init__(self, owner: tuple[str, str]) -> None:
        self.owner = owner
        self.node_id = "here"
        self.clock = SystemClock()

    def shard_of(self, bucket: str, name: str) -> int:
        return 0

    def shard_count(self) -> int:
        return 1

    def local_engine(self, shard: int) -> None:
        return None

    def owner_url(self, shard: int) -> tuple[str, str]:
        return self.owner

    def check_acknowledge(self, shard: int) -> None:
        raise AssertionError("nothing is served here")

    async def durable(self, shard: int) -> None:
        raise AssertionError("nothing is served here")


def router(view: View, forwarder: Forwarder, no_engine: Any) -> ShardRouter:
    """Routing alone: a lease TTL + margin of 1.8 s to follow a shard in."""
    return ShardRouter(
        view, forwarder, node_routes=no_engine, engine_handler=lambda engine: no_engine, retry_window_s=1.8
    )


async def _serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _scenario(method: str, headers: dict[str, str], *, old_dead: bool = False) -> dict[str, Any]:
    seen: dict[str, list[bytes]] = {"old": [], "new": []}
    view: View

    async def old(request: web.Request) -> web.Response:
        seen["old"].append(await request.read())
        view.owner = ("new", new_url)  # the lease moved while the old owner refused
        return web.Response(
            status=503, text=_MOVED, content_type="application/json", headers={"Retry-After": "1"}
        )

    async def new(request: web.Request) -> web.Response:
        assert request.headers[FORWARDED_BY] == "here"
        seen["new"].append(await request.read())
        return web.Response(status=204 if request.method == "POST" else 200, body=b"from-new")

    new_runner, new_url = await _serve(new)
    old_runner, old_url = await _serve(old)
    if old_dead:
        await old_runner.cleanup()
        old_url = _closed_port()
    view = View(("old", old_url))
    forwarder = Forwarder("here", connect_timeout_s=2.0, read_timeout_s=5.0)

    async def no_engine(request: Request) -> Response:
        raise AssertionError("not served here")

    route = map_errors(router(view, forwarder, no_engine).route)

    async def body() -> bytes:
        return b"payload"

    try:
        if old_dead:
            # The view learns of the new owner a moment later (a lease read).
            asyncio.get_running_loop().call_later(0.1, setattr, view, "owner", ("new", new_url))
        response = await route(Request(method, "/v1/stream/s", "", headers, body))
    finally:
        await forwarder.close()
        await new_runner.cleanup()
        if not old_dead:
            await old_runner.cleanup()
    return {"status": response.status, "headers": response.headers, "body": response.body, **seen}


PRODUCER = {"Producer-Id": "p1", "Producer-Epoch": "0", "Producer-Seq": "7"}


def test_a_read_is_retried_on_the_new_owner() -> None:
    out = asyncio.run(_scenario("GET", {}))
    assert (out["status"], out["body"]) == (200, b"from-new")
    assert (len(out["old"]), len(out["new"])) == (1, 1)


def test_a_producer_append_is_retried_on_the_new_owner_with_its_body() -> None:
    out = asyncio.run(_scenario("POST", {"Content-Type": "application/octet-stream", **PRODUCER}))
    assert out["status"] == 204
    assert out["old"] == [b"payload"] and out["new"] == [b"payload"]


def test_a_plain_append_the_old_owner_saw_is_not_resent() -> None:
    out = asyncio.run(_scenario("POST", {"Content-Type": "application/octet-stream"}))
    assert out["status"] == 503 and out["headers"]["Retry-After"] == "1"
    assert b"SHARD_NOT_OWNED" in out["body"]
    assert (out["old"], out["new"]) == ([b"payload"], [])


def test_a_producer_append_missing_its_seq_is_not_idempotent() -> None:
    headers = {"Producer-Id": "p1", "Producer-Epoch": "0"}
    out = asyncio.run(_scenario("POST", headers))
    assert out["status"] == 503 and out["new"] == []


def test_a_plain_append_that_never_left_is_sent_to_the_new_owner() -> None:
    out = asyncio.run(_scenario("POST", {"Content-Type": "application/octet-stream"}, old_dead=True))
    assert out["status"] == 204 and out["new"] == [b"payload"]


def test_retries_are_bounded_when_every_owner_refuses() -> None:
    async def run() -> tuple[int, int]:
        calls = 0
        view: View

        async def refuse(request: web.Request) -> web.Response:
            nonlocal calls
            calls += 1
            view.owner = (f"o{calls}", url)  # a new owner each time, all refusing
            return web.Response(status=503, text=_MOVED, content_type="application/json")

        runner, url = await _serve(refuse)
        view = View(("o0", url))
        forwarder = Forwarder("here")

        async def no_engine(request: Request) -> Response:
            raise AssertionError

        route = router(view, forwarder, no_engine).route

        async def body() -> bytes:
            return b""

        try:
            response = await route(Request("GET", "/v1/stream/s", "", {}, body))
        finally:
            await forwarder.close()
            await runner.cleanup()
        return response.status, calls

    assert asyncio.run(run()) == (503, FORWARD_TRIES)
