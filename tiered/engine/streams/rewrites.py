"""Cold objects rewritten: stream ranges move from an old object to its rewritten copy; owners by bucket.

A rewrite (``tiered.engine.jobs.rewrite``) copies the rows of an object that
some stream still reads into a new object, then journals ``ColdRewriteCommitted``.
Applying it is deterministic and safe against anything that happened between
the plan and the commit: only a range that still reads from the old object,
exactly as listed, moves; one released meanwhile (retention, a delete, an
erasure) stays released, so a rewrite never brings back what a release let go.

``owners_by_bucket`` is who still owns each object, by bucket (the stream
ranges that read from it), the proof an erasure needs: a bare count cannot say
whether an erased bucket is among the owners.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.engine.streams import integrity, keyed
from tiered.engine.streams.model import ColdObject, ColdRef
from tiered.engine.streams.records import ColdHolesReleased, ColdRewriteCommitted
from tiered.engine.streams.release import unref

if TYPE_CHECKING:
    from tiered.engine.streams.state import StreamState


def apply_rewrite_committed(state: StreamState, record: ColdRewriteCommitted) -> None:
    state.copies_in_flight.pop(record.new_key, None)
    dropped = {(d.uid, d.start): d for d in record.dropped}
    new = state.cold_objects.get(record.new_key)
    if new is None:
        new = ColdObject(record.new_key, record.size, record.crc32c, record.ts_ms, record.index)
        state.cold_objects[record.new_key] = new
    for r in record.ranges:
        s = state.streams.get(r.uid)
        if s is None:
            continue
        for i, ref in enumerate(s.cold_refs):
            if ref.key == record.old_key and ref.start == r.start and ref.end == r.end:
                s.cold_refs[i] = ColdRef(ref.start, ref.end, record.new_key)
                gone = dropped.get((r.uid, r.start))
                if gone is not None:  # a compaction rewrite: the records in holes it left behind are released
                    integrity.note_dropped(
                        s, ref.start, int.from_bytes(gone.digest, "big"), gone.records, gone.size
                    )
                new.refs += 1
                unref(state, record.old_key, record.ts_ms)
                break
    if new.refs == 0 and new.released_ms is None:
        new.released_ms = record.ts_ms  # every range it copied was released meanwhile: garbage


def apply_holes_released(state: StreamState, record: ColdHolesReleased) -> None:
    """Drop each listed reference that still reads ``old_key`` exactly and lies wholly in its holes."""
    for r in record.ranges:
        s = state.streams.get(r.uid)
        if s is None or not keyed.within_hole(s.holes, r.start, r.end):
            continue
        kept = [
            ref
            for ref in s.cold_refs
            if not (ref.key == record.old_key and ref.start == r.start and ref.end == r.end)
        ]
        if len(kept) == len(s.cold_refs):
            continue  # released or moved meanwhile
        integrity.note_release(s, s.cold_refs, kept)
        s.cold_refs = kept
        unref(state, record.old_key, record.ts_ms)


def owners_by_bucket(state: StreamState) -> dict[str, dict[str, int]]:
    """Object key -> bucket -> how many stream ranges of that bucket read from it.

    A soft-deleted stream (kept for its forks) counts under its own bucket, so
    an erased bucket's bytes that a fork in another bucket still inherits show
    as that erased bucket's ownership.
    """
    owners: dict[str, dict[str, int]] = {}
    for s in state.streams.values():
        for ref in s.cold_refs:
            by_bucket = owners.setdefault(ref.key, {})
            by_bucket[s.bucket] = by_bucket.get(s.bucket, 0) + 1
    return owners


def refs_to(state: StreamState, key: str) -> list[tuple[int, str, str, int, ColdRef]]:
    """The stream ranges reading from ``key``: (uid, bucket, path, incarnation, ref)."""
    return [
        (s.uid, s.bucket, s.path, s.incarnation, ref)
        for s in state.streams.values()
        for ref in s.cold_refs
        if ref.key == key
    ]
