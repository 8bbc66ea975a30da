"""Object-store layer: one behavioural suite run against every backend.

The `backend` fixture runs each scenario against LocalDirStore (on tmp_path)
and S3Store (against moto's HTTP server, each test under its own key prefix),
so the two stay interchangeable. Backend-specific guarantees (crash-safe
publishing on disk; ambiguity handling, multipart aborts and outage behaviour
on S3) and the pure retry policy are tested separately below.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from hypothesis import given
from hypothesis import strategies as st

from tests.support.deadlines import Deadline
from tests.support.s3_server import S3Endpoint
from tiered.cold.objects.localdir import STAGING_DIR, LocalDirStore
from tiered.cold.objects.retry import RetryPolicy
from tiered.cold.objects.s3 import MIN_PART_SIZE, S3Store, is_retryable
from tiered.cold.objects.store import (
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
    ReadOnlyStore,
)

pytestmark = pytest.mark.timeout(60)

Scenario = Callable[[Any], Awaitable[None]]

MULTIPART_THRESHOLD = 64 * 1024
FAST_RETRY = RetryPolicy(attempts=3, base=0.01, cap=0.05)
# Bytes 0..255 repeated: every byte value, and any misplaced offset shows.
PATTERN = bytes(range(256)) * 4


async def _open_s3(endpoint: S3Endpoint, **options: Any) -> S3Store:
    options.setdefault("retry", FAST_RETRY)
    store = S3Store(
        endpoint.bucket,
        prefix=f"t-{uuid.uuid4().hex}",
        endpoint_url=endpoint.url,
        region=endpoint.region,
        path_style=True,
        connect_timeout=2,
        read_timeout=10,
        **options,
    )
    return await store.open()


def _run_s3(endpoint: S3Endpoint, scenario: Callable[[S3Store], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        store = await _open_s3(endpoint, **options)
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


class Backend:
    """Runs an async scenario against a freshly opened store of one kind."""

    def __init__(self, name: str, request: pytest.FixtureRequest, tmp_path: Any) -> None:
        self.name = name
        self._request = request
        self._tmp_path = tmp_path

    def run(self, scenario: Scenario, **s3_options: Any) -> None:
        """`s3_options` tune S3Store (page size, multipart); LocalDirStore needs none."""
        if self.name == "s3":
            _run_s3(self._request.getfixturevalue("moto_s3"), scenario, **s3_options)
            return

        async def main() -> None:
            async with LocalDirStore(self._tmp_path / "objects") as store:
                await scenario(store)

        asyncio.run(main())


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    return Backend(request.param, request, tmp_path)


async def _keys(store: Any, prefix: str = "") -> list[str]:
    return [info.key async for info in store.list(prefix)]


# -- shared behavioural suite --------------------------------------------------


def test_backends_satisfy_protocol(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        assert isinstance(store, ObjectStore)

    backend.run(scenario)


def test_put_get_is_byte_exact(backend: Backend) -> None:
    data = PATTERN + os.urandom(4096) + b"\x00\r\n"

    async def scenario(store: Any) -> None:
        info = await store.put("seg/0001.bin", data)
        assert (info.key, info.size) == ("seg/0001.bin", len(data))
        assert info.last_modified.tzinfo is not None
        assert await store.get("seg/0001.bin") == data
        head = await store.head("seg/0001.bin")
        assert head is not None
        assert (head.key, head.size, head.etag) == (info.key, info.size, info.etag)

    backend.run(scenario)


def test_empty_object(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        info = await store.put("empty", b"")
        assert info.size == 0
        assert await store.get("empty") == b""
        assert await store.get("empty", start=0, end=10) == b""
        assert await store.get("empty", start=3) == b""

    backend.run(scenario)


RANGES = [
    (0, 1),  # first byte
    (500, 600),  # middle
    (1023, 1024),  # last byte
    (None, None),  # whole object
    (0, None),
    (None, 10),
    (1000, None),  # tail
    (1020, 5000),  # end clamped to the size
    (1024, None),  # starts exactly at the end
    (2000, 3000),  # entirely past the end
    (7, 7),  # empty
]


def test_ranged_get_is_half_open_like_slices(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        await store.put("r", PATTERN)
        for start, end in RANGES:
            got = await store.get("r", start=start, end=end)
            assert got == PATTERN[start:end], (start, end)

    backend.run(scenario)


def test_invalid_ranges_are_rejected(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        await store.put("r", PATTERN)
        for start, end in [(-1, None), (None, -1), (5, 3)]:
            with pytest.raises(ValueError):
                await store.get("r", start=start, end=end)

    backend.run(scenario)


def test_get_missing_raises_not_found(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        for start, end in [(None, None), (0, 10), (5, None), (3, 3)]:
            with pytest.raises(ObjectNotFound):
                await store.get("missing/key", start=start, end=end)

    backend.run(scenario)


def test_head_missing_returns_none(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        assert await store.head("missing") is None
        assert await store.head("missing/deeper/key") is None

    backend.run(scenario)


def test_conditional_create_refuses_overwrite(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        first = await store.put("k", b"first")
        with pytest.raises(ObjectExists):
            await store.put("k", b"second")
        # Without an ambiguous failure even identical bytes are a conflict.
        with pytest.raises(ObjectExists):
            await store.put("k", b"first")
        assert await store.get("k") == b"first"
        head = await store.head("k")
        assert head is not None and head.etag == first.etag

    backend.run(scenario)


def test_unconditional_put_replaces(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        first = await store.put("k", b"first")
        second = await store.put("k", b"second!", if_none_match=False)
        assert second.size == 7 and second.etag != first.etag
        assert await store.get("k") == b"second!"
        # Unconditional put also creates.
        await store.put("fresh", b"x", if_none_match=False)
        assert await store.get("fresh") == b"x"

    backend.run(scenario)


def test_concurrent_conditional_creates_have_one_winner(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        bodies = [f"writer-{i}".encode() for i in range(8)]
        results = await asyncio.gather(*(store.put("race", body) for body in bodies), return_exceptions=True)
        winners = [bodies[i] for i, r in enumerate(results) if isinstance(r, ObjectInfo)]
        assert len(winners) == 1, results
        assert all(isinstance(r, ObjectExists) for r in results if not isinstance(r, ObjectInfo))
        assert await store.get("race") == winners[0]

    backend.run(scenario)


def test_compare_and_set_replaces_only_the_version_read(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        v1 = await store.put("cas", b"v1")
        read = await store.get_with_info("cas")
        assert read.data == b"v1" and read.info.etag == v1.etag and read.info.size == 2
        v2 = await store.put("cas", b"v2!", if_match=read.info.etag)
        assert v2.etag != v1.etag and v2.size == 3
        head = await store.head("cas")
        assert head is not None and head.etag == v2.etag
        # The version read is gone: a second writer holding its ETag loses.
        with pytest.raises(PreconditionFailed) as lost:
            await store.put("cas", b"stale", if_match=v1.etag)
        assert lost.value.outcome_unknown is False
        # Quoted ETags (as S3 sends them) work too.
        v3 = await store.put("cas", b"v3", if_match=f'"{v2.etag}"')
        assert (await store.get_with_info("cas")).info.etag == v3.etag
        assert await store.get("cas") == b"v3"

    backend.run(scenario)


def test_compare_and_set_needs_an_object(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        with pytest.raises(PreconditionFailed):
            await store.put("absent", b"x", if_match="0123456789abcdef")
        assert await store.head("absent") is None
        with pytest.raises(ObjectNotFound):
            await store.get_with_info("absent")
        # A deleted object's ETag no longer matches anything.
        gone = await store.put("gone", b"x")
        await store.delete("gone")
        with pytest.raises(PreconditionFailed):
            await store.put("gone", b"y", if_match=gone.etag)
        assert await store.head("gone") is None

    backend.run(scenario)


def test_concurrent_compare_and_sets_have_one_winner(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        base = await store.put("lease", b"free")
        bodies = [f"holder-{i}".encode() for i in range(8)]
        results = await asyncio.gather(
            *(store.put("lease", body, if_match=base.etag) for body in bodies), return_exceptions=True
        )
        winners = [bodies[i] for i, r in enumerate(results) if isinstance(r, ObjectInfo)]
        assert len(winners) == 1, results
        assert all(isinstance(r, PreconditionFailed) for r in results if not isinstance(r, ObjectInfo))
        assert await store.get("lease") == winners[0]

    backend.run(scenario)


def test_delete_is_idempotent(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        await store.put("a/b/c", b"data")
        await store.delete("a/b/c")
        assert await store.head("a/b/c") is None
        await store.delete("a/b/c")  # already gone
        await store.delete("never/existed")
        # The key is free again for a conditional create.
        await store.put("a/b/c", b"again")
        assert await store.get("a/b/c") == b"again"

    backend.run(scenario)


def test_delete_many(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        for i in range(5):
            await store.put(f"d/{i}", b"x" * i)
        failures = await store.delete_many(["d/0", "d/2", "d/4", "d/missing", "d/2"])
        assert failures == []
        assert await _keys(store, "d/") == ["d/1", "d/3"]
        assert await store.delete_many([]) == []

    backend.run(scenario)


def test_delete_many_validates_before_deleting(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        await store.put("keep", b"x")
        with pytest.raises(InvalidKey):
            await store.delete_many(["keep", "../escape"])
        assert await store.head("keep") is not None

    backend.run(scenario)


def test_list_by_prefix_across_pages(backend: Backend) -> None:
    keys = [f"seg/a/{i:03d}" for i in range(7)] + ["seg/ab", "seg/b/1", "other/x"]

    async def scenario(store: Any) -> None:
        for key in reversed(keys):
            await store.put(key, key.encode())
        # Seven keys under "seg/a/" with pages of two: four round trips on S3.
        infos = [info async for info in store.list("seg/a/")]
        assert [i.key for i in infos] == sorted(k for k in keys if k.startswith("seg/a/"))
        assert all(i.size == len(i.key) for i in infos)
        # Prefixes need not end at a '/'.
        assert await _keys(store, "seg/a") == sorted(k for k in keys if k.startswith("seg/a"))
        assert await _keys(store) == sorted(keys)
        assert await _keys(store, "seg/") == sorted(k for k in keys if k.startswith("seg/"))
        assert await _keys(store, "nothing/") == []
        assert await _keys(store, "seg/a/00") == [f"seg/a/{i:03d}" for i in range(7)]

    backend.run(scenario, list_page_size=2)


def test_list_order_is_utf8_byte_order(backend: Backend) -> None:
    # '-' < '/' < '0' < 'B' < 'a' < 'é' in UTF-8 byte order, like S3.
    keys = ["a/b", "a-c", "a0", "B", "é", "a/bc"]

    async def scenario(store: Any) -> None:
        for key in keys:
            await store.put(key, b".")
        assert await _keys(store) == sorted(keys, key=lambda k: k.encode())

    backend.run(scenario)


def test_list_info_matches_head(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        put = await store.put("x/1", b"hello")
        [listed] = [info async for info in store.list("x/")]
        assert (listed.key, listed.size, listed.etag) == ("x/1", 5, put.etag)
        assert listed.last_modified.tzinfo is not None

    backend.run(scenario)


def test_unicode_and_odd_keys(backend: Backend) -> None:
    keys = ["ünï/cödé ✓.bin", "spaces in/name", "plus+and=eq", "pct%20lit"]

    async def scenario(store: Any) -> None:
        for key in keys:
            await store.put(key, key.encode())
        for key in keys:
            assert await store.get(key) == key.encode()
        assert await _keys(store) == sorted(keys)

    backend.run(scenario)


BAD_KEYS = ["", "/abs", "a//b", "a/", "../x", "a/../b", "./a", "a/.", "a\\b", "a\x00b", "x" * 1025, "\udc80"]


def test_invalid_keys_are_rejected(backend: Backend) -> None:
    async def scenario(store: Any) -> None:
        for key in BAD_KEYS:
            with pytest.raises(InvalidKey):
                await store.put(key, b"x")
            with pytest.raises(InvalidKey):
                await store.get(key)
            with pytest.raises(InvalidKey):
                await store.head(key)
            with pytest.raises(InvalidKey):
                await store.delete(key)
        with pytest.raises(InvalidKey):
            await _keys(store, "../")
        assert await _keys(store) == []

    backend.run(scenario)


def test_multipart_sized_body_roundtrips(backend: Backend) -> None:
    # Above the test threshold: two parts on S3 (5 MiB + remainder).
    body = os.urandom(MIN_PART_SIZE + 1234)

    async def scenario(store: Any) -> None:
        info = await store.put("big/blob", body)
        assert info.size == len(body)
        assert await store.get("big/blob") == body
        boundary = MIN_PART_SIZE
        assert (
            await store.get("big/blob", start=boundary - 10, end=boundary + 10)
            == body[boundary - 10 : boundary + 10]
        )
        head = await store.head("big/blob")
        assert head is not None and head.size == len(body) and head.etag == info.etag
        if backend.name == "s3":
            assert info.etag.endswith("-2"), "expected a two-part multipart upload"
        with pytest.raises(ObjectExists):
            await store.put("big/blob", body[::-1])
        assert await store.get("big/blob", start=0, end=64) == body[:64]

    backend.run(scenario, multipart_threshold=MULTIPART_THRESHOLD, part_size=MIN_PART_SIZE)


# -- LocalDirStore specifics -----------------------------------------------------


def _run_local(root: Any, scenario: Callable[[LocalDirStore], Awaitable[None]]) -> None:
    async def main() -> None:
        async with LocalDirStore(root) as store:
            await scenario(store)

    asyncio.run(main())


def test_local_reserved_and_overlong_keys(tmp_path: Any) -> None:
    async def scenario(store: LocalDirStore) -> None:
        for key in [f"{STAGING_DIR}/x", STAGING_DIR, "a/" + "n" * 256]:
            with pytest.raises(InvalidKey):
                await store.put(key, b"x")
        await store.put("a/" + "n" * 255, b"ok")  # NAME_MAX itself is fine
        await store.put(f"a/{STAGING_DIR}", b"only reserved at the top")

    _run_local(tmp_path, scenario)


def test_local_key_cannot_be_object_and_prefix(tmp_path: Any) -> None:
    async def scenario(store: LocalDirStore) -> None:
        await store.put("a", b"file")
        with pytest.raises(ObjectStoreError) as raised:
            await store.put("a/b", b"nested")
        assert not isinstance(raised.value, ObjectExists)
        assert await store.head("a/b") is None
        with pytest.raises(ObjectNotFound):
            await store.get("a/b")
        await store.put("d/e", b"nested")
        with pytest.raises(ObjectStoreError) as raised:
            await store.put("d", b"file")
        assert not isinstance(raised.value, ObjectExists)
        assert await store.head("d") is None
        with pytest.raises(ObjectNotFound):
            await store.get("d")
        await store.delete("d")  # a directory is not an object: no-op
        assert await store.get("d/e") == b"nested"

    _run_local(tmp_path, scenario)


def test_local_publish_leaves_no_temp_files(tmp_path: Any) -> None:
    async def scenario(store: LocalDirStore) -> None:
        await store.put("k", b"1")
        with pytest.raises(ObjectExists):
            await store.put("k", b"2")
        await store.put("k", b"3", if_none_match=False)
        assert os.listdir(tmp_path / STAGING_DIR) == []
        assert (tmp_path / "k").read_bytes() == b"3"
        assert await _keys(store) == ["k"]  # staging is never listed

    _run_local(tmp_path, scenario)


def test_local_delete_prunes_empty_directories(tmp_path: Any) -> None:
    async def scenario(store: LocalDirStore) -> None:
        await store.put("p/q/r/1", b"x")
        await store.put("p/keep", b"y")
        await store.delete("p/q/r/1")
        assert not (tmp_path / "p" / "q").exists()
        assert (tmp_path / "p" / "keep").exists()

    _run_local(tmp_path, scenario)


def test_local_sweeps_stale_staging_files(tmp_path: Any) -> None:
    staging = tmp_path / STAGING_DIR
    staging.mkdir()
    stale, fresh = staging / "old.tmp", staging / "new.tmp"
    stale.write_bytes(b"crashed writer")
    fresh.write_bytes(b"in flight")
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    LocalDirStore(tmp_path)
    assert sorted(os.listdir(staging)) == ["new.tmp"]


def test_local_closed_store_refuses_work(tmp_path: Any) -> None:
    async def scenario() -> None:
        store = LocalDirStore(tmp_path)
        await store.close()
        with pytest.raises(ObjectStoreError):
            await store.put("k", b"x")
        with pytest.raises(ObjectStoreError):
            await _keys(store)

    asyncio.run(scenario())


def _increment_with_compare_and_set(root: str, times: int) -> int:
    """In a separate process: add 1 to the counter object ``times`` times; returns the lost races."""

    async def main() -> int:
        lost = 0
        async with LocalDirStore(root) as store:
            done = 0
            while done < times:
                current = await store.get_with_info("counter")
                try:
                    await store.put("counter", b"%d" % (int(current.data) + 1), if_match=current.info.etag)
                    done += 1
                except PreconditionFailed:
                    lost += 1
        return lost

    return asyncio.run(main())


def test_local_compare_and_set_is_atomic_across_processes(tmp_path: Any) -> None:
    """Four processes increment one counter by read-modify-write: no update is lost."""
    import multiprocessing

    asyncio.run(_put_once(tmp_path, "counter", b"0"))
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        lost = pool.starmap(_increment_with_compare_and_set, [(str(tmp_path), 25)] * 4)
    assert (tmp_path / "counter").read_bytes() == b"100"
    print(f"lost compare-and-set races: {lost}")


async def _put_once(root: Any, key: str, data: bytes) -> None:
    async with LocalDirStore(root) as store:
        await store.put(key, data)


def test_local_compare_and_set_and_delete_exclude_each_other(tmp_path: Any) -> None:
    """A delete cannot slip between a compare-and-set's check and its replace."""

    async def scenario(store: LocalDirStore) -> None:
        for round_ in range(30):
            info = await store.put("k", b"%d" % round_)
            results = await asyncio.gather(
                store.put("k", b"replaced", if_match=info.etag), store.delete("k"), return_exceptions=True
            )
            replaced, deleted = results
            assert deleted is None, results
            # Either the delete came first (the compare-and-set finds nothing) or the
            # replace did (and the delete removes it): never a replace that re-creates
            # the object after the delete.
            assert isinstance(replaced, (ObjectInfo, PreconditionFailed)), results
            assert await store.head("k") is None

    _run_local(tmp_path, scenario)


def test_read_only_store_refuses_compare_and_set(tmp_path: Any) -> None:
    async def scenario(store: LocalDirStore) -> None:
        info = await store.put("k", b"x")
        read_only = ReadOnlyStore(store)
        with pytest.raises(ObjectStoreError, match="read-only"):
            await read_only.put("k", b"y", if_match=info.etag)
        found = await read_only.get_with_info("k")
        assert found.data == b"x" and found.info.etag == info.etag

    _run_local(tmp_path, scenario)


def test_local_io_runs_off_the_event_loop(tmp_path: Any) -> None:
    """A slow disk must not stall other tasks: heartbeats keep ticking during I/O."""

    async def scenario(store: LocalDirStore) -> None:
        ticks = 0
        stop = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        beat = asyncio.create_task(heartbeat())
        await store.put("big", os.urandom(32 * 1024 * 1024))
        await store.get("big")
        stop.set()
        await beat
        assert ticks > 10

    _run_local(tmp_path, scenario)


# -- S3Store specifics -------------------------------------------------------------


def _raise_once(exc_factory: Callable[[], Exception]) -> Callable[..., None]:
    """An event hook that raises once, then lets requests through."""
    fired = []

    def hook(**_: Any) -> None:
        if not fired:
            fired.append(True)
            raise exc_factory()

    return hook


def _timeout() -> Exception:
    return ReadTimeoutError(endpoint_url="http://simulated")


def _incomplete_uploads(endpoint: S3Endpoint, store: S3Store) -> list[dict[str, Any]]:
    client = boto3.client("s3", endpoint_url=endpoint.url, region_name=endpoint.region)
    resp = client.list_multipart_uploads(Bucket=endpoint.bucket, Prefix=store.prefix)
    return list(resp.get("Uploads", []))


def test_s3_lost_put_response_counts_as_success(moto_s3: S3Endpoint) -> None:
    """The PUT lands but its response is lost; the retry's 412 is our own object."""

    async def scenario(store: S3Store) -> None:
        store._s3.meta.events.register("after-call.s3.PutObject", _raise_once(_timeout))
        info = await store.put("k", b"payload")
        assert info.size == 7
        assert await store.get("k") == b"payload"

    _run_s3(moto_s3, scenario)


def test_s3_ambiguous_retry_does_not_claim_someone_elses_object(moto_s3: S3Endpoint) -> None:
    """The first attempt fails in flight; the retry's 412 is a different object."""

    async def scenario(store: S3Store) -> None:
        await store.put("k", b"theirs")
        store._s3.meta.events.register("before-send.s3.PutObject", _raise_once(_timeout))
        with pytest.raises(ObjectExists):
            await store.put("k", b"ours!!")  # same size, different bytes
        assert await store.get("k") == b"theirs"

    _run_s3(moto_s3, scenario)


def test_s3_lost_complete_response_counts_as_success(moto_s3: S3Endpoint) -> None:
    body = os.urandom(MIN_PART_SIZE + 10)

    async def scenario(store: S3Store) -> None:
        hook = _raise_once(_timeout)
        store._s3.meta.events.register("after-call.s3.CompleteMultipartUpload", hook)
        info = await store.put("big", body)
        assert info.size == len(body)
        assert await store.get("big") == body
        assert _incomplete_uploads(moto_s3, store) == []

    _run_s3(moto_s3, scenario, multipart_threshold=MULTIPART_THRESHOLD)


def test_s3_failed_multipart_is_aborted(moto_s3: S3Endpoint) -> None:
    body = os.urandom(MIN_PART_SIZE + 10)

    def denied() -> Exception:
        error = {
            "Error": {"Code": "AccessDenied", "Message": "no"},
            "ResponseMetadata": {"HTTPStatusCode": 403},
        }
        return ClientError(error, "UploadPart")

    async def scenario(store: S3Store) -> None:
        store._s3.meta.events.register("before-send.s3.UploadPart", _raise_once(denied))
        with pytest.raises(ObjectStoreError) as raised:
            await store.put("big", body)
        assert not isinstance(raised.value, ObjectStoreUnavailable)
        assert _incomplete_uploads(moto_s3, store) == []
        assert await store.head("big") is None
        # A conflicting multipart create is aborted too.
        await store.put("big", body)
        with pytest.raises(ObjectExists):
            await store.put("big", body[::-1])
        assert _incomplete_uploads(moto_s3, store) == []

    _run_s3(moto_s3, scenario, multipart_threshold=MULTIPART_THRESHOLD)


def test_s3_cancelled_multipart_is_aborted(moto_s3: S3Endpoint) -> None:
    async def stall(**_: Any) -> None:
        await asyncio.sleep(30)

    async def scenario(store: S3Store) -> None:
        store._s3.meta.events.register("before-send.s3.UploadPart", stall)
        upload = asyncio.create_task(store.put("big", os.urandom(MIN_PART_SIZE + 10)))
        deadline = Deadline(10)
        while not _incomplete_uploads(moto_s3, store):  # until it started; its first part stalls
            assert not deadline.expired(), f"the multipart upload did not start within {deadline}"
            await asyncio.sleep(0.05)
        assert len(_incomplete_uploads(moto_s3, store)) == 1
        upload.cancel()
        with pytest.raises(asyncio.CancelledError):
            await upload
        assert _incomplete_uploads(moto_s3, store) == []

    _run_s3(moto_s3, scenario, multipart_threshold=MULTIPART_THRESHOLD)


def test_s3_transient_errors_are_retried(moto_s3: S3Endpoint, caplog: pytest.LogCaptureFixture) -> None:
    def slow_down() -> Exception:
        error = {"Error": {"Code": "SlowDown", "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": 503}}
        return ClientError(error, "GetObject")

    async def scenario(store: S3Store) -> None:
        await store.put("k", b"v")
        store._s3.meta.events.register("before-send.s3.GetObject", _raise_once(slow_down))
        store._s3.meta.events.register(
            "before-send.s3.ListObjectsV2", _raise_once(lambda: EndpointConnectionError(endpoint_url="x"))
        )
        assert await store.get("k") == b"v"
        assert await _keys(store) == ["k"]

    with caplog.at_level(logging.WARNING, logger="tiered.cold.objects.s3"):
        _run_s3(moto_s3, scenario)
    assert sum("retry 1" in r.getMessage() for r in caplog.records) == 2


def test_s3_delete_many_batches_by_1000(moto_s3: S3Endpoint) -> None:
    async def scenario(store: S3Store) -> None:
        calls: list[int] = []
        store._s3.meta.events.register(
            "provide-client-params.s3.DeleteObjects",
            lambda params, **_: calls.append(len(params["Delete"]["Objects"])),
        )
        await store.put("gone/0", b"x")
        keys = [f"gone/{i}" for i in range(2500)]
        assert await store.delete_many(keys) == []
        assert calls == [1000, 1000, 500]
        assert await store.head("gone/0") is None

    _run_s3(moto_s3, scenario)


def test_s3_keys_live_under_the_prefix(moto_s3: S3Endpoint) -> None:
    async def scenario(store: S3Store) -> None:
        await store.put("a/b", b"x")
        client = boto3.client("s3", endpoint_url=moto_s3.url, region_name=moto_s3.region)
        listed = client.list_objects_v2(Bucket=moto_s3.bucket, Prefix=store.prefix)
        assert [o["Key"] for o in listed["Contents"]] == [f"{store.prefix}a/b"]
        assert store.prefix.endswith("/")

    _run_s3(moto_s3, scenario)


def test_s3_unopened_store_fails_clearly() -> None:
    async def scenario() -> None:
        with pytest.raises(ObjectStoreError, match="not open"):
            await S3Store("bucket").get("k")

    asyncio.run(scenario())


def test_s3_constructor_takes_no_secrets_and_validates() -> None:
    names = set(inspect.signature(S3Store).parameters)
    assert not {n for n in names if "secret" in n or "access_key" in n or "token" in n}
    with pytest.raises(ValueError):
        S3Store("bucket", part_size=MIN_PART_SIZE - 1)
    with pytest.raises(ValueError):
        S3Store("bucket", list_page_size=1001)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port that accepts TCP connections but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


OUTAGE_RETRY = RetryPolicy(attempts=2, base=0.01, cap=0.02)


def _outage_store(port: int, timeout: float) -> S3Store:
    return S3Store(
        "bucket",
        endpoint_url=f"http://127.0.0.1:{port}",
        region="us-east-1",
        path_style=True,
        retry=OUTAGE_RETRY,
        connect_timeout=timeout,
        read_timeout=timeout,
    )


async def _assert_unavailable(store: S3Store, ops: list[Callable[[], Awaitable[object]]]) -> None:
    sends: list[str] = []
    store._s3.meta.events.register("before-send.s3", lambda **_: sends.append("send"))
    for op in ops:
        with pytest.raises(ObjectStoreUnavailable):
            await op()
    # Exactly our two attempts per operation: botocore does not retry on its own.
    assert len(sends) == 2 * len(ops)


def test_s3_outage_on_closed_port_fails_fast(aws_test_env: None) -> None:
    async def scenario() -> None:
        async with _outage_store(_closed_port(), timeout=0.5) as store:
            await _assert_unavailable(
                store,
                [
                    lambda: store.put("k", b"x"),
                    lambda: store.get("k", start=1, end=2),
                    lambda: store.head("k"),
                    lambda: store.delete("k"),
                    lambda: store.delete_many(["k"]),
                    lambda: _keys(store),
                ],
            )

    started = time.monotonic()
    asyncio.run(scenario())
    assert time.monotonic() - started < 5


def test_s3_outage_on_silent_server_times_out(aws_test_env: None, blackhole: int) -> None:
    """Connections succeed but no byte ever comes back: read timeouts must fire,
    for uploads too (they must not wait forever for "100 Continue")."""

    async def scenario() -> None:
        async with _outage_store(blackhole, timeout=0.15) as store:
            await _assert_unavailable(
                store, [lambda: store.put("k", b"x"), lambda: store.get("k"), lambda: _keys(store)]
            )

    started = time.monotonic()
    asyncio.run(scenario())
    # Three operations x two attempts x 0.15 s, plus tiny backoffs.
    assert time.monotonic() - started < 5


def test_s3_attempt_timeout_bounds_any_stall(moto_s3: S3Endpoint) -> None:
    """A wait the transport leaves unbounded is still cut off per attempt."""

    async def stall(**_: Any) -> None:
        await asyncio.sleep(30)

    async def scenario(store: S3Store) -> None:
        store._s3.meta.events.register("before-send.s3.HeadObject", stall)
        started = time.monotonic()
        with pytest.raises(ObjectStoreUnavailable):
            await store.head("k")
        assert time.monotonic() - started < 3

    _run_s3(moto_s3, scenario, attempt_timeout=0.2, retry=OUTAGE_RETRY)


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        (_client_error("SlowDown", 503), True),
        (_client_error("ServiceUnavailable", 503), True),
        (_client_error("InternalError", 500), True),
        (_client_error("RequestTimeout", 400), True),
        (_client_error("ThrottlingException", 400), True),
        (_client_error("TooManyRequests", 429), True),
        (_client_error("ConditionalRequestConflict", 409), True),
        (_client_error("NotImplemented", 501), False),
        (_client_error("NoSuchKey", 404), False),
        (_client_error("PreconditionFailed", 412), False),
        (_client_error("AccessDenied", 403), False),
        (ReadTimeoutError(endpoint_url="x"), True),
        (EndpointConnectionError(endpoint_url="x"), True),
        (TimeoutError(), True),
        (ValueError("bug"), False),
    ],
)
def test_s3_retry_classification(error: Exception, retry: bool) -> None:
    assert is_retryable(error) is retry


# -- retry policy (pure, no I/O) -----------------------------------------------------


def test_backoff_window_doubles_then_caps() -> None:
    policy = RetryPolicy(attempts=10, base=0.1, cap=1.0)
    assert [policy.window(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert policy.window(100_000) == 1.0  # no overflow for absurd retry counts


def test_backoff_is_full_jitter() -> None:
    policy = RetryPolicy(base=1.0, cap=8.0)
    assert policy.delay(2, rand=lambda: 0.0) == 0.0
    assert policy.delay(2, rand=lambda: 0.5) == 2.0
    assert policy.delay(5, rand=lambda: 0.999) == pytest.approx(7.992)


@given(
    retry=st.integers(min_value=0, max_value=200),
    base=st.floats(min_value=0, max_value=10),
    cap=st.floats(min_value=0, max_value=60),
    r=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_delay_stays_within_window(retry: int, base: float, cap: float, r: float) -> None:
    policy = RetryPolicy(base=base, cap=cap)
    delay = policy.delay(retry, rand=lambda: r)
    assert 0 <= delay <= min(cap, base * 2**retry)


class _Flaky:
    """An operation that fails with the given errors, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _run_policy(policy: RetryPolicy, op: _Flaky, retryable: Callable[[Exception], bool]) -> tuple[Any, list]:
    sleeps: list[float] = []
    seen: list[tuple[str, int, float]] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    async def main() -> Any:
        return await policy.run(
            op,
            retryable=retryable,
            on_retry=lambda exc, n, d: seen.append((str(exc), n, d)),
            sleep=sleep,
            rand=lambda: 0.5,
        )

    try:
        result: Any = asyncio.run(main())
    except Exception as exc:  # returned so tests can assert on it
        result = exc
    assert [d for _, _, d in seen] == sleeps
    return result, seen


def test_retry_until_success() -> None:
    op = _Flaky(OSError("a"), OSError("b"))
    result, seen = _run_policy(RetryPolicy(attempts=5, base=1, cap=10), op, lambda e: True)
    assert result == "ok" and op.calls == 3
    assert seen == [("a", 1, 0.5), ("b", 2, 1.0)]


def test_retry_gives_up_after_attempts_with_last_error() -> None:
    op = _Flaky(OSError("1"), OSError("2"), OSError("3"), OSError("4"))
    result, seen = _run_policy(RetryPolicy(attempts=3, base=1, cap=10), op, lambda e: True)
    assert isinstance(result, OSError) and str(result) == "3"
    assert op.calls == 3 and len(seen) == 2


def test_non_retryable_error_is_raised_immediately() -> None:
    op = _Flaky(KeyError("fatal"), OSError("never reached"))
    result, seen = _run_policy(RetryPolicy(attempts=5), op, lambda e: isinstance(e, OSError))
    assert isinstance(result, KeyError) and op.calls == 1 and seen == []


def test_single_attempt_never_sleeps() -> None:
    op = _Flaky(OSError("x"))
    result, seen = _run_policy(RetryPolicy(attempts=1), op, lambda e: True)
    assert isinstance(result, OSError) and op.calls == 1 and seen == []


def test_cancellation_is_not_retried() -> None:
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError

    async def main() -> None:
        await RetryPolicy(attempts=5, base=0).run(op, retryable=lambda e: True)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert calls == 1


def test_retry_policy_validates() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base=-1)
