"""The GC pass: expiry, retention, hot cleanup, deletion, reconciliation.

One pass is bounded (``max_objects`` per step), resumable (every step is a
journaled lifecycle that a restart continues) and idempotent (running it twice
changes nothing the first did not). The server runs passes on a schedule;
``tiered gc`` triggers one over the admin API or runs one offline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tiered.cold.chunk_index import ColdDataDamaged
from tiered.cold.store import ObjectStoreError
from tiered.records import RetentionAdvanced, StreamExpired

from .deletion import delete_objects, plan_deletions
from .reconcile import find_discrepancies
from .retention import plan_expirations, plan_retention

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    dry_run: bool = False
    started_ms: int = 0
    finished_ms: int = 0
    streams_expired: int = 0
    retention_advanced: int = 0
    bytes_released: int = 0  # stream bytes no reader can reach any more
    objects_released: int = 0  # objects with no owner, waiting out the grace delay
    objects_deleted: int = 0
    bytes_deleted: int = 0
    orphans_found: int = 0
    orphans_deleted: int = 0
    segments_deleted: int = 0
    would_delete: list[dict[str, Any]] = field(default_factory=list)  # dry run: key, bytes, reason
    errors: list[str] = field(default_factory=list)
    integrity_errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GcTotals:
    """Counters for metrics, over the process lifetime."""

    passes: int = 0
    bytes_reclaimed: int = 0
    objects_deleted: int = 0
    orphans_found: int = 0
    integrity_errors: int = 0
    last_pass_ms: int = 0


class GcRunner:
    def __init__(
        self,
        service,  # tiered.service.StreamService  # type: ignore[no-untyped-def]
        *,
        grace_s: float,
        max_objects: int,
        interval_s: float,
        reconcile_interval_s: float,
    ) -> None:
        self.service = service
        self.grace_ms = int(grace_s * 1000)
        self.max_objects = max_objects
        self.interval_s = interval_s
        self.reconcile_interval_s = reconcile_interval_s
        self.totals = GcTotals()
        self.last_report: GcReport | None = None
        self._lock = asyncio.Lock()
        self._last_reconcile = 0.0

    def pending_deletions(self) -> int:
        return sum(1 for o in self.service.state.cold_objects.values() if o.refs == 0)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            reconcile = time.monotonic() - self._last_reconcile >= self.reconcile_interval_s
            try:
                await self.run_pass(reconcile=reconcile)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("GC pass failed; the next one will resume")

    async def run_pass(self, *, dry_run: bool = False, reconcile: bool = True, now_ms: int | None = None) -> GcReport:
        async with self._lock:
            return await self._pass(dry_run, reconcile, now_ms if now_ms is not None else int(time.time() * 1000))

    async def _pass(self, dry_run: bool, reconcile: bool, now: int) -> GcReport:
        service = self.service
        state = service.state
        report = GcReport(dry_run=dry_run, started_ms=now)
        hot_before = state.hot_bytes

        expired = plan_expirations(state, now, self.max_objects)
        report.streams_expired = len(expired)
        if expired and not dry_run:
            await service.commit_records([StreamExpired(uid=uid, ts_ms=now) for uid in expired])

        advances = await self._retention_advances(now)
        report.retention_advanced = len(advances)
        if dry_run:
            for uid, offset in advances:
                s = state.streams[uid]
                report.bytes_released += offset - s.retained_from
        elif advances:
            before = {uid: state.streams[uid].retained_from for uid, _ in advances}
            await service.commit_records([RetentionAdvanced(ts_ms=now, advances=tuple(advances))])
            report.bytes_released += sum(offset - before[uid] for uid, offset in advances)

        if not dry_run and service.flusher is not None:
            await service.flusher.release_hot_copies()
            report.segments_deleted = service.segments_deleted_last
        report.objects_released = self.pending_deletions()

        due = plan_deletions(state, now, self.grace_ms, self.max_objects)
        if due and not dry_run and not await self._prefix_held(report):
            due = []
        if dry_run:
            for key in due:
                obj = state.cold_objects[key]
                reason = "delete interrupted earlier" if obj.deleting else "no owner left; grace delay passed"
                report.would_delete.append({"key": key, "bytes": obj.size, "reason": reason})
        elif due:
            result = await delete_objects(service, service.store, due, now, orphan=False)
            report.objects_deleted = len(result.deleted)
            report.bytes_deleted = result.bytes_deleted
            report.errors.extend(result.errors)

        if reconcile:
            self._last_reconcile = time.monotonic()
            await self._reconcile(report, dry_run, now)

        report.finished_ms = int(time.time() * 1000)
        if not dry_run:
            t = self.totals
            t.passes += 1
            t.bytes_reclaimed += report.bytes_deleted + max(0, hot_before - state.hot_bytes)
            t.objects_deleted += report.objects_deleted + report.orphans_deleted
            t.orphans_found += report.orphans_found
            if reconcile:  # only a reconciliation knows; other passes leave the gauge alone
                t.integrity_errors = len(report.integrity_errors)
            t.last_pass_ms = report.finished_ms
            self.last_report = report
        return report

    async def _prefix_held(self, report: GcReport, *, force: bool = False) -> bool:
        """Whether this data dir still owns the object-store prefix (nothing is deleted otherwise)."""
        claim = getattr(self.service, "claim", None)
        if claim is None:
            report.errors.append("the object-store prefix is not claimed by this data dir: nothing deleted")
            return False
        try:
            held = await claim.still_held(force=force)
        except ObjectStoreError as exc:
            report.errors.append(f"cannot read the prefix claim: {exc}")
            return False
        if not held:
            report.errors.append("the object-store prefix is claimed by another data dir: nothing deleted")
        return held

    async def _retention_advances(self, now: int) -> list[tuple[int, int]]:
        """(uid, new retained offset) for every stream a policy releases data of now.

        Where the size target lies inside a cold range, the object is read for the
        record boundary at or below it; failing that, the plan's known boundary
        (lower, so more is kept) is used.
        """
        state = self.service.state
        advances = []
        for plan in plan_retention(state, now):
            offset = plan.offset
            lookup = plan.lookup
            reader = self.service.cold_reader
            obj = state.cold_objects.get(lookup.key) if lookup is not None else None
            if lookup is not None and obj is not None and reader is not None:
                try:
                    starts = await reader.record_starts(lookup.key, obj.index, lookup.bucket, lookup.path,
                                                        lookup.lo, lookup.target + 1)
                    offset = max([offset, *(o for o in starts if o <= lookup.target)])
                except (ObjectStoreError, ColdDataDamaged) as exc:
                    log.warning("retention of %s/%s keeps more than needed: record boundaries in %s unreadable: %s",
                                lookup.bucket, lookup.path, lookup.key, exc)
            s = state.streams.get(plan.uid)
            if s is not None and offset > s.retained_from:
                advances.append((plan.uid, offset))
        return advances

    async def _reconcile(self, report: GcReport, dry_run: bool, now: int) -> None:
        service = self.service
        try:
            found = await find_discrepancies(service.state, service.store, now, self.grace_ms, self.max_objects)
        except ObjectStoreError as exc:
            report.errors.append(f"listing the object store failed: {exc}")
            return
        report.orphans_found = len(found.orphans)
        report.integrity_errors.extend(
            f"{key}: referenced by metadata but missing from the object store" for key in found.missing
        )
        if dry_run:
            for key, size in found.orphans.items():
                report.would_delete.append({"key": key, "bytes": size, "reason": "orphan: no metadata references it"})
            return
        # Re-check right before deleting: a key may have become known meanwhile.
        orphans = [k for k in found.orphans if k not in service.state.cold_objects and k not in service.state.copies_in_flight]
        if orphans and not await self._prefix_held(report, force=True):
            return  # an orphan here may be another data dir's live object
        if orphans:
            result = await delete_objects(
                service, service.store, orphans, now, orphan=True, sizes={k: found.orphans[k] for k in orphans}
            )
            report.orphans_deleted = len(result.deleted)
            report.bytes_deleted += result.bytes_deleted
            report.errors.extend(result.errors)
