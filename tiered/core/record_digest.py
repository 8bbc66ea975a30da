"""The integrity digest of a record: an order-independent, additive multiset hash.

CRC32C proves that a record read is the record written; this proves that a
stream holds exactly the records acknowledged (no row lost, none doubled, none
from elsewhere). Every record, identified by where it belongs and what it
holds, hashes to a 256-bit number; a set of records digests to the sum of
their numbers modulo 2**256. Sums commute, so the digest does not depend on the
order records are counted in (hot or cold tier, any object), and releasing a
record subtracts it.

The hash, exactly (``docs/integrity.md`` has test vectors)::

    SHA-256( b"tiered.record.v1\\n"
             || u32be(len(bucket)) || bucket        (UTF-8)
             || u32be(len(stream)) || stream        (the stream's path, UTF-8, no leading "/")
             || u64be(incarnation)                  (0: the first stream at that path)
             || u64be(start) || u64be(end)          (byte offsets: end = start + len(bytes))
             || bytes )

read as a big-endian unsigned integer. A digest is written as 64 lowercase
hex digits (big-endian). SHA-256 because every client platform has it (the
browser's WebCrypto included) and it is hardware-accelerated where it matters.

Pure and dependency-free: the cold format (footer contributions), the stream
state (journal state) and clients all compute the same function.
"""

from __future__ import annotations

import hashlib
import struct
from typing import TypeAlias

#: A SHA-256 being fed a record's bytes (``RecordHasher.begin``).
HashState: TypeAlias = "hashlib._Hash"

DOMAIN = b"tiered.record.v1\n"
MODULUS = 1 << 256
MASK = MODULUS - 1

_pack_range = struct.Struct(">QQ").pack
_from_bytes = int.from_bytes


def _name(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">I", len(raw)) + raw


def record_prefix(bucket: str, stream: str, incarnation: int) -> bytes:
    """The bytes every record of one stream's incarnation starts its hash input with."""
    return DOMAIN + _name(bucket) + _name(stream) + struct.pack(">Q", incarnation)


class RecordHasher:
    """Hashes the records of one stream incarnation (the shared prefix is hashed once)."""

    __slots__ = ("_base",)

    def __init__(self, bucket: str, stream: str, incarnation: int) -> None:
        self._base = hashlib.sha256(record_prefix(bucket, stream, incarnation))

    def __call__(self, start: int, data: bytes | memoryview) -> int:
        h = self._base.copy()
        h.update(_pack_range(start, start + len(data)))
        h.update(data)
        return _from_bytes(h.digest(), "big")

    def begin(self, start: int, size: int) -> HashState:
        """A hash of the record of ``size`` bytes at ``start``, to be fed its bytes as they stream by.

        The record's range comes before its bytes in the hash input, so a body
        streamed before its offset is final is hashed for the offset expected
        (``tiered.engine.streams.large_bodies`` re-reads it if that moved).
        """
        h = self._base.copy()
        h.update(_pack_range(start, start + size))
        return h


def hash_value(h: HashState) -> int:
    """The contribution a hash begun with ``RecordHasher.begin`` adds up to, once fed every byte."""
    return _from_bytes(h.digest(), "big")


def record_hash(bucket: str, stream: str, incarnation: int, start: int, data: bytes | memoryview) -> int:
    """The 256-bit contribution of the record ``data`` at ``[start, start + len(data))``."""
    return RecordHasher(bucket, stream, incarnation)(start, data)


def format_digest(value: int) -> str:
    """A digest as 64 lowercase hex digits."""
    return f"{value & MASK:064x}"


def parse_digest(text: str) -> int:
    """A digest from its 64 hex digits (ValueError otherwise)."""
    if len(text) != 64:
        raise ValueError("a digest is 64 hex digits")
    return int(text, 16)


def digest_bytes(value: int) -> bytes:
    """A contribution or digest as 32 big-endian bytes (how cold footers store them)."""
    return (value & MASK).to_bytes(32, "big")
