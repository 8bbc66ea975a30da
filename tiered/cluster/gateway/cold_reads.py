"""Catch-up reads of other nodes' streams, answered here from the object store (the shell).

For a plain catch-up read (``catchup.catchup_offset``)
of a stream whose shard another node owns, ``CatchupReads.serve``:

1. looks for a valid cached locator for (stream, caller) that covers the
   owner's answer (``LocatorCache``);
2. without one, sends the read to the owner through the usual forwarding
   path, marked ``Tiered-Locator: 1`` and carrying the client's credentials:
   the owner authorizes and checks it exactly as the read itself, and answers
   either with a locator (the read is all cold) or with its ordinary answer
   (a refusal, or bytes that reach the hot tier), which goes to the client
   unchanged;
3. with a locator, fetches the row groups itself (every fetched byte checked
   against the CRC32C digests of the object's index, and page checksums:
   damage is a 502 ``DATA_DAMAGED``, never a 200) and answers with the bytes
   and headers the owner would (``tiered.api.routes.streams.read_chunk`` and
   ``chunk_response``, shared with the owner's read), plus
   ``Tiered-Served-By: <this node>``.

Anything it cannot answer exactly as the owner would (a JSON message that
runs past the locator, an object that is gone) returns None: the caller
forwards the read as before. While a locator is valid the owner is not asked
at all, so reads keep working while it is paused or being replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping

from tiered.api.kit.target import Family
from tiered.api.kit.types import Request, Response
from tiered.api.routes.streams import chunk_response, read_chunk
from tiered.cluster.gateway.catchup import CacheKey, LocatorCache, catchup_offset, credential_key, start_of
from tiered.cluster.membership.secret import SIGNATURE_HEADER
from tiered.cold.objects.store import ObjectNotFound, ObjectStore
from tiered.cold.parquet.reader import ColdReader
from tiered.core.clock import Clock
from tiered.engine.streams.cold_read import read_cold
from tiered.engine.streams.locators import (
    LOCATOR_HEADER,
    LOCATOR_MEDIA_TYPE,
    ColdPiece,
    Locator,
    decode_locator,
    record_of,
    servable_end,
)
from tiered.engine.streams.model import ColdSlice

__all__ = ["SERVED_BY", "CatchupReads", "shard_object_key"]

log = logging.getLogger(__name__)

#: On an answer this node gave from the object store for a stream another node owns.
SERVED_BY = "Tiered-Served-By"
#: Requests with any of these are never served from locators (forwarded, fanned out, a redirect asked for,
#: a node's signed call: its locator would be cached under "no credential", for anonymous readers to reuse).
_NOT_CATCHUP = ("Tiered-Forwarded-By", "Tiered-Shard", "Tiered-Redirect", SIGNATURE_HEADER)

Send = Callable[[Request], Awaitable[Response]]


def shard_object_key(shard: int, key: str) -> str:
    """A shard's cold object key (relative to its engine's prefix) as seen from the cluster's prefix."""
    return f"shards/{shard:04d}/{key}"


class _NotCold(Exception):
    """The answer needs bytes outside the locator: forward the read instead."""


class _Headers(Mapping[str, str]):
    """The request's headers (case-insensitive) with one more."""

    def __init__(self, base: Mapping[str, str], name: str, value: str) -> None:
        self._base = base
        self._name = name
        self._value = value

    def __getitem__(self, key: str) -> str:
        if key.lower() == self._name.lower():
            return self._value
        return self._base[key]

    def __iter__(self) -> Iterator[str]:
        lowered = self._name.lower()
        yield from (k for k in self._base if k.lower() != lowered)
        yield self._name

    def __len__(self) -> int:
        return sum(1 for _ in self)


class CatchupReads:
    def __init__(
        self,
        store: ObjectStore,
        clock: Clock,
        node_id: str,
        *,
        max_valid_s: float,
        cache_bytes: int,
        read_timeout_s: float,
        cache_entries: int = 4096,
        authenticate: Callable[[str | None], object] | None = None,
        on_served: Callable[[str, int, bool], None] | None = None,
    ) -> None:
        self.clock = clock
        self.node_id = node_id
        self.max_valid_s = max_valid_s
        self.read_timeout_s = read_timeout_s
        self.cache = LocatorCache(cache_entries)
        self.reader = ColdReader(store, cache_bytes)
        # What /readyz shows: reads answered from the store, locators fetched, and reads forwarded anyway.
        self.counters = {"served": 0, "locators": 0, "owner_answered": 0, "integrity_errors": 0}
        # Checks the caller's credential here before a cached locator serves it (raises 401 for a token
        # revoked since the locator was issued: every shard holds every token, ``tokens.py``).
        self.authenticate = authenticate
        # Counts each read answered here in its bucket's usage: (bucket, bytes, whether the owner already
        # counted the request: it did when it gave the locator for this very read, but sent no bytes).
        self.on_served = on_served

    def stats(self) -> dict[str, int]:
        return {**self.counters, "cached": len(self.cache), "expired": self.cache.expired}

    async def serve(self, request: Request, shard: int, send: Send) -> Response | None:
        """The answer to ``request`` (a read of a stream in ``shard``, owned elsewhere), or None: forward it."""
        if self.max_valid_s <= 0:
            return None
        headers = request.headers
        marked = any(headers.get(h) is not None for h in _NOT_CATCHUP)
        offset = catchup_offset(request.method, request.query, marked=marked)
        if offset is None:
            return None
        target = request.target  # parsed once, as the owner's access check and route read it
        bucket, path = target.bucket, target.stream
        if target.family is not Family.STREAM or bucket is None or path is None:
            return None  # not a stream read: the owner answers
        key: CacheKey = (bucket, path, credential_key(headers.get("Authorization")))
        locator = self.cache.get(key, offset, self.clock.monotonic())
        owner_counted = locator is None  # the owner counts the read that fetches a locator
        if locator is not None and self.authenticate is not None:
            self.authenticate(headers.get("Authorization"))
        if locator is None:
            sent_at = self.clock.monotonic()
            answer = await send(self._locator_request(request))
            if not _is_locator(answer):
                self.counters["owner_answered"] += 1
                return answer  # the owner's own answer to this read
            try:
                if not isinstance(answer.body, bytes):
                    raise ValueError("streamed")
                locator = decode_locator(answer.body)
            except ValueError as exc:
                log.warning("a locator for %s/%s from the owner of shard %d: %s", bucket, path, shard, exc)
                return None
            self.counters["locators"] += 1
            self.cache.put(key, locator, sent_at, self.max_valid_s)
        try:
            response = await self._answer(request, shard, locator, start_of(locator, offset))
        except ObjectNotFound:
            # Gone before the locator expired (an operator's GC without grace?): the owner knows better.
            self.cache.drop(key)
            return None
        if response is not None:
            self.counters["served"] += 1
            if self.on_served is not None:
                size = len(response.body) if isinstance(response.body, bytes) else 0
                self.on_served(bucket, size, owner_counted)
        return response

    def _locator_request(self, request: Request) -> Request:
        async def no_body() -> bytes:
            return b""

        return Request(
            request.method,
            request.path,
            request.query_string,
            _Headers(request.headers, LOCATOR_HEADER, "1"),
            no_body,
            scheme=request.scheme,
            host=request.host,
        )

    async def _answer(self, request: Request, shard: int, loc: Locator, offset: int) -> Response | None:
        if servable_end(loc, offset) is None:
            return None

        async def read(start: int, end: int) -> bytes:
            if start < loc.start or end > loc.cold_end:
                raise _NotCold
            return await self._read(shard, loc, start, end)

        try:
            data, end, up_to_date = await read_chunk(read, offset, loc.tail, loc.chunk_bytes, json=loc.json)
        except _NotCold:
            return None
        if up_to_date:
            return None  # only the owner knows whether the stream is closed now
        response = chunk_response(
            request.headers.get("If-None-Match"),
            loc.uid,
            loc.content_type,
            loc.json,
            offset,
            end,
            data,
            up_to_date=False,
            closed=False,
            cursor=None,
        )
        ordinal = record_of(
            loc, offset
        )  # as the owner's ``_with_record``: the message holding the first byte
        if ordinal is not None:
            response.headers["Stream-Record"] = str(ordinal)
        response.headers[SERVED_BY] = self.node_id
        return response

    async def _read(self, shard: int, loc: Locator, start: int, end: int) -> bytes:
        pieces = [p for p in loc.pieces if p.start < end and p.end > start]
        parts = await asyncio.gather(
            *(self._read_piece(shard, p, max(start, p.start), min(end, p.end)) for p in pieces)
        )
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _read_piece(self, shard: int, piece: ColdPiece, start: int, end: int) -> bytes:
        def counted() -> None:
            self.counters["integrity_errors"] += 1

        # The owner's handling and words (the key relative to the shard); a missing object goes back
        # to ``serve``, which forwards the read.
        return await read_cold(
            lambda: self.reader.read(
                shard_object_key(shard, piece.key), piece.index, piece.bucket, piece.path, start, end
            ),
            ColdSlice(piece.key, piece.bucket, piece.path, start, end),
            timeout_s=self.read_timeout_s,
            on_damaged=counted,
            missing_is_damage=False,
            whose=" for a peer's stream",
        )


def _is_locator(answer: Response) -> bool:
    if answer.status != 200:
        return False
    found = {k.lower(): v for k, v in answer.headers.items()}
    return found.get(LOCATOR_HEADER.lower()) == "1" and found.get("content-type") == LOCATOR_MEDIA_TYPE
