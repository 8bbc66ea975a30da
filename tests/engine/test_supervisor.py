"""The supervisor: a crashed job is restarted after a capped exponential backoff, and every job is reported.

Time is the test's: a ``VirtualClock`` for crash times and run lengths, and a
``sleep`` that records each backoff and returns at once (or holds the job
until the test lets it go), so no test waits for a real backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tiered.core.clock import VirtualClock
from tiered.engine.supervisor import BACKOFF, ENDED, RUNNING, Backoff, Supervisor

pytestmark = pytest.mark.timeout(30)


class Sleeps:
    """A ``sleep`` that records each pause; from pause ``hold_at`` on it waits until ``release``."""

    def __init__(self, hold_at: int | None = None) -> None:
        self.pauses: list[float] = []
        self.hold_at = hold_at
        self.held = asyncio.Event()
        self._go = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if self.hold_at is not None and len(self.pauses) >= self.hold_at:
            self.held.set()
            await self._go.wait()
            self._go.clear()
        await asyncio.sleep(0)

    def release(self) -> None:
        """Every pause from now on returns at once."""
        self.hold_at = None
        self._go.set()

    def release_one(self) -> None:
        """The pause held now returns; the next ones up to ``hold_at`` too."""
        self._go.set()


def crashing(runs: list[int], clock: VirtualClock | None = None, ran_s: float = 0) -> Callable[[], object]:
    """A job that crashes every time, after ``ran_s`` seconds of (virtual) work."""

    async def job() -> None:
        runs.append(1)
        if clock is not None and ran_s:
            clock.advance(int(ran_s * 1000))
        raise RuntimeError(f"crash {len(runs)}")

    return job


async def until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0)


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(base_s=1, cap_s=10)
    assert [backoff.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_a_crashing_job_is_restarted_with_backoff_and_reported_crash_looping() -> None:
    async def scenario() -> None:
        clock = VirtualClock()
        sleeps = Sleeps(hold_at=5)
        supervisor = Supervisor(clock, backoff=Backoff(base_s=1, cap_s=8), sleep=sleeps)
        runs: list[int] = []
        supervisor.start("boom", crashing(runs))  # type: ignore[arg-type]
        await asyncio.wait_for(sleeps.held.wait(), 10)
        assert sleeps.pauses == [1, 2, 4, 8, 8]  # doubled per crash in a row, capped
        assert len(runs) == 5
        status = supervisor.status["boom"]
        assert (status.state, status.restarts, status.in_a_row) == (BACKOFF, 5, 5)
        assert status.last_crash_ms == clock.now_ms() and "RuntimeError('crash 5')" == status.last_error
        assert supervisor.problems() == [
            "boom: crash-looping (5 crashes in a row; last: RuntimeError('crash 5'))"
        ]
        report = supervisor.report()["boom"]
        assert report == {
            "state": "backoff",
            "restarts": 5,
            "last_crash_ms": clock.now_ms(),
            "last_error": "RuntimeError('crash 5')",
        }
        families = {f.name: f for f in supervisor.families()}
        [restarts] = families["tiered_job_restarts"].samples
        assert (restarts.labels, restarts.value) == ({"job": "boom"}, 5)
        [crashed] = families["tiered_job_last_crash_timestamp_seconds"].samples
        assert crashed.value == clock.now_ms() / 1000
        [up] = families["tiered_job_up"].samples
        assert up.value == 0  # waiting to be restarted
        await supervisor.stop()
        assert supervisor.problems() == []  # stopping: nothing is expected to run

    asyncio.run(scenario())


def test_one_crash_is_not_a_crash_loop_and_a_long_run_starts_the_count_again() -> None:
    async def scenario() -> None:
        clock = VirtualClock()
        sleeps = Sleeps()
        supervisor = Supervisor(
            clock, backoff=Backoff(base_s=1, cap_s=60, stable_s=30), crash_loop_after=3, sleep=sleeps
        )
        runs: list[int] = []
        crashes_after = [0.0, 0.0, 40.0, 0.0]  # the third run lasts 40 s (virtual) before it crashes
        finished = asyncio.Event()

        async def job() -> None:
            runs.append(1)
            if len(runs) > len(crashes_after):
                await finished.wait()  # runs on, healthy
                return
            clock.advance(int(crashes_after[len(runs) - 1] * 1000))
            raise RuntimeError("boom")

        supervisor.start("flaky", job)
        await until(lambda: len(runs) == 5)
        # 1 s, 2 s; then a 40 s run (longer than stable_s) starts the count again: 1 s, 2 s.
        assert sleeps.pauses == [1, 2, 1, 2]
        status = supervisor.status["flaky"]
        assert (status.state, status.restarts, status.in_a_row) == (RUNNING, 4, 2)
        assert supervisor.problems() == []  # two in a row: below crash_loop_after
        await supervisor.stop()

    asyncio.run(scenario())


def test_a_job_that_ends_by_itself_is_reported_stopped_and_not_restarted() -> None:
    async def scenario() -> None:
        supervisor = Supervisor(VirtualClock(), sleep=Sleeps())
        calls: list[int] = []

        async def once() -> None:
            calls.append(1)

        supervisor.start("once", once)
        await until(lambda: supervisor.status["once"].state == ENDED)
        await asyncio.sleep(0)
        assert calls == [1]
        assert supervisor.problems() == ["once: stopped (ended by itself)"]
        await supervisor.stop()

    asyncio.run(scenario())


def test_stop_waits_for_draining_jobs_and_cancels_the_others() -> None:
    async def scenario() -> None:
        supervisor = Supervisor(VirtualClock(), sleep=Sleeps())
        stop = asyncio.Event()
        handed_off: list[str] = []
        cancelled: list[str] = []

        async def lease_loop() -> None:
            await stop.wait()
            await asyncio.sleep(0)
            handed_off.append("every shard")  # what the lease loop does on its way out

        async def other() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append("other")
                raise

        supervisor.start("membership", lease_loop, drain=True)
        supervisor.start("other", other)
        await asyncio.sleep(0)
        with pytest.raises(ValueError):
            supervisor.start("other", other)
        stop.set()
        await supervisor.stop()
        assert handed_off == ["every shard"] and cancelled == ["other"]
        assert supervisor.names == []

    asyncio.run(scenario())
