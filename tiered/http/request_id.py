"""Request ids: every request gets one, every line logged while handling it carries it, the response echoes it.

A client's (or a proxy's) ``X-Request-Id`` is kept when it is a plain token:
1 to 128 characters of ``A-Z a-z 0-9 . _ : = + / -``. Anything else (too
long, spaces, control characters, non-ASCII) is replaced, so an id can never
forge a log line or a response header. A generated id is this process's
random prefix and a counter: unique without a random draw per request.

The id is set in a context variable (``tiered.logs.REQUEST_ID``) and not reset
after the handler returns: both server adapters run each request in a task of
its own, with its own copy of the context, so the id lasts exactly as long as
the request, a streamed (SSE) body included.

This is the outermost layer, so it also hands every answer to ``on_answer``
(``tiered_http_requests_total``, by route and status) in the same step: a
layer of its own would cost every request another coroutine.
"""

from __future__ import annotations

import itertools
import re
import secrets
from collections.abc import Callable

from tiered.logs import REQUEST_ID

from .types import Handler, Request, Response

HEADER = "X-Request-Id"
_VALID = re.compile(r"[A-Za-z0-9._:=+/-]{1,128}")
_PREFIX = secrets.token_hex(6) + "-"
_counter = itertools.count(1)

OnAnswer = Callable[[Request, Response], None]


def new_request_id() -> str:
    return _PREFIX + str(next(_counter))


def request_ids(handler: Handler, *, on_answer: OnAnswer | None = None) -> Handler:
    async def with_request_id(request: Request) -> Response:
        request_id = request.headers.get(HEADER)
        if request_id is None or _VALID.fullmatch(request_id) is None:
            request_id = new_request_id()
        REQUEST_ID.set(request_id)
        response = await handler(request)
        response.headers[HEADER] = request_id
        if on_answer is not None:
            on_answer(request, response)
        return response

    return with_request_id
