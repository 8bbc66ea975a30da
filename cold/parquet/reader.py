"""Reading stream bytes out of cold objects, through a bounded cache.

A read is planned from the metadata alone (the object's ``ChunkIndex``): the
footer and only the row groups that overlap the range are fetched with ranged
GETs, never a LIST or a whole-object download.
"""

from __future__ import annotations

from tiered.cold.objects.store import ObjectStore
from tiered.cold.parquet.chunk import read_stream_bytes, read_stream_range
from tiered.cold.parquet.chunk_index import ChunkIndex, ColdDataDamaged
from tiered.cold.parquet.read_cache import ByteLRU


class ColdReader:
    def __init__(self, store: ObjectStore, cache_bytes: int) -> None:
        self.store = store
        self.cache = ByteLRU(cache_bytes)

    async def read(
        self, key: str, index: ChunkIndex, bucket: str, stream: str, start: int, end: int
    ) -> bytes:
        """Bytes ``[start, end)`` of one stream from one object (exactly, or raise)."""

        async def fetch(lo: int, hi: int) -> bytes:
            return await self.store.get(key, start=lo, end=hi)

        data = await read_stream_bytes(
            fetch, index, bucket, stream, start, end, cache=self.cache, object_key=key
        )
        if len(data) != end - start:
            raise ColdDataDamaged(key, f"returned {len(data)} bytes for {bucket}/{stream} [{start}, {end})")
        return data

    async def record_starts(
        self, key: str, index: ChunkIndex, bucket: str, stream: str, lo: int, hi: int
    ) -> list[int]:
        """Offsets in ``[lo, hi)`` where one of the stream's records starts (retention lands on them)."""

        async def fetch(a: int, b: int) -> bytes:
            return await self.store.get(key, start=a, end=b)

        pieces = await read_stream_range(
            fetch, index, bucket, stream, lo, hi, cache=self.cache, object_key=key
        )
        # The first piece may be a record trimmed at ``lo``; ``lo`` is a boundary the caller knows anyway.
        return [offset for offset, _ in pieces]
