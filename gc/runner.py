"""The GC runner: one pass runs every task in order; the server runs passes on a schedule.

One pass is bounded (``max_objects`` per task), resumable (every task is a
journaled lifecycle a restart continues) and idempotent (running it twice
changes nothing the first did not). ``tiered gc`` triggers one over the admin
API or runs one offline. Tasks, in order: expiry, producer expiry, retention,
hot copies and segments, released objects, reconciliation (every
``reconcile_interval_s``); then the engine's extra tasks (in cluster mode, the
garbage only a cluster has: ``tiered/cluster/gc/``).

A task with a period of its own (``every_s``: a ``PeriodicTask``) runs on it,
alone, and is left out of scheduled passes; a pass asked for (admin API,
offline) runs it with the others. It has a lock of its own (never two runs of
one task at once), so a slow one (the fork-pin sweep asks other nodes) never
holds up the passes. So one runner, one job (``gc``), collects every kind of
garbage of an engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tiered.core.ports import NOT_RECORDED, LatencyRecorder
from tiered.gc.cold_objects import DeleteReleasedObjects, pending_deletions
from tiered.gc.compaction import CompactKeyedStreams
from tiered.gc.context import GcContext, GcPass, GcTask
from tiered.gc.erasure import RewriteErasedObjects
from tiered.gc.expiry import ExpireStreams
from tiered.gc.hot_segments import ReleaseHotCopies
from tiered.gc.orphans import ReconcileOrphans
from tiered.gc.producers import ExpireProducers
from tiered.gc.reclaim import ReclaimCompactedObjects
from tiered.gc.report import GcReport, GcTotals
from tiered.gc.retention import ApplyRetention

log = logging.getLogger(__name__)


@runtime_checkable
class PeriodicTask(GcTask, Protocol):
    """A GC task run every ``every_s`` seconds on its own schedule (besides in every pass asked for)."""

    every_s: float


def default_tasks() -> list[GcTask]:
    return [
        ExpireStreams(),
        ExpireProducers(),
        ApplyRetention(),
        ReleaseHotCopies(),
        CompactKeyedStreams(),  # keyed compaction (issue 21)
        ReclaimCompactedObjects(),  # its storage reclaimed: objects rewritten without the holes
        RewriteErasedObjects(),  # before the deletes: the objects it releases wait out the grace there
        DeleteReleasedObjects(),
        ReconcileOrphans(),
    ]


class GcRunner:
    def __init__(
        self,
        ctx: GcContext,
        *,
        interval_s: float,
        reconcile_interval_s: float,
        tasks: Sequence[GcTask] | None = None,
        pass_seconds: LatencyRecorder = NOT_RECORDED,
    ) -> None:
        self.ctx = ctx
        self.pass_seconds = pass_seconds
        self.tasks = list(tasks) if tasks is not None else default_tasks()
        self.interval_s = interval_s
        self.reconcile_interval_s = reconcile_interval_s
        self.totals = GcTotals()
        self.last_report: GcReport | None = None
        self._lock = asyncio.Lock()
        self._task_locks: dict[int, asyncio.Lock] = {}  # id of a periodic task -> its own lock
        self._last_reconcile = float("-inf")

    def pending_deletions(self) -> int:
        return pending_deletions(self.ctx.state)

    async def run_forever(self) -> None:
        """Passes every ``interval_s``; each periodic task every ``every_s`` of its own."""
        clock = self.ctx.clock
        next_pass = clock.monotonic() + self.interval_s
        next_run: dict[int, float] = {}  # id of a periodic task -> when it runs next
        while True:
            periodic = [t for t in self.tasks if isinstance(t, PeriodicTask)]
            for task in periodic:
                next_run.setdefault(id(task), clock.monotonic() + task.every_s)
            wake = min([next_pass, *(next_run[id(t)] for t in periodic)])
            await asyncio.sleep(max(0.0, wake - clock.monotonic()))
            for task in periodic:
                if clock.monotonic() >= next_run[id(task)]:
                    await self._run_alone(task)
                    next_run[id(task)] = clock.monotonic() + task.every_s
            if clock.monotonic() < next_pass:
                continue
            reconcile = clock.monotonic() - self._last_reconcile >= self.reconcile_interval_s
            try:
                await self.run_pass(reconcile=reconcile, scheduled=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("GC pass failed; the next one will resume")
            next_pass = clock.monotonic() + self.interval_s

    def _task_lock(self, task: GcTask) -> asyncio.Lock:
        return self._task_locks.setdefault(id(task), asyncio.Lock())

    async def _run_alone(self, task: GcTask) -> None:
        """One periodic task on its own schedule: its failures are logged, the next run resumes."""
        now = self.ctx.clock.now_ms()
        gc_pass = GcPass(now=now, dry_run=False, reconcile=False, report=GcReport(started_ms=now))
        try:
            async with self._task_lock(task):
                await task.run(self.ctx, gc_pass)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("GC task %s failed; its next run resumes", task.name)
        for error in gc_pass.report.errors:
            log.warning("GC task %s: %s", task.name, error)

    async def run_pass(
        self,
        *,
        dry_run: bool = False,
        reconcile: bool = True,
        now_ms: int | None = None,
        scheduled: bool = False,
    ) -> GcReport:
        """One pass (see the module docstring). A real pass is timed (``pass_seconds``); one that
        fails counts as an error in ``totals`` (scheduled or asked for over the admin API alike).
        ``scheduled``: periodic tasks are left out (they run on their own schedule)."""
        async with self._lock:
            if dry_run:
                return await self._run_pass(
                    dry_run=True, reconcile=reconcile, now_ms=now_ms, scheduled=scheduled
                )
            with self.pass_seconds.time():
                try:
                    return await self._run_pass(
                        dry_run=False, reconcile=reconcile, now_ms=now_ms, scheduled=scheduled
                    )
                except Exception:
                    self.totals.errors += 1
                    raise

    async def _run_pass(
        self, *, dry_run: bool, reconcile: bool, now_ms: int | None, scheduled: bool
    ) -> GcReport:
        ctx = self.ctx
        now = now_ms if now_ms is not None else ctx.clock.now_ms()
        gc_pass = GcPass(
            now=now,
            dry_run=dry_run,
            reconcile=reconcile,
            report=GcReport(dry_run=dry_run, started_ms=now),
        )
        hot_before = ctx.state.hot_bytes
        if reconcile:
            self._last_reconcile = ctx.clock.monotonic()
        for task in self.tasks:
            if not isinstance(task, PeriodicTask):
                await task.run(ctx, gc_pass)
            elif not scheduled:
                async with self._task_lock(task):
                    await task.run(ctx, gc_pass)
        report = gc_pass.report
        report.finished_ms = ctx.clock.now_ms()
        if not dry_run:
            t = self.totals
            t.passes += 1
            t.bytes_reclaimed += report.bytes_deleted + max(0, hot_before - ctx.state.hot_bytes)
            t.objects_deleted += report.objects_deleted + report.orphans_deleted
            t.orphans_found += report.orphans_found
            t.producer_states_expired += report.producer_states_expired
            t.errors += len(report.errors)
            if reconcile:  # only a reconciliation knows; other passes leave the gauge alone
                t.integrity_errors = len(report.integrity_errors)
            t.last_pass_ms = report.finished_ms
            self.last_report = report
        return report
