"""Forwarding a request to the node that serves its shard, as an HTTP client of that node.

Clients reach any node; the official Python client does not follow
redirects, so a node that does not serve a request's shard *proxies* it to the
owner the shard's lease advertises, and streams the owner's answer back
(long-polls and SSE included). A forwarded request carries
``Tiered-Forwarded-By``; a node never forwards such a request again (a stale
view on both sides would otherwise bounce it), it answers 503 with a retry
hint instead and the client's retry finds the converged owner.

A failure says whether the request may have reached the owner
(``ForwardFailed.sent``): a refused or timed-out connection means it did not.
The caller (``tiered/cluster/gateway/shard_router.py``) re-resolves the owner and retries
what is safe to send twice (``idempotent``: reads, producer appends) and what
was never sent; anything else is a 503 the client retries, the outcome unknown.

Between the workers of one node (``tiered/cluster/workers/``) a request is
not sent as HTTP again: it goes in a frame of the request as this worker
parsed it, its target included, on a persistent connection to the sibling's
frame socket (``forward_frames.py``, ``forward_channel.py``; the sibling
serves it with ``forward_serve.py``). What a frame cannot carry (a body too
large to hold, streamed on; a header value that is not text) and the scrape
of a sibling's metrics go over the sibling's HTTP socket, as between nodes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from urllib.parse import quote, unquote

import aiohttp

from tiered.api.kit.target import Target
from tiered.api.kit.types import Request, Response
from tiered.cluster.gateway.forward_channel import ChannelFailed, FrameChannel, frames_socket
from tiered.cluster.gateway.forward_frames import HOP_BY_HOP, MAX_ANSWER, Ask
from tiered.cluster.gateway.unix_http import UnixHttp, UnixHttpFailed
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.logs import REQUEST_ID

__all__ = [
    "FORWARDED_BY",
    "REDIRECT_HEADER",
    "UNIX_SCHEME",
    "ForwardFailed",
    "Forwarder",
    "idempotent",
    "moved_away",
    "unix_socket_of",
    "unix_url",
]

log = logging.getLogger(__name__)

FORWARDED_BY = "Tiered-Forwarded-By"
#: A client that follows redirects may ask for a 307 to the owner instead of a proxied answer.
REDIRECT_HEADER = "Tiered-Redirect"

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the client library recomputes.
_HOP = HOP_BY_HOP | {"host", "content-length"}
_CHUNK = 64 * 1024
#: Bodies declared larger than this (by default) are streamed to the owner, not read whole first;
#: smaller ones are held, so a forward that failed before sending can be sent again.
STREAM_ABOVE = 8 * 1024 * 1024
_AUTO = ("Content-Type", "User-Agent", "Accept", "Accept-Encoding")
_PRODUCER = ("Producer-Id", "Producer-Epoch", "Producer-Seq")
_FORWARDED_BY = FORWARDED_BY.lower()
# An owner's 503 with one of these codes means "not mine (any more)": another owner will answer.
_MOVED = (b'"SHARD_NOT_OWNED"', b'"SHARD_FENCED"')


#: The advertised URL of a worker of a multi-worker node (``tiered/cluster/workers/``): its Unix socket.
UNIX_SCHEME = "http+unix://"


def unix_url(path: str) -> str:
    """The advertised URL of a Unix socket (the path percent-encoded, so it is one URL authority)."""
    return UNIX_SCHEME + quote(path, safe="")


def unix_socket_of(base_url: str) -> str | None:
    """The socket path a ``unix_url`` names; None for an ordinary http(s) URL."""
    if not base_url.startswith(UNIX_SCHEME):
        return None
    return unquote(base_url[len(UNIX_SCHEME) :].rstrip("/"))


class ForwardFailed(TieredError):
    """The owner could not be asked, or its answer was lost; ``sent`` False: it cannot have seen the request."""

    def __init__(self, shard: int, message: str, *, sent: bool) -> None:
        super().__init__(ErrorCode.SHARD_NOT_OWNED, message, shard=shard, retry_after_s=1)
        self.sent = sent


def idempotent(request: Request) -> bool:
    """Safe to send twice: a read, or an append a producer numbered (the owner deduplicates it)."""
    if request.method in ("GET", "HEAD"):
        return True
    return request.method == "POST" and all(request.headers.get(h) for h in _PRODUCER)


def moved_away(response: Response) -> bool:
    """The owner answered that the shard is not (or no longer) its own: 503 SHARD_NOT_OWNED/SHARD_FENCED."""
    if response.status != 503 or not isinstance(response.body, bytes):
        return False
    return any(code in response.body for code in _MOVED)


class Forwarder:
    def __init__(
        self,
        node_id: str,
        *,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 120.0,
        stream_above: int = STREAM_ABOVE,
        max_answer_bytes: int = MAX_ANSWER,
    ) -> None:
        """``stream_above``: bodies declared larger are streamed on (the large-body threshold);
        ``max_answer_bytes``: the largest whole answer taken from a sibling worker in one frame
        (``forward_frames.max_answer_bytes``: a larger one fails the request, never buffered whole)."""
        self.node_id = node_id
        self.max_answer_bytes = max_answer_bytes
        self.stream_above = stream_above
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._unix: dict[str, UnixHttp] = {}  # a multi-worker node's siblings, by socket
        # The same siblings' frame sockets (``forward_channel.py``), by their HTTP socket.
        self._frames: dict[str, FrameChannel] = {}
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._targets: dict[str, tuple[str | None, str]] = {}  # base URL -> (its socket, its prefix)
        self.forwarded = 0

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=256),
            )
        return self._session

    def _unix_client(self, path: str) -> UnixHttp:
        client = self._unix.get(path)
        if client is None:
            client = self._unix[path] = UnixHttp(
                path, connect_timeout_s=self._connect_timeout_s, read_timeout_s=self._read_timeout_s
            )
        return client

    def _target(self, base_url: str) -> tuple[str | None, str]:
        """The Unix socket ``base_url`` names (None: an http(s) URL) and the URL prefix to send to."""
        found = self._targets.get(base_url)
        if found is None:
            if len(self._targets) > 1024:  # owners' URLs: a handful; bounded all the same
                self._targets.clear()
            found = self._targets[base_url] = (unix_socket_of(base_url), base_url.rstrip("/"))
        return found

    def _frame_channel(self, path: str) -> FrameChannel:
        channel = self._frames.get(path)
        if channel is None:
            channel = self._frames[path] = FrameChannel(
                frames_socket(path),
                connect_timeout_s=self._connect_timeout_s,
                read_timeout_s=self._read_timeout_s,
                max_body=self.max_answer_bytes,
            )
        return channel

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        clients, self._unix = list(self._unix.values()), {}
        for client in clients:
            await client.close()
        channels, self._frames = list(self._frames.values()), {}
        for channel in channels:
            await channel.close()

    async def fetch(
        self, base_url: str, path_: str, headers: dict[str, str], timeout_s: float = 5.0
    ) -> tuple[int, bytes] | None:
        """A node's own answer to a ``GET`` of ``path`` (a multi-worker node's scrape of its siblings'
        metrics: ``tiered/cluster/workers/metrics.py``); None if it could not be asked or did not answer."""
        path, prefix = self._target(base_url)
        if path is not None:
            try:
                answer = await self._unix_client(path).request(
                    "GET", path_, headers, b"", read_timeout_s=timeout_s
                )
            except UnixHttpFailed as exc:
                log.info("%s did not answer GET %s: %s", base_url, path_, exc)
                return None
            assert isinstance(answer.body, bytes)
            return answer.status, answer.body
        try:
            async with self._client().get(
                prefix + path_, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("%s did not answer GET %s: %s", base_url, path_, exc)
            return None

    def redirect(self, request: Request, base_url: str) -> Response:
        """A 307 to the same URL on the owner (the client asked for it with ``Tiered-Redirect``)."""
        location = (
            base_url.rstrip("/") + request.path + (f"?{request.query_string}" if request.query_string else "")
        )
        return Response(307, {"Location": location, "Content-Length": "0"}, b"")

    async def forward(self, request: Request, base_url: str, shard: int) -> Response:
        """The owner's answer to ``request``; ``SHARD_NOT_OWNED`` (503) when the owner cannot be reached."""
        path, prefix = self._target(base_url)
        if request.streamed:  # a retry after a large body was streamed on: it cannot be sent again
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard}: the owner could not take the body streamed to it; retry",
                shard=shard,
                retry_after_s=1,
            )
        body: bytes | AsyncIterator[bytes] | None = None
        declared = request.declared_length()
        if declared is not None and declared > self.stream_above:
            body = request.body_stream()  # a large body: streamed on, never held whole
        if body is None:
            body = await request.body()
        if path is not None and isinstance(body, bytes):
            # To a worker (docs/workers.md): the request as parsed here, in a frame, unless it cannot be.
            framed = await self._forward_framed(request, path, body, shard)
            if framed is not None:
                return framed
        target = request.path + (f"?{request.query_string}" if request.query_string else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers[FORWARDED_BY] = self.node_id
        if request.host:
            # The owner answers with URLs (Location, subscription callbacks, JWKS) for the host the client used.
            headers["Host"] = request.host
        if not isinstance(body, bytes):
            headers["Content-Length"] = str(declared)
        if path is not None:  # to a worker as HTTP over its Unix socket, the body whole
            if not isinstance(body, bytes):
                body = b"".join([chunk async for chunk in body])
            return await self._forward_unix(request.method, path, target, headers, body, shard)
        # The client library adds headers the original request may not have had (a Content-Type for
        # a body, above all): forward exactly what the client sent.
        absent = [h for h in _AUTO if request.headers.get(h) is None]
        try:
            resp = await self._client().request(
                request.method,
                prefix + target,
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=absent,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise ForwardFailed(
                shard,
                f"shard {shard}: its owner at {base_url} could not be reached ({type(exc).__name__}); retry",
                sent=False,
            ) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ForwardFailed(
                shard,
                f"shard {shard}: its owner at {base_url} did not answer ({type(exc).__name__}); retry",
                sent=True,
            ) from exc
        self.forwarded += 1
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        if request.method == "HEAD":
            resp.release()
            return Response(resp.status, out, b"")
        content_type = resp.headers.get("Content-Type", "")
        if content_type.startswith("text/event-stream"):
            return Response(resp.status, out, _stream(resp))
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ForwardFailed(
                shard,
                f"shard {shard}: the owner's answer was cut off ({type(exc).__name__}); the outcome is unknown",
                sent=True,
            ) from exc
        finally:
            resp.release()
        return Response(resp.status, out, data)

    async def _forward_framed(self, request: Request, path: str, body: bytes, shard: int) -> Response | None:
        """``forward`` to a sibling worker as a frame (``forward_frames.py``): the request as parsed here, its
        target included, and the body as read. None: send it as HTTP instead (a header value that is not
        text, or a sibling without a frame socket: neither sent anything)."""
        raw = request.headers
        headers: dict[str, str] = {}
        for name in raw:
            lowered = name.lower()
            value = raw.get(name)
            if value is not None and lowered not in HOP_BY_HOP:
                headers[lowered] = value
        headers[_FORWARDED_BY] = self.node_id
        try:
            parsed: Target | None = (
                request.target
            )  # parsed once, here: the owner judges and serves this value
        except TieredError:
            parsed = None  # the owner refuses it as it refuses any target that does not parse
        ask = Ask(
            request.method,
            request.path,
            request.query_string,
            headers,
            request.scheme,
            request.host,
            REQUEST_ID.get() or "",
            parsed,
        )
        try:
            answer = await self._frame_channel(path).request(ask, body)
        except UnicodeEncodeError:
            return None
        except ChannelFailed as exc:
            if not exc.sent:
                return None  # the HTTP socket decides: answered, or "could not be reached"
            raise ForwardFailed(
                shard, f"shard {shard}: its owner at {path} did not answer ({exc}); retry", sent=True
            ) from exc
        self.forwarded += 1
        return Response(answer.status, answer.headers, answer.body)

    async def _forward_unix(
        self, method: str, path: str, target: str, headers: dict[str, str], body: bytes, shard: int
    ) -> Response:
        """``forward`` to a sibling worker over its Unix socket (``unix_http.py``: no aiohttp client)."""
        try:
            answer = await self._unix_client(path).request(method, target, headers, body)
        except UnixHttpFailed as exc:
            what = "could not be reached" if not exc.sent else "did not answer"
            raise ForwardFailed(
                shard, f"shard {shard}: its owner at {path} {what} ({exc}); retry", sent=exc.sent
            ) from exc
        self.forwarded += 1
        out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        return Response(answer.status, out, answer.body)


async def _stream(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_chunked(_CHUNK):
            yield chunk
    except (aiohttp.ClientError, TimeoutError):
        log.info("a forwarded event stream ended early")
    finally:
        resp.release()
