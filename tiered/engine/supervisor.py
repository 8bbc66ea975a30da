"""Background jobs, named, started, restarted and stopped by one supervisor, and reported.

A job is a coroutine that runs until cancelled; jobs handle their own
expected failures (a store outage, a full journal). One that crashes anyway
is logged and restarted after a capped exponential backoff (``Backoff``), so
a bug in one pass cannot silently end flushing, GC or a cluster loop for the
life of the process, and a job that crashes at once every time does not spin.

Every job is reported, by name: ``report()`` for ``/readyz`` and
``families()`` for ``/metrics`` (restarts, last crash, whether it runs).
``problems()`` names what makes the owner not ready: a job crash-looping
(``crash_loop_after`` crashes in a row, each before it ran ``Backoff.stable_s``,
until a restart has run that long) or one that ended by itself while it should run. Each owner of jobs (a single
server's engine, each shard's engine, a cluster node) has one supervisor; the
class is the one place that decides how a loop is run.

Time comes from the ``Clock`` (crash times, how long a run lasted) and waits
from ``sleep``, so a test drives both and never sleeps for real.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tiered.core.clock import Clock

log = logging.getLogger(__name__)

Job = Callable[[], Coroutine[Any, Any, None]]
Sleep = Callable[[float], Awaitable[None]]

#: What a job is doing: running, waiting to be restarted after a crash, or ended by itself.
RUNNING, BACKOFF, ENDED = "running", "backoff", "ended"


@dataclass(frozen=True, slots=True)
class Backoff:
    """The pause before restarting a crashed job: ``base_s``, doubled per crash in a row, at most ``cap_s``.

    A run that lasted ``stable_s`` or more before it crashed starts the count again.
    """

    base_s: float = 1.0
    cap_s: float = 60.0
    stable_s: float = 60.0

    def delay(self, crashes_in_a_row: int) -> float:
        return min(self.cap_s, self.base_s * 2.0 ** max(0, crashes_in_a_row - 1))


@dataclass(slots=True)
class JobStatus:
    """One job, as ``/readyz`` and ``/metrics`` show it."""

    name: str
    state: str = RUNNING
    restarts: int = 0  # crashes after which it was (or is being) restarted
    in_a_row: int = 0  # crashes since it last ran ``stable_s``
    last_crash_ms: int = 0  # wall time of the last crash (0: never)
    last_error: str = ""
    started: float = 0.0  # monotonic time of its latest (re)start

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "restarts": self.restarts}
        if self.last_crash_ms:
            out["last_crash_ms"] = self.last_crash_ms
            out["last_error"] = self.last_error
        return out


class Supervisor:
    def __init__(
        self,
        clock: Clock,
        *,
        backoff: Backoff = Backoff(),
        crash_loop_after: int = 3,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.clock = clock
        self.backoff = backoff
        self.crash_loop_after = crash_loop_after
        self._sleep = sleep
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._drain: set[str] = set()
        self.status: dict[str, JobStatus] = {}
        self.stopping = False

    def start(self, name: str, job: Job, *, drain: bool = False) -> None:
        """Run ``job`` as ``name`` until stopped. ``drain``: ``stop`` waits for it to end by itself
        (its owner signals it first: a loop that hands shards off on its way out) instead of cancelling it."""
        if name in self._tasks:
            raise ValueError(f"job {name} is already running")
        self.status[name] = JobStatus(name)
        if drain:
            self._drain.add(name)
        self._tasks[name] = asyncio.create_task(self._supervise(self.status[name], job), name=name)

    async def _supervise(self, status: JobStatus, job: Job) -> None:
        while True:
            status.started = self.clock.monotonic()
            status.state = RUNNING
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.clock.monotonic() - status.started >= self.backoff.stable_s:
                    status.in_a_row = 0
                status.in_a_row += 1
                status.restarts += 1
                status.last_crash_ms = self.clock.now_ms()
                status.last_error = repr(exc)[:200]
                delay = self.backoff.delay(status.in_a_row)
                log.exception(
                    "background job %s crashed (%d in a row); restarting in %.1fs",
                    status.name,
                    status.in_a_row,
                    delay,
                )
                status.state = BACKOFF
                await self._sleep(delay)
            else:
                status.state = ENDED
                if not self.stopping:
                    log.error("background job %s ended by itself; it is not restarted", status.name)
                return

    @property
    def names(self) -> list[str]:
        return sorted(self._tasks)

    async def stop(self) -> None:
        """Wait for the draining jobs that still run, cancel the rest, and wait for each to finish."""
        self.stopping = True
        tasks = dict(self._tasks)
        self._tasks.clear()
        draining = [
            t for name, t in tasks.items() if name in self._drain and self.status[name].state == RUNNING
        ]
        for task in tasks.values():
            if task not in draining:
                task.cancel()
        for result in await asyncio.gather(*draining, return_exceptions=True):
            if isinstance(result, Exception):
                log.error("a background job failed while stopping: %r", result)
        await asyncio.gather(*tasks.values(), return_exceptions=True)

    # ------------------------------------------------------------- reports

    def problems(self) -> list[str]:
        """What makes the owner not ready, one line per job (empty: every job runs as it should)."""
        if self.stopping:
            return []
        out = []
        now = self.clock.monotonic()
        for name, s in sorted(self.status.items()):
            if s.state == ENDED:
                out.append(f"{name}: stopped (ended by itself)")
            elif s.in_a_row >= self.crash_loop_after and (
                s.state == BACKOFF or now - s.started < self.backoff.stable_s
            ):  # until a restart has run ``stable_s``
                out.append(f"{name}: crash-looping ({s.in_a_row} crashes in a row; last: {s.last_error})")
        return out

    def report(self) -> dict[str, dict[str, Any]]:
        """Every job by name, for ``/readyz``."""
        return {name: s.as_json() for name, s in sorted(self.status.items())}

    def families(self) -> Iterator[Metric]:
        """``tiered_job_restarts_total``, ``tiered_job_last_crash_timestamp_seconds`` and ``tiered_job_up``, by job."""
        restarts = CounterMetricFamily(
            "tiered_job_restarts",
            "Background jobs restarted after a crash, by job",
            labels=["job"],
        )
        crashed = GaugeMetricFamily(
            "tiered_job_last_crash_timestamp_seconds",
            "When a background job last crashed (Unix seconds; 0: never), by job",
            labels=["job"],
        )
        up = GaugeMetricFamily(
            "tiered_job_up",
            "1 while a background job runs; 0 while it waits to be restarted or after it ended, by job",
            labels=["job"],
        )
        for name, s in sorted(self.status.items()):
            restarts.add_metric([name], s.restarts)
            crashed.add_metric([name], s.last_crash_ms / 1000)
            up.add_metric([name], 1 if s.state == RUNNING else 0)
        yield restarts
        yield crashed
        yield up
