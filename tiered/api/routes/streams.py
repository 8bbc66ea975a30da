"""Stream routes: the Durable Streams protocol's create, append, read (catch-up, long-poll, SSE), HEAD, delete.

* ``/v1/stream/{path}``: a stream in the default bucket (what the official
  clients and the conformance suite use);
* ``/v1/buckets/{bucket}/stream/{path}``: a stream in an explicit bucket.

Each operation is a row of the route table (``tiered.api.table``: ``append``,
``read``, ``head``, ``create``, ``delete``, and a 405 for any other method),
bound to its ``serve_*`` handler. The stream's address, the live mode and a
fork's source come from the request's parsed target (``tiered.api.kit.target``),
the very value the access check judged: never parsed again here. Handlers parse the other headers into
requests, call ``StreamService`` and render its answers; protocol rules live
in ``protocol``, state rules in the state machine, and errors are
``TieredError`` codes mapped in ``tiered.api.kit.errors``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from tiered.api.kit.target import StreamAddress
from tiered.api.kit.target import clean_header as _clean_header
from tiered.api.kit.types import Handler, LiveLease, Request, Response
from tiered.api.routes.keyed import key_response, keyed_headers, read_live_chunk
from tiered.api.routes.snapshots import SnapshotRoutes, snapshot_headers, wants_snapshot_read
from tiered.api.routes.sse import control_event, credential_event, data_event, utf8_boundary
from tiered.core.clock import Clock
from tiered.core.content import is_json, is_text_like, json_messages_to_array, valid_media_type
from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import format_offset, parse_offset
from tiered.core.parsing import parse_uint
from tiered.engine.streams import integrity
from tiered.engine.streams.conditions import parse_expected_offset, parse_record_match
from tiered.engine.streams.header_keys import parse_key_headers
from tiered.engine.streams.large_bodies import LargeBodies
from tiered.engine.streams.locators import LOCATOR_HEADER, LOCATOR_MEDIA_TYPE, build_locator, encode_locator
from tiered.engine.streams.model import AppendRequest, CreateRequest, ForkRequest, Stream
from tiered.engine.streams.protocol import (
    HEADER_LIMITS,
    check_value_lengths,
    next_cursor,
    parse_closed,
    parse_expires_at,
)
from tiered.engine.streams.service import StreamService

CACHEABLE = "public, max-age=60, stale-while-revalidate=300"
# Headers whose values we store or echo: they must be clean UTF-8 text.
_TEXT_HEADERS = ("Content-Type", "Producer-Id", "Stream-Seq", "Stream-Forked-From", "Stream-Expires-At")
assert set(_TEXT_HEADERS) == set(HEADER_LIMITS)  # ``check_stream_headers`` looks each up once for both checks

StreamHandler = Callable[[Request, str, str], Awaitable[Response]]


class StreamRoutes:
    def __init__(
        self,
        service: StreamService,
        clock: Clock,
        *,
        read_chunk_bytes: int,
        long_poll_timeout_s: float,
        sse_max_connection_s: float,
        locator_valid_ms: int = 0,
        locator_span_bytes: int = 0,
        snapshots: SnapshotRoutes | None = None,
        large: LargeBodies | None = None,
    ) -> None:
        """``locator_valid_ms`` > 0 (cluster mode): peers may ask for cold locators (``tiered/engine/streams/locators.py``)."""
        self.service = service
        self.locator_valid_ms = locator_valid_ms
        self.locator_span_bytes = locator_span_bytes
        self.clock = clock
        self.read_chunk_bytes = read_chunk_bytes
        self.long_poll_timeout_s = long_poll_timeout_s
        self.sse_max_connection_s = sse_max_connection_s
        self.snapshots = snapshots  # stream snapshots and bootstrap reads (``tiered.api.routes.snapshots``)
        self.large = large  # large bodies stored by reference (``tiered.engine.streams.large_bodies``)
        # The route table's handlers (``tiered.api.table``): each checks the headers, then serves.
        self.serve_append = self._checked(self.append)
        self.serve_read = self._checked(self.read)
        self.serve_head = self._checked(self.head)
        self.serve_create = self._checked(self.create)
        self.serve_delete = self._checked(self.delete)

    def _checked(self, handler: StreamHandler) -> Handler:
        async def serve(request: Request) -> Response:
            target = request.target  # parsed once (and cached per path): what the access check judged
            bucket, path = target.bucket, target.stream
            assert bucket is not None and path is not None
            check_stream_headers(request.headers)
            return await handler(request, bucket, path)

        return serve

    async def not_allowed(self, request: Request) -> Response:
        """Any other method on a stream."""
        raise TieredError(
            ErrorCode.METHOD_NOT_ALLOWED,
            f"method {request.method} is not allowed on a stream",
            allow="GET, HEAD, PUT, POST, DELETE",
        )

    # ---------------------------------------------------------------- create

    async def create(self, request: Request, bucket: str, path: str) -> Response:
        if self.snapshots is not None and "snapshot" in request.query:  # a snapshot's publish
            return await self.snapshots.publish(request, bucket, path)
        h = request.headers
        content_type = h.get("Content-Type")
        if content_type is not None and not valid_media_type(content_type):
            raise bad_request(f"invalid Content-Type {content_type!r}")
        ttl_s, expires_at, expires_at_ms = _expiry(h)
        closed = parse_closed(h.get("Stream-Closed"))
        fork = await self._fork_request(h, request.target.fork, bucket, path)
        compaction_key = h.get(
            "Stream-Compaction-Key"
        )  # keyed compaction (``keyed``), checked by the service
        body = await request.body()
        created, s = await self.service.create(
            bucket,
            path,
            CreateRequest(content_type, ttl_s, expires_at, expires_at_ms, closed, body, fork, compaction_key),
        )
        v = self.service.view(s)
        headers = {"Content-Type": s.content_type, "Stream-Next-Offset": format_offset(v.tail)}
        if v.closed:
            headers["Stream-Closed"] = "true"
        if created:
            # Absolute when the Host is sound, else relative (RFC 9110 allows both).
            headers["Location"] = (request.origin or "") + request.path
        return Response(201 if created else 200, headers)

    async def _fork_request(
        self, h: Mapping[str, str], source: StreamAddress | None, bucket: str, path: str
    ) -> ForkRequest | None:
        """``source``: the fork's source as the target parsed it (and the access check judged it)."""
        offset_raw = h.get("Stream-Fork-Offset")
        sub_raw = h.get("Stream-Fork-Sub-Offset")
        if source is None:
            if offset_raw is not None or sub_raw is not None:
                raise bad_request("Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From")
            return None
        src_bucket, src_path = source
        offset = None
        if offset_raw is not None:
            offset = parse_offset(offset_raw)
            if offset is None:
                raise bad_request(f"malformed Stream-Fork-Offset {offset_raw!r}")
        sub = parse_uint(sub_raw, "Stream-Fork-Sub-Offset") if sub_raw is not None else 0
        spec = f"{src_bucket}/{src_path}@{offset_raw or ''}+{sub}"
        return await self.service.fork_request(
            src_bucket, src_path, offset, sub, spec, target=(bucket, path), headers=h
        )

    # ---------------------------------------------------------------- append

    async def append(self, request: Request, bucket: str, path: str) -> Response:
        h = request.headers
        close = parse_closed(h.get("Stream-Closed"))
        producer, epoch, seq = _producer(h)
        stream_seq = h.get("Stream-Seq")
        if stream_seq == "":
            raise bad_request("Stream-Seq must not be empty")
        content_type = h.get("Content-Type")
        expected = parse_expected_offset(h)
        record_match = parse_record_match(h)
        key, tombstone = parse_key_headers(h)  # issue 21: ``Stream-Key`` (``header_keys``)
        size = request.declared_length()
        stream = None
        if (
            self.large is not None
            and key is None
            and self.large.takes(size)
            and not is_json(content_type or "")
        ):
            stream = request.body_stream()  # a large body: streamed to its own object, journaled by reference
        if stream is not None and size is not None and self.large is not None:
            _check_body_type(content_type)
            req = AppendRequest(
                content_type, b"", close, producer, epoch, seq, stream_seq, expected, record_match
            )
            result = await self.large.append(bucket, path, req, size, stream)
        else:
            # The body, read whole (within ``max_body_bytes``) and checked here rather than in a helper
            # coroutine (one frame fewer for every append); the request is built once, with it.
            body = await request.body()
            if not body and not (close or tombstone):
                raise bad_request("an append needs a body (or Stream-Closed: true to close)")
            if body:
                _check_body_type(content_type)
            req = AppendRequest(
                content_type,
                body,
                close,
                producer,
                epoch,
                seq,
                stream_seq,
                expected,
                record_match,
                key,  # issue 21: a keyed append (``header_keys``)
                tombstone,
            )
            result = await self.service.append(bucket, path, req)
        headers = {"Stream-Next-Offset": format_offset(result.tail)}
        next_record = self.service.record_at(result.stream, result.tail, result.tail)
        if next_record is not None:
            headers["Stream-Record-Next"] = str(next_record)
        if result.closed:
            headers["Stream-Closed"] = "true"
        if producer is not None and result.epoch is not None:
            headers["Producer-Epoch"] = str(result.epoch)
            headers["Producer-Seq"] = str(result.seq)
            # 200 says "new data stored"; duplicates and close-only say 204.
            return Response(200 if result.stored else 204, headers)
        return Response(204, headers)

    # ---------------------------------------------------------------- delete, head

    async def delete(self, request: Request, bucket: str, path: str) -> Response:
        await self.service.delete(bucket, path, request.headers)
        return Response(204)

    async def head(self, request: Request, bucket: str, path: str) -> Response:
        s = self.service.lookup(bucket, path)
        v = self.service.view(s)
        headers = {
            "Content-Type": s.content_type,
            "Stream-Next-Offset": format_offset(v.tail),
            "Cache-Control": "no-store",
        }
        _expiry_headers(s, headers)
        if v.closed:
            headers["Stream-Closed"] = "true"
        headers["Stream-Retained-Offset"] = format_offset(s.retained_from)
        snapshot_headers(s, headers)
        records = self.service.records(s, v.tail)
        if records is not None:  # record ordinals (``tiered.engine.streams.ordinals``)
            headers["Stream-Record-First"] = str(records.first)
            headers["Stream-Record-Next"] = str(records.next)
            headers["Stream-Record-Count"] = str(records.count)
        digests = integrity.view(s)
        if digests is not None:  # none for a stream from data written before digests were kept
            headers["Stream-Integrity"] = digests.header()
        keyed_headers(s, v.tail, headers)  # water marks (``keyed``)
        return Response(200, headers)

    # ---------------------------------------------------------------- read

    async def read(self, request: Request, bucket: str, path: str) -> Response:
        q = request.query
        live = request.target.live  # an unknown mode was refused (400) when the target was parsed
        offset_raw = q.get("offset")
        record_raw = q.get("record")
        if record_raw is not None and offset_raw is not None:
            raise bad_request("give offset or record, not both")
        if self.snapshots is not None and wants_snapshot_read(q, offset_raw):  # snapshots, bootstrap
            return await self.snapshots.read(request, bucket, path)
        if live is not None and offset_raw is None and record_raw is None:
            raise bad_request("live reads need an offset")
        service = self.service
        s = service.lookup(bucket, path)
        service.touch(s)
        v = service.view(s)
        key_raw = q.get("key")
        if key_raw is not None:  # the newest message of a key (``keyed``)
            if offset_raw is not None or record_raw is not None or live is not None:
                raise bad_request("a key read takes no offset, record or live mode")
            return await key_response(service, s, v.tail, key_raw)
        if record_raw is not None:  # from the N-th message (``tiered.engine.streams.ordinals``)
            offset = service.record_offset(s, parse_uint(record_raw, "query parameter record"), v.tail)
        elif offset_raw is None or offset_raw == "-1":
            offset = s.retained_from  # the earliest retained byte
        elif offset_raw == "now":
            offset = v.tail
        else:
            parsed = parse_offset(offset_raw)
            if parsed is None:
                raise bad_request(f"malformed offset {offset_raw!r}")
            if parsed > v.tail:
                raise TieredError(ErrorCode.OFFSET_BEYOND_TAIL, "offset is beyond the end of the stream")
            if parsed < s.retained_from:
                raise service.offset_gone(s, parsed)  # retention, or an earlier stream's offset
            offset = parsed
        if live is None and offset_raw != "now":
            located = self._locator(request, s, v.tail, offset)
            if located is not None:
                return located
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
            return self._with_record(Response(200, headers, b"[]" if s.json else b""), s, v.tail, v.tail)
        return await self._chunk_response(request, s, offset, cursor=None)

    def _with_record(self, response: Response, s: Stream, offset: int, tail: int) -> Response:
        """``Stream-Record``: the ordinal of the message a read's first byte belongs to (the next one at the tail)."""
        ordinal = self.service.record_at(s, offset, tail)
        if ordinal is not None:
            response.headers["Stream-Record"] = str(ordinal)
        return response

    async def _read_chunk(
        self, s: Stream, offset: int, *, whole_chars: bool = False
    ) -> tuple[bytes, int, bool, bool]:
        """(stored bytes, next offset, up to date, closed-at-end) from ``offset``.

        ``whole_chars`` (SSE text): never end a partial chunk inside a UTF-8 character.
        """
        service = self.service
        v = service.view(s)

        async def read(start: int, end: int) -> bytes:
            return await service.read(s, start, end)

        if s.holes and s.holes[-1][1] > offset:  # a compacted range: its removed messages skipped
            data, end, up_to_date = await read_live_chunk(
                read, s.holes, offset, v.tail, self.read_chunk_bytes
            )
        else:
            data, end, up_to_date = await read_chunk(
                read, offset, v.tail, self.read_chunk_bytes, json=s.json, whole_chars=whole_chars
            )
        return data, end, up_to_date, up_to_date and v.closed

    async def _chunk_response(self, request: Request, s: Stream, offset: int, cursor: str | None) -> Response:
        data, end, up_to_date, closed = await self._read_chunk(s, offset)
        response = chunk_response(
            request.headers.get("If-None-Match"),
            s.uid,
            s.content_type,
            s.json,
            offset,
            end,
            data,
            up_to_date=up_to_date,
            closed=closed,
            cursor=cursor,
        )
        return self._with_record(response, s, offset, max(end, offset))

    def _locator(self, request: Request, s: Stream, tail: int, offset: int) -> Response | None:
        """A peer node's catch-up read (``Tiered-Locator: 1``) that is all cold: its locator instead of bytes.

        Reached only after this request passed the same authorization, lookup
        and offset checks as the read itself, so a refusal is the read's own.
        """
        if self.locator_valid_ms <= 0 or request.headers.get(LOCATOR_HEADER) != "1" or s.holes:
            return None
        service = self.service
        now_ms = self.clock.now_ms()
        valid_ms = self.locator_valid_ms
        # The peer caches the locator for this credential: never past the credential's own expiry.
        expires_ms = getattr(getattr(request.auth, "principal", None), "expires_ms", None)
        if isinstance(expires_ms, int):
            valid_ms = min(valid_ms, expires_ms - now_ms)
        locator = build_locator(
            service.state,
            s,
            tail=tail,
            offset=offset,
            chunk_bytes=self.read_chunk_bytes,
            span_bytes=self.locator_span_bytes,
            valid_ms=valid_ms,
            now_ms=now_ms,
            index_of=service.record_indexes(),
        )
        if locator is None:
            return None
        headers = {"Content-Type": LOCATOR_MEDIA_TYPE, LOCATOR_HEADER: "1", "Cache-Control": "no-store"}
        return Response(200, headers, encode_locator(locator))

    def _cursor(self, client_cursor: str | None) -> str:
        return next_cursor(self.clock.now_ms() / 1000, client_cursor)

    async def _long_poll(self, request: Request, s: Stream, offset: int) -> Response:
        service, clock = self.service, self.clock
        lease = request.auth.lease if request.auth is not None else None
        cursor = self._cursor(request.query.get("cursor"))
        deadline = clock.monotonic() + self.long_poll_timeout_s
        while True:
            v = service.view(s)
            if offset < v.tail:
                return await self._chunk_response(request, s, offset, cursor)
            if v.closed:
                closed = Response(
                    204,
                    {
                        "Stream-Next-Offset": format_offset(v.tail),
                        "Stream-Up-To-Date": "true",
                        "Stream-Closed": "true",
                    },
                )
                return self._with_record(closed, s, v.tail, v.tail)
            remaining = deadline - clock.monotonic()
            # A credential that ended answers like a timeout: the next request gets its 401.
            if remaining <= 0 or service.closing or (lease is not None and lease.end_reason() is not None):
                timed_out = Response(
                    204,
                    {
                        "Stream-Next-Offset": format_offset(v.tail),
                        "Stream-Up-To-Date": "true",
                        "Stream-Cursor": cursor,
                    },
                )
                return self._with_record(timed_out, s, v.tail, v.tail)
            await _wait(service, s, offset, remaining, lease)
            if not service.still_live(s):
                raise TieredError(ErrorCode.STREAM_NOT_FOUND, "stream was deleted")

    async def _sse(self, request: Request, s: Stream, offset: int) -> Response:
        binary = not is_text_like(s.content_type)
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "Connection": "keep-alive",
        }
        if binary:
            headers["Stream-Sse-Data-Encoding"] = "base64"
        first = None
        if offset < self.service.view(s).tail:
            # Read before the 200 goes out: damage or an outage here is an ordinary error answer.
            first = await self._read_chunk(s, offset, whole_chars=not binary)
        lease = request.auth.lease if request.auth is not None else None
        response = Response(
            200, headers, self._sse_events(s, offset, binary, first, request.query.get("cursor"), lease)
        )
        return self._with_record(response, s, offset, self.service.view(s).tail)

    async def _sse_events(
        self,
        s: Stream,
        offset: int,
        binary: bool,
        first: tuple[bytes, int, bool, bool] | None,
        client_cursor: str | None,
        lease: LiveLease | None = None,
    ) -> AsyncIterator[bytes]:
        """The event stream; an error after the 200 ends it abruptly (the adapter cuts the connection).

        A read whose credential expires or is revoked ends with a control event saying so.
        """
        service, clock = self.service, self.clock
        deadline = clock.monotonic() + self.sse_max_connection_s
        sent_control = False
        while True:
            if service.closing or not service.still_live(s):
                return
            reason = lease.end_reason() if lease is not None else None
            if reason is not None:
                yield credential_event(offset, reason)
                return
            v = service.view(s)
            if offset < v.tail:
                if first is not None:
                    data, offset, up_to_date, closed = first
                    first = None
                else:
                    data, offset, up_to_date, closed = await self._read_chunk(
                        s, offset, whole_chars=not binary
                    )
                # One write per data+control pair: a reader never sees data
                # without the control event that positions it.
                yield data_event(data, s.json, binary) + control_event(
                    offset, self._cursor(client_cursor), up_to_date, closed
                )
                sent_control = True
                if closed:
                    return
                continue
            if v.closed:
                yield control_event(v.tail, None, True, True)
                return
            if not sent_control:
                yield control_event(offset, self._cursor(client_cursor), True, False)
                sent_control = True
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return
            changed = await _wait(service, s, offset, min(remaining, 15.0), lease)
            if not changed and clock.monotonic() < deadline and (lease is None or lease.end_reason() is None):
                yield b": keep-alive\n\n"


ReadBytes = Callable[[int, int], Awaitable[bytes]]


async def read_chunk(
    read: ReadBytes, offset: int, tail: int, chunk_bytes: int, *, json: bool, whole_chars: bool = False
) -> tuple[bytes, int, bool]:
    """(bytes, next offset, up to date) of the answer to a read at ``offset``; ``read(start, end)`` gives bytes.

    Shared by the owner's read and a peer's read from cold locators
    (``tiered/cluster/gateway/catchup.py``), so both answer with the same bytes.
    ``whole_chars`` (SSE text): never end a partial chunk inside a UTF-8 character.
    """
    end = min(tail, offset + chunk_bytes)
    data = await read(offset, end) if end > offset else b""
    if whole_chars and end < tail and data:
        cut = utf8_boundary(data)
        if cut > 0 and data[cut - 1 : cut] == b"\r":
            cut -= 1  # keep CR LF together: split, a client would see two line breaks
        if cut > 0:
            data, end = data[:cut], offset + cut
        else:  # the chunk is smaller than one character: send the whole character
            end = min(tail, offset + 4)
            data = await read(offset, end)
            data = data[: utf8_boundary(data) or len(data)]
            end = offset + len(data)
    if json and end < tail and data:
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # one message larger than a chunk: send it whole
            rest = await read(end, tail)
            cut = len(data) + rest.find(b"\n") + 1
            data = data + rest[: cut - len(data)]
        data = data[:cut]
        end = offset + cut
    return data, end, end >= tail


def chunk_response(
    if_none_match: str | None,
    uid: int,
    content_type: str,
    json: bool,
    offset: int,
    end: int,
    data: bytes,
    *,
    up_to_date: bool,
    closed: bool,
    cursor: str | None,
) -> Response:
    """The answer to a catch-up (or long-poll) read of ``[offset, end)``: the owner's and a peer's alike."""
    etag = f'"{uid}:{format_offset(offset)}:{format_offset(end)}{":c" if closed else ""}"'
    headers = {
        "Content-Type": content_type,
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
    if if_none_match == etag:
        return Response(304, headers)
    return Response(200, headers, json_messages_to_array(data) if json else data)


async def _wait(
    service: StreamService, s: Stream, offset: int, timeout: float, lease: LiveLease | None
) -> bool:
    """Wait for the stream to move, no longer than the credential holds; revoking it wakes us."""
    if lease is None:
        return await service.wait_for_change(s, offset, timeout)
    left = lease.seconds_left()
    if left is not None:
        timeout = min(timeout, left)
    lease.watch(s.uid)
    try:
        return await service.wait_for_change(s, offset, timeout)
    finally:
        lease.unwatch(s.uid)


def check_stream_headers(headers: Mapping[str, str]) -> None:
    """What every stream route checks before it serves: stored and echoed headers within their length
    limits (first: an oversized value costs one comparison), then clean UTF-8 text (400 otherwise).

    The route table's stream handlers and the append route's fused path (``tiered.api.append_path``) both
    run it.
    """
    # Each looked up once, for both checks (in a loop: a comprehension is a call of its own).
    values: dict[str, str | None] = {}
    for name in _TEXT_HEADERS:
        values[name] = headers.get(name)
    if not any(values.values()):
        return  # none sent (an empty value is clean and within every limit)
    check_value_lengths(values)
    for name in _TEXT_HEADERS:
        value = values[name]
        if value is not None and not _clean_header(value):
            raise bad_request(f"{name} must be printable UTF-8 text")


def _expiry(h: Mapping[str, str]) -> tuple[int | None, str | None, int | None]:
    ttl_raw, exp_raw = h.get("Stream-TTL"), h.get("Stream-Expires-At")
    if ttl_raw is not None and exp_raw is not None:
        raise bad_request("use Stream-TTL or Stream-Expires-At, not both")
    ttl_s = parse_uint(ttl_raw, "Stream-TTL") if ttl_raw is not None else None
    if exp_raw is not None:
        return None, exp_raw, parse_expires_at(exp_raw)
    return ttl_s, None, None


def _expiry_headers(s: Stream, headers: dict[str, str]) -> None:
    if s.ttl_s is not None:
        headers["Stream-TTL"] = str(s.ttl_s)
    if s.expires_at is not None:
        headers["Stream-Expires-At"] = s.expires_at


def _check_body_type(content_type: str | None) -> None:
    if content_type is None:
        raise bad_request("an append with a body needs a Content-Type")
    if not valid_media_type(content_type):
        raise bad_request(f"invalid Content-Type {content_type!r}")


def _producer(h: Mapping[str, str]) -> tuple[str | None, int, int]:
    pid, epoch_raw, seq_raw = h.get("Producer-Id"), h.get("Producer-Epoch"), h.get("Producer-Seq")
    if pid is None and epoch_raw is None and seq_raw is None:
        return None, 0, 0
    if pid is None or epoch_raw is None or seq_raw is None:
        raise bad_request("Producer-Id, Producer-Epoch and Producer-Seq must be sent together")
    if not pid:
        raise bad_request("Producer-Id must not be empty")
    return pid, parse_uint(epoch_raw, "Producer-Epoch"), parse_uint(seq_raw, "Producer-Seq")
