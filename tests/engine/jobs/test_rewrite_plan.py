"""The rewrite's pure parts: which rows a rewrite keeps, how its commit moves ranges, owners by bucket."""

from __future__ import annotations

import pytest

from tiered.cold.parquet.chunk import ColdRecord, encode_chunk
from tiered.engine.jobs.rewrite_plan import (
    KeptRange,
    RewriteMismatch,
    erasure_candidates,
    plan_rewrite,
    select_rows,
)
from tiered.engine.streams.model import CreateRequest
from tiered.engine.streams.records import (
    ColdCopyCommitted,
    ColdCopyStarted,
    ColdRewriteCommitted,
    CopyRange,
    RetentionAdvanced,
)
from tiered.engine.streams.rewrites import owners_by_bucket
from tiered.engine.streams.state import StreamState

OCTET = "application/octet-stream"


def _rec(bucket: str, path: str, start: int, payload: bytes) -> ColdRecord:
    return ColdRecord(bucket, path, start, start + len(payload), 1, payload)


def _state() -> tuple[StreamState, dict[str, int]]:
    """Streams a/x (alpha), b/y and b/z (beta), 10 bytes each, all in object 'old'."""
    st = StreamState()
    uids: dict[str, int] = {}
    for bucket in ("alpha", "beta"):
        for r in st.decide_bucket(bucket, 1):
            st.apply(r)
    for bucket, path in (("alpha", "x"), ("beta", "y"), ("beta", "z")):
        records, _ = st.decide_create(
            bucket, path, CreateRequest(OCTET, None, None, None, False, b"0123456789"), 1
        )
        for i, r in enumerate(records):
            st.apply(r, (0, i))
        uids[path] = st.paths[(bucket, path)]
    rows = [
        _rec("alpha", "x", 0, b"0123456789"),
        _rec("beta", "y", 0, b"0123456789"),
        _rec("beta", "z", 0, b"0123456789"),
    ]
    _, index = encode_chunk(rows)
    ranges = tuple(CopyRange(uid, 0, 10) for uid in uids.values())
    st.apply(ColdCopyStarted("old", 2, ranges))
    st.apply(ColdCopyCommitted("old", 2, 100, 7, index, ranges))
    return st, uids


def test_owners_by_bucket_and_erasure_candidates() -> None:
    st, _ = _state()
    assert owners_by_bucket(st) == {"old": {"alpha": 1, "beta": 2}}
    assert erasure_candidates(st, 10) == []  # nothing erased
    st.apply(st.decide_erase_bucket("alpha", 3))
    assert owners_by_bucket(st) == {"old": {"beta": 2}}
    assert erasure_candidates(st, 10) == ["old"] and erasure_candidates(st, 0) == []
    plan = plan_rewrite(st, "old")
    assert plan is not None and {(k.bucket, k.path, k.start, k.end) for k in plan.keep} == {
        ("beta", "y", 0, 10),
        ("beta", "z", 0, 10),
    }


def test_commit_moves_only_ranges_still_reading_the_old_object() -> None:
    st, uids = _state()
    st.apply(st.decide_erase_bucket("alpha", 3))
    _, index = encode_chunk([_rec("beta", "y", 0, b"0123456789"), _rec("beta", "z", 0, b"0123456789")])
    st.apply(ColdCopyStarted("new", 4, ()))
    # beta/y's range was released between the plan and the commit: it stays released.
    st.apply(RetentionAdvanced(4, ((uids["y"], 10),)))
    assert st.cold_objects["old"].refs == 1
    stale = CopyRange(uids["z"], 0, 9)  # not the range z reads: not moved
    st.apply(ColdRewriteCommitted("old", "new", 5, 50, 1, index, (CopyRange(uids["y"], 0, 10), stale)))
    assert st.cold_objects["new"].refs == 0 and st.cold_objects["new"].released_ms == 5
    assert st.cold_objects["old"].refs == 1 and "new" not in st.copies_in_flight
    st.apply(ColdRewriteCommitted("old", "new2", 6, 50, 1, index, (CopyRange(uids["z"], 0, 10),)))
    assert [r.key for r in st.streams[uids["z"]].cold_refs] == ["new2"]
    assert st.cold_objects["old"].refs == 0 and st.cold_objects["old"].released_ms == 6
    assert st.cold_objects["new2"].refs == 1
    assert plan_rewrite(st, "old") is None and erasure_candidates(st, 10) == []


def test_select_rows_keeps_exactly_the_ranges_and_refuses_gaps() -> None:
    rows = [
        _rec("b", "y", 0, b"ab"),
        _rec("b", "y", 2, b"cd"),
        _rec("b", "z", 0, b"zz"),
        _rec("a", "x", 0, b"x"),
    ]
    keep = [KeptRange(1, "b", "y", 0, 0, 4)]
    assert select_rows(rows, keep) == rows[:2]
    assert select_rows(rows, keep, lambda r: r.start_offset > 0) == rows[1:2]
    with pytest.raises(RewriteMismatch, match="cover only up to 4"):
        select_rows(rows, [KeptRange(1, "b", "y", 0, 0, 6)])
    with pytest.raises(RewriteMismatch, match="gap or overlap"):
        select_rows([rows[0], rows[0], rows[1]], keep)
