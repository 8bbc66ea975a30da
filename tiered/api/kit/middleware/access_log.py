"""The access log: one structured line per refused or failed request, so a refusal leaves a trace.

``--access-log`` (``access_log``): ``errors`` (the default) writes a line for
every answer with status >= 400 and for every client that left before its
answer; ``all`` writes one for every request (and for clients that left in the
middle of a streamed answer); ``off`` writes none. Lines go to the
``tiered.access`` logger, in the configured ``log_format``, at INFO (WARNING
for 5xx), whatever ``log_level`` is (``tiered.core.logs.configure_logging``):
turning them off is ``access_log = off``.

Fields (``tiered.core.logs`` renders them as `` key=value`` in text, as keys of the
JSON object in json): ``request_id`` (as on every line logged for the request,
so it finds the request's other lines too), ``method``, ``route`` (the
metrics label: never the path sent), ``bucket`` (when the request names a
valid one), ``status``, ``code`` (the ``{"error": {"code"}}`` of the answer),
``duration_ms``; a client that left has ``phase`` (``request``: before its
answer; ``response``: during a streamed one) instead of ``status`` and
``code``. Nothing else the client sent is written: no credential, no header
or query value, no stream name.

The success path pays one clock read and one comparison; only logged
requests pay for the rest (decoding the error code from the answer's body).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import msgspec

from tiered.api.kit.router import normalize_path
from tiered.api.kit.types import UNMATCHED, Request, Response
from tiered.core.errors import TieredError
from tiered.core.ids import DEFAULT_BUCKET, validate_bucket

log = logging.getLogger("tiered.access")

MODES = ("off", "errors", "all")
_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"))
_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_STREAM_PREFIX = "/v1/stream/"
_BUCKETS_PREFIX = "/v1/buckets/"


class _Error(msgspec.Struct):
    code: str = ""


class _ErrorBody(msgspec.Struct):
    error: _Error | None = None


_decode_error = msgspec.json.Decoder(_ErrorBody).decode


def error_code(response: Response) -> str | None:
    """The ``{"error": {"code"}}`` of an answer's body, when it has one (and it is a code, not free text)."""
    body = response.body
    if not isinstance(body, bytes) or not body.startswith(b"{"):
        return None
    try:
        error = _decode_error(body).error
    except msgspec.DecodeError:
        return None
    if error is None or not _CODE.fullmatch(error.code):
        return None
    return error.code


def bucket_of(request: Request) -> str | None:
    """The bucket the request names, if a valid one: from its route, what auth classified, or its path."""
    bucket: Any = request.params.get("bucket") or getattr(request.access, "bucket", None)
    if bucket is None:
        path = normalize_path(request.path)
        if path.startswith(_STREAM_PREFIX):
            bucket = DEFAULT_BUCKET  # streams and the subscription APIs (``/v1/stream/__ds``)
        elif path.startswith(_BUCKETS_PREFIX):
            bucket = path[len(_BUCKETS_PREFIX) :].split("/", 1)[0]
    if not isinstance(bucket, str):
        return None
    try:
        return validate_bucket(bucket)
    except TieredError:
        return None  # whatever the client sent, it is no bucket name: not written


class AccessLog:
    """What ``tiered.api.kit.middleware.request_id`` hands each answer (or each client that left) to."""

    __slots__ = ("min_status", "log_all", "monotonic")

    def __init__(self, mode: str, monotonic: Callable[[], float]) -> None:
        if mode not in ("errors", "all"):
            raise ValueError(f"access log mode {mode!r}: 'errors' or 'all' (off: no AccessLog)")
        self.log_all = mode == "all"
        self.min_status = 0 if self.log_all else 400
        self.monotonic = monotonic

    def answered(self, request: Request, response: Response, started: float) -> None:
        """One answered request (``min_status`` and above)."""
        status = response.status
        fields = self._fields(request)
        fields["status"] = status
        if status >= 400:
            code = error_code(response)
            if code is not None:
                fields["code"] = code
        fields["duration_ms"] = self._since(started)
        if status >= 500:
            log.warning("request failed", extra={"fields": fields})
        elif status >= 400:
            log.info("request refused", extra={"fields": fields})
        else:
            log.info("request served", extra={"fields": fields})

    def left(self, request: Request, phase: str, started: float) -> None:
        """A client that disconnected: before its answer (``request``) or during a streamed one (``response``)."""
        if phase == "response" and not self.log_all:
            return  # its answer was logged (or not) by status; ending a stream is the reader's right
        fields = self._fields(request)
        fields["phase"] = phase
        fields["duration_ms"] = self._since(started)
        log.info("client disconnected", extra={"fields": fields})

    def _fields(self, request: Request) -> dict[str, Any]:
        method = request.method if request.method in _METHODS else "OTHER"
        fields: dict[str, Any] = {"method": method, "route": request.route or UNMATCHED}
        bucket = bucket_of(request)
        if bucket is not None:
            fields["bucket"] = bucket
        return fields

    def _since(self, started: float) -> float:
        return round((self.monotonic() - started) * 1000, 3)
