"""Requests and responses as the service sees them, whatever HTTP server carries them.

Adapters (``aiohttp_server``, ``rsgi_server``) build a ``Request`` and turn a
``Response`` back into bytes on the wire; handlers, middleware and the error
mapper never see the server's own types. A response body is bytes, or an async
iterator of byte chunks (SSE), which the adapter writes as they come.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from tiered.api.kit.target import Target, decode_query, parse_target
from tiered.core.errors import ErrorCode, TieredError

_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


#: ``Request.route`` of a request no route matched (yet).
UNMATCHED = "unmatched"


class LiveLease(Protocol):
    """How long the credential behind a live read (long-poll, SSE) may keep it open.

    Set by the auth middleware (``tiered.api.kit.middleware.auth``); the read path asks it
    between waits and has it watch the stream it waits on, so revoking the
    credential wakes the reader at once.
    """

    def end_reason(self) -> str | None:
        """Why live reads must end now ("expired", "revoked"), or None while the credential holds."""
        ...

    def seconds_left(self) -> float | None:
        """Seconds until the credential expires (None: it does not)."""
        ...

    def watch(self, uid: int) -> None: ...

    def unwatch(self, uid: int) -> None: ...


class AuthView(Protocol):
    """What routes may ask about the caller (set by the auth middleware; None when auth is off)."""

    lease: LiveLease | None

    def visible(self, bucket: str) -> bool:
        """Whether listings may show this bucket (and what lives in it) to the caller."""
        ...

    def stream_prefixes(self, bucket: str) -> tuple[str, ...] | None:
        """The stream-path prefixes a listing of ``bucket`` shows the caller; None: every stream."""
        ...


class Request:
    """One HTTP request. ``headers.get`` is case-insensitive; ``path`` is still percent-encoded.

    ``target`` is what the request names, parsed once (``tiered.api.kit.target``):
    every layer reads it rather than the raw path, query or headers; so does
    its route in the route table (``routed``: ``tiered.api.table.route_of``).
    The router fills in ``params`` and ``route`` (the matched route's name, for metrics).
    """

    __slots__ = (
        "method",
        "path",
        "query_string",
        "headers",
        "scheme",
        "host",
        "params",
        "route",
        "auth",
        "access",
        "routed",
        "_read",
        "_query",
        "_target",
        "_body",
        "_stream",
        "streamed",
    )

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: Mapping[str, str],
        read: Callable[[], Awaitable[bytes]],
        *,
        scheme: str = "http",
        host: str = "",
        stream: Callable[[], AsyncIterator[bytes]] | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.scheme = scheme
        self.host = host
        self.params: Mapping[str, str] = {}  # read-only: a route's parameters may be shared between requests
        self.route = UNMATCHED  # until a route matches (or the CORS preflight answers)
        self.auth: AuthView | None = None  # the caller, when auth is on (``tiered.api.kit.middleware.auth``)
        self.access: object | None = None  # what the request touches (``tiered.api.access``), once classified
        # Its route (``tiered.api.table.route_of``: a ``Routed``, typed there), once classified.
        self.routed: Any = None
        self._read = read
        self._query: dict[str, str] | None = None
        self._target: Target | None = None
        self._body: bytes | None = None
        # The body as it arrives, when the adapter can stream it (a declared length within the large-body
        # limit): what a large body stored by reference is read through (``body_stream``).
        self._stream = stream
        self.streamed = False  # ``body_stream`` handed the body out: it cannot be read (or sent) again

    async def body(self) -> bytes:
        """The whole body (the adapter enforces the size limit: ``PAYLOAD_TOO_LARGE``); read once, kept."""
        if self._body is None:
            if self.streamed:
                # A retry of a request whose body was streamed on already (cluster forwarding): the client's
                # own retry sends it again.
                raise TieredError(
                    ErrorCode.UNAVAILABLE,
                    "the request body was consumed by an earlier attempt; retry",
                    retry_after_s=1,
                )
            self._body = await self._read()
        return self._body

    def declared_length(self) -> int | None:
        """The body's ``Content-Length``, when it declares one as plain digits."""
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def body_stream(self) -> AsyncIterator[bytes] | None:
        """The body as it arrives, in chunks (once, instead of ``body()``); None when it cannot stream.

        The adapter ends it with ``ClientDisconnected`` if the body stops short of its declared length.
        """
        stream, self._stream = self._stream, None
        if stream is None or self._body is not None:
            return None
        self.streamed = True
        return stream()

    @property
    def origin(self) -> str | None:
        """``scheme://host[:port]`` this request was sent to, or ``None`` when the Host is not a valid one.

        The Host header is the client's word: it may only shape URLs we answer
        with when it is a plain host name or address (no other bytes).
        """
        if not _HOST.fullmatch(self.host):
            return None
        return f"{self.scheme}://{self.host}"

    @property
    def query(self) -> dict[str, str]:
        """Query parameters, percent-decoded as strict UTF-8 (400 otherwise); the first of repeated names wins.

        The same mapping as ``target.query``: decoded once.
        """
        if self._query is None:
            self._query = decode_query(self.query_string)
        return self._query

    @property
    def target(self) -> Target:
        """What the request names, parsed once (``tiered.api.kit.target``); raises its 4xx if it does not parse."""
        target = self._target
        if target is None:
            target = self._target = parse_target(self.method, self.path, self.query, self.headers)
        return target


Body = bytes | AsyncIterator[bytes]


class Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str] | None = None, body: Body = b"") -> None:
        self.status = status
        self.headers = headers if headers is not None else {}
        self.body = body


class _AfterBody:
    """A streamed body that runs ``done`` once, however it ends (exhausted, failed, or closed unstarted)."""

    __slots__ = ("_body", "_done")

    def __init__(self, body: AsyncIterator[bytes], done: Callable[[], None]) -> None:
        self._body = body
        self._done: Callable[[], None] | None = done

    def __aiter__(self) -> _AfterBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._body.__anext__()
        except BaseException:
            self._finish()
            raise

    def _finish(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done()

    async def aclose(self) -> None:
        self._finish()
        aclose = getattr(self._body, "aclose", None)
        if aclose is not None:
            await aclose()


def after_body(response: Response, done: Callable[[], None]) -> Response:
    """Run ``done`` when the response is finished: now for a bytes body, at its end for a streamed one."""
    if isinstance(response.body, bytes):
        done()
    else:
        response.body = _AfterBody(response.body, done)
    return response


Handler = Callable[[Request], Awaitable[Response]]
Middleware = Callable[[Handler], Handler]

JSON = "application/json"


def json_response(
    data: object, status: int = 200, headers: dict[str, str] | None = None, content_type: str = JSON
) -> Response:
    import msgspec

    h = {"Content-Type": content_type}
    if headers:
        h.update(headers)
    return Response(status, h, msgspec.json.encode(data))
