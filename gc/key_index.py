"""Compaction of streams keyed by header: fold their keyed appends into a key index, supersede the older ones.

For each stream keyed by header (``tiered.engine.streams.header_keys``) whose
cold range grew since its index was written (or holding a tombstone now due),
one pass:

1. reads the stream's key index object (if any), checked (size, CRC32C, every block);
2. plans (pure, ``header_keys.plan_index``): the pending keyed appends wholly in the
   cold range join the index; each key keeps its newest append; the older ones
   become holes; tombstones past ``tombstone_delay_ms`` leave;
3. journals the intent (``ColdCopyStarted`` with no ranges: a crash from here on
   leaves a known key, which the flusher aborts at the next start and
   reconciliation deletes), uploads the new index object (``data/<ULID>.keys``);
4. journals, in one batch, the pass's holes (``StreamCompacted``) and then the
   index (``KeyIndexCommitted``): the stream's old index object is released and
   GC deletes it after the grace delay, as any cold object nobody owns.

Unlike a stream keyed by a JSON pointer, no cold message is read: every key is
journal state until it is in the index. ``steps`` is a test seam called after
each journaled step and the upload (``intent``, ``upload``, ``commit``), so
crash tests stop a pass between any two.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import google_crc32c

from tiered.cold.objects.keys import new_key_index_key
from tiered.cold.objects.store import ObjectStoreError
from tiered.cold.parquet.chunk import ColdDataDamaged
from tiered.core.errors import TieredError
from tiered.engine.jobs.compaction_scan import Decision
from tiered.engine.streams import header_keys, key_index_file
from tiered.engine.streams.model import KeyIndexRef, Stream
from tiered.engine.streams.records import ColdCopyAborted, ColdCopyStarted, KeyIndexCommitted, StreamCompacted
from tiered.gc.context import GcContext, GcPass, in_turn

log = logging.getLogger(__name__)

Step = Callable[[str], Awaitable[None]]
Message = tuple[int, int, bytes, int]  # (start, end, bytes, stored_ms) of a pointer stream's cold message


async def _no_step(_: str) -> None:
    return None


class KeyIndexer:
    """The header-keyed half of the ``compaction`` GC task (``tiered.gc.compaction`` calls it)."""

    def __init__(self, steps: Step = _no_step) -> None:
        self.steps = steps
        self.after_uid = -1  # where the previous pass stopped (soft)
        # Soft: per stream, when a tombstone its index kept falls due (a restart checks every stream once).
        self.due_ms: dict[int, int | None] = {}

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        for s in self._due(ctx, gc_pass.now):
            self.after_uid = s.uid
            try:
                await self._one(ctx, gc_pass, s)
            except (ObjectStoreError, ColdDataDamaged, TieredError) as exc:
                log.warning("key index of %s/%s skipped this pass: %s", s.bucket, s.path, exc)
                gc_pass.report.errors.append(f"key index of {s.bucket}/{s.path} skipped: {exc}")

    def _due(self, ctx: GcContext, now_ms: int) -> list[Stream]:
        state = ctx.state
        for uid in [u for u in self.due_ms if u not in state.streams]:
            del self.due_ms[uid]
        sources = {s.fork_source for s in state.streams.values() if s.fork_source is not None}
        keyed = sorted(
            (
                s
                for s in state.streams.values()
                if header_keys.is_header_keyed(s)
                and s.uid not in sources  # a fork reads its source's bytes below the fork point
                and not s.soft_deleted
                and state.paths.get((s.bucket, s.path)) == s.uid
                and self._changed(s, now_ms)
            ),
            key=lambda s: s.uid,
        )
        return in_turn(keyed, self.after_uid, ctx.compaction_max_streams, lambda s: s.uid)

    def _changed(self, s: Stream, now_ms: int) -> bool:
        """Whether a pass may change ``s``'s index: appends to fold, or a tombstone due (or never checked)."""
        first = s.pending_keys[0] if s.pending_keys else None
        if first is not None and first.end <= s.cold_end and first.start <= s.cold_end:
            return True  # appends to fold (in offset order: the first tells)
        if s.uid not in self.due_ms:
            return s.key_index is not None  # once after a start: tombstones, retention
        due = self.due_ms[s.uid]
        return due is not None and due <= now_ms

    async def _one(self, ctx: GcContext, gc_pass: GcPass, s: Stream) -> None:
        report = gc_pass.report
        before = s.key_index
        data = b""
        if before is not None:
            data = await ctx.store.get(before.key)
        if ctx.state.streams.get(s.uid) is not s or s.key_index is not before:
            return  # deleted, or another pass committed, while the index was read
        old = key_index_file.decode_all(before, data) if before is not None else iter(())
        # No ``await`` from the plan to the encoded object: the merge reads the stream as it streams.
        plan, entries = header_keys.plan_index(s, old, gc_pass.now, ctx.tombstone_delay_ms)
        body, footer_length = key_index_file.encode(entries)
        if not plan.changed:
            self.due_ms[s.uid] = plan.tombstone_due_ms
            return
        if gc_pass.dry_run:
            report.messages_compacted += plan.superseded
            report.would_compact.append(
                {"bucket": s.bucket, "path": s.path, "removed": plan.removed, "keys": plan.keys}
            )
            return
        index = (body, footer_length, plan.keys)
        if not await self._write(ctx, s, before, index, plan.covers_to, plan.folded, tuple(plan.removed)):
            return
        self.due_ms[s.uid] = plan.tombstone_due_ms
        report.key_indexes_written += 1
        if plan.removed:
            report.streams_compacted += 1
            report.messages_compacted += plan.superseded

    async def index_pointer(self, ctx: GcContext, gc_pass: GcPass, s: Stream, decision: Decision) -> None:
        """A stream keyed by a JSON pointer, right after its compaction pass scanned (and maybe compacted)
        its cold range: the newest message of each key there (found by the pass's decision, in the worker
        process), as its key index (``?key=`` reads it and scans only what follows ``covers_to``). Written
        after the pass's ``StreamCompacted``, so an index missing or behind (a crash, a failed upload) only
        makes a keyed read scan more, never answer wrong.
        """
        before = s.key_index
        if gc_pass.dry_run or not decision.covers_to:
            return
        if before is not None and before.covers_to >= decision.covers_to and not decision.gone:
            return  # the index already covers what the pass saw, and nothing was removed
        try:
            body, footer_length = key_index_file.encode(iter(decision.newest))
            index = (body, footer_length, len(decision.newest))
            if await self._write(ctx, s, before, index, decision.covers_to, 0, ()):
                gc_pass.report.key_indexes_written += 1
        except (ObjectStoreError, TieredError) as exc:
            log.warning("key index of %s/%s not written this pass: %s", s.bucket, s.path, exc)
            gc_pass.report.errors.append(f"key index of {s.bucket}/{s.path} not written: {exc}")

    async def _write(
        self,
        ctx: GcContext,
        s: Stream,
        before: KeyIndexRef | None,
        index: tuple[bytes, int, int],
        covers_to: int,
        folded: int,
        holes: tuple[tuple[int, int], ...],
    ) -> bool:
        """Intent, upload, then (holes first) the commit of ``index`` (object bytes, footer length, keys);
        False when the stream changed meanwhile."""
        body, footer_length, keys = index
        key = new_key_index_key(ctx.clock.now_ms())
        await ctx.committer.commit([ColdCopyStarted(key=key, ts_ms=ctx.clock.now_ms(), ranges=())])
        await self.steps("intent")
        try:
            await ctx.store.put(key, body)
        except BaseException:
            await _abort(ctx, key, "the key index upload failed")
            raise
        await self.steps("upload")
        if ctx.state.streams.get(s.uid) is not s or s.key_index is not before:
            await _abort(ctx, key, "the stream changed while its key index was written")
            return False
        ts = ctx.clock.now_ms()
        records: list[StreamCompacted | KeyIndexCommitted] = []
        if holes:  # the holes first: see ``KeyIndexCommitted``
            records.append(StreamCompacted(uid=s.uid, ts_ms=ts, removed=holes))
        records.append(
            KeyIndexCommitted(
                uid=s.uid,
                key=key,
                size=len(body),
                crc32c=google_crc32c.value(body),
                footer_length=footer_length,
                covers_to=covers_to,
                keys=keys,
                folded=folded,
                ts_ms=ts,
            )
        )
        await ctx.committer.commit(records)
        await self.steps("commit")
        return True


async def _abort(ctx: GcContext, key: str, reason: str) -> None:
    """The upload will not be committed: its key (if written) is an orphan for reconciliation."""
    try:
        await ctx.committer.commit([ColdCopyAborted(key=key, ts_ms=ctx.clock.now_ms(), reason=reason)])
    except Exception as exc:  # the journal failed: the intent stays, the flusher aborts it at the next start
        log.warning("could not journal the abort of key index %s: %s", key, exc)
