"""Serving the service's HTTP handler with aiohttp's low-level server.

No aiohttp routing or middleware: one handler gets every request (routing,
errors and middleware are ours, in ``tiered.api.kit``). A reader that disconnects
cancels its handler (``handler_cancellation``), so a long-poll or SSE waiter
slot is freed when the connection closes; a body read the disconnect reaches
first ends with ``ClientDisconnected`` (a client disconnect, never a 500).
Bodies are read here against the configured limit (413
``PAYLOAD_TOO_LARGE``); a body that breaks the HTTP framing (a bad chunk) is a
400. A streaming body that fails after the status line went out cuts the
connection without a clean end. A host name is listened on at every address
it resolves to (``tiered.core.hosts``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from tiered.api.kit.errors import ClientDisconnected
from tiered.api.kit.types import Handler, Request
from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.hosts import listen_addresses

log = logging.getLogger(__name__)


class _QuietBadRequests(logging.Filter):
    """One line per malformed request, not a traceback a client can flood the log with."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args, record.exc_info, record.exc_text = (
                "bad request: %s",
                (exc.message,),
                None,
                None,
            )
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_filter_installed = False


def _install_filter() -> None:
    global _filter_installed
    if not _filter_installed:
        logging.getLogger("aiohttp.server").addFilter(_QuietBadRequests())
        _filter_installed = True


class AiohttpListener:
    def __init__(self, handler: Handler, *, max_body_bytes: int, large_body_max_bytes: int = 0) -> None:
        self._handler = handler
        self._max_body = max_body_bytes
        self._large_max = large_body_max_bytes  # bodies that may stream (``Request.body_stream``); 0: none
        self._server = web.Server(self._handle, handler_cancellation=True, access_log=None)
        self._listeners: list[asyncio.Server] = []

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Listen on every address ``host`` names, all on one port (port 0: the first address picks it)."""
        _install_filter()
        loop = asyncio.get_running_loop()
        try:
            for address in listen_addresses(host):
                listener = await loop.create_server(
                    self._server, address, port, backlog=1024, reuse_address=True
                )
                self._listeners.append(listener)
                port = listener.sockets[0].getsockname()[1]
        except BaseException:
            await self.stop()
            raise
        return [sock.getsockname()[:2] for sock in self.sockets]

    async def stop(self, timeout: float = 5.0) -> None:
        listeners, self._listeners = self._listeners, []
        if not listeners:
            return
        for listener in listeners:
            listener.close()
        await self._server.shutdown(timeout)
        for listener in listeners:
            await listener.wait_closed()

    @property
    def sockets(self) -> list[socket.socket]:
        return [sock for listener in self._listeners for sock in listener.sockets]

    async def _handle(self, raw: web.BaseRequest) -> web.StreamResponse:
        path, _, query = raw.raw_path.partition("?")

        async def read() -> bytes:
            return await _read_body(raw, self._max_body)

        request = Request(
            raw.method,
            path,
            query,
            raw.headers,
            read,
            scheme=raw.scheme,
            host=raw.host,
            stream=_streamer(raw, self._large_max),
        )
        try:
            response = await self._handler(request)
        except ClientDisconnected:
            # The connection is gone (counted by the request-id layer): end like aiohttp's own
            # handler cancellation, which neither answers nor logs.
            raise asyncio.CancelledError from None
        body = response.body
        if isinstance(body, bytes):
            return web.Response(status=response.status, headers=response.headers, body=body)
        stream = web.StreamResponse(status=response.status, headers=response.headers)
        try:
            await stream.prepare(raw)
            async for chunk in body:
                await stream.write(chunk)
            await stream.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the reader went away
        except Exception as exc:
            # The status line is out: cut the connection so the client sees a failed read, not a clean end.
            log.warning("streaming response to %s ended by an error: %s", path[:200], exc)
            if raw.transport is not None:
                raw.transport.abort()
        finally:
            if isinstance(body, AsyncIterator) and hasattr(body, "aclose"):
                await body.aclose()
        return stream


async def _read_body(raw: web.BaseRequest, limit: int) -> bytes:
    length = raw.content_length
    if length is not None and length > limit:
        raise TieredError(ErrorCode.PAYLOAD_TOO_LARGE, "request body is larger than the server's limit")
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = await raw.content.readany()
        except ConnectionError:
            raise ClientDisconnected("the client left before sending the whole body") from None
        except HttpProcessingError as exc:  # the body broke its framing (a bad chunk, a short body)
            raise bad_request(f"the request body is malformed: {exc.message}") from None
        if not chunk:
            break
        total += len(chunk)
        if total > limit:
            raise TieredError(ErrorCode.PAYLOAD_TOO_LARGE, "request body is larger than the server's limit")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _streamer(raw: web.BaseRequest, limit: int) -> Callable[[], AsyncIterator[bytes]] | None:
    """The body as it arrives (a large body, stored by reference), when its length is declared and within
    ``limit``; a body cut short ends it with ``ClientDisconnected``."""
    declared = raw.content_length
    if not limit or declared is None or declared > limit:
        return None

    async def chunks() -> AsyncIterator[bytes]:
        seen = 0
        while seen < declared:
            try:
                chunk = await raw.content.readany()
            except ConnectionError:
                chunk = b""
            except HttpProcessingError as exc:
                raise bad_request(f"the request body is malformed: {exc.message}") from None
            if not chunk:
                raise ClientDisconnected(f"the client left after {seen} of the body's {declared} bytes")
            seen += len(chunk)
            yield chunk

    return chunks
