"""A minimal HTTP/2 client for tests: one connection, one task reading it, many streams.

Why not httpx for many long-lived streams on one connection: httpcore's HTTP/2
connection lets whichever request wants data take a shared read lock and block
on the socket while holding it, even when the response another request waits
for has already been read (the same family as encode/httpcore#1022 and
pydantic/httpx2#1133). With a few dozen idle SSE streams open, a POST on the
same connection then waits until the server next writes anything (an SSE
keep-alive, 15 s later) although the server answered it in a millisecond. A
test of the server must not time the client's lock queue, so this client does
what HTTP/2 clients in browsers do: one task reads the socket and hands each
frame to its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings


@dataclass
class H2Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class _Stream:
    headers: asyncio.Future[dict[str, str]]
    chunks: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)


class H2Connection:
    """One HTTP/2 connection (TLS with ALPN ``h2``); every request is a stream on it."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext) -> None:
        self._host, self._port, self._ssl = host, port, ssl_context
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self._streams: dict[int, _Stream] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self.streams_opened = 0

    async def __aenter__(self) -> H2Connection:
        ctx = self._ssl
        ctx.set_alpn_protocols(["h2"])
        self._reader, self._writer = await asyncio.open_connection(
            self._host, self._port, ssl=ctx, server_hostname=self._host
        )
        ssl_object = self._writer.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            raise ConnectionError("the server did not negotiate HTTP/2 by ALPN")
        self._h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000,
            },
        )
        self._h2.initiate_connection()
        self._flush()
        self._task = asyncio.create_task(self._read_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await self._task
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()

    def _flush(self) -> None:
        assert self._writer is not None
        data = self._h2.data_to_send()
        if data:
            self._writer.write(data)

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while data := await self._reader.read(65536):
                for event in self._h2.receive_data(data):
                    self._dispatch(event)
                self._flush()
        finally:
            for s in self._streams.values():
                if not s.headers.done():
                    s.headers.set_exception(ConnectionError("the connection closed"))
                s.chunks.put_nowait(None)

    def _dispatch(self, event: h2.events.Event) -> None:
        s = self._streams.get(getattr(event, "stream_id", 0))
        if s is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            s.headers.set_result({k.decode(): v.decode() for k, v in event.headers})
        elif isinstance(event, h2.events.DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            s.chunks.put_nowait(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            s.chunks.put_nowait(None)
        elif isinstance(event, h2.events.StreamReset):
            if not s.headers.done():
                s.headers.set_exception(ConnectionError(f"stream reset: {event.error_code!r}"))
            s.chunks.put_nowait(None)

    async def _open(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, _Stream]:
        sid = self._h2.get_next_available_stream_id()
        stream = _Stream(asyncio.get_running_loop().create_future())
        self._streams[sid] = stream
        pseudo = [(":method", method), (":path", path), (":scheme", "https")]
        pseudo.append((":authority", f"{self._host}:{self._port}"))
        extra = dict(headers)
        if body:
            extra["content-length"] = str(len(body))
        self._h2.send_headers(sid, pseudo + list(extra.items()), end_stream=not body)
        if body:  # test bodies are small: one frame, within the initial window
            self._h2.send_data(sid, body, end_stream=True)
        self._flush()
        self.streams_opened += 1
        return sid, stream

    async def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> H2Response:
        """Send a request and read its whole response."""
        sid, stream = await self._open(method, path, headers or {}, body)
        head = await stream.headers
        chunks = []
        while (chunk := await stream.chunks.get()) is not None:
            chunks.append(chunk)
        del self._streams[sid]
        return H2Response(int(head[":status"]), head, b"".join(chunks))

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, headers: dict[str, str] | None = None
    ) -> AsyncIterator[tuple[H2Response, AsyncIterator[bytes]]]:
        """Send a request; yield its status and headers, and its body as chunks arrive."""
        sid, stream = await self._open(method, path, headers or {}, b"")
        head = await stream.headers

        async def body() -> AsyncIterator[bytes]:
            while (chunk := await stream.chunks.get()) is not None:
                yield chunk

        try:
            yield H2Response(int(head[":status"]), head), body()
        finally:
            if self._h2.streams.get(sid) is not None and not self._h2.streams[sid].closed:
                self._h2.reset_stream(sid)
                self._flush()
            self._streams.pop(sid, None)
