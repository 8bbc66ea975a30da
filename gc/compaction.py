"""Keyed compaction: the cold data of keyed streams keeps only the newest message per key.

For each keyed stream (``tiered.engine.streams.keyed``) this task reads the
live messages of its cold range (what reads still serve, holes skipped),
decides what to remove (every message but the newest of its key; a newest one
that is a tombstone once it has been stored for ``tombstone_delay_ms``) and
journals it as one ``StreamCompacted`` record: a reader sees the range
compacted all at once or not at all, and a crash before the record leaves
the stream as it was (the next pass decides again, the same way: idempotent).
The bytes are read here; splitting them into messages and deciding run in the
rewrite worker process (``tiered.engine.jobs.compaction_scan``), off the event loop.

A tombstone's age is measured from when its cold object was written, which
is never before its append: a late reader sees a delete for at least the delay.

Not compacted (skipped, counted in the report): forks and the streams forks
read from (a fork reads its source's bytes below the fork point), and ranges
holding a large body stored by reference (scanning stops before it).
At most ``compaction_max_streams`` streams per pass, in uid order after where
the previous pass stopped, so every keyed stream gets its turn; a stream whose
cold range has not changed since its last scan is not read again until a
tombstone that scan kept falls due (soft state: a restart scans everything once).

Issue 21 (``tiered.gc.key_index``): after each stream's pass the newest message
of each key it saw becomes the stream's key index (``?key=`` reads it); streams
keyed by header (``Stream-Key``) are compacted there, from their journaled keys.
"""

from __future__ import annotations

import logging
from concurrent.futures.process import BrokenProcessPool

from tiered.cold.objects.store import ObjectStoreError
from tiered.cold.parquet.chunk import ColdDataDamaged
from tiered.core.errors import TieredError
from tiered.engine.jobs.compaction_scan import Piece, decide_in_worker
from tiered.engine.streams.header_keys import HEADER_MODE
from tiered.engine.streams.keyed import live_pieces
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import StreamCompacted
from tiered.gc.context import GcContext, GcPass, in_turn
from tiered.gc.erasure import pace
from tiered.gc.key_index import KeyIndexer

log = logging.getLogger(__name__)


class CompactKeyedStreams:
    name = "compaction"

    def __init__(self) -> None:
        self.after_uid = -1  # where the previous pass stopped (soft: a restart starts from the first)
        # Soft: per stream, what its last scan saw and when a tombstone it kept falls due; a stream
        # whose cold range has not changed is not read again before then.
        self.scanned: dict[int, tuple[tuple[int, int, int], int | None]] = {}
        self.indexer = KeyIndexer()  # key indexes, and streams keyed by header (issue 21): ``key_index``

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        report = gc_pass.report
        await self.indexer.run(ctx, gc_pass)
        if ctx.reader is None:
            return
        for s in self._due(ctx, gc_pass.now):
            self.after_uid = s.uid
            try:
                pieces = await _cold_pieces(ctx, s)
                # Splitting, parsing keys and deciding run in the rewrite worker process, off the loop.
                decision = await decide_in_worker(
                    s.compaction_key or "/", pieces, gc_pass.now, ctx.tombstone_delay_ms
                )
                removed, gone, due = decision.removed, decision.gone, decision.due
            except (ObjectStoreError, ColdDataDamaged, TieredError, BrokenProcessPool) as exc:
                log.warning("compaction of %s/%s skipped this pass: %s", s.bucket, s.path, exc)
                report.errors.append(f"compaction of {s.bucket}/{s.path} skipped: {exc}")
                continue
            if not removed:
                if not gc_pass.dry_run:
                    await self.indexer.index_pointer(ctx, gc_pass, s, decision)  # ?key=
                    self.scanned[s.uid] = (_seen(s), due)
                continue
            skipped = _changed_meanwhile(ctx, s)
            if skipped is not None:  # a dry run says what a real pass would do: the same skip
                log.info("compaction of %s/%s skipped this pass: %s", s.bucket, s.path, skipped)
                report.compaction_skipped.append({"bucket": s.bucket, "path": s.path, "reason": skipped})
                continue
            report.messages_compacted += gone
            if gc_pass.dry_run:
                report.would_compact.append({"bucket": s.bucket, "path": s.path, "removed": removed})
                continue
            await ctx.committer.commit(
                [StreamCompacted(uid=s.uid, ts_ms=ctx.clock.now_ms(), removed=tuple(removed))]
            )
            report.streams_compacted += 1
            await self.indexer.index_pointer(ctx, gc_pass, s, decision)  # ?key= (issue 21)
            self.scanned[s.uid] = (_seen(s), due)  # after the commit: a failed one is tried again

    def _due(self, ctx: GcContext, now_ms: int) -> list[Stream]:
        state = ctx.state
        for uid in [u for u in self.scanned if u not in state.streams]:
            del self.scanned[uid]
        sources = {s.fork_source for s in state.streams.values() if s.fork_source is not None}
        keyed = sorted(
            (
                s
                for s in state.streams.values()
                if s.compaction_key is not None
                and s.compaction_key != HEADER_MODE  # keyed by header: ``KeyIndexer``
                and s.fork_source is None
                and s.uid not in sources
                and s.cold_end > s.retained_from
                and state.paths.get((s.bucket, s.path)) == s.uid
                and self._changed(s, now_ms)
            ),
            key=lambda s: s.uid,
        )
        return in_turn(keyed, self.after_uid, ctx.compaction_max_streams, lambda s: s.uid)

    def _changed(self, s: Stream, now_ms: int) -> bool:
        """Whether a scan of ``s`` may remove something its last one did not."""
        last = self.scanned.get(s.uid)
        if last is None or last[0] != _seen(s):
            return True
        due = last[1]
        return due is not None and due <= now_ms


def _changed_meanwhile(ctx: GcContext, s: Stream) -> str | None:
    """Why ``s`` is not compacted after all (it changed while the pass read it), or None."""
    if ctx.state.streams.get(s.uid) is not s:
        return "deleted or erased while the pass read it"
    if s.uid in ctx.state.children:
        return "forked while the pass read it (a fork inherits holes only at its creation)"
    return None


def _seen(s: Stream) -> tuple[int, int, int]:
    return (s.cold_end, s.retained_from, len(s.holes))


async def _cold_pieces(ctx: GcContext, s: Stream) -> list[Piece]:
    """The live pieces of ``s``'s cold range (bytes), each with when its object was written."""
    assert ctx.reader is not None
    out: list[Piece] = []
    for ref in list(s.cold_refs):
        obj = ctx.state.cold_objects.get(ref.key)
        if obj is None or obj.payload is not None:
            break  # a large body stored by reference (or an object going away): stop before it
        start = max(ref.start, s.retained_from)
        for a, b in live_pieces(s.holes, start, ref.end):
            started = ctx.clock.monotonic()
            out.append((a, await ctx.reader.read(ref.key, obj.index, s.bucket, s.path, a, b), obj.created_ms))
            await pace(ctx, b - a, started)  # paced like the rewrites, so appends keep their share
    return out
