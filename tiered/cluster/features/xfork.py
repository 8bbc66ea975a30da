"""Forks whose source lives in another shard (cluster mode): a pin there, a copy here.

A fork lives in the shard of its own ``(bucket, path)``; its source may be in
a shard another node owns. The fork's engine (``StreamService.fork_request``,
source not found locally) asks this object, which talks to the source's shard
through the same routing a client's request takes (served here or forwarded
to the owner):

1. **Pin.** ``PUT`` a *pin* in the source's shard: an ordinary fork of the
   source, created by the source's own engine with the client's fork headers
   (``Stream-Forked-From``, ``Stream-Fork-Offset``, ``Stream-Fork-Sub-Offset``,
   ``Content-Type``, ``Stream-TTL``/``Stream-Expires-At``). So every refusal is
   the single-node one (404 no source, 409 deleted source or content-type
   mismatch, 400 beyond the tail), the fork point and the inherited expiry are
   resolved exactly as on one node, and the source now has a live fork: while
   the pin lives, deleting the source soft-deletes it (410, its path blocked),
   as with a local fork. The pin's name, ``__forks/<fork's bucket>/<fork's
   path>/<n>``, is chosen (``n``) to hash to the source's shard; pins whose
   fork is gone are swept (``tiered/cluster/gc/pin_sweep.py``).
2. **Copy.** Read the pin from its retained offset to its tail (the fork
   point) and hand the bytes to the fork's engine, which stores them as the
   fork's own data *at the same offsets* (``ForkCopy``), in the same journal
   record that creates the fork: the fork is durable in its own shard once
   acknowledged (in object-store durability, in a WAL object), and reads no
   longer depend on the source's owner. JSON streams are read as arrays and
   re-encoded message by message, which gives back the stored bytes exactly
   (the length is checked against the offsets).
3. **Release.** When the fork (or the last stream reading through it) is
   deleted, or its creation fails after the pin, the pin is deleted: the
   source's engine drops its fork count and, if the source was soft-deleted,
   removes it (cascade), as on one node.

Sub-requests are this node's signed *system* calls (``subrequest.system_request``),
authorized as the operator on the pin's stream routes: the fork's engine
already checked, before it asked, that the caller may write the fork and read
the source (``tiered.api.kit.middleware.auth``, ``Stream-Forked-From``, prefix grants
included), which is all a fork needs on one node. So a caller with read on
the source but no write in its bucket forks across shards too; the pin (in
the source's bucket) is the node's, not the caller's. Not counted in the
source bucket's usage either (the client's fork is counted once, in its own).
Only a node without a signer yet sends the caller's own ``Authorization``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import quote

import msgspec

from tiered.api.kit.types import Request, Response
from tiered.cluster.gateway.subrequest import Sign, internal_request, system_request
from tiered.cluster.membership.secret import SIGNATURE_HEADER
from tiered.cluster.membership.shards import shard_of
from tiered.core.content import is_json
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET, MAX_STREAM_PATH, format_offset, parse_offset
from tiered.engine.streams.model import ForkCopy, ForkRequest
from tiered.engine.streams.protocol import parse_expires_at

__all__ = ["PIN_PREFIX", "CrossShardForks", "pin_name", "pinned_fork", "stream_url"]

log = logging.getLogger(__name__)

PIN_PREFIX = "__forks/"
#: Fork headers the pin is created with (everything else of the client's request stays here).
_PASSED = (
    "Stream-Forked-From",
    "Stream-Fork-Offset",
    "Stream-Fork-Sub-Offset",
    "Content-Type",
    "Stream-TTL",
    "Stream-Expires-At",
)
_MAX_READS = 100_000  # chunks of one copy at most (a bound, far above any real stream)

Send = Callable[[Request, int], Awaitable[Response]]

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def pin_name(
    fork_bucket: str, fork_path: str, source_bucket: str, source_shard: int, shard_count: int
) -> str:
    """The pin's path in ``source_bucket``: named after the fork, and hashing to the source's shard.

    ``__forks/<fork bucket>/<fork path>/<n>`` (the sweeper reads the fork's
    address back from it), or ``__forks/#<digest>/<n>`` when that would be too long.
    """
    stem = f"{PIN_PREFIX}{fork_bucket}/{fork_path}"
    if len(stem.encode()) > MAX_STREAM_PATH - 16:
        digest = hashlib.sha256(
            len(fork_bucket).to_bytes(4, "big") + fork_bucket.encode() + fork_path.encode()
        ).hexdigest()[:32]
        stem = f"{PIN_PREFIX}#{digest}"
    for n in range(64 * shard_count):
        name = f"{stem}/{n}"
        if shard_of(source_bucket, name, shard_count) == source_shard:
            return name
    raise TieredError(ErrorCode.INTERNAL_ERROR, "no pin name hashes to the source's shard")


def pinned_fork(pin: str) -> tuple[str, str] | None:
    """The fork ``(bucket, path)`` a pin's name gives back; None for a digest name or another stream."""
    if not pin.startswith(PIN_PREFIX) or pin.startswith(PIN_PREFIX + "#"):
        return None
    stem, _, n = pin[len(PIN_PREFIX) :].rpartition("/")
    bucket, _, path = stem.partition("/")
    return (bucket, path) if bucket and path and n.isdigit() else None


def stream_url(bucket: str, path: str) -> str:
    """The percent-encoded URL path of a stream."""
    quoted = quote(path, safe="/")
    return f"/v1/stream/{quoted}" if bucket == DEFAULT_BUCKET else f"/v1/buckets/{bucket}/stream/{quoted}"


def _source_of(spec: str) -> tuple[str, str]:
    """The source ``(bucket, path)`` a fork spec (``bucket/path@offset+sub``) names."""
    address = spec.rsplit("@", 1)[0]
    bucket, _, path = address.partition("/")
    return bucket, path


def _refusal(response: Response) -> TieredError:
    """The source engine's refusal, as the same error here (same status, same code)."""
    code, message = ErrorCode.INTERNAL_ERROR, f"the fork source's shard answered {response.status}"
    if isinstance(response.body, bytes):
        try:
            err = msgspec.json.decode(response.body)["error"]
            code, message = ErrorCode(err["code"]), str(err.get("message", message))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            pass
    if response.status == 503 and code is ErrorCode.INTERNAL_ERROR:
        code = ErrorCode.SHARD_NOT_OWNED
    return (
        TieredError(code, message, retry_after_s=1) if response.status == 503 else TieredError(code, message)
    )


class CrossShardForks:
    """The ``RemoteForks`` of one shard's engine: ``send(request, shard)`` is shard routing's."""

    def __init__(
        self,
        shard: int,
        shard_count: Callable[[], int],
        send: Send,
        sign: Sign | None,
    ) -> None:
        self.shard = shard
        self.shard_count = shard_count
        self.send = send
        self.sign = sign

    async def _call(
        self,
        method: str,
        bucket: str,
        path: str,
        shard: int,
        client: Mapping[str, str] | None,
        extra: Mapping[str, str] | None = None,
        query: str = "",
    ) -> Response:
        url, extra = stream_url(bucket, path), extra or {}
        request = system_request(self.sign, method, url, extra, query=query)
        if request.headers.get(SIGNATURE_HEADER) is None and client is not None:
            auth = client.get("Authorization")  # no signer yet: the caller's own credential
            if auth is not None:
                request = internal_request(method, url, {**extra, "Authorization": auth}, query=query)
        return await self.send(request, shard)

    def _pin(self, fork: tuple[str, str], source: tuple[str, str]) -> tuple[str, int]:
        count = self.shard_count()
        shard = shard_of(source[0], source[1], count)
        return pin_name(fork[0], fork[1], source[0], shard, count), shard

    async def resolve(
        self, target: tuple[str, str], source: tuple[str, str], spec: str, headers: Mapping[str, str]
    ) -> ForkRequest:
        count = self.shard_count()
        if shard_of(source[0], source[1], count) == self.shard:
            raise TieredError(ErrorCode.FORK_SOURCE_NOT_FOUND, "fork source stream not found")
        pin, shard = self._pin(target, source)
        passed = {h: v for h in _PASSED if (v := headers.get(h)) is not None}
        created = await self._call("PUT", source[0], pin, shard, headers, passed)
        if created.status >= 300:
            raise _refusal(created)
        try:
            return await self._copy(target, source, spec, pin, shard, headers)
        except BaseException:
            await self.release(target[0], target[1], spec, headers)
            raise

    async def _copy(
        self,
        target: tuple[str, str],
        source: tuple[str, str],
        spec: str,
        pin: str,
        shard: int,
        headers: Mapping[str, str],
    ) -> ForkRequest:
        head = await self._call("HEAD", source[0], pin, shard, headers)
        if head.status != 200:
            raise _refusal(head)
        h = {k.lower(): v for k, v in head.headers.items()}  # a forwarded answer's names are as sent
        content_type = h.get("content-type", "application/octet-stream")
        tail = parse_offset(h.get("stream-next-offset", ""))
        start = parse_offset(h.get("stream-retained-offset", "")) or 0
        if tail is None:
            raise TieredError(ErrorCode.INTERNAL_ERROR, "the fork source's shard gave no tail")
        ttl_raw, expires_at = h.get("stream-ttl"), h.get("stream-expires-at")
        expires_at_ms = parse_expires_at(expires_at) if expires_at is not None else None
        base = await self._read(source[0], pin, shard, start, tail, is_json(content_type), headers)
        copy = ForkCopy(
            base=base,
            base_from=start,
            content_type=content_type,
            ttl_s=int(ttl_raw) if ttl_raw is not None else None,
            expires_at=expires_at,
            expires_at_ms=expires_at_ms,
        )
        return ForkRequest(source_uid=None, offset=tail, spec=spec, copy=copy)

    async def _read(
        self,
        bucket: str,
        pin: str,
        shard: int,
        start: int,
        tail: int,
        json: bool,
        headers: Mapping[str, str],
    ) -> bytes:
        """The pin's stored bytes ``[start, tail)``, chunk by chunk."""
        out = bytearray()
        offset = start
        for _ in range(_MAX_READS):
            if offset >= tail:
                break
            query = f"offset={format_offset(offset)}"
            got = await self._call("GET", bucket, pin, shard, headers, query=query)
            if got.status != 200 or not isinstance(got.body, bytes):
                raise _refusal(got)
            answer = {k.lower(): v for k, v in got.headers.items()}
            nxt = parse_offset(answer.get("stream-next-offset", ""))
            if nxt is None or nxt <= offset or nxt > tail:
                raise TieredError(ErrorCode.INTERNAL_ERROR, "the fork source's shard answered a bad read")
            chunk = got.body
            if json:
                chunk = b"".join(_encoder.encode(m) + b"\n" for m in _decoder.decode(chunk))
            if len(chunk) != nxt - offset:
                raise TieredError(
                    ErrorCode.INTERNAL_ERROR, "the fork source's bytes did not match its offsets"
                )
            out += chunk
            offset = nxt
        if offset != tail:
            raise TieredError(ErrorCode.INTERNAL_ERROR, "the fork source could not be read to the fork point")
        return bytes(out)

    async def release(
        self, bucket: str, path: str, spec: str, headers: Mapping[str, str] | None = None
    ) -> None:
        """Delete the pin the fork ``(bucket, path)`` holds; a failure is logged (the pin then stays)."""
        source = _source_of(spec)
        try:
            pin, shard = self._pin((bucket, path), source)
            gone = await self._call("DELETE", source[0], pin, shard, headers)
        except TieredError as exc:
            log.warning("fork %s/%s: its pin on %s/%s stays (%s)", bucket, path, *source, exc.message)
            return
        if gone.status not in (204, 404, 410):
            log.warning("fork %s/%s: deleting its pin answered %d", bucket, path, gone.status)
