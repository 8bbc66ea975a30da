"""``GET {stream}?key=K`` of a stream keyed by header: the newest append of a key, from the key index plus
what it does not cover yet (``header_keys``), never a superseded or deleted one.

The newest append of ``K`` is the newest of its pending appends (journal
state: every keyed append the index does not cover), else the index's entry
(one or two ranged GETs of the index object, ``key_index_file``). The answer is
checked again after every ``await``: should the compactor have committed a new
index, a newer append have arrived or the chosen append have become a hole
meanwhile, the read starts over (a few times at most, then 503: retry).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tiered.cold.parquet.chunk_index import ColdDataDamaged
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.streams import header_keys, key_index_file
from tiered.engine.streams.cold_read import read_cold
from tiered.engine.streams.model import ColdSlice, KeyedAppend, Stream
from tiered.engine.streams.reader import StreamReader

ATTEMPTS = 4
ReadBytes = Callable[[int, int], Awaitable[bytes]]


def _count_damage(reader: StreamReader) -> None:
    reader.integrity_errors["cold"] += 1


async def _from_index(
    reader: StreamReader, cache: key_index_file.FooterCache, s: Stream, key: str
) -> KeyedAppend | None:
    index = s.key_index
    assert index is not None
    cold = reader.cold
    if cold is None:
        raise TieredError(ErrorCode.COLD_NOT_READY, "the object store is not open yet; retry shortly")

    async def fetch(start: int, end: int) -> bytes:
        sl = ColdSlice(index.key, s.bucket, s.path, start, end)
        return await read_cold(
            lambda: cold.store.get(index.key, start=start, end=end),
            sl,
            timeout_s=reader.cold_read_timeout_s,
            on_damaged=lambda: _count_damage(reader),
            health=reader.store_health,
        )

    try:
        return await key_index_file.lookup(index, fetch, key, cache)
    except ColdDataDamaged as exc:  # a block or footer failed its checksum
        _count_damage(reader)
        raise TieredError(
            ErrorCode.DATA_DAMAGED, f"the key index of this stream is damaged ({exc}); it will not be served"
        ) from None


async def newest_by_header(
    read: ReadBytes, reader: StreamReader, cache: key_index_file.FooterCache, s: Stream, key: str
) -> tuple[KeyedAppend, bytes]:
    """(the newest append of ``key``, its bytes); KEY_NOT_FOUND when it has none, or was deleted (the
    tombstone's offset in the error's ``key_offset``)."""
    header_keys.check_key(key, "key")
    for _ in range(ATTEMPTS):
        index = s.key_index
        entry = header_keys.newest_pending(s, key)
        if entry is None and index is not None:
            entry = await _from_index(reader, cache, s, key)
            if s.key_index is not index or header_keys.newest_pending(s, key) is not None:
                continue  # the compactor committed, or the key was appended, while the index was read
        if entry is None or not header_keys.readable(s, entry):
            raise header_keys.not_found(None)
        if entry.tombstone:
            raise header_keys.not_found(entry)
        data = await read(entry.start, entry.end)
        if header_keys.readable(s, entry) and header_keys.newest_pending(s, key) in (None, entry):
            return entry, data
    raise TieredError(ErrorCode.UNAVAILABLE, "the key changed during every attempt to read it; retry shortly")
