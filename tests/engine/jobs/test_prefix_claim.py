"""One server per object-store prefix.

Two ``tiered serve`` processes with their own data dirs on one bucket and prefix
(moto, and Ceph RGW over HTTP and HTTPS, whose If-Match takes bare ETags): the second refuses to start (exit 1, a message naming both ways out),
a restart of the first is the same owner, and an explicit ``--take-over-prefix``
moves the claim: the old owner, still running, stops writing and deleting
there (its GC deletes nothing, its flusher copies nothing, ``/readyz`` says why),
so it never deletes the new owner's objects as orphans.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from tests.support.deadlines import scaled
from tests.support.http_helpers import request
from tests.support.s3_backends import WITHOUT_IAM, S3Backend
from tests.support.server_process import ServerProcess
from tiered.cold.objects.localdir import LocalDirStore
from tiered.engine.jobs.claim import CLAIM_KEY, PrefixClaim, PrefixClaimed, load_identity

pytestmark = pytest.mark.timeout(120)
OCTET = {"Content-Type": "application/octet-stream"}


def keys(backend: S3Backend) -> set[str]:
    return set(backend.keys("data/"))


def server(data: Path, backend: S3Backend, *extra: str) -> ServerProcess:
    return ServerProcess(
        data,
        *backend.serve_args(),
        "--flush-interval-s",
        "0.1",
        "--hot-retention-s",
        "0",
        "--gc-grace-s",
        "0",
        "--gc-interval-s",
        "3600",
        *extra,
        env=backend.env,
    )


def wait_for(cond, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + scaled(timeout)
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("s3_backend", WITHOUT_IAM, indirect=True)
def test_a_second_server_on_the_same_prefix_refuses_to_start(tmp_path: Path, s3_backend: S3Backend) -> None:
    a = server(tmp_path / "a", s3_backend).start()
    b = server(tmp_path / "b", s3_backend)
    try:
        assert request("PUT", a.url + "/v1/stream/s", OCTET, b"a" * 3000)[0] == 201
        wait_for(lambda: len(keys(s3_backend)) == 1, "A's object")
        a_objects = keys(s3_backend)
        with pytest.raises(RuntimeError, match="exited with 1"):
            b.start()
        log = b.log()
        assert (
            "claimed by another tiered data dir" in log
            and "--take-over-prefix" in log
            and "--s3-prefix" in log
        ), log
        assert "Traceback" not in log
        assert keys(s3_backend) == a_objects
        assert a.stop() == 0
        a.start()  # a restart of the same data dir is the same owner
        assert request("GET", a.url + "/v1/stream/s?offset=-1")[2] == b"a" * 3000
    finally:
        a.kill()
        b.kill()


@pytest.mark.parametrize("s3_backend", WITHOUT_IAM, indirect=True)
def test_take_over_stops_the_old_owner_writing_and_deleting(tmp_path: Path, s3_backend: S3Backend) -> None:
    a = server(tmp_path / "a", s3_backend).start()
    b = server(tmp_path / "b", s3_backend, "--take-over-prefix", "true")
    try:
        assert request("PUT", a.url + "/v1/stream/s", OCTET, b"a" * 3000)[0] == 201
        wait_for(lambda: len(keys(s3_backend)) == 1, "A's object")
        a_objects = keys(s3_backend)
        b.start()
        assert request("PUT", b.url + "/v1/stream/t", OCTET, b"b" * 3000)[0] == 201
        wait_for(lambda: len(keys(s3_backend)) == 2, "B's object")
        both = keys(s3_backend)
        assert len(both - a_objects) == 1
        # A learns at its next check (forced by its GC pass) and deletes nothing there, orphans included.
        status, _, raw = request("POST", a.url + "/v1/admin/gc")
        report = json.loads(raw)
        assert status == 200 and report["orphans_deleted"] == 0 and report["objects_deleted"] == 0, report
        assert any("claimed by another data dir" in e for e in report["errors"]), report
        assert keys(s3_backend) == both
        status, _, raw = request("GET", a.url + "/readyz")
        assert status == 503 and "claimed by another data dir" in json.loads(raw)["prefix"]
        # A's flusher copies nothing there any more: new data stays hot on A.
        assert request("POST", a.url + "/v1/stream/s", OCTET, b"more")[0] == 204
        time.sleep(1.0)
        assert keys(s3_backend) == both
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


class _RacingStore:
    """A store on which another server takes the claim over between our read and our write, once."""

    def __init__(self, inner: LocalDirStore) -> None:
        self.inner = inner
        self.raced = False

    async def put(self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None):  # type: ignore[no-untyped-def]
        if if_match is not None and not self.raced:
            self.raced = True
            await PrefixClaim(self.inner, "racer", "/data/racer").acquire(take_over=True)
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)


def test_take_over_replaces_only_the_claim_it_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The take-over is a compare-and-set: when the claim changes under it, it reads again and
    says from whom it really takes over, instead of overwriting a claim it never saw."""

    async def main() -> None:
        store = LocalDirStore(tmp_path / "store")
        await PrefixClaim(store, "old", "/data/old").acquire()
        racing = _RacingStore(store)
        mine = PrefixClaim(racing, "mine", "/data/mine", recheck_s=0)  # type: ignore[arg-type]
        with caplog.at_level(logging.WARNING, logger="tiered.engine.jobs.claim"):
            await mine.acquire(take_over=True)
        assert racing.raced
        assert json.loads(await store.get(CLAIM_KEY))["identity"] == "mine"
        taken_from = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
        # mine from old (refused: the claim had changed), racer from old, then mine from racer.
        assert len(taken_from) == 3 and "from identity racer " in taken_from[-1], taken_from
        racer = PrefixClaim(store, "racer", "/data/racer", held=True)
        assert not await racer.still_held(force=True)

    asyncio.run(main())
