"""Catch-up reads any node serves from the object store (pure): which reads, which locator, until when.

A node that does not own a stream's shard answers a catch-up read of that
stream below its cold frontier itself, from the cold objects (the shell is
``cold_reads.py``; the locator and why it is safe, ``tiered/streams/
locators.py``). What is decided here:

* ``catchup_offset``: is this request a plain catch-up read at an explicit
  offset (not live, not ``-1``/``now``, not forwarded, not a redirect
  request)? Only those are candidates; everything else is forwarded as before.
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

from tiered.ids import parse_offset
from tiered.streams.locators import Locator, servable_end

__all__ = ["LocatorCache", "catchup_offset", "credential_key", "MAX_LOCATORS_PER_KEY"]

#: Locators kept per (stream, caller): a reader moves forward, so a few recent ranges are enough.
MAX_LOCATORS_PER_KEY = 4

_KEY = os.urandom(32)  # per process: cache keys are useless outside it


def catchup_offset(method: str, query: Mapping[str, str], headers: Mapping[str, str]) -> int | None:
    """The offset of a catch-up read this node may try to serve from locators; None: forward as usual.

    ``headers`` are the names that take a request out: one already forwarded
    (``Tiered-Forwarded-By``), a bucket fan-out (``Tiered-Shard``), a client
    asking for a redirect (``Tiered-Redirect``). The caller passes what the
    request carries; their values do not matter.
    """
    if method != "GET" or "live" in query or headers:
        return None
    raw = query.get("offset")
    if raw is None:
        return None
    return parse_offset(raw)  # None for -1, now and anything malformed: the owner answers those


def credential_key(authorization: str | None) -> bytes:
    """Who is reading, as a cache key: a keyed digest of the ``Authorization`` header (b"" for none)."""
    if authorization is None:
        return b""
    return hmac.new(_KEY, authorization.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()


CacheKey = tuple[str, str, bytes]  # bucket, stream path, credential key


class LocatorCache:
    """Locators by (bucket, path, caller): at most ``capacity`` keys, LRU, each locator until it expires."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._entries: OrderedDict[CacheKey, list[tuple[Locator, float]]] = OrderedDict()
        self.expired = 0  # locators dropped because their validity ended

    def get(self, key: CacheKey, offset: int, now: float) -> Locator | None:
        """A valid locator that serves a read at ``offset`` (``servable_end``), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        live = [(loc, until) for loc, until in found if now < until]
        self.expired += len(found) - len(live)
        if not live:
            del self._entries[key]
            return None
        self._entries[key] = live
        self._entries.move_to_end(key)
        for loc, _ in live:
            if servable_end(loc, offset) is not None:
                return loc
        return None

    def put(self, key: CacheKey, locator: Locator, sent_at: float, max_valid_s: float) -> float:
        """Keep ``locator``, asked for at ``sent_at``; valid until the earlier of the owner's and our bound."""
        until = sent_at + min(locator.valid_ms / 1000, max_valid_s)
        found = self._entries.pop(key, [])
        found = [e for e in found if e[0].start != locator.start][-(MAX_LOCATORS_PER_KEY - 1) :]
        found.append((locator, until))
        self._entries[key] = found
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return until

    def drop(self, key: CacheKey) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
