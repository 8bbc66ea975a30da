"""The one place error codes become HTTP: status, headers and body.

Every error body has one shape, the one the protocol uses for its
subscription APIs::

    {"error": {"code": "STREAM_CLOSED", "message": "stream is closed", "next_offset": "..."}}

and the protocol's headers carry what clients must not parse bodies for:
``Stream-Closed`` and ``Stream-Next-Offset`` on a closed stream,
``Stream-Next-Offset`` below the retained offset, ``Producer-Epoch`` and the
expected/received sequence headers for producers, ``Retry-After`` on every
429 and 503, ``WWW-Authenticate`` on 401, ``Allow`` on 405. Anything that is not a
``TieredError`` is a bug: logged with its traceback, answered 500, except
``ClientDisconnected``: the client left while its request was being read, so
there is nobody to answer (the request-id layer counts it as a client
disconnect, never as a 500).
"""

from __future__ import annotations

import logging

import msgspec

from tiered.api.kit.types import Handler, Request, Response
from tiered.core.errors import ErrorCode, TieredError

log = logging.getLogger(__name__)

C = ErrorCode
STATUS: dict[ErrorCode, int] = {
    C.BAD_REQUEST: 400,
    C.INVALID_REQUEST: 400,
    C.WEBHOOK_URL_REJECTED: 400,
    C.UNAUTHORIZED: 401,
    C.TOKEN_INVALID: 401,
    C.TOKEN_EXPIRED: 401,
    C.STALE_PRODUCER_EPOCH: 403,
    C.FORBIDDEN: 403,
    C.ADMIN_DISABLED: 403,
    C.NOT_FOUND: 404,
    C.STREAM_NOT_FOUND: 404,
    C.FORK_SOURCE_NOT_FOUND: 404,
    C.BUCKET_NOT_FOUND: 404,
    C.SUBSCRIPTION_NOT_FOUND: 404,
    C.GROUP_NOT_FOUND: 404,
    C.TOKEN_NOT_FOUND: 404,
    C.METHOD_NOT_ALLOWED: 405,
    C.STREAM_EXISTS: 409,
    C.PATH_OFFSETS_USED: 409,
    C.STREAM_CLOSED: 409,
    C.CONTENT_TYPE_MISMATCH: 409,
    C.PRODUCER_SEQ_GAP: 409,
    C.STREAM_SEQ_REGRESSION: 409,
    C.FORK_SOURCE_DELETED: 409,
    C.BUCKET_ERASED: 409,
    C.DEFAULT_BUCKET_PROTECTED: 409,
    C.SUBSCRIPTION_ALREADY_EXISTS: 409,
    C.FENCED: 409,
    C.ALREADY_CLAIMED: 409,
    C.NO_PENDING_WORK: 409,
    C.INVALID_OFFSET: 409,
    C.GROUP_EXISTS: 409,
    C.NOT_MEMBER: 409,
    C.TOO_MANY_MEMBERS: 409,
    C.STALE_REVISION: 409,
    C.OFFSET_BEYOND_TAIL: 400,
    C.STREAM_DELETED: 410,
    C.OFFSET_GONE: 410,
    C.BUCKET_ALREADY_ERASED: 410,
    C.PAYLOAD_TOO_LARGE: 413,
    C.TOO_MANY_STREAMS: 413,
    C.RATE_LIMITED: 429,
    C.INTERNAL_ERROR: 500,
    C.DATA_DAMAGED: 502,
    C.HOT_TIER_FULL: 503,
    C.TOO_MANY_READERS: 503,
    C.JOURNAL_FAILED: 503,
    C.STORE_UNAVAILABLE: 503,
    C.COLD_NOT_READY: 503,
    C.UNAVAILABLE: 503,
    C.SHARD_NOT_OWNED: 503,  # cluster: no valid lease here (yet); the owner or a retry will answer
    C.SHARD_FENCED: 503,  # cluster: a higher epoch took the shard over; retry reaches the new owner
    C.QUOTA_EXCEEDED: 507,
    # Stream snapshots.
    C.SNAPSHOT_NOT_FOUND: 404,
    C.SNAPSHOT_CONFLICT: 409,
    C.SNAPSHOT_STALE: 409,
    C.SNAPSHOT_PRECONDITION_FAILED: 412,
    C.SNAPSHOT_NOT_AT_BOUNDARY: 400,
    C.TAIL_MISMATCH: 412,  # issue 22: conditional appends
    C.KEY_NOT_FOUND: 404,  # issue 21: keyed reads
    # Issue 21: per-append keys (``Stream-Key``) of streams keyed by header.
    C.STREAM_KEY_INVALID: 400,
    C.STREAM_KEY_REQUIRED: 400,
    C.STREAM_KEY_NOT_ALLOWED: 400,
}
RETRY_AFTER_S: dict[ErrorCode, int] = {
    C.HOT_TIER_FULL: 2,
    C.TOO_MANY_READERS: 1,
    C.JOURNAL_FAILED: 5,
    C.STORE_UNAVAILABLE: 2,
    C.COLD_NOT_READY: 1,
    C.UNAVAILABLE: 5,
    C.SHARD_NOT_OWNED: 1,
    C.SHARD_FENCED: 1,
    C.RATE_LIMITED: 1,
}
_encode = msgspec.json.Encoder().encode


class ClientDisconnected(Exception):
    """The client closed the connection before its request was read in full (raised by the adapters' body reads)."""


def error_response(exc: TieredError) -> Response:
    status = STATUS[exc.code]
    ctx = exc.context
    headers = {"Content-Type": "application/json"}
    code = exc.code
    if code is C.STREAM_CLOSED:
        headers["Stream-Closed"] = "true"
        headers["Stream-Next-Offset"] = ctx["next_offset"]
    elif code is C.OFFSET_GONE:
        headers["Stream-Next-Offset"] = ctx["next_offset"]
    elif code is C.TAIL_MISMATCH:
        headers["Stream-Next-Offset"] = ctx["next_offset"]
        if "record_next" in ctx:
            headers["Stream-Record-Next"] = str(ctx["record_next"])
    elif code is C.STALE_PRODUCER_EPOCH:
        headers["Producer-Epoch"] = str(ctx["epoch"])
    elif code is C.PRODUCER_SEQ_GAP:
        headers["Producer-Expected-Seq"] = str(ctx["expected_seq"])
        headers["Producer-Received-Seq"] = str(ctx["received_seq"])
    elif code is C.UNAUTHORIZED:
        headers["WWW-Authenticate"] = ctx.get("challenge", "Bearer")
    elif code is C.METHOD_NOT_ALLOWED and "allow" in ctx:
        headers["Allow"] = ctx["allow"]
    if code is C.KEY_NOT_FOUND and "key_offset" in ctx:  # issue 21: the tombstone that deleted the key
        headers["Stream-Key-Offset"] = ctx["key_offset"]
    if "snapshot_offset" in ctx:  # the stream's newest snapshot (a 410 below retention: bootstrap from it)
        headers["Stream-Snapshot-Offset"] = ctx["snapshot_offset"]
    if status in (429, 503):
        headers["Retry-After"] = str(ctx.get("retry_after_s", RETRY_AFTER_S.get(code, 1)))
    body = {"code": code.value, "message": exc.message}
    body.update((k, v) for k, v in ctx.items() if k not in ("challenge", "allow"))
    return Response(status, headers, _encode({"error": body}))


def map_errors(handler: Handler) -> Handler:
    """Middleware: every ``TieredError`` becomes its response; anything else is a logged 500."""

    async def mapped(request: Request) -> Response:
        try:
            return await handler(request)
        except TieredError as exc:
            return error_response(exc)
        except ClientDisconnected:
            raise  # nobody to answer: not a bug (``tiered.api.kit.middleware.request_id`` counts it)
        except Exception:
            return internal_error(request)

    return mapped


def internal_error(request: Request) -> Response:
    """The answer to an exception that is not a ``TieredError`` (a bug): logged with its traceback, 500.

    Call it from an ``except`` block (this module's middleware, the fused append path).
    """
    log.exception("internal error handling %s %s", request.method, request.path[:200])
    return error_response(TieredError(C.INTERNAL_ERROR, "internal error"))
