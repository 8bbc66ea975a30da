"""Phase 2, step 1: one storage engine per served shard, under the node's data dir.

``ShardHost`` is the ``ClusterNode``'s hooks: each shard the node serves gets
a whole single-node engine (journal, hot segments, snapshots, cold prefix) in
``<data>/shards/<shard>/``. With local durability a shard's acknowledged data
lives on its last writer's disk, so no other node serves it: a peer that takes
the lease of a dead writer gives it back unfenced, and the writer, back under
its id, takes it again and finds its data.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import cluster_sim
from tests.support.cluster_sim import NodeClock, World, chain, nonce_source
from tiered.cluster.membership.cas import MemoryCasStore
from tiered.cluster.membership.lease import LeaseTiming, decode_lease
from tiered.cluster.membership.manifest import EntryKind
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.cluster.membership.shards import shard_of
from tiered.cluster.shards.host import ShardHost, shard_config
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.streams.model import AppendRequest, CreateRequest

TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)
SHARDS = 2


class Harness:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.world = World()
        self.store = MemoryCasStore()
        self.rng = random.Random(3)
        self.loop = asyncio.new_event_loop()
        self.hosts: list[ShardHost] = []

    def node(self, name: str, *, rebalance: bool = False) -> tuple[ClusterNode, ShardHost]:
        clock = NodeClock(self.world, origin=1000.0 * (len(self.hosts) + 1))
        host = ShardHost(Config(data_dir=str(self.root / name)), name, clock, jobs=False)
        self.hosts.append(host)
        config = NodeConfig(name, f"http://{name}", TIMING, shard_count=SHARDS, rebalance=rebalance)
        return ClusterNode(self.store, config, clock, nonce=nonce_source(self.rng), hooks=host), host

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def rounds(self, nodes: list[ClusterNode], count: int, dt: float = 1.0) -> None:
        for _ in range(count):
            for node in nodes:
                self.run(node.tick())
            self.world.advance(dt)

    def close(self) -> None:
        for host in self.hosts:
            self.run(host.close())
        self.loop.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.close()


def _create(path: str, data: bytes) -> CreateRequest:
    return CreateRequest("text/plain", None, None, None, False, data)


async def _write_and_read(host: ShardHost, path: str, first: bytes, more: bytes) -> bytes:
    engine = host.engine(shard_of(DEFAULT_BUCKET, path, SHARDS))
    await engine.streams.create(DEFAULT_BUCKET, path, _create(path, first))
    await engine.streams.append(DEFAULT_BUCKET, path, AppendRequest("text/plain", more, False))
    return await _read(host, path)


async def _read(host: ShardHost, path: str) -> bytes:
    engine = host.engine(shard_of(DEFAULT_BUCKET, path, SHARDS))
    s = engine.streams.lookup(DEFAULT_BUCKET, path)
    return await engine.streams.read(s, 0, s.tail)


def _paths_per_shard() -> dict[int, str]:
    found: dict[int, str] = {}
    for i in range(100):
        found.setdefault(shard_of(DEFAULT_BUCKET, f"s{i}", SHARDS), f"s{i}")
    assert len(found) == SHARDS
    return found


def test_shard_config_puts_each_shard_in_its_own_directory_and_prefix(tmp_path: Path) -> None:
    base = Config(data_dir=str(tmp_path / "d"), s3_prefix="team/a/")
    config = shard_config(base, 7)
    assert config.data_path == tmp_path / "d" / "shards" / "0007"
    assert config.s3_prefix == "team/a/shards/0007" and config.take_over_prefix
    assert shard_config(Config(data_dir=str(tmp_path)), 12).s3_prefix == "shards/0012"


def test_each_served_shard_runs_its_own_engine_under_the_data_dir(harness: Harness) -> None:
    x, host = harness.node("x")
    harness.rounds([x], 1)
    assert sorted(host.engines) == [0, 1] and host.epochs == {0: 1, 1: 1}
    paths = _paths_per_shard()
    for shard, path in paths.items():
        assert harness.run(_write_and_read(host, path, b"hello ", f"shard {shard}".encode())) == (
            f"hello shard {shard}".encode()
        )
        shard_dir = harness.root / "x" / "shards" / f"{shard:04d}"
        assert (shard_dir / "hot").is_dir() and (shard_dir / "cold").is_dir()
    # Each engine knows only its own shard's streams.
    with pytest.raises(TieredError) as err:
        host.engine(0).streams.lookup(DEFAULT_BUCKET, paths[1])
    assert err.value.code is ErrorCode.STREAM_NOT_FOUND
    with pytest.raises(TieredError) as err:
        host.engine(5)
    assert err.value.code is ErrorCode.SHARD_NOT_OWNED


def test_a_clean_restart_takes_its_shards_back_and_recovers_them(harness: Harness) -> None:
    x, host = harness.node("x")
    harness.rounds([x], 1)
    paths = _paths_per_shard()
    for path in paths.values():
        harness.run(_write_and_read(host, path, b"kept ", b"across restarts"))
    harness.run(x.stop())  # hands off: flush + snapshot, release naming x as the last owner
    harness.run(host.close())
    for shard in range(SHARDS):
        lease = decode_lease(harness.store.history[cluster_sim.keys.lease_key(shard)][-1], shard)
        assert lease.free and lease.last_owner == "x"
    again, host2 = harness.node("x")
    harness.rounds([again], 1)
    assert sorted(host2.engines) == [0, 1] and host2.epochs == {0: 2, 1: 2}
    for path in paths.values():
        assert harness.run(_read(host2, path)) == b"kept across restarts"


def test_with_local_durability_no_other_node_serves_a_dead_writers_shards(harness: Harness) -> None:
    x, host_x = harness.node("x")
    harness.rounds([x], 1)
    paths = _paths_per_shard()
    for path in paths.values():
        harness.run(_write_and_read(host_x, path, b"only on ", b"x's disk"))
    # x dies (its process is gone; its volume stays). y runs on alone, long past the TTL.
    harness.run(host_x.close())
    y, host_y = harness.node("y")
    harness.rounds([y], 30)
    assert host_y.engines == {} and y.serving() == {}
    for shard in range(SHARDS):
        # y took the lease, refused to fence it, gave it back naming x: the chain is x's alone.
        assert {e.writer for e in chain(harness.store, shard)} == {"x"}
        assert [e.kind for e in chain(harness.store, shard)] == [EntryKind.FENCE]
        lease = decode_lease(harness.store.objects[cluster_sim.keys.lease_key(shard)].data, shard)
        assert lease.free and lease.last_owner == "x"
    # x comes back under its id on its volume: it takes its shards back, with their data.
    back, host_back = harness.node("x")
    harness.rounds([back, y], 3)
    assert sorted(host_back.engines) == [0, 1] and host_y.engines == {}
    for path in paths.values():
        assert harness.run(_read(host_back, path)) == b"only on x's disk"


def test_a_shard_starts_without_waiting_for_another_shards_engine_to_close(tmp_path: Path) -> None:
    """Placement off the hot path: a takeover's engine start waits only for its own shard's previous engine."""
    loop = asyncio.new_event_loop()
    host = ShardHost(Config(data_dir=str(tmp_path)), "n1", jobs=False)
    release = asyncio.Event()
    closing = host._close

    async def slow_close(shard, node, reason):  # type: ignore[no-untyped-def]
        await release.wait()  # an engine whose stop hangs (a slow flush, a stuck store)
        await closing(shard, node, reason)

    async def scenario() -> None:
        await host.serve(0, 1)
        host._close = slow_close  # type: ignore[method-assign]
        host.stopped(0, "handed off")
        await asyncio.wait_for(host.serve(1, 1), 30)  # another shard: not held up by shard 0's close
        assert set(host.engines) == {1}
        again = asyncio.ensure_future(host.serve(0, 2))
        await asyncio.sleep(0.05)
        assert not again.done(), "the same shard waits for its previous engine to let go of its directory"
        release.set()
        await asyncio.wait_for(again, 30)
        assert set(host.engines) == {0, 1}
        await host.close()

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
