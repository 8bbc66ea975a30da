"""Fault injection at every step of the cold-object lifecycles, with restarts.

A crash point is simulated inside a wrapper object store: at that moment the journal is
marked failed (nothing more can reach it, exactly as if the process had died), the step
raises, and the service is closed without a shutdown snapshot, like SIGKILL after the last
fsync. Then a new service recovers the same data dir.

* after the upload, before ``ColdCopyCommitted``: restart aborts the copy; the object is an
  orphan that reconciliation deletes once the grace delay has passed, never before (and
  never while the copy is still in flight);
* after ``ColdDeleteStarted``, before the store delete: the next pass deletes and finishes;
* after the store delete, before ``ColdDeleteFinished``: the next pass completes
  idempotently, with no integrity error;
* store errors and timeouts on delete and on list: the pass reports them, blocks nothing
  else (appends, reads, flushes, erasure go on meanwhile) and changes nothing it should
  not; a later pass succeeds.

The crash tests run on the local-dir store and on S3 (moto's server, moto as an IAM user
holding only iam.tf's policy, Ceph RGW over HTTP and over HTTPS), so the S3 delete and list
paths run for real. A real ``S3Store`` is also pointed at an endpoint that accepts
connections and never answers (its own timeouts fire) and at a moto bucket that does not
exist (every call errors). And one test SIGKILLs a real ``tiered serve`` right after an
acknowledged erasure, then collects after the restart.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.deadlines import scaled
from tests.support.gc_support import (
    ControlledStore,
    Harness,
    VirtualClock,
    install_store,
    journal_records,
    make_config,
    object_files,
)
from tests.support.http_helpers import request as http
from tests.support.s3_backends import ALL, backend_for
from tests.support.server_process import ServerProcess
from tiered.cold.objects.keys import key_time_ms, new_object_key
from tiered.cold.objects.retry import RetryPolicy
from tiered.cold.objects.s3 import S3Store
from tiered.core.config import Config
from tiered.engine.engine import Engine
from tiered.engine.streams.records import (
    ColdCopyAborted,
    ColdCopyCommitted,
    ColdCopyStarted,
    ColdDeleteFinished,
    ColdDeleteStarted,
)

pytestmark = pytest.mark.timeout(120)


GRACE_MS = 10_000
KEPT = [b"kept-" + bytes(range(256)) * 6, b"kept-second", b"\x00" * 999]
GONE = [b"gone-" + bytes(range(255, -1, -1)) * 5, b"gone-second"]


class SimulatedCrash(Exception):
    """The process 'dies' here: raised after the journal stopped accepting records."""


def die_here(svc: Engine, where: str) -> None:
    svc.journal.failed = SimulatedCrash(f"process died {where}")
    raise SimulatedCrash(where)


class CrashingStore(ControlledStore):
    """A ControlledStore that can also 'kill the process' before/after a put or delete."""

    def __init__(self, inner: Any, harness: Harness) -> None:
        super().__init__(inner)
        self.harness = harness
        self.crash_put = ""  # "", "after"
        self.crash_delete = ""  # "", "before", "after"

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> Any:
        info = await super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        if self.crash_put == "after":
            die_here(self.harness.s, f"after uploading {key}")
        return info

    async def delete_many(self, keys: Any) -> Any:
        keys = list(keys)
        if self.crash_delete == "before":
            die_here(self.harness.s, "before the store delete")
        result = await super().delete_many(keys)
        if self.crash_delete == "after":
            die_here(self.harness.s, "after the store delete")
        return result


# --------------------------------------------------------------------------- stores


@pytest.fixture(params=["local", *ALL])
def config(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Config]:
    """A node's config on the local store, or on an S3 store of tests/support/s3_backends.py (moto, moto with
    iam.tf's policy enforced, Ceph RGW over HTTP and over HTTPS)."""
    if request.param == "local":
        yield make_config(tmp_path / "data", gc_grace_s=GRACE_MS / 1000)
        return
    with backend_for(request.param, request, monkeypatch) as backend:
        yield make_config(tmp_path / "data", gc_grace_s=GRACE_MS / 1000, **backend.config())


async def stored_keys(h: Harness) -> set[str]:
    store = h.s.store
    assert store is not None
    return {info.key async for info in store.list("data/")}


async def setup_released_object(h: Harness, clock: VirtualClock) -> tuple[str, str, int]:
    """Bucket 'kept' (object K) and bucket 'gone' (object G), then 'gone' erased: G is released."""
    for b in ("kept", "gone"):
        await h.bucket(b)
    await h.create("kept", "s", KEPT[0])
    for data in KEPT[1:]:
        await h.append("kept", "s", data)
    await h.flush()
    [kept_key] = h.s.state.cold_objects
    await h.create("gone", "s", GONE[0])
    await h.append("gone", "s", GONE[1])
    await h.flush()
    [gone_key] = set(h.s.state.cold_objects) - {kept_key}
    clock.advance(1_000)
    await h.s.streams.erase_bucket("gone")
    assert h.s.state.cold_objects[gone_key].refs == 0
    return kept_key, gone_key, clock.ms


# --------------------------------------------------------------------------- crash points


def test_crash_after_upload_before_commit(config: Config) -> None:
    clock = VirtualClock()
    h = Harness(config, wrap=lambda inner: CrashingStore(inner, h), clock=clock)
    data = [b"first " * 100, b"second " * 50]

    async def body() -> None:
        await h.start()
        await h.create("default", "s", data[0])
        await h.append("default", "s", data[1])
        store = h.s.store
        assert isinstance(store, CrashingStore)
        store.crash_put = "after"
        with pytest.raises(SimulatedCrash):
            await h.s.flusher.flush_once()  # type: ignore[union-attr]
        [orphan] = [c[1] for c in store.calls if c[0] == "put"]
        await h.crash()
        records = journal_records(config.data_path)
        assert [r.key for r in records if isinstance(r, ColdCopyStarted)] == [orphan]
        assert not [r for r in records if isinstance(r, ColdCopyCommitted | ColdCopyAborted)]
        uploaded_at = key_time_ms(orphan)
        assert uploaded_at == clock.ms

        # Restart, but the copy is still "in flight" (not aborted yet): never deleted, whatever the time.
        await h.start(abort_interrupted=False)
        assert list(h.s.state.copies_in_flight) == [orphan]
        assert await stored_keys(h) == {orphan}
        report = await h.gc(uploaded_at + 100 * GRACE_MS, dry_run=True)
        assert report.would_delete == [] and report.integrity_errors == [] and report.errors == []
        report = await h.gc(uploaded_at + GRACE_MS - 1)
        assert report.orphans_found == 0 and await stored_keys(h) == {orphan}
        assert await h.read("default", "s") == b"".join(data)  # the hot copy is still the only copy

        # What the flusher does first on start: abort the interrupted copy. Now it is an orphan.
        await h.crash()
        await h.start()
        assert h.s.state.copies_in_flight == {} and h.s.state.cold_objects == {}
        kinds = [type(r) for r in journal_records(config.data_path)]
        assert kinds.count(ColdCopyAborted) == 1
        report = await h.gc(uploaded_at + GRACE_MS - 1)  # younger than the grace delay: kept
        assert (report.orphans_found, report.orphans_deleted, report.errors) == (0, 0, [])
        assert await stored_keys(h) == {orphan}
        report = await h.gc(uploaded_at + GRACE_MS)
        assert (report.orphans_found, report.orphans_deleted, report.errors) == (1, 1, []), report
        assert report.integrity_errors == []
        assert await stored_keys(h) == set()
        # The data was never lost: flushed again under a new key, and read from it.
        clock.advance(1_000)
        assert await h.flush() == 1
        [new_key] = h.s.state.cold_objects
        assert new_key != orphan and await stored_keys(h) == {new_key}
        assert h.slice_kinds("default", "s") == ["ColdSlice"]
        assert await h.read("default", "s") == b"".join(data)
        report = await h.gc(clock.ms + 100 * GRACE_MS)
        assert (report.orphans_found, report.objects_deleted, report.integrity_errors) == (0, 0, [])
        await h.stop()

    asyncio.run(body())
    records = journal_records(config.data_path)
    started = [r for r in records if isinstance(r, ColdDeleteStarted)]
    finished = [r for r in records if isinstance(r, ColdDeleteFinished)]
    assert len(started) == 1 and started[0].orphan and len(finished) == 1 and finished[0].orphan


@pytest.mark.parametrize("crash_point", ["before", "after"])
def test_crash_around_the_store_delete(config: Config, crash_point: str) -> None:
    """'before': ColdDeleteStarted journaled, object still there. 'after': object gone, no
    ColdDeleteFinished. Either way the next pass after a restart finishes the delete."""
    clock = VirtualClock()
    h = Harness(config, wrap=lambda inner: CrashingStore(inner, h), clock=clock)

    async def body() -> None:
        await h.start()
        kept, gone, released = await setup_released_object(h, clock)
        store = h.s.store
        assert isinstance(store, CrashingStore)
        store.crash_delete = crash_point
        with pytest.raises(SimulatedCrash):
            await h.gc(released + GRACE_MS)
        await h.crash()
        records = journal_records(config.data_path)
        assert isinstance(records[-1], ColdDeleteStarted) and records[-1].keys == (gone,)
        assert not any(isinstance(r, ColdDeleteFinished) for r in records)

        await h.start()
        obj = h.s.state.cold_objects[gone]
        assert obj.deleting and obj.refs == 0
        expected = {kept, gone} if crash_point == "before" else {kept}
        assert await stored_keys(h) == expected
        # A dry run says what is pending and why, and changes nothing.
        report = await h.gc(released + GRACE_MS, dry_run=True)
        assert [(w["key"], w["reason"]) for w in report.would_delete] == [
            (gone, "delete interrupted earlier")
        ]
        assert report.integrity_errors == []
        assert await stored_keys(h) == expected and gone in h.s.state.cold_objects
        # The next pass completes it, idempotently, with no integrity error.
        report = await h.gc(released + GRACE_MS)
        assert report.objects_deleted == 1 and report.errors == [] and report.integrity_errors == [], report
        assert set(h.s.state.cold_objects) == {kept}
        assert await stored_keys(h) == {kept}
        assert await h.read("kept", "s") == b"".join(KEPT)
        report = await h.gc(released + 2 * GRACE_MS)
        assert (report.objects_deleted, report.orphans_found, report.errors, report.integrity_errors) == (
            0,
            0,
            [],
            [],
        )
        await h.restart(crash=True)
        assert set(h.s.state.cold_objects) == {kept}
        assert await h.read("kept", "s") == b"".join(KEPT)
        await h.stop()

    asyncio.run(body())
    records = journal_records(config.data_path)
    started = [r.keys for r in records if isinstance(r, ColdDeleteStarted)]
    finished = [r.keys for r in records if isinstance(r, ColdDeleteFinished)]
    gone_key = started[0][0]
    assert started == [(gone_key,), (gone_key,)]  # the interrupted start, then the retry's
    assert finished == [(gone_key,)]


# --------------------------------------------------------------------------- store errors and timeouts


def _observable(h: Harness) -> dict[str, Any]:
    st = h.s.state
    return {
        "streams": sorted(
            (s.bucket, s.path, s.tail, s.retained_from, s.soft_deleted) for s in st.streams.values()
        ),
        "objects": sorted((k, o.refs) for k, o in st.cold_objects.items()),
        "buckets": sorted(st.buckets),
        "erased": sorted(st.erased_buckets),
    }


@pytest.mark.parametrize("fault", ["delete-error", "delete-hang", "list-error", "list-hang"])
def test_store_errors_and_timeouts_are_reported_and_block_nothing(config: Config, fault: str) -> None:
    clock = VirtualClock()
    h = Harness(config, wrap=lambda inner: ControlledStore(inner, hang_s=1.5), clock=clock)
    op, mode = fault.split("-")

    async def body() -> None:
        await h.start()
        kept, gone, released = await setup_released_object(h, clock)
        store = h.s.store
        assert isinstance(store, ControlledStore)
        orphan = new_object_key(released - 2 * GRACE_MS)  # an old upload nobody committed
        await store.inner.put(orphan, b"orphaned bytes")
        before = _observable(h)
        setattr(store, f"fail_{op}", mode)

        t0 = time.monotonic()
        gc_task = asyncio.create_task(h.gc(released + GRACE_MS))
        if mode == "hang":
            while not store.hanging and not gc_task.done():
                await asyncio.sleep(0.01)
            assert store.hanging, await gc_task
            # Meanwhile everything else goes on: appends, cold reads, a flush, creation, erasure.
            t1 = time.monotonic()
            await h.append("kept", "s", b"while GC hangs")
            assert await h.read("kept", "s") == b"".join(KEPT) + b"while GC hangs"
            await h.bucket("other")
            await h.create("other", "x", b"x" * 100)
            assert await h.flush() >= 1
            assert h.s.state.hot_bytes == 0
            await h.s.streams.erase_bucket("other")
            assert time.monotonic() - t1 < 1.0 and not gc_task.done()
        report = await gc_task
        if mode == "hang":
            assert time.monotonic() - t0 >= 1.5
        assert report.errors, report
        assert any("injected" in e for e in report.errors)
        if op == "delete":
            # The intent is journaled; the objects stay known, in the store, and nothing was lost.
            assert report.objects_deleted == 0 and report.orphans_deleted == 0
            assert h.s.state.cold_objects[gone].deleting
            assert await store.inner.head(gone) is not None
            assert report.orphans_found == 1  # the listing worked; only the delete failed
        else:
            # The listing failed: no orphan found, but deleting released objects does not need it.
            assert report.orphans_found == 0 and report.orphans_deleted == 0
            assert report.objects_deleted == 1 and gone not in h.s.state.cold_objects
        assert await store.inner.head(orphan) is not None
        assert await store.inner.head(kept) is not None
        assert report.integrity_errors == []
        if mode == "error":
            after = _observable(h)
            if op == "delete":
                assert after == before
            else:
                before["objects"] = [o for o in before["objects"] if o[0] != gone]
                assert after == before
        assert (await h.read("kept", "s")).startswith(b"".join(KEPT))

        # The store recovers: the next pass does the rest.
        setattr(store, f"fail_{op}", "ok")
        report = await h.gc(released + 2 * GRACE_MS)
        assert report.errors == [] and report.integrity_errors == [], report
        assert report.orphans_deleted == 1
        assert await store.inner.head(orphan) is None and await store.inner.head(gone) is None
        assert gone not in h.s.state.cold_objects and kept in h.s.state.cold_objects
        assert (await h.read("kept", "s")).startswith(b"".join(KEPT))
        await h.restart(crash=True)
        report = await h.gc(released + 3 * GRACE_MS)
        assert (report.errors, report.integrity_errors, report.objects_deleted) == ([], [], 0)
        await h.stop()

    asyncio.run(body())


def test_delete_rejected_per_key_is_reported_and_retried(config: Config) -> None:
    """A store that answers a batch delete with per-key failures (S3 DeleteObjects 'Errors')."""
    from tiered.cold.objects.store import DeleteFailure

    class PartialStore(ControlledStore):
        refuse: set[str] = set()

        async def delete_many(self, keys: Any) -> list[DeleteFailure]:
            keys = list(keys)
            ok = [k for k in keys if k not in self.refuse]
            await self.inner.delete_many(ok)
            return [DeleteFailure(k, "AccessDenied", "injected") for k in keys if k in self.refuse]

    clock = VirtualClock()
    h = Harness(config, wrap=PartialStore, clock=clock)

    async def body() -> None:
        await h.start()
        kept, gone, released = await setup_released_object(h, clock)
        store = h.s.store
        assert isinstance(store, PartialStore)
        store.refuse = {gone}
        report = await h.gc(released + GRACE_MS)
        assert report.objects_deleted == 0 and any(gone in e and "AccessDenied" in e for e in report.errors)
        assert h.s.state.cold_objects[gone].deleting and await store.inner.head(gone) is not None
        store.refuse = set()
        report = await h.gc(released + GRACE_MS + 1)
        assert report.objects_deleted == 1 and report.errors == []
        assert gone not in h.s.state.cold_objects and await store.inner.head(gone) is None
        await h.stop()

    asyncio.run(body())


# --------------------------------------------------------------------------- a real S3Store timing out


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An HTTP endpoint that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        srv.close()


@pytest.mark.parametrize("failure", ["timeout", "no-such-bucket"])
def test_real_s3_failures_on_delete_and_list_fail_the_step_not_the_pass(
    tmp_path: Path, failure: str, request: pytest.FixtureRequest, aws_test_env: None
) -> None:
    """A real S3Store whose endpoint never answers (its timeouts fire, retries run out), or that
    answers every call with an error (moto, a bucket that does not exist)."""
    config = make_config(tmp_path / "data", gc_grace_s=GRACE_MS / 1000)
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    if failure == "timeout":
        endpoint, bucket = request.getfixturevalue("black_hole"), "tiered-test"
    else:
        endpoint, bucket = request.getfixturevalue("moto_s3").url, "no-such-bucket"

    async def body() -> None:
        await h.start()
        kept, gone, released = await setup_released_object(h, clock)
        local = h.s.store
        broken = await S3Store(
            bucket,
            "broken",
            endpoint_url=endpoint,
            region="us-east-1",
            path_style=True,
            retry=RetryPolicy(attempts=2, base=0.01, cap=0.01),
            connect_timeout=0.5,
            read_timeout=0.3,
            attempt_timeout=1.0,
        ).open()
        try:
            install_store(h.s, broken)
            before = _observable(h)
            t0 = time.monotonic()
            report = await h.gc(released + GRACE_MS)
            assert time.monotonic() - t0 < 10
            assert len(report.errors) == 2, report.errors  # the delete and the listing
            assert any("delete" in e for e in report.errors) and any("listing" in e for e in report.errors)
            assert report.objects_deleted == 0 and report.integrity_errors == []
            assert _observable(h) == before
            assert h.s.state.cold_objects[gone].deleting
        finally:
            install_store(h.s, local)
            await broken.close()
        # Hot data and appends were never affected; with the store back, the next pass finishes.
        await h.append("kept", "s", b"more")
        report = await h.gc(released + GRACE_MS + 1)
        assert report.errors == [] and report.objects_deleted == 1 and report.integrity_errors == []
        assert set(h.s.state.cold_objects) == {kept}
        assert await h.read("kept", "s") == b"".join(KEPT) + b"more"
        await h.stop()

    asyncio.run(body())


# --------------------------------------------------------------------------- a real SIGKILL


def test_sigkill_after_erasure_then_gc_after_restart(tmp_path: Path) -> None:
    """Acknowledged erasure survives SIGKILL; after the restart GC deletes only what nobody owns."""
    data = tmp_path / "data"
    args = (
        "--flush-interval-s",
        "0.1",
        "--hot-retention-s",
        "0",
        "--gc-grace-s",
        "0",
        "--gc-interval-s",
        "3600",
    )
    ct = {"Content-Type": "application/octet-stream"}

    def cold_objects(srv: ServerProcess) -> int:
        body = http("GET", srv.url + "/metrics")[2].decode()
        return int(
            float(
                next(line for line in body.splitlines() if line.startswith("tiered_cold_objects ")).split()[1]
            )
        )

    def wait(cond: Any) -> None:
        deadline = time.monotonic() + scaled(15)
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    no_token = {"TIERED_ADMIN_TOKEN": ""}
    srv = ServerProcess(data, *args, env=no_token).start()
    try:
        for b in ("kept", "gone"):
            assert http("PUT", f"{srv.url}/v1/buckets/{b}")[0] == 201
        assert http("PUT", f"{srv.url}/v1/buckets/kept/stream/s", ct, b"".join(KEPT))[0] == 201
        wait(lambda: cold_objects(srv) == 1)
        assert http("PUT", f"{srv.url}/v1/buckets/gone/stream/s", ct, b"".join(GONE))[0] == 201
        wait(lambda: cold_objects(srv) == 2)
        kept_key, gone_key = sorted(object_files(data))
        assert http("DELETE", f"{srv.url}/v1/buckets/gone")[0] == 204
    finally:
        srv.kill()  # SIGKILL, no shutdown snapshot: the erasure must come back from the journal
    assert object_files(data) == {kept_key, gone_key}
    srv = ServerProcess(data, *args, env=no_token).start()
    try:
        assert http("PUT", f"{srv.url}/v1/buckets/gone")[0] == 409
        status, _, raw = http("POST", srv.url + "/v1/admin/gc")
        report = json.loads(raw)
        assert status == 200 and report["objects_deleted"] == 1 and report["integrity_errors"] == [], report
        assert object_files(data) == {kept_key}
        assert http("GET", f"{srv.url}/v1/buckets/kept/stream/s?offset=-1")[2] == b"".join(KEPT)
    finally:
        srv.stop()
