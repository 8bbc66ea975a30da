"""The conditional-write store the cluster protocol coordinates through, and nothing more.

The whole cluster protocol (leases, heartbeats, manifests) needs five
operations from the object store: read an object with its version (ETag),
create it only if absent, replace it only if it is still the version we read,
delete, and list keys with their versions. ``CasStore`` is that interface;
``ObjectStoreCas`` adapts the project's ``ObjectStore`` (S3 with ``If-Match``)
to it, and ``MemoryCasStore`` is a linearizable in-memory store for tests that
can inject the failures real stores produce.

Outcomes, as the protocol sees them:

* success: the write is in place; its new ETag is returned.
* ``AlreadyExists`` / ``PreconditionFailed``: the store refused the condition.
  Usually nothing was applied, but a client retry of a write that *was* applied
  is answered the same way (botocore retries timed-out PUTs), so callers settle
  every failure by reading back the nonce their body carries.
* ``ConcurrentWrite`` (S3's 409 ConditionalRequestConflict): not applied; try again.
* ``OutcomeUnknown``: the answer was lost; the write may land now, later, or never.
* ``CasUnavailable``: a read or list failed; nothing changed.

Every body the protocol writes carries a fresh random nonce, so two writes never
have equal bytes and an ETag (an MD5 on S3) is never reused: a compare-and-set
cannot be fooled by an old version coming back (no ABA).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from tiered.cold.objects.store import ObjectExists, ObjectInfo, ObjectNotFound, ObjectStore, ObjectStoreError
from tiered.cold.objects.store import PreconditionFailed as S3PreconditionFailed

__all__ = [
    "AlreadyExists",
    "CasError",
    "CasStore",
    "CasUnavailable",
    "ConcurrentWrite",
    "DatedCas",
    "Fault",
    "Listed",
    "MemoryCasStore",
    "ObjectStoreCas",
    "OutcomeUnknown",
    "PreconditionFailed",
    "Versioned",
]


@dataclass(frozen=True, slots=True)
class Versioned:
    """An object's bytes and the ETag of exactly that version."""

    data: bytes
    etag: str


@dataclass(frozen=True, slots=True)
class Listed:
    key: str
    etag: str


class CasError(Exception):
    """Base of every failure a ``CasStore`` reports."""

    def __init__(self, key: str, detail: str = "") -> None:
        super().__init__(f"{key!r}: {detail}" if detail else key)
        self.key = key


class AlreadyExists(CasError):
    """``put_if_absent`` found an object at the key."""


class PreconditionFailed(CasError):
    """``put_if_match`` found another version at the key, or no object."""


class ConcurrentWrite(CasError):
    """Another conditional write to the key was in progress (S3's 409); nothing was applied."""


class CasUnavailable(CasError):
    """The store did not answer; a read or list returned nothing, a delete may not have happened."""


class OutcomeUnknown(CasUnavailable):
    """A write's answer was lost: it may be applied now, later (a delayed request), or never."""


@runtime_checkable
class CasStore(Protocol):
    async def get(self, key: str) -> Versioned | None:
        """The object and its ETag, or None if there is none."""
        ...

    async def put_if_absent(self, key: str, data: bytes) -> str:
        """Create the object (``If-None-Match: *``); returns its ETag."""
        ...

    async def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace the object if its ETag is still ``etag`` (``If-Match``); returns the new ETag."""
        ...

    async def delete(self, key: str) -> None:
        """Delete the object; a missing key is not an error."""
        ...

    async def list(self, prefix: str) -> list[Listed]:
        """Every key under ``prefix`` with its ETag, in key order."""
        ...


@runtime_checkable
class DatedCas(Protocol):
    """A store that also tells the time: its clock when it applied a compare-and-set (its ``Date``)."""

    async def put_if_match_dated(self, key: str, data: bytes, etag: str) -> tuple[str, float | None]:
        """``put_if_match``, and the store's clock (Unix seconds, whole on S3) in its answer, if it gave one."""
        ...


def md5_etag(data: bytes) -> str:
    """S3's ETag of a single-part upload: the MD5 of the bytes, in hex."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


# -- the adapter over the project's ObjectStore ---------------------------------------------

# Bounded: an object that changes under every read is being written in a loop; give up.
_READ_ATTEMPTS = 4


class ObjectStoreCas:
    """``CasStore`` over an ``ObjectStore`` whose ``put`` takes ``if_match=`` (``S3Store``).

    Deliberately thin: conditional creates and compare-and-set replaces are
    the store's own (``S3Store`` already speaks both ETag forms, quoted for
    AWS and moto and bare for Ceph RGW, and settles its own ambiguous
    retries by a write id); this class only maps its exceptions to the
    protocol's outcomes and reads a version consistently.

    ``ObjectStore.get`` returns bytes without the ETag, so a versioned read is
    ``head`` then ``get``: when the bytes' MD5 is the ETag (single-part
    uploads, as every protocol object is) they are that version; otherwise a
    second ``head`` must show the same ETag. Bodies carry nonces, so equal
    ETags before and after mean no write happened in between.
    """

    def __init__(self, store: ObjectStore) -> None:
        if "if_match" not in inspect.signature(store.put).parameters:
            raise ValueError(
                f"{type(store).__name__} has no compare-and-set put (if_match): the cluster needs an "
                "S3-compatible store with conditional writes"
            )
        self._store = store

    async def get(self, key: str) -> Versioned | None:
        try:
            for _ in range(_READ_ATTEMPTS):
                before = await self._store.head(key)
                if before is None:
                    return None
                try:
                    data = await self._store.get(key)
                except ObjectNotFound:
                    continue  # deleted in between: look again
                if md5_etag(data) == before.etag:
                    return Versioned(data, before.etag)
                after = await self._store.head(key)
                if after is not None and after.etag == before.etag:
                    return Versioned(data, before.etag)
        except ObjectStoreError as exc:
            raise CasUnavailable(key, str(exc)) from exc
        raise CasUnavailable(key, f"the object changed under each of {_READ_ATTEMPTS} reads")

    async def put_if_absent(self, key: str, data: bytes) -> str:
        try:
            info = await self._store.put(key, data, if_none_match=True)
        except ObjectExists as exc:
            raise AlreadyExists(key) from exc
        except ObjectStoreError as exc:
            raise OutcomeUnknown(key, str(exc)) from exc
        return info.etag

    async def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return (await self._put_if_match(key, data, etag)).etag

    async def put_if_match_dated(self, key: str, data: bytes, etag: str) -> tuple[str, float | None]:
        """The answer's ``Date`` is ``S3Store``'s ``last_modified`` of a put (whole seconds)."""
        info = await self._put_if_match(key, data, etag)
        return info.etag, info.last_modified.timestamp()

    async def _put_if_match(self, key: str, data: bytes, etag: str) -> ObjectInfo:
        put = self._store.put
        try:
            return await put(key, data, if_match=etag)
        except S3PreconditionFailed as exc:
            if exc.outcome_unknown:
                raise OutcomeUnknown(key, str(exc)) from exc
            raise PreconditionFailed(key, str(exc)) from exc
        except ObjectStoreError as exc:
            raise OutcomeUnknown(key, str(exc)) from exc

    async def delete(self, key: str) -> None:
        try:
            await self._store.delete(key)
        except ObjectStoreError as exc:
            raise CasUnavailable(key, str(exc)) from exc

    async def list(self, prefix: str) -> list[Listed]:
        try:
            return [Listed(info.key, info.etag) async for info in self._store.list(prefix)]
        except ObjectStoreError as exc:
            raise CasUnavailable(prefix, str(exc)) from exc


# -- the in-memory store for tests ------------------------------------------------------------


class Fault(StrEnum):
    """What an injected fault does to the next matching request."""

    LOST = "lost"  # applied, then the answer is lost: OutcomeUnknown
    DROPPED = "dropped"  # never reaches the store: OutcomeUnknown
    DELAYED = "delayed"  # OutcomeUnknown now; applied later by ``deliver_delayed``
    CONFLICT_409 = "409"  # not applied: ConcurrentWrite
    APPLIED_412 = "412"  # applied, but a retry's refusal is the answer: AlreadyExists/PreconditionFailed
    UNAVAILABLE = "unavailable"  # a read or list fails: CasUnavailable


WRITE_FAULTS = (Fault.LOST, Fault.DROPPED, Fault.DELAYED, Fault.CONFLICT_409, Fault.APPLIED_412)


@dataclass
class _Pending:
    key: str
    data: bytes
    if_match: str | None  # None: a create


@dataclass
class MemoryCasStore:
    """A linearizable ``CasStore`` in memory: each call takes effect at one instant.

    ETags are MD5s of the bytes, as on S3. Faults are queued with ``inject``
    and consumed by the next request they apply to (writes or reads, in
    queue order). ``DELAYED`` writes wait in ``delayed`` until
    ``deliver_delayed`` applies them with their original condition, exactly
    as a request held in the network and arriving late would be. ``on_call``
    runs before and after every request's effect (tests advance a virtual
    clock there to model latency); ``yields`` says how many times to yield to
    the event loop at each of those two points, so concurrent callers
    interleave between a request's send, its effect and its answer.
    ``history`` records every applied write per key.
    """

    objects: dict[str, Versioned] = field(default_factory=dict)
    faults: deque[tuple[Fault, str]] = field(default_factory=deque)
    delayed: list[_Pending] = field(default_factory=list)
    history: dict[str, list[bytes]] = field(default_factory=dict)
    on_call: Callable[[str, str], None] | None = None
    yields: Callable[[], int] | None = None
    calls: int = 0
    #: The store's clock (Unix seconds) as its answers' ``Date`` gives it; None: answers carry none.
    date: Callable[[], float] | None = None

    def inject(self, fault: Fault, key_prefix: str = "") -> None:
        """Make the next request on a key starting with ``key_prefix`` fail this way."""
        self.faults.append((fault, key_prefix))

    def clear_faults(self) -> None:
        self.faults.clear()

    def deliver_delayed(self, index: int = 0) -> bool:
        """Apply one delayed write now (its condition judged now); whether it was applied."""
        pending = self.delayed.pop(index)
        return self._apply(pending) is not None

    def drop_delayed(self) -> None:
        self.delayed.clear()

    def _take_fault(self, key: str, *, write: bool) -> Fault | None:
        for i, (fault, prefix) in enumerate(self.faults):
            if key.startswith(prefix) and (fault in WRITE_FAULTS) == write:
                del self.faults[i]
                return fault
        return None

    def _apply(self, pending: _Pending) -> str | None:
        """Apply a write if its condition holds now; the new ETag, or None if refused."""
        current = self.objects.get(pending.key)
        if pending.if_match is None:
            if current is not None:
                return None
        elif current is None or current.etag != pending.if_match:
            return None
        version = Versioned(pending.data, md5_etag(pending.data))
        self.objects[pending.key] = version
        self.history.setdefault(pending.key, []).append(pending.data)
        return version.etag

    async def _pause(self, op: str, key: str) -> None:
        if self.on_call is not None:
            self.on_call(op, key)
        for _ in range(1 + (self.yields() if self.yields else 0)):
            await asyncio.sleep(0)  # a real await point, as every store call is

    async def _enter(self, op: str, key: str) -> None:
        self.calls += 1
        await self._pause(op, key)

    async def _leave(self, op: str, key: str) -> None:
        await self._pause(op + ":answer", key)

    async def _write(self, op: str, pending: _Pending) -> str:
        await self._enter(op, pending.key)
        fault = self._take_fault(pending.key, write=True)
        if fault is Fault.DROPPED:
            raise OutcomeUnknown(pending.key, "injected: request dropped")
        if fault is Fault.DELAYED:
            self.delayed.append(pending)
            raise OutcomeUnknown(pending.key, "injected: request delayed")
        if fault is Fault.CONFLICT_409:
            raise ConcurrentWrite(pending.key, "injected: 409 ConditionalRequestConflict")
        etag = self._apply(pending)
        await self._leave(op, pending.key)
        if fault is Fault.LOST:
            raise OutcomeUnknown(pending.key, "injected: applied, answer lost")
        if etag is None or fault is Fault.APPLIED_412:
            error = AlreadyExists if pending.if_match is None else PreconditionFailed
            raise error(pending.key, "injected: 412 after applying" if etag else "condition failed")
        return etag

    async def get(self, key: str) -> Versioned | None:
        await self._enter("get", key)
        if self._take_fault(key, write=False) is not None:
            raise CasUnavailable(key, "injected: read failed")
        found = self.objects.get(key)
        await self._leave("get", key)
        return found

    async def put_if_absent(self, key: str, data: bytes) -> str:
        return await self._write("put_if_absent", _Pending(key, bytes(data), None))

    async def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return await self._write("put_if_match", _Pending(key, bytes(data), etag))

    async def put_if_match_dated(self, key: str, data: bytes, etag: str) -> tuple[str, float | None]:
        """Whole seconds, as an S3 ``Date`` header has them."""
        etag = await self.put_if_match(key, data, etag)
        return etag, None if self.date is None else float(math.floor(self.date()))

    async def delete(self, key: str) -> None:
        await self._enter("delete", key)
        if self._take_fault(key, write=False) is not None:
            raise CasUnavailable(key, "injected: delete failed")
        self.objects.pop(key, None)
        await self._leave("delete", key)

    async def list(self, prefix: str) -> list[Listed]:
        await self._enter("list", prefix)
        if self._take_fault(prefix, write=False) is not None:
            raise CasUnavailable(prefix, "injected: list failed")
        found = [Listed(k, v.etag) for k, v in sorted(self.objects.items()) if k.startswith(prefix)]
        await self._leave("list", prefix)
        return found
