"""The pure parts of catch-up reads from cold locators: which reads, which locator, until when, how much kept."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from tiered.cluster.gateway.catchup import (
    MAX_LOCATORS_PER_KEY,
    RETAINED_START,
    LocatorCache,
    catchup_offset,
    credential_key,
    start_of,
)
from tiered.cold.parquet.chunk_index import ChunkIndex, ChunkRange, RowGroupSpan, StreamIndex
from tiered.core.ids import format_offset
from tiered.engine.streams import locators
from tiered.engine.streams.locators import (
    MAX_PIECES,
    ColdPiece,
    Locator,
    build_locator,
    decode_locator,
    encode_locator,
    record_of,
    servable_end,
)
from tiered.engine.streams.model import ColdObject, ColdSlice, HotSlice
from tiered.engine.streams.ordinals import RecordIndex, ordinal_containing


def msgspec_replace(loc: Locator, **changes: Any) -> Locator:
    return msgspec.structs.replace(loc, **changes)


def _index(bucket: str = "b", path: str = "p", start: int = 0, end: int = 1000) -> ChunkIndex:
    return ChunkIndex(
        file_size=200,
        footer_length=20,
        row_groups=(RowGroupSpan(4, 176, 3, 12345),),
        streams=(StreamIndex(bucket, path, (ChunkRange(start, end, 0, 0, 3),)),),
        footer_crc32c=678,
    )


def _locator(
    start: int = 0, cold_end: int = 1000, tail: int = 5000, chunk: int = 100, valid_ms: int = 2000
) -> Locator:
    pieces = (ColdPiece("data/A.parquet", "b", "p", start, cold_end, _index("b", "p", start, cold_end)),)
    return Locator(7, "application/octet-stream", False, tail, chunk, start, cold_end, valid_ms, pieces)


# ---------------------------------------------------------------- which reads


def test_only_plain_catch_up_reads_at_an_explicit_offset_are_candidates() -> None:
    at = format_offset(12345)
    assert catchup_offset("GET", {"offset": at}, marked=False) == 12345
    assert catchup_offset("GET", {"offset": at, "cursor": "x"}, marked=False) == 12345
    assert catchup_offset("HEAD", {"offset": at}, marked=False) is None
    assert catchup_offset("POST", {"offset": at}, marked=False) is None
    for live in ("long-poll", "sse", ""):
        assert catchup_offset("GET", {"offset": at, "live": live}, marked=False) is None
    for raw in ("now", "12", "", "x" * 33):
        assert catchup_offset("GET", {"offset": raw}, marked=False) is None
    # From the retained start: where that is, the locator says.
    assert catchup_offset("GET", {"offset": "-1"}, marked=False) == RETAINED_START
    assert catchup_offset("GET", {}, marked=False) == RETAINED_START
    assert catchup_offset("GET", {"offset": at}, marked=True) is None


def test_the_credential_key_names_the_caller_without_holding_the_credential() -> None:
    assert credential_key(None) == b""
    a = credential_key("Bearer secret-token-a")
    assert a == credential_key("Bearer secret-token-a")
    assert a != credential_key("Bearer secret-token-b") and a != b""
    assert b"secret" not in a and len(a) == 32


# ---------------------------------------------------------------- what a locator serves


def test_a_locator_serves_only_answers_wholly_inside_it_and_below_the_tail() -> None:
    loc = _locator(start=100, cold_end=1000, tail=1200, chunk=100)
    assert servable_end(loc, 100) == 200
    assert servable_end(loc, 900) == 1000  # ends exactly at the cold frontier
    assert servable_end(loc, 99) is None  # before the locator
    assert servable_end(loc, 901) is None  # the answer would reach the hot tier
    at_tail = _locator(start=0, cold_end=1000, tail=1000, chunk=100)
    assert servable_end(at_tail, 800) == 900
    assert servable_end(at_tail, 900) is None  # up to date: only the owner knows if it is closed now


def test_locators_round_trip_and_malformed_ones_are_refused() -> None:
    loc = _locator()
    assert decode_locator(encode_locator(loc)) == loc
    with pytest.raises(ValueError):
        decode_locator(b"\x00not msgpack")
    gap = Locator(
        1, "t", False, 5000, 100, 0, 2000, 1000,
        (
            ColdPiece("data/1", "b", "p", 0, 1000, _index()),
            ColdPiece("data/2", "b", "p", 1100, 2000, _index()),
        ),
    )  # fmt: skip
    with pytest.raises(ValueError, match="contiguously"):
        decode_locator(encode_locator(gap))
    elsewhere = Locator(
        1,
        "t",
        False,
        5000,
        100,
        0,
        1000,
        1000,
        (ColdPiece("_tiered/cluster/cluster.json", "b", "p", 0, 1000, _index()),),
    )
    with pytest.raises(ValueError, match="cold objects"):
        decode_locator(encode_locator(elsewhere))  # only cold objects' keys are ever read
    beyond_tail = Locator(1, "t", False, 500, 100, 0, 1000, 1000, _locator().pieces)
    with pytest.raises(ValueError):
        decode_locator(encode_locator(beyond_tail))


# ---------------------------------------------------------------- the owner builds it


class _State:
    """What ``build_locator`` asks of ``StreamState``: a read plan (cold refs, then hot) and the cold objects."""

    def __init__(self, cold: list[ColdSlice], objects: dict[str, ColdObject]) -> None:
        self.cold = cold
        self.hot_from = cold[-1].end if cold else 0
        self.cold_objects = objects

    def plan_read(self, s: Any, start: int, end: int) -> list[ColdSlice | HotSlice]:
        out: list[ColdSlice | HotSlice] = [
            ColdSlice(c.key, c.bucket, c.path, max(start, c.start), min(end, c.end))
            for c in self.cold
            if c.end > start and c.start < end
        ]
        if end > self.hot_from:
            out.append(HotSlice(3, 0, end - max(start, self.hot_from)))
        return out


def _obj(key: str, start: int, end: int, bucket: str = "b", path: str = "p") -> ColdObject:
    both = ChunkIndex(
        300,
        20,
        (RowGroupSpan(4, 100, 3, 1), RowGroupSpan(104, 176, 3, 2)),
        tuple(
            sorted(
                (
                    StreamIndex(bucket, path, (ChunkRange(start, end, 0, 0, 3),)),
                    StreamIndex("zz", "other", (ChunkRange(0, 10, 1, 0, 3),)),
                ),
                key=lambda e: (e.bucket, e.stream),
            )
        ),
    )
    return ColdObject(key, 300, 0, 0, both, refs=1)


def _stream(**kw: Any) -> Any:
    base = {
        "uid": 9,
        "content_type": "application/json",
        "json": True,
        "ttl_s": None,
        "expires_at_ms": None,
        "retained_from": 0,
    }
    return SimpleNamespace(**{**base, **kw})


def _build(state: _State, s: Any, **kw: Any) -> Locator | None:
    args = {
        "tail": 4000,
        "offset": 0,
        "chunk_bytes": 500,
        "span_bytes": 1 << 20,
        "valid_ms": 3000,
        "now_ms": 0,
    }
    return build_locator(state, s, **{**args, **kw})  # type: ignore[arg-type]


def test_the_owner_locates_the_leading_cold_run_with_per_stream_indexes() -> None:
    plan = [ColdSlice("data/A", "b", "p", 0, 1000), ColdSlice("data/B", "b", "p", 1000, 2500)]
    state = _State(plan, {"data/A": _obj("data/A", 0, 1000), "data/B": _obj("data/B", 1000, 2500)})
    loc = _build(state, _stream())
    assert loc is not None
    assert (loc.uid, loc.content_type, loc.json, loc.tail, loc.chunk_bytes) == (
        9,
        "application/json",
        True,
        4000,
        500,
    )
    assert (loc.start, loc.cold_end, loc.valid_ms) == (0, 2500, 3000)
    assert [(p.key, p.start, p.end) for p in loc.pieces] == [("data/A", 0, 1000), ("data/B", 1000, 2500)]
    # Each piece's index names only this stream, with the object's row groups and digests.
    assert all([e.stream for e in p.index.streams] == ["p"] for p in loc.pieces)
    assert loc.pieces[0].index.row_groups == state.cold_objects["data/A"].index.row_groups
    assert decode_locator(encode_locator(loc)) == loc
    # A read whose answer reaches the hot tier gets no locator: the owner answers it.
    assert _build(state, _stream(), offset=2100) is None
    # The locator reaches back half its span, never below the retained start.
    loc = _build(state, _stream(), offset=1500)  # [1500, 2000): all cold
    assert loc is not None and (loc.start, loc.cold_end) == (0, 2500)
    loc = _build(state, _stream(retained_from=700), offset=1500)
    assert loc is not None and loc.retained_from == 700
    assert [(p.key, p.start, p.end) for p in loc.pieces] == [
        ("data/A", 700, 1000),
        ("data/B", 1000, 2500),
    ]
    loc = _build(state, _stream(), offset=1500, span_bytes=1200)
    assert loc is not None and (loc.start, loc.cold_end) == (900, 2100)


def test_no_locator_for_ttl_streams_reads_near_the_tail_or_when_switched_off() -> None:
    plan = [ColdSlice("data/A", "b", "p", 0, 3000)]
    state = _State(plan, {"data/A": _obj("data/A", 0, 3000)})
    assert _build(state, _stream(ttl_s=60)) is None  # a read renews a TTL on the owner
    assert _build(state, _stream(), valid_ms=0) is None
    assert _build(state, _stream(), tail=500) is None  # the answer is up to date
    assert _build(state, _stream(), chunk_bytes=3000, tail=3000) is None
    # An expiring stream: the locator ends before the stream does.
    loc = _build(state, _stream(expires_at_ms=1_000_400), now_ms=1_000_000)
    assert loc is not None and loc.valid_ms == 400
    assert _build(state, _stream(expires_at_ms=1_000_000), now_ms=1_000_000) is None


def test_an_object_being_deleted_ends_the_locator_and_pieces_are_bounded() -> None:
    plan = [ColdSlice("data/A", "b", "p", 0, 1000), ColdSlice("data/B", "b", "p", 1000, 2000)]
    deleting = _obj("data/B", 1000, 2000)
    deleting.deleting = True
    state = _State(plan, {"data/A": _obj("data/A", 0, 1000), "data/B": deleting})
    loc = _build(state, _stream())
    assert loc is not None and loc.cold_end == 1000
    many = [ColdSlice(f"data/{i}", "b", "p", i * 10, i * 10 + 10) for i in range(MAX_PIECES + 50)]
    state = _State(many, {sl.key: _obj(sl.key, sl.start, sl.end) for sl in many})
    loc = _build(state, _stream(), chunk_bytes=100, tail=100_000)
    assert loc is not None and len(loc.pieces) == MAX_PIECES and loc.cold_end == MAX_PIECES * 10


def test_a_fork_reads_its_sources_pieces() -> None:
    plan = [ColdSlice("data/S", "b", "source", 0, 1000), ColdSlice("data/F", "b", "p", 1000, 2000)]
    state = _State(
        plan, {"data/S": _obj("data/S", 0, 1000, path="source"), "data/F": _obj("data/F", 1000, 2000)}
    )
    loc = _build(state, _stream())
    assert loc is not None
    assert [(p.path, p.index.streams[0].stream) for p in loc.pieces] == [("source", "source"), ("p", "p")]


def test_the_locator_carries_the_owners_stream_record_for_every_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = [ColdSlice("data/A", "b", "p", 0, 1000), ColdSlice("data/B", "b", "p", 1000, 2500)]
    state = _State(plan, {"data/A": _obj("data/A", 0, 1000), "data/B": _obj("data/B", 1000, 2500)})
    index = RecordIndex()
    index.add([7 * i for i in range(4000 // 7 + 1)])  # a message every 7 bytes, from 0
    index.trim_below(300)  # retention released the first ones (mid-message at 300)
    indexes = {9: (index, None, 0)}

    def owner(x: int) -> int:
        return ordinal_containing(indexes.get, 9, x, 4000)

    loc = _build(state, _stream(retained_from=300), offset=300, index_of=indexes.get)
    assert loc is not None and loc.record_first is not None
    assert decode_locator(encode_locator(loc)) == loc
    assert [record_of(loc, x) for x in range(loc.start, loc.cold_end)] == [
        owner(x) for x in range(loc.start, loc.cold_end)
    ]
    # Without ordinals (a stream from before them, or no index given): no Stream-Record, as the owner.
    assert record_of(_build(state, _stream(retained_from=300), offset=300), 300) is None  # type: ignore[arg-type]
    assert record_of(_build(state, _stream(), index_of=lambda uid: None), 0) is None  # type: ignore[arg-type]
    # Too many messages for one locator: it is cut short where its ordinals end, and still exact.
    monkeypatch.setattr(locators, "MAX_RECORDS", 100)
    loc = _build(state, _stream(retained_from=300), offset=300, chunk_bytes=300, index_of=indexes.get)
    assert loc is not None and loc.cold_end == 1001 and loc.pieces[-1].end == 1001  # 100 changes from 301
    assert [record_of(loc, x) for x in range(300, 1001)] == [owner(x) for x in range(300, 1001)]
    # A read whose answer holds more messages than one locator may: no locator, the owner answers it.
    assert (
        _build(state, _stream(retained_from=300), offset=300, chunk_bytes=800, index_of=indexes.get) is None
    )


# ---------------------------------------------------------------- the non-owner keeps it


def test_a_cached_locator_is_valid_from_when_it_was_asked_for_and_never_after() -> None:
    cache = LocatorCache(8)
    key = ("b", "p", b"")
    loc = _locator(valid_ms=2000)
    until = cache.put(key, loc, sent_at=100.0, max_valid_s=5.0)
    assert until == 102.0  # the owner's validity, counted from the send
    assert cache.get(key, 0, 101.99) is loc
    assert cache.get(key, 0, 102.0) is None and cache.expired == 1 and len(cache) == 0
    # Our own bound wins when it is shorter.
    assert cache.put(key, loc, sent_at=200.0, max_valid_s=0.5) == 200.5
    assert cache.get(key, 0, 200.6) is None


def test_a_cached_locator_serves_only_its_own_caller_and_range() -> None:
    cache = LocatorCache(8)
    mine, theirs = ("b", "p", credential_key("Bearer a")), ("b", "p", credential_key("Bearer b"))
    loc = _locator(start=0, cold_end=1000, chunk=100)
    cache.put(mine, loc, 0.0, 10.0)
    assert cache.get(mine, 500, 1.0) is loc
    assert cache.get(theirs, 500, 1.0) is None
    assert cache.get(("b", "other", mine[2]), 500, 1.0) is None
    assert cache.get(mine, 950, 1.0) is None  # the answer would run past the locator
    # A read from the retained start is served by a locator that starts there (as of issue).
    assert cache.get(mine, RETAINED_START, 1.0) is loc and start_of(loc, RETAINED_START) == 0
    later = _locator(start=300, cold_end=1000, chunk=100)
    cache.put(theirs, msgspec_replace(later, retained_from=100), 0.0, 10.0)
    assert cache.get(theirs, RETAINED_START, 1.0) is None  # it does not reach back to 100
    assert cache.get(theirs, 300, 1.0) is not None


def test_the_cache_is_bounded_in_keys_locators_per_key_and_pieces() -> None:
    cache = LocatorCache(3)
    for i in range(5):
        cache.put(("b", f"p{i}", b""), _locator(), 0.0, 10.0)
    assert len(cache) == 3
    assert cache.get(("b", "p0", b""), 0, 1.0) is None and cache.get(("b", "p4", b""), 0, 1.0) is not None
    cache = LocatorCache(10)
    key = ("b", "p", b"")
    for i in range(MAX_LOCATORS_PER_KEY + 3):
        cache.put(key, _locator(start=i * 1000, cold_end=i * 1000 + 1000, tail=10**6), 0.0, 10.0)
    assert cache.pieces == MAX_LOCATORS_PER_KEY
    assert cache.get(key, 0, 1.0) is None  # the oldest ranges were let go
    assert cache.get(key, (MAX_LOCATORS_PER_KEY + 2) * 1000, 1.0) is not None
    cache = LocatorCache(100, max_pieces=3)
    for i in range(6):
        cache.put(("b", f"p{i}", b""), _locator(), 0.0, 10.0)
    assert cache.pieces <= 3 and len(cache) == 3
    cache.drop(("b", "p5", b""))
    assert cache.pieces == 2
