"""Deleting cold objects nobody owns any more, through a journaled lifecycle.

An object is deletable only when no stream range references it (every owner
released it) and the grace delay has passed since then, so readers that
planned a read before the release and lagging caches finish first. Each batch
is ``cold.delete-start`` (journal) -> object-store delete -> ``cold.delete-finish``;
a crash anywhere resumes, because delete is idempotent and a started delete is
retried on the next pass. A store failure leaves the batch started and blocks
nothing else. Nothing is deleted under a prefix this data dir does not own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tiered.cold.objects.store import ObjectStore, ObjectStoreError
from tiered.core.ports import Committer
from tiered.engine.streams.records import ColdDeleteFinished, ColdDeleteStarted
from tiered.engine.streams.state import StreamState
from tiered.gc.context import GcContext, GcPass, prefix_held

log = logging.getLogger(__name__)


@dataclass
class DeletionResult:
    deleted: list[str] = field(default_factory=list)
    bytes_deleted: int = 0
    errors: list[str] = field(default_factory=list)


def pending_deletions(state: StreamState) -> int:
    """Objects no stream references (waiting out the grace delay or being deleted)."""
    return sum(1 for o in state.cold_objects.values() if o.refs == 0)


def plan_deletions(state: StreamState, now_ms: int, grace_ms: int, limit: int) -> list[str]:
    """Released objects past their grace delay (and interrupted deletes), oldest first."""
    due = []
    for key, obj in state.cold_objects.items():
        if obj.refs > 0 or key in state.copies_in_flight:
            continue
        if obj.deleting or (obj.released_ms is not None and obj.released_ms + grace_ms <= now_ms):
            due.append((obj.released_ms or 0, key))
    due.sort()
    return [key for _, key in due[:limit]]


async def delete_objects(
    state: StreamState,
    committer: Committer,
    store: ObjectStore,
    keys: list[str],
    now_ms: int,
    *,
    orphan: bool,
    sizes: dict[str, int] | None = None,
) -> DeletionResult:
    """Run the journaled delete lifecycle for ``keys`` (all or nothing per key)."""
    result = DeletionResult()
    if not keys:
        return result
    sizes = dict(sizes or {})
    for k in keys:
        obj = state.cold_objects.get(k)
        if obj is not None:
            sizes[k] = obj.size
    await committer.commit([ColdDeleteStarted(keys=tuple(keys), ts_ms=now_ms, orphan=orphan)])
    try:
        failures = await store.delete_many(keys)
    except ObjectStoreError as exc:
        log.warning("deleting %d cold objects failed (will retry): %s", len(keys), exc)
        result.errors.append(f"delete of {len(keys)} objects failed: {exc}")
        return result
    failed = {f.key for f in failures}
    for f in failures:
        result.errors.append(f"{f.key}: {f.code} {f.message}")
    done = tuple(k for k in keys if k not in failed)
    if done:
        await committer.commit([ColdDeleteFinished(keys=done, ts_ms=now_ms, orphan=orphan)])
    result.deleted.extend(done)
    result.bytes_deleted = sum(sizes.get(k, 0) for k in done)
    return result


class DeleteReleasedObjects:
    name = "cold_objects"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        report = gc_pass.report
        report.objects_released = pending_deletions(ctx.state)
        due = plan_deletions(ctx.state, gc_pass.now, ctx.grace_ms, ctx.max_objects)
        if gc_pass.dry_run:
            for key in due:
                obj = ctx.state.cold_objects[key]
                reason = "delete interrupted earlier" if obj.deleting else "no owner left; grace delay passed"
                report.would_delete.append({"key": key, "bytes": obj.size, "reason": reason})
            return
        if not due or not await prefix_held(ctx, report):
            return
        result = await delete_objects(ctx.state, ctx.committer, ctx.store, due, gc_pass.now, orphan=False)
        report.objects_deleted = len(result.deleted)
        report.bytes_deleted = result.bytes_deleted
        report.errors.extend(result.errors)
