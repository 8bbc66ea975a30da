"""Consumer groups: a stateful property test of the pure coordinator core.

A hypothesis ``RuleBasedStateMachine`` drives ``GroupsState`` (registered in a
``StreamState``, exactly as the server does) with a virtual clock: streams come
and go and grow, members join, rejoin, heartbeat with commits and releases,
leave and expire, explicit streams are linked and unlinked, the group is
deleted and created again, stale calls and stale journal records are replayed,
and the process "crashes" and is rebuilt from a snapshot plus the journal.

After every step it checks the invariants the design promises: one holder
per stream, every holder a live member instance, activation only after the
previous holder let go, balance within one, the fewest moves, the revision
rising by exactly one per plan, fences rising per stream, cursors monotonic,
within the tail and surviving restarts and rebalances, and stale calls
refused with the state unchanged.

Retention advances streams' retained offsets too (issue 18, defect 9): every
cursor it passes is moved to the retained offset by a journaled skip naming
exactly the range between them, the range stays visible to members until a
commit moves the cursor, and after a sweep no cursor of a group's stream is
left behind its retained offset (no member is ever sent to read released data).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tiered.core.errors import TieredError
from tiered.core.errors import TieredError as StreamError
from tiered.core.globs import glob_match
from tiered.core.ids import DEFAULT_BUCKET, format_offset, parse_offset
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.groups import views
from tiered.engine.groups.records import (
    GroupCommitted,
    GroupCreated,
    GroupCursorsSkipped,
    GroupDeleted,
    GroupPlanned,
)
from tiered.engine.groups.state import (
    CommitRequest,
    GroupSpec,
    GroupsState,
    ReleaseRequest,
    assign,
    live_stream,
)
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams.model import AppendRequest, CreateRequest
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

B = DEFAULT_BUCKET
G = "g"
PATHS = ["a/1", "a/2", "a/3", "a/4", "b/1", "b/2", "c"]
LINKABLE = ["b/1", "b/2", "c", "a/1"]
MEMBERS = ["m1", "m2", "m3", "m4"]
TIMEOUT = 5_000
SPEC = GroupSpec(pattern="a/*", streams=("c",), session_timeout_ms=TIMEOUT, max_members=3, max_streams=6)


def new_state() -> StreamState:
    return StreamState([GroupsState()])


def skipped_to(records: list) -> dict[int, int]:
    """Where the skips among ``records`` move cursors (stream uid -> retained offset)."""
    return {s.stream_uid: s.end for r in records if isinstance(r, GroupCursorsSkipped) for s in r.skips}


def cursors_after(before: dict[int, int], records: list) -> dict[int, int]:
    """The cursors ``records`` leave without a commit: a plan drops gone streams' cursors and starts new
    streams where they start (above 0 for a stream created again at a path), a skip moves one forward."""
    cursors = dict(before)
    for r in records:
        if isinstance(r, GroupPlanned):
            for uid in r.dropped_cursors:
                cursors.pop(uid, None)
            for uid, offset in r.starts:
                cursors.setdefault(uid, offset)
        elif isinstance(r, GroupCursorsSkipped):
            cursors.update((s.stream_uid, s.end) for s in r.skips)
    return cursors


@dataclass
class Creds:
    """What one client instance knows: its identity and its last view."""

    member: str
    join_id: str
    incarnation: int
    generation: int
    view: dict


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = new_state()
        self.now = 1_000_000
        self.journal: list[tuple[bytes, tuple[int, int] | None]] = []
        self.snapshot: tuple[bytes, int] | None = None
        self.next_loc = 0
        self.join_seq = 0
        self.clients: dict[str, Creds] = {}
        self.stale_creds: list[Creds] = []  # superseded or from a retired incarnation
        self.retired_joins: list[tuple[str, str, int]] = []  # (member, join id, incarnation)
        self.old_fences: list[
            tuple[str, int, int, str, int]
        ] = []  # (member, incarnation, generation, stream, fence)
        self.cursor_floor: dict[tuple[int, int], int] = {}  # (incarnation, uid) -> highest cursor seen
        self.fence_floor: dict[tuple[int, int], int] = {}
        self.released_now: set[tuple[str, int]] = set()
        self.skipped_total = 0

    # ------------------------------------------------------------------ plumbing

    @property
    def groups(self) -> GroupsState:
        ext = self.state.extensions["groups"]
        assert isinstance(ext, GroupsState)
        return ext

    def commit(self, records: list) -> None:
        """Journal (encode, decode) and apply, checking each plan transition."""
        for r in records:
            body = encode_record(r)
            r = decode_record(body)
            loc = None
            if getattr(r, "data", b""):
                loc = (1, self.next_loc)
                self.next_loc += len(r.data) + 1
            before = self._plan_view(r.name) if isinstance(r, GroupPlanned) else None
            if isinstance(r, GroupCursorsSkipped):
                self._check_skip(r)
            self.state.apply(r, loc)
            self.journal.append((body, loc))
            if isinstance(r, GroupPlanned):
                self._check_transition(r, before)
                event(f"plan by {r.op.split(':')[0] if not r.op.startswith('op-') else 'link'}")
                if any(
                    t.holder is not None and t.owner is not None and t.holder != t.owner for t in r.targets
                ):
                    event("a move is draining")
            elif isinstance(r, GroupCommitted):
                event("cursor committed")
        self.released_now = set()

    def _check_skip(self, r: GroupCursorsSkipped) -> None:
        """A skip names exactly the range from the cursor to the retained offset, and moves the cursor there."""
        g = self.groups.groups[r.name]
        assert r.incarnation == g.incarnation and r.skips
        for skip in r.skips:
            s = self.state.streams[skip.stream_uid]
            assert skip.stream_uid in g.targets and skip.path == g.targets[skip.stream_uid].path
            assert g.cursors.get(skip.stream_uid, 0) == skip.start < skip.end == s.retained_from
            self.skipped_total += skip.end - skip.start
        event("retention passed a cursor")

    def _plan_view(self, name: str):
        g = self.groups.groups.get(name)
        if g is None:
            return None
        return (
            g.incarnation,
            g.revision,
            {m.member: m.generation for m in g.members.values()},
            {
                uid: (t.linked, t.owner, t.holder, t.holder_generation, t.fence)
                for uid, t in g.targets.items()
            },
        )

    def _check_transition(self, r: GroupPlanned, before) -> None:
        g = self.groups.groups[r.name]
        assert before is not None
        inc, rev, members_before, targets_before = before
        # Compare-and-set: each plan moves the revision by exactly one.
        assert inc == r.incarnation and r.expected_revision == rev and g.revision == rev + 1 == r.revision
        members = {m.member: m.generation for m in g.members.values()}
        for uid, t in g.targets.items():
            prev = targets_before.get(uid)
            if prev is None or prev[2] is None:
                continue
            _, _, holder, holder_gen, fence = prev
            if (t.holder, t.holder_generation, t.fence) != (holder, holder_gen, fence):
                # The previous holder let go: released, left, expired or was fenced.
                assert (holder, uid) in self.released_now or members.get(holder) != holder_gen, (uid, prev, t)
        for uid, prev in targets_before.items():
            if uid not in g.targets and prev[2] is not None:
                s = live_stream(self.state, uid, self.now)
                assert s is None or (prev[2], uid) in self.released_now or members.get(prev[2]) != prev[3]
        # Minimal moves: only the excess over a balanced quota moves.
        linked = [uid for uid, t in g.targets.items() if t.linked]
        if members and linked:
            prev_owner = {uid: targets_before[uid][1] for uid in linked if uid in targets_before}
            kept = Counter(o for o in prev_owner.values() if o in members)
            moves = sum(1 for uid, o in prev_owner.items() if o in members and g.targets[uid].owner != o)
            base, extra = divmod(len(linked), len(members))
            quotas = [base + 1] * extra + [base] * (len(members) - extra)
            counts = sorted((kept[m] for m in members), reverse=True)
            assert moves == sum(max(0, c - q) for c, q in zip(counts, quotas, strict=True)), (
                moves,
                counts,
                quotas,
            )

    def decide(self, fn, *args, **kwargs):
        """Run a decide; a refusal must leave the state exactly as it was."""
        digest = self.groups.digest()
        try:
            return fn(*args, **kwargs)
        except TieredError:
            assert self.groups.digest() == digest
            raise

    def expect_refusal(self, code: str, fn, *args, **kwargs) -> TieredError:
        digest = self.groups.digest()
        with pytest.raises(TieredError) as info:
            fn(*args, **kwargs)
        assert info.value.code == code, info.value
        assert self.groups.digest() == digest
        return info.value

    def group(self):
        return self.groups.groups.get(G)

    def stream_tail(self, path: str) -> int | None:
        s = self.state.find(B, path)
        if s is None or live_stream(self.state, s.uid, self.now) is None:
            return None
        return s.tail

    def refresh(self, member: str) -> None:
        c = self.clients.get(member)
        g = self.group()
        if c is None or g is None or member not in g.members or g.members[member].generation != c.generation:
            return
        c.view = views.member_view(self.groups, G, member)

    def retire_client(self, member: str) -> None:
        c = self.clients.pop(member, None)
        if c is not None:
            self.stale_creds.append(c)
            self.retired_joins.append((member, c.join_id, c.incarnation))

    def forget_departed(self) -> None:
        """Clients whose instance the server no longer knows (expired, left) become stale."""
        g = self.group()
        for member in list(self.clients):
            c = self.clients[member]
            m = g.members.get(member) if g is not None else None
            if g is None or g.incarnation != c.incarnation or m is None or m.generation != c.generation:
                self.retire_client(member)
            else:
                self.refresh(member)

    # ------------------------------------------------------------------ streams

    @initialize(
        paths=st.lists(st.sampled_from(PATHS), min_size=2, max_size=5, unique=True),
        members=st.lists(st.sampled_from(MEMBERS), max_size=3, unique=True),
    )
    def setup(self, paths: list[str], members: list[str]) -> None:
        for path in paths:
            self.create_stream(path, b"hello")
        self.create_group()
        for member in members:
            self.join(member)

    @rule(path=st.sampled_from(PATHS), data=st.binary(min_size=0, max_size=5))
    def create_stream(self, path: str, data: bytes) -> None:
        req = CreateRequest(
            content_type="text/plain",
            ttl_s=None,
            expires_at=None,
            expires_at_ms=None,
            closed=False,
            data=data,
        )
        records, _ = self.state.decide_create(B, path, req, self.now)
        self.commit(records)

    @rule(path=st.sampled_from(PATHS), n=st.integers(1, 9))
    def append(self, path: str, n: int) -> None:
        try:
            record = self.state.decide_append(B, path, AppendRequest("text/plain", b"x" * n, False), self.now)
        except StreamError:
            return
        self.commit([record])

    @rule(path=st.sampled_from(PATHS))
    def delete_stream(self, path: str) -> None:
        try:
            record = self.state.decide_delete(B, path, self.now)
        except StreamError:
            return
        self.commit([record])

    # ------------------------------------------------------------------ group lifecycle

    @rule()
    def create_group(self) -> None:
        if self.group() is not None:
            assert self.decide(self.groups.decide_create, G, SPEC, self.state, self.now) == []
            return
        try:
            records = self.decide(self.groups.decide_create, G, SPEC, self.state, self.now)
        except TieredError as exc:
            assert exc.code == "TOO_MANY_STREAMS"
            return
        self.commit(records)
        g = self.group()
        assert g is not None and g.revision == 0 and not g.members
        # Every stream selected at creation is the group's from its retained offset on.
        selected, _ = self.groups.select(g, self.state, self.now)
        assert g.cursors == {uid: self.state.streams[uid].retained_from for uid, _ in selected}

    @precondition(lambda self: self.group() is not None)
    @rule(use_revision=st.booleans(), go=st.integers(0, 3))
    def delete_group(self, use_revision: bool, go: int) -> None:
        if go:
            return  # rarely: a deletion resets everything
        g = self.group()
        records = self.decide(
            self.groups.decide_delete,
            G,
            self.now,
            incarnation=g.incarnation,
            expected_revision=g.revision if use_revision else None,
        )
        self.commit(records)
        assert self.group() is None
        # A retried delete of the same incarnation is fine and changes nothing.
        assert self.groups.decide_delete(G, self.now, incarnation=g.incarnation) == []
        self.forget_departed()

    @precondition(lambda self: self.group() is not None)
    @rule()
    def stale_admin_revision(self) -> None:
        g = self.group()
        self.expect_refusal(
            "STALE_REVISION", self.groups.decide_delete, G, self.now, expected_revision=g.revision + 1
        )
        self.expect_refusal(
            "STALE_REVISION",
            self.groups.decide_link,
            G,
            ["b/1"],
            self.state,
            self.now,
            expected_revision=g.revision + 7,
        )

    @precondition(lambda self: self.group() is not None)
    @rule(path=st.sampled_from(LINKABLE), unlink=st.booleans())
    def link(self, path: str, unlink: bool) -> None:
        g = self.group()
        rev = g.revision
        op = f"op-{len(self.journal)}"
        try:
            records = self.decide(
                self.groups.decide_link,
                G,
                [path],
                self.state,
                self.now,
                unlink=unlink,
                op_id=op,
                expected_revision=rev,
            )
        except TieredError as exc:
            assert exc.code == "TOO_MANY_STREAMS" and not unlink
            return
        self.commit(records)
        assert (path in self.group().explicit) != unlink
        if records:
            # A retry with the same operation id is recognised, even though the revision moved.
            assert (
                self.groups.decide_link(
                    G, [path], self.state, self.now, unlink=unlink, op_id=op, expected_revision=rev
                )
                == []
            )
        self.forget_departed()

    @rule(path=st.sampled_from(PATHS), fraction=st.sampled_from([0.3, 0.7, 1.0]), follow=st.booleans())
    def retain(self, path: str, fraction: float, follow: bool) -> None:
        """Retention advances; the server moves passed cursors at once (``follow``) or at the next sweep."""
        s = self.state.find(B, path)
        if s is None or live_stream(self.state, s.uid, self.now) is None:
            return
        offset = s.retained_from + int((s.tail - s.retained_from) * fraction)
        records = self.state.decide_retain(B, path, offset, self.now)
        self.commit(records)
        if follow:
            self.commit(self.groups.decide_skips(self.state, self.now))
            assert self.groups.decide_skips(self.state, self.now) == []

    @precondition(lambda self: self.group() is not None)
    @rule()
    def sweep(self) -> None:
        records = self.groups.decide_sweep(self.state, self.now)
        assert sum(isinstance(r, GroupPlanned) for r in records) <= 1
        assert sum(isinstance(r, GroupCursorsSkipped) for r in records) <= 1
        self.commit(records)
        self.forget_departed()
        assert self.groups.decide_sweep(self.state, self.now) == []  # a plan is a fixed point
        # After a sweep no stream of the group is left behind its retained offset.
        g = self.group()
        for uid in g.targets:
            s = live_stream(self.state, uid, self.now)
            if s is not None:
                assert g.cursors.get(uid, 0) >= s.retained_from

    @rule(ms=st.sampled_from([100, 1_000, 2_600, 6_000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    # ------------------------------------------------------------------ members

    @precondition(lambda self: self.group() is not None)
    @rule(member=st.sampled_from(MEMBERS))
    def join(self, member: str) -> None:
        self.join_seq += 1
        join_id = f"{member}-j{self.join_seq}"
        g = self.group()
        try:
            records = self.decide(self.groups.decide_join, G, member, join_id, self.state, self.now)
        except TieredError as exc:
            assert exc.code == "TOO_MANY_MEMBERS"
            alive = [m for m in g.members.values() if m.last_seen_ms + TIMEOUT > self.now]
            assert member not in g.members and len(alive) >= SPEC.max_members
            return
        old = self.clients.get(member)
        self.commit(records)
        g = self.group()
        m = g.members[member]
        assert m.join_id == join_id and m.generation == g.generation_seq
        if old is not None and old.incarnation == g.incarnation:
            assert m.generation > old.generation  # the new instance fences the old one
        if old is not None:
            self.retire_client(member)
        self.clients[member] = Creds(
            member, join_id, g.incarnation, m.generation, views.member_view(self.groups, G, member)
        )
        self.forget_departed()
        # Retrying the same join changes no membership.
        assert self.groups.decide_join(G, member, join_id, self.state, self.now) == []

    @precondition(
        lambda self: (
            self.group() is not None and any(j[2] == self.group().incarnation for j in self.retired_joins)
        )
    )
    @rule(data=st.data())
    def stale_join(self, data) -> None:
        """A delayed retry of a superseded or ended instance's join must not fence its successor."""
        inc = self.group().incarnation
        member, join_id, _ = data.draw(st.sampled_from([j for j in self.retired_joins if j[2] == inc]))
        self.expect_refusal("FENCED", self.groups.decide_join, G, member, join_id, self.state, self.now)

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), fraction=st.sampled_from([0.0, 0.5, 1.0]), release=st.booleans())
    def heartbeat(self, data, fraction: float, release: bool) -> None:
        member = data.draw(st.sampled_from(sorted(self.clients)))
        c = self.clients[member]
        g = self.group()
        if g is None or g.incarnation != c.incarnation:
            self.expect_refusal(
                "FENCED" if g is not None else "GROUP_NOT_FOUND",
                self.groups.decide_heartbeat,
                G,
                c.incarnation,
                member,
                c.generation,
                [],
                [],
                self.state,
                self.now,
            )
            self.retire_client(member)
            return
        commits, releases, expected = [], [], {}
        for a in c.view["assignments"]:
            tail = self.stream_tail(a["stream"])
            if tail is None:
                continue
            if a["cursor"] == "-1":  # nothing committed yet: the stream's start (above 0 once re-created)
                start = self.state.find(B, a["stream"])
                assert start is not None
                cursor = start.retained_from
            else:
                cursor = parse_offset(a["cursor"])
            target = cursor + int((tail - cursor) * fraction) if tail >= cursor else cursor
            commits.append(CommitRequest(a["stream"], a["fence"], target))
            expected[a["stream"]] = target
            if release and a["revoked"]:
                releases.append(ReleaseRequest(a["stream"], a["fence"]))
                t = g.targets_by_path().get(a["stream"])
                if t is not None:
                    self.released_now.add((member, t.stream_uid))
        try:
            records, rejected = self.decide(
                self.groups.decide_heartbeat,
                G,
                c.incarnation,
                member,
                c.generation,
                commits,
                releases,
                self.state,
                self.now,
            )
        except TieredError as exc:
            assert exc.code in ("NOT_MEMBER", "FENCED")
            self.retire_client(member)
            return
        self.groups.touch(G, c.incarnation, member, c.generation, self.now)
        for r in rejected:
            assert r.code in ("FENCED", "STREAM_GONE"), r
        assert sum(isinstance(r, GroupPlanned) for r in records) <= 1
        self.commit(records)
        g = self.group()
        for path, offset in expected.items():
            if any(r.stream == path for r in rejected):
                continue
            t = g.targets_by_path().get(path)
            if t is not None:
                assert g.cursors.get(t.stream_uid, 0) >= offset
        self.refresh(member)
        self.forget_departed()
        # The same heartbeat again is harmless: commits do not regress, releases are no-ops.
        digest = self.groups.digest()
        records2, _ = (
            self.groups.decide_heartbeat(
                G, c.incarnation, member, c.generation, commits, releases, self.state, self.now
            )
            if member in self.clients
            else ([], [])
        )
        assert not any(isinstance(r, GroupCommitted) for r in records2)
        if not records2:
            assert self.groups.digest() == digest

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def heartbeat_and_release(self, data) -> None:
        self.heartbeat(data, 1.0, True)

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), n=st.integers(1, 9))
    def append_to_assigned(self, data, n: int) -> None:
        """Grow a stream somebody holds, so commits have somewhere to go."""
        held = sorted({a["stream"] for c in self.clients.values() for a in c.view["assignments"]})
        if held:
            self.append(data.draw(st.sampled_from(held)), n)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def commit_beyond_tail(self, data) -> None:
        member = data.draw(st.sampled_from(sorted(self.clients)))
        c = self.clients[member]
        live = [a for a in c.view["assignments"] if self.stream_tail(a["stream"]) is not None]
        g = self.group()
        if not live or g is None or g.incarnation != c.incarnation:
            return
        a = live[0]
        tail = self.stream_tail(a["stream"])
        t = g.targets_by_path()[a["stream"]]
        before = g.cursors.get(t.stream_uid, 0)
        try:
            records, rejected = self.groups.decide_heartbeat(
                G,
                c.incarnation,
                member,
                c.generation,
                [CommitRequest(a["stream"], a["fence"], tail + 1)],
                [],
                self.state,
                self.now,
            )
        except TieredError:
            return
        # The path may now name a newer stream than the one the group tracks: that one is gone.
        tracked_gone = live_stream(self.state, t.stream_uid, self.now) is None
        expected = (["OFFSET_BEYOND_TAIL"], ["FENCED"]) + ((["STREAM_GONE"],) if tracked_gone else ())
        assert [r.code for r in rejected] in expected
        assert not any(isinstance(r, GroupCommitted) for r in records)
        self.commit(records)
        # Unchanged, unless retention had passed it (then moved to the retained offset, as a skip) or the
        # stream is gone (then the plan dropped its cursor).
        expected = cursors_after({t.stream_uid: before}, records).get(t.stream_uid, 0)
        assert self.group().cursors.get(t.stream_uid, 0) == expected
        self.forget_departed()

    @precondition(lambda self: self.old_fences)
    @rule(data=st.data())
    def stale_fence_commit(self, data) -> None:
        member, inc, gen, stream, fence = data.draw(st.sampled_from(self.old_fences))
        g = self.group()
        if g is None or g.incarnation != inc:
            return
        t = g.targets_by_path().get(stream)
        if t is not None and t.holder == member and t.holder_generation == gen and t.fence == fence:
            return  # not stale after all
        before = dict(g.cursors)
        try:
            records, rejected = self.groups.decide_heartbeat(
                G,
                inc,
                member,
                gen,
                [CommitRequest(stream, fence, 0)],
                [ReleaseRequest(stream, fence)],
                self.state,
                self.now,
            )
        except TieredError as exc:
            assert exc.code in ("FENCED", "NOT_MEMBER")
            return
        assert [r.code for r in rejected] == ["FENCED"]
        assert not any(isinstance(r, GroupCommitted) for r in records)
        self.commit(records)
        assert self.group().cursors == cursors_after(before, records)

    @precondition(lambda self: self.stale_creds)
    @rule(data=st.data())
    def zombie_heartbeat(self, data) -> None:
        c = data.draw(st.sampled_from(self.stale_creds))
        g = self.group()
        commits = [CommitRequest(a["stream"], a["fence"], 0) for a in c.view["assignments"]]
        digest = self.groups.digest()
        if g is None:
            self.expect_refusal(
                "GROUP_NOT_FOUND",
                self.groups.decide_heartbeat,
                G,
                c.incarnation,
                c.member,
                c.generation,
                commits,
                [],
                self.state,
                self.now,
            )
            return
        m = g.members.get(c.member)
        if g.incarnation != c.incarnation:
            e = self.expect_refusal(
                "FENCED",
                self.groups.decide_heartbeat,
                G,
                c.incarnation,
                c.member,
                c.generation,
                commits,
                [],
                self.state,
                self.now,
            )
            assert e.context["reason"] == "incarnation"
        elif m is None:
            self.expect_refusal(
                "NOT_MEMBER",
                self.groups.decide_heartbeat,
                G,
                c.incarnation,
                c.member,
                c.generation,
                commits,
                [],
                self.state,
                self.now,
            )
        elif m.generation != c.generation:
            e = self.expect_refusal(
                "FENCED",
                self.groups.decide_heartbeat,
                G,
                c.incarnation,
                c.member,
                c.generation,
                commits,
                [],
                self.state,
                self.now,
            )
            assert e.context["reason"] == "generation"
            self.expect_refusal(
                "FENCED",
                self.groups.decide_leave,
                G,
                c.incarnation,
                c.member,
                c.generation,
                commits,
                self.state,
                self.now,
            )
        assert self.groups.digest() == digest

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def leave(self, data) -> None:
        member = data.draw(st.sampled_from(sorted(self.clients)))
        c = self.clients[member]
        g = self.group()
        if g is None or g.incarnation != c.incarnation:
            self.retire_client(member)
            return
        try:
            records, rejected, was = self.decide(
                self.groups.decide_leave, G, c.incarnation, member, c.generation, [], self.state, self.now
            )
        except TieredError as exc:
            assert exc.code == "FENCED"
            self.retire_client(member)
            return
        self.commit(records)
        assert member not in self.group().members
        assert was and any(isinstance(r, GroupPlanned) for r in records)
        # Leaving again is fine.
        assert (
            self.groups.decide_leave(G, c.incarnation, member, c.generation, [], self.state, self.now)[2]
            is False
        )
        self.retire_client(member)
        self.forget_departed()

    # ------------------------------------------------------------------ the journal

    @precondition(lambda self: self.journal)
    @rule(data=st.data())
    def replay_stale_record(self, data) -> None:
        """Applying an old group record again (a duplicate, a stale retry) changes nothing."""
        group_bodies = [(i, b) for i, (b, _) in enumerate(self.journal)]
        i, body = data.draw(st.sampled_from(group_bodies))
        record = decode_record(body)
        if not isinstance(
            record, GroupCreated | GroupPlanned | GroupCommitted | GroupCursorsSkipped | GroupDeleted
        ):
            return
        digest = self.groups.digest()
        self.groups.apply(record)
        assert self.groups.digest() == digest, record

    @rule()
    def take_snapshot(self) -> None:
        self.snapshot = (encode_snapshot(self.state, LogPosition(0, len(self.journal))), len(self.journal))

    @rule()
    def crash_and_recover(self) -> None:
        if self.snapshot is not None:
            state, pos = decode_snapshot(self.snapshot[0], new_state)
            start = pos.offset
        else:
            state, start = new_state(), 0
        for body, loc in self.journal[start:]:
            state.apply(decode_record(body), loc)
        recovered = state.extensions["groups"]
        assert isinstance(recovered, GroupsState)
        assert recovered.digest() == self.groups.digest()
        event("recovered with a snapshot" if self.snapshot is not None else "recovered from the journal")
        assert {u: s.tail for u, s in state.streams.items()} == {
            u: s.tail for u, s in self.state.streams.items()
        }
        recovered.grant_grace(self.now)
        self.state = state
        for member in list(self.clients):
            self.refresh(member)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def one_holder_per_stream_and_balance(self) -> None:
        for g in self.groups.groups.values():
            members = {m.member: m.generation for m in g.members.values()}
            paths = Counter(t.path for t in g.targets.values())
            assert all(n == 1 for n in paths.values())
            owners: Counter[str] = Counter()
            holders: Counter[str] = Counter()
            settled = True
            for t in g.targets.values():
                if t.holder is not None:
                    # Every holder is a live member instance (never a fenced one).
                    assert members.get(t.holder) == t.holder_generation, t
                if not t.linked:
                    assert t.owner is None and t.holder is not None  # only a drain keeps an unlinked stream
                    continue
                if members:
                    assert t.owner in members
                    # Never an owner waiting while nobody holds the stream.
                    assert t.holder is not None
                else:
                    assert t.owner is None and t.holder is None
                owners[t.owner] += 1
                holders[t.holder] += 1
                settled = settled and t.holder == t.owner
            if members:
                counts = [owners[m] for m in members]
                assert max(counts) - min(counts) <= 1, counts
                if settled:
                    counts = [holders[m] for m in members]
                    assert max(counts) - min(counts) <= 1, counts

    @invariant()
    def skipped_ranges_are_shown_until_a_commit(self) -> None:
        """A pending skip ends where the cursor is; members holding the stream are shown it."""
        for g in self.groups.groups.values():
            for uid, (start, end) in g.skipped.items():
                assert start < end == g.cursors[uid], (uid, start, end, g.cursors.get(uid))

    @invariant()
    def member_views_agree(self) -> None:
        """What members are told: each stream active for at most one member, with its pending skip."""
        g = self.group()
        if g is None:
            return
        active: Counter[str] = Counter()
        by_path = g.targets_by_path()
        for member in g.members:
            for a in views.member_view(self.groups, G, member)["assignments"]:
                gap = g.skipped.get(by_path[a["stream"]].stream_uid)
                assert a.get("skipped") == (
                    None
                    if gap is None
                    else {
                        "from": format_offset(gap[0]),
                        "to": format_offset(gap[1]),
                        "bytes": gap[1] - gap[0],
                    }
                )
                active[a["stream"]] += 1
                self.old_fences.append(
                    (member, g.incarnation, g.members[member].generation, a["stream"], a["fence"])
                )
        assert all(n == 1 for n in active.values()), active
        del self.old_fences[:-40]

    @invariant()
    def cursors_and_fences_monotonic(self) -> None:
        for g in self.groups.groups.values():
            for uid, cursor in g.cursors.items():
                key = (g.incarnation, uid)
                assert cursor >= self.cursor_floor.get(key, 0)
                self.cursor_floor[key] = cursor
                s = self.state.streams.get(uid)
                if s is not None:
                    assert cursor <= s.tail
            for uid, t in g.targets.items():
                if t.holder is None:
                    continue  # a fence only means something while someone holds the stream
                key = (g.incarnation, uid)
                # Every activation gets a fence above all earlier ones for this stream.
                assert t.fence >= self.fence_floor.get(key, 0)
                self.fence_floor[key] = t.fence
                assert 0 < t.fence <= g.revision


GroupMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_group_coordinator = GroupMachine.TestCase


# --------------------------------------------------------------------------- unit checks


@pytest.mark.parametrize(
    ("pattern", "path", "ok"),
    [
        ("a/*", "a/1", True),
        ("a/*", "a/1/2", False),
        ("a/*", "a", False),
        ("a/**", "a", True),
        ("a/**", "a/1/2", True),
        ("**", "x/y", True),
        ("**/z", "z", True),
        ("**/z", "x/y/z", True),
        ("**/z", "x/y/zz", False),
        ("a/*/c", "a/b/c", True),
        ("a/*/c", "a/c", False),
        ("ev*/x", "events/x", True),
        ("a/**/c/*", "a/b/b/c/d", True),
        ("a/**/c/*", "a/b/b/c", False),
        ("a.b/*", "aXb/1", False),
    ],
)
def test_glob(pattern: str, path: str, ok: bool) -> None:
    assert glob_match(pattern, path) is ok


def test_assign_is_balanced_sticky_and_minimal() -> None:
    members = ["a", "b", "c"]
    uids = list(range(10))
    first = assign(members, uids, {}, {})
    assert sorted(Counter(first.values()).values()) == [3, 3, 4]
    # A fourth member takes exactly the excess; nobody else's streams move.
    second = assign(members + ["d"], uids, first, {})
    moved = [u for u in uids if second[u] != first[u]]
    assert len(moved) == 2 and all(second[u] == "d" for u in moved)
    # Removing a member moves only its streams.
    third = assign(["a", "b", "d"], uids, second, {})
    assert all(third[u] == second[u] for u in uids if second[u] != "c")


def test_heartbeat_flow_with_drain() -> None:
    """A move is intent first; the new owner is activated (higher fence) only after the release."""
    state = new_state()
    groups = state.extensions["groups"]
    assert isinstance(groups, GroupsState)
    now = 10_000

    def commit(records) -> None:
        for r in records:
            state.apply(r, (1, 1) if getattr(r, "data", b"") else None)

    for p in ("a/1", "a/2"):
        commit(
            state.decide_create(B, p, CreateRequest("text/plain", None, None, None, False, b"12345"), now)[0]
        )
    commit(groups.decide_create(G, GroupSpec(pattern="a/*"), state, now))
    commit(groups.decide_join(G, "m1", "j1", state, now))
    v1 = views.member_view(groups, G, "m1")
    assert [(a["stream"], a["fence"], a["revoked"]) for a in v1["assignments"]] == [
        ("a/1", 1, False),
        ("a/2", 1, False),
    ]
    commit(groups.decide_join(G, "m2", "j2", state, now))
    v1 = views.member_view(groups, G, "m1")
    v2 = views.member_view(groups, G, "m2")
    assert [(a["stream"], a["revoked"]) for a in v1["assignments"]] == [("a/1", False), ("a/2", True)]
    assert v2["assignments"] == [] and v2["pending"] == ["a/2"]
    # m1 commits its last position of a/2 and releases it in the same heartbeat.
    records, rejected = groups.decide_heartbeat(
        G, 1, "m1", 1, [CommitRequest("a/2", 1, 3)], [ReleaseRequest("a/2", 1)], state, now
    )
    assert rejected == [] and [type(r) for r in records] == [GroupCommitted, GroupPlanned]
    commit(records)
    v2 = views.member_view(groups, G, "m2")
    assert v2["assignments"] == [
        {"stream": "a/2", "fence": 3, "cursor": "0000000000000000_0000000000000003", "revoked": False}
    ]
    # m1's old fence no longer commits.
    _, rejected = groups.decide_heartbeat(G, 1, "m1", 1, [CommitRequest("a/2", 1, 5)], [], state, now)
    assert [r.code for r in rejected] == ["FENCED"]
