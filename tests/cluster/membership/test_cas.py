"""The compare-and-set store protocol: the in-memory store and its faults, and the adapter over object stores."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tiered.cluster.membership.cas import (
    AlreadyExists,
    CasUnavailable,
    ConcurrentWrite,
    Fault,
    Listed,
    MemoryCasStore,
    ObjectStoreCas,
    OutcomeUnknown,
    PreconditionFailed,
    md5_etag,
)
from tiered.cold.objects.localdir import LocalDirStore


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_memory_store_create_compare_and_set_list_delete() -> None:
    async def scenario() -> None:
        store = MemoryCasStore()
        etag = await store.put_if_absent("k/a", b"one")
        assert etag == md5_etag(b"one")
        with pytest.raises(AlreadyExists):
            await store.put_if_absent("k/a", b"two")
        with pytest.raises(PreconditionFailed):
            await store.put_if_match("k/a", b"two", "not-the-etag")
        with pytest.raises(PreconditionFailed):
            await store.put_if_match("k/missing", b"two", etag)
        new = await store.put_if_match("k/a", b"two", etag)
        found = await store.get("k/a")
        assert found is not None and (found.data, found.etag) == (b"two", new)
        with pytest.raises(PreconditionFailed):
            await store.put_if_match("k/a", b"three", etag)  # the old version is gone: no ABA
        await store.put_if_absent("k/b", b"b")
        await store.put_if_absent("other", b"o")
        assert await store.list("k/") == [Listed("k/a", new), Listed("k/b", md5_etag(b"b"))]
        await store.delete("k/a")
        await store.delete("k/a")  # missing is fine
        assert await store.get("k/a") is None
        assert store.history["k/a"] == [b"one", b"two"]

    run(scenario())


def test_memory_store_faults_do_what_real_stores_do() -> None:
    async def scenario() -> None:
        store = MemoryCasStore()
        store.inject(Fault.LOST)
        with pytest.raises(OutcomeUnknown):
            await store.put_if_absent("a", b"1")
        assert (await store.get("a")) is not None  # applied, answer lost

        store.inject(Fault.DROPPED)
        with pytest.raises(OutcomeUnknown):
            await store.put_if_absent("b", b"1")
        assert await store.get("b") is None  # never arrived

        store.inject(Fault.CONFLICT_409)
        with pytest.raises(ConcurrentWrite):
            await store.put_if_absent("b", b"1")
        assert await store.get("b") is None

        store.inject(Fault.APPLIED_412)
        with pytest.raises(AlreadyExists):
            await store.put_if_absent("b", b"mine")
        found = await store.get("b")
        assert found is not None and found.data == b"mine"  # applied, then a retry's refusal

        # Delayed: refused now, applied later with its original condition.
        etag = found.etag
        store.inject(Fault.DELAYED, "b")
        with pytest.raises(OutcomeUnknown):
            await store.put_if_match("b", b"late", etag)
        assert store.deliver_delayed() is True
        found = await store.get("b")
        assert found is not None and found.data == b"late"
        store.inject(Fault.DELAYED)
        with pytest.raises(OutcomeUnknown):
            await store.put_if_match("b", b"stale", etag)  # etag no longer current
        assert store.deliver_delayed() is False

        # Targeted by key prefix; reads fail only with read faults.
        store.inject(Fault.UNAVAILABLE, "x/")
        await store.put_if_absent("y", b"y")
        assert await store.get("y") is not None
        with pytest.raises(CasUnavailable):
            await store.list("x/")
        assert not store.faults

    run(scenario())


def test_the_adapter_refuses_a_store_without_compare_and_set() -> None:
    class PutOnly:
        async def put(self, key: str, data: bytes) -> None: ...

    with pytest.raises(ValueError, match="compare-and-set"):
        ObjectStoreCas(PutOnly())  # type: ignore[arg-type]


def test_the_adapter_over_the_local_directory_store(tmp_path: Path) -> None:
    """Every ObjectStore has conditional writes now; the local one serves the protocol too."""

    async def scenario() -> None:
        cas = ObjectStoreCas(LocalDirStore(tmp_path))
        etag = await cas.put_if_absent("k", b"one")
        with pytest.raises(AlreadyExists):
            await cas.put_if_absent("k", b"two")
        etag2 = await cas.put_if_match("k", b"two", etag)
        with pytest.raises(PreconditionFailed):
            await cas.put_if_match("k", b"three", etag)
        got = await cas.get("k")
        assert got is not None and got.data == b"two" and got.etag == etag2

    run(scenario())
