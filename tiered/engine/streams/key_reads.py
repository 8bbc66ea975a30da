"""``GET {stream}?key=K``: the newest message of a key, from the key index the compactor keeps plus what it
does not cover yet, never a superseded or deleted one.

* Keyed by header (``header_keys``): the newest append of ``K`` is the newest of its
  pending appends (journal state: every keyed append the index does not cover), else
  the index's entry (one or two ranged GETs of the index object, ``key_index_file``).
* Keyed by a JSON pointer (``keyed``): the newest message of ``K`` in the live messages
  from the index's ``covers_to`` on (a scan of what was not compacted yet), else the
  index's entry; with no index yet, a scan from the low-water mark.

The answer is checked again after every ``await``: should the compactor have committed
a new index, a newer append have arrived or the chosen message have become a hole
meanwhile, the read starts over (a few times at most, then 503: retry).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tiered.cold.parquet.chunk_index import ColdDataDamaged
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.streams import header_keys, key_index_file, keyed
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


async def _scan_suffix(
    read: ReadBytes, s: Stream, tokens: tuple[str, ...], start: int, tail: int, key: str
) -> tuple[int, bytes, bool] | None:
    """(offset, message, is a tombstone) of the newest live message of ``key`` in ``[start, tail)``."""
    found: tuple[int, bytes, bool] | None = None
    offset = start
    while offset < tail:
        data, end, _ = await keyed.read_live_chunk(read, s.holes, offset, tail, keyed.KEY_SCAN_CHUNK)
        pos = 0
        for piece_start, piece_end in keyed.live_pieces(s.holes, offset, end):
            piece = data[pos : pos + (piece_end - piece_start)]
            pos += piece_end - piece_start
            for m0, _, message in keyed.split_messages(piece_start, piece):
                k, tombstone = keyed.message_key(tokens, message)
                if k == key:
                    found = (m0, message, tombstone)
        offset = end
    return found


async def newest_by_pointer(
    read: ReadBytes, reader: StreamReader, cache: key_index_file.FooterCache, s: Stream, tail: int, key: str
) -> tuple[int, bytes]:
    """(offset, message) of the newest live message of ``key`` (canonical: ``keyed.parse_key_query``) in
    a stream keyed by a JSON pointer; KEY_NOT_FOUND when it has none or was deleted."""
    assert s.compaction_key is not None
    tokens = keyed.parse_pointer(s.compaction_key)
    for _ in range(ATTEMPTS):
        index = s.key_index
        start = keyed.low_water_mark(s, tail)
        found = await _scan_suffix(
            read, s, tokens, start if index is None else max(index.covers_to, start), tail, key
        )
        if found is not None:
            offset, message, tombstone = found
            if tombstone:
                raise header_keys.not_found(KeyedAppend(offset, offset, key, True, 0))
            return offset, message
        if index is None:
            raise header_keys.not_found(None)  # the scan from the low-water mark found nothing
        entry = await _from_index(reader, cache, s, key)
        if s.key_index is not index:
            continue  # the compactor committed a new index meanwhile
        if entry is None or not header_keys.readable(s, entry):
            raise header_keys.not_found(None)
        if entry.tombstone:
            raise header_keys.not_found(entry)
        data = await read(entry.start, entry.end)
        if header_keys.readable(s, entry) and s.key_index is index:
            return entry.start, data
    raise TieredError(ErrorCode.UNAVAILABLE, "the key changed during every attempt to read it; retry shortly")
