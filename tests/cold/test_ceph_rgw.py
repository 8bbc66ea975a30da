"""S3Store against a real S3-compatible store: Ceph RADOS Gateway on loopback.

Every operation the service relies on runs against the gateway over HTTP and
over HTTPS (verified against the harness's throwaway CA). The conditional
writes (If-None-Match create, If-Match compare-and-set, the probe) also run
against moto, so both a store that behaves like AWS and one that does not
are covered. The gateway's measured quirks, each pinned by a test here:

* `If-Match` matches only the bare ETag, not the quoted one S3 returns;
* `If-None-Match`/`If-Match` on CompleteMultipartUpload are ignored;
* CompleteMultipartUpload answers with an empty ETag;
* over HTTPS, botocore's default aws-chunked checksum trailers get 411;
* `If-Match` on a missing key is 412 (AWS and moto: 404).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ReadTimeoutError

from tests.support import ceph_rgw as rgw
from tests.support import http_helpers as http
from tests.support import s3_server
from tests.support.deadlines import scaled
from tests.support.server_process import ServerProcess
from tiered.cold.objects.backends import open_object_store
from tiered.cold.objects.retry import RetryPolicy
from tiered.cold.objects.s3 import MIN_PART_SIZE, PROBE_KEY_PREFIX, ConditionalWriteSupport, S3Store
from tiered.cold.objects.store import (
    ConditionalWritesUnsupported,
    ObjectExists,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
    ReadOnlyStore,
)

pytestmark = pytest.mark.timeout(300)

FAST_RETRY = RetryPolicy(attempts=3, base=0.01, cap=0.05)
MULTIPART_THRESHOLD = 64 * 1024
PATTERN = bytes(range(256)) * 4  # every byte value; a misplaced offset shows


@dataclass(frozen=True)
class Target:
    """One S3 endpoint: the gateway over HTTP or HTTPS, or moto."""

    name: str
    url: str
    bucket: str
    region: str
    ca_bundle: str | None

    @property
    def is_ceph(self) -> bool:
        return self.name.startswith("ceph")

    def store(self, **options: Any) -> S3Store:
        options.setdefault("retry", FAST_RETRY)
        options.setdefault("prefix", f"t-{uuid.uuid4().hex}")
        return S3Store(
            self.bucket,
            endpoint_url=self.url,
            region=self.region,
            addressing_style="path",
            ca_bundle=self.ca_bundle,
            connect_timeout=2,
            read_timeout=10,
            **options,
        )

    def run(self, scenario: Callable[[S3Store], Awaitable[None]], **options: Any) -> None:
        async def main() -> None:
            async with self.store(**options) as store:
                try:
                    await scenario(store)
                finally:
                    await _clean(store)

        asyncio.run(main())

    def raw_client(self) -> Any:
        """A plain boto3 client, to look at the bucket behind S3Store's back.

        A fresh session: boto3's default one caches the credentials it found first
        (another module's test credentials), not this test's environment.
        """
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            region_name=self.region,
            verify=self.ca_bundle,
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )


def _target(name: str, request: pytest.FixtureRequest) -> Target:
    request.getfixturevalue("aws_test_env")  # isolated AWS config, shared botocore loader
    if name == "moto":
        moto: s3_server.S3Endpoint = request.getfixturevalue("moto_s3")
        return Target(name, moto.url, moto.bucket, moto.region, None)
    endpoint: rgw.RGWEndpoint = request.getfixturevalue("ceph_rgw_env")
    tls = name == "ceph-https"
    return Target(
        name, endpoint.endpoint(tls), endpoint.bucket, endpoint.region, endpoint.ca_bundle if tls else None
    )


@pytest.fixture(params=["ceph-http", "ceph-https"])
def ceph(request: pytest.FixtureRequest) -> Target:
    """The gateway, over HTTP and over HTTPS."""
    return _target(request.param, request)


@pytest.fixture(params=["ceph-http", "ceph-https", "moto"])
def any_store(request: pytest.FixtureRequest) -> Target:
    """The gateway (HTTP, HTTPS) and moto."""
    return _target(request.param, request)


@pytest.fixture
def moto(request: pytest.FixtureRequest) -> Target:
    return _target("moto", request)


async def _clean(store: S3Store) -> None:
    """Tests share one bucket per store: leave nothing behind."""
    keys = [info.key async for info in store.list()]
    assert await store.delete_many(keys) == []


async def _keys(store: S3Store, prefix: str = "") -> list[str]:
    return [info.key async for info in store.list(prefix)]


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _multipart_etag(body: bytes, part_size: int) -> str:
    parts = [body[i : i + part_size] for i in range(0, len(body), part_size)]
    digest = hashlib.md5(b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts))
    return f"{digest.hexdigest()}-{len(parts)}"


def _raise_once(exc_factory: Callable[[], Exception]) -> Callable[..., None]:
    fired: list[bool] = []

    def hook(**_: Any) -> None:
        if not fired:
            fired.append(True)
            raise exc_factory()

    return hook


def _timeout() -> Exception:
    return ReadTimeoutError(endpoint_url="http://simulated")


def _ignore_headers(*names: str) -> Callable[..., None]:
    """A client hook that drops conditional parameters: a store that ignores the headers."""

    def hook(params: dict[str, Any], **_: Any) -> None:
        for name in names:
            params.pop(name, None)

    return hook


# -- the operations the service relies on (gateway, HTTP and HTTPS) ---------------------


def test_put_get_head_single(ceph: Target) -> None:
    data = PATTERN + os.urandom(4096) + b"\x00\r\n"

    async def scenario(store: S3Store) -> None:
        info = await store.put("seg/0001.bin", data)
        assert (info.key, info.size, info.etag) == ("seg/0001.bin", len(data), _md5(data))
        assert info.last_modified.tzinfo is not None
        assert await store.get("seg/0001.bin") == data
        head = await store.head("seg/0001.bin")
        assert head is not None
        assert (head.key, head.size, head.etag) == ("seg/0001.bin", len(data), _md5(data))
        assert await store.head("seg/missing") is None
        with pytest.raises(ObjectNotFound):
            await store.get("seg/missing")
        empty = await store.put("empty", b"")
        assert (empty.size, await store.get("empty"), await store.get("empty", start=0, end=5)) == (
            0,
            b"",
            b"",
        )

    ceph.run(scenario)


RANGES = [(0, 1), (500, 600), (1023, 1024), (None, None), (0, None), (None, 10), (1000, None),
          (1020, 5000), (1024, None), (2000, 3000), (7, 7)]  # fmt: skip


def test_ranged_get(ceph: Target) -> None:
    async def scenario(store: S3Store) -> None:
        await store.put("r", PATTERN)
        for start, end in RANGES:
            assert await store.get("r", start=start, end=end) == PATTERN[start:end], (start, end)
        with pytest.raises(ObjectNotFound):
            await store.get("missing", start=3, end=9)

    ceph.run(scenario)


def test_multipart_put(ceph: Target) -> None:
    """Two parts (5 MiB + remainder); the gateway's empty CompleteMultipartUpload ETag is read back by HEAD."""
    body = os.urandom(MIN_PART_SIZE + 1234)

    async def scenario(store: S3Store) -> None:
        heads: list[int] = []
        store._s3.meta.events.register("before-send.s3.HeadObject", lambda **_: heads.append(1))
        info = await store.put("big/blob", body)
        assert (info.size, info.etag) == (len(body), _multipart_etag(body, MIN_PART_SIZE))
        assert len(heads) == 1  # the ETag came from a HEAD: CompleteMultipartUpload's was empty
        head = await store.head("big/blob")
        assert head is not None and (head.size, head.etag) == (len(body), info.etag)
        assert await store.get("big/blob") == body
        boundary = MIN_PART_SIZE
        assert (
            await store.get("big/blob", start=boundary - 10, end=boundary + 10)
            == body[boundary - 10 : boundary + 10]
        )
        assert await store.get("big/blob", start=len(body) - 5) == body[-5:]
        # Unconditional multipart replace.
        again = await store.put("big/blob", body[::-1], if_none_match=False)
        assert again.etag == _multipart_etag(body[::-1], MIN_PART_SIZE)
        assert await store.get("big/blob", start=0, end=64) == body[::-1][:64]
        uploads = ceph.raw_client().list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix)
        assert uploads.get("Uploads", []) == []

    ceph.run(scenario, multipart_threshold=MULTIPART_THRESHOLD, part_size=MIN_PART_SIZE)


def test_list_with_pagination(ceph: Target) -> None:
    keys = [f"seg/a/{i:03d}" for i in range(7)] + ["seg/ab", "seg/b/1", "other/x", "é", "a-c", "a/b"]

    async def scenario(store: S3Store) -> None:
        for key in reversed(keys):
            await store.put(key, key.encode())
        pages: list[int] = []
        store._s3.meta.events.register("before-send.s3.ListObjectsV2", lambda **_: pages.append(1))
        infos = [info async for info in store.list("seg/a/")]
        assert len(pages) == 4  # seven keys, pages of two
        assert [i.key for i in infos] == [f"seg/a/{i:03d}" for i in range(7)]
        assert all(i.size == len(i.key.encode()) and i.etag == _md5(i.key.encode()) for i in infos)
        assert await _keys(store) == sorted(keys, key=lambda k: k.encode())
        assert await _keys(store, "seg/a") == sorted(k for k in keys if k.startswith("seg/a"))
        assert await _keys(store, "nothing/") == []

    ceph.run(scenario, list_page_size=2)


def test_delete_and_delete_many(ceph: Target) -> None:
    async def scenario(store: S3Store) -> None:
        for i in range(5):
            await store.put(f"d/{i}", b"x" * i)
        await store.delete("d/0")
        await store.delete("d/0")  # already gone
        await store.delete("never/existed")
        assert await store.head("d/0") is None
        assert await store.delete_many(["d/1", "d/3", "d/missing", "d/3"]) == []
        assert await _keys(store, "d/") == ["d/2", "d/4"]
        assert await store.delete_many([]) == []
        assert await store.delete_many(f"d/{i}" for i in range(5)) == []
        assert await _keys(store) == []
        await store.put("d/0", b"again")  # the key is free for a conditional create again
        assert await store.get("d/0") == b"again"

    ceph.run(scenario)


def test_corrupted_upload_is_refused(ceph: Target) -> None:
    """With an endpoint the default checksum mode sends Content-MD5, which the gateway verifies."""

    def corrupt(params: dict[str, Any], **_: Any) -> None:
        params["Body"] = b"X" + params["Body"][1:]

    async def scenario(store: S3Store) -> None:
        assert store.checksum_mode == "when_required"
        store._s3.meta.events.register("provide-client-params.s3.PutObject", corrupt)
        with pytest.raises(ObjectStoreError, match="BadDigest") as raised:
            await store.put("k", b"payload")
        assert not isinstance(raised.value, ObjectStoreUnavailable)
        assert await store.head("k") is None

    ceph.run(scenario)


def test_https_with_aws_chunked_checksums_is_refused_with_a_hint(ceph_rgw_env: rgw.RGWEndpoint) -> None:
    """botocore's default (checksum trailers over HTTPS) gets 411 from the gateway; the error says what to do."""
    target = Target(
        "ceph-https", ceph_rgw_env.tls_url, ceph_rgw_env.bucket, ceph_rgw_env.region, ceph_rgw_env.ca_bundle
    )

    async def scenario(store: S3Store) -> None:
        with pytest.raises(ObjectStoreError, match="checksum_mode='when_required'") as raised:
            await store.put("k", b"payload")
        assert "MissingContentLength" in str(raised.value)
        assert await store.head("k") is None

    target.run(scenario, checksum_mode="when_supported")


def test_http_with_flexible_checksums_works(ceph_rgw_env: rgw.RGWEndpoint) -> None:
    """Over plain HTTP botocore sends the CRC32 as a header, which the gateway takes."""
    target = Target("ceph-http", ceph_rgw_env.url, ceph_rgw_env.bucket, ceph_rgw_env.region, None)
    body = os.urandom(MIN_PART_SIZE + 10)

    async def scenario(store: S3Store) -> None:
        await store.put("small", b"payload")
        await store.put("big", body)
        assert (await store.get("small"), await store.get("big")) == (b"payload", body)

    target.run(
        scenario,
        checksum_mode="when_supported",
        multipart_threshold=MULTIPART_THRESHOLD,
        part_size=MIN_PART_SIZE,
    )


def test_tls_is_verified_against_the_ca_bundle(ceph_rgw_env: rgw.RGWEndpoint) -> None:
    untrusted = Target("ceph-https", ceph_rgw_env.tls_url, ceph_rgw_env.bucket, ceph_rgw_env.region, None)

    async def scenario(store: S3Store) -> None:
        with pytest.raises(ObjectStoreUnavailable, match="(?i)certificate verify failed"):
            await store.head("k")

    async def main() -> None:
        async with untrusted.store(retry=RetryPolicy(attempts=1)) as store:
            await scenario(store)

    asyncio.run(main())


def test_open_object_store_passes_the_options_on(ceph_rgw_env: rgw.RGWEndpoint, tmp_path: Path) -> None:
    endpoint = ceph_rgw_env
    options: dict[str, Any] = dict(
        local_root=tmp_path / "unused",
        s3_bucket=endpoint.bucket,
        s3_prefix=f"t-{uuid.uuid4().hex}",
        s3_endpoint=endpoint.tls_url,
        s3_region=endpoint.region,
        s3_ca_bundle=endpoint.ca_bundle,
    )

    async def main() -> None:
        store = await open_object_store("s3", s3_path_style=True, s3_probe_conditional_writes=True, **options)
        try:
            assert isinstance(store, S3Store)
            assert (store.addressing_style, store.checksum_mode) == ("path", "when_required")
            assert store.conditional_writes == ConditionalWriteSupport(True, "unquoted", False)
            assert await _keys(store) == []  # the probe cleaned up
            await store.put("k", b"over https")
        finally:
            await store.close()
        # Read-only (verify, dry runs) writes nothing, so it does not probe.
        reader = await open_object_store(
            "s3", s3_addressing_style="path", s3_probe_conditional_writes=True, read_only=True, **options
        )
        try:
            assert isinstance(reader, ReadOnlyStore)
            assert [info.key async for info in reader.list()] == ["k"]
            assert await reader.get("k") == b"over https"
        finally:
            await reader.close()
        cleaner = await open_object_store("s3", s3_addressing_style="path", **options)
        try:
            assert await cleaner.delete_many(["k"]) == []
        finally:
            await cleaner.close()
        with pytest.raises(ValueError, match="addressing_style"):
            await open_object_store("s3", s3_addressing_style="sideways", **options)
        with pytest.raises(ValueError, match="contradicts"):
            await open_object_store("s3", s3_path_style=True, s3_addressing_style="virtual", **options)
        with pytest.raises(ValueError, match="checksum_mode"):
            await open_object_store("s3", s3_checksum_mode="always", **options)

    asyncio.run(main())


# -- conditional writes (gateway over HTTP and HTTPS, and moto) ------------------------------


def test_if_none_match_create_refuses_overwrite(any_store: Target) -> None:
    async def scenario(store: S3Store) -> None:
        first = await store.put("k", b"first")
        with pytest.raises(ObjectExists):
            await store.put("k", b"second")
        with pytest.raises(ObjectExists):
            await store.put("k", b"first")  # identical bytes, no ambiguity: still a conflict
        assert await store.get("k") == b"first"
        head = await store.head("k")
        assert head is not None and head.etag == first.etag == _md5(b"first")

    any_store.run(scenario)


@pytest.mark.parametrize("probed", [False, True], ids=["learned", "probed"])
def test_if_match_compare_and_set(any_store: Target, probed: bool) -> None:
    async def scenario(store: S3Store) -> None:
        if probed:
            await store.probe_conditional_writes()
        v1 = await store.put("cas", b"version 1")
        v2 = await store.put("cas", b"version 2!", if_match=v1.etag)
        assert (v2.size, v2.etag) == (10, _md5(b"version 2!"))
        assert await store.get("cas") == b"version 2!"
        # The stale ETag is refused, and nothing changes.
        with pytest.raises(PreconditionFailed) as raised:
            await store.put("cas", b"version 3 from a stale read", if_match=v1.etag)
        assert raised.value.outcome_unknown is False
        assert await store.get("cas") == b"version 2!"
        # ETags are accepted quoted as well, as S3 returns them.
        v3 = await store.put("cas", b"v3", if_match=f'"{v2.etag}"')
        assert v3.etag == _md5(b"v3")
        head = await store.head("cas")
        assert head is not None and (head.size, head.etag) == (2, v3.etag)
        # No object at the key: refused too (the gateway says 412, AWS and moto 404).
        missing = "the current ETag is not" if any_store.is_ceph else "no object at the key"
        with pytest.raises(PreconditionFailed, match=missing):
            await store.put("missing", b"x", if_match=v3.etag)
        assert await store.head("missing") is None
        # Compare-and-set goes out as one PutObject, even above the multipart threshold.
        big = os.urandom(MULTIPART_THRESHOLD + 1)
        v4 = await store.put("cas", big, if_match=v3.etag)
        assert (v4.etag, await store.get("cas")) == (_md5(big), big)
        expected_form = "unquoted" if any_store.is_ceph else "quoted"
        assert store._if_match_form == expected_form

    any_store.run(scenario, multipart_threshold=MULTIPART_THRESHOLD, part_size=MIN_PART_SIZE)


def test_probe_passes_and_cleans_up(any_store: Target) -> None:
    async def scenario(store: S3Store) -> None:
        support = await store.probe_conditional_writes()
        # Ceph RGW 16: bare ETags in If-Match; conditions on CompleteMultipartUpload ignored.
        assert support == ConditionalWriteSupport(
            if_none_match=True,
            if_match_form="unquoted" if any_store.is_ceph else "quoted",
            multipart_if_none_match=not any_store.is_ceph,
        )
        assert store.conditional_writes == support
        assert await _keys(store) == []
        uploads = any_store.raw_client().list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix)
        assert uploads.get("Uploads", []) == []
        # Conditional multipart-sized creates stay create-only whatever the store does with
        # CompleteMultipartUpload (on the gateway they go out as one PutObject).
        body = os.urandom(MIN_PART_SIZE + 10)
        first = await store.put("big", body)
        with pytest.raises(ObjectExists):
            await store.put("big", body[::-1])
        assert await store.get("big") == body
        assert first.etag == (_md5(body) if any_store.is_ceph else _multipart_etag(body, MIN_PART_SIZE))
        # Unconditional replaces still use multipart.
        replaced = await store.put("big", body[::-1], if_none_match=False)
        assert replaced.etag == _multipart_etag(body[::-1], MIN_PART_SIZE)

    any_store.run(scenario, multipart_threshold=MULTIPART_THRESHOLD, part_size=MIN_PART_SIZE)


def test_unprobed_gateway_ignores_conditions_on_multipart_completion(ceph: Target) -> None:
    """Why the probe exists: without it, a multipart-sized create silently overwrites on the gateway."""
    body = os.urandom(MIN_PART_SIZE + 10)

    async def scenario(store: S3Store) -> None:
        await store.put("big", body)
        await store.put("big", body[::-1])  # no ObjectExists: the gateway completed over the object
        assert await store.get("big", start=0, end=32) == body[::-1][:32]

    ceph.run(scenario, multipart_threshold=MULTIPART_THRESHOLD, part_size=MIN_PART_SIZE)


@pytest.mark.parametrize(
    ("ignored", "message"),
    [
        (("PutObject", "IfNoneMatch"), "ignored If-None-Match: \\* and overwrote"),
        (("PutObject", "IfMatch"), "ignored If-Match with a stale ETag"),
    ],
    ids=["if-none-match", "if-match"],
)
def test_probe_refuses_a_store_that_overwrites_silently(
    any_store: Target, ignored: tuple[str, str], message: str
) -> None:
    operation, parameter = ignored

    async def scenario(store: S3Store) -> None:
        store._s3.meta.events.register(f"provide-client-params.s3.{operation}", _ignore_headers(parameter))
        with pytest.raises(ConditionalWritesUnsupported, match=message):
            await store.probe_conditional_writes()
        assert store.conditional_writes is None
        assert await _keys(store) == []  # the probe object is deleted even so

    any_store.run(scenario)


def test_probe_refuses_a_store_that_never_matches(moto: Target) -> None:
    def mangle(params: dict[str, Any], **_: Any) -> None:
        if "IfMatch" in params:
            params["IfMatch"] = params["IfMatch"] + "x"

    async def scenario(store: S3Store) -> None:
        store._s3.meta.events.register("provide-client-params.s3.PutObject", mangle)
        with pytest.raises(
            ConditionalWritesUnsupported, match="refused If-Match with the object's current ETag"
        ):
            await store.probe_conditional_writes()
        assert await _keys(store) == []

    moto.run(scenario)


def test_probe_notices_ignored_multipart_conditions_on_moto(moto: Target) -> None:
    """moto honours If-None-Match on CompleteMultipartUpload; a store like the gateway is simulated."""
    body = os.urandom(MIN_PART_SIZE + 10)

    async def scenario(store: S3Store) -> None:
        hook = _ignore_headers("IfNoneMatch")
        store._s3.meta.events.register("provide-client-params.s3.CompleteMultipartUpload", hook)
        support = await store.probe_conditional_writes()
        assert support == ConditionalWriteSupport(True, "quoted", False)
        assert await _keys(store) == []
        completes: list[int] = []
        store._s3.meta.events.register(
            "before-send.s3.CompleteMultipartUpload", lambda **_: completes.append(1)
        )
        await store.put("big", body)
        with pytest.raises(ObjectExists):
            await store.put("big", body[::-1])
        assert completes == []  # both went out as PutObject with If-None-Match
        assert await store.get("big") == body

    moto.run(scenario, multipart_threshold=MULTIPART_THRESHOLD, part_size=MIN_PART_SIZE)


def test_probe_object_lives_under_the_prefix(moto: Target) -> None:
    async def scenario(store: S3Store) -> None:
        keys: list[str] = []
        store._s3.meta.events.register(
            "provide-client-params.s3.PutObject", lambda params, **_: keys.append(params["Key"])
        )
        await store.probe_conditional_writes()
        assert keys and len(set(keys)) == 1
        assert keys[0].startswith(f"{store.prefix}{PROBE_KEY_PREFIX}")

    moto.run(scenario)


# -- ambiguous failures of compare-and-set (a retried If-Match put) --------------------------


def test_if_match_lost_response_counts_as_success(any_store: Target) -> None:
    """The replace lands but its response is lost; the retry's 412 is our own write, proved by its write id."""

    async def scenario(store: S3Store) -> None:
        await store.probe_conditional_writes()  # so the first attempt is one the store can match
        v1 = await store.put("cas", b"v1")
        store._s3.meta.events.register("after-call.s3.PutObject", _raise_once(_timeout))
        v2 = await store.put("cas", b"v2 ours", if_match=v1.etag)
        assert (v2.size, v2.etag) == (7, _md5(b"v2 ours"))
        assert await store.get("cas") == b"v2 ours"

    any_store.run(scenario)


def test_if_match_lost_response_with_identical_bytes_from_someone_else(any_store: Target) -> None:
    """After an ambiguous attempt, equal bytes written by another writer do not count as ours."""

    async def scenario(store: S3Store) -> None:
        await store.probe_conditional_writes()  # so the retry is one the store can match
        v1 = await store.put("cas", b"v1")
        fired: list[bool] = []

        async def someone_else_writes(**_: Any) -> None:
            if fired:
                return
            fired.append(True)
            async with any_store.store(prefix=store.prefix.rstrip("/")) as other:
                await other.put("cas", b"v2", if_match=v1.etag)
            raise _timeout()  # our first attempt, never sent, looks lost

        store._s3.meta.events.register("before-send.s3.PutObject", someone_else_writes)
        with pytest.raises(PreconditionFailed) as raised:
            await store.put("cas", b"v2", if_match=v1.etag)
        assert raised.value.outcome_unknown is True
        assert await store.get("cas") == b"v2"

    any_store.run(scenario)


# -- `tiered serve` with its cold tier in the gateway ------------------------------------------


@pytest.fixture(params=[False, True], ids=["http", "https"])
def served(request: pytest.FixtureRequest, ceph_rgw: rgw.RGWEndpoint, tmp_path: Path) -> Iterator[tuple]:
    tls: bool = request.param
    prefix = f"serve-{uuid.uuid4().hex}"
    srv = ServerProcess(
        tmp_path / "data",
        "--flush-interval-s", "0.05",
        "--hot-retention-s", "0",
        *rgw.serve_args(ceph_rgw, prefix, tls=tls),
        env=rgw.serve_env(ceph_rgw, tls=tls),
    )  # fmt: skip
    srv.start()
    try:
        yield srv, ceph_rgw, prefix, tls
    finally:
        srv.stop()
        client = _gateway_client(ceph_rgw)
        listed = client.list_objects_v2(Bucket=ceph_rgw.bucket, Prefix=f"{prefix}/")
        for item in listed.get("Contents", []):
            client.delete_object(Bucket=ceph_rgw.bucket, Key=item["Key"])


def _gateway_client(endpoint: rgw.RGWEndpoint) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        region_name=endpoint.region,
        aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )


def test_tiered_serve_keeps_its_cold_tier_in_the_gateway(served: tuple) -> None:
    srv, endpoint, prefix, _tls = served
    url = http.stream_url(srv.url, "ceph/stream")
    assert http.create(url)[0] == 201
    records = [os.urandom(n) for n in (1, 100, 5000, 70_000)]
    for record in records:
        assert http.append(url, record)[0] == 204
    client = _gateway_client(endpoint)

    def data_keys() -> list[str]:
        listed = client.list_objects_v2(Bucket=endpoint.bucket, Prefix=f"{prefix}/data/")
        return [item["Key"] for item in listed.get("Contents", [])]

    deadline = time.monotonic() + scaled(60)
    while not data_keys():
        assert time.monotonic() < deadline, f"no cold object appeared in the gateway:\n{srv.log()}"
        time.sleep(0.05)
    assert all(key.endswith(".parquet") for key in data_keys())
    claim = client.head_object(Bucket=endpoint.bucket, Key=f"{prefix}/_tiered/claim.json")
    assert claim["ContentLength"] > 0
    assert http.read_all(url)[0] == b"".join(records)
    # After a restart the bytes come back from the gateway (--hot-retention-s 0).
    assert srv.stop() == 0, srv.log()
    srv.start()
    assert http.read_all(url)[0] == b"".join(records)
