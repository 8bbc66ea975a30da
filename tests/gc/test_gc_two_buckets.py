"""The product card's case: one cold object owned by two buckets, and forks across buckets.

* Streams in buckets ``alpha`` and ``beta`` are flushed into ONE Parquet object. Erasing
  ``alpha`` releases only alpha's ownership; the object is rewritten with beta's rows only
  (issue 21's erasure rewrite) and the old one deleted after the grace delay, and beta's
  stream keeps reading byte-exact, across restarts. Erasing ``beta`` too
  leaves the object with no owner: it is deleted once the grace delay has passed, never
  before.
* A fork in bucket ``beta`` of a stream in bucket ``alpha`` keeps its inherited bytes
  readable after alpha is erased; alpha's bytes past the fork point are released and
  their object deleted after the grace delay.

In-process tests run the real ``StreamService`` with a virtual clock; the HTTP test runs
``tiered serve`` against every S3 store of ``tests/support/s3_backends.py`` (moto, moto with iam.tf's
policy enforced, Ceph RGW over HTTP and HTTPS) and drives GC with ``POST /v1/admin/gc``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.deadlines import scaled
from tests.support.error_helpers import http_status
from tests.support.gc_support import Harness, VirtualClock, journal_records, make_config, object_files
from tests.support.http_helpers import append, create, read, read_all, request, stream_url
from tests.support.s3_backends import ALL, S3Backend
from tests.support.server_process import ServerProcess
from tiered.core.errors import TieredError as StreamError
from tiered.engine.streams.records import BucketErased, ColdDeleteFinished, ColdDeleteStarted

pytestmark = pytest.mark.timeout(120)


GRACE_S = 10.0
GRACE_MS = int(GRACE_S * 1000)

A_DATA = [bytes(range(256)) * 20, b"alpha-second-record", b"\x00\xff" * 700]
B_DATA = [b"beta-" + bytes(range(200)) * 11, b"\xfe" * 3000, b"beta-last"]


def test_object_owned_by_two_buckets_survives_erasure_of_one_and_goes_after_both(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data", gc_grace_s=GRACE_S)
    clock = VirtualClock()
    h = Harness(config, clock=clock)

    async def body() -> None:
        await h.start()
        for b in ("alpha", "beta"):
            await h.bucket(b)
        await h.create("alpha", "events/a", A_DATA[0])
        await h.create("beta", "events/b", B_DATA[0])
        for a, b in zip(A_DATA[1:], B_DATA[1:], strict=True):
            await h.append("alpha", "events/a", a)
            await h.append("beta", "events/b", b)
        assert await h.flush() == 1
        state = h.s.state
        [key] = state.cold_objects
        assert object_files(config.data_path) == {key}
        obj = state.cold_objects[key]
        assert obj.refs == 2
        assert {(e.bucket, e.stream) for e in obj.index.streams} == {
            ("alpha", "events/a"),
            ("beta", "events/b"),
        }
        assert h.slice_kinds("beta", "events/b") == ["ColdSlice"]  # hot copies trimmed: only cold
        assert await h.read("beta", "events/b") == b"".join(B_DATA)
        assert await h.read("alpha", "events/a") == b"".join(A_DATA)

        clock.advance(1_000)
        await h.s.streams.erase_bucket("alpha")
        erased_at = clock.ms
        assert obj.refs == 1 and obj.released_ms is None
        with pytest.raises(StreamError) as err:
            h.s.streams.lookup("alpha", "events/a")
        assert http_status(err.value) == 404

        # Beta still owns it, so erasure rewrites it without alpha's rows (tests/gc/test_gc_erasure_rewrite.py):
        # the copy serves beta, byte-exact; the old object goes after the grace delay.
        report = await h.gc(erased_at)
        assert report.objects_rewritten == 1 and report.objects_deleted == 0, report
        old = key
        [key] = set(state.cold_objects) - {old}
        assert object_files(config.data_path) == {old, key}
        obj = state.cold_objects[key]
        assert {(e.bucket, e.stream) for e in obj.index.streams} == {("beta", "events/b")}
        for delta in (GRACE_MS, 100 * GRACE_MS):
            report = await h.gc(erased_at + delta)
            assert report.objects_rewritten == 0 and report.orphans_deleted == 0, report
            assert report.errors == [] and report.integrity_errors == []
            assert object_files(config.data_path) == {key}
            assert await h.read("beta", "events/b") == b"".join(B_DATA)

        # And across a crash and a clean restart.
        for crash in (True, False):
            await h.restart(crash=crash)
            assert set(h.s.state.cold_objects) == {key}
            assert h.s.state.cold_objects[key].refs == 1
            assert "alpha" in h.s.state.erased_buckets
            assert await h.read("beta", "events/b") == b"".join(B_DATA)
            report = await h.gc(erased_at + 200 * GRACE_MS)
            assert report.objects_deleted == 0 and object_files(config.data_path) == {key}

        clock.ms = erased_at + 300 * GRACE_MS
        await h.s.streams.erase_bucket("beta")
        released = clock.ms
        obj = h.s.state.cold_objects[key]
        assert obj.refs == 0 and obj.released_ms == released
        report = await h.gc(released + GRACE_MS - 1)  # one ms short of the grace delay
        assert report.objects_deleted == 0 and report.objects_released == 1
        assert object_files(config.data_path) == {key}
        report = await h.gc(released + GRACE_MS)
        assert report.objects_deleted == 1 and report.bytes_deleted == obj.size, report
        assert report.errors == [] and report.integrity_errors == []
        assert object_files(config.data_path) == set() and h.s.state.cold_objects == {}
        # Idempotent: nothing left to do, nothing reported.
        report = await h.gc(released + 2 * GRACE_MS)
        assert (report.objects_deleted, report.orphans_found, report.integrity_errors) == (0, 0, [])
        await h.stop()

    asyncio.run(body())
    records = journal_records(config.data_path)
    kinds = [type(r) for r in records]
    assert kinds.count(BucketErased) == 2
    started = [r for r in records if isinstance(r, ColdDeleteStarted)]
    finished = [r for r in records if isinstance(r, ColdDeleteFinished)]
    assert len(started) == len(finished) == 2  # the object erasure rewrote, then its copy
    for start, finish in zip(started, finished, strict=True):
        assert start.keys == finish.keys and not start.orphan
        assert records.index(start) < records.index(finish)


def test_fork_in_another_bucket_keeps_inherited_bytes_after_the_source_bucket_is_erased(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path / "data", gc_grace_s=GRACE_S)
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    before_fork = b"inherited:" + bytes(range(256)) * 8
    after_fork = b"alpha-only-after-the-fork:" + b"\x07" * 2500
    own = b"the fork's own data"

    async def body() -> None:
        await h.start()
        for b in ("alpha", "beta"):
            await h.bucket(b)
        await h.create("alpha", "src", before_fork)
        await h.flush()  # object 1: alpha/src [0, len(before_fork))
        await h.append("alpha", "src", after_fork)
        await h.flush()  # object 2: alpha/src past the fork point
        first, second = sorted(h.s.state.cold_objects, key=lambda k: h.s.state.cold_objects[k].created_ms)
        fork_point = len(before_fork)
        await h.create("beta", "fork", fork_from=("alpha", "src"), fork_offset=fork_point)
        await h.append("beta", "fork", own)
        assert await h.read("beta", "fork") == before_fork + own
        assert h.s.state.cold_objects[first].refs == 1 and h.s.state.cold_objects[second].refs == 1

        clock.advance(1_000)
        await h.s.streams.erase_bucket("alpha")
        erased_at = clock.ms
        state = h.s.state
        src = next(s for s in state.streams.values() if s.bucket == "alpha")
        assert src.soft_deleted and src.keep_end == fork_point
        assert state.cold_objects[first].refs == 1  # the fork still reads it
        assert state.cold_objects[second].refs == 0  # nobody can reach alpha's bytes past the fork point
        assert state.cold_objects[second].released_ms == erased_at
        assert await h.read("beta", "fork") == before_fork + own

        report = await h.gc(erased_at + GRACE_MS - 1)
        assert report.objects_deleted == 0 and object_files(config.data_path) == {first, second}
        report = await h.gc(erased_at + GRACE_MS)
        assert report.objects_deleted == 1 and report.errors == [] and report.integrity_errors == []
        assert object_files(config.data_path) == {first}
        assert await h.read("beta", "fork") == before_fork + own
        await h.flush()  # the fork's own bytes go cold too
        assert await h.read("beta", "fork") == before_fork + own

        await h.restart(crash=True)
        assert await h.read("beta", "fork") == before_fork + own
        assert await h.read("beta", "fork", fork_point) == own
        # Erasing beta too frees everything.
        clock.advance(1_000)
        await h.s.streams.erase_bucket("beta")
        gone_at = clock.ms
        assert h.s.state.streams == {}
        report = await h.gc(gone_at + GRACE_MS)
        assert report.errors == [] and report.integrity_errors == []
        assert object_files(config.data_path) == set() and h.s.state.cold_objects == {}
        assert h.s.state.hot_bytes == 0
        await h.stop()

    asyncio.run(body())


# --------------------------------------------------------------------------- over HTTP, on S3


@pytest.fixture
def s3_server_proc(tmp_path: Path, s3_backend: S3Backend) -> Iterator[ServerProcess]:
    flush_bytes = 64 * 1024
    srv = ServerProcess(
        tmp_path / "data",
        *s3_backend.serve_args(),
        # No timed flush: the flush starts when both buckets' appends are waiting (flush_bytes).
        "--flush-interval-s",
        "3600",
        "--flush-bytes",
        str(flush_bytes),
        "--hot-retention-s",
        "0",
        "--gc-grace-s",
        "0.5",
        "--gc-interval-s",
        "3600",
        "--long-poll-timeout-s",
        "2",
        env={**s3_backend.env, "TIERED_ADMIN_TOKEN": ""},  # loopback, no token: admin calls allowed
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


def _s3_keys(backend: S3Backend) -> set[str]:
    return set(backend.keys("data/"))


def _metric(srv: ServerProcess, name: str) -> float:
    status, _, body = request("GET", srv.url + "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _wait(cond, what: str, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + scaled(timeout)
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _gc(srv: ServerProcess) -> dict:  # type: ignore[type-arg]
    status, _, body = request("POST", srv.url + "/v1/admin/gc")
    assert status == 200, body
    return json.loads(body)


@pytest.mark.parametrize("s3_backend", ALL, indirect=True)
def test_shared_object_on_s3_over_http(s3_server_proc: ServerProcess, s3_backend: S3Backend) -> None:
    """On every S3 store of tests/support/s3_backends.py; each GC pass also reconciles (lists the prefix)."""
    srv = s3_server_proc
    a_url, b_url = stream_url(srv.url, "shared/a", "alpha"), stream_url(srv.url, "shared/b", "beta")
    f_url = stream_url(srv.url, "fork-of-a", "beta")
    for b in ("alpha", "beta"):
        assert request("PUT", f"{srv.url}/v1/buckets/{b}")[0] == 201
    a_bytes, b_bytes = bytes(range(256)) * 128, b"\x5a" * 30_000 + b"end of b"  # 32 KiB + ~30 KiB < 64 KiB
    assert create(a_url)[0] == 201 and create(b_url)[0] == 201
    assert append(a_url, a_bytes)[0] == 204
    assert append(b_url, b_bytes)[0] == 204
    # Nothing flushed yet; one more append crosses --flush-bytes and the flusher packs what is
    # durable (both buckets' data) into one object. (The crossing append itself may stay hot.)
    assert _metric(srv, "tiered_cold_objects") == 0
    assert append(b_url, b"\x01" * 4_000)[0] == 204
    b_bytes += b"\x01" * 4_000
    _wait(lambda: _metric(srv, "tiered_cold_objects") == 1, "the flush")
    [key] = _s3_keys(s3_backend)
    table = pq.read_table(pa.BufferReader(s3_backend.read(key)))
    assert set(table.column("bucket").to_pylist()) == {"alpha", "beta"}  # one object, two owners
    # A fork in beta of alpha's stream, at alpha's tail (inherits all of a_bytes from the shared object).
    status, _, _ = request("PUT", f_url, {"Stream-Forked-From": "/v1/buckets/alpha/stream/shared/a"}, b"")
    assert status == 201

    assert request("DELETE", f"{srv.url}/v1/buckets/alpha")[0] == 204
    assert read(a_url, "-1")[0] == 404
    time.sleep(0.7)  # past the grace delay
    report = _gc(srv)
    assert report["objects_deleted"] == 0 and report["errors"] == [] and report["integrity_errors"] == []
    assert _s3_keys(s3_backend) == {key}
    assert read_all(b_url)[0] == b_bytes
    assert read_all(f_url)[0] == a_bytes

    assert request("DELETE", f"{srv.url}/v1/buckets/beta")[0] == 204
    report = _gc(srv)  # immediately: still within the grace delay
    assert report["objects_deleted"] == 0 and report["objects_released"] == 1, report
    assert _s3_keys(s3_backend) == {key}
    time.sleep(0.7)
    report = _gc(srv)
    assert report["objects_deleted"] == 1 and report["bytes_deleted"] > 0, report
    assert report["errors"] == [] and report["integrity_errors"] == []
    assert _s3_keys(s3_backend) == set()
    assert _metric(srv, "tiered_cold_objects") == 0
    assert _metric(srv, "tiered_gc_objects_deleted_total") == 1
    status, _, body = request("GET", srv.url + "/v1/admin/gc")
    assert status == 200 and json.loads(body)["pending_deletions"] == 0


def test_crossing_flush_bytes_flushes_the_data_that_crossed_it(tmp_path: Path) -> None:
    """Packing several buckets' data into one object relies on the --flush-bytes kick taking everything
    waiting, including the append that crossed the threshold (regression: the kick used to fire before
    that append was durable, so its pass could not see it)."""
    config = make_config(tmp_path / "data", flush_bytes=64 * 1024, flush_interval_s=3600.0)

    async def body() -> None:
        from tiered.engine.engine import Engine
        from tiered.engine.streams.model import AppendRequest, CreateRequest

        svc = Engine(config)
        await svc.start(jobs=False)
        svc.start_jobs({"cold-flusher"})  # the background flusher runs: only the kick can start a pass
        write = svc.journal._write

        def slow_disk_write(batch: object) -> None:  # an fdatasync that takes 200 ms (a busy disk)
            time.sleep(0.2)
            write(batch)

        svc.journal._write = slow_disk_write  # type: ignore[method-assign]
        try:
            await svc.streams.create(
                "default", "s", CreateRequest("application/octet-stream", None, None, None, False, b"")
            )
            await svc.streams.append(
                "default", "s", AppendRequest("application/octet-stream", b"x" * 70_000, False)
            )
            deadline = time.monotonic() + scaled(2)
            while svc.state.hot_bytes and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert svc.state.hot_bytes == 0, "70,000 bytes > --flush-bytes are waiting, and stay hot"
        finally:
            await asyncio.sleep(0.01)
            await svc.stop()

    asyncio.run(body())
