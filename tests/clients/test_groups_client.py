"""``GroupConsumer`` against a scripted group server: what the client does when retention passed its position.

The fake server (aiohttp, on 127.0.0.1) answers join, heartbeat and leave with
a fixed member view and serves one stream whose data below ``RETAINED`` is
gone (410 with the retained offset in ``Stream-Next-Offset``, as tiered
answers). The client must continue from the retained offset and hand the
skipped range to the application in the next batch, never stop reading the
stream (issue 18, defect 9: it used to treat the 410 like a deleted stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tiered.core.ids import format_offset
from tiered_client.groups import Batch, GroupConsumer

pytestmark = pytest.mark.timeout(60)

STREAM = "orders/eu"
DATA = b"0123456789abcdef"
RETAINED = 5


def off(n: int) -> str:
    return format_offset(n)


class FakeGroupServer:
    """One group, one member, one stream: the member view is fixed, the stream retained from ``retained``."""

    def __init__(
        self, cursor: int, *, skipped: dict[str, Any] | None = None, closed: bool = False, gone: bool = False
    ) -> None:
        assignment: dict[str, Any] = {"stream": STREAM, "fence": 7, "cursor": off(cursor), "revoked": False}
        if skipped is not None:
            assignment["skipped"] = skipped
        self.view = {
            "group": "billing",
            "incarnation": 1,
            "revision": 3,
            "member": "w1",
            "generation": 2,
            "bucket": "default",
            "session_timeout_ms": 3000,
            "assignments": [assignment],
            "pending": [],
        }
        self.closed = closed
        self.gone = gone  # soft-deleted: 410 without a retained offset
        self.reads: list[str] = []
        self.commits: list[dict[str, Any]] = []
        self.server: TestServer | None = None

    async def __aenter__(self) -> FakeGroupServer:
        app = web.Application()
        app.router.add_post("/v1/groups/billing/join", self.join)
        app.router.add_post("/v1/groups/billing/heartbeat", self.heartbeat)
        app.router.add_post("/v1/groups/billing/leave", self.leave)
        app.router.add_get("/v1/stream/{path:.*}", self.read)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        await self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"

    async def join(self, request: web.Request) -> web.Response:
        return web.json_response(self.view)

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.commits += body.get("commits", [])
        if body.get("wait_ms"):
            await asyncio.sleep(min(body["wait_ms"], 200) / 1000)
        return web.json_response({**self.view, "rejected": []})

    async def leave(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.commits += body.get("commits", [])
        return web.json_response({"group": "billing", "member": "w1", "left": True, "rejected": []})

    async def read(self, request: web.Request) -> web.Response:
        assert request.match_info["path"] == STREAM
        offset = request.query["offset"]
        self.reads.append(offset)
        end = RETAINED if self.closed else len(DATA)
        if self.gone:
            return web.json_response({"error": {"code": "STREAM_DELETED", "message": "gone"}}, status=410)
        if offset < off(RETAINED):
            return web.json_response(
                {
                    "error": {
                        "code": "OFFSET_GONE",
                        "message": "no longer retained",
                        "next_offset": off(RETAINED),
                    }
                },
                status=410,
                headers={"Stream-Next-Offset": off(RETAINED)},
            )
        headers = {"Stream-Next-Offset": off(end), "Stream-Up-To-Date": "true", "Content-Type": "text/plain"}
        if self.closed:
            headers["Stream-Closed"] = "true"
        if "live" in request.query:
            await asyncio.sleep(0.2)
            return web.Response(status=204, headers=headers)
        start = int(offset.split("_")[1])
        return web.Response(status=200, body=DATA[start:end], headers=headers)


def run(server: FakeGroupServer, scenario: Callable[[GroupConsumer], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with server:
            async with GroupConsumer(server.url, "billing", "w1", commit_interval_s=0.05) as consumer:
                async with asyncio.timeout(10):
                    return await scenario(consumer)

    return asyncio.run(main())


async def first(consumer: GroupConsumer) -> Batch:
    """The first batch, committed (and the commit acknowledged)."""
    batch = await consumer.__anext__()
    assert consumer.commit(batch)
    await consumer.flush()
    return batch


def test_a_read_below_the_retained_offset_continues_from_it_and_reports_the_gap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """fb04ba4: the 410 stopped the stream's reader for good; no batch ever came."""
    server = FakeGroupServer(cursor=2)
    with caplog.at_level(logging.WARNING, logger="tiered_client.groups"):
        batch = run(server, first)
    assert (batch.stream, batch.offset, batch.next_offset, batch.data, batch.fence) == (
        STREAM,
        off(RETAINED),
        off(len(DATA)),
        DATA[RETAINED:],
        7,
    )
    s = batch.skipped
    assert s is not None and (s.stream, s.from_offset, s.to_offset, s.bytes) == (STREAM, off(2), off(5), None)
    assert server.reads[:2] == [off(2), off(RETAINED)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"w1: group 'billing': data of stream {STREAM!r} from {off(2)} to {off(5)} is no longer "
        "retained; continuing from the retained offset (the next batch reports the skipped range)"
    ]
    # Committing the batch commits its end: the group's cursor moves past the gap too.
    assert server.commits[-1] == {"stream": STREAM, "fence": 7, "offset": off(len(DATA))}


def test_a_skip_the_server_reported_in_the_assignment_reaches_the_first_batch() -> None:
    skipped = {"from": off(0), "to": off(RETAINED), "bytes": RETAINED}
    server = FakeGroupServer(cursor=RETAINED, skipped=skipped)
    batch = run(server, first)
    assert (batch.offset, batch.data) == (off(RETAINED), DATA[RETAINED:])
    s = batch.skipped
    assert s is not None and (s.stream, s.from_offset, s.to_offset, s.bytes) == (STREAM, off(0), off(5), 5)
    assert server.reads[0] == off(RETAINED)  # never read below the moved cursor


def test_only_the_first_batch_after_a_gap_carries_it() -> None:
    server = FakeGroupServer(cursor=2)

    async def two(consumer: GroupConsumer) -> tuple[Batch, Batch | None]:
        one = await consumer.__anext__()
        server.view["assignments"][0]["cursor"] = off(len(DATA))
        try:
            async with asyncio.timeout(1):
                return one, await consumer.__anext__()
        except TimeoutError:
            return one, None

    one, two_ = run(server, two)
    assert one.skipped is not None and two_ is None  # nothing else to read: no second batch, no second report


def test_a_gap_up_to_the_end_of_a_closed_stream_is_still_handed_out() -> None:
    """Nothing follows the gap (the stream closed at the retained offset): an empty batch carries it."""
    server = FakeGroupServer(cursor=1, closed=True)
    batch = run(server, first)
    assert (batch.offset, batch.next_offset, batch.data) == (off(RETAINED), off(RETAINED), b"")
    s = batch.skipped
    assert s is not None and (s.from_offset, s.to_offset) == (off(1), off(RETAINED))


def test_a_deleted_stream_still_stops_its_reader() -> None:
    """A 410 without a retained offset (a soft-deleted stream) is not a gap: the reader stops, as before."""
    server = FakeGroupServer(cursor=0, gone=True)

    async def none(consumer: GroupConsumer) -> Batch | None:
        try:
            async with asyncio.timeout(1):
                return await consumer.__anext__()
        except TimeoutError:
            return None

    assert run(server, none) is None
    assert server.reads == [off(0)]


def test_close_while_a_long_poll_is_being_abandoned_returns() -> None:
    """close() cancels the heartbeat task; if that lands while the task waits for the long-poll it just
    abandoned (a commit kicked it), the cancellation must not be taken for the long-poll's own: it used to
    be swallowed there, the loop went on heartbeating and close() (and ``async with``) never returned."""
    server = FakeGroupServer(cursor=RETAINED)

    async def main() -> None:
        async with server:
            consumer = GroupConsumer(server.url, "billing", "w1")
            real_post = consumer._post
            in_long_poll, abandoning = asyncio.Event(), asyncio.Event()

            async def post(action: str, body: dict[str, Any], timeout: float = 10.0) -> tuple[int, Any]:
                if action != "heartbeat" or not body["wait_ms"]:
                    return await real_post(action, body, timeout)
                in_long_poll.set()
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    abandoning.set()
                    await asyncio.sleep(0.2)  # giving the connection back takes a moment
                    raise
                raise AssertionError("unreachable")

            consumer._post = post  # type: ignore[method-assign]
            await consumer.start()
            async with asyncio.timeout(10):
                await in_long_poll.wait()
            consumer._kick.set()  # what a commit does: the long-poll is abandoned to send it
            async with asyncio.timeout(10):
                await abandoning.wait()
            closing = asyncio.ensure_future(consumer.close())
            done, _ = await asyncio.wait({closing}, timeout=5)  # a bound for a hang: it takes milliseconds
            assert consumer._hb_task is not None
            heartbeats_ended = consumer._hb_task.done()
            consumer._hb_task.cancel()  # a second cancellation ends it even when the first was swallowed
            await closing
            assert closing in done and heartbeats_ended, "close() waited for a heartbeat loop that went on"

    asyncio.run(main())
