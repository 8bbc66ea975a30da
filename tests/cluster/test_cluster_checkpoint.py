"""Checkpoint objects, the pure part: the plan copies exactly the live bytes, and layers stay few.

A model of a shard's files (appends, cuts, deletions) shipped as one WAL
object per ship, checkpointed whenever the backlog reaches a bound: after
every step the index reproduces every file byte-exact from the objects, the
backlog never exceeds the bound at a checkpoint, and a file is in
O(log n) checkpoint objects.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.cluster.shards.checkpoint import (
    MAX_LAYERS,
    RestoreBound,
    backlog,
    checkpoint_key,
    is_checkpoint_object,
    plan_checkpoint,
)
from tiered.cluster.shards.wal_index import Piece, WalCommit, WalIndex, wal_epoch, wal_key


def materialize(index: WalIndex, objects: dict[str, bytes]) -> dict[str, bytes]:
    out = {}
    for name, pieces in index.files.items():
        buf = bytearray()
        for p in pieces:
            del buf[p.at :]
            buf.extend(objects[p.wal][p.wal_at : p.wal_at + p.length])
        out[name] = bytes(buf[: index.size(name)])
    return out


class Model:
    """Local files, their shipped index and the store's objects, as the shipper keeps them."""

    def __init__(self, bound: RestoreBound) -> None:
        self.files: dict[str, bytearray] = {}
        self.shipped: dict[str, int] = {}
        self.index = WalIndex()
        self.objects: dict[str, bytes] = {}
        self.bound = bound
        self.number = 0
        self.copied = 0

    def ship(self) -> None:
        self.number += 1
        key = wal_key(0, 1, self.number, "t")
        pieces, data = [], b""
        for name, buf in sorted(self.files.items()):
            done = self.shipped.get(name)
            if done is None or len(buf) > done:
                start = done or 0
                pieces.append(Piece(name, start, len(buf) - start, key, len(data)))
                data += bytes(buf[start:])
            elif len(buf) < done:
                pieces.append(Piece(name, len(buf), 0, key, len(data)))
            self.shipped[name] = len(buf)
        deleted = sorted(n for n in self.shipped if n not in self.files)
        for name in deleted:
            del self.shipped[name]
        self.objects[key] = data
        self.index.apply(WalCommit(pieces, deleted))

    def checkpoint(self) -> None:
        self.number += 1
        plan = plan_checkpoint(self.index, checkpoint_key(0, 1, self.number, "t"))
        data = b"".join(bytes(self.files[c.file][c.at : c.at + c.length]) for c in plan.copies)
        assert [c.wal_at for c in plan.copies] == [
            sum(c.length for c in plan.copies[:i]) for i in range(len(plan.copies))
        ]
        self.objects[plan.key] = data
        self.copied += len(data)
        self.index.files = plan.files
        assert backlog(self.index).objects == 0, "every live byte is in checkpoint objects"

    def check(self) -> None:
        assert materialize(self.index, self.objects) == {n: bytes(b) for n, b in self.files.items()}


def test_keys_carry_their_epoch_and_tell_checkpoint_objects_apart() -> None:
    key = checkpoint_key(3, 7, 12, "abcd")
    assert wal_epoch(key) == 7 and is_checkpoint_object(key)
    assert not is_checkpoint_object(wal_key(3, 7, 12, "abcd"))


def test_one_object_replaces_many_and_the_backlog_counts_what_restores_read() -> None:
    m = Model(RestoreBound(4, 1 << 20))
    for i in range(10):
        m.files.setdefault("hot/1.seg", bytearray()).extend(b"x%d" % i)
        m.files.setdefault("snapshots/snapshot-1.bin", bytearray(b"snap"))
        m.ship()
    assert backlog(m.index).objects == 10 and backlog(m.index).reaches(m.bound)
    m.checkpoint()
    m.check()
    assert len(m.index.referenced()) == 1
    # The snapshot is now in a checkpoint object: a later checkpoint copies only the segment's tail.
    m.files["hot/1.seg"].extend(b"tail")
    m.ship()
    before = m.copied
    m.checkpoint()
    m.check()
    assert m.copied - before <= len(m.files["hot/1.seg"]), "the sealed snapshot is not copied again"


def test_a_file_that_is_gone_locally_is_left_as_it_is() -> None:
    m = Model(RestoreBound(2, 1 << 20))
    m.files["hot/1.seg"] = bytearray(b"abc")
    m.ship()
    plan = plan_checkpoint(m.index, checkpoint_key(0, 1, 9, "t"), skip=frozenset({"hot/1.seg"}))
    assert not plan.copies and plan.files == m.index.files


def test_a_growing_file_stays_in_few_layers_and_is_copied_a_logarithmic_number_of_times() -> None:
    m = Model(RestoreBound(1, 1 << 30))
    for _ in range(600):
        m.files.setdefault("hot/1.seg", bytearray()).extend(b"y" * 100)
        m.ship()
        m.checkpoint()
        layers = len(m.index.files["hot/1.seg"])
        assert layers <= math.log2(len(m.files["hot/1.seg"]) / 100) + 2
    m.check()
    total = len(m.files["hot/1.seg"])
    assert m.copied <= total * (math.log2(total / 100) + 2), (m.copied, total)
    assert max(len(p) for p in m.index.files.values()) <= MAX_LAYERS


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "cut", "delete", "ship", "checkpoint"]),
            st.integers(0, 2),
            st.binary(min_size=1, max_size=20),
        ),
        max_size=60,
    )
)
def test_the_index_reproduces_every_file_through_ships_and_checkpoints(
    ops: list[tuple[str, int, bytes]],
) -> None:
    m = Model(RestoreBound(3, 64))
    for op, n, data in ops:
        name = f"hot/{n}.seg"
        if op == "append":
            m.files.setdefault(name, bytearray()).extend(data)
        elif op == "cut" and name in m.files:
            # Recovery cuts a torn tail when an engine starts; the host ships before the engine takes a
            # write (WalShipper.ship_recovered), so a cut is never followed by appends in one ship.
            del m.files[name][len(m.files[name]) // 2 :]
            m.ship()
            m.check()
        elif op == "delete":
            m.files.pop(name, None)
        elif op == "ship":
            m.ship()
            m.check()
            if backlog(m.index).reaches(m.bound):
                m.checkpoint()
                m.check()
        elif op == "checkpoint":
            m.ship()
            m.checkpoint()
            m.check()
