"""Physical keyed compaction: cold objects rewritten without the bytes compaction removed.

``tiered.gc.compaction`` journals which messages of a keyed stream are removed
(its holes); this task, run right after it, reclaims their storage. Each
object that still holds bytes inside some stream's holes is rewritten by the
one cold-object rewrite machinery (``tiered.engine.jobs.rewrite``, as erasure
uses it: read and checksum, intent, upload, commit, in a worker process):
records wholly inside holes are not copied (their integrity digests are
released with the commit), other streams' rows are copied byte-exact, and a
stream range wholly inside holes stops reading the object at all. The old
object, owned by nobody once its ranges moved, is deleted by ``cold_objects``
after the grace delay, so a read planned against it still finds it.

A record only partly inside holes (an append that carried several messages,
some still live) is kept whole: storage is reclaimed record by record, as
reads and the integrity digests count records. An object whose hole bytes all
sit in such records is remembered (soft state, by its count of hole bytes) and
not read again until that count changes.

Most hole bytes first, at most ``rewrite_max_objects`` per pass, paced to
``rewrite_bytes_per_s`` like erasure; a failure is reported and the next pass
tries again.
"""

from __future__ import annotations

import logging
from concurrent.futures.process import BrokenProcessPool

from tiered.cold.objects.store import ObjectNotFound, ObjectStoreError
from tiered.cold.parquet.chunk import ColdDataDamaged
from tiered.engine.jobs.rewrite import ObjectRewriter
from tiered.engine.jobs.rewrite_plan import RewriteMismatch, reclaim_candidates
from tiered.gc.context import GcContext, GcPass, prefix_held
from tiered.gc.erasure import pace

log = logging.getLogger(__name__)


class ReclaimCompactedObjects:
    name = "compaction-reclaim"

    def __init__(self) -> None:
        # Soft: object key -> the hole bytes it held when a rewrite found no record to drop.
        self.no_gain: dict[str, int] = {}

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        report = gc_pass.report
        state = ctx.state
        for key in [k for k in self.no_gain if k not in state.cold_objects]:
            del self.no_gain[key]
        due = reclaim_candidates(state, ctx.rewrite_max_objects, lambda k, n: self.no_gain.get(k) == n)
        if not due:
            return
        if gc_pass.dry_run:
            for key, held in due:
                report.would_rewrite.append(
                    {
                        "key": key,
                        "bytes": state.cold_objects[key].size,
                        "reason": f"holds {held} bytes keyed compaction removed",
                    }
                )
            return
        if not await prefix_held(ctx, report):
            return
        rewriter = ObjectRewriter(state, ctx.committer, ctx.store, ctx.clock)
        started = ctx.clock.monotonic()
        for key, held in due:
            try:
                done = await rewriter.rewrite(key, only_if_reclaims=True)
            except ObjectNotFound:
                log.error("integrity error: compaction cannot rewrite %s: missing from the object store", key)
                report.integrity_errors.append(
                    f"compaction cannot rewrite {key}: missing from the object store"
                )
                continue
            except (ObjectStoreError, BrokenProcessPool) as exc:
                log.warning("compaction rewrite of %s failed (will retry): %s", key, exc)
                report.errors.append(f"compaction rewrite of {key} failed: {exc}")
                continue
            except (ColdDataDamaged, RewriteMismatch) as exc:
                log.error("integrity error: compaction cannot rewrite %s: %s", key, exc)
                report.integrity_errors.append(f"compaction cannot rewrite {key}: {exc}")
                continue
            if done is None:
                self.no_gain[key] = held
                continue
            report.objects_compacted += 1
            report.compaction_bytes_reclaimed += done.bytes_before - done.bytes_after
            await pace(ctx, done.bytes_moved, started)
            started = ctx.clock.monotonic()
