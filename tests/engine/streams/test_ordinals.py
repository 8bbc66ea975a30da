"""Record ordinals (issue 22), pure: ``tiered.engine.streams.ordinals`` against a model.

The index is derived from the stream records the state applies, so it is checked the way the
engine produces it: decide, apply, replay the journal, snapshot and restore; and against a
model (a list of (ordinal, start offset) per message) under random appends, retention and
compaction's removal of messages.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.streams.test_state_machine import FakeDisk, Harness
from tiered.core.content import encode_json_messages
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.engine import new_state
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams import ordinals
from tiered.engine.streams.model import ForkRequest
from tiered.engine.streams.ordinals import RecordIndex, RecordsState, message_starts
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

B = DEFAULT_BUCKET


class OrdinalHarness(Harness):
    """The state machine harness with the engine's extensions (the record index among them)."""

    def __init__(self) -> None:
        self.state = new_state()
        self.disk = FakeDisk()
        self.journal = []

    @property
    def records(self) -> RecordsState:
        ext = self.state.extensions[ordinals.NAME]
        assert isinstance(ext, RecordsState)
        return ext

    def index_of(self, uid: int) -> tuple[RecordIndex, int | None, int] | None:
        index = self.records.indexes.get(uid)
        if index is None:
            return None
        s = self.state.streams[uid]
        return index, (s.fork_source if uid in self.records.parents else None), s.fork_offset

    def view(self, path: str) -> ordinals.RecordView | None:
        s = self.stream(path)
        return ordinals.view(self.index_of, s.uid, s.retained_from, s.tail)

    def replay_full(self) -> StreamState:
        fresh = new_state()
        for r, loc in self.journal:
            fresh.apply(decode_record(encode_record(r)), loc)
        return fresh


def test_message_starts() -> None:
    assert message_starts(10, b"", False) == []
    assert message_starts(10, b"abc", False) == [10]
    assert message_starts(10, b"1\n22\n333\n", True) == [10, 12, 15]
    assert message_starts(0, b'{"a":"x"}\n', True) == [0]


def test_appends_number_messages_densely_and_replay_and_snapshots_agree() -> None:
    h = OrdinalHarness()
    h.create("bytes", content_type="application/octet-stream", data=b"a")
    h.append("bytes", b"bc")
    h.append("bytes", b"def")
    h.create("json", content_type="application/json")
    h.append(
        "json", encode_json_messages(b"[1, 2, 3]", allow_empty_array=False), content_type="application/json"
    )
    h.append("json", encode_json_messages(b"4", allow_empty_array=False), content_type="application/json")
    assert h.view("bytes") == ordinals.RecordView(0, 3, 3)
    assert h.view("json") == ordinals.RecordView(0, 4, 4)
    s = h.stream("json")
    assert [ordinals.offset_of(h.index_of, s.uid, n, s.tail) for n in range(5)] == [0, 2, 4, 6, 8]
    assert ordinals.offset_of(h.index_of, s.uid, 5, s.tail) is None
    assert [ordinals.ordinal_containing(h.index_of, s.uid, o, s.tail) for o in range(9)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
    ]

    def dump(state: StreamState) -> dict[int, Any]:
        ext = state.extensions[ordinals.NAME]
        assert isinstance(ext, RecordsState)
        return {uid: index.packed() for uid, index in ext.indexes.items()}

    assert dump(h.replay_full()) == dump(h.state)
    restored, _ = decode_snapshot(encode_snapshot(h.state, LogPosition(1, 0)), new_state)
    assert dump(restored) == dump(h.state)


def test_retention_trims_and_reports_the_first_retained_record() -> None:
    h = OrdinalHarness()
    h.create("s", content_type="text/plain")
    for part in (b"aa", b"bbb", b"c", b"dddd"):
        h.append("s", part, content_type="text/plain")
    h.commit(h.state.decide_retain(B, "s", 5, 0))
    assert h.view("s") == ordinals.RecordView(2, 4, 2)
    assert len(h.records.indexes[h.stream("s").uid].ords) == 2  # the index forgot what retention released


def test_compaction_skips_removed_ordinals_and_never_reuses_them() -> None:
    h = OrdinalHarness()
    h.create("s", content_type="text/plain")
    for part in (b"aa", b"bbb", b"c", b"dddd"):
        h.append("s", part, content_type="text/plain")
    s = h.stream("s")
    index = h.records.indexes[s.uid]
    assert index.remove_range(2, 6) == 2  # records 1 and 2 compacted away
    assert ordinals.offset_of(h.index_of, s.uid, 1, s.tail) == 6  # reads from the next survivor
    assert ordinals.view(h.index_of, s.uid, 0, s.tail) == ordinals.RecordView(0, 4, 2)
    h.append("s", b"e", content_type="text/plain")
    assert index.ords.tolist() == [0, 3, 4]


def test_a_fork_continues_its_source_and_deletes_forget_indexes() -> None:
    h = OrdinalHarness()
    h.create("src", content_type="text/plain", data=b"a")
    h.append("src", b"bc", content_type="text/plain")
    h.append("src", b"def", content_type="text/plain")
    src = h.stream("src")
    h.create("fork", content_type="text/plain", fork=ForkRequest(src.uid, 3, "src@3"))
    h.append("fork", b"X", content_type="text/plain")
    fork = h.stream("fork")
    assert h.view("fork") == ordinals.RecordView(0, 3, 3)
    assert ordinals.offset_of(h.index_of, fork.uid, 1, fork.tail) == 1
    assert ordinals.offset_of(h.index_of, fork.uid, 2, fork.tail) == 3
    assert ordinals.ordinal_containing(h.index_of, fork.uid, 2, fork.tail) == 1
    h.delete("src")  # soft-deleted: the fork still reads it
    assert src.uid in h.records.indexes
    h.delete("fork")
    assert h.records.indexes == {} and h.records.parents == {}


def _changes_agree(h: OrdinalHarness, uid: int, retained_from: int, tail: int) -> None:
    """``changes`` (what a cold locator carries) gives ``ordinal_containing`` at every offset of any range."""
    for start in range(retained_from, tail):
        first = ordinals.ordinal_containing(h.index_of, uid, start, tail)
        for end in {start + 1, (start + tail + 1) // 2, tail}:
            changes = ordinals.changes(h.index_of, uid, start, end, tail)
            assert all(start <= o < end for o, _ in changes)
            for x in range(start, end):
                at = [n for o, n in changes if o <= x]
                assert (at[-1] if at else first) == ordinals.ordinal_containing(h.index_of, uid, x, tail)


def test_changes_answer_ordinals_through_forks_and_retention() -> None:
    h = OrdinalHarness()
    h.create("src", content_type="text/plain", data=b"a")
    for part in (b"bc", b"def", b"gh"):
        h.append("src", part, content_type="text/plain")
    src = h.stream("src")
    h.commit(h.state.decide_retain(B, "src", 2, 0))  # mid-message: the partial one's entry goes
    h.create("fork", content_type="text/plain", fork=ForkRequest(src.uid, 4, "src@4"))  # mid-message, no body
    h.append("fork", b"XY", content_type="text/plain")
    h.append("fork", b"Z", content_type="text/plain")
    fork = h.stream("fork")
    h.create("fork2", content_type="text/plain", data=b"QQ", fork=ForkRequest(fork.uid, 7, "fork@7"))
    h.append("fork2", b"R", content_type="text/plain")
    for name in ("src", "fork", "fork2"):
        s = h.stream(name)
        _changes_agree(h, s.uid, s.retained_from, s.tail)


def test_streams_from_before_ordinals_have_none_and_appends_do_not_start_a_partial_index() -> None:
    h = OrdinalHarness()
    h.create("s", content_type="text/plain", data=b"old")
    h.records.indexes.clear()  # as restored from a snapshot written before ordinals were kept
    h.append("s", b"new", content_type="text/plain")
    assert h.view("s") is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    json_mode=st.booleans(),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.lists(st.integers(0, 99), min_size=1, max_size=4)),
            st.tuples(st.just("retain"), st.integers(0, 200)),
        ),
        max_size=25,
    ),
)
def test_ordinals_match_a_model(json_mode: bool, ops: list[tuple[str, Any]]) -> None:
    h = OrdinalHarness()
    ct = "application/json" if json_mode else "application/octet-stream"
    h.create("s", content_type=ct)
    model: list[tuple[int, int]] = []  # (ordinal, start) of every message stored
    for op, arg in ops:
        s = h.stream("s")
        if op == "append":
            if json_mode:
                data = encode_json_messages(json.dumps(arg).encode(), allow_empty_array=False)
                starts = message_starts(s.tail, data, True)
            else:
                data, starts = bytes(arg), [s.tail]
            model += [(len(model) + i, start) for i, start in enumerate(starts)]
            h.append("s", data, content_type=ct)
        else:
            h.commit(h.state.decide_retain(B, "s", min(arg, s.tail), 0))
    s = h.stream("s")
    kept = [(o, start) for o, start in model if start >= s.retained_from]
    view = h.view("s")
    assert view == ordinals.RecordView(kept[0][0] if kept else len(model), len(model), len(kept))
    for ordinal, start in kept:
        assert ordinals.offset_of(h.index_of, s.uid, ordinal, s.tail) == start
        assert ordinals.ordinal_containing(h.index_of, s.uid, start, s.tail) == ordinal
    assert ordinals.offset_of(h.index_of, s.uid, len(model), s.tail) == s.tail
    _changes_agree(h, s.uid, s.retained_from, s.tail)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "a/b", "b", "c/d", "c", "e"])), max_size=30)
)
def test_the_stream_directory_follows_creates_and_deletes(ops: list[tuple[bool, str]]) -> None:
    """``listing.StreamDirectory``: built lazily, kept sorted, stale paths skipped, rebuilt after restore."""
    from tiered.engine.streams.listing import StreamDirectory

    h = OrdinalHarness()
    directory = h.state.extensions[StreamDirectory.name]
    assert isinstance(directory, StreamDirectory)
    for i, (create, path) in enumerate(ops):
        if i == len(ops) // 2:
            directory.paths_of(B, h.state)  # built halfway: the rest is observed
        exists = h.state.find(B, path) is not None
        if create and not exists:
            h.create(path, content_type="text/plain")
        elif not create and exists:
            h.delete(path)
    live = sorted(p for (b, p) in h.state.paths if b == B)
    assert [p for p in directory.paths_of(B, h.state) if (B, p) in h.state.paths] == live
    restored, _ = decode_snapshot(encode_snapshot(h.state, LogPosition(1, 0)), new_state)
    again = restored.extensions[StreamDirectory.name]
    assert isinstance(again, StreamDirectory) and again.paths_of(B, restored) == live
