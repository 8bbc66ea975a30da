"""Keyed compaction: the cold data of keyed streams keeps only the newest message per key.

For each keyed stream (``tiered.engine.streams.keyed``) this task reads the
live messages of its cold range (what reads still serve, holes skipped),
decides what to remove (every message but the newest of its key; a newest one
that is a tombstone once it has been stored for ``tombstone_delay_ms``) and
journals it as one ``StreamCompacted`` record: a reader sees the range
compacted all at once or not at all, and a crash before the record leaves
the stream as it was (the next pass decides again, the same way: idempotent).

A tombstone's age is measured from when its cold object was written, which
is never before its append: a late reader sees a delete for at least the delay.

Not compacted (skipped, counted in the report): forks and the streams forks
read from (a fork reads its source's bytes below the fork point), and ranges
holding a large body stored by reference (scanning stops before it).
At most ``compaction_max_streams`` streams per pass, in uid order after where
the previous pass stopped, so every keyed stream gets its turn.
"""

from __future__ import annotations

import logging

from tiered.cold.objects.store import ObjectStoreError
from tiered.cold.parquet.chunk import ColdDataDamaged
from tiered.core.errors import TieredError
from tiered.engine.streams.keyed import live_pieces, parse_pointer, plan_removals, split_messages
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import StreamCompacted
from tiered.gc.context import GcContext, GcPass

log = logging.getLogger(__name__)

Message = tuple[int, int, bytes, int]


class CompactKeyedStreams:
    name = "compaction"

    def __init__(self) -> None:
        self.after_uid = -1  # where the previous pass stopped (soft: a restart starts from the first)

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        report = gc_pass.report
        if ctx.reader is None:
            return
        for s in self._due(ctx):
            self.after_uid = s.uid
            try:
                messages = await _cold_messages(ctx, s)
                removed = plan_removals(
                    parse_pointer(s.compaction_key or "/"), messages, gc_pass.now, ctx.tombstone_delay_ms
                )
            except (ObjectStoreError, ColdDataDamaged, TieredError) as exc:
                log.warning("compaction of %s/%s skipped this pass: %s", s.bucket, s.path, exc)
                report.errors.append(f"compaction of {s.bucket}/{s.path} skipped: {exc}")
                continue
            if not removed:
                continue
            report.messages_compacted += sum(1 for r in removed for m in messages if r[0] <= m[0] < r[1])
            if gc_pass.dry_run:
                report.would_compact.append({"bucket": s.bucket, "path": s.path, "removed": removed})
                continue
            if ctx.state.streams.get(s.uid) is not s:
                continue  # deleted or erased while its messages were read
            await ctx.committer.commit(
                [StreamCompacted(uid=s.uid, ts_ms=ctx.clock.now_ms(), removed=tuple(removed))]
            )
            report.streams_compacted += 1

    def _due(self, ctx: GcContext) -> list[Stream]:
        state = ctx.state
        sources = {s.fork_source for s in state.streams.values() if s.fork_source is not None}
        keyed = sorted(
            (
                s
                for s in state.streams.values()
                if s.compaction_key is not None
                and s.fork_source is None
                and s.uid not in sources
                and s.cold_end > s.retained_from
                and state.paths.get((s.bucket, s.path)) == s.uid
            ),
            key=lambda s: s.uid,
        )
        later = [s for s in keyed if s.uid > self.after_uid]
        order = later + [s for s in keyed if s.uid <= self.after_uid]
        return order[: ctx.compaction_max_streams]


async def _cold_messages(ctx: GcContext, s: Stream) -> list[Message]:
    """The live messages of ``s``'s cold range, each with when its object was written."""
    assert ctx.reader is not None
    out: list[Message] = []
    for ref in list(s.cold_refs):
        obj = ctx.state.cold_objects.get(ref.key)
        if obj is None or obj.payload is not None:
            break  # a large body stored by reference (or an object going away): stop before it
        start = max(ref.start, s.retained_from)
        for a, b in live_pieces(s.holes, start, ref.end):
            data = await ctx.reader.read(ref.key, obj.index, s.bucket, s.path, a, b)
            out.extend((m0, m1, m, obj.created_ms) for m0, m1, m in split_messages(a, data))
    return out
