"""The Unix-socket HTTP client a worker forwards with, against a scripted server on a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tiered.cluster.gateway.unix_http import UnixHttp, UnixHttpFailed

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, list[bytes]], Awaitable[None]]


async def _serve(path: Path, script: Script, seen: list[bytes], connections: list[int]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await script(reader, writer, seen)
        finally:
            writer.close()

    return await asyncio.start_unix_server(handle, str(path))


async def _request_head(reader: asyncio.StreamReader, seen: list[bytes]) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    seen.append(head + (await reader.readexactly(length) if length else b""))
    return True


def _run(
    tmp_path: Path, script: Script, client_part: Callable[[UnixHttp], Awaitable[object]]
) -> tuple[object, list[bytes], int]:
    async def main() -> tuple[object, list[bytes], int]:
        path = tmp_path / "s.sock"
        seen: list[bytes] = []
        connections: list[int] = []
        server = await _serve(path, script, seen, connections)
        client = UnixHttp(str(path), connect_timeout_s=2, read_timeout_s=5)
        try:
            result = await client_part(client)
        finally:
            await client.close()
            server.close()
        return result, seen, len(connections)

    return asyncio.run(main())


async def _keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[bytes]) -> None:
    while await _request_head(reader, seen):
        body = b"hello %d" % len(seen)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-content-type-options: nosniff\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()


def test_answers_are_read_and_the_connection_reused(tmp_path: Path) -> None:
    async def two(client: UnixHttp) -> object:
        a = await client.request(
            "POST", "/v1/stream/a?x=1", {"Host": "h", "Content-Type": "text/plain"}, b"abc"
        )
        b = await client.request("GET", "/v1/stream/a", {"Bad": "\udcff"}, b"")
        return a, b

    (a, b), seen, connections = _run(tmp_path, _keep_alive, two)  # type: ignore[misc]
    assert (a.status, a.body, b.status, b.body) == (200, b"hello 1", 200, b"hello 2")
    assert a.headers["X-Content-Type-Options"] == "nosniff"  # title-cased: middleware adds no second copy
    assert connections == 1
    assert seen[0].startswith(b"POST /v1/stream/a?x=1 HTTP/1.1\r\n") and seen[0].endswith(b"\r\n\r\nabc")
    assert b"Host: h\r\n" in seen[0] and b"Content-Length: 3\r\n" in seen[0]
    assert b"Bad: \xff\r\n" in seen[1] and b"Host: worker\r\n" in seen[1] and b"Content-Length" not in seen[1]


async def _chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[bytes]) -> None:
    await _request_head(reader, seen)
    kind = b"text/event-stream" if b"/sse" in seen[0] else b"application/json"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in (b"data: one\n\n", b"data: two\n\n"):
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def test_chunked_bodies_are_joined_and_event_streams_streamed(tmp_path: Path) -> None:
    async def whole(client: UnixHttp) -> object:
        return await client.request("GET", "/json", {}, b"")

    answer, _, _ = _run(tmp_path, _chunked, whole)
    assert answer.body == b"data: one\n\ndata: two\n\n"  # type: ignore[attr-defined]

    async def streamed(client: UnixHttp) -> object:
        answer = await client.request("GET", "/sse", {}, b"")
        assert not isinstance(answer.body, bytes)
        return [piece async for piece in answer.body]

    pieces, _, _ = _run(tmp_path, _chunked, streamed)
    assert pieces == [b"data: one\n\n", b"data: two\n\n"]


async def _no_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[bytes]) -> None:
    while await _request_head(reader, seen):
        writer.write(b"HTTP/1.1 204 No Content\r\nStream-Next-Offset: 5\r\n\r\n")
        await writer.drain()


def test_answers_without_a_body(tmp_path: Path) -> None:
    async def head(client: UnixHttp) -> object:
        return [await client.request(m, "/x", {}, b"") for m in ("HEAD", "GET")]

    answers, _, connections = _run(tmp_path, _no_body, head)
    assert [(a.status, a.body, a.headers["Stream-Next-Offset"]) for a in answers] == [(204, b"", "5")] * 2  # type: ignore[attr-defined]
    assert connections == 1


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[bytes]) -> None:
    await _request_head(reader, seen)  # read the request, then close without answering


def test_a_request_the_server_read_but_never_answered_may_have_been_applied(tmp_path: Path) -> None:
    async def one(client: UnixHttp) -> object:
        with pytest.raises(UnixHttpFailed) as failed:
            await client.request("POST", "/x", {}, b"body")
        return failed.value.sent

    sent, seen, _ = _run(tmp_path, _hang_up, one)
    assert sent is True and len(seen) == 1


def test_no_socket_means_not_sent(tmp_path: Path) -> None:
    async def main() -> None:
        client = UnixHttp(str(tmp_path / "none.sock"), connect_timeout_s=1, read_timeout_s=1)
        with pytest.raises(UnixHttpFailed) as failed:
            await client.request("POST", "/x", {}, b"body")
        assert failed.value.sent is False

    asyncio.run(main())


async def _one_per_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[bytes]
) -> None:
    await _request_head(reader, seen)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    await writer.drain()  # then the server closes the idle connection


def test_an_idle_connection_the_server_closed_is_not_reused(tmp_path: Path) -> None:
    async def two(client: UnixHttp) -> object:
        first = await client.request("GET", "/a", {}, b"")
        await asyncio.sleep(0.1)  # the close reaches the client while the connection is idle
        second = await client.request("GET", "/b", {}, b"")
        return first.body, second.body

    bodies, _, connections = _run(tmp_path, _one_per_connection, two)
    assert bodies == (b"ok", b"ok") and connections == 2


def test_a_header_that_would_split_the_request_is_refused_unsent(tmp_path: Path) -> None:
    async def one(client: UnixHttp) -> object:
        with pytest.raises(UnixHttpFailed) as failed:
            await client.request("GET", "/a", {"X": "a\r\nInjected: 1"}, b"")
        return failed.value.sent

    sent, seen, _ = _run(tmp_path, _keep_alive, one)
    assert sent is False and seen == []
