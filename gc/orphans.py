"""Reconciliation: compare what the object store holds with what metadata references.

* An object under the data prefix that the metadata does not know (an upload
  that crashed or failed before its commit) and that is older than the grace
  delay is an orphan: it is deleted through the same journaled lifecycle, and
  only under a prefix this data dir has claimed.
* An object the metadata references but the store does not have is an
  integrity error: reported loudly (logs, metrics, the pass report), never
  dropped from the metadata silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tiered.cold.objects.keys import DATA_PREFIX, key_time_ms
from tiered.cold.objects.store import ObjectStore, ObjectStoreError
from tiered.engine.streams.state import StreamState
from tiered.gc.cold_objects import delete_objects
from tiered.gc.context import GcContext, GcPass, prefix_held

log = logging.getLogger(__name__)


@dataclass
class ReconcileResult:
    listed: int = 0
    orphans: dict[str, int] = field(default_factory=dict)  # key -> size, old enough to delete
    young_unknown: int = 0  # unknown but within the grace delay (maybe an upload under way)
    missing: list[str] = field(default_factory=list)
    complete: bool = False  # the whole prefix was listed


def _known(state: StreamState, key: str) -> bool:
    return key in state.cold_objects or key in state.copies_in_flight


async def find_discrepancies(
    state: StreamState, store: ObjectStore, now_ms: int, grace_ms: int, max_orphans: int
) -> ReconcileResult:
    """List the data prefix once; bounded by ``max_orphans`` found."""
    result = ReconcileResult()
    seen: set[str] = set()
    async for info in store.list(DATA_PREFIX):
        result.listed += 1
        seen.add(info.key)
        if _known(state, info.key):
            continue
        born = key_time_ms(info.key)
        if born is None:
            born = int(info.last_modified.timestamp() * 1000)
        if now_ms - born < grace_ms:
            result.young_unknown += 1
            continue
        result.orphans[info.key] = info.size
        if len(result.orphans) >= max_orphans:
            return result  # bounded; the next pass lists again and picks up the rest
    result.complete = True
    for key, obj in state.cold_objects.items():
        # Objects committed after the listing began may legitimately be absent from it.
        if key not in seen and not obj.deleting and obj.created_ms < now_ms:
            result.missing.append(key)
    for key in result.missing:
        log.error("integrity error: cold object %s is referenced by metadata but missing from the store", key)
    return result


class ReconcileOrphans:
    name = "orphans"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        if not gc_pass.reconcile:
            return
        report = gc_pass.report
        try:
            found = await find_discrepancies(ctx.state, ctx.store, gc_pass.now, ctx.grace_ms, ctx.max_objects)
        except ObjectStoreError as exc:
            report.errors.append(f"listing the object store failed: {exc}")
            return
        report.orphans_found = len(found.orphans)
        report.integrity_errors.extend(
            f"{key}: referenced by metadata but missing from the object store" for key in found.missing
        )
        if gc_pass.dry_run:
            for key, size in found.orphans.items():
                report.would_delete.append(
                    {"key": key, "bytes": size, "reason": "orphan: no metadata references it"}
                )
            return
        # Re-check right before deleting: a key may have become known meanwhile.
        orphans = [k for k in found.orphans if not _known(ctx.state, k)]
        if not orphans or not await prefix_held(ctx, report, force=True):
            return  # an orphan here may be another data dir's live object
        result = await delete_objects(
            ctx.state,
            ctx.committer,
            ctx.store,
            orphans,
            gc_pass.now,
            orphan=True,
            sizes={k: found.orphans[k] for k in orphans},
        )
        report.orphans_deleted = len(result.deleted)
        report.bytes_deleted += result.bytes_deleted
        report.errors.extend(result.errors)
