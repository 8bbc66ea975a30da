"""Hot copies that are cold and past the hot retention are trimmed; segment files nothing needs are deleted."""

from __future__ import annotations

from tiered.gc.context import GcContext, GcPass


class ReleaseHotCopies:
    name = "hot_segments"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        if gc_pass.dry_run or ctx.hot is None:
            return
        await ctx.hot.release_hot_copies()
        gc_pass.report.segments_deleted = ctx.segments_deleted()
