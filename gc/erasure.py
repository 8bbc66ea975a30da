"""Erasure that reaches every byte: rewrite shared objects without an erased bucket's rows.

Erasing a bucket releases its streams' ranges at once, but an object another
bucket still reads keeps the erased rows for as long as it lives. This task
rewrites each such object (``tiered.engine.jobs.rewrite``: upload before
commit, commit before release) with only the rows still read; the old object,
now owned by nobody, is deleted by the next task (``cold_objects``) once the
grace delay has passed, through its journaled delete. Earliest erasure first,
at most ``rewrite_max_objects`` objects per pass, paced to ``rewrite_bytes_per_s``
(so appends keep their share of the machine); a failure is reported and
the next pass tries again. ``GET /v1/admin/erasure`` reports what still holds
an erased bucket's bytes, and ``tiered verify`` fails past the deadline
(``erasure_deadline_s``, which the grace delay must stay below).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures.process import BrokenProcessPool

from tiered.cold.objects.store import ObjectNotFound, ObjectStoreError
from tiered.cold.parquet.chunk import ColdDataDamaged
from tiered.engine.jobs.rewrite import ObjectRewriter
from tiered.engine.jobs.rewrite_plan import RewriteMismatch, erasure_candidates
from tiered.gc.context import GcContext, GcPass, prefix_held

log = logging.getLogger(__name__)


class RewriteErasedObjects:
    name = "erasure"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        report = gc_pass.report
        due = erasure_candidates(ctx.state, ctx.rewrite_max_objects)
        if not due:
            return
        if gc_pass.dry_run:
            for key in due:
                report.would_rewrite.append(
                    {
                        "key": key,
                        "bytes": ctx.state.cold_objects[key].size,
                        "reason": "holds an erased bucket's rows",
                    }
                )
            return
        if not await prefix_held(ctx, report):
            return
        rewriter = ObjectRewriter(ctx.state, ctx.committer, ctx.store, ctx.clock)
        started = ctx.clock.monotonic()
        for key in due:
            try:
                done = await rewriter.rewrite(key)
            except ObjectNotFound:
                log.error("integrity error: erasure cannot rewrite %s: missing from the object store", key)
                report.integrity_errors.append(f"erasure cannot rewrite {key}: missing from the object store")
                continue
            except (ObjectStoreError, BrokenProcessPool) as exc:
                log.warning("erasure rewrite of %s failed (will retry): %s", key, exc)
                report.errors.append(f"erasure rewrite of {key} failed: {exc}")
                continue
            except (ColdDataDamaged, RewriteMismatch) as exc:
                log.error("integrity error: erasure cannot rewrite %s: %s", key, exc)
                report.integrity_errors.append(f"erasure cannot rewrite {key}: {exc}")
                continue
            if done is not None:
                report.objects_rewritten += 1
                await pace(ctx, done.bytes_moved, started)
            started = ctx.clock.monotonic()


async def pace(ctx: GcContext, moved: int, started: float) -> None:
    """Hold the rewrite to ``rewrite_bytes_per_s`` (read plus written), so appends keep their share."""
    if ctx.rewrite_bytes_per_s > 0:
        await asyncio.sleep(max(0.0, moved / ctx.rewrite_bytes_per_s - (ctx.clock.monotonic() - started)))
