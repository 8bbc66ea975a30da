"""Cold-object rewrites, planned (pure): what a rewrite keeps, which objects erasure must rewrite, the report.

A cold object packs rows of many streams of many buckets. When a bucket is
erased its streams let go of their ranges, but an object that another bucket
still reads stays, erased rows and all. The rewrite job copies the rows some
stream still reads into a new object and releases the old one through the
GC's owner-and-grace lifecycle; this module decides, with no I/O:

* ``plan_rewrite``: the stream ranges still reading from an object (what the
  new object must hold, exactly);
* ``select_rows``: the rows of the old object inside those ranges, checked to
  tile each range record by record (a rewrite never drops or invents a byte a
  reader is served);
* ``erasure_candidates``: objects still read by someone that hold an erased
  bucket's rows no stream reads any more, earliest erasure first;
* ``erasure_report``: per erased bucket, every object still holding its bytes,
  why, until when, and whether the erasure deadline has passed.

Rows of an erased bucket that a fork in another bucket inherited (its soft-
deleted source still reads them) are that fork's data: they stay, reported as
``inherited by forks`` and exempt from the deadline, as the fork semantics of
``tests/gc/test_gc_two_buckets.py`` promise the fork's reader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tiered.cold.parquet.chunk import ColdRecord
from tiered.engine.streams.keyed import continues, within_hole
from tiered.engine.streams.model import ColdObject
from tiered.engine.streams.rewrites import owners_by_bucket, refs_to
from tiered.engine.streams.state import StreamState

PENDING = "rewrite pending"
AWAITING_DELETE = "awaiting deletion"
INHERITED = "inherited by forks"


class KeptRange(NamedTuple):
    """A stream range the rewritten object must hold: ``[start, end)`` of ``bucket/path``'s incarnation.

    ``holes``: the stream's holes inside it (keyed compaction, ``keyed``): bytes no read is served.
    A record wholly inside them is not copied (``select_rows``), and the old object may lack them.
    """

    uid: int
    bucket: str
    path: str
    incarnation: int
    start: int
    end: int
    holes: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class RewritePlan:
    key: str
    keep: tuple[KeptRange, ...]


class RewriteMismatch(ValueError):
    """The object's rows do not tile a range the metadata says it serves: nothing is rewritten."""


def plan_rewrite(state: StreamState, key: str) -> RewritePlan | None:
    """What a rewrite of ``key`` keeps; None if it is not to be rewritten (unknown, unowned, in flight)."""
    obj = state.cold_objects.get(key)
    if obj is None or obj.deleting or obj.refs == 0 or key in state.copies_in_flight:
        return None
    if obj.payload is not None:  # a large body's raw bytes, not Parquet: released whole, never rewritten
        return None
    keep = tuple(
        KeptRange(
            uid,
            bucket,
            path,
            incarnation,
            ref.start,
            ref.end,
            holes_within(state.streams[uid].holes, ref.start, ref.end),
        )
        for uid, bucket, path, incarnation, ref in refs_to(state, key)
    )
    return RewritePlan(key, keep) if keep else None


def holes_within(holes: Iterable[tuple[int, int]], start: int, end: int) -> tuple[tuple[int, int], ...]:
    """``holes`` (sorted, merged) clipped to ``[start, end)``."""
    return tuple((max(a, start), min(b, end)) for a, b in holes if a < end and b > start)


def in_holes(k: KeptRange) -> bool:
    """Whether all of ``k`` lies in its stream's holes: no read is served from it (it is released)."""
    return k.end > k.start and within_hole(k.holes, k.start, k.end)


def select_rows(
    records: Iterable[ColdRecord],
    keep: Iterable[KeptRange],
    predicate: Callable[[ColdRecord], bool] | None = None,
    dropped: dict[KeptRange, list[ColdRecord]] | None = None,
) -> list[ColdRecord]:
    """The rows inside the kept ranges (and passing ``predicate``), each range tiled exactly.

    A record wholly inside a range's holes (keyed compaction) is not kept: it is
    added to ``dropped`` (by range) so its digest can be released. Missing rows
    are allowed only inside holes (an object a compaction rewrote already).
    Raises ``RewriteMismatch`` when a kept range is not covered record by record
    (a gap outside the holes, an overlap, rows short of its end): the old object
    stays as it is.
    """
    wanted: dict[tuple[str, str], list[KeptRange]] = {}
    for k in keep:
        wanted.setdefault((k.bucket, k.path), []).append(k)
    reached: dict[KeptRange, int] = {k: k.start for ks in wanted.values() for k in ks}
    out: list[ColdRecord] = []
    for rec in records:
        for k in wanted.get((rec.bucket, rec.stream), ()):
            if rec.start_offset >= k.start and rec.end_offset <= k.end and rec.end_offset > rec.start_offset:
                pos = reached[k]
                if not continues(k.holes, pos, rec.start_offset):
                    raise RewriteMismatch(
                        f"{rec.bucket}/{rec.stream}: gap or overlap at offset {pos} "
                        f"(next record starts at {rec.start_offset})"
                    )
                reached[k] = rec.end_offset
                if k.holes and within_hole(k.holes, rec.start_offset, rec.end_offset):
                    if dropped is not None:
                        dropped.setdefault(k, []).append(rec)
                elif predicate is None or predicate(rec):
                    out.append(rec)
                break
    for k, pos in reached.items():
        if not continues(k.holes, pos, k.end):
            raise RewriteMismatch(f"{k.bucket}/{k.path} [{k.start}, {k.end}): rows cover only up to {pos}")
    return out


# ------------------------------------------------------------------ erasure


def _reads_by_object(state: StreamState) -> dict[str, dict[tuple[str, str], int]]:
    """Object key -> (bucket, path) -> bytes of it stream ranges read (one walk over the streams)."""
    reads: dict[str, dict[tuple[str, str], int]] = {}
    for s in state.streams.values():
        for ref in s.cold_refs:
            by_path = reads.setdefault(ref.key, {})
            by_path[(s.bucket, s.path)] = by_path.get((s.bucket, s.path), 0) + (ref.end - ref.start)
    return reads


def _unread_rows_of(read: dict[tuple[str, str], int], obj: ColdObject, buckets: Iterable[str]) -> bool:
    """Whether ``obj`` holds rows of ``buckets`` that no stream range reads any more (``read``: its reads)."""
    names = set(buckets)
    return any(
        e.bucket in names and read.get((e.bucket, e.stream), 0) < e.end_offset - e.start_offset
        for e in obj.index.streams
    )


def erased_held(obj: ColdObject, erased: dict[str, int]) -> dict[str, int]:
    """Bucket -> bytes of its rows ``obj`` holds, for the erased buckets among them."""
    held: dict[str, int] = {}
    owner = obj.owner_bucket
    if owner is not None and owner in erased:  # a large body's or a stream snapshot's object: all of it
        held[owner] = obj.size
    for e in obj.index.streams:
        if e.bucket in erased:
            held[e.bucket] = held.get(e.bucket, 0) + sum(r.end_offset - r.start_offset for r in e.ranges)
    return held


def erasure_candidates(state: StreamState, limit: int) -> list[str]:
    """Objects to rewrite for erasure: still read by someone, holding unread erased rows; earliest first."""
    erased = state.erased_buckets
    if not erased:
        return []
    due: list[tuple[int, str]] = []
    reads = _reads_by_object(state)
    for key, obj in state.cold_objects.items():
        held = erased_held(obj, erased)
        if not held or obj.refs == 0 or obj.deleting or key in state.copies_in_flight:
            continue
        if _unread_rows_of(reads.get(key, {}), obj, held):
            due.append((min(erased[b] for b in held), key))
    due.sort()
    return [key for _, key in due[:limit]]


@dataclass
class HeldObject:
    key: str
    bytes: int  # of the erased bucket's rows
    status: str  # PENDING, AWAITING_DELETE or INHERITED
    owners: dict[str, int]  # bucket -> stream ranges reading from it
    until_ms: int | None  # when it will hold them no more (None: while the forks read them)
    overdue: bool


@dataclass
class ErasedBucket:
    bucket: str
    erased_ms: int
    deadline_ms: int
    objects: list[HeldObject] = field(default_factory=list)

    @property
    def overdue(self) -> int:
        return sum(1 for o in self.objects if o.overdue)


@dataclass
class ErasureReport:
    now_ms: int
    deadline_ms: int  # the configured deadline, as a duration
    buckets: list[ErasedBucket]

    @property
    def overdue(self) -> list[tuple[str, HeldObject]]:
        return [(b.bucket, o) for b in self.buckets for o in b.objects if o.overdue]

    def to_json(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "deadline_s": self.deadline_ms / 1000,
            "overdue": len(self.overdue),
            "buckets": [
                {
                    "bucket": b.bucket,
                    "erased_ms": b.erased_ms,
                    "deadline_ms": b.deadline_ms,
                    "overdue": b.overdue,
                    "objects": [vars(o) for o in b.objects],
                }
                for b in self.buckets
            ],
        }


def erasure_report(state: StreamState, now_ms: int, deadline_ms: int, grace_ms: int) -> ErasureReport:
    """Per erased bucket, the objects still holding its bytes (see the module docstring)."""
    erased = state.erased_buckets
    out = {b: ErasedBucket(b, at, at + deadline_ms) for b, at in sorted(erased.items())}
    owners = owners_by_bucket(state) if erased else {}
    reads = _reads_by_object(state) if erased else {}
    for key in sorted(state.cold_objects):
        obj = state.cold_objects[key]
        held = erased_held(obj, erased)
        for bucket, n in held.items():
            entry = out[bucket]
            if obj.refs == 0 or obj.deleting:
                status = AWAITING_DELETE
                until: int | None = now_ms if obj.deleting else (obj.released_ms or now_ms) + grace_ms
            elif _unread_rows_of(reads.get(key, {}), obj, (bucket,)):
                status, until = PENDING, entry.deadline_ms
            else:
                status, until = INHERITED, None
            overdue = status != INHERITED and now_ms > entry.deadline_ms
            entry.objects.append(HeldObject(key, n, status, dict(owners.get(key, {})), until, overdue))
    return ErasureReport(now_ms, deadline_ms, list(out.values()))


# ------------------------------------------------------------------ keyed compaction


def reclaim_candidates(
    state: StreamState, limit: int, skip: Callable[[str, int], bool]
) -> list[tuple[str, int]]:
    """Objects holding bytes of a stream's holes (keyed compaction), with how many: most first.

    The bytes counted are those the object's index says it holds inside a range
    a stream reads from it and inside that stream's holes. Not candidates: large
    bodies' objects, objects going away or being written, objects a fork source
    reads (a fork created before holes were inherited may read its source's
    holes), and those ``skip`` names with that count (a rewrite found nothing to drop there).
    """
    held: dict[str, int] = {}
    for s in state.streams.values():
        if not s.holes or s.uid in state.children:
            continue
        for ref in s.cold_refs:
            obj = state.cold_objects.get(ref.key)
            if obj is None or obj.payload is not None or obj.deleting or ref.key in state.copies_in_flight:
                continue
            holes = holes_within(s.holes, ref.start, ref.end)
            if not holes:
                continue
            entry = obj.index.find(s.bucket, s.path)
            stored = 0 if entry is None else _overlap(entry.ranges, holes)
            if stored or in_holes(
                KeptRange(s.uid, s.bucket, s.path, s.incarnation, ref.start, ref.end, holes)
            ):
                held[ref.key] = held.get(ref.key, 0) + stored
    due = sorted(((-n, key) for key, n in held.items() if not skip(key, n)))
    return [(key, -n) for n, key in due[:limit]]


def _overlap(ranges: Iterable[Any], holes: tuple[tuple[int, int], ...]) -> int:
    """Bytes of the index ``ranges`` (``ChunkRange``) inside ``holes``."""
    total = 0
    for r in ranges:
        for a, b in holes:
            total += max(0, min(r.end_offset, b) - max(r.start_offset, a))
    return total
