"""Retention: which data the policies release now (``plan_retention``, pure) and the GC task
that applies the plan (``ApplyRetention``, the shell: it reads record boundaries from the store).

The rule, exactly:

* ``retention_bytes = B`` keeps at least the newest ``B`` bytes: the retained
  offset moves to the greatest record boundary at or below ``tail - B``, never
  past it (a stream never keeps fewer than ``B`` bytes unless it holds fewer).
* ``retention_ms = T`` releases only data whose every record is older than
  ``now - T``: the retained offset moves past a stretch only when its newest
  record is older than the cutoff. Hot records carry their own append times; a
  cold range counts as old as its object (written after every record in it), so
  age retention may keep a cold range a little longer, never shorter.
* With both, whichever releases more wins (each one alone keeps what it must).
* A cold range is released only when all of it lies below the retained offset;
  a partially retained range stays referenced and readers start at the retained
  offset inside it. Record boundaries never split: JSON streams keep whole
  messages, and every offset a reader holds stays valid or becomes a clean 410.

Record boundaries inside a cold range are not in memory (only row group edges
are, in the object's index). When the size target falls strictly inside a cold
range, the plan carries a ``BoundaryLookup``: the GC shell reads that stretch's
record starts from the object and moves to the greatest one at or below the
target; if it cannot (store down, damage), the plan's ``offset`` (a known
boundary below the target) is used, which still keeps at least ``B`` bytes.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from dataclasses import dataclass

from tiered.cold.objects.store import ObjectStoreError
from tiered.cold.parquet.chunk_index import ColdDataDamaged
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import RetentionAdvanced
from tiered.engine.streams.state import StreamState
from tiered.gc.context import GcContext, GcPass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BoundaryLookup:
    """Where to look for a finer record boundary: ``(lo, target]`` of one stream in one object."""

    key: str
    bucket: str
    path: str
    lo: int
    target: int


@dataclass(frozen=True, slots=True)
class RetentionTarget:
    """A stream whose policy releases data now: move its retained offset to ``offset`` (or a
    boundary the ``lookup`` finds in ``(offset, lookup.target]``)."""

    uid: int
    offset: int
    lookup: BoundaryLookup | None = None


def _age_units(state: StreamState, s: Stream) -> list[tuple[int, int, int]]:
    """(start, end, newest append time) of the stream's data from its retained offset on."""
    units: list[tuple[int, int, int]] = []
    if s.fork_source is not None and s.retained_from < s.fork_offset:
        units.append((s.retained_from, s.fork_offset, s.created_ms))  # inherited: one unit
    for ref in s.cold_refs:
        if ref.end > s.retained_from:
            obj = state.cold_objects.get(ref.key)
            # An object is written after every record in it: its age bounds theirs.
            units.append((ref.start, ref.end, obj.created_ms if obj else 0))
    c = s.chunks
    for i in range(len(c)):
        start, end = c.starts[i], c.starts[i] + c.lens[i]
        if end > s.retained_from and start >= s.cold_end:
            units.append((start, end, c.times[i]))
    return units


def policy_for(state: StreamState, s: Stream) -> tuple[int | None, int | None]:
    """The stream's own policy if it has one, else its bucket's."""
    if s.retention_ms is not None or s.retention_bytes is not None:
        return s.retention_ms, s.retention_bytes
    return state.bucket_retention.get(s.bucket, (None, None))


def size_target(state: StreamState, s: Stream, target: int) -> tuple[int, BoundaryLookup | None]:
    """The greatest record boundary known in memory at or below ``target``, and where a finer
    one may lie (inside a cold range) if that boundary is below it."""
    if target >= s.tail:
        return s.tail, None
    best = s.retained_from
    if s.fork_source is not None and s.fork_offset <= target:
        best = max(best, s.fork_offset)
    inside: tuple[str, int] | None = None
    for ref in s.cold_refs:
        if ref.start <= target:
            best = max(best, ref.start)
        if ref.end <= target:
            best = max(best, ref.end)
        elif ref.start < target < ref.end:
            inside = (ref.key, ref.start)
            obj = state.cold_objects.get(ref.key)
            entry = obj.index.find(s.bucket, s.path) if obj is not None else None
            for rng in entry.ranges if entry is not None else ():
                if ref.start <= rng.start_offset <= target:  # row group edges are record boundaries
                    best = max(best, rng.start_offset)
    c = s.chunks
    i = bisect_right(c.starts, target) - 1
    if i >= 0:
        best = max(best, c.starts[i])
    if best >= target or inside is None:
        return best, None
    key, _ = inside
    return best, BoundaryLookup(key, s.bucket, s.path, best, target)


def plan_retention(state: StreamState, now_ms: int) -> list[RetentionTarget]:
    """Every live stream whose policy releases data now, with where its retained offset goes."""
    plans = []
    for s in state.streams.values():
        if s.soft_deleted:
            continue
        retention_ms, retention_bytes = policy_for(state, s)
        if retention_ms is None and retention_bytes is None:
            continue
        offset, lookup = s.retained_from, None
        if retention_bytes is not None and s.tail - retention_bytes > s.retained_from:
            offset, lookup = size_target(state, s, s.tail - retention_bytes)
        if retention_ms is not None:
            cutoff = now_ms - retention_ms
            age_offset = s.retained_from
            for _, end, newest in _age_units(state, s):
                if newest >= cutoff:
                    break
                age_offset = max(age_offset, end)
            if age_offset > offset:
                offset = age_offset
                if lookup is not None and lookup.target <= offset:
                    lookup = None  # age releases past it anyway
        offset = min(offset, s.tail)
        if offset > s.retained_from or lookup is not None:
            plans.append(RetentionTarget(s.uid, offset, lookup))
    return plans


class ApplyRetention:
    """Move retained offsets where the policies say; what falls below is released."""

    name = "retention"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        state = ctx.state
        advances = await self.advances(ctx, gc_pass.now)
        report = gc_pass.report
        report.retention_advanced = len(advances)
        report.bytes_released += sum(offset - state.streams[uid].retained_from for uid, offset in advances)
        if advances and not gc_pass.dry_run:
            await ctx.committer.commit([RetentionAdvanced(ts_ms=gc_pass.now, advances=tuple(advances))])

    @staticmethod
    async def advances(ctx: GcContext, now: int) -> list[tuple[int, int]]:
        """(uid, new retained offset) for every stream a policy releases data of now.

        Where the size target lies inside a cold range, the object is read for the
        record boundary at or below it; failing that, the plan's known boundary
        (lower, so more is kept) is used.
        """
        state = ctx.state
        out = []
        for plan in plan_retention(state, now):
            offset = plan.offset
            lookup = plan.lookup
            obj = state.cold_objects.get(lookup.key) if lookup is not None else None
            if lookup is not None and obj is not None and ctx.reader is not None:
                try:
                    starts = await ctx.reader.record_starts(
                        lookup.key, obj.index, lookup.bucket, lookup.path, lookup.lo, lookup.target + 1
                    )
                    offset = max([offset, *(o for o in starts if o <= lookup.target)])
                except (ObjectStoreError, ColdDataDamaged) as exc:
                    log.warning(
                        "retention of %s/%s keeps more than needed: record boundaries in %s unreadable: %s",
                        lookup.bucket,
                        lookup.path,
                        lookup.key,
                        exc,
                    )
            s = state.streams.get(plan.uid)
            if s is not None and offset > s.retained_from:
                out.append((plan.uid, offset))
        return out
