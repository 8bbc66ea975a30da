"""The frames workers forward requests in: the format (pure), and both halves on a real Unix socket.

The owner's half (``FrameServer``) runs a scripted handler; the receiving
worker's half is the ``Forwarder`` itself (or its ``FrameChannel``), so each
test sees what a forwarded request looks like to the owner and what comes
back to the worker the client reached.
"""

from __future__ import annotations

import asyncio
import os
import stat
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.deadlines import Deadline, scaled
from tiered.api.kit.errors import ClientDisconnected, error_response
from tiered.api.kit.rsgi_server import RsgiHeaders
from tiered.api.kit.target import parse_target
from tiered.api.kit.types import Handler, Request, Response
from tiered.cluster.gateway.forward import Forwarder, ForwardFailed, unix_url
from tiered.cluster.gateway.forward_batch import TurnBatch
from tiered.cluster.gateway.forward_channel import ChannelFailed, FrameChannel, _Conn, frames_socket
from tiered.cluster.gateway.forward_frames import (
    ASK,
    CANCEL,
    CHUNK,
    END,
    HEAD,
    HEAD_SIZE,
    WHOLE,
    Ask,
    FrameError,
    FrameReader,
    Said,
    decode_ask,
    frame,
    max_answer_bytes,
)
from tiered.cluster.gateway.forward_serve import FrameServer
from tiered.core.config import Config
from tiered.core.logs import REQUEST_ID

MiB = 1024 * 1024


# ---------------------------------------------------------------- the format


def _ask(path: str = "/v1/stream/a", **headers: str) -> Ask:
    query = {"offset": "-1"}
    target = parse_target("GET", path, query, RsgiHeaders({}))
    return Ask("GET", path, "offset=-1", dict(headers), "http", "h:1", "rid-1", target)


def test_a_request_frame_round_trips_with_its_parsed_target() -> None:
    ask = _ask(authorization="Bearer t")
    reader = FrameReader(max_body=10)
    [(kind, rid, meta, body)] = reader.feed(frame(ASK, ask, b"0123456789", rid=7))
    assert (kind, rid, body) == (ASK, 7, b"0123456789")
    got = decode_ask(meta)
    assert got == ask and got.target == ask.target and got.target is not None
    assert got.target.family is ask.target.family and got.target.stream == "a"  # type: ignore[union-attr]


def test_frames_split_over_reads_and_packed_in_one_are_each_found_whole() -> None:
    one, two = frame(ASK, _ask(), b"x" * 100), frame(WHOLE, Said(200, {"a": "b"}), b"")
    reader = FrameReader(max_body=1000)
    got: list[tuple[int, int, bytes, bytes]] = []
    for i in range(len(one)):  # byte by byte: nothing comes out until the frame is whole
        got += reader.feed(one[i : i + 1])
        assert len(got) == (1 if i == len(one) - 1 else 0)
    got += reader.feed(two + one[:5])  # one whole frame, and the start of the next
    assert [g[0] for g in got] == [ASK, WHOLE] and got[0][3] == b"x" * 100
    assert reader.pending == 5
    got = reader.feed(one[5:])
    assert len(got) == 1 and got[0][3] == b"x" * 100 and reader.pending == 0


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack("!BIII", 0x00, 1, 0, 0),  # no such kind
        struct.pack("!BIII", ASK, 1, 0, 11),  # a body over the limit
        struct.pack("!BIII", ASK, 1, 2 * MiB, 0),  # a head over the limit
    ],
)
def test_bytes_that_are_not_a_frame_are_refused(raw: bytes) -> None:
    with pytest.raises(FrameError):
        FrameReader(max_body=10).feed(raw + b"\0" * 4)


def test_a_meta_that_is_not_a_request_is_refused() -> None:
    with pytest.raises(FrameError):
        decode_ask(b"\x93\x01\x02\x03")


def test_the_frame_socket_sits_beside_the_http_socket() -> None:
    assert frames_socket("/tmp/x/w1.sock") == "/tmp/x/w1.frames"


# ---------------------------------------------------------------- both halves on a socket


class Owner:
    """A frame server with a scripted handler; what it was asked, as the owner saw it."""

    def __init__(self, tmp_path: Path, handler: Handler) -> None:
        self.http_socket = tmp_path / "w1.sock"  # what the sibling advertises (nothing listens: frames only)
        self.path = Path(frames_socket(str(self.http_socket)))
        self.server = FrameServer(handler, max_body_bytes=64 * MiB)

    @property
    def url(self) -> str:
        return unix_url(str(self.http_socket))


Scenario = Callable[[Owner, Forwarder], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def loop(request: pytest.FixtureRequest) -> str:
    """Each scenario on asyncio's own loop and on uvloop's (what workers run: its transports differ)."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
    return str(request.param)


def _run(tmp_path: Path, handler: Handler, scenario: Scenario, loop: str = "asyncio") -> None:
    async def main() -> None:
        owner = Owner(tmp_path, handler)
        await owner.server.start(owner.path)
        forwarder = Forwarder("w0", connect_timeout_s=2, read_timeout_s=10)
        try:
            await asyncio.wait_for(scenario(owner, forwarder), scaled(60))
        finally:
            await forwarder.close()
            await owner.server.stop()

    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def _request(method: str, path: str, body: bytes = b"", query: str = "", **headers: str) -> Request:
    async def read() -> bytes:
        return body

    lowered = {k.lower().replace("_", "-"): v for k, v in headers.items()}
    return Request(method, path, query, RsgiHeaders(lowered), read, host="node.example:8080")


def test_a_forwarded_request_reaches_the_owner_as_the_receiver_parsed_it(tmp_path: Path, loop: str) -> None:
    seen: list[tuple[Request, bytes, str | None]] = []

    async def handler(request: Request) -> Response:
        seen.append((request, await request.body(), REQUEST_ID.get()))
        return Response(201, {"Stream-Next-Offset": "7", "Connection": "close", "Location": "/x"}, b"made")

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        req = _request(
            "POST",
            "/v1/buckets/bk1/stream/s%20t",
            b"\x00payload\xff",
            "q=1",
            authorization="Bearer secret-1",
            producer_id="p",
            content_type="application/octet-stream",
            connection="keep-alive",
            transfer_encoding="chunked",
        )
        parsed = req.target
        REQUEST_ID.set("rid-42")
        answer = await forwarder.forward(req, owner.url, 3)
        assert (answer.status, answer.body) == (201, b"made")
        assert answer.headers == {"Stream-Next-Offset": "7", "Location": "/x"}  # hop-by-hop dropped
        [(got, body, request_id)] = seen
        assert body == b"\x00payload\xff" and request_id == "rid-42"
        assert (got.method, got.path, got.query_string, got.host) == (req.method, req.path, "q=1", req.host)
        assert got.target == parsed and got.target.bucket == "bk1" and got.target.stream == "s t"
        assert got.query == {"q": "1"}
        # the credential the owner authorizes is the one the client sent, under any spelling of its name
        assert got.headers.get("Authorization") == "Bearer secret-1" == got.headers.get("authorization")
        assert got.headers.get("Producer-Id") == "p"
        assert got.headers.get("Tiered-Forwarded-By") == "w0"  # never forwarded again by the owner
        assert got.headers.get("Connection") is None and got.headers.get("Transfer-Encoding") is None
        assert forwarder.forwarded == 1

    _run(tmp_path, handler, scenario, loop)


def test_the_owner_judges_the_target_it_was_routed_by_and_never_parses_again(
    tmp_path: Path, loop: str
) -> None:
    targets = []

    async def handler(request: Request) -> Response:
        targets.append(request.target)
        return Response(204)

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        channel = FrameChannel(str(owner.path), connect_timeout_s=2, read_timeout_s=5, max_body=MiB)
        routed = parse_target("GET", "/v1/buckets/routed/stream/x", {}, RsgiHeaders({}))
        ask = Ask("GET", "/v1/buckets/other/stream/y", "", {}, "http", "", "", routed)
        answer = await channel.request(ask, b"")
        await channel.close()
        assert answer.status == 204
        assert targets == [routed]  # the carried value, not a parse of the path beside it

    _run(tmp_path, handler, scenario, loop)


def test_large_bodies_travel_byte_exact_both_ways_on_one_reused_connection(tmp_path: Path, loop: str) -> None:
    big = os.urandom(6 * MiB)

    async def handler(request: Request) -> Response:
        body = await request.body()
        return Response(200, {"Content-Type": "application/octet-stream"}, body[::-1])

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        for i in range(3):
            body = big[i:]
            answer = await forwarder.forward(_request("POST", "/v1/stream/big", body), owner.url, 0)
            assert answer.status == 200 and answer.body == body[::-1]
        assert len(owner.server.connections) == 1  # one persistent connection carried all three

    _run(tmp_path, handler, scenario, loop)


async def _collect(body: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in body]


def test_an_event_stream_is_passed_on_as_the_owner_writes_it(tmp_path: Path, loop: str) -> None:
    more = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        await more.wait()  # the first event must reach the reader before the second exists
        yield b"data: two\n\n"

    async def handler(request: Request) -> Response:
        return Response(200, {"Content-Type": "text/event-stream"}, events())

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        req = _request("GET", "/v1/stream/s", query="offset=-1&live=sse")
        answer = await forwarder.forward(req, owner.url, 0)
        assert answer.status == 200 and answer.headers["Content-Type"] == "text/event-stream"
        assert not isinstance(answer.body, bytes)
        body = answer.body.__aiter__()
        assert await body.__anext__() == b"data: one\n\n"
        more.set()
        assert await _collect(body) == [b"data: two\n\n"]
        # the connection is reusable once the stream ended cleanly
        again = await forwarder.forward(
            _request("GET", "/v1/stream/s", query="offset=-1&live=sse"), owner.url, 0
        )
        more.set()
        assert not isinstance(again.body, bytes) and len(await _collect(again.body)) == 2
        assert len(owner.server.connections) == 1

    _run(tmp_path, handler, scenario, loop)


def test_a_stream_that_fails_on_the_owner_reaches_the_reader_cut_not_ended(tmp_path: Path, loop: str) -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        raise OSError("the disk went away")

    async def handler(request: Request) -> Response:
        return Response(200, {"Content-Type": "text/event-stream"}, events())

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        answer = await forwarder.forward(_request("GET", "/v1/stream/s", query="live=sse"), owner.url, 0)
        assert not isinstance(answer.body, bytes)
        body = answer.body.__aiter__()
        assert await body.__anext__() == b"data: one\n\n"
        with pytest.raises(ChannelFailed):
            await body.__anext__()

    _run(tmp_path, handler, scenario, loop)


def test_a_reader_that_leaves_ends_the_owners_stream(tmp_path: Path, loop: str) -> None:
    closed = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: x\n\n"
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    async def handler(request: Request) -> Response:
        return Response(200, {"Content-Type": "text/event-stream"}, events())

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        answer = await forwarder.forward(_request("GET", "/v1/stream/s", query="live=sse"), owner.url, 0)
        assert not isinstance(answer.body, bytes)
        body = answer.body.__aiter__()
        assert await body.__anext__() == b"data: x\n\n"
        await body.aclose()  # type: ignore[attr-defined]
        await asyncio.wait_for(closed.wait(), scaled(10))

    _run(tmp_path, handler, scenario, loop)


@pytest.mark.parametrize("method", ["GET", "POST"])  # a read's own connection; the shared one writes use
def test_a_client_that_leaves_mid_request_cancels_it_on_the_owner(
    tmp_path: Path, loop: str, method: str
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: Request) -> Response:
        started.set()
        try:
            await asyncio.sleep(60)  # a long-poll
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Response(204)

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        task = asyncio.ensure_future(forwarder.forward(_request(method, "/v1/stream/s"), owner.url, 0))
        await asyncio.wait_for(started.wait(), scaled(10))
        task.cancel()
        await asyncio.wait_for(cancelled.wait(), scaled(10))
        if method == "POST":  # the shared connection stays, for every other write
            assert len(owner.server.connections) == 1

    _run(tmp_path, handler, scenario, loop)


def test_an_owner_dying_mid_forward_is_a_503_to_retry(tmp_path: Path) -> None:
    started = asyncio.Event()

    async def handler(request: Request) -> Response:
        started.set()
        await asyncio.sleep(60)
        return Response(204)

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        task = asyncio.ensure_future(forwarder.forward(_request("POST", "/v1/stream/s", b"x"), owner.url, 5))
        await asyncio.wait_for(started.wait(), scaled(10))
        await owner.server.stop()  # the owner's connections go, as when its process is killed
        with pytest.raises(ForwardFailed) as failed:
            await task
        assert failed.value.sent  # it may have been applied: a plain write is not resent
        answer = error_response(failed.value)
        assert answer.status == 503 and answer.headers.get("Retry-After") == "1"
        # nothing listens now: "not sent", which the shard router may retry on the next owner
        with pytest.raises(ForwardFailed) as unreachable:
            await forwarder.forward(_request("POST", "/v1/stream/s", b"x"), owner.url, 5)
        assert not unreachable.value.sent

    _run(tmp_path, handler, scenario, loop)


def test_a_request_cut_off_mid_frame_is_never_served(tmp_path: Path, loop: str) -> None:
    served: list[bytes] = []

    async def handler(request: Request) -> Response:
        served.append(await request.body())
        return Response(204)

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        whole = frame(ASK, Ask("POST", "/v1/stream/s", "", {}, "http", "", ""), b"A" * 100_000)
        _, writer = await asyncio.open_unix_connection(str(owner.path))
        writer.write(whole[: HEAD_SIZE + 50_000])  # the sender died half way through the body
        await writer.drain()
        writer.close()
        deadline = Deadline(10)
        while owner.server.connections and not deadline.expired():
            await asyncio.sleep(0.01)
        assert not owner.server.connections, f"the cut connection still open after {deadline}"
        answer = await forwarder.forward(_request("POST", "/v1/stream/s", b"whole"), owner.url, 0)
        assert answer.status == 204
        assert served == [b"whole"]  # the half-sent append never reached the handler

    _run(tmp_path, handler, scenario, loop)


def test_a_header_that_is_not_text_is_forwarded_as_http_instead(tmp_path: Path, loop: str) -> None:
    async def handler(request: Request) -> Response:
        raise AssertionError("a frame cannot carry it")

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        req = _request("GET", "/v1/stream/s", x_odd="\udcff")
        with pytest.raises(ForwardFailed) as failed:  # the HTTP socket: nobody listens in this test
            await forwarder.forward(req, owner.url, 0)
        assert not failed.value.sent

    _run(tmp_path, handler, scenario, loop)


def test_the_frame_socket_is_open_to_its_user_only(tmp_path: Path, loop: str) -> None:
    async def handler(request: Request) -> Response:
        return Response(204)

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        mode = stat.S_IMODE(owner.path.stat().st_mode)
        assert mode & 0o077 == 0, oct(mode)

    _run(tmp_path, handler, scenario, loop)


def test_concurrent_writes_share_one_connection_each_answer_to_its_own_request(
    tmp_path: Path, loop: str
) -> None:
    async def handler(request: Request) -> Response:
        body = await request.body()
        await asyncio.sleep(0.001 * (body[-1] % 7))  # answers come back out of order
        return Response(200, {"Stream-Next-Offset": body.decode()}, body + b"!")

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        bodies = [f"append-{i}".encode() for i in range(300)]
        answers = await asyncio.gather(
            *(forwarder.forward(_request("POST", "/v1/stream/s", b), owner.url, 0) for b in bodies)
        )
        for body, answer in zip(bodies, answers, strict=True):
            assert (answer.status, answer.body) == (200, body + b"!")
            assert answer.headers["Stream-Next-Offset"] == body.decode()
        assert len(owner.server.connections) == 1

    _run(tmp_path, handler, scenario, loop)


def test_a_request_cancelled_before_it_left_is_never_started(tmp_path: Path, loop: str) -> None:
    served: list[bytes] = []

    async def handler(request: Request) -> Response:
        served.append(await request.body())
        return Response(204)

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        ask = Ask("POST", "/v1/stream/s", "", {}, "http", "", "")
        reader, writer = await asyncio.open_unix_connection(str(owner.path))
        # the sender's client left before its request was written: both leave in one write
        writer.write(
            frame(ASK, ask, b"never", rid=5) + frame(CANCEL, rid=5) + frame(ASK, ask, b"kept", rid=6)
        )
        head = await asyncio.wait_for(reader.readexactly(HEAD_SIZE), scaled(10))
        kind, rid, meta_len, body_len = struct.unpack("!BIII", head)
        await reader.readexactly(meta_len + body_len)
        assert (kind, rid) == (WHOLE, 6)
        assert served == [b"kept"]
        writer.close()

    _run(tmp_path, handler, scenario, loop)


def test_a_streamed_answer_to_a_write_comes_back_whole(tmp_path: Path, loop: str) -> None:
    async def parts() -> AsyncIterator[bytes]:
        for piece in (b"a", b"b", b"c"):
            yield piece

    async def handler(request: Request) -> Response:
        return Response(200, {"Content-Type": "application/json"}, parts())

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        answer = await forwarder.forward(_request("POST", "/v1/stream/s", b"x"), owner.url, 0)
        assert (answer.status, answer.body) == (200, b"abc")

    _run(tmp_path, handler, scenario, loop)


def test_a_sibling_without_a_frame_socket_is_asked_over_http(tmp_path: Path, loop: str) -> None:
    heads: list[bytes] = []

    async def http_sibling(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(v)
            for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
        heads.append(head + await reader.readexactly(length))
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nLocation: /x\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def main() -> None:
        sock = tmp_path / "w1.sock"  # an HTTP socket, and no frame socket beside it
        server = await asyncio.start_unix_server(http_sibling, str(sock))
        forwarder = Forwarder("w0", connect_timeout_s=2, read_timeout_s=10)
        try:
            answer = await forwarder.forward(
                _request("POST", "/v1/stream/s", b"body"), unix_url(str(sock)), 0
            )
            assert (answer.status, answer.body, answer.headers.get("Location")) == (201, b"ok", "/x")
            [head] = heads
            assert head.startswith(b"POST /v1/stream/s HTTP/1.1\r\n") and head.endswith(b"\r\n\r\nbody")
            assert b"Tiered-Forwarded-By: w0" in head
        finally:
            await forwarder.close()
            server.close()

    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


class _Transport:
    """A connection's transport as the channel sees it: what it was told (reading paused, closed)."""

    def __init__(self) -> None:
        self.reading = True
        self.closed = False
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.written += parts

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_a_connection_paused_for_a_slow_reader_reads_again_before_it_is_pooled() -> None:
    """The end of a streamed answer arrives in the same read as the chunk that paused the connection
    (the reader is behind): it goes back to the pool reading, and the reader draining the rest of the
    answer (or leaving) no longer touches it."""

    async def main() -> None:
        channel = FrameChannel("/nowhere.frames", connect_timeout_s=1, read_timeout_s=5, max_body=MiB)
        conn = _Conn(channel, MiB)
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        answer = conn.send([b"ask"], 5)
        big = b"x" * (300 * 1024)  # over what is held for a slow reader
        conn.data_received(
            frame(HEAD, Said(200, {})) + frame(CHUNK, None, b"first") + frame(CHUNK, None, big) + frame(END)
        )
        got = await answer
        assert channel._idle == [conn] and conn.idle
        assert transport.reading  # paused by the big chunk, resumed at the end
        assert not isinstance(got.body, bytes)
        body = got.body.__aiter__()
        assert await body.__anext__() == b"first"
        transport.pause_reading()  # the connection's next request, paused for its own reader
        assert await body.__anext__() == big
        assert not transport.reading  # the old answer's reader did not resume the new one
        await body.aclose()  # type: ignore[attr-defined]
        assert not transport.closed  # leaving after the end closes nothing

    asyncio.run(main())


@pytest.mark.parametrize("opens", [True, False])
def test_a_write_whose_client_leaves_while_the_shared_connection_opens_leaves_alone(
    tmp_path: Path, loop: str, opens: bool
) -> None:
    """The first write starts opening the shared connection; its client leaves before it is open. The
    write that waits for the same connection is sent on it, or, if it could not be opened, fails as
    never sent (the forwarder then asks over HTTP), never as if its own client had left."""
    served: list[bytes] = []

    async def handler(request: Request) -> Response:
        served.append(await request.body())
        return Response(204)

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        channel = FrameChannel(str(owner.path), connect_timeout_s=2, read_timeout_s=5, max_body=MiB)
        opening = asyncio.Event()
        real_open = channel._open

        async def slow_open(factory: Callable[[], Any]) -> Any:
            await opening.wait()
            if not opens:
                raise ChannelFailed("cannot connect", sent=False)
            return await real_open(factory)

        channel._open = slow_open  # type: ignore[method-assign]
        ask = Ask("POST", "/v1/stream/s", "", {}, "http", "", "")
        first = asyncio.ensure_future(channel.request(ask, b"first"))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(channel.request(ask, b"second"))
        await asyncio.sleep(0)
        first.cancel()  # the first write's client leaves while the connection is being opened
        await asyncio.sleep(0)
        opening.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        try:
            if opens:
                answer = await asyncio.wait_for(second, scaled(10))
                assert answer.status == 204 and served == [b"second"]
            else:
                with pytest.raises(ChannelFailed) as failed:
                    await asyncio.wait_for(second, scaled(10))
                assert not failed.value.sent and served == []
        finally:
            await channel.close()

    _run(tmp_path, handler, scenario, loop)


@pytest.mark.parametrize("method", ["GET", "POST"])  # a read's own connection; the shared one
@pytest.mark.parametrize("fault", ["undecodable header", "client disconnected"])
def test_a_request_the_owner_cannot_answer_fails_at_once_never_at_the_timeout(
    tmp_path: Path, loop: str, method: str, fault: str
) -> None:
    """An answer that cannot be framed (a header value that is not text), or a handler that ends as if
    its client left: the request is cut (a 503 to retry, the outcome unknown) at once, and the
    connection serves the next request."""

    async def handler(request: Request) -> Response:
        if request.path.endswith("/fine"):
            return Response(200, {}, b"fine")
        if fault == "client disconnected":
            raise ClientDisconnected("as if")
        return Response(200, {"X-Odd": "\udcff"}, b"applied")

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        channel = FrameChannel(str(owner.path), connect_timeout_s=2, read_timeout_s=600, max_body=MiB)
        ask = Ask(method, "/v1/stream/s", "", {}, "http", "", "")
        try:
            with pytest.raises(ChannelFailed) as failed:
                await asyncio.wait_for(channel.request(ask, b"x"), scaled(5))
            assert failed.value.sent
            fine = Ask(method, "/v1/stream/fine", "", {}, "http", "", "")
            answer = await asyncio.wait_for(channel.request(fine, b"x"), scaled(5))
            assert (answer.status, answer.body) == (200, b"fine")
        finally:
            await channel.close()
        answer = error_response(ForwardFailed(0, str(failed.value), sent=True))
        assert answer.status == 503 and answer.headers.get("Retry-After") == "1"

    _run(tmp_path, handler, scenario, loop)


@pytest.mark.parametrize("fault", ["too large", "failed"])
def test_a_streamed_answer_to_a_write_that_cannot_come_back_whole_is_a_503_to_retry(
    tmp_path: Path, loop: str, fault: str
) -> None:
    """Past what the sender takes in one frame, or failing half way: cut, so the client gets a 503 with
    Retry-After (the outcome unknown), never a 500; the shared connection carries on."""

    async def parts() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"x" * 600
        if fault == "failed":
            raise OSError("the disk went away")

    async def handler(request: Request) -> Response:
        if request.path.endswith("/fine"):
            return Response(204)
        return Response(200, {"Content-Type": "application/json"}, parts())

    async def scenario(owner: Owner, forwarder: Forwarder) -> None:
        owner.server.max_answer_bytes = 1000 if fault == "too large" else 10_000
        with pytest.raises(ForwardFailed) as failed:
            await asyncio.wait_for(
                forwarder.forward(_request("POST", "/v1/stream/s", b"x"), owner.url, 0), scaled(5)
            )
        assert failed.value.sent
        answer = error_response(failed.value)
        assert answer.status == 503 and answer.headers.get("Retry-After") == "1"
        fine = await forwarder.forward(_request("POST", "/v1/stream/fine", b"x"), owner.url, 0)
        assert fine.status == 204 and len(owner.server.connections) == 1

    _run(tmp_path, handler, scenario, loop)


def test_the_answer_a_worker_takes_whole_is_bounded_by_what_the_service_answers_whole(
    tmp_path: Path, loop: str
) -> None:
    """A node's bound covers every body it answers whole; an answer past the sender's bound fails the
    request (a 503 to retry) as soon as its frame's head arrives, never buffered; the next is served."""
    config = Config(max_body_bytes=8 * MiB, read_chunk_bytes=2 * MiB)
    bound = max_answer_bytes(config)
    assert bound >= config.stream_snapshot_max_bytes + config.bootstrap_max_bytes
    assert bound >= config.max_body_bytes and bound < 2**31

    async def handler(request: Request) -> Response:
        return Response(200, {}, b"x" * (100 if request.path.endswith("/small") else 5000))

    async def scenario(owner: Owner, _: Forwarder) -> None:
        forwarder = Forwarder("w0", connect_timeout_s=2, read_timeout_s=600, max_answer_bytes=1000)
        try:
            for method in ("GET", "POST"):
                with pytest.raises(ForwardFailed) as failed:
                    await asyncio.wait_for(
                        forwarder.forward(_request(method, "/v1/stream/big", b"x"), owner.url, 0), scaled(5)
                    )
                assert failed.value.sent
                small = await forwarder.forward(_request(method, "/v1/stream/small", b"x"), owner.url, 0)
                assert small.body == b"x" * 100
        finally:
            await forwarder.close()

    _run(tmp_path, handler, scenario, loop)


def test_frames_queued_in_one_turn_of_the_loop_leave_in_one_write() -> None:
    writes: list[list[bytes]] = []

    async def main() -> None:
        batch = TurnBatch(writes.append)
        batch.add([b"a"])
        batch.add([b"b", b"c"])
        assert writes == []  # nothing before the turn ends
        await asyncio.sleep(0)
        assert writes == [[b"a", b"b", b"c"]]
        batch.add([b"d"])
        batch.flush()  # before something written directly: the order kept
        batch.add([b"e"])
        batch.clear()  # the connection went: nothing more is written
        await asyncio.sleep(0)
        assert writes == [[b"a", b"b", b"c"], [b"d"]]

    asyncio.run(main())
