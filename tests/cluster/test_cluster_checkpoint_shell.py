"""Checkpoint objects in the shipper: a long-lived shard restores from a few objects; a crash anywhere loses nothing.

Real ``ClusterNode`` shells on the in-memory CAS store with virtual clocks,
a ``WalShipper`` over a shard directory whose segments the test writes,
rolls and deletes as the engine would (flushed to the cold tier), and a
local-directory object store. The owner "dies" by being abandoned (its
shipper never called again, its node never ticks: SIGKILL in process); a
second node declares it dead, takes the shard, restores it and settles.

* A long run (thousands of WAL objects, a small restore bound): the restore
  reads the checkpoint objects plus at most the bound, and after the grace
  nothing but what the index refers to is left in the store.
* A crash before and after every store or chain write of a checkpoint and of
  releasing what it covers (the object's PUT, the entry, each delete after
  the grace, each chain prune): every shipped byte is restored byte-exact,
  and after the new owner's reconciliation and grace nothing is leaked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.cluster.test_cluster_wal_gc_shell import Sim, write_segment
from tests.support.cluster_sim import chain
from tiered.cluster.membership.manifest import ManifestEntry
from tiered.cluster.membership.node_shell import ClusterNode
from tiered.cluster.shards.checkpoint import RestoreBound, is_checkpoint_object
from tiered.cluster.shards.restore import restore_shard
from tiered.cluster.shards.wal import WalShipper
from tiered.cluster.shards.wal_index import WalIndex
from tiered.cluster.shards.wal_lifecycle import check_pruned_chain
from tiered.hot.segment import segment_name

T = TypeVar("T")
BOUND = RestoreBound(max_objects=6, max_bytes=4096)
GRACE_S = 5.0


@pytest.fixture
def sim(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = Sim(tmp_path)
    yield s
    s.run(s.objects.close())
    s.loop.close()


class Crash(Exception):
    """The process died here (SIGKILL)."""


class Fuse:
    """Counts the writes an owner makes; at write ``at`` it dies, before the write or just after it landed."""

    def __init__(self, at: int | None, after: bool) -> None:
        self.at = at
        self.after = after
        self.count = 0
        self.blown = False

    async def write(self, do: Callable[[], Awaitable[T]]) -> T:
        n = self.count
        self.count += 1
        if n == self.at and not self.after:
            self.blown = True
            raise Crash(n)
        result = await do()
        if n == self.at:
            self.blown = True
            raise Crash(n)
        return result


class FusedStore:
    def __init__(self, inner: Any, fuse: Fuse) -> None:
        self.inner = inner
        self.fuse = fuse

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, key: str, data: bytes, **kw: Any) -> Any:
        return await self.fuse.write(lambda: self.inner.put(key, data, **kw))

    async def delete(self, key: str) -> Any:
        return await self.fuse.write(lambda: self.inner.delete(key))


class FusedChain:
    def __init__(self, node: ClusterNode, fuse: Fuse) -> None:
        self.node = node
        self.fuse = fuse
        self.store = FusedStore(node.store, fuse)

    async def commit(self, shard: int, payload: bytes) -> ManifestEntry:
        return await self.fuse.write(lambda: self.node.commit(shard, payload))


def shipper(sim: Sim, node: ClusterNode, index: WalIndex, fuse: Fuse | None = None) -> WalShipper:
    fuse = fuse or Fuse(None, False)
    return WalShipper(
        0,
        node.serving()[0],
        sim.root / node.node_id,
        FusedStore(sim.objects, fuse),  # type: ignore[arg-type]
        FusedChain(node, fuse),
        index,
        node.clock,
        interval_s=0.2,
        checkpoint_every=BOUND.max_objects,
        gc_grace_s=GRACE_S,
        gc_limit=100,
        reconcile_interval_s=1.0,
        restore_bound=BOUND,
    )


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for sub in ("hot", "snapshots")
        if (directory / sub).is_dir()
        for p in sorted((directory / sub).iterdir())
    }


class Engine:
    """Writes the way a shard engine does: appends to the open segment, rolls it, deletes flushed ones."""

    def __init__(self, directory: Path, roll_every: int = 40) -> None:
        self.directory = directory
        self.roll_every = roll_every
        self.writes = 0
        self.segment = 1

    def append(self) -> None:
        self.writes += 1
        write_segment(self.directory, self.segment, b"w%06d;" % self.writes)
        if self.writes % self.roll_every == 0:
            self.segment += 1
            old = self.directory / "hot" / segment_name(self.segment - 2)
            old.unlink(missing_ok=True)  # flushed to the cold tier two rolls ago


def take_over(sim: Sim, name: str, origin: float) -> tuple[ClusterNode, WalShipper, Any]:
    b = sim.node(name, origin)
    sim.rounds([b], 20)  # the old owner is silent: declared dead, the shard taken at the next epoch
    assert list(b.serving()) == [0]
    index, report = sim.run(restore_shard(sim.objects, sim.cas, 0, sim.root / name, concurrency=4))
    return b, shipper(sim, b, index), report


def settle(sim: Sim, node: ClusterNode, successor: WalShipper) -> None:
    """The new owner's reconciliation, the grace, the deletes and the pruning, as its GC runner would."""
    for _ in range(4):
        sim.rounds([node], 2)
        sim.run(successor.ship_once())
        sim.run(successor.maintain())
        sim.rounds([node], int(GRACE_S) + 1)
        sim.run(successor.maintain())
    sim.run(successor.flush())
    sim.run(successor.maintain())
    left = sim.wal_keys()
    assert left == successor.index.referenced(), "nothing leaked: every object left is referenced"
    assert not successor.released
    check_pruned_chain(chain(sim.cas, 0))


def test_a_long_lived_shard_restores_from_the_checkpoint_and_a_bounded_tail(sim: Sim) -> None:
    a = sim.node("a", 1000.0)
    sim.rounds([a], 3)
    ship = shipper(sim, a, WalIndex())
    engine = Engine(sim.root / "a")
    for i in range(2400):
        engine.append()
        sim.run(ship.ship_once())
        if i % 50 == 0:
            sim.rounds([a], 1)  # beats (the window), and the grace passes for the deletes
            sim.run(ship.maintain())
    assert ship.ships >= 2400 and ship.checkpoint_objects >= 2400 // BOUND.max_objects
    shipped = files_of(sim.root / "a")
    # a is SIGKILLed: b restores from one checkpoint plus at most the bound's WAL objects.
    b, successor, report = take_over(sim, "b", 9000.0)
    assert files_of(sim.root / "b") == shipped
    wal_objects = report.objects - report.checkpoint_objects
    assert wal_objects <= BOUND.max_objects, report
    assert report.checkpoint_objects <= 2 * 12, report  # a few layers per live file
    assert report.entries <= BOUND.max_objects + 1, report
    settle(sim, b, successor)
    assert files_of(sim.root / "b") == shipped


def scenario(sim: Sim, fuse: Fuse) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """An owner ships enough for a checkpoint object, then checkpoints and releases, dying at ``fuse``.

    The ships before the step under test are not faulted. Returns the files as of the last ship that
    returned (acknowledged), and as the owner's disk held them when it died (the ship in flight may
    have landed without its caller hearing so).
    """
    a = sim.node("a", 1000.0)
    sim.rounds([a], 3)
    ship = shipper(sim, a, WalIndex(), fuse)
    engine = Engine(sim.root / "a", roll_every=4)
    armed, fuse.at = fuse.at, None
    for _ in range(BOUND.max_objects - 1):
        engine.append()
        sim.run(ship.ship_once())
    acknowledged = files_of(sim.root / "a")
    fuse.count, fuse.at = 0, armed
    try:
        engine.append()
        sim.run(ship.ship_once())  # the WAL object, its commit, the checkpoint object, the checkpoint entry
        acknowledged = files_of(sim.root / "a")
        assert ship.checkpoint_objects == 1
        sim.rounds([a], int(GRACE_S) + 1)
        sim.run(ship.maintain())  # the released WAL objects deleted past the grace, then the chain pruned
        sim.run(ship.ship_once())
        sim.run(ship.maintain())
    except Crash:
        pass
    return acknowledged, files_of(sim.root / "a")


def fresh(path: Path) -> Sim:
    return Sim(path)


def close(sim: Sim) -> None:
    sim.run(sim.objects.close())
    sim.loop.close()


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_a_crash_at_every_step_of_a_checkpoint_and_its_releases(tmp_path: Path, after: bool) -> None:
    probe = fresh(tmp_path / "probe")
    counted = Fuse(None, False)
    try:
        scenario(probe, counted)
        assert probe.wal_keys() and all(is_checkpoint_object(k) for k in probe.wal_keys())
    finally:
        close(probe)
    total = counted.count
    assert total >= 10, "the checkpoint object, its entry, the deletes and the prunes are all steps"
    for k in range(total):
        sim = fresh(tmp_path / f"crash-{k}")
        try:
            fuse = Fuse(k, after)
            acknowledged, on_disk = scenario(sim, fuse)
            assert fuse.blown
            b, successor, _ = take_over(sim, "b", 9000.0)
            restored = files_of(sim.root / "b")
            # Nothing acknowledged is lost: the files as acknowledged, or with the ship in flight.
            assert restored in (acknowledged, on_disk), k
            settle(sim, b, successor)
            assert files_of(sim.root / "b") == restored
        finally:
            close(sim)


def test_a_tail_cut_at_start_and_overwritten_reaches_the_next_owner(sim: Sim) -> None:
    """Recovery cuts a torn tail when the new owner's engine starts; appends then pass the old size
    before the next ship. Shipping compares sizes, so without ``note_recovery`` the bytes rewritten
    below the old size would never be shipped and the next owner would restore the torn ones."""
    a = sim.node("a", 1000.0)
    sim.rounds([a], 3)
    ship = shipper(sim, a, WalIndex())
    segment = sim.root / "a" / "hot" / segment_name(1)
    segment.parent.mkdir(parents=True, exist_ok=True)
    segment.write_bytes(b"acked;torn")
    sim.run(ship.ship_once())
    b, successor, _ = take_over(sim, "b", 9000.0)
    restored = sim.root / "b" / "hot" / segment_name(1)
    assert restored.read_bytes() == b"acked;torn"
    with open(restored, "r+b") as f:  # the engine's recovery cuts the torn tail...
        f.truncate(len(b"acked;"))
    successor.note_recovery()  # ...then the host notes it, before the shard's first write
    with open(restored, "ab") as f:
        f.write(b"new-append;")  # past the old size
    sim.run(successor.ship_once())
    c, _, _ = take_over(sim, "c", 20000.0)
    assert (sim.root / "c" / "hot" / segment_name(1)).read_bytes() == b"acked;new-append;"
