"""The HTTP request path: Durable Streams over aiohttp.

URL scheme:

* ``/v1/stream/{path}`` - a stream in the default bucket (what the official
  clients and conformance suite use);
* ``/v1/buckets/{bucket}/stream/{path}`` - a stream in an explicit bucket;
* ``/v1/buckets`` (GET: list) and ``/v1/buckets/{bucket}`` (PUT: create, GET:
  describe).

Handlers translate HTTP into service calls and back; protocol rules live in
``protocol``, state rules in ``state``. Any ``StreamError``/``BadRequest``
becomes a 4xx with a JSON body ``{"error": "..."}``.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

import msgspec
from aiohttp import web

from .content import (
    InvalidJson,
    encode_json_messages,
    is_json,
    is_text_like,
    json_messages_to_array,
    media_type,
    valid_media_type,
)
from .ids import (
    DEFAULT_BUCKET,
    InvalidName,
    format_offset,
    parse_offset,
    validate_bucket,
    validate_stream_path,
)
from .live import TooManyWaiters
from .protocol import BadRequest, next_cursor, parse_closed, parse_expires_at, parse_uint
from .service import StreamService, now_ms
from .state import AppendRequest, CreateRequest, ForkRequest, Stream, StreamError

log = logging.getLogger(__name__)

STREAM_PREFIX = "/v1/stream/"
BUCKETS_PREFIX = "/v1/buckets"

EXPOSED_HEADERS = ", ".join(
    [
        "Stream-Next-Offset",
        "Stream-Cursor",
        "Stream-Up-To-Date",
        "Stream-Closed",
        "Stream-TTL",
        "Stream-Expires-At",
        "Stream-Sse-Data-Encoding",
        "Stream-Retained-Offset",
        "Producer-Epoch",
        "Producer-Seq",
        "Producer-Expected-Seq",
        "Producer-Received-Seq",
        "ETag",
        "Location",
        "Content-Type",
        "Retry-After",
    ]
)
ALLOWED_HEADERS = ", ".join(
    [
        "Content-Type",
        "Authorization",
        "If-None-Match",
        "Stream-Seq",
        "Stream-TTL",
        "Stream-Expires-At",
        "Stream-Closed",
        "Stream-Forked-From",
        "Stream-Fork-Offset",
        "Stream-Fork-Sub-Offset",
        "Producer-Id",
        "Producer-Epoch",
        "Producer-Seq",
    ]
)
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Resource-Policy": "cross-origin",
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": EXPOSED_HEADERS,
}
CACHEABLE = "public, max-age=60, stale-while-revalidate=300"


def error_response(status: int, message: str, headers: dict[str, str] | None = None, code: str | None = None) -> web.Response:
    body = msgspec.json.encode({"error": message} if code is None else {"error": message, "code": code})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


# Headers whose values we store or echo: they must be clean UTF-8 text.
_TEXT_HEADERS = ("Content-Type", "Producer-Id", "Stream-Seq", "Stream-Forked-From", "Stream-Expires-At")


def _clean_header(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes arrive as lone surrogates
        return False
    return value.isprintable()


def _decode_path(raw: str) -> str:
    """Percent-decode strictly: invalid UTF-8 must not alias onto U+FFFD names."""
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise InvalidName("the path is not valid UTF-8 once percent-decoded") from None


def _not_reserved(path: str) -> str:
    """``__ds/...`` is the protocol's control namespace (tiered.http_subscriptions), never a stream."""
    if path.split("/", 1)[0] == "__ds":
        raise InvalidName("stream paths whose first segment is __ds are reserved for Durable Streams control APIs")
    return path


def _stream_address(path: str) -> tuple[str, str]:
    """(bucket, stream path) for a request path, or raise BadRequest/InvalidName."""
    if path.startswith(STREAM_PREFIX):
        return DEFAULT_BUCKET, _not_reserved(validate_stream_path(path[len(STREAM_PREFIX) :]))
    if path.startswith(BUCKETS_PREFIX + "/"):
        rest = path[len(BUCKETS_PREFIX) + 1 :]
        bucket, sep, tail = rest.partition("/stream/")
        if sep:
            return validate_bucket(bucket), _not_reserved(validate_stream_path(tail))
    raise InvalidName("not a stream URL")


class StreamsApi:
    def __init__(self, service: StreamService) -> None:
        self.service = service
        self.config = service.config

    # ---------------------------------------------------------------- wiring

    def routes(self) -> list[web.RouteDef]:
        return [
            # [\s\S]: a path with an encoded newline must reach validation (400), not miss the route.
            web.route("*", "/v1/stream/{path:[\\s\\S]*}", self.dispatch_stream),
            web.route("*", BUCKETS_PREFIX + "/{bucket}/stream/{path:[\\s\\S]*}", self.dispatch_stream),
            web.get(BUCKETS_PREFIX, self.list_buckets),
            web.put(BUCKETS_PREFIX + "/{bucket}", self.put_bucket),
            web.get(BUCKETS_PREFIX + "/{bucket}", self.get_bucket),
            web.get("/healthz", self.health),
            web.get("/readyz", self.ready),
        ]

    async def dispatch_stream(self, request: web.Request) -> web.StreamResponse:
        handler: Callable[[web.Request, str, str], Awaitable[web.StreamResponse]] | None = {
            "GET": self.read,
            "HEAD": self.head,
            "PUT": self.create,
            "POST": self.append,
            "DELETE": self.delete,
        }.get(request.method)
        if handler is None:
            return error_response(405, f"method {request.method} is not allowed on a stream")
        try:
            bucket, path = _stream_address(_decode_path(request.raw_path.split("?", 1)[0]))
        except InvalidName as exc:
            return error_response(400, str(exc))
        for name in _TEXT_HEADERS:
            value = request.headers.get(name)
            if value is not None and not _clean_header(value):
                return error_response(400, f"{name} must be printable UTF-8 text")
        try:
            return await handler(request, bucket, path)
        except StreamError as exc:
            if request.method == "HEAD":
                return web.Response(status=exc.status, headers=exc.headers)
            return error_response(exc.status, exc.message, exc.headers, exc.code)
        except (BadRequest, InvalidName, InvalidJson) as exc:
            return error_response(400, str(exc))
        except TooManyWaiters:
            return error_response(503, "too many live readers; retry shortly", {"Retry-After": "1"})

    # ---------------------------------------------------------------- create

    async def create(self, request: web.Request, bucket: str, path: str) -> web.StreamResponse:
        h = request.headers
        content_type = h.get("Content-Type")
        if content_type is not None and not valid_media_type(content_type):
            raise BadRequest(f"invalid Content-Type {content_type!r}")
        ttl_s, expires_at, expires_at_ms = self._expiry(h)
        closed = parse_closed(h.get("Stream-Closed"))
        fork = await self._fork_request(h)
        body = await request.read()
        effective_type = content_type
        if fork is not None and content_type is None:
            source = self.service.state.streams.get(fork.source_uid)
            if source is None:
                raise StreamError(404, "fork source stream not found")
            effective_type = source.content_type
        data = body
        if body and effective_type is not None and is_json(effective_type):
            data = encode_json_messages(body, allow_empty_array=True)
        self._check_hot_capacity(len(data))
        created, s = await self.service.create(
            bucket,
            path,
            CreateRequest(
                content_type=content_type,
                ttl_s=ttl_s,
                expires_at=expires_at,
                expires_at_ms=expires_at_ms,
                closed=closed,
                data=data,
                fork=fork,
            ),
        )
        v = self.service.view(s)
        headers = {
            "Content-Type": s.content_type,
            "Stream-Next-Offset": format_offset(v.tail),
        }
        if v.closed:
            headers["Stream-Closed"] = "true"
        if created:
            headers["Location"] = str(request.url.with_query(None))
        return web.Response(status=201 if created else 200, headers=headers)

    def _expiry(self, h) -> tuple[int | None, str | None, int | None]:  # type: ignore[no-untyped-def]
        ttl_raw, exp_raw = h.get("Stream-TTL"), h.get("Stream-Expires-At")
        if ttl_raw is not None and exp_raw is not None:
            raise BadRequest("use Stream-TTL or Stream-Expires-At, not both")
        ttl_s = parse_uint(ttl_raw, "Stream-TTL") if ttl_raw is not None else None
        if exp_raw is not None:
            return None, exp_raw, parse_expires_at(exp_raw)
        return ttl_s, None, None

    async def _fork_request(self, h) -> ForkRequest | None:  # type: ignore[no-untyped-def]
        source_url = h.get("Stream-Forked-From")
        offset_raw = h.get("Stream-Fork-Offset")
        sub_raw = h.get("Stream-Fork-Sub-Offset")
        if source_url is None:
            if offset_raw is not None or sub_raw is not None:
                raise BadRequest("Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From")
            return None
        try:
            src_bucket, src_path = _stream_address(_decode_path(source_url.split("?", 1)[0]))
        except InvalidName:
            raise StreamError(404, "fork source stream not found") from None
        source = self.service.state.find(src_bucket, src_path)
        if source is None:
            raise StreamError(404, "fork source stream not found")
        if source.soft_deleted:
            raise StreamError(409, "fork source stream was deleted")
        source = self.service.lookup(src_bucket, src_path)
        v = self.service.view(source)
        if offset_raw is None:
            offset = v.tail
        else:
            parsed = parse_offset(offset_raw)
            if parsed is None:
                raise BadRequest(f"malformed Stream-Fork-Offset {offset_raw!r}")
            if parsed > v.tail:
                raise BadRequest("Stream-Fork-Offset is beyond the source stream's tail")
            offset = parsed
        sub = parse_uint(sub_raw, "Stream-Fork-Sub-Offset") if sub_raw is not None else 0
        if sub:
            offset = await self._resolve_sub_offset(source, offset, sub, v.tail)
        spec = f"{src_bucket}/{src_path}@{offset_raw or ''}+{sub}"
        return ForkRequest(source_uid=source.uid, offset=offset, spec=spec)

    async def _resolve_sub_offset(self, source: Stream, anchor: int, sub: int, tail: int) -> int:
        """Move a fork point ``sub`` bytes (or JSON messages) past ``anchor``."""
        if source.json:
            data = await self.service.read(source, anchor, tail)
            pos = 0
            for _ in range(sub):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    raise BadRequest("Stream-Fork-Sub-Offset is past the end of the source stream")
                pos = nl + 1
            return anchor + pos
        if anchor + sub > tail:
            raise BadRequest("Stream-Fork-Sub-Offset is past the end of the source stream")
        return anchor + sub

    def _check_hot_capacity(self, incoming: int) -> None:
        if incoming and self.service.state.hot_bytes + incoming > self.config.max_hot_bytes:
            raise StreamError(
                503, "hot tier is full until data moves to the cold tier", {"Retry-After": "2"}
            )

    # ---------------------------------------------------------------- append

    async def append(self, request: web.Request, bucket: str, path: str) -> web.StreamResponse:
        h = request.headers
        close = parse_closed(h.get("Stream-Closed"))
        producer, epoch, seq = self._producer(h)
        stream_seq = h.get("Stream-Seq")
        content_type = h.get("Content-Type")
        body = await request.read()
        s = self.service.lookup(bucket, path)
        if not body and not close:
            raise BadRequest("an append needs a body (or Stream-Closed: true to close)")
        data = body
        if body:
            if content_type is None:
                raise BadRequest("an append with a body needs a Content-Type")
            if not valid_media_type(content_type):
                raise BadRequest(f"invalid Content-Type {content_type!r}")
            if s.json and media_type(content_type) == "application/json" and not s.closed:
                data = encode_json_messages(body, allow_empty_array=False)
        self._check_hot_capacity(len(data))
        result = await self.service.append(
            bucket,
            path,
            AppendRequest(
                content_type=content_type,
                data=data,
                close=close,
                producer=producer,
                epoch=epoch,
                seq=seq,
                stream_seq=stream_seq,
            ),
        )
        headers = {"Stream-Next-Offset": format_offset(result.tail)}
        if result.closed:
            headers["Stream-Closed"] = "true"
        if producer is not None and result.epoch is not None:
            headers["Producer-Epoch"] = str(result.epoch)
            headers["Producer-Seq"] = str(result.seq)
            # 200 says "new data stored"; duplicates and close-only say 204.
            return web.Response(status=200 if data and not result.duplicate else 204, headers=headers)
        return web.Response(status=204, headers=headers)

    def _producer(self, h) -> tuple[str | None, int, int]:  # type: ignore[no-untyped-def]
        pid, epoch_raw, seq_raw = h.get("Producer-Id"), h.get("Producer-Epoch"), h.get("Producer-Seq")
        present = [v is not None for v in (pid, epoch_raw, seq_raw)]
        if not any(present):
            return None, 0, 0
        if not all(present):
            raise BadRequest("Producer-Id, Producer-Epoch and Producer-Seq must be sent together")
        if not pid:
            raise BadRequest("Producer-Id must not be empty")
        return pid, parse_uint(epoch_raw, "Producer-Epoch"), parse_uint(seq_raw, "Producer-Seq")

    # ---------------------------------------------------------------- delete

    async def delete(self, request: web.Request, bucket: str, path: str) -> web.StreamResponse:
        await self.service.delete(bucket, path)
        return web.Response(status=204)

    # ------------------------------------------------------------------ head

    async def head(self, request: web.Request, bucket: str, path: str) -> web.StreamResponse:
        s = self.service.lookup(bucket, path)
        v = self.service.view(s)
        headers = {
            "Content-Type": s.content_type,
            "Stream-Next-Offset": format_offset(v.tail),
            "Cache-Control": "no-store",
        }
        self._expiry_headers(s, headers)
        if v.closed:
            headers["Stream-Closed"] = "true"
        headers["Stream-Retained-Offset"] = format_offset(s.retained_from)
        return web.Response(status=200, headers=headers)

    @staticmethod
    def _expiry_headers(s: Stream, headers: dict[str, str]) -> None:
        if s.ttl_s is not None:
            headers["Stream-TTL"] = str(s.ttl_s)
        if s.expires_at is not None:
            headers["Stream-Expires-At"] = s.expires_at

    # ------------------------------------------------------------------ read

    async def read(self, request: web.Request, bucket: str, path: str) -> web.StreamResponse:
        q = request.query
        live = q.get("live")
        if live not in (None, "long-poll", "sse"):
            raise BadRequest(f"unknown live mode {live!r}; use long-poll or sse")
        offset_raw = q.get("offset")
        if live is not None and offset_raw is None:
            raise BadRequest("live reads need an offset")
        s = self.service.lookup(bucket, path)
        self.service.touch(s)
        v = self.service.view(s)
        if offset_raw is None or offset_raw == "-1":
            offset = s.retained_from  # the earliest retained byte
        elif offset_raw == "now":
            offset = v.tail
        else:
            parsed = parse_offset(offset_raw)
            if parsed is None:
                raise BadRequest(f"malformed offset {offset_raw!r}")
            if parsed > v.tail:
                raise BadRequest("offset is beyond the end of the stream")
            if parsed < s.retained_from:
                raise StreamError(
                    410,
                    "data at this offset is no longer retained; Stream-Next-Offset is the earliest",
                    {"Stream-Next-Offset": format_offset(s.retained_from)},
                )
            offset = parsed
        if live == "sse":
            return await self._sse(request, s, offset)
        if live == "long-poll":
            return await self._long_poll(request, s, offset)
        if offset_raw == "now":
            headers = {
                "Content-Type": s.content_type,
                "Stream-Next-Offset": format_offset(v.tail),
                "Stream-Up-To-Date": "true",
                "Cache-Control": "no-store",
            }
            if v.closed:
                headers["Stream-Closed"] = "true"
            return web.Response(status=200, body=b"[]" if s.json else b"", headers=headers)
        return await self._chunk_response(request, s, offset, cursor=None)

    async def _read_chunk(self, s: Stream, offset: int, *, whole_chars: bool = False) -> tuple[bytes, int, bool, bool]:
        """(stored bytes, next offset, up to date, closed-at-end) from ``offset``.

        ``whole_chars`` (SSE text): never end a partial chunk inside a UTF-8 character.
        """
        v = self.service.view(s)
        end = min(v.tail, offset + self.config.read_chunk_bytes)
        data = await self.service.read(s, offset, end) if end > offset else b""
        if whole_chars and end < v.tail and data:
            cut = _utf8_boundary(data)
            if cut > 0 and data[cut - 1 : cut] == b"\r":
                cut -= 1  # keep CR LF together: split, a client would see two line breaks
            if cut > 0:
                data, end = data[:cut], offset + cut
            else:  # the chunk is smaller than one character: send the whole character
                end = min(v.tail, offset + 4)
                data = await self.service.read(s, offset, end)
                data = data[: _utf8_boundary(data) or len(data)]
                end = offset + len(data)
        if s.json and end < v.tail and data:
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one message larger than a chunk: send it whole
                rest = await self.service.read(s, end, v.tail)
                cut = len(data) + rest.find(b"\n") + 1
                data = data + rest[: cut - len(data)]
            data = data[:cut]
            end = offset + cut
        up_to_date = end >= v.tail
        return data, end, up_to_date, up_to_date and v.closed

    async def _chunk_response(self, request: web.Request, s: Stream, offset: int, cursor: str | None) -> web.Response:
        data, end, up_to_date, closed = await self._read_chunk(s, offset)
        etag = f'"{s.uid}:{format_offset(offset)}:{format_offset(end)}{":c" if closed else ""}"'
        headers = {
            "Content-Type": s.content_type,
            "Stream-Next-Offset": format_offset(end),
            "ETag": etag,
            "Cache-Control": CACHEABLE,
        }
        if up_to_date:
            headers["Stream-Up-To-Date"] = "true"
        if closed:
            headers["Stream-Closed"] = "true"
        if cursor is not None and not closed:
            headers["Stream-Cursor"] = cursor
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        body = json_messages_to_array(data) if s.json else data
        return web.Response(status=200, body=body, headers=headers)

    async def _long_poll(self, request: web.Request, s: Stream, offset: int) -> web.StreamResponse:
        cursor = next_cursor(time.time(), request.query.get("cursor"))
        deadline = time.monotonic() + self.config.long_poll_timeout_s
        while True:
            v = self.service.view(s)
            if offset < v.tail:
                return await self._chunk_response(request, s, offset, cursor)
            if v.closed:
                return web.Response(
                    status=204,
                    headers={
                        "Stream-Next-Offset": format_offset(v.tail),
                        "Stream-Up-To-Date": "true",
                        "Stream-Closed": "true",
                    },
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.service.closing:
                return web.Response(
                    status=204,
                    headers={
                        "Stream-Next-Offset": format_offset(v.tail),
                        "Stream-Up-To-Date": "true",
                        "Stream-Cursor": cursor,
                    },
                )
            await self.service.wait_for_change(s, offset, remaining)
            if self.service.state.streams.get(s.uid) is not s or s.soft_deleted:
                raise StreamError(404, "stream was deleted")

    async def _sse(self, request: web.Request, s: Stream, offset: int) -> web.StreamResponse:
        binary = not is_text_like(s.content_type)
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "Connection": "keep-alive",
        }
        if binary:
            headers["Stream-Sse-Data-Encoding"] = "base64"
        client_cursor = request.query.get("cursor")
        deadline = time.monotonic() + self.config.sse_max_connection_s
        sent_control = False
        v = self.service.view(s)
        first: tuple[bytes, int, bool, bool] | None = None
        if offset < v.tail:
            # Read before the 200 goes out: damage or an outage here is an ordinary error answer.
            first = await self._read_chunk(s, offset, whole_chars=not binary)
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        try:
            while True:
                if self.service.closing or self.service.state.streams.get(s.uid) is not s or s.soft_deleted:
                    break
                v = self.service.view(s)
                if offset < v.tail:
                    if first is not None:
                        data, offset, up_to_date, closed = first
                        first = None
                    else:
                        data, offset, up_to_date, closed = await self._read_chunk(s, offset, whole_chars=not binary)
                    cursor = next_cursor(time.time(), client_cursor)
                    # One write per data+control pair: a reader never sees data
                    # without the control event that positions it.
                    await resp.write(
                        _sse_data_event(data, s.json, binary) + _sse_control_event(offset, cursor, up_to_date, closed)
                    )
                    sent_control = True
                    if closed:
                        break
                    continue
                if v.closed:
                    await resp.write(_sse_control_event(v.tail, None, True, True))
                    break
                if not sent_control:
                    cursor = next_cursor(time.time(), client_cursor)
                    await resp.write(_sse_control_event(offset, cursor, True, False))
                    sent_control = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                changed = await self.service.wait_for_change(s, offset, min(remaining, 15.0))
                if not changed and time.monotonic() < deadline:
                    await resp.write(b": keep-alive\n\n")
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the reader went away: nothing to clean up
        except StreamError as exc:
            # The 200 is out: cut the connection without a clean end, so the client
            # sees a failed read (and its retry gets the error answer) rather than a recycle.
            log.warning("SSE read of %s/%s ended by an error: %s", s.bucket, s.path, exc.message)
            if request.transport is not None:
                request.transport.abort()
        return resp

    # --------------------------------------------------------------- buckets

    async def list_buckets(self, request: web.Request) -> web.StreamResponse:
        buckets = [{"name": name, "created_ms": ts} for name, ts in sorted(self.service.state.buckets.items())]
        return web.json_response({"buckets": buckets})

    async def put_bucket(self, request: web.Request) -> web.StreamResponse:
        try:
            name = validate_bucket(request.match_info["bucket"])
        except InvalidName as exc:
            return error_response(400, str(exc))
        try:
            created = await self.service.create_bucket(name)
        except StreamError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        return web.json_response({"name": name}, status=201 if created else 200)

    async def get_bucket(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["bucket"]
        state = self.service.state
        if name not in state.buckets:
            return error_response(404, f"bucket {name!r} does not exist")
        now = now_ms()
        streams = sum(1 for s in state.streams.values() if s.bucket == name and not s.soft_deleted and not s.expired(now))
        return web.json_response({"name": name, "created_ms": state.buckets[name], "streams": streams})

    async def health(self, request: web.Request) -> web.StreamResponse:
        """Liveness: the process runs and its journal writes (an object-store outage is not fatal)."""
        ok = self.service.journal.failed is None
        _, checks = self.service.readiness()
        return web.json_response({"ok": ok, "store": checks["store"]}, status=200 if ok else 503)

    async def ready(self, request: web.Request) -> web.StreamResponse:
        """Readiness: recovery finished, the journal writes and the object store answered its last probe."""
        ready, checks = self.service.readiness()
        return web.json_response({"ready": ready, **checks}, status=200 if ready else 503)


def _utf8_boundary(data: bytes) -> int:
    """Length of ``data`` without a trailing incomplete UTF-8 sequence."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n
        if b >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n


def _sse_data_event(data: bytes, json_mode: bool, binary: bool) -> bytes:
    if binary:
        text = base64.b64encode(data)
        lines = [text[i : i + 76] for i in range(0, len(text), 76)] or [b""]
    else:
        payload = json_messages_to_array(data) if json_mode else data
        # Splitting on every line terminator means stream bytes can never start
        # a new SSE field or event (no CR/LF injection).
        lines = payload.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    out = bytearray(b"event: data\n")
    for line in lines:
        # Parsers drop one space after "data:", so a line that itself starts
        # with a space gets an extra one to keep it; others go unpadded.
        out += (b"data: " if line.startswith(b" ") else b"data:") + line + b"\n"
    out += b"\n"
    return bytes(out)


def _sse_control_event(next_offset: int, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    control: dict[str, object] = {"streamNextOffset": format_offset(next_offset)}
    if cursor is not None and not closed:
        control["streamCursor"] = cursor
    if up_to_date:
        control["upToDate"] = True
    if closed:
        control["streamClosed"] = True
    return b"event: control\ndata:" + msgspec.json.encode(control) + b"\n\n"


@web.middleware
async def protocol_headers(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """CORS preflight, and turning any aiohttp HTTP error into our JSON shape."""
    if request.method == "OPTIONS":
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "GET, HEAD, PUT, POST, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                "Access-Control-Max-Age": "86400",
            },
        )
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, "request body is larger than the server's limit")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.status, exc.reason)
        raise


async def _add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def build_app(service: StreamService) -> web.Application:
    app = web.Application(client_max_size=service.config.max_body_bytes, middlewares=[protocol_headers])
    from .http_admin import AdminApi  # imports this module's helpers

    app.add_routes(AdminApi(service).routes())
    from .http_subscriptions import SubscriptionsApi

    app.add_routes(SubscriptionsApi(service).routes())  # the reserved /v1/stream/__ds routes, before streams
    app.add_routes(StreamsApi(service).routes())
    from .http_groups import GroupsApi

    GroupsApi(service).install(app)
    app.on_response_prepare.append(_add_security_headers)
    return app
