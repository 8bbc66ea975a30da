"""The rewrite's pure parts for keyed compaction: rows in holes dropped, gaps in holes allowed, candidates."""

from __future__ import annotations

import pytest

from tiered.cold.parquet.chunk import ColdRecord
from tiered.engine.jobs.rewrite_plan import (
    KeptRange,
    RewriteMismatch,
    holes_within,
    in_holes,
    select_rows,
)


def _rec(start: int, payload: bytes, path: str = "k") -> ColdRecord:
    return ColdRecord("b", path, start, start + len(payload), 1, payload)


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
