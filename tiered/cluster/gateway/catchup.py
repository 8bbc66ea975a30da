"""Catch-up reads any node serves from the object store (pure): which reads, which locator, until when.

A node that does not own a stream's shard answers a catch-up read of that
stream below its cold frontier itself, from the cold objects (the shell is
``cold_reads.py``; the locator and why it is safe, ``tiered/engine/streams/
locators.py``). What is decided here:

* ``catchup_offset``: is this request a plain catch-up read (not live, not
  ``now``, not forwarded, not a redirect request)? Only those are
  candidates; everything else is forwarded as before. A read from the
  retained start (``-1``) starts where the locator says it did when issued.
* ``LocatorCache``: locators by (stream, caller), bounded (LRU) and
  expiring. A locator's validity counts from the moment its request was
  *sent*, on this node's monotonic clock: that is before the owner issued it,
  so it ends no later than the owner meant, and the owner's validity is below
  the GC grace that keeps its objects. The caller is part of the key: the
  owner authorized *this* credential to read the stream, and a cached locator
  must not serve anyone else. The key holds a keyed digest of the
  ``Authorization`` header, never the credential.

What a valid locator may serve that the owner would no longer: bytes of a
stream deleted, or trimmed by retention, after the locator was issued, for
at most its validity (``cluster_locator_ttl_s``, default 5 s) — as a cache
would, and the answers are marked cacheable for 60 s anyway. A credential
revoked meanwhile likewise reads on for at most that long.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import OrderedDict
from collections.abc import Mapping

from tiered.core.ids import parse_offset
from tiered.engine.streams.locators import Locator, servable_end

__all__ = [
    "MAX_LOCATORS_PER_KEY",
    "RETAINED_START",
    "LocatorCache",
    "catchup_offset",
    "credential_key",
    "start_of",
]

#: Locators kept per (stream, caller): a reader moves forward, so a few recent ranges are enough.
MAX_LOCATORS_PER_KEY = 4

_KEY = os.urandom(32)  # per process: cache keys are useless outside it


#: ``catchup_offset`` of a read from the retained start (``offset=-1`` or none): the locator says where.
RETAINED_START = -1


def catchup_offset(method: str, query: Mapping[str, str], *, marked: bool) -> int | None:
    """The offset of a catch-up read this node may try to serve from locators; None: forward as usual.

    ``RETAINED_START`` for a read from the earliest retained byte. ``marked``:
    the request carries a header that takes it out (already forwarded, a
    bucket fan-out's sub-request, a client asking for a redirect).
    """
    if marked or method != "GET" or "live" in query or "key" in query:  # a key read: the owner's index
        return None
    raw = query.get("offset")
    if raw is None or raw == "-1":
        return RETAINED_START
    return parse_offset(raw)  # None for now and anything malformed: the owner answers those


def start_of(locator: Locator, offset: int) -> int:
    """The stream position a read at ``offset`` (maybe ``RETAINED_START``) starts at, by this locator."""
    return locator.retained_from if offset == RETAINED_START else offset


def credential_key(authorization: str | None) -> bytes:
    """Who is reading, as a cache key: a keyed digest of the ``Authorization`` header (b"" for none)."""
    if authorization is None:
        return b""
    return hmac.new(_KEY, authorization.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()


CacheKey = tuple[str, str, bytes]  # bucket, stream path, credential key


class LocatorCache:
    """Locators by (bucket, path, caller), each until it expires; LRU over keys, bounded in keys and pieces.

    Pieces (one cold object's index each) are what takes memory, so they are
    bounded too: ``max_pieces`` over every kept locator.
    """

    def __init__(self, capacity: int, max_pieces: int = 65536) -> None:
        if capacity < 1 or max_pieces < 1:
            raise ValueError("capacity and max_pieces must be positive")
        self.capacity = capacity
        self.max_pieces = max_pieces
        self.pieces = 0
        self._entries: OrderedDict[CacheKey, list[tuple[Locator, float]]] = OrderedDict()
        self.expired = 0  # locators dropped because their validity ended

    def get(self, key: CacheKey, offset: int, now: float) -> Locator | None:
        """A valid locator that serves a read at ``offset`` (or ``RETAINED_START``), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        live = [(loc, until) for loc, until in found if now < until]
        if len(live) != len(found):
            self.expired += len(found) - len(live)
            self.pieces -= _pieces(found) - _pieces(live)
        if not live:
            del self._entries[key]
            return None
        self._entries[key] = live
        self._entries.move_to_end(key)
        for loc, _ in live:
            if servable_end(loc, start_of(loc, offset)) is not None:
                return loc
        return None

    def put(self, key: CacheKey, locator: Locator, sent_at: float, max_valid_s: float) -> float:
        """Keep ``locator``, asked for at ``sent_at``; valid until the earlier of the owner's and our bound."""
        until = sent_at + min(locator.valid_ms / 1000, max_valid_s)
        found = self._entries.pop(key, [])
        self.pieces -= _pieces(found)
        found = [e for e in found if e[0].start != locator.start][-(MAX_LOCATORS_PER_KEY - 1) :]
        found.append((locator, until))
        self._entries[key] = found
        self.pieces += _pieces(found)
        while len(self._entries) > self.capacity or (
            self.pieces > self.max_pieces and len(self._entries) > 1
        ):
            _, evicted = self._entries.popitem(last=False)
            self.pieces -= _pieces(evicted)
        return until

    def drop(self, key: CacheKey) -> None:
        self.pieces -= _pieces(self._entries.pop(key, []))

    def __len__(self) -> int:
        return len(self._entries)


def _pieces(entries: list[tuple[Locator, float]]) -> int:
    """What ``entries`` weigh against ``max_pieces``: their pieces, and 4 KiB of record ordinals as one more."""
    return sum(len(loc.pieces) + len(loc.record_offs) // 2048 for loc, _ in entries)
