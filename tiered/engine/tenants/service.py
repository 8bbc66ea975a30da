"""The tenants shell: quota overrides through the admin API, usage queries, and the usage recorder.

The recorder (job ``usage-recorder``) journals what the ``UsageCounter``
counted in memory (egress by tier, requests by class) as one
``UsageRecorded`` record every ``--usage-interval-s``, then, once everything
applied so far is durable, writes the usage log's lines. A crash loses the
egress and request counts of at most one interval (appended bytes and records
are never lost: they are counted from the append records themselves); a clean
shutdown records what is pending.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from tiered.core.clock import Clock
from tiered.core.errors import TieredError
from tiered.engine.journal.committer import Committer
from tiered.engine.streams.state import StreamState
from tiered.engine.tenants.footprint import Footprint, footprints
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.records import UsageRecorded
from tiered.engine.tenants.state import TenantState
from tiered.engine.tenants.usage_counters import BucketUsage, UsageCounter
from tiered.engine.tenants.usage_log import UsageLog

log = logging.getLogger(__name__)


def usage_view(bucket: str, usage: BucketUsage, fp: Footprint | None, erased: bool) -> dict[str, Any]:
    fp = fp or Footprint()
    return {
        "bucket": bucket,
        "erased": erased,
        **usage.as_json(),
        "retained_bytes": fp.by_tier(),
        "streams": fp.streams,
    }


class TenantService:
    def __init__(
        self,
        streams: StreamState,
        state: TenantState,
        committer: Committer,
        gate: TenantGate,
        clock: Clock,
        *,
        interval_s: float,
        usage_log: UsageLog | None = None,
    ) -> None:
        self.streams = streams
        self.state = state
        self.committer = committer
        self.gate = gate
        self.clock = clock
        self.interval_s = interval_s
        self.counter = UsageCounter()
        self.usage_log = usage_log
        self._last_recorded_ms = clock.now_ms()

    # ------------------------------------------------------------- quotas

    async def set_quotas(self, bucket: str, overrides: dict[str, int | None]) -> dict[str, Any]:
        await self.committer.admit()
        record = self.state.decide_quotas(bucket, overrides, self.streams.buckets, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait([record]))
        return self.quotas_view(bucket)

    def quotas_view(self, bucket: str) -> dict[str, Any]:
        return {
            "bucket": bucket,
            "overrides": dict(self.state.quotas.get(bucket, {})),
            "effective": self.gate.quotas(bucket).as_dict(),
        }

    # ------------------------------------------------------------- usage

    def usage(self, bucket: str | None = None) -> list[dict[str, Any]]:
        """Counters (journaled plus counted since the last record) and gauges, per bucket."""
        fps = footprints(self.streams)
        names = set(self.state.usage) | set(self.streams.buckets)
        if bucket is not None:
            names = {bucket} & (names | set(self.streams.erased_buckets))
        out = []
        for name in sorted(names):
            u = replace(self.state.peek(name))
            u.add(self.counter.pending(name))
            out.append(usage_view(name, u, fps.get(name), name in self.streams.erased_buckets))
        return out

    async def record_usage(self) -> int:
        """Journal what was counted in memory, then write the usage log; returns how many buckets moved."""
        deltas = self.counter.take()
        now = self.clock.now_ms()
        if deltas:
            try:
                await self.committer.commit([UsageRecorded(ts_ms=now, deltas=deltas)])
            except TieredError:
                self.counter.put_back(deltas)  # counted again with the next record
                raise
        if self.usage_log is not None:
            await self.committer.settled()  # every counter the lines show is durable
            lines = self._log_lines(now, {d.bucket for d in deltas})
            await asyncio.to_thread(self.usage_log.write, lines, now)
        self._last_recorded_ms = now
        return len(deltas)

    def _log_lines(self, now_ms: int, moved: set[str]) -> list[dict[str, Any]]:
        fps = footprints(self.streams)
        lines = []
        for name in sorted(set(self.streams.buckets) | moved):
            view = usage_view(name, self.state.peek(name), fps.get(name), name in self.streams.erased_buckets)
            lines.append({"ts_ms": now_ms, "from_ms": self._last_recorded_ms, **view})
        return lines

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.record_usage()
            except TieredError as exc:
                log.warning("usage not recorded this interval (kept for the next): %s", exc.message)
            except OSError as exc:
                log.error("usage log not written: %s", exc)
