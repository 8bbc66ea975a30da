"""The engine built by its constructor: hooks reach each part through its constructor, parts stay frozen,
and every job runs under the engine's supervisor (a crashing one shows in ``/readyz`` and ``/metrics``).

One engine on a local store and a ``VirtualClock``; the hooks are stand-ins
for what a cluster plugs in (``tiered/cluster/compose.py``); HTTP goes
through the production handler, called in process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.test_supervisor import Sleeps
from tests.support.frozen import outside_assignments, part_classes
from tests.support.gc_support import VirtualClock, make_config
from tiered.api.app import build_handler
from tiered.api.kit.types import Request, Response
from tiered.core.config import Config
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.engine import Engine
from tiered.engine.hooks import EngineHooks, EngineView, Extension
from tiered.engine.streams.model import AppendRequest, CreateRequest, ForkRequest, Stream
from tiered.engine.streams.records import StreamCreated
from tiered.engine.streams.state import StreamState
from tiered.engine.supervisor import Backoff, Supervisor
from tiered.gc.context import GcContext, GcPass

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _admin_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_ADMIN_TOKEN", raising=False)  # loopback, auth off: admin routes open


class Forks:
    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def resolve(
        self, target: tuple[str, str], source: tuple[str, str], spec: str, headers: Any
    ) -> ForkRequest:
        self.asked.append(source)
        from tiered.core.errors import ErrorCode, TieredError

        raise TieredError(ErrorCode.FORK_SOURCE_NOT_FOUND, "no such source elsewhere either")

    async def release(self, bucket: str, path: str, spec: str, headers: Any = None) -> None:
        pass


class Remote:
    """Other shards' streams, as the subscriptions' shard sees them: none."""

    def tail(self, path: str) -> int | None:
        return None

    def paths(self) -> Iterable[str]:
        return []

    def retained(self, path: str) -> tuple[int, int] | None:
        return None


class Directory:
    async def view(self, local: StreamState, buckets: Iterable[str], *, fresh: bool) -> StreamState:
        return local


class Counted:
    """A GC task of the hooks: counts the passes it ran in."""

    name = "counted"

    def __init__(self) -> None:
        self.passes = 0

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        self.passes += 1


class Created:
    """An extension's commit observer: the streams created, seen from the engine's state."""

    def __init__(self, view: EngineView) -> None:
        self.view = view
        self.created: list[str] = []

    def before_apply(self, record: Any) -> object:
        return None

    def after_apply(self, record: Any, token: object) -> Sequence[Any]:
        if isinstance(record, StreamCreated):
            self.created.append(record.path)
        return ()

    def on_durable(self, record: Any) -> Callable[[], None] | None:
        return None


def _extension(built: list[Created], job: Callable[[], Awaitable[None]]) -> Callable[[EngineView], Extension]:
    def extension(view: EngineView) -> Extension:
        observer = Created(view)
        built.append(observer)
        return Extension(observers=(observer,), jobs={"extension-job": job})  # type: ignore[dict-item]

    return extension


async def _idle() -> None:
    await asyncio.Event().wait()


def _config(tmp_path: Path) -> Config:
    return make_config(tmp_path / "data", flush_interval_s=0.05, gc_interval_s=0.05)


async def _get(handler: Callable[[Request], Awaitable[Response]], path: str) -> tuple[int, bytes]:
    async def body() -> bytes:
        return b""

    response = await handler(Request("GET", path, "", {}, body))
    assert isinstance(response.body, bytes)
    return response.status, response.body


def job_samples(exposition: bytes) -> dict[tuple[str, str], float]:
    """(sample name, job label) -> value of every ``tiered_job_*`` sample."""
    return {
        (sample.name, sample.labels.get("job", "")): sample.value
        for family in text_string_to_metric_families(exposition.decode())
        if family.name.startswith("tiered_job_")
        for sample in family.samples
    }


async def _workload(engine: Engine) -> None:
    streams = engine.streams
    await streams.create_bucket("b")
    await streams.create("b", "s", CreateRequest("text/plain", None, None, None, False, b"one"))
    await streams.append("b", "s", AppendRequest("text/plain", b"two", False))
    stream = streams.lookup("b", "s")
    assert isinstance(stream, Stream)
    assert await engine.reader.read(stream, 0, 6) == b"onetwo"
    await engine.gc.run_pass()


def test_hooks_reach_each_part_through_its_constructor(tmp_path: Path) -> None:
    async def scenario() -> None:
        forks, remote, directory, counted = Forks(), Remote(), Directory(), Counted()
        built: list[Created] = []
        ran = asyncio.Event()

        async def job() -> None:
            ran.set()
            await _idle()

        async def append(path: str, event: bytes) -> bool:
            return True

        def others(bucket: str) -> tuple[int, int]:
            return (0, 0)

        hooks = EngineHooks(
            remote_forks=forks,
            remote_streams=remote,
            remote_append=append,
            quota_others=others,
            stream_directory=directory,
            gc_tasks=(counted,),
            extensions=(_extension(built, job),),
        )
        engine = Engine(_config(tmp_path), VirtualClock(), hooks=hooks)
        await engine.start(jobs=False)
        try:
            assert engine.streams.remote_forks is forks
            assert engine.subscriptions.remote_streams is remote
            assert engine.deliveries.remote_append is append
            assert engine.gate.others is others
            assert engine.groups.directory is directory
            assert engine.gc.tasks[-1] is counted
            [observer] = built
            assert observer.view.state is engine.state
            assert engine.committer.observers[-1] is observer  # after the engine's own
            assert "extension-job" in engine.jobs()
            await _workload(engine)
            assert observer.created == ["s"] and counted.passes == 1
            engine.start_jobs({"extension-job"})
            await asyncio.wait_for(ran.wait(), 10)
            assert engine.supervisor.names == ["extension-job"]
        finally:
            await engine.stop()

    asyncio.run(scenario())


def test_parts_are_frozen_once_composed_and_while_serving(tmp_path: Path) -> None:
    """No attribute of a part is set by anyone but the part itself, from construction through a workload."""

    async def scenario() -> None:
        config = _config(tmp_path)
        probe = Engine(config, VirtualClock())
        await probe.start(jobs=False)
        classes = part_classes(probe)
        await probe.stop()
        names = {c.__qualname__ for c in classes}
        assert {"StreamService", "StreamReader", "TimedFlusher", "TenantGate", "Committer"} <= names
        assert {"SubscriptionService", "SubscriptionDelivery", "GroupService", "GcRunner"} <= names
        built: list[Created] = []
        hooks = EngineHooks(
            remote_forks=Forks(),
            remote_streams=Remote(),
            stream_directory=Directory(),
            gc_tasks=(Counted(),),
            extensions=(_extension(built, _idle),),
        )
        with outside_assignments(classes) as seen:
            engine = Engine(config, VirtualClock(), hooks=hooks)
            await engine.start()  # every job runs: flusher and GC passes every 50 ms
            try:
                await _workload(engine)
                handler = build_handler(engine)
                assert (await _get(handler, "/readyz"))[0] in (200, 503)
                deadline = asyncio.get_running_loop().time() + 10
                while engine.gc.totals.passes < 2 and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                assert engine.gc.totals.passes >= 2
            finally:
                await engine.stop()
        assert seen == []

    asyncio.run(scenario())


def test_a_crashing_job_is_restarted_and_shows_in_readyz_and_metrics(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = VirtualClock()
        sleeps = Sleeps(hold_at=3)
        supervisor = Supervisor(clock, backoff=Backoff(base_s=1, cap_s=60, stable_s=60), sleep=sleeps)
        crashes: list[int] = []
        healthy = asyncio.Event()

        async def flaky() -> None:
            if len(crashes) < 3:
                crashes.append(1)
                raise RuntimeError("a bug in one pass")
            healthy.set()
            await _idle()

        hooks = EngineHooks(extensions=(_extension([], flaky),))
        engine = Engine(_config(tmp_path), clock, hooks=hooks, supervisor=supervisor)
        await engine.start(jobs=False)
        handler = build_handler(engine)
        try:
            assert engine.store is not None
            await engine.store_health.probe(engine.store, 5)
            assert (await _get(handler, "/readyz"))[0] == 200
            engine.start_jobs({"extension-job", "snapshots"})
            await asyncio.wait_for(sleeps.held.wait(), 10)
            assert sleeps.pauses == [1, 2, 4]
            status, raw = await _get(handler, "/readyz")
            body = json.loads(raw)
            assert status == 503 and body["ready"] is False
            assert body["jobs_failing"] == [
                "extension-job: crash-looping (3 crashes in a row; last: RuntimeError('a bug in one pass'))"
            ]
            assert body["jobs"]["extension-job"]["restarts"] == 3
            assert body["jobs"]["snapshots"] == {"state": "running", "restarts": 0}
            status, raw = await _get(handler, "/metrics")
            samples = job_samples(raw)
            assert status == 200
            assert samples["tiered_job_restarts_total", "extension-job"] == 3
            assert (
                samples["tiered_job_last_crash_timestamp_seconds", "extension-job"] == clock.now_ms() / 1000
            )
            assert samples["tiered_job_up", "extension-job"] == 0
            assert samples["tiered_job_up", "snapshots"] == 1
            # Restarted, it runs: still reported until it has run a minute, then ready again.
            sleeps.release()
            await asyncio.wait_for(healthy.wait(), 10)
            assert (await _get(handler, "/readyz"))[0] == 503
            clock.advance(60_000)
            assert (await _get(handler, "/readyz"))[0] == 200
            assert job_samples((await _get(handler, "/metrics"))[1])["tiered_job_up", "extension-job"] == 1
        finally:
            await engine.stop()

    asyncio.run(scenario())


def test_the_engine_of_one_server_has_no_hooks(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = Engine(_config(tmp_path), VirtualClock())
        await engine.start(jobs=False)
        try:
            assert engine.streams.remote_forks is None and engine.subscriptions.remote_streams is None
            assert engine.deliveries.remote_append is None and engine.gate.others is None
            assert engine.groups.directory is None and engine.extensions == []
            assert [t.name for t in engine.gc.tasks][-1] == "orphans"  # the single-node tasks only
            await engine.streams.create_bucket("b")
            assert DEFAULT_BUCKET in engine.state.buckets
        finally:
            await engine.stop()

    asyncio.run(scenario())


class Periodic(Counted):
    """A GC task of the hooks with a period of its own (as the fork-pin sweep and WAL GC are)."""

    name = "periodic"
    every_s = 0.05


def test_a_periodic_gc_task_runs_on_its_own_period_and_in_passes_asked_for(tmp_path: Path) -> None:
    async def scenario() -> None:
        periodic = Periodic()
        config = make_config(tmp_path / "data")  # passes every hour: only the task's own period is short
        engine = Engine(config, VirtualClock(), hooks=EngineHooks(gc_tasks=(periodic,)))
        await engine.start(jobs=False)
        try:
            engine.start_jobs({"gc"})
            deadline = asyncio.get_running_loop().time() + 10
            while periodic.passes < 3 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            assert periodic.passes >= 3 and engine.gc.totals.passes == 0  # alone, not as a scheduled pass
            before = periodic.passes
            report = await engine.gc.run_pass()  # asked for (admin API, offline): every task
            assert report.errors == [] and engine.gc.totals.passes == 1
            assert periodic.passes >= before + 1
        finally:
            await engine.stop()

    asyncio.run(scenario())
