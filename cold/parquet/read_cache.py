"""Bounded LRU cache of byte strings for cold-object reads.

Cold reads fetch two kinds of blobs: Parquet footers (a few KiB, needed by every
read of an object) and row groups (~1 MiB, reused by sequential readers of a
stream). Their sizes differ by three orders of magnitude, so the cache is bounded
by total bytes rather than by entry count.

Not thread-safe: it is meant to be owned by one asyncio event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class ByteLRU:
    """Least-recently-used map from hashable keys to ``bytes``, bounded by total size."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[Hashable, bytes] = OrderedDict()

    def get(self, key: Hashable) -> bytes | None:
        """Return the cached value (marking it most recently used) or None."""
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: Hashable, value: bytes) -> None:
        """Insert or replace ``key``, evicting least recently used entries to fit.

        A value larger than the whole cache is not stored: caching it would only
        flush every other entry for a blob that cannot stay resident anyway.
        """
        self.discard(key)
        size = len(value)
        if size > self.max_bytes:
            return
        while self.nbytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= len(evicted)
            self.evictions += 1
        self._entries[key] = value
        self.nbytes += size

    def discard(self, key: Hashable) -> None:
        """Drop ``key`` if present (e.g. after the object it names was deleted)."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= len(old)

    def clear(self) -> None:
        """Drop every entry; statistics are kept."""
        self._entries.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Membership test that does not touch recency or hit/miss counters."""
        return key in self._entries
