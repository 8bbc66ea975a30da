"""Serving the service's HTTP handler with granian (RSGI), in the service's own event loop.

granian's Rust runtime parses HTTP/1.1 and HTTP/2 and terminates TLS; each
request is handed to ``_App.__rsgi__`` as a coroutine on our asyncio loop, so the
journal, the flusher, GC and deliveries share the loop with request handlers,
as they do under aiohttp. Measured here, the same handler serves appends
faster through granian than through aiohttp (``docs/benchmarks.md``).

Like the aiohttp adapter: a client that disconnects cancels its handler (a
long-poll or SSE waiter slot is freed at once), or, mid-body, ends the body
read with ``ClientDisconnected`` (a client disconnect, not a 500); bodies are
read against the configured limit (413), and a streaming body that fails
after the status line went out cuts the stream instead of ending it cleanly.

Reading bodies: granian's whole-body read (``await proto()``) fails on a body
cut short (connection closed or reset before the declared ``Content-Length``,
a chunked body without its last chunk, an HTTP/2 stream reset), but its
chunk iterator does not: it turns such a failure into an empty chunk, the
same as the end of the body, so a truncated body would be taken for a whole
one. Hence: with ``Content-Length`` (checked against the limit first) and on
HTTP/2 the body is read whole; only HTTP/1.1 chunked bodies, whose size is
unknown until read, are iterated against the limit, and there the one
failure signal granian leaves (an empty chunk that is not the last: the body
failed, or carried trailer fields) is refused (400), never appended. An
HTTP/2 body without ``Content-Length`` is thus buffered whole before the
limit applies (413 after reading it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from granian._granian import RSGIProtocolClosed as ProtocolClosed
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings, HTTP2Settings
from granian.server.embed import Server

from tiered.api.kit.errors import ClientDisconnected
from tiered.api.kit.types import Handler, Request, Response
from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.hosts import listen_addresses, url_host

log = logging.getLogger(__name__)

_TOO_LARGE = "request body is larger than the server's limit"


_LOWER: dict[str, str] = {}

#: What a header value granian could not decode reads as (not encodable: refused downstream).
UNDECODABLE = "\udcff"


class RsgiHeaders(Mapping[str, str]):
    """Case-insensitive view of granian's headers (which keys in lower case).

    granian hides a value that is not visible ASCII (it answers ``None`` for a
    header it lists). Such a value reads as ``UNDECODABLE``, a lone surrogate
    like the ones aiohttp's surrogate-escaped decoding leaves, so the routes
    refuse it the same way on both adapters (400, or 401 for credentials).

    The headers are copied into a dict once, on the first look-up: an append
    asks for a dozen or more names, most of them absent, and each question to
    granian's object is a call into its runtime (two for an absent name); the
    copy asks once per name the client sent. (``items()`` would be one call,
    but it leaves hidden values out, so a hidden first value of a repeated
    name would read as the next one: not what granian's ``get`` answers.)
    """

    __slots__ = ("_raw", "_seen")

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._seen: dict[str, str] | None = None

    def _headers(self) -> dict[str, str]:
        seen = self._seen
        if seen is None:
            raw = self._raw
            seen = {}
            # Each name read as granian's own ``get`` reads it (its first value; None when that value is
            # hidden, even if a later one is clean): one call per name sent, none per name asked for.
            for name in raw.keys():
                value = raw.get(name)
                seen[name] = UNDECODABLE if value is None else value
            self._seen = seen
        return seen

    def get(self, key: str, default: Any = None) -> Any:
        name = _LOWER.get(key)
        if name is None:
            name = key.lower()
            if len(_LOWER) < 1024:  # the service asks for a fixed set of names
                _LOWER[key] = name
        return (self._seen or self._headers()).get(name, default)

    def __getitem__(self, key: str) -> str:
        value = self._headers().get(key.lower())
        if value is None or value is UNDECODABLE:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._headers()

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers())

    def __len__(self) -> int:
        return len(self._headers())


#: A request still running after this long (up to twice as long) starts watching for its client to leave.
WATCH_AFTER_S = 0.05


class _DisconnectWatch:
    """Cancels a request's task when its client disconnects, so waiter slots free at once."""

    __slots__ = ("_proto", "_task", "_future", "client_left")

    def __init__(self, proto: Any, task: asyncio.Task[Any]) -> None:
        self._proto = proto
        self._task = task
        self._future: asyncio.Future[Any] | None = None
        self.client_left = False

    def start(self) -> None:
        self._future = asyncio.ensure_future(self._proto.client_disconnect())
        self._future.add_done_callback(self._left)

    def _left(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            self.client_left = True
            self._task.cancel()

    def stop(self) -> None:
        if self._future is not None:
            self._future.remove_done_callback(self._left)
            self._future.cancel()


class _SlowRequests:
    """Which requests watch for their client to leave: those still running after ``WATCH_AFTER_S``.

    Most requests finish long before that, so none of them should pay for a watcher, nor for a timer
    of its own (an event-loop timer per request cost an append about as much as a middleware layer).
    One timer ticks every ``WATCH_AFTER_S`` while requests run: a request that has seen a whole tick
    (it ran 50 to 100 ms) gets its ``_DisconnectWatch``. A request costs a dict entry in and out.
    """

    __slots__ = ("_young", "_old", "_watching", "_timer")

    def __init__(self) -> None:
        self._young: dict[asyncio.Task[Any], Any] = {}  # task -> proto, started since the last tick
        self._old: dict[asyncio.Task[Any], Any] = {}  # started before the last tick
        self._watching: dict[asyncio.Task[Any], _DisconnectWatch] = {}
        self._timer: asyncio.TimerHandle | None = None

    def enter(self, task: asyncio.Task[Any], proto: Any) -> None:
        self._young[task] = proto
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._tick)

    def client_left(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task`` was cancelled because its client left (not by the server)."""
        watch = self._watching.get(task)
        return watch is not None and watch.client_left

    def leave(self, task: asyncio.Task[Any]) -> None:
        if self._young.pop(task, None) is None and self._old.pop(task, None) is None:
            watch = self._watching.pop(task, None)
            if watch is not None:
                watch.stop()

    def _tick(self) -> None:
        for task, proto in self._old.items():
            watch = self._watching[task] = _DisconnectWatch(proto, task)
            watch.start()
        self._old, self._young = self._young, {}
        self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._tick) if self._old else None


class _App:
    """The RSGI application object granian calls once per request."""

    def __init__(self, handler: Handler, max_body_bytes: int, large_body_max_bytes: int = 0) -> None:
        self._handler = handler
        self._max_body = max_body_bytes
        self._large_max = large_body_max_bytes  # bodies that may stream (``Request.body_stream``); 0: none
        self._slow = _SlowRequests()
        #: The loop granian calls this on (set when the listener starts): ``asyncio.current_task()`` without
        #: it asks for the running loop, which on Python 3.11 is a ``getpid`` system call per request.
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            proto.close(403)  # websockets: not part of the protocol
            return
        task = asyncio.current_task(self.loop)
        assert task is not None
        # Most requests finish long before it: only the ones still running
        # (long-polls, SSE, appends queued behind a full batch) get a watcher.
        slow = self._slow
        slow.enter(task, proto)
        try:
            # The request, served in this frame (one coroutine fewer for every request to step through).
            headers = RsgiHeaders(scope.headers)
            # Read once: the body reader and the streamer judge the same value.
            length = headers.get("content-length")
            host = scope.authority or headers.get("host") or ""
            request = Request(
                scope.method,
                raw_path(scope.path),
                scope.query_string,
                headers,
                self._reader(proto, length, whole=scope.http_version == "2"),
                scheme=scope.scheme,
                host=host,
                stream=_streamer(proto, length, self._large_max),
            )
            response = await self._handler(request)
            body = response.body
            if isinstance(body, bytes):
                if body:
                    proto.response_bytes(response.status, list(response.headers.items()), body)
                else:
                    proto.response_empty(response.status, list(response.headers.items()))
            else:
                await _stream(proto, response, body, scope.path)
        except ClientDisconnected:
            pass  # nobody to answer (counted by the request-id layer)
        except asyncio.CancelledError:
            if not slow.client_left(task):
                raise  # the server itself is being cancelled
        finally:
            slow.leave(task)

    def _reader(self, proto: Any, length: str | None, *, whole: bool) -> Callable[[], Awaitable[bytes]]:
        """How the body is read: whole in one call when its declared length is within the limit (the usual
        request: no coroutine of ours between ``Request.body`` and granian), else against the limit."""
        max_body = self._max_body
        if length is not None and length.isdigit() and int(length) <= max_body:
            return functools.partial(_whole_body, proto)

        async def read() -> bytes:
            return await _read_body(proto, length, max_body, whole=whole)

        return read


def _streamer(proto: Any, length: str | None, limit: int) -> Callable[[], AsyncIterator[bytes]] | None:
    """The body as it arrives (a large body, stored by reference), when its length (``content-length``) is
    declared and within ``limit``: counted against that length, since granian's chunk iterator ends a cut
    body as if whole."""
    if not limit or length is None or not length.isdigit() or int(length) > limit:
        return None
    declared = int(length)

    async def chunks() -> AsyncIterator[bytes]:
        seen = 0
        stream = proto.__aiter__()
        while seen < declared:
            try:
                chunk = await _next_chunk(stream)
            except ProtocolClosed:
                chunk = None
            if not chunk:
                raise ClientDisconnected(f"the client left after {seen} of the body's {declared} bytes")
            seen += len(chunk)
            yield chunk

    return chunks


def raw_path(decoded: str) -> str:
    """The percent-encoded path the router and routes expect, from granian's decoded one.

    granian decodes the path, replacing invalid UTF-8 with U+FFFD. Escaping
    ``%`` gives back a path that decodes to the same text, and U+FFFD becomes
    an invalid escape so that the route refuses it (400) instead of serving a
    stream whose name was never sent. (A client can therefore not name a
    stream with a literal U+FFFD through this adapter.)
    """
    if "%" in decoded:
        decoded = decoded.replace("%", "%25")
    if "\ufffd" in decoded:
        decoded = decoded.replace("\ufffd", "%FF")
    return decoded


async def _stream(proto: Any, response: Response, body: AsyncIterator[bytes], path: str) -> None:
    transport = proto.response_stream(response.status, list(response.headers.items()))
    try:
        async for chunk in body:
            await transport.send_bytes(chunk)
    except ProtocolClosed:
        pass  # the reader went away
    except Exception as exc:
        # The status line is out: raising makes granian abort the stream, so the
        # client sees a failed read, not a clean end.
        log.warning("streaming response to %s ended by an error: %s", path[:200], exc)
        raise
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            await aclose()


async def _read_body(proto: Any, length: str | None, limit: int, *, whole: bool = False) -> bytes:
    """The request body (``length``: its ``content-length``), read against ``limit``; ``whole``: read it in one
    call even without a length (HTTP/2)."""
    if length is not None and length.isdigit():
        if int(length) > limit:
            await _drain(proto.__aiter__(), int(length))
            raise TieredError(ErrorCode.PAYLOAD_TOO_LARGE, _TOO_LARGE)
        return await _whole_body(proto)
    if whole:
        body = await _whole_body(proto)
        if len(body) > limit:
            raise TieredError(ErrorCode.PAYLOAD_TOO_LARGE, _TOO_LARGE)
        return body
    chunks: list[bytes] = []
    total = 0
    stream = proto.__aiter__()  # one iterator: granian refuses a second
    while (chunk := await _next_chunk(stream)) is not None:
        if not chunk:
            # granian ends a body with one empty chunk; another one after it means the
            # body failed (cut short) or carried trailers: either way it is not the body sent.
            if await _next_chunk(stream) is None:
                break
            raise bad_request(_UNFINISHED)
        total += len(chunk)
        if total > limit:
            await _drain(stream, total)
            raise TieredError(ErrorCode.PAYLOAD_TOO_LARGE, _TOO_LARGE)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_UNFINISHED = (
    "the chunked request body did not end cleanly (the connection was cut before its last chunk, or it "
    "carried trailer fields, which are not accepted): nothing was written"
)


async def _whole_body(proto: Any) -> bytes:
    try:
        body: bytes = await proto()
    except ProtocolClosed:
        raise ClientDisconnected("the client left before sending the whole body") from None
    return body


async def _next_chunk(stream: Any) -> bytes | None:
    try:
        chunk: bytes = await stream.__anext__()
    except StopAsyncIteration:
        return None
    return chunk


#: Bodies up to this size are read and dropped before a 413, so a client still
#: sending sees the answer instead of a reset; larger ones are cut short.
DRAIN_LIMIT = 64 * 1024 * 1024


async def _drain(stream: Any, seen: int) -> None:
    if seen > DRAIN_LIMIT:
        return
    while (chunk := await _next_chunk(stream)) is not None:
        seen += len(chunk)
        if seen > DRAIN_LIMIT:
            return


def _bindable_port(host: str, port: int, *, reuse_port: bool = False) -> int:
    """Bind ``(host, port)`` once ourselves: a busy port is a clear ``OSError`` here.

    granian binds in its own threads, where a failure only ends a worker; and a
    connect probe would succeed against whoever else holds the port. Port 0
    picks a free port (granian's workers cannot report one they chose).
    ``reuse_port``: a worker of a multi-worker node (``tiered/cli/workers.py``)
    shares the port with its siblings (granian binds with ``SO_REUSEPORT`` on
    Linux), so its probe must too; the supervisor's own probe did not.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {url_host(host)}:{port}: {exc.strerror}") from None
        return int(s.getsockname()[1])


class RsgiListener:
    """granian's embedded server, started and stopped like ``AiohttpListener``.

    ``max_connections`` bounds requests in flight (granian's backpressure): it
    must exceed the live readers the service allows, or readers past it would
    queue instead of being answered 503 by the service. granian binds one
    address per server, so a host name that resolves to several addresses
    (``localhost``: ``127.0.0.1`` and ``::1``) gets one embedded server each,
    all on the same port and the same handler.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int,
        large_body_max_bytes: int = 0,
        max_connections: int = 16384,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        reuse_port: bool = False,
    ) -> None:
        self._app = _App(handler, max_body_bytes, large_body_max_bytes)
        self._reuse_port = reuse_port
        self._max_connections = max_connections
        self._tls = (tls_cert, tls_key)
        self._servers: list[tuple[Server, asyncio.Task[None]]] = []

    @property
    def scheme(self) -> str:
        return "https" if self._tls[0] is not None else "http"

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Listen on every address ``host`` names (``tiered.core.hosts``); returns (address, port) of each."""
        bound: list[tuple[str, int]] = []
        try:
            for address in listen_addresses(host):
                port = _bindable_port(
                    address, port, reuse_port=self._reuse_port
                )  # port 0: the first address picks, the others follow
                await self._start_one(address, port)
                bound.append((address, port))
        except BaseException:
            await self.stop()
            raise
        return bound

    async def start_unix(self, path: Path) -> None:
        """Listen on a Unix socket at ``path`` too (plain HTTP: a multi-worker node's workers reach each other
        there, ``tiered/cluster/workers/``); a stale socket file left by a killed process is replaced."""
        path.unlink(missing_ok=True)
        await self._start_one("", 0, uds=path)

    async def _start_one(self, address: str, port: int, uds: Path | None = None) -> None:
        self._app.loop = asyncio.get_running_loop()  # granian runs the app on the loop that serves it
        cert, key = self._tls
        if uds is not None:
            cert = key = None  # local peers only, over a socket file only this user can open
        server = Server(
            self._app,
            address=address or "127.0.0.1",
            port=port,
            uds=uds,
            interface=Interfaces.RSGI,
            http=HTTPModes.auto,  # HTTP/1.1, and HTTP/2 by ALPN over TLS or by prior knowledge
            websockets=False,
            backlog=1024,
            backpressure=self._max_connections,
            http1_settings=HTTP1Settings(header_read_timeout=30_000, keep_alive=True),
            http2_settings=HTTP2Settings(max_concurrent_streams=1000),
            log_enabled=False,
            ssl_cert=cert,
            ssl_key=key,
        )
        server.workers_kill_timeout = 5
        name = f"http-granian-{uds or address}"
        task = asyncio.get_running_loop().create_task(server.serve(), name=name)
        self._servers.append((server, task))
        if uds is not None:
            await _until_listening_unix(uds, task)
        else:
            await _until_listening(address, port, task)

    async def stop(self, timeout: float = 5.0) -> None:
        servers, self._servers = self._servers, []
        for server, _ in servers:
            server.stop()  # type: ignore[no-untyped-call]
        for _, task in servers:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except TimeoutError:
                log.warning("HTTP server did not stop within %.1f s; cancelling it", timeout)
                task.cancel()
            except Exception:  # it failed to start: ``start`` raised that already
                pass


async def _until_listening(host: str, port: int, task: asyncio.Task[None], timeout: float = 10.0) -> None:
    """granian binds in its own threads: wait until the port accepts, or report why it never did."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if task.done():
            task.result()  # raises the server's own error
            raise OSError(f"the HTTP server exited before listening on {host}:{port}")
        try:
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise OSError(f"the HTTP server did not start listening on {host}:{port}") from None
            await asyncio.sleep(0.01)


async def _until_listening_unix(path: Path, task: asyncio.Task[None], timeout: float = 10.0) -> None:
    """``_until_listening`` for a Unix socket."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if task.done():
            task.result()
            raise OSError(f"the HTTP server exited before listening on {path}")
        try:
            _, writer = await asyncio.open_unix_connection(str(path))
            writer.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise OSError(f"the HTTP server did not start listening on {path}") from None
            await asyncio.sleep(0.01)
