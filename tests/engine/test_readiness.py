"""``/readyz``: ready only once recovery finished and the object store answered; ``/healthz`` meanwhile.

A node is held in the middle of its start (after the journal replay, before
the store opens: ``GatedNode``) to read its readiness while recovering; then
it is served over HTTP with no background job, so the store has not been
probed yet (not ready, but live), and one probe makes it ready. A live
``tiered serve`` gets ready by itself (its probe job).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.deadlines import scaled
from tests.support.gc_support import Harness, VirtualClock, make_config
from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess
from tiered.api.app import build_handler
from tiered.api.kit.aiohttp_server import AiohttpListener
from tiered.cold.objects.store import ObjectStore
from tiered.engine.engine import Engine

pytestmark = pytest.mark.timeout(60)


class GatedNode(Engine):
    """A node whose start waits, after recovering its journal, until the test opens the gate."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reached = asyncio.Event()
        self.gate = asyncio.Event()

    async def _open_store(self, *, read_only: bool, probe: bool) -> ObjectStore:
        self.reached.set()
        await self.gate.wait()
        return await super()._open_store(read_only=read_only, probe=probe)


def test_ready_only_after_recovery_and_an_answer_from_the_store(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")
    clock = VirtualClock()

    async def main() -> None:
        first = Harness(config, clock=clock)
        await first.start()
        await first.bucket("b")
        await first.create("b", "s", b"recovered bytes")
        await first.stop()

        node = GatedNode(config, clock)
        starting = asyncio.create_task(node.start(jobs=False))
        await asyncio.wait_for(node.reached.wait(), 10)
        assert len(node.state.streams) == 1  # the journal is replayed...
        ready, checks = node.readiness()
        assert not ready and checks["recovered"] is False  # ...but recovery has not finished
        node.gate.set()
        await asyncio.wait_for(starting, 10)

        listener = AiohttpListener(build_handler(node), max_body_bytes=config.max_body_bytes)
        [(_, port)] = await listener.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:

                async def get(path: str) -> tuple[int, dict[str, Any]]:
                    async with session.get(f"http://127.0.0.1:{port}{path}") as r:
                        return r.status, json.loads(await r.read())

                status, body = await get("/readyz")  # recovered; the store not probed yet
                assert status == 503
                assert body["ready"] is False and body["recovered"] is True and body["journal"] == "ok"
                assert body["store"]["reachable"] is None
                status, body = await get("/healthz")  # live all the same
                assert status == 200 and body["ok"] is True

                assert node.store is not None
                assert await node.store_health.probe(node.store, 5.0)
                status, body = await get("/readyz")
                assert status == 200
                assert body["ready"] is True and body["store"]["reachable"] is True
        finally:
            await listener.stop()
            await node.stop()

    asyncio.run(main())


def test_a_live_server_gets_ready_by_itself(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", "--store-probe-interval-s", "0.2").start()
    try:
        deadline = time.monotonic() + scaled(15)
        while (status := request("GET", srv.url + "/readyz")[0]) != 200 and time.monotonic() < deadline:
            assert status == 503
            time.sleep(0.05)
        status, _, raw = request("GET", srv.url + "/readyz")
        body = json.loads(raw)
        assert status == 200 and body["ready"] is True and body["recovered"] is True
        assert body["store"]["reachable"] is True and body["journal"] == "ok"
    finally:
        assert srv.stop() == 0
