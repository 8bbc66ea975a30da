"""The GC runner: one pass runs every task in order; the server runs passes on a schedule.

One pass is bounded (``max_objects`` per task), resumable (every task is a
journaled lifecycle a restart continues) and idempotent (running it twice
changes nothing the first did not). ``tiered gc`` triggers one over the admin
API or runs one offline. Tasks, in order: expiry, producer expiry, retention,
hot copies and segments, released objects, reconciliation (every
``reconcile_interval_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tiered.core.ports import NOT_RECORDED, LatencyRecorder
from tiered.gc.cold_objects import DeleteReleasedObjects, pending_deletions
from tiered.gc.context import GcContext, GcPass, GcTask
from tiered.gc.expiry import ExpireStreams
from tiered.gc.hot_segments import ReleaseHotCopies
from tiered.gc.orphans import ReconcileOrphans
from tiered.gc.producers import ExpireProducers
from tiered.gc.report import GcReport, GcTotals
from tiered.gc.retention import ApplyRetention

log = logging.getLogger(__name__)


def default_tasks() -> list[GcTask]:
    return [
        ExpireStreams(),
        ExpireProducers(),
        ApplyRetention(),
        ReleaseHotCopies(),
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
        self._last_reconcile = float("-inf")

    def pending_deletions(self) -> int:
        return pending_deletions(self.ctx.state)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            reconcile = self.ctx.clock.monotonic() - self._last_reconcile >= self.reconcile_interval_s
            try:
                await self.run_pass(reconcile=reconcile)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("GC pass failed; the next one will resume")

    async def run_pass(
        self, *, dry_run: bool = False, reconcile: bool = True, now_ms: int | None = None
    ) -> GcReport:
        """One pass (see the module docstring). A real pass is timed (``pass_seconds``); one that
        fails counts as an error in ``totals`` (scheduled or asked for over the admin API alike)."""
        async with self._lock:
            if dry_run:
                return await self._run_pass(dry_run=True, reconcile=reconcile, now_ms=now_ms)
            with self.pass_seconds.time():
                try:
                    return await self._run_pass(dry_run=False, reconcile=reconcile, now_ms=now_ms)
                except Exception:
                    self.totals.errors += 1
                    raise

    async def _run_pass(self, *, dry_run: bool, reconcile: bool, now_ms: int | None) -> GcReport:
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
