"""The pure group coordinator when retention passes cursors (issue 18, defect 9): moved, reported, journaled.

``GroupsState`` inside a real ``StreamState``, on a virtual clock, records
encoded and decoded as the journal does. The rules:

* a cursor behind its stream's retained offset moves there with a
  ``GroupCursorsSkipped`` record naming ``[cursor, retained)``, when retention
  is applied (``decide_skips``) and at joins, heartbeats (after their
  commits), leaves, links and sweeps;
* the range is in the holder's assignment and the group view (``skipped``)
  until a commit moves the cursor; skips with no commit between are one range;
* where a stream became the group's is where its cursor starts, never a skip:
  its retained offset at the group's creation or an explicit link, its first
  byte when it was created later;
* skip records are idempotent, survive snapshots and replay.
"""

from __future__ import annotations

from typing import Any

from tiered.core.ids import DEFAULT_BUCKET as B
from tiered.core.ids import format_offset
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.groups import views
from tiered.engine.groups.records import GroupCursorsSkipped, GroupPlanned, SkippedRange
from tiered.engine.groups.state import CommitRequest, GroupSpec, GroupsState
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams.model import AppendRequest, CreateRequest
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

T0 = 1_000_000


def new_state() -> StreamState:
    return StreamState([GroupsState()])


class World:
    def __init__(self) -> None:
        self.state = new_state()
        self.now = T0
        self.journal: list[bytes] = []
        self._pos = 0

    @property
    def groups(self) -> GroupsState:
        ext = self.state.extensions["groups"]
        assert isinstance(ext, GroupsState)
        return ext

    def commit(self, records: list[Any]) -> list[Any]:
        out = []
        for r in records:
            body = encode_record(r)
            r = decode_record(body)
            loc = None
            if getattr(r, "data", b""):
                loc = (1, self._pos)
                self._pos += len(r.data) + 1
            self.state.apply(r, loc)
            self.journal.append(body)
            out.append(r)
        return out

    def stream(self, path: str, data: bytes) -> int:
        req = CreateRequest("text/plain", None, None, None, False, data)
        records, _ = self.state.decide_create(B, path, req, self.now)
        self.commit(records)
        s = self.state.find(B, path)
        assert s is not None
        return s.uid

    def append(self, path: str, data: bytes) -> None:
        self.commit([self.state.decide_append(B, path, AppendRequest("text/plain", data, False), self.now)])

    def retain(self, path: str, offset: int, *, follow: bool = True) -> list[GroupCursorsSkipped]:
        """Advance retention; ``follow``: as the server does at once (``RetentionFollower``)."""
        self.commit(self.state.decide_retain(B, path, offset, self.now))
        return self.commit(self.groups.decide_skips(self.state, self.now)) if follow else []

    def group(self, name: str, **spec: Any) -> None:
        self.commit(self.groups.decide_create(name, GroupSpec(**spec), self.state, self.now))

    def join(self, name: str, member: str) -> dict[str, Any]:
        self.commit(self.groups.decide_join(name, member, f"{member}-j", self.state, self.now))
        return views.member_view(self.groups, name, member)

    def heartbeat(self, name: str, view: dict[str, Any], *commits: tuple[str, int]) -> list[Any]:
        fences = {a["stream"]: a["fence"] for a in view["assignments"]}
        requests = [CommitRequest(path, fences[path], offset) for path, offset in commits]
        g = self.groups.get(name)
        records, rejected = self.groups.decide_heartbeat(
            name, g.incarnation, view["member"], view["generation"], requests, [], self.state, self.now
        )
        assert rejected == []
        return self.commit(records)


def gap(start: int, end: int) -> dict[str, Any]:
    return {"from": format_offset(start), "to": format_offset(end), "bytes": end - start}


def skips_of(records: list[Any]) -> list[tuple[str, int, int]]:
    return [(s.path, s.start, s.end) for r in records if isinstance(r, GroupCursorsSkipped) for s in r.skips]


def test_retention_past_a_committed_cursor_moves_it_and_the_holder_is_told() -> None:
    w = World()
    uid = w.stream("s", b"0123456789")
    w.group("g", streams=("s",))
    view = w.join("g", "m1")
    assert view["assignments"][0]["cursor"] == format_offset(0)
    w.heartbeat("g", view, ("s", 4))

    skipped = w.retain("s", 8)
    assert skips_of(skipped) == [("s", 4, 8)]
    g = w.groups.get("g")
    assert (g.cursors[uid], g.skipped) == (8, {uid: (4, 8)})
    view = views.member_view(w.groups, "g", "m1")
    assert view["assignments"][0]["cursor"] == format_offset(8)
    assert view["assignments"][0]["skipped"] == gap(4, 8)
    row = views.group_view(w.groups, "g", w.state, w.now, lambda s: s.tail)["targets"][0]
    assert (row["cursor"], row["skipped"]) == (format_offset(8), gap(4, 8))

    # More retention before any commit: one range from the last commit on.
    w.append("s", b"abcdef")
    assert skips_of(w.retain("s", 12)) == [("s", 8, 12)]
    assert w.groups.get("g").skipped == {uid: (4, 12)}
    # A late commit below the cursor changes nothing; one past it clears the report.
    assert w.heartbeat("g", view, ("s", 10)) == []
    assert w.groups.get("g").skipped == {uid: (4, 12)}
    records = w.heartbeat("g", view, ("s", 14))
    assert skips_of(records) == [] and w.groups.get("g").skipped == {}
    assert "skipped" not in views.member_view(w.groups, "g", "m1")["assignments"][0]
    assert w.groups.decide_skips(w.state, w.now) == []  # a fixed point


def test_without_the_immediate_follow_up_every_decision_catches_it() -> None:
    """Cluster mode's groups hear of another shard's retention late: sweeps, joins and heartbeats move the cursor."""
    w = World()
    uid = w.stream("s", b"0123456789")
    w.group("g", streams=("s",))
    view = w.join("g", "m1")
    w.retain("s", 3, follow=False)
    g = w.groups.get("g")
    # A heartbeat's commit is applied first: committing past the retained offset is no skip.
    assert skips_of(w.heartbeat("g", view, ("s", 5))) == []
    w.retain("s", 7, follow=False)
    # A heartbeat whose commit stays below it: the rest is skipped, from the commit on.
    assert skips_of(w.heartbeat("g", view, ("s", 6))) == [("s", 6, 7)]
    assert (g.cursors[uid], g.skipped[uid]) == (7, (6, 7))
    w.retain("s", 9, follow=False)
    assert skips_of(w.commit(w.groups.decide_sweep(w.state, w.now))) == [("s", 7, 9)]
    assert g.skipped[uid] == (6, 9)
    w.retain("s", 10, follow=False)
    assert skips_of(w.commit(w.groups.decide_join("g", "m2", "m2-j", w.state, w.now))) == [("s", 9, 10)]
    assert g.cursors[uid] == 10 and g.skipped[uid] == (6, 10)


def test_where_a_stream_became_the_groups_is_no_skip() -> None:
    w = World()
    old = w.stream("old", b"0123456789")
    w.retain("old", 6)
    # Created on a stream whose first 6 bytes are already gone: it starts at 6.
    w.group("g", pattern="*")
    assert w.groups.get("g").cursors == {old: 6}
    # A stream created later is the group's from its first byte: retention before any plan is a skip.
    w.stream("late", b"abcdef")
    w.retain("late", 4)
    view = w.join("g", "m1")
    by_stream = {a["stream"]: a for a in view["assignments"]}
    assert by_stream["old"]["cursor"] == format_offset(6) and "skipped" not in by_stream["old"]
    assert (by_stream["late"]["cursor"], by_stream["late"]["skipped"]) == (format_offset(4), gap(0, 4))
    # An existing stream linked explicitly becomes the group's as it is: at its retained offset.
    w.group("h", streams=("nothing-yet",))
    w.join("h", "m1")
    linked = w.groups.decide_link("h", ["old"], w.state, w.now)
    assert [type(r) for r in linked] == [GroupPlanned]
    plan = w.commit(linked)[0]
    assert isinstance(plan, GroupPlanned) and plan.starts == ((old, 6),)
    assert w.groups.get("h").cursors[old] == 6 and w.groups.get("h").skipped == {}


def test_a_group_created_before_retention_reports_what_it_never_planned() -> None:
    """The group selected the stream at creation; retention came before its first plan."""
    w = World()
    uid = w.stream("s", b"0123456789")
    w.group("g", streams=("s",))
    assert w.groups.get("g").cursors == {uid: 0} and w.groups.get("g").targets == {}
    w.retain("s", 10)  # nothing to move yet: the group has no targets
    records = w.commit(w.groups.decide_sweep(w.state, w.now))
    assert [type(r) for r in records] == [GroupPlanned, GroupCursorsSkipped]
    assert skips_of(records) == [("s", 0, 10)]


def test_skip_records_are_idempotent_and_survive_snapshots_and_replay() -> None:
    w = World()
    uid = w.stream("s", b"0123456789")
    w.group("g", streams=("s",))
    view = w.join("g", "m1")
    w.heartbeat("g", view, ("s", 2))
    (record,) = w.retain("s", 5)
    digest = w.groups.digest()
    w.groups.apply(record)  # a replayed or duplicated record: the cursor is no longer at its start
    stale = GroupCursorsSkipped("g", record.incarnation, w.now, (SkippedRange(uid, "s", 3, 9),))
    w.groups.apply(stale)
    other = GroupCursorsSkipped("g", record.incarnation + 1, w.now, (SkippedRange(uid, "s", 5, 9),))
    w.groups.apply(other)  # another incarnation's
    assert w.groups.digest() == digest

    snapshot = encode_snapshot(w.state, LogPosition(0, len(w.journal)))
    restored, _ = decode_snapshot(snapshot, new_state)
    replayed = new_state()
    for body in w.journal:
        replayed.apply(decode_record(body), (1, 0) if getattr(decode_record(body), "data", b"") else None)
    for state in (restored, replayed):
        groups = state.extensions["groups"]
        assert isinstance(groups, GroupsState)
        assert groups.digest() == digest
        assert groups.get("g").skipped == {uid: (2, 5)}
