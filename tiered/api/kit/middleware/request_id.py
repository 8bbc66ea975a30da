"""Request ids: every request gets one, every line logged while handling it carries it, the response echoes it.

A client's (or a proxy's) ``X-Request-Id`` is kept when it is a plain token:
1 to 128 characters of ``A-Z a-z 0-9 . _ : = + / -``. Anything else (too
long, spaces, control characters, non-ASCII) is replaced, so an id can never
forge a log line or a response header. A generated id is this process's
random prefix and a counter: unique without a random draw per request.

The id is set in a context variable (``tiered.core.logs.REQUEST_ID``) and not reset
after the handler returns: both server adapters run each request in a task of
its own, with its own copy of the context, so the id lasts exactly as long as
the request, a streamed (SSE) body included.

This is the outermost layer, so it also sees how every request ended, in the
same step (a layer of its own would cost every request another coroutine):

* an answer goes to the metrics (``tiered_http_requests_total``, by route and
  status) and, when its status calls for it, to the access log
  (``tiered.api.kit.middleware.access_log``);
* a client that left before its answer (the adapter's body read raised
  ``ClientDisconnected``, or the adapter cancelled the handler when the
  connection closed) is a client disconnect (``phase="request"``), never a
  status: there was nobody to answer;
* a client that left during a streamed answer (SSE) is one too
  (``phase="response"``): the adapter closed the body before it ended.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from tiered.api.kit.errors import ClientDisconnected
from tiered.api.kit.middleware.access_log import AccessLog
from tiered.api.kit.types import Handler, Request, Response
from tiered.core.logs import REQUEST_ID

HEADER = "X-Request-Id"
_VALID = re.compile(r"[A-Za-z0-9._:=+/-]{1,128}")
_PREFIX = secrets.token_hex(6) + "-"
_counter = itertools.count(1)


class RequestMetrics(Protocol):
    """What counts answered requests and clients that left (``tiered.engine.engine_metrics``, ``tiered.cluster.node_metrics``).

    Both label the request (``request.route``) as they count it, so the access
    log that follows names the same route.
    """

    def count_answer(self, request: Request, response: Response) -> None: ...

    def count_disconnect(self, request: Request, phase: str) -> None: ...


def new_request_id() -> str:
    return _PREFIX + str(next(_counter))


def request_id_of(request: Request) -> str:
    """The request's id (the client's when it is a plain token, else a new one), set for every log line."""
    request_id = request.headers.get(HEADER)
    if request_id is None or _VALID.fullmatch(request_id) is None:
        request_id = new_request_id()
    REQUEST_ID.set(request_id)
    return request_id


def answered(
    request: Request,
    response: Response,
    request_id: str,
    started: float,
    metrics: RequestMetrics | None,
    access_log: AccessLog | None,
) -> Response:
    """An answer on its way out: the id echoed, counted, logged when its status calls for it.

    Shared by this layer and the append route's fused path (``tiered.api.append_path``), so both end
    every request the same way.
    """
    response.headers[HEADER] = request_id
    if metrics is not None:
        metrics.count_answer(request, response)
    if access_log is not None and response.status >= access_log.min_status:
        access_log.answered(request, response, started)
    body = response.body
    if not isinstance(body, bytes):
        response.body = _Streamed(
            body, lambda: client_left(request, "response", started, metrics, access_log)
        )
    return response


def request_ids(
    handler: Handler,
    *,
    metrics: RequestMetrics | None = None,
    access_log: AccessLog | None = None,
) -> Handler:
    monotonic = access_log.monotonic if access_log is not None else None

    async def with_request_id(request: Request) -> Response:
        request_id = request_id_of(request)
        started = monotonic() if monotonic is not None else 0.0
        try:
            response = await handler(request)
        except (ClientDisconnected, asyncio.CancelledError):
            # The client left (or, at shutdown, the server cancelled what was still in flight).
            client_left(request, "request", started, metrics, access_log)
            raise
        return answered(request, response, request_id, started, metrics, access_log)

    return with_request_id


def client_left(
    request: Request,
    phase: str,
    started: float,
    metrics: RequestMetrics | None,
    access_log: AccessLog | None,
) -> None:
    if metrics is not None:
        metrics.count_disconnect(request, phase)
    if access_log is not None:
        access_log.left(request, phase, started)


class _Streamed:
    """A streamed body that reports a reader who left before its end: closed early, or cancelled mid-wait.

    The adapters close a streamed body however it ends (``aclose``); a body
    that ended (exhausted, or failed on the server's side, which the adapter
    logs) is not a reader leaving.
    """

    __slots__ = ("_body", "_left", "_over")

    def __init__(self, body: AsyncIterator[bytes], left: Callable[[], None]) -> None:
        self._body = body
        self._left = left
        self._over = False

    def __aiter__(self) -> _Streamed:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._body.__anext__()
        except asyncio.CancelledError:
            self._report()  # the adapter cancelled the handler: the connection closed
            raise
        except BaseException:
            self._over = True  # the end, or the server's own failure
            raise

    def _report(self) -> None:
        if not self._over:
            self._over = True
            self._left()

    async def aclose(self) -> None:
        self._report()
        aclose = getattr(self._body, "aclose", None)
        if aclose is not None:
            await aclose()
