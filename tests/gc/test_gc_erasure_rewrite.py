"""Erasure that reaches every byte: shared cold objects rewritten without the erased bucket's rows.

* Streams of ``alpha`` and ``beta`` share one Parquet object. Erasing ``alpha`` makes the
  next GC pass rewrite it with beta's rows only (upload before commit, commit before
  release); the old object is deleted once the grace delay has passed. After the
  deadline every remaining object, opened with pyarrow, holds no row, no payload byte
  and no footer statistic of ``alpha``; beta reads byte-exact throughout and after
  restarts; ``tiered verify``'s checks pass.
* The admin report (``GET /v1/admin/erasure``) lists per erased bucket the objects still
  holding its bytes, their status and until when; ``verify_erasure`` fails past the
  deadline while one is left.
* A crash between every two steps of the rewrite (intent journaled / uploaded / committed
  / old object's delete started / deleted) loses nothing acknowledged, serves nothing
  twice, and leaves no object behind once reconciliation ran.
* A release racing the rewrite (retention past beta's range, or beta's erasure, landing
  between the upload and the commit) wins: the range stays released, both objects go.
* Rows a fork in another bucket inherited stay (``inherited by forks``), exempt from the
  deadline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.gc.test_gc_faults import SimulatedCrash, die_here
from tests.support.gc_support import (
    ControlledStore,
    Harness,
    HttpHarness,
    VirtualClock,
    journal_records,
    make_config,
    object_files,
)
from tests.support.s3_backends import backend_for
from tiered.cli.verify import verify_cold, verify_erasure
from tiered.core.config import Config
from tiered.engine.jobs.rewrite_plan import AWAITING_DELETE, INHERITED, PENDING, erasure_report
from tiered.engine.streams.records import ColdCopyAborted, ColdCopyStarted, ColdRewriteCommitted

pytestmark = pytest.mark.timeout(120)

GRACE_S = 10.0
GRACE_MS = int(GRACE_S * 1000)
DEADLINE_S = 3600.0
DEADLINE_MS = int(DEADLINE_S * 1000)

A_DATA = [b"ALPHA-SECRET-" + bytes(range(256)) * 4, b"ALPHA-SECRET-second", b"ALPHA-SECRET-" + b"\x01" * 900]
B_DATA = [b"beta-" + bytes(range(200)) * 11, b"\xfe" * 3000, b"beta-last"]
C_DATA = [b"gamma-" + b"\x02" * 1500, b"gamma-last"]


def _config(tmp_path: Path) -> Config:
    return make_config(tmp_path / "data", gc_grace_s=GRACE_S, erasure_deadline_s=DEADLINE_S)


async def _shared_object(h: Harness) -> str:
    """alpha/a, beta/b and beta/c flushed into one object; returns its key."""
    for b in ("alpha", "beta"):
        await h.bucket(b)
    await h.create("alpha", "a", A_DATA[0])
    await h.create("beta", "b", B_DATA[0])
    await h.create("beta", "c", C_DATA[0])
    for data in A_DATA[1:]:
        await h.append("alpha", "a", data)
    for data in B_DATA[1:]:
        await h.append("beta", "b", data)
    await h.append("beta", "c", C_DATA[1])
    assert await h.flush() == 1
    [key] = h.s.state.cold_objects
    return key


async def _beta_reads(h: Harness) -> None:
    assert await h.read("beta", "b") == b"".join(B_DATA)
    assert await h.read("beta", "c") == b"".join(C_DATA)
    assert await h.read("beta", "b", len(B_DATA[0])) == b"".join(B_DATA[1:])


def assert_no_alpha_byte(data_dir: Path) -> None:
    """Open every object left with pyarrow: no row, no payload byte, no footer statistic of alpha."""
    for key in object_files(data_dir):
        path = data_dir / "cold" / key
        table = pq.read_table(path)
        assert "alpha" not in set(table.column("bucket").to_pylist()), key
        for payload in table.column("payload").to_pylist():
            assert b"ALPHA-SECRET" not in payload, key
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            stats = meta.row_group(rg).column(0).statistics
            assert stats is None or "alpha" not in (stats.min, stats.max), key
        raw = path.read_bytes()
        assert b"alpha" not in raw and b"ALPHA-SECRET" not in raw, key


async def stored_objects(h: Harness) -> dict[str, bytes]:
    """Every object under the data prefix, as the store (local or S3) holds it."""
    store = h.s.store
    assert store is not None
    return {info.key: await store.get(info.key) async for info in store.list("data/")}


async def assert_no_alpha_byte_stored(h: Harness) -> None:
    """The same as ``assert_no_alpha_byte``, through the store: no row, payload or statistic of alpha."""
    for key, raw in (await stored_objects(h)).items():
        table = pq.read_table(pa.BufferReader(raw))
        assert "alpha" not in set(table.column("bucket").to_pylist()), key
        assert not any(b"ALPHA-SECRET" in p for p in table.column("payload").to_pylist()), key
        assert b"alpha" not in raw and b"ALPHA-SECRET" not in raw, key


async def _converge(h: Harness, now: int) -> None:
    """GC passes until nothing is left to do: rewrite, delete past the grace, reconcile."""
    for at in (now, now + GRACE_MS, now + 2 * GRACE_MS, now + 3 * GRACE_MS):
        report = await h.gc(at)
        assert report.errors == [] and report.integrity_errors == [], report


async def _no_leak(h: Harness) -> None:
    state = h.s.state
    assert set(await stored_objects(h)) == set(state.cold_objects)
    assert all(obj.refs > 0 for obj in state.cold_objects.values())
    assert state.copies_in_flight == {}


async def _verified(h: Harness, now: int) -> None:
    report = await verify_cold(h.s.state, h.s.store)
    assert report.errors == [], report.errors
    assert verify_erasure(h.s.state, h.config, now) == []


# --------------------------------------------------------------------------- the rewrite


def test_erasure_rewrites_the_shared_object_and_no_byte_of_the_erased_bucket_is_left(tmp_path: Path) -> None:
    config = _config(tmp_path)
    clock = VirtualClock()
    h = Harness(config, clock=clock)

    async def body() -> None:
        await h.start()
        old = await _shared_object(h)
        old_size = h.s.state.cold_objects[old].size
        clock.advance(1_000)
        await h.s.streams.erase_bucket("alpha")
        erased_at = clock.ms
        report = erasure_report(h.s.state, clock.ms, DEADLINE_MS, GRACE_MS)
        [entry] = report.buckets
        assert entry.bucket == "alpha" and entry.deadline_ms == erased_at + DEADLINE_MS
        [held] = entry.objects
        assert held.key == old and held.status == PENDING and held.owners == {"beta": 2}
        assert held.bytes == sum(map(len, A_DATA)) and held.until_ms == erased_at + DEADLINE_MS
        assert not held.overdue

        dry = await h.s.gc.run_pass(dry_run=True, now_ms=clock.ms)
        assert [w["key"] for w in dry.would_rewrite] == [old] and object_files(config.data_path) == {old}

        gc = await h.gc(clock.ms)
        assert gc.objects_rewritten == 1 and gc.errors == [] and gc.integrity_errors == []
        state = h.s.state
        [new] = set(state.cold_objects) - {old}
        assert state.cold_objects[old].refs == 0 and state.cold_objects[old].released_ms == clock.ms
        assert state.cold_objects[new].refs == 2 and state.cold_objects[new].size < old_size
        assert h.cold_keys_of("beta", "b") == {new} and h.cold_keys_of("beta", "c") == {new}
        assert {(e.bucket, e.stream) for e in state.cold_objects[new].index.streams} == {
            ("beta", "b"),
            ("beta", "c"),
        }
        await _beta_reads(h)
        [held] = erasure_report(state, clock.ms, DEADLINE_MS, GRACE_MS).buckets[0].objects
        assert held.key == old and held.status == AWAITING_DELETE and held.until_ms == clock.ms + GRACE_MS
        # Idempotent: nothing more to rewrite.
        again = await h.gc(clock.ms + 1)
        assert again.objects_rewritten == 0 and set(state.cold_objects) == {old, new}

        gone = await h.gc(clock.ms + GRACE_MS)
        assert gone.objects_deleted == 1 and object_files(config.data_path) == {new}
        assert erasure_report(h.s.state, clock.ms, DEADLINE_MS, GRACE_MS).buckets[0].objects == []
        await _verified(h, erased_at + DEADLINE_MS + 1)
        assert_no_alpha_byte(config.data_path)

        for crash in (True, False):
            await h.restart(crash=crash)
            await _beta_reads(h)
            assert set(h.s.state.cold_objects) == {new} and h.s.state.cold_objects[new].refs == 2
            await _verified(h, erased_at + DEADLINE_MS + 1)
        await h.stop()

    asyncio.run(body())
    records = journal_records(config.data_path)
    [commit] = [r for r in records if isinstance(r, ColdRewriteCommitted)]
    [intent] = [r for r in records if isinstance(r, ColdCopyStarted) and r.key == commit.new_key]
    assert intent.ranges == () and records.index(intent) < records.index(commit)


def test_report_and_verify_fail_past_the_deadline_until_the_rewrite_ran(tmp_path: Path) -> None:
    config = _config(tmp_path)
    clock = VirtualClock()
    h = HttpHarness(config, clock=clock)

    async def body() -> None:
        await h.start()
        old = await _shared_object(h)
        await h.s.streams.erase_bucket("alpha")
        erased_at = clock.ms
        assert (
            verify_erasure(h.s.state, config, erased_at + DEADLINE_MS) == []
        )  # at the deadline: not past it
        [problem] = verify_erasure(h.s.state, config, erased_at + DEADLINE_MS + 1)
        assert old in problem and "'alpha'" in problem and PENDING in problem
        clock.ms = erased_at + DEADLINE_MS + 1
        status, headers, raw = await h.http("GET", "/v1/admin/erasure")
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        report = json.loads(raw)
        assert report["overdue"] == 1 and report["deadline_s"] == DEADLINE_S
        [bucket] = report["buckets"]
        assert bucket["bucket"] == "alpha" and bucket["erased_ms"] == erased_at and bucket["overdue"] == 1
        [obj] = bucket["objects"]
        assert obj["key"] == old and obj["status"] == PENDING and obj["owners"] == {"beta": 2}
        assert obj["overdue"] is True
        assert (await h.http("POST", "/v1/admin/erasure"))[0] == 405

        status, _, raw = await h.http("POST", "/v1/admin/gc")
        assert status == 200 and json.loads(raw)["objects_rewritten"] == 1
        # Rewritten, but the old object waits out the grace delay: still overdue until it is deleted.
        [problem] = verify_erasure(h.s.state, config, clock.ms)
        assert AWAITING_DELETE in problem
        clock.advance(GRACE_MS)
        await h.http("POST", "/v1/admin/gc")
        assert verify_erasure(h.s.state, config, clock.ms) == []
        report = json.loads((await h.http("GET", "/v1/admin/erasure"))[2])
        assert report["overdue"] == 0 and report["buckets"][0]["objects"] == []
        await _beta_reads(h)
        assert_no_alpha_byte(config.data_path)
        await h.stop()

    asyncio.run(body())


def test_grace_must_stay_below_the_erasure_deadline(tmp_path: Path) -> None:
    from tiered.core.config import ConfigError

    with pytest.raises(ConfigError, match="gc_grace_s must be below erasure_deadline_s"):
        make_config(tmp_path, gc_grace_s=100.0, erasure_deadline_s=100.0)


def test_rows_a_fork_in_another_bucket_inherited_stay_and_are_exempt(tmp_path: Path) -> None:
    config = _config(tmp_path)
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    inherited = b"ALPHA-inherited:" + bytes(range(256)) * 4

    async def body() -> None:
        await h.start()
        for b in ("alpha", "beta"):
            await h.bucket(b)
        await h.create("alpha", "src", inherited)
        await h.create("alpha", "other", b"ALPHA-SECRET-other" * 50)
        await h.create("beta", "b", B_DATA[0])
        assert await h.flush() == 1
        await h.create("beta", "fork", fork_from=("alpha", "src"), fork_offset=len(inherited))
        await h.s.streams.erase_bucket("alpha")
        erased_at = clock.ms
        gc = await h.gc(clock.ms)
        assert gc.objects_rewritten == 1
        await h.gc(clock.ms + GRACE_MS)
        [new] = h.s.state.cold_objects
        assert {(e.bucket, e.stream) for e in h.s.state.cold_objects[new].index.streams} == {
            ("alpha", "src"),
            ("beta", "b"),
        }
        [held] = erasure_report(h.s.state, clock.ms, DEADLINE_MS, GRACE_MS).buckets[0].objects
        assert held.status == INHERITED and held.until_ms is None and held.bytes == len(inherited)
        assert verify_erasure(h.s.state, config, erased_at + 10 * DEADLINE_MS) == []
        assert await h.read("beta", "fork") == inherited
        assert await h.read("beta", "b") == B_DATA[0]
        table = pq.read_table(config.data_path / "cold" / new)
        assert not any(b"ALPHA-SECRET-other" in p for p in table.column("payload").to_pylist())
        await h.stop()

    asyncio.run(body())


# --------------------------------------------------------------------------- crashes and races


class StepStore(ControlledStore):
    """Runs ``before_put`` / ``after_put`` / ``before_delete`` (once each) around the store's calls;
    ``hooked`` picks the puts the hooks are for (a test of one writer among several)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.hooked: Callable[[str], bool] = lambda key: True
        self.before_put: Callable[[], Awaitable[None]] | None = None
        self.after_put: Callable[[], Awaitable[None]] | None = None
        self.before_delete: Callable[[], Awaitable[None]] | None = None

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> Any:
        if not self.hooked(key):
            return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        hook, self.before_put = self.before_put, None
        if hook is not None:
            await hook()
        info = await super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        hook, self.after_put = self.after_put, None
        if hook is not None:
            await hook()
        return info

    async def delete_many(self, keys: Any) -> Any:
        hook, self.before_delete = self.before_delete, None
        if hook is not None:
            await hook()
        return await super().delete_many(keys)


CRASH_POINTS = ["intent-journaled", "uploaded", "committed", "delete-journaled", "deleted"]


@pytest.fixture(params=["local", "moto"])
def store_config(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Config]:
    """The node's config on the local store, or on moto's S3 server (real HTTP) under a fresh prefix."""
    if request.param == "local":
        yield _config(tmp_path)
        return
    with backend_for(request.param, request, monkeypatch) as backend:
        yield make_config(
            tmp_path / "data", gc_grace_s=GRACE_S, erasure_deadline_s=DEADLINE_S, **backend.config()
        )


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_between_any_two_steps_loses_nothing_and_leaks_nothing(
    store_config: Config, point: str
) -> None:
    config = store_config
    clock = VirtualClock()
    h = Harness(config, StepStore, clock=clock)

    def die() -> None:
        die_here(h.s, point)

    async def crash_now() -> None:
        die()

    async def body() -> None:
        await h.start()
        old = await _shared_object(h)
        await h.s.streams.erase_bucket("alpha")
        erased_at = clock.ms
        store = h.s.gc.ctx.store
        assert isinstance(store, StepStore)
        if point == "intent-journaled":
            store.before_put = crash_now
        elif point == "uploaded":
            store.after_put = crash_now
        if point in ("intent-journaled", "uploaded"):
            with pytest.raises(SimulatedCrash):
                await h.gc(clock.ms)
        else:
            assert (await h.gc(clock.ms)).objects_rewritten == 1
            if point != "committed":  # "committed": the process dies right after the commit
                store.before_delete = crash_now
                if point == "deleted":
                    # The store delete runs, then the process dies before ColdDeleteFinished.
                    async def delete_then_die() -> None:
                        await store.inner.delete_many([old])
                        die()

                    store.before_delete = delete_then_die
                with pytest.raises(SimulatedCrash):
                    await h.gc(clock.ms + GRACE_MS)
        await h.restart(crash=True)
        await _beta_reads(h)
        assert "alpha" in h.s.state.erased_buckets
        clock.advance(1)
        await _converge(h, clock.ms)
        await _beta_reads(h)
        await _no_leak(h)
        [new] = h.s.state.cold_objects
        assert new != old
        await assert_no_alpha_byte_stored(h)
        await _verified(h, erased_at + DEADLINE_MS + 1)
        await h.restart(crash=True)
        await _beta_reads(h)
        await h.stop()

    asyncio.run(body())
    records = journal_records(config.data_path)
    commits = [r for r in records if isinstance(r, ColdRewriteCommitted)]
    assert len(commits) == 1
    if point in ("intent-journaled", "uploaded"):
        aborted = [r for r in records if isinstance(r, ColdCopyAborted)]
        assert len(aborted) == 1 and aborted[0].key != commits[0].new_key


@pytest.mark.parametrize("release", ["retention", "erase-beta", "delete-stream"])
def test_a_release_racing_the_rewrite_wins_and_both_objects_go(store_config: Config, release: str) -> None:
    """The release lands between the upload and the commit (Redpanda's orphaned segments, AutoMQ's race)."""
    config = store_config
    clock = VirtualClock()
    h = Harness(config, StepStore, clock=clock)

    async def body() -> None:
        await h.start()
        old = await _shared_object(h)
        await h.s.streams.erase_bucket("alpha")
        store = h.s.gc.ctx.store
        assert isinstance(store, StepStore)

        async def release_now() -> None:
            if release == "retention":
                await h.s.streams.retain_from("beta", "b", sum(map(len, B_DATA)))
            elif release == "erase-beta":
                await h.s.streams.erase_bucket("beta")
            else:
                await h.s.streams.delete("beta", "b")

        store.after_put = release_now
        gc = await h.gc(clock.ms)
        assert gc.objects_rewritten == 1 and gc.errors == []
        state = h.s.state
        [new] = set(state.cold_objects) - {old}
        survivors = 0 if release == "erase-beta" else 1  # beta/c still reads, unless beta went too
        assert state.cold_objects[new].refs == survivors
        assert state.cold_objects[old].refs == 0
        if release == "retention":
            assert await h.read("beta", "b") == b""
        if survivors:
            assert await h.read("beta", "c") == b"".join(C_DATA)
        await _converge(h, clock.ms + 1)
        await _no_leak(h)
        assert len(h.s.state.cold_objects) == survivors
        await assert_no_alpha_byte_stored(h)
        for crash in (True, False):
            await h.restart(crash=crash)
            await _no_leak(h)
            if survivors:
                assert await h.read("beta", "c") == b"".join(C_DATA)
        await h.stop()

    asyncio.run(body())


# --------------------------------------------------------------------------- a real SIGKILL


@pytest.mark.parametrize("kill", ["after-rewrite", "during-gc"])
def test_sigkill_of_a_real_server_around_the_rewrite(tmp_path: Path, kill: str) -> None:
    """``tiered serve`` SIGKILLed right after the rewrite (old object not yet deleted), or while the GC
    request is in flight (wherever it is): after a restart beta reads byte-exact, GC and reconciliation
    leave exactly one object, with no byte of alpha, and ``tiered verify`` passes."""
    import subprocess
    import sys
    import threading
    import time

    from tests.support.deadlines import Deadline
    from tests.support.http_helpers import request as http
    from tests.support.server_process import ServerProcess

    data = tmp_path / "data"
    args = (
        *("--flush-interval-s", "3600", "--flush-bytes", "4096", "--hot-retention-s", "0"),
        *("--gc-grace-s", "1", "--gc-interval-s", "3600", "--erasure-deadline-s", "600"),
    )
    env = {"TIERED_ADMIN_TOKEN": ""}
    ct = {"Content-Type": "application/octet-stream"}
    alpha, beta = b"".join(A_DATA), b"".join(B_DATA)

    def wait(cond: Callable[[], bool]) -> None:
        deadline = Deadline(15)
        while not cond():
            assert not deadline.expired(), "timed out"
            time.sleep(0.05)

    srv = ServerProcess(data, *args, env=env).start()
    try:
        for b in ("alpha", "beta"):
            assert http("PUT", f"{srv.url}/v1/buckets/{b}")[0] == 201
        for b, p in (("alpha", "a"), ("beta", "b")):
            assert http("PUT", f"{srv.url}/v1/buckets/{b}/stream/{p}", ct)[0] == 201
        assert http("POST", f"{srv.url}/v1/buckets/alpha/stream/a", ct, alpha)[0] == 204
        assert http("POST", f"{srv.url}/v1/buckets/beta/stream/b", ct, beta)[0] == 204  # crosses flush bytes
        wait(lambda: len(object_files(data)) == 1)
        [old] = object_files(data)
        assert set(pq.read_table(data / "cold" / old).column("bucket").to_pylist()) == {"alpha", "beta"}
        assert http("DELETE", f"{srv.url}/v1/buckets/alpha")[0] == 204
        if kill == "after-rewrite":
            status, _, raw = http("POST", srv.url + "/v1/admin/gc")
            assert status == 200 and json.loads(raw)["objects_rewritten"] == 1
            assert len(object_files(data)) == 2
        else:
            threading.Thread(
                target=lambda: _swallow(http, "POST", srv.url + "/v1/admin/gc"), daemon=True
            ).start()
            time.sleep(0.02)
    finally:
        srv.kill()
    srv = ServerProcess(data, *args, env=env).start()
    try:
        assert http("GET", f"{srv.url}/v1/buckets/beta/stream/b?offset=-1")[2] == beta
        deadline = Deadline(30)
        while True:
            status, _, raw = http("POST", srv.url + "/v1/admin/gc")
            report = json.loads(raw)
            assert status == 200 and report["errors"] == [] and report["integrity_errors"] == [], report
            if len(object_files(data)) == 1 and old not in object_files(data):
                break
            assert not deadline.expired(), (object_files(data), report)
            time.sleep(0.3)  # the grace delay (1 s) passes in real time
        erasure = json.loads(http("GET", srv.url + "/v1/admin/erasure")[2])
        assert erasure["overdue"] == 0 and erasure["buckets"][0]["objects"] == []
        assert http("GET", f"{srv.url}/v1/buckets/beta/stream/b?offset=-1")[2] == beta
    finally:
        srv.stop()
    assert_no_alpha_byte(data)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiered.cli",
            "verify",
            "--data-dir",
            str(data),
            "--erasure-deadline-s",
            "600",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _swallow(http: Callable[..., Any], *args: Any) -> None:
    try:
        http(*args)
    except Exception:
        pass  # the server was killed under it


@pytest.mark.parametrize("damage", ["flipped-bit", "missing"])
def test_a_damaged_object_is_never_rewritten_and_is_reported(tmp_path: Path, damage: str) -> None:
    config = _config(tmp_path)
    clock = VirtualClock()
    h = Harness(config, clock=clock)

    async def body() -> None:
        await h.start()
        old = await _shared_object(h)
        path = config.data_path / "cold" / old
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 3] ^= 0x40  # one flipped bit in the middle of the rows
        if damage == "missing":
            path.unlink()
        else:
            path.write_bytes(bytes(raw))
        await h.s.streams.erase_bucket("alpha")
        for at in (clock.ms, clock.ms + GRACE_MS):
            report = await h.gc(at)
            assert report.objects_rewritten == 0 and report.errors == []
            # (reconciliation reports a missing object too)
            [problem] = [p for p in report.integrity_errors if p.startswith("erasure")]
            assert f"erasure cannot rewrite {old}" in problem
            assert ("CRC32C" if damage == "flipped-bit" else "missing from the object store") in problem
        assert object_files(config.data_path) == ({old} if damage == "flipped-bit" else set())
        assert set(h.s.state.cold_objects) == {old}
        assert h.s.state.copies_in_flight == {}
        [held] = erasure_report(h.s.state, clock.ms, DEADLINE_MS, GRACE_MS).buckets[0].objects
        assert held.status == PENDING  # still reported: the operator must act
        await h.stop()

    asyncio.run(body())
    assert not [
        r for r in journal_records(config.data_path) if isinstance(r, ColdCopyStarted) and r.ranges == ()
    ]


@pytest.mark.parametrize("mode", ["error", "hang"])
def test_a_failing_upload_is_reported_aborted_and_retried(tmp_path: Path, mode: str) -> None:
    config = _config(tmp_path)
    clock = VirtualClock()
    h = Harness(config, ControlledStore, clock=clock)

    async def body() -> None:
        await h.start()
        old = await _shared_object(h)
        await h.s.streams.erase_bucket("alpha")
        store = h.s.gc.ctx.store
        assert isinstance(store, ControlledStore)
        store.hang_s = 0.05
        store.fail_put = mode
        report = await h.gc(clock.ms)
        assert report.objects_rewritten == 0 and report.integrity_errors == []
        [error] = report.errors
        assert f"erasure rewrite of {old} failed" in error
        assert set(h.s.state.cold_objects) == {old} and h.s.state.copies_in_flight == {}
        await _beta_reads(h)
        store.fail_put = "ok"
        report = await h.gc(clock.ms + 1)
        assert report.objects_rewritten == 1 and report.errors == []
        await _converge(h, clock.ms + 2)
        await _no_leak(h)
        await assert_no_alpha_byte_stored(h)
        await _beta_reads(h)
        await h.stop()

    asyncio.run(body())
    records = journal_records(config.data_path)
    [aborted] = [r for r in records if isinstance(r, ColdCopyAborted)]
    assert "rewrite upload failed" in aborted.reason
