"""The WAL GC in the shipper: released through a checkpoint, deleted after the grace, chain pruned.

Real ``ClusterNode`` shells on the in-memory CAS store with virtual clocks
(``cluster_sim``), a ``WalShipper`` over a shard directory whose segment
files the test writes and deletes as the engine would, and a local-directory
object store for the WAL objects. A second node takes the shard over from a
crashed first one and finishes its releases; the first, resumed as a zombie,
finds its next chain position fenced even though the chain was pruned.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.support.cluster_sim import NodeClock, World, chain, nonce_source
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import MemoryCasStore
from tiered.cluster.membership.lease import LeaseTiming
from tiered.cluster.membership.manifest import EntryKind
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.cluster.shards.wal import WalShipper, restore
from tiered.cluster.shards.wal_index import (
    Checkpoint,
    WalIndex,
    decode_payload,
    encode_payload,
    wal_epoch,
    wal_prefix,
)
from tiered.cluster.shards.wal_lifecycle import check_pruned_chain
from tiered.cold.objects.localdir import LocalDirStore
from tiered.core.errors import ErrorCode, TieredError
from tiered.hot.segment import segment_name

TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)
GRACE_S = 5.0


class Sim:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.world = World()
        self.cas = MemoryCasStore()
        self.objects = LocalDirStore(root / "objects")
        self.rng = random.Random(5)
        self.loop = asyncio.new_event_loop()

    def node(self, name: str, origin: float) -> ClusterNode:
        config = NodeConfig(name, f"http://{name}", TIMING, shard_count=1)
        return ClusterNode(self.cas, config, NodeClock(self.world, origin), nonce=nonce_source(self.rng))

    def shipper(self, node: ClusterNode, index: WalIndex) -> WalShipper:
        directory = self.root / node.node_id
        return WalShipper(
            0,
            node.serving()[0],
            directory,
            self.objects,
            node,
            index,
            node.clock,
            interval_s=0.2,
            gc_grace_s=GRACE_S,
            gc_limit=100,
            reconcile_interval_s=30.0,
        )

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def rounds(self, nodes: list[ClusterNode], count: int, dt: float = 1.0) -> None:
        for _ in range(count):
            for node in nodes:
                self.run(node.tick())
            self.world.advance(dt)

    def wal_keys(self) -> set[str]:
        async def collect() -> set[str]:
            return {info.key async for info in self.objects.list(wal_prefix(0))}

        return set(self.run(collect()))

    def latest_checkpoint(self) -> Checkpoint:
        for entry in reversed(chain(self.cas, 0)):
            if entry.kind is EntryKind.COMMIT:
                payload = decode_payload(entry.payload, 0)
                if isinstance(payload, Checkpoint):
                    return payload
        raise AssertionError("no checkpoint")


@pytest.fixture
def sim(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = Sim(tmp_path)
    yield s
    s.run(s.objects.close())
    s.loop.close()


def write_segment(directory: Path, n: int, data: bytes) -> None:
    hot = directory / "hot"
    hot.mkdir(parents=True, exist_ok=True)
    with open(hot / segment_name(n), "ab") as f:
        f.write(data)


def test_released_after_a_checkpoint_deleted_after_the_grace_chain_pruned(sim: Sim) -> None:
    a = sim.node("a", 1000.0)
    sim.rounds([a], 3)
    assert a.serving() == {0: 1}
    shipper = sim.shipper(a, WalIndex())
    d = sim.root / "a"
    write_segment(d, 1, b"one-")
    sim.run(shipper.flush())
    write_segment(d, 1, b"more")
    sim.run(shipper.flush())
    first = sim.wal_keys()
    assert len(first) == 2
    # The engine flushed segment 1 to the cold tier and deleted it; segment 2 goes on.
    (d / "hot" / segment_name(1)).unlink()
    write_segment(d, 2, b"two")
    sim.run(shipper.flush())
    released = sim.latest_checkpoint().released
    assert set(released) == first, "the release is in the chain before anything is deleted"
    sim.run(shipper.maintain())
    assert first <= sim.wal_keys(), "nothing deleted within the grace"
    sim.world.advance(GRACE_S - 0.5)
    sim.run(shipper.maintain())
    assert first <= sim.wal_keys()
    sim.world.advance(1.0)
    sim.run(shipper.maintain())
    remaining = sim.wal_keys()
    assert not (first & remaining) and len(remaining) == 1
    assert shipper.wal_deleted == 2
    sim.run(shipper.maintain())  # idempotent: nothing left to do
    assert shipper.wal_deleted == 2
    # The chain below the latest checkpoint is gone but for the fence; the tail is whole.
    entries = chain(sim.cas, 0)
    assert [e.kind for e in entries[:1]] == [EntryKind.FENCE] and entries[0].seq == 1
    assert entries[1].seq == shipper.checkpoint_seq and shipper.entries_pruned > 0
    check_pruned_chain(entries)
    # A restore from the pruned chain rebuilds the files from the objects that are left.
    index = sim.run(restore(sim.objects, sim.cas, 0, sim.root / "restored"))
    assert (sim.root / "restored" / "hot" / segment_name(2)).read_bytes() == b"two"
    assert not (sim.root / "restored" / "hot" / segment_name(1)).exists()
    assert index.referenced() == remaining


def test_a_new_owner_finishes_the_releases_of_a_crashed_one_and_the_zombie_is_fenced(sim: Sim) -> None:
    a = sim.node("a", 1000.0)
    sim.rounds([a], 3)
    shipper = sim.shipper(a, WalIndex())
    d = sim.root / "a"
    write_segment(d, 1, b"old")
    sim.run(shipper.flush())
    old = sim.wal_keys()
    (d / "hot" / segment_name(1)).unlink()
    write_segment(d, 2, b"kept")
    sim.run(shipper.flush())
    assert set(sim.latest_checkpoint().released) == old
    # A ship whose commit never landed leaves an orphan of epoch 1.
    orphan = wal_prefix(0) + "0000000001-deadbeef-000000000099"
    sim.run(sim.objects.put(orphan, b"never committed"))
    # a crashes before deleting anything; b declares it dead and takes the shard at epoch 2.
    b = sim.node("b", 5000.0)
    sim.rounds([b], 20)
    assert b.serving() == {0: 2}
    index = sim.run(restore(sim.objects, sim.cas, 0, sim.root / "b"))
    assert index.released.keys() == old
    successor = sim.shipper(b, index)
    sim.run(successor.maintain())
    assert old | {orphan} <= sim.wal_keys(), "the grace restarts on the new owner's clock"
    # Reconciliation finds the orphan (epoch 1 <= 2, referenced by nothing) and releases it.
    sim.rounds([b], 30)  # b beats meanwhile: its checkpoint needs an open window
    sim.run(successor.maintain())
    assert orphan in sim.latest_checkpoint().released
    assert not (old & sim.wal_keys()), "the older epoch's release finished after the grace"
    sim.rounds([b], int(GRACE_S))
    sim.run(successor.maintain())
    write_segment(sim.root / "b", 2, b"+")
    sim.run(successor.flush())
    sim.run(successor.maintain())
    left = sim.wal_keys()
    assert orphan not in left and {wal_epoch(k) for k in left} == {1, 2}
    assert (sim.root / "b" / "hot" / segment_name(2)).read_bytes() == b"kept+"
    # Every entry of epoch 1 but its fence is pruned, and so is a's checkpoint: b's fence stays.
    entries = chain(sim.cas, 0)
    check_pruned_chain(entries)
    fences = [e for e in entries if e.kind is EntryKind.FENCE]
    assert [(e.epoch, e.writer) for e in fences] == [(1, "a"), (2, "b")]
    assert all(e.epoch == 2 for e in entries if e.kind is EntryKind.COMMIT)
    # a resumes as a zombie: its next position is b's fence (kept), so its write fails there.
    writer = a.writers[0]
    entry = writer.plan_commit(encode_payload(WalIndex().checkpoint()), "zombie-nonce")
    assert entry.seq == fences[1].seq
    with pytest.raises(TieredError) as caught:
        sim.run(a._settle_entry(0, writer, entry))
    assert caught.value.code is ErrorCode.SHARD_FENCED
    assert sim.cas.objects[keys.manifest_key(0, entry.seq)].data != b""
    assert chain(sim.cas, 0) == entries
