"""Large bodies stored by reference (issue 22): byte-exact round trips, damage, GC release, crashes.

A real ``Engine`` (``tests/support/gc_support.Harness``: nothing in the
background, passes when the test asks) on the local store and on moto, with a
low threshold so bodies stay small. The HTTP adapters' streaming and SIGKILL of
a real server are in ``tests/api/test_http_large_bodies.py``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gc_support import Harness, VirtualClock, journal_records, make_config
from tests.support.s3_backends import backend_for
from tiered.cli.verify import verify_cold
from tiered.cold.objects.keys import is_payload_key, key_time_ms
from tiered.cold.objects.payload import PAYLOAD_BLOCK_BYTES, digest_of
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.streams.model import AppendRequest, ColdSlice, HotSlice
from tiered.engine.streams.records import ColdCopyAborted, ColdCopyStarted, PayloadAppended

pytestmark = pytest.mark.timeout(120)

GRACE_MS = 10_000
OCTET = "application/octet-stream"
THRESHOLD = 64 * 1024


def body_of(size: int, seed: int) -> bytes:
    """Bytes no two offsets of which repeat within a block: a misplaced block shows."""
    return (bytes(range(256)) * (size // 256 + 1))[:size] if seed == 0 else os.urandom(size)


async def chunked(data: bytes, chunk: int = 100_003) -> AsyncIterator[bytes]:
    for i in range(0, len(data), chunk):
        await asyncio.sleep(0)
        yield data[i : i + chunk]


@pytest.fixture(params=["local", "moto"])
def config(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Config]:
    settings: dict[str, Any] = {
        "gc_grace_s": GRACE_MS / 1000,
        "large_body_threshold_bytes": THRESHOLD,
        "large_body_max_bytes": 64 * 1024 * 1024,
    }
    if request.param == "local":
        yield make_config(tmp_path / "data", **settings)
        return
    with backend_for(request.param, request, monkeypatch) as backend:
        yield make_config(tmp_path / "data", **settings, **backend.config())


async def large_append(h: Harness, path: str, data: bytes, **req: Any) -> Any:
    request = AppendRequest(req.pop("content_type", OCTET), b"", False, **req)
    return await h.s.large_bodies.append("default", path, request, len(data), chunked(data))


async def stored_keys(h: Harness) -> set[str]:
    store = h.s.store
    assert store is not None
    return {info.key async for info in store.list("data/")}


async def read_range(h: Harness, path: str, start: int, end: int) -> bytes:
    s = h.s.streams.lookup("default", path)
    return await h.s.streams.read(s, start, end)


def test_round_trip_between_hot_appends_through_flush_restart_and_snapshot(config: Config) -> None:
    """hot | payload | hot | payload: every range byte-exact, before and after a flush, a crash, a snapshot."""
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    size = 2 * PAYLOAD_BLOCK_BYTES + 12_345 if config.cold_store == "local" else 9 * 1024 * 1024
    big = [body_of(size, 0), body_of(THRESHOLD + 1, 1)]
    small = [b"first hot record;", b"second hot record;"]
    expected = small[0] + big[0] + small[1] + big[1]

    async def check(h: Harness) -> None:
        assert await h.read("default", "s") == expected
        edges = [0, len(small[0]), len(small[0]) + len(big[0]), len(expected) - len(big[1]), len(expected)]
        for a in edges:
            for b in edges:
                for lo, hi in ((a, b), (a + 1, b - 1), (a - 1, b + 1)):
                    lo, hi = max(0, lo), min(len(expected), hi)
                    if lo < hi:
                        assert await read_range(h, "s", lo, hi) == expected[lo:hi], (lo, hi)
        assert (
            await read_range(h, "s", PAYLOAD_BLOCK_BYTES - 3, PAYLOAD_BLOCK_BYTES + 5)
            == (expected[PAYLOAD_BLOCK_BYTES - 3 : PAYLOAD_BLOCK_BYTES + 5])
        )

    async def body() -> None:
        await h.start()
        await h.create("default", "s", small[0])
        result = await large_append(h, "s", big[0])
        assert (result.tail, result.stored, result.duplicate) == (len(small[0]) + len(big[0]), True, False)
        await h.append("default", "s", small[1])
        result = await large_append(h, "s", big[1])
        assert result.tail == len(expected)
        s = h.s.streams.lookup("default", "s")
        kinds = [type(sl) for sl in h.s.state.plan_read(s, 0, s.tail)]
        assert kinds == [HotSlice, ColdSlice, HotSlice, ColdSlice]
        payloads = {k for k in h.s.state.cold_objects if is_payload_key(k)}
        assert len(payloads) == 2 and await stored_keys(h) == payloads
        assert s.cold_end == 0  # hot bytes below the payloads wait for the flusher
        await check(h)
        # The flusher copies the hot records (stopping at each payload); the cold prefix runs over them.
        clock.advance(1_000)
        assert await h.flush() == 1  # the first hot record; the cold prefix runs on over the payload
        assert h.s.streams.lookup("default", "s").cold_end == len(small[0]) + len(big[0])
        await check(h)
        assert await h.flush() == 1  # the second; then over the second payload
        assert h.s.streams.lookup("default", "s").cold_end == len(expected)
        assert h.s.state.hot_bytes == 0
        assert await h.flush() == 0
        await check(h)
        await h.restart(crash=True)  # replay from the journal
        await check(h)
        await h.s.journal.snapshot(h.s.state)
        await h.restart()  # from the snapshot
        await check(h)
        usage = h.s.state.extensions["tenants"].peek("default")  # type: ignore[attr-defined]
        assert usage.appended_bytes == len(expected)
        await h.stop()

    asyncio.run(body())


def test_payload_at_the_cold_prefix_is_cold_at_once(config: Config) -> None:
    h = Harness(config)
    data = body_of(THRESHOLD * 3 + 7, 1)

    async def body() -> None:
        await h.start()
        await h.create("default", "s")
        await large_append(h, "s", data, producer="p", epoch=0, seq=0)
        s = h.s.streams.lookup("default", "s")
        assert (s.cold_end, s.tail, len(s.chunks), h.s.state.hot_bytes) == (len(data), len(data), 0, 0)
        # A retry of the same producer append is a duplicate: answered, nothing stored twice.
        again = await large_append(h, "s", data, producer="p", epoch=0, seq=0)
        assert again.duplicate and not again.stored and again.tail == len(data)
        assert len(h.s.state.cold_objects) == 1
        assert await h.read("default", "s") == data
        await h.stop()

    asyncio.run(body())


def test_refusals_store_nothing(config: Config) -> None:
    h = Harness(config)

    async def body() -> None:
        await h.start()
        await h.create("default", "j", b"[1]", content_type="application/json")
        await h.create("default", "t", b"text", content_type="text/plain")
        with pytest.raises(TieredError) as err:
            await large_append(h, "j", b"[" + b"1," * THRESHOLD + b"1]", content_type="application/json")
        assert err.value.code is ErrorCode.PAYLOAD_TOO_LARGE  # JSON streams: bodies go through the journal
        with pytest.raises(TieredError) as err:
            await large_append(h, "t", body_of(THRESHOLD + 1, 0))
        assert err.value.code is ErrorCode.CONTENT_TYPE_MISMATCH
        with pytest.raises(TieredError) as err:
            await large_append(h, "missing", body_of(THRESHOLD + 1, 0))
        assert err.value.code is ErrorCode.STREAM_NOT_FOUND
        with pytest.raises(TieredError) as err:
            await h.s.large_bodies.append(
                "default", "t", AppendRequest(OCTET, b"", False), 10**12, chunked(b"")
            )
        assert err.value.code is ErrorCode.PAYLOAD_TOO_LARGE
        # A body shorter than declared: 400, the upload abandoned and deleted, nothing journaled as data.
        await h.create("default", "o")
        with pytest.raises(TieredError) as err:
            await h.s.large_bodies.append(
                "default", "o", AppendRequest(OCTET, b"", False), THRESHOLD * 2, chunked(b"x" * THRESHOLD)
            )
        assert err.value.code is ErrorCode.BAD_REQUEST
        assert h.s.streams.lookup("default", "o").tail == 0
        assert h.s.state.cold_objects == {} and h.s.state.copies_in_flight == {}
        assert await stored_keys(h) == set()
        await h.stop()

    asyncio.run(body())
    kinds = [type(r) for r in journal_records(config.data_path)]
    assert PayloadAppended not in kinds and kinds.count(ColdCopyStarted) == kinds.count(ColdCopyAborted) == 1


def test_damaged_payload_is_an_integrity_error(config: Config) -> None:
    if config.cold_store != "local":
        pytest.skip("damage is injected into the local store's file")
    h = Harness(config)
    data = body_of(3 * PAYLOAD_BLOCK_BYTES, 0)

    async def body() -> None:
        await h.start()
        await h.create("default", "s")
        await large_append(h, "s", data)
        [key] = h.s.state.cold_objects
        path = config.data_path / "cold" / key
        raw = bytearray(path.read_bytes())
        raw[PAYLOAD_BLOCK_BYTES + 10] ^= 0x01  # one bit, in the second block
        path.write_bytes(bytes(raw))
        assert (
            await read_range(h, "s", 0, PAYLOAD_BLOCK_BYTES) == data[:PAYLOAD_BLOCK_BYTES]
        )  # block 0 is sound
        for lo, hi in ((0, len(data)), (PAYLOAD_BLOCK_BYTES + 5, PAYLOAD_BLOCK_BYTES + 20)):
            with pytest.raises(TieredError) as err:
                await read_range(h, "s", lo, hi)
            assert err.value.code is ErrorCode.DATA_DAMAGED
        assert h.s.reader.integrity_errors["cold"] == 2
        path.write_bytes(bytes(raw[:-1]))  # truncated: damage too
        with pytest.raises(TieredError) as err:
            await read_range(h, "s", len(data) - 10, len(data))
        assert err.value.code is ErrorCode.DATA_DAMAGED
        path.unlink()  # missing: damage too
        with pytest.raises(TieredError) as err:
            await read_range(h, "s", 0, 10)
        assert err.value.code is ErrorCode.DATA_DAMAGED
        await h.stop()

    asyncio.run(body())


@pytest.mark.parametrize("release", ["delete", "retention", "erase"])
def test_released_payload_is_deleted_by_gc_after_the_grace(config: Config, release: str) -> None:
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    data = body_of(THRESHOLD * 2, 1)

    async def body() -> None:
        await h.start()
        await h.bucket("b")
        await h.create("b", "s", b"hot;")
        await large_append_in(h, "b", "s", data)
        await h.append("b", "s", b"after;")
        [key] = h.s.state.cold_objects
        assert await stored_keys(h) == {key}
        report = await h.gc(clock.ms + 100 * GRACE_MS)
        assert (report.objects_deleted, report.orphans_found, report.integrity_errors) == (0, 0, [])
        clock.advance(1_000)
        if release == "delete":
            await h.s.streams.delete("b", "s")
        elif release == "retention":
            s = h.s.streams.lookup("b", "s")
            await h.s.streams.retain_from("b", "s", s.tail - len(b"after;"))
            assert await h.read("b", "s") == b"after;"
        else:
            await h.s.streams.erase_bucket("b")
        released = clock.ms
        assert h.s.state.cold_objects[key].refs == 0
        report = await h.gc(released + GRACE_MS - 1)
        assert report.objects_deleted == 0 and await stored_keys(h) == {key}
        report = await h.gc(released + GRACE_MS)
        assert report.objects_deleted == 1 and report.errors == [], report
        assert await stored_keys(h) == set() and key not in h.s.state.cold_objects
        await h.restart(crash=True)
        assert key not in h.s.state.cold_objects
        await h.stop()

    asyncio.run(body())


async def large_append_in(h: Harness, bucket: str, path: str, data: bytes) -> Any:
    return await h.s.large_bodies.append(
        bucket, path, AppendRequest(OCTET, b"", False), len(data), chunked(data)
    )


class SimulatedCrash(Exception):
    pass


@pytest.mark.parametrize("when", ["during-upload", "after-upload"])
def test_crash_around_the_upload_loses_nothing_and_leaves_no_orphan(config: Config, when: str) -> None:
    """The process dies mid-upload, or after the upload but before the reference is journaled."""
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    before = body_of(THRESHOLD + 99, 0)
    data = body_of(THRESHOLD * 4, 1)

    async def dying(data: bytes) -> AsyncIterator[bytes]:
        half = len(data) // 2
        yield data[:half]
        h.s.journal.failed = SimulatedCrash("the process died")  # nothing journaled from here on
        if when == "during-upload":
            raise SimulatedCrash("mid-upload")
        yield data[half:]

    async def body() -> None:
        await h.start()
        await h.create("default", "s")
        await large_append(h, "s", before)  # acknowledged: must survive
        [kept] = h.s.state.cold_objects
        with pytest.raises(Exception):  # noqa: B017 - the crash, or the refusal of a failed journal
            await h.s.large_bodies.append(
                "default", "s", AppendRequest(OCTET, b"", False), len(data), dying(data)
            )
        await h.crash()
        records = journal_records(config.data_path)
        [intent] = [r.key for r in records if isinstance(r, ColdCopyStarted) and r.key != kept]
        assert [r.key for r in records if isinstance(r, PayloadAppended)] == [kept]
        stored = await _keys_of(config)
        assert stored == ({kept, intent} if when == "after-upload" else {kept})
        await h.start()  # aborts the interrupted intent, as the flusher's run() does first
        assert h.s.state.copies_in_flight == {}
        assert await h.read("default", "s") == before
        started = key_time_ms(intent)
        assert started is not None
        report = await h.gc(started + GRACE_MS - 1)
        assert report.orphans_deleted == 0
        report = await h.gc(started + GRACE_MS)
        assert report.orphans_deleted == (1 if when == "after-upload" else 0), report
        assert report.integrity_errors == [] and await stored_keys(h) == {kept}
        assert await h.read("default", "s") == before
        await h.stop()

    asyncio.run(body())


async def _keys_of(config: Config) -> set[str]:
    h = Harness(config)
    await h.start(abort_interrupted=False)
    try:
        return await stored_keys(h)
    finally:
        await h.crash()


def test_verify_checks_every_block_of_payload_objects(config: Config) -> None:
    if config.cold_store != "local":
        pytest.skip("damage is injected into the local store's file")
    h = Harness(config)
    data = body_of(2 * PAYLOAD_BLOCK_BYTES + 3, 1)

    async def body() -> None:
        await h.start()
        await h.create("default", "s", b"hot;")
        await large_append(h, "s", data)
        await h.flush()
        store = h.s.store
        assert store is not None
        report = await verify_cold(h.s.state, store)
        assert report.errors == [] and report.objects == 2  # the flushed Parquet object and the payload
        [key] = [k for k in h.s.state.cold_objects if is_payload_key(k)]
        path = config.data_path / "cold" / key
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x80
        path.write_bytes(bytes(raw))
        report = await verify_cold(h.s.state, store)
        assert len(report.errors) == 1 and key in report.errors[0] and "block 2" in report.errors[0]
        await h.stop()

    asyncio.run(body())


def test_digest_blocks() -> None:
    data = body_of(2 * PAYLOAD_BLOCK_BYTES + 1, 1)
    d = digest_of(data)
    assert d.size == len(data) and len(d.block_crcs) == 3
    assert digest_of(b"").block_crcs == ()
