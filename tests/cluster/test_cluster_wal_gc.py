"""Releasing WAL objects through the chain, deleting them after a grace delay, pruning the chain. Pure.

The planning functions of ``tiered/cluster/shards/wal_lifecycle.py`` alone, then a
hypothesis state machine that runs owners of successive epochs over a model
store and chain (ships, deletions of files, fenced ships that leave orphans,
checkpoints, deletes after grace, pruning, takeovers that forget everything
but the store, zombies re-creating their landed entries) and checks after
every step that a restore from the chain rebuilds every file byte-exact from
objects that still exist.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tiered.cluster.membership.manifest import EntryKind, ManifestEntry
from tiered.cluster.shards.wal_index import (
    Checkpoint,
    Piece,
    WalCommit,
    WalIndex,
    decode_payload,
    encode_payload,
    wal_key,
)
from tiered.cluster.shards.wal_lifecycle import (
    adopt_releases,
    check_pruned_chain,
    due_deletions,
    plan_prune,
    plan_releases,
    prunable,
)
from tiered.core.errors import TieredError

SHARD = 3
GRACE_MS = 5_000


def k(epoch: int, n: int) -> str:
    return wal_key(SHARD, epoch, n, "t0k3n000")


def test_only_unreferenced_objects_of_this_epoch_or_older_are_released() -> None:
    index = WalIndex()
    index.apply(WalCommit([Piece("hot/1", 0, 3, k(2, 1), 0), Piece("hot/2", 0, 0, k(2, 2), 0)]))
    listed = [k(1, 1), k(2, 1), k(2, 2), k(3, 1), "_tiered/cluster/wal/0003/junk"]
    released = plan_releases(index, listed, 2, {}, 100, limit=10)
    # k(2, 2) holds only an empty piece (a cut): no live byte is in it.
    assert released == {k(1, 1): 100, k(2, 2): 100}
    # Pending releases are carried (with their time), new ones are bounded per checkpoint.
    again = plan_releases(index, listed, 2, {k(1, 1): 50}, 200, limit=1)
    assert again == {k(1, 1): 50, k(2, 2): 200}
    assert plan_releases(index, listed, 2, {k(1, 1): 50}, 200, limit=0) == {k(1, 1): 50}


def test_deletions_wait_for_the_grace_and_are_bounded() -> None:
    pending = {"a": 1_000, "b": 3_000, "c": 2_000}
    assert due_deletions(pending, 5_999, GRACE_MS, 10) == []
    assert due_deletions(pending, 6_000, GRACE_MS, 10) == ["a"]
    assert due_deletions(pending, 8_000, GRACE_MS, 10) == ["a", "c", "b"]
    assert due_deletions(pending, 8_000, GRACE_MS, 2) == ["a", "c"]
    # A new owner counts the grace from when it read the releases, on its own clock.
    assert adopt_releases({"a": 10**15, "b": 0}, 7) == {"a": 7, "b": 7}


def entry(seq: int, epoch: int, kind: EntryKind = EntryKind.COMMIT, writer: str = "") -> ManifestEntry:
    return ManifestEntry(SHARD, seq, epoch, kind, writer or f"n{epoch}", 1, f"{seq}-{epoch}")


def test_pruning_keeps_fences_and_everything_from_the_checkpoint_on() -> None:
    assert plan_prune([1, 2, 3, 4, 5, 6], 5, {1}, 10) == [2, 3, 4]
    assert plan_prune([1, 2, 3, 4, 5, 6], 5, set(), 2) == [1, 2]
    assert prunable(entry(2, 1), 5) and not prunable(entry(1, 1, EntryKind.FENCE), 5)
    assert not prunable(entry(5, 1), 5)


def test_a_pruned_chain_is_checked_from_its_tail() -> None:
    full = [
        entry(1, 1, EntryKind.FENCE),
        entry(2, 1),
        entry(3, 2, EntryKind.FENCE),
        entry(4, 2),
        entry(5, 2),
        entry(6, 2),
    ]
    summary = check_pruned_chain([full[0], full[2], full[4], full[5]])
    assert (summary.latest_seq, summary.latest_epoch, summary.fences) == (6, 2, {1: 1, 2: 3})
    assert check_pruned_chain([full[0], full[1], full[4], full[5]]).fences == {1: 1}  # a stray kept
    with pytest.raises(TieredError):
        check_pruned_chain([entry(3, 3, EntryKind.FENCE), full[4], full[5]])  # epoch falls
    with pytest.raises(TieredError):
        check_pruned_chain([full[0], entry(3, 1, EntryKind.FENCE), full[4], full[5]])  # two fences of 1
    with pytest.raises(TieredError):
        check_pruned_chain([full[0], full[2], full[4], entry(6, 2, EntryKind.FENCE)])  # tail broken


class Owner:
    """One owner's view: what a shipper keeps in memory (all lost on a takeover)."""

    def __init__(self, epoch: int, index: WalIndex, released: dict[str, int], checkpoint_seq: int | None):
        self.epoch = epoch
        self.index = index
        self.released = released
        self.checkpoint_seq = checkpoint_seq
        self.kept: set[int] = set()
        self.number = 0


class WalGcMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.objects: dict[str, bytes] = {}  # the WAL objects in the store
        self.chain: dict[int, ManifestEntry] = {}  # the chain in the store
        self.history: dict[int, ManifestEntry] = {}  # every entry ever landed
        self.truth: dict[str, bytearray] = {}
        self.owner = Owner(1, WalIndex(), {}, None)
        self._land(EntryKind.FENCE, b"")

    # -- the owner's steps ---------------------------------------------------------------

    def _land(self, kind: EntryKind, payload: bytes) -> int:
        seq = max(self.history, default=0) + 1
        e = ManifestEntry(SHARD, seq, self.owner.epoch, kind, f"n{self.owner.epoch}", 1, f"x{seq}", payload)
        self.chain[seq] = self.history[seq] = e
        return seq

    def _new_key(self) -> str:
        self.owner.number += 1
        return k(self.owner.epoch, self.owner.number)

    @rule(
        file=st.sampled_from(["hot/1", "hot/2", "snapshots/s"]),
        cut=st.integers(0, 30),
        data=st.binary(max_size=8),
    )
    def ship(self, file: str, cut: int, data: bytes) -> None:
        truth = self.truth.setdefault(file, bytearray())
        at = min(cut, len(truth))
        del truth[at:]
        truth.extend(data)
        key = self._new_key()
        self.objects[key] = b"pad" + data
        commit = WalCommit([Piece(file, at, len(data), key, 3)])
        self._land(EntryKind.COMMIT, encode_payload(commit))
        self.owner.index.apply(commit)

    @rule(file=st.sampled_from(["hot/1", "hot/2", "snapshots/s"]))
    def delete_file(self, file: str) -> None:
        """The engine flushed a segment to cold objects and deleted it (or replaced a snapshot)."""
        if file in self.truth:
            del self.truth[file]
            commit = WalCommit([], [file])
            self._land(EntryKind.COMMIT, encode_payload(commit))
            self.owner.index.apply(commit)

    @rule()
    def fenced_ship(self) -> None:
        """A WAL object put whose commit never landed: referenced by nothing, ever."""
        self.objects[self._new_key()] = b"orphan"

    @rule(limit=st.integers(1, 3))
    def checkpoint(self, limit: int) -> None:
        o = self.owner
        released = plan_releases(o.index, list(self.objects), o.epoch, o.released, self.now, limit)
        o.checkpoint_seq = self._land(EntryKind.COMMIT, encode_payload(o.index.checkpoint(released)))
        o.released = released

    @rule(ms=st.integers(0, 4_000))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(limit=st.integers(1, 3))
    def delete_due(self, limit: int) -> None:
        for key in due_deletions(self.owner.released, self.now, GRACE_MS, limit):
            self.objects.pop(key, None)  # idempotent: it may be gone already
            del self.owner.released[key]

    @precondition(lambda self: self.owner.checkpoint_seq is not None)
    @rule(limit=st.integers(1, 4))
    def prune(self, limit: int) -> None:
        o = self.owner
        assert o.checkpoint_seq is not None
        for seq in plan_prune(list(self.chain), o.checkpoint_seq, o.kept, limit):
            if prunable(self.chain[seq], o.checkpoint_seq):
                del self.chain[seq]
            else:
                o.kept.add(seq)

    @rule()
    def take_over(self) -> None:
        """The owner dies (its memory, pending deletes included, is gone); the next epoch restores."""
        epoch = self.owner.epoch + 1
        self.owner = Owner(epoch, WalIndex(), {}, None)
        self._land(EntryKind.FENCE, b"")
        index, seq = self._restore()
        self.owner = Owner(epoch, index, adopt_releases(index.released, self.now), seq)

    @rule(data=st.data())
    def zombie_retries_a_landed_entry(self, data: st.DataObject) -> None:
        """An older writer's pending entry that had landed is written again (same bytes) after pruning."""
        pruned = sorted(set(self.history) - set(self.chain))
        if pruned:
            seq = data.draw(st.sampled_from(pruned))
            if self.history[seq].epoch < self.owner.epoch:
                self.chain[seq] = self.history[seq]

    # -- what must hold ------------------------------------------------------------------

    def _restore(self) -> tuple[WalIndex, int | None]:
        """What ``wal.restore`` does: back from the tail to the latest checkpoint, then forward."""
        tail: list[bytes] = []
        found: int | None = None
        for seq in sorted(self.chain, reverse=True):
            e = self.chain[seq]
            if e.kind is EntryKind.COMMIT and e.payload:
                tail.append(e.payload)
                if isinstance(decode_payload(e.payload, SHARD), Checkpoint):
                    found = seq
                    break
        index = WalIndex()
        for payload in reversed(tail):
            index.apply(decode_payload(payload, SHARD))
        return index, found

    @invariant()
    def a_restore_rebuilds_every_file_from_objects_that_exist(self) -> None:
        index, _ = self._restore()
        assert set(index.files) == set(self.truth)
        for name, pieces in index.files.items():
            buf = bytearray()
            for p in pieces:
                del buf[p.at :]
                if p.length:
                    assert p.wal in self.objects, f"{p.wal} is referenced but was deleted"
                    buf.extend(self.objects[p.wal][p.wal_at : p.wal_at + p.length])
            assert bytes(buf[: index.size(name)]) == bytes(self.truth[name])

    @invariant()
    def released_objects_are_never_referenced(self) -> None:
        assert not (self.owner.released.keys() & self.owner.index.referenced())

    @invariant()
    def the_chain_stays_valid_and_older_writers_find_a_fence(self) -> None:
        check_pruned_chain([self.chain[s] for s in sorted(self.chain)])
        latest = max(self.chain)
        assert latest == max(self.history), "the tail is never pruned"
        # Every older writer's next position (right after its last landed entry) is the next
        # epoch's fence, still in the store: its create-only write there fails, it stops.
        last_of: dict[int, int] = {}
        for seq, e in self.history.items():
            last_of[e.epoch] = max(last_of.get(e.epoch, 0), seq)
        for epoch, last in last_of.items():
            if epoch < self.owner.epoch:
                assert last + 1 in self.chain and self.chain[last + 1].kind is EntryKind.FENCE

    @rule()
    def settle(self) -> None:
        """Reconciliation: a checkpoint releases all garbage; after the grace nothing is left over."""
        self.checkpoint(limit=1000)
        self.now += GRACE_MS
        self.delete_due(limit=1000)
        assert set(self.objects) == self.owner.index.referenced()


TestWalGc = WalGcMachine.TestCase
TestWalGc.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
