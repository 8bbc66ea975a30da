"""A small HTTP/1.1 client over one Unix socket: how a worker forwards a request to a sibling worker.

A multi-worker node (``tiered/cluster/workers/``) forwards about (N-1)/N of
its requests to the sibling that serves their shard, so the forwarding
worker's CPU per request is a large part of the node's. aiohttp's client
builds a request object, a URL, header multidicts and a response object per
request; this one writes the request head and body in one ``write`` on a
pooled keep-alive connection and parses the answer's head itself (measured:
``docs/benchmarks.md``). It speaks only to our own server (granian) on a
socket only this user can open, so it needs only what that server sends:
``Content-Length`` or chunked bodies, or a body up to the close.

A failure says whether the request may have reached the sibling
(``UnixHttpFailed.sent``): a connection that could not be opened means it did
not; anything after the request was written means it may have.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping

__all__ = ["Answer", "UnixHttp", "UnixHttpFailed"]

log = logging.getLogger(__name__)

_HEAD_LIMIT = 256 * 1024
_NO_BODY = frozenset({204, 304})
_CHUNK = 64 * 1024


class UnixHttpFailed(Exception):
    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class Answer:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes | AsyncIterator[bytes]) -> None:
        self.status = status
        self.headers = headers  # names title-cased (granian sends them in lower case)
        self.body = body


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class UnixHttp:
    def __init__(
        self, path: str, *, connect_timeout_s: float, read_timeout_s: float, max_idle: int = 64
    ) -> None:
        self.path = path
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        self._idle: list[_Conn] = []

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()

    async def _connect(self) -> _Conn:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()  # the sibling closed it while idle (it restarted, or stopped)
        try:
            return await asyncio.wait_for(
                asyncio.open_unix_connection(self.path, limit=_HEAD_LIMIT), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise UnixHttpFailed(f"cannot connect to {self.path}: {exc!r}", sent=False) from exc

    def _release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and len(self._idle) < self.max_idle and not conn[0].at_eof():
            self._idle.append(conn)
        else:
            conn[1].close()

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        read_timeout_s: float | None = None,
        stream_events: bool = True,
    ) -> Answer:
        """Send one request and read its answer (an event stream's body is streamed: ``stream_events``)."""
        head = _head(method, target, headers, body)
        conn = await self._connect()
        reader, writer = conn
        timeout = read_timeout_s if read_timeout_s is not None else self.read_timeout_s
        try:
            writer.write(head + body if body else head)
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            status, answer_headers, lowered = _parse_head(raw)
            if method == "HEAD" or status in _NO_BODY or status < 200:
                self._release(conn, lowered.get("connection") != "close")
                return Answer(status, answer_headers, b"")
            chunked = "chunked" in lowered.get("transfer-encoding", "")
            if stream_events and lowered.get("content-type", "").startswith("text/event-stream"):
                return Answer(status, answer_headers, self._stream(conn, chunked, lowered, timeout))
            data, reusable = await self._body(reader, chunked, lowered, timeout)
        except UnixHttpFailed:
            writer.close()
            raise
        except (OSError, EOFError, TimeoutError, ValueError, asyncio.LimitOverrunError) as exc:
            writer.close()
            raise UnixHttpFailed(f"{self.path} did not answer: {exc!r}", sent=True) from exc
        except BaseException:
            writer.close()  # cancelled mid-answer: the connection is in an unknown state
            raise
        self._release(conn, reusable and lowered.get("connection") != "close")
        return Answer(status, answer_headers, data)

    async def _body(
        self, reader: asyncio.StreamReader, chunked: bool, lowered: dict[str, str], timeout: float
    ) -> tuple[bytes, bool]:
        """The whole body, and whether the connection can carry another request."""
        if chunked:
            parts = [piece async for piece in _chunks(reader, timeout)]
            return b"".join(parts), True
        length = lowered.get("content-length")
        if length is not None:
            return await asyncio.wait_for(reader.readexactly(int(length)), timeout), True
        return await asyncio.wait_for(reader.read(), timeout), False

    async def _stream(
        self, conn: _Conn, chunked: bool, lowered: dict[str, str], timeout: float
    ) -> AsyncIterator[bytes]:
        reader, writer = conn
        try:
            if chunked:
                async for piece in _chunks(reader, timeout):
                    yield piece
            else:
                left = int(lowered["content-length"]) if "content-length" in lowered else -1
                while left != 0:
                    piece = await asyncio.wait_for(
                        reader.read(_CHUNK if left < 0 else min(left, _CHUNK)), timeout
                    )
                    if not piece:
                        break
                    left -= len(piece) if left > 0 else 0
                    yield piece
        except (OSError, EOFError, TimeoutError, ValueError, asyncio.LimitOverrunError):
            log.info("a forwarded event stream ended early")
        finally:
            writer.close()  # an event stream's connection is not reused


async def _chunks(reader: asyncio.StreamReader, timeout: float) -> AsyncIterator[bytes]:
    while True:
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)) != b"\r\n":
                pass  # trailer fields: none from our server, skipped all the same
            return
        data = await asyncio.wait_for(reader.readexactly(size + 2), timeout)
        yield data[:-2]


def _head(method: str, target: str, headers: Mapping[str, str], body: bytes) -> bytes:
    lines = [f"{method} {target} HTTP/1.1"]
    host = False
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise UnixHttpFailed(f"a header cannot be sent: {name!r}", sent=False)
        host = host or name.lower() == "host"
        lines.append(f"{name}: {value}")
    if not host:
        lines.append("Host: worker")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    lines.append("\r\n")
    # A value the server could not decode reaches here as a lone surrogate: sent as the byte it was.
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def _parse_head(raw: bytes) -> tuple[int, dict[str, str], dict[str, str]]:
    """Status, headers by title-cased name, and the same by lower-case name."""
    lines = raw[:-4].decode("utf-8", "surrogateescape").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    lowered: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"a malformed header line: {line[:80]!r}")
        value = value.strip()
        # Names in the canonical case our middleware writes (``X-Content-Type-Options``), so an answer
        # passed on is not given a second copy of a header under another case.
        headers[name.title()] = value
        lowered[name.lower()] = value
    return status, headers, lowered
