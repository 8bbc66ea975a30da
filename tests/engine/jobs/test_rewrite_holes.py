"""The rewrite's pure parts for keyed compaction: rows in holes dropped, gaps in holes allowed, candidates."""

from __future__ import annotations

import pytest

from tiered.cold.parquet.chunk import ColdRecord, encode_chunk
from tiered.core.record_digest import digest_bytes, record_hash
from tiered.engine.jobs.rewrite_plan import (
    KeptRange,
    RewriteMismatch,
    holes_within,
    in_holes,
    select_rows,
)
from tiered.engine.streams import integrity
from tiered.engine.streams.model import CreateRequest
from tiered.engine.streams.records import (
    Appended,
    ColdCopyCommitted,
    ColdCopyStarted,
    ColdHolesReleased,
    ColdRewriteCommitted,
    CopyRange,
    DroppedRows,
    RetentionAdvanced,
    StreamCompacted,
)
from tiered.engine.streams.state import StreamState

OCTET = "application/octet-stream"


def _rec(start: int, payload: bytes, path: str = "k", bucket: str = "b") -> ColdRecord:
    return ColdRecord(bucket, path, start, start + len(payload), 1, payload)


ROWS = [_rec(0, b"aaaa"), _rec(4, b"bbbb"), _rec(8, b"cccc"), _rec(12, b"dddd"), _rec(0, b"other", "o")]


def test_records_wholly_in_holes_are_dropped_and_reported_per_range() -> None:
    k = KeptRange(1, "b", "k", 0, 0, 16, ((4, 10),))  # [4, 10): all of "bbbb", half of "cccc"
    o = KeptRange(2, "b", "o", 0, 0, 5)
    dropped: dict[KeptRange, list[ColdRecord]] = {}
    kept = select_rows(ROWS, (k, o), None, dropped)
    assert [(r.stream, r.start_offset) for r in kept] == [("k", 0), ("k", 8), ("k", 12), ("o", 0)]
    assert dropped == {k: [ROWS[1]]}


def test_missing_rows_are_allowed_inside_holes_only() -> None:
    rewritten = [ROWS[0], ROWS[2], ROWS[3]]  # "bbbb" already gone
    k = KeptRange(1, "b", "k", 0, 0, 16, ((4, 8),))
    assert select_rows(rewritten, (k,)) == rewritten
    with pytest.raises(RewriteMismatch, match="gap or overlap at offset 4"):
        select_rows(rewritten, (KeptRange(1, "b", "k", 0, 0, 16, ((5, 8),)),))
    with pytest.raises(RewriteMismatch, match="cover only up to 12"):
        select_rows(ROWS[:3], (KeptRange(1, "b", "k", 0, 0, 16, ((13, 16),)),))
    assert select_rows(ROWS[:3], (KeptRange(1, "b", "k", 0, 0, 16, ((12, 16),)),)) == ROWS[:3]


def test_holes_clipped_and_ranges_wholly_in_holes() -> None:
    assert holes_within([(0, 3), (5, 9), (12, 20)], 2, 14) == ((2, 3), (5, 9), (12, 14))
    assert in_holes(KeptRange(1, "b", "k", 0, 4, 8, ((4, 8),)))
    assert not in_holes(KeptRange(1, "b", "k", 0, 4, 8, ((4, 6), (6, 8))[:1]))
    assert not in_holes(KeptRange(1, "b", "k", 0, 4, 4, ()))


def test_the_hole_checks_are_one_rule_for_rewrites_verify_and_releases() -> None:
    """``keyed.within_hole`` / ``keyed.continues`` are the one rule: a gap in stored rows is allowed
    only wholly inside one hole; the rewrite's tiling and ``tiered verify``'s agree case by case."""
    from tiered.cli.verify import _check_range
    from tiered.engine.streams.keyed import continues, within_hole

    holes = ((4, 8), (8, 10), (12, 16))  # not merged on purpose: a gap must lie inside ONE hole
    assert within_hole(holes, 4, 8) and within_hole(holes, 5, 6) and not within_hole(holes, 4, 10)
    assert continues(holes, 4, 4) and continues(holes, 4, 8) and continues(holes, 12, 16)
    assert not continues(holes, 4, 10) and not continues(holes, 8, 4) and not continues((), 0, 1)
    for kept in ([0], [0, 8], [0, 12], [0, 4, 8], [0, 8, 12], [4, 8], [0, 4, 12]):
        rows = [ROWS[i // 4] for i in kept]
        holes_ = ((4, 8), (12, 16))
        try:
            select_rows(rows, (KeptRange(1, "b", "k", 0, 0, 16, holes_),))
            tiled = True
        except RewriteMismatch:
            tiled = False
        verified = _check_range([(r.start_offset, r.end_offset, len(r.payload)) for r in rows], 0, 16, holes_)
        assert tiled == (verified is None), (kept, verified)


# --------------------------------------------------------------------------- the apply rules (pure)


def _keyed_state() -> tuple[StreamState, int, dict[str, int]]:
    """Stream default/k with records "aaaa" "bbbb" (object 'A') and "cccc" "dddd" (object 'B')."""
    st = StreamState()
    records, _ = st.decide_create("default", "k", CreateRequest(OCTET, None, None, None, False, b""), 1)
    for r in records:
        st.apply(r)
    uid = st.paths[("default", "k")]
    s = st.streams[uid]
    for i, data in enumerate((b"aaaa", b"bbbb", b"cccc", b"dddd")):
        appended = Appended(
            uid=uid,
            offset=s.tail,
            ts_ms=2,
            producer=None,
            epoch=0,
            seq=0,
            stream_seq=None,
            close=False,
            data=data,
        )
        st.apply(appended, (0, 100 + i))
    hashes = {}
    for key, lo in (("A", 0), ("B", 8)):
        rows = [_rec(lo + 4 * i, ROWS[lo // 4 + i].payload, bucket="default") for i in (0, 1)]
        _, index = encode_chunk(rows)
        st.apply(ColdCopyStarted(key, 3, (CopyRange(uid, lo, lo + 8),)))
        st.apply(ColdCopyCommitted(key, 3, 100, 7, index, (CopyRange(uid, lo, lo + 8),)))
    for start, data in ((0, b"aaaa"), (4, b"bbbb"), (8, b"cccc"), (12, b"dddd")):
        hashes[data.decode()] = record_hash("default", "k", 0, start, data)
    return st, uid, hashes


def test_a_commit_with_dropped_records_and_a_holes_release_move_digests_to_released() -> None:
    st, uid, h = _keyed_state()
    s = st.streams[uid]
    view = integrity.view(s)
    assert view is not None and view.live_records == 4
    total = view.total
    st.apply(StreamCompacted(uid=uid, ts_ms=4, removed=((0, 12),)))  # "aaaa", "bbbb", "cccc"
    # A lies wholly in the hole: released; B is rewritten without "cccc".
    st.apply(ColdHolesReleased("A", 5, (CopyRange(uid, 0, 8),)))
    _, index = encode_chunk([_rec(12, b"dddd", bucket="default")], gaps=True)
    st.apply(ColdCopyStarted("B2", 5, ()))
    dropped = DroppedRows(uid, 8, digest_bytes(h["cccc"]), 1, 4)
    st.apply(ColdRewriteCommitted("B", "B2", 6, 50, 1, index, (CopyRange(uid, 8, 16),), dropped=(dropped,)))
    assert [(r.start, r.end, r.key) for r in s.cold_refs] == [(8, 16, "B2")]
    assert st.cold_objects["A"].refs == 0 and st.cold_objects["B"].refs == 0
    after = integrity.view(s)
    assert after is not None
    assert (after.live, after.live_records, after.live_bytes) == (h["dddd"], 1, 4)
    assert after.released_records == 3 and after.total == total  # what was appended, unchanged


def test_a_holes_release_outside_holes_or_of_a_moved_range_changes_nothing() -> None:
    st, uid, _ = _keyed_state()
    s = st.streams[uid]
    st.apply(ColdHolesReleased("A", 5, (CopyRange(uid, 0, 8),)))  # no holes: A is still read
    assert [r.key for r in s.cold_refs] == ["A", "B"] and st.cold_objects["A"].refs == 1
    st.apply(StreamCompacted(uid=uid, ts_ms=4, removed=((0, 8),)))
    st.apply(RetentionAdvanced(5, ((uid, 8),)))  # retention released A's range first
    st.apply(ColdHolesReleased("A", 6, (CopyRange(uid, 0, 8),)))
    assert [r.key for r in s.cold_refs] == ["B"]
    view = integrity.view(s)
    assert view is not None and view.released_records == 2  # released once, by retention
