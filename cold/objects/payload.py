"""Large bodies stored by reference: one object per body, its raw bytes, checked block by block.

A body above the large-body threshold never goes through the journal: it is
streamed to an object of its own (``data/<ULID>.payload``, ``keys``) and the
journal then records a reference to it. While the body streams, its CRC32C is
computed over the whole and over each block of ``PAYLOAD_BLOCK_BYTES``; the
reference keeps both (``PayloadDigest``), so a ranged read fetches whole
blocks and checks each one before a byte of it is served (``read_payload``),
and ``verify_payload`` checks a whole object. Memory stays bounded: the
upload holds at most a few parts, a read a few blocks.

Backends stream through their ``put_stream(key, chunks, size)`` (the local
directory: a staged file, fsynced, published create-only; S3: a multipart
upload, aborted on any failure). Pyarrow-free, like the rest of ``objects``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import google_crc32c
import msgspec

from tiered.cold.objects.store import ObjectInfo, ObjectStore, ObjectStoreError

#: Granularity of a payload's checksums: a read fetches and checks whole blocks.
PAYLOAD_BLOCK_BYTES = 1024 * 1024


class PayloadDigest(msgspec.Struct, frozen=True, array_like=True):
    """What a reference keeps to check a payload object: its size and CRC32C, whole and per block."""

    size: int
    crc32c: int
    block_bytes: int
    block_crcs: tuple[int, ...]


class PayloadDamaged(Exception):
    """A payload object's bytes do not match the digest its reference keeps."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"payload object {key}: {detail}")
        self.key = key


class BodyLengthMismatch(Exception):
    """The body streamed is not as long as its declared length: nothing of it may be committed."""


class _Digester:
    """CRC32C of everything fed, and of each block of ``block_bytes``."""

    __slots__ = ("block_bytes", "size", "crc", "block_crc", "block_fill", "blocks")

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.size = 0
        self.crc = 0
        self.block_crc = 0
        self.block_fill = 0
        self.blocks: list[int] = []

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.crc = google_crc32c.extend(self.crc, chunk)
        view = memoryview(chunk)
        while view:
            take = min(len(view), self.block_bytes - self.block_fill)
            self.block_crc = google_crc32c.extend(self.block_crc, bytes(view[:take]))
            self.block_fill += take
            view = view[take:]
            if self.block_fill == self.block_bytes:
                self.blocks.append(self.block_crc)
                self.block_crc, self.block_fill = 0, 0

    def finish(self) -> PayloadDigest:
        blocks = list(self.blocks)
        if self.block_fill:
            blocks.append(self.block_crc)
        return PayloadDigest(self.size, self.crc, self.block_bytes, tuple(blocks))


def digest_of(data: bytes, block_bytes: int = PAYLOAD_BLOCK_BYTES) -> PayloadDigest:
    """The digest of bytes in memory (tests, tools)."""
    d = _Digester(block_bytes)
    d.update(data)
    return d.finish()


async def upload_payload(
    store: ObjectStore,
    key: str,
    chunks: AsyncIterator[bytes],
    size: int,
    *,
    block_bytes: int = PAYLOAD_BLOCK_BYTES,
) -> tuple[PayloadDigest, ObjectInfo]:
    """Stream ``chunks`` (exactly ``size`` bytes) to a new object at ``key``; its digest and metadata.

    A body shorter or longer than ``size`` raises ``BodyLengthMismatch`` and
    the backend leaves no object (a failed or cut upload publishes nothing).
    """
    put_stream: Any = getattr(store, "put_stream", None)
    if put_stream is None:
        raise ObjectStoreError(f"the object store {type(store).__name__} cannot stream large bodies")
    digester = _Digester(block_bytes)

    async def checked() -> AsyncIterator[bytes]:
        async for chunk in chunks:
            if digester.size + len(chunk) > size:
                raise BodyLengthMismatch(f"the body is longer than its declared {size} bytes")
            digester.update(chunk)
            yield chunk
        if digester.size != size:
            raise BodyLengthMismatch(f"the body ended after {digester.size} of its declared {size} bytes")

    info: ObjectInfo = await put_stream(key, checked(), size)
    digest = digester.finish()
    if info.size != size:
        raise PayloadDamaged(key, f"the store holds {info.size} bytes after an upload of {size}")
    return digest, info


def block_span(digest: PayloadDigest, lo: int, hi: int) -> tuple[int, int]:
    """The first and last block (inclusive) holding object bytes ``[lo, hi)``."""
    return lo // digest.block_bytes, (hi - 1) // digest.block_bytes


def check_blocks(key: str, digest: PayloadDigest, first: int, data: bytes) -> None:
    """``data`` is blocks ``first, first+1, ...`` of the object, read whole: each must match its CRC32C."""
    bb = digest.block_bytes
    view = memoryview(data)
    for n in range(0, len(data), bb):
        block = first + n // bb
        if block >= len(digest.block_crcs):
            raise PayloadDamaged(key, f"block {block} is past the end of the object")
        if google_crc32c.value(bytes(view[n : n + bb])) != digest.block_crcs[block]:
            raise PayloadDamaged(key, f"block {block} (bytes {block * bb}..) fails its CRC32C")


async def read_payload(store: ObjectStore, key: str, digest: PayloadDigest, lo: int, hi: int) -> bytes:
    """Object bytes ``[lo, hi)``, from whole blocks each checked against the reference's digest."""
    if not 0 <= lo < hi <= digest.size:
        raise PayloadDamaged(key, f"range [{lo}, {hi}) is outside the object's {digest.size} bytes")
    first, last = block_span(digest, lo, hi)
    a = first * digest.block_bytes
    b = min(digest.size, (last + 1) * digest.block_bytes)
    data = await store.get(key, start=a, end=b)
    if len(data) != b - a:
        raise PayloadDamaged(key, f"the store returned {len(data)} bytes for [{a}, {b})")
    check_blocks(key, digest, first, data)
    return data[lo - a : hi - a]


async def verify_payload(
    store: ObjectStore,
    key: str,
    digest: PayloadDigest,
    *,
    span_blocks: int = 8,
    on_bytes: Callable[[bytes], None] | None = None,
) -> None:
    """Read a whole payload object a few blocks at a time; raise ``PayloadDamaged`` at the first bad block.

    ``on_bytes`` sees every checked span in order (``tiered verify`` hashes the body for its digests).
    """
    crc = 0
    step = span_blocks * digest.block_bytes
    for a in range(0, digest.size, step):
        b = min(digest.size, a + step)
        data = await store.get(key, start=a, end=b)
        if len(data) != b - a:
            raise PayloadDamaged(key, f"the store returned {len(data)} bytes for [{a}, {b})")
        check_blocks(key, digest, a // digest.block_bytes, data)
        crc = google_crc32c.extend(crc, data)
        if on_bytes is not None:
            on_bytes(data)
    if crc != digest.crc32c:
        raise PayloadDamaged(key, "the whole object's CRC32C does not match")
