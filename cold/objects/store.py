"""The object-store interface shared by every cold-tier backend.

The cold tier only needs a handful of operations from an object store, and it
needs them to behave identically whether the bytes live in a local directory
(the embedded default) or in S3. This module pins down that contract: the
`ObjectStore` protocol, the `ObjectInfo` metadata record, the error hierarchy
the service maps to HTTP statuses, and the key rules both backends enforce so
that a key accepted by one is accepted by the other.

Conditional writes are part of the contract, because correctness rests on them
(the one-server-per-prefix claim today, shard leases tomorrow):

* create-only: ``put(key, data)`` (``if_none_match=True``, the default) writes
  only if nothing is at the key, else raises `ObjectExists`;
* compare-and-set: ``put(key, data, if_match=etag)`` replaces the object only if
  its current ETag is ``etag``, else raises `PreconditionFailed` (also when
  there is no object);
* a consistent read: ``get_with_info(key)`` returns the bytes and the
  `ObjectInfo` (ETag) of the same version, so a read-modify-write is::

      current = await store.get_with_info(key)          # ObjectNotFound: create instead
      new = decide(current.data)
      try:
          await store.put(key, new, if_match=current.info.etag)
      except PreconditionFailed as lost:                 # someone else wrote first
          ...                                           # re-read and decide again
          # lost.outcome_unknown: an ambiguous earlier attempt of ours may have
          # landed and been replaced since; re-reading tells what is there now

Every backend enforces them atomically (LocalDirStore with a lock on its
directory; S3 with ``If-None-Match``/``If-Match``). An S3-compatible store that
silently ignores the headers is refused by the conditional-write probe
(`tiered.cold.objects.s3.S3Store.probe_conditional_writes`) before it is used.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from typing import Protocol, runtime_checkable

import msgspec

__all__ = [
    "ConditionalWritesUnsupported",
    "DeleteFailure",
    "InvalidKey",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "PreconditionFailed",
    "ReadOnlyStore",
    "StoredObject",
    "MAX_KEY_BYTES",
    "check_range",
    "validate_key",
    "validate_prefix",
]

# S3's limit; LocalDirStore additionally caps each segment at NAME_MAX.
MAX_KEY_BYTES = 1024


class ObjectInfo(msgspec.Struct, frozen=True):
    """Metadata of one stored object.

    `key` is the logical key (without any backend prefix). `etag` is opaque:
    it changes whenever the content changes, but callers must not assume it is
    an MD5 (it is not for S3 multipart uploads, SSE-KMS, or LocalDirStore).
    `last_modified` is timezone-aware UTC.
    """

    key: str
    size: int
    etag: str
    last_modified: datetime


class StoredObject(msgspec.Struct, frozen=True):
    """An object's bytes and the metadata of that same version (see `ObjectStore.get_with_info`)."""

    info: ObjectInfo
    data: bytes


class DeleteFailure(msgspec.Struct, frozen=True):
    """One key that `delete_many` could not delete, with the backend's reason."""

    key: str
    code: str
    message: str


class ObjectStoreError(Exception):
    """Base class for every error raised by an object store."""


class ObjectNotFound(ObjectStoreError):
    """The key does not exist."""


class ObjectExists(ObjectStoreError):
    """A conditional create found a different object already at the key."""


class PreconditionFailed(ObjectStoreError):
    """A compare-and-set put (`if_match`) found another ETag at the key, or no object.

    Nothing was written by this call, unless `outcome_unknown` is True: then an
    earlier attempt of the same call failed ambiguously and the object there
    now is not ours, so that attempt may have been applied and then replaced by
    someone else, or never applied. Either way the caller lost the race: read
    the key again to see what is there.
    """

    def __init__(self, key: str, detail: str = "", *, outcome_unknown: bool = False) -> None:
        super().__init__(f"{key!r}: {detail}" if detail else key)
        self.key = key
        self.outcome_unknown = outcome_unknown


class ConditionalWritesUnsupported(ObjectStoreError):
    """The store does not enforce the conditional writes the cold tier relies on.

    Raised when a store was found to overwrite silently where a conditional
    write had to be refused (S3Store's conditional-write probe), and for a
    conditional write a store cannot do safely (a compare-and-set over 5 GiB
    on S3). Using such a store would lose data silently, so it
    is refused loudly instead.
    """


class ObjectStoreUnavailable(ObjectStoreError):
    """The backend stayed unreachable or overloaded after all retries.

    The service maps this to 503: the request may succeed later, and for a
    write the outcome is unknown (the object may or may not exist).
    """


class InvalidKey(ObjectStoreError, ValueError):
    """The key violates the rules in `validate_key`."""


def validate_key(key: str) -> str:
    """Check that `key` is a portable object key and return it unchanged.

    Rules (common to every backend, so keys are portable between them):
    a non-empty str of at most MAX_KEY_BYTES UTF-8 bytes, '/'-separated,
    not starting with '/', no empty segments (so no trailing '/' or '//'),
    no '.' or '..' segments, and no NUL or backslash characters.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"key must be a non-empty str, got {key!r}")
    _check_chars(key)
    if key.startswith("/"):
        raise InvalidKey(f"key must be relative, got {key!r}")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKey(f"key has an empty, '.' or '..' segment: {key!r}")
    return key


def validate_prefix(prefix: str) -> str:
    """Check a listing prefix: like a key, but may be empty or end with '/'."""
    if not isinstance(prefix, str):
        raise InvalidKey(f"prefix must be a str, got {prefix!r}")
    if prefix:
        validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def check_range(start: int | None, end: int | None) -> tuple[int, int | None]:
    """Normalise a `get` byte range to (start, end-or-None).

    Ranges are half-open like Python slices: bytes [start, end). Both bounds
    must be non-negative and start <= end; either may be None (start of
    object / end of object). Bounds past the end are clamped, exactly as
    `data[start:end]` would be, so a range beyond the object yields b"".
    """
    lo = 0 if start is None else start
    if lo < 0 or (end is not None and end < 0):
        raise ValueError(f"byte range bounds must be non-negative: [{start}, {end})")
    if end is not None and end < lo:
        raise ValueError(f"byte range end precedes start: [{start}, {end})")
    return lo, end


def _check_chars(key: str) -> None:
    if "\x00" in key or "\\" in key:
        raise InvalidKey(f"key contains NUL or backslash: {key!r}")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates cannot be stored anywhere
        raise InvalidKey(f"key is not valid Unicode: {key!r}") from exc
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidKey(f"key longer than {MAX_KEY_BYTES} bytes")


@runtime_checkable
class ObjectStore(Protocol):
    """Async object store used by the cold tier.

    All methods are coroutine functions except `list`, which returns an
    async iterator. Implementations retry transient failures themselves and
    raise `ObjectStoreUnavailable` once retries are exhausted.
    """

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> ObjectInfo:
        """Store `data` at `key` and return its metadata (the new version's ETag).

        With if_none_match (the default) this is a conditional create: it
        raises ObjectExists if a different object is already there. If an
        earlier attempt of the same call may have succeeded (ambiguous
        failure), the existing object is compared against `data` and the put
        counts as successful when it matches. With if_none_match=False an
        existing object is replaced atomically.

        With `if_match` (an ETag from `head`, `list`, `get_with_info` or an
        earlier `put`) this is a compare-and-set that takes precedence over
        `if_none_match`: the object is replaced only if its current ETag is
        that one, else PreconditionFailed is raised (also when the key holds
        no object). Readers see the old or the new version, never a mix.
        """
        ...

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        """Return bytes [start, end) of the object (see `check_range`).

        Raises ObjectNotFound if the key does not exist.
        """
        ...

    async def get_with_info(self, key: str) -> StoredObject:
        """Return the whole object and the metadata of that same version.

        The ETag in the result is the one to pass as `put(..., if_match=)` for
        a read-modify-write. Raises ObjectNotFound if the key does not exist.
        """
        ...

    async def head(self, key: str) -> ObjectInfo | None:
        """Return the object's metadata, or None if it does not exist."""
        ...

    async def delete(self, key: str) -> None:
        """Delete the object. Deleting a missing key is not an error."""
        ...

    async def delete_many(self, keys: Iterable[str]) -> list[DeleteFailure]:
        """Delete several objects; return the keys that could not be deleted.

        Missing keys count as deleted. Raises ObjectStoreUnavailable if the
        backend cannot be reached at all (some keys may already be gone;
        deletes are idempotent, so retrying the whole call is safe).
        """
        ...

    async def close(self) -> None:
        """Release connections and threads. The store is unusable afterwards."""
        ...

    # Declared last so `list` does not shadow the builtin in annotations above.
    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Yield metadata of every object whose key starts with `prefix`,
        in ascending key order (UTF-8 byte order, as S3 does), fetching
        lazily page by page."""
        ...


class ReadOnlyStore:
    """An ObjectStore that refuses every write: what read-only commands (verify, dry runs) open."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> ObjectInfo:
        # Creates, replaces and compare-and-sets alike: read-only commands write nothing.
        raise ObjectStoreError(f"refusing to write {key!r}: the store was opened read-only")

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        return await self._inner.get(key, start=start, end=end)

    async def get_with_info(self, key: str) -> StoredObject:
        return await self._inner.get_with_info(key)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._inner.head(key)

    async def delete(self, key: str) -> None:
        raise ObjectStoreError(f"refusing to delete {key!r}: the store was opened read-only")

    async def delete_many(self, keys: Iterable[str]) -> list[DeleteFailure]:
        raise ObjectStoreError("refusing to delete: the store was opened read-only")

    async def close(self) -> None:
        await self._inner.close()

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self._inner.list(prefix)
