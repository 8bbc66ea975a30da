"""Object keys: ``data/<ULID>.parquet``, so keys sort by creation time and an object's age shows in its name.

Pyarrow-free, so the GC (reconciliation judges unknown keys by their age) and
tools can use it without the Parquet codec.
"""

from __future__ import annotations

import os

DATA_PREFIX = "data/"
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_object_key(now_ms: int, randomness: bytes | None = None) -> str:
    """``data/<ULID>.parquet``: keys sort by creation time, so age shows in the name."""
    rand = int.from_bytes(randomness or os.urandom(10), "big")
    value = (now_ms << 80) | rand
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return DATA_PREFIX + "".join(reversed(chars)) + ".parquet"


SNAPSHOT_SUFFIX = ".snapshot"


def new_snapshot_key(now_ms: int, randomness: bytes | None = None) -> str:
    """``data/<ULID>.snapshot``: a stream snapshot's body, under the data prefix (reconciliation sees it)."""
    return new_object_key(now_ms, randomness).removesuffix(".parquet") + SNAPSHOT_SUFFIX


def is_snapshot_key(key: str) -> bool:
    """A stream snapshot's object (raw bytes), not a Parquet chunk."""
    return key.endswith(SNAPSHOT_SUFFIX)


def key_time_ms(key: str) -> int | None:
    """The creation time encoded in a key from ``new_object_key`` (or ``new_snapshot_key``, or a payload key)."""
    name = (
        key.rsplit("/", 1)[-1]
        .removesuffix(".parquet")
        .removesuffix(SNAPSHOT_SUFFIX)
        .removesuffix(PAYLOAD_SUFFIX)
        .removesuffix(KEY_INDEX_SUFFIX)
    )
    if len(name) != 26:
        return None
    value = 0
    for ch in name:
        i = _CROCKFORD.find(ch)
        if i < 0:
            return None
        value = (value << 5) | i
    return value >> 80


#: Large bodies stored by reference (one object per body, its raw bytes): ``data/<ULID>.payload``.
PAYLOAD_SUFFIX = ".payload"


def new_payload_key(now_ms: int, randomness: bytes | None = None) -> str:
    """``data/<ULID>.payload``: under the data prefix, so reconciliation and GC treat it as any cold object."""
    return new_object_key(now_ms, randomness).removesuffix(".parquet") + PAYLOAD_SUFFIX


def is_payload_key(key: str) -> bool:
    return key.endswith(PAYLOAD_SUFFIX)


#: A header-keyed stream's key index (``tiered/engine/streams/key_index_file.py``): ``data/<ULID>.keys``.
KEY_INDEX_SUFFIX = ".keys"


def new_key_index_key(now_ms: int, randomness: bytes | None = None) -> str:
    """``data/<ULID>.keys``: under the data prefix, so reconciliation and GC treat it as any cold object."""
    return new_object_key(now_ms, randomness).removesuffix(".parquet") + KEY_INDEX_SUFFIX


def is_key_index_key(key: str) -> bool:
    return key.endswith(KEY_INDEX_SUFFIX)
