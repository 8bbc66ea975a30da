"""The key index object of a header-keyed stream (``header_keys``): sorted blocks, a footer, checksums.

The compactor writes one immutable object per pass that changes the index
(``data/<ULID>.keys``); a keyed read fetches the footer (cached per object:
objects never change) and the one block that can hold the key, so a read
costs two ranged GETs at most, one once the footer is cached, whatever the
number of keys. Layout::

    block 0 .. block n-1     each: msgpack array of [key, start, end, tombstone, ts_ms], sorted by key
    footer                   msgpack [version, [[first_key, last_key, offset, length, crc32c], ...]]
    trailer (12 bytes)       footer crc32c, footer length, magic b"TKI1" (big-endian u32s)

Every block and the footer carry a CRC32C, checked on every read; the
journal's ``KeyIndexRef`` has the whole object's size and CRC32C (the
compactor's full reads and ``tiered verify`` check those). Damage is
``ColdDataDamaged``: an integrity error, never an answer.

Size: an entry is the key plus about 15 bytes, so 1M keys of 20 bytes are
about 35 MB in 1,000 blocks and a 100 KB footer. The compactor rewrites the
whole object when a pass changes it (a read of the old one and a write of the
new one, streaming in sorted order); see docs/compaction.md for why that is
the chosen cost and what would replace it at larger scales.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from itertools import islice

import google_crc32c
import msgspec

from tiered.cold.parquet.chunk_index import ColdDataDamaged
from tiered.engine.streams.model import KeyedAppend, KeyIndexRef

MAGIC = b"TKI1"
VERSION = 1
TRAILER = struct.Struct(">II4s")
#: Entries per block: about 40 KB for keys of 20 bytes, one ranged GET a lookup.
BLOCK_ENTRIES = 1024


class BlockRef(msgspec.Struct, array_like=True, frozen=True):
    first: str
    last: str
    offset: int
    length: int
    crc32c: int


class Footer(msgspec.Struct, array_like=True, frozen=True):
    version: int
    blocks: tuple[BlockRef, ...]


_enc = msgspec.msgpack.Encoder()
_block_dec = msgspec.msgpack.Decoder(list[KeyedAppend])
_footer_dec = msgspec.msgpack.Decoder(Footer)

Fetch = Callable[[int, int], Awaitable[bytes]]


def encode(entries: Iterable[KeyedAppend], block_entries: int = BLOCK_ENTRIES) -> tuple[bytes, int]:
    """(object bytes, footer length with the trailer) of ``entries`` (sorted by key, one per key), taken
    a block at a time (a compaction pass streams them out of its merge)."""
    parts: list[bytes] = []
    blocks: list[BlockRef] = []
    pos = 0
    it = iter(entries)
    while chunk := list(islice(it, block_entries)):
        body = _enc.encode(chunk)
        blocks.append(BlockRef(chunk[0].key, chunk[-1].key, pos, len(body), google_crc32c.value(body)))
        parts.append(body)
        pos += len(body)
    footer = _enc.encode(Footer(VERSION, tuple(blocks)))
    parts.append(footer)
    parts.append(TRAILER.pack(google_crc32c.value(footer), len(footer), MAGIC))
    return b"".join(parts), len(footer) + TRAILER.size


def _damaged(key: str, detail: str) -> ColdDataDamaged:
    return ColdDataDamaged(key, f"key index: {detail}")


def decode_footer(object_key: str, tail: bytes) -> Footer:
    """The footer from the object's last bytes (footer and trailer), checked."""
    if len(tail) < TRAILER.size:
        raise _damaged(object_key, "shorter than its trailer")
    crc, length, magic = TRAILER.unpack(tail[-TRAILER.size :])
    body = tail[-TRAILER.size - length : -TRAILER.size]
    if magic != MAGIC or len(body) != length or google_crc32c.value(body) != crc:
        raise _damaged(object_key, "footer checksum mismatch")
    try:
        footer = _footer_dec.decode(body)
    except msgspec.DecodeError as exc:
        raise _damaged(object_key, f"footer does not decode: {exc}") from None
    if footer.version != VERSION:
        raise _damaged(object_key, f"unknown version {footer.version}")
    return footer


def decode_block(object_key: str, ref: BlockRef, body: bytes) -> list[KeyedAppend]:
    if len(body) != ref.length or google_crc32c.value(body) != ref.crc32c:
        raise _damaged(object_key, f"block at {ref.offset} checksum mismatch")
    try:
        return _block_dec.decode(body)
    except msgspec.DecodeError as exc:
        raise _damaged(object_key, f"block at {ref.offset} does not decode: {exc}") from None


def decode_all(index: KeyIndexRef, data: bytes) -> Iterator[KeyedAppend]:
    """Every entry of a whole object read back, in key order; its size and CRC32C checked first."""
    if len(data) != index.size or google_crc32c.value(data) != index.crc32c:
        raise _damaged(index.key, "size or checksum differs from the journal's")
    footer = decode_footer(index.key, data[len(data) - index.footer_length :])
    for ref in footer.blocks:
        yield from decode_block(index.key, ref, data[ref.offset : ref.offset + ref.length])


class FooterCache:
    """Decoded footers (with their blocks' first keys, for the binary search) by object key (objects are
    immutable), the least recently used dropped first."""

    def __init__(self, max_objects: int = 256) -> None:
        self.max_objects = max_objects
        self._footers: OrderedDict[str, tuple[Footer, list[str]]] = OrderedDict()

    def get(self, key: str) -> tuple[Footer, list[str]] | None:
        found = self._footers.get(key)
        if found is not None:
            self._footers.move_to_end(key)
        return found

    def put(self, key: str, footer: Footer) -> tuple[Footer, list[str]]:
        found = self._footers[key] = (footer, [b.first for b in footer.blocks])
        self._footers.move_to_end(key)
        while len(self._footers) > self.max_objects:
            self._footers.popitem(last=False)
        return found


async def lookup(index: KeyIndexRef, fetch: Fetch, key: str, cache: FooterCache) -> KeyedAppend | None:
    """The index's entry of ``key`` (None: the index holds none): the footer (cached), then one block."""
    found = cache.get(index.key)
    if found is None:
        footer = decode_footer(index.key, await fetch(index.size - index.footer_length, index.size))
        found = cache.put(index.key, footer)
    footer, firsts = found
    i = bisect_right(firsts, key) - 1
    if i < 0 or footer.blocks[i].last < key:
        return None
    ref = footer.blocks[i]
    entries = decode_block(index.key, ref, await fetch(ref.offset, ref.offset + ref.length))
    keys = [e.key for e in entries]
    j = bisect_right(keys, key) - 1
    return entries[j] if j >= 0 and keys[j] == key else None
