"""One server per object-store prefix.

Two ``tiered serve`` processes with their own data dirs on one moto bucket and
prefix: the second refuses to start (exit 1, a message naming both ways out),
a restart of the first is the same owner, and an explicit ``--take-over-prefix``
moves the claim: the old owner, still running, stops writing and deleting
there (its GC deletes nothing, its flusher copies nothing, ``/readyz`` says why),
so it never deletes the new owner's objects as orphans.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import boto3
import pytest

from tests import s3_server
from tests.http_helpers import request
from tests.server_process import ServerProcess
from tiered.cold.claim import CLAIM_KEY, PrefixClaim, PrefixClaimed, load_identity
from tiered.cold.localdir import LocalDirStore

pytestmark = pytest.mark.timeout(120)
OCTET = {"Content-Type": "application/octet-stream"}


def keys(endpoint: s3_server.S3Endpoint, prefix: str) -> set[str]:
    client = boto3.client("s3", endpoint_url=endpoint.url, region_name=endpoint.region)
    resp = client.list_objects_v2(Bucket=endpoint.bucket, Prefix=prefix + "/data/")
    return {item["Key"] for item in resp.get("Contents", [])}


def server(data: Path, endpoint: s3_server.S3Endpoint, prefix: str, *extra: str) -> ServerProcess:
    return ServerProcess(
        data,
        "--cold-store",
        "s3",
        "--s3-bucket",
        endpoint.bucket,
        "--s3-prefix",
        prefix,
        "--s3-endpoint",
        endpoint.url,
        "--s3-region",
        endpoint.region,
        "--s3-path-style",
        "true",
        "--flush-interval-s",
        "0.1",
        "--hot-retention-s",
        "0",
        "--gc-grace-s",
        "0",
        "--gc-interval-s",
        "3600",
        *extra,
        env={k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")},
    )


def wait_for(cond, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_second_server_on_the_same_prefix_refuses_to_start(
    tmp_path: Path, moto_s3: s3_server.S3Endpoint
) -> None:
    prefix = f"claim-{time.monotonic_ns()}"
    a = server(tmp_path / "a", moto_s3, prefix).start()
    b = server(tmp_path / "b", moto_s3, prefix)
    try:
        assert request("PUT", a.url + "/v1/stream/s", OCTET, b"a" * 3000)[0] == 201
        wait_for(lambda: len(keys(moto_s3, prefix)) == 1, "A's object")
        a_objects = keys(moto_s3, prefix)
        with pytest.raises(RuntimeError, match="exited with 1"):
            b.start()
        log = b.log()
        assert (
            "claimed by another tiered data dir" in log
            and "--take-over-prefix" in log
            and "--s3-prefix" in log
        ), log
        assert "Traceback" not in log
        assert keys(moto_s3, prefix) == a_objects
        assert a.stop() == 0
        a.start()  # a restart of the same data dir is the same owner
        assert request("GET", a.url + "/v1/stream/s?offset=-1")[2] == b"a" * 3000
    finally:
        a.kill()
        b.kill()


def test_take_over_stops_the_old_owner_writing_and_deleting(
    tmp_path: Path, moto_s3: s3_server.S3Endpoint
) -> None:
    prefix = f"takeover-{time.monotonic_ns()}"
    a = server(tmp_path / "a", moto_s3, prefix).start()
    b = server(tmp_path / "b", moto_s3, prefix, "--take-over-prefix", "true")
    try:
        assert request("PUT", a.url + "/v1/stream/s", OCTET, b"a" * 3000)[0] == 201
        wait_for(lambda: len(keys(moto_s3, prefix)) == 1, "A's object")
        a_objects = keys(moto_s3, prefix)
        b.start()
        assert request("PUT", b.url + "/v1/stream/t", OCTET, b"b" * 3000)[0] == 201
        wait_for(lambda: len(keys(moto_s3, prefix)) == 2, "B's object")
        both = keys(moto_s3, prefix)
        assert len(both - a_objects) == 1
        # A learns at its next check (forced by its GC pass) and deletes nothing there, orphans included.
        status, _, raw = request("POST", a.url + "/v1/admin/gc")
        report = json.loads(raw)
        assert status == 200 and report["orphans_deleted"] == 0 and report["objects_deleted"] == 0, report
        assert any("claimed by another data dir" in e for e in report["errors"]), report
        assert keys(moto_s3, prefix) == both
        status, _, raw = request("GET", a.url + "/readyz")
        assert status == 503 and "claimed by another data dir" in json.loads(raw)["prefix"]
        # A's flusher copies nothing there any more: new data stays hot on A.
        assert request("POST", a.url + "/v1/stream/s", OCTET, b"more")[0] == 204
        time.sleep(1.0)
        assert keys(moto_s3, prefix) == both
        assert request("GET", a.url + "/v1/stream/s?offset=-1")[2] == b"a" * 3000 + b"more"
        assert request("GET", b.url + "/v1/stream/t?offset=-1")[2] == b"b" * 3000
    finally:
        a.kill()
        b.kill()


def test_claim_object_and_identity(tmp_path: Path) -> None:
    async def main() -> None:
        store = LocalDirStore(tmp_path / "store")
        assert load_identity(tmp_path, create=False) is None
        ident = load_identity(tmp_path, create=True)
        assert ident and load_identity(tmp_path, create=False) == ident
        mine = PrefixClaim(store, ident, "/data/a", recheck_s=0)
        await mine.acquire()
        await mine.acquire()  # idempotent for the same identity
        assert json.loads(await store.get(CLAIM_KEY))["identity"] == ident
        other = PrefixClaim(store, "other", "/data/b", recheck_s=0)
        with pytest.raises(PrefixClaimed):
            await other.acquire()
        assert await mine.still_held()
        await other.acquire(take_over=True)
        assert not await mine.still_held() and mine.lost_to is not None and mine.lost_to.identity == "other"
        await store.put(CLAIM_KEY, b"not json", if_none_match=False)
        with pytest.raises(PrefixClaimed, match="not readable"):
            await PrefixClaim(store, "third", "/x").acquire()

    asyncio.run(main())
