"""A cluster that settles under churn (issue 23), scenario by scenario on virtual clocks.

* Restores are never wasted: a shard being restored stays with its (live)
  restoring node whatever joins meanwhile; a node that loses a shard
  mid-restore abandons it (its restore is cancelled, the shard never served
  from it).
* Two processes under one node id: the one holding the id's current
  incarnation keeps it, the other ends (``NodeIdInUse``); one late write of
  a crashed process is not taken for a twin.
* Clock sanity: a node whose clock runs twice as fast as real time finds out
  from the store's ``Date`` and its peers' heartbeats, and then declares no
  peer dead (no churn), while the sane nodes do not doubt themselves.

Every node has its own monotonic clock over one simulated time
(``tests/support/cluster_sim.py``), all on one in-memory store.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from tests.support.cluster_sim import NodeClock, World, nonce_source
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import Fault, MemoryCasStore
from tiered.cluster.membership.heartbeat import Liveness, decode_heartbeat
from tiered.cluster.membership.identity import NodeIdInUse
from tiered.cluster.membership.lease import HoldState, LeaseTiming
from tiered.cluster.membership.manifest import ManifestEntry
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.cluster.membership.placement import assignment

T = TypeVar("T")
TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)
SHARDS = 8
WALL_ORIGIN = 1_800_000_000.0  # the store's clock (Unix seconds) at simulated time 0


@dataclass
class GatedEngines:
    """``ShardHost``-like hooks: ``serve`` restores (held at a gate while the test wants it to run) and
    then has an engine; ``stopped`` closes it. Every call is recorded."""

    calls: list[tuple[str, int]] = field(default_factory=list)
    gates: dict[int, asyncio.Event] = field(default_factory=dict)
    engines: dict[int, int] = field(default_factory=dict)  # shard -> the epoch its engine was restored for
    cancelled: list[int] = field(default_factory=list)

    async def prepare(self, shard: int, epoch: int, latest: ManifestEntry | None) -> None:
        self.calls.append(("prepare", shard))

    async def serve(self, shard: int, epoch: int) -> None:
        self.calls.append(("serve", shard))
        if shard in self.engines:
            return
        gate = self.gates.get(shard)
        try:
            if gate is not None:
                await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(shard)
            raise
        self.engines[shard] = epoch

    async def flush(self, shard: int) -> None:
        self.calls.append(("flush", shard))

    def stopped(self, shard: int, reason: str) -> None:
        self.calls.append(("stopped", shard))
        self.engines.pop(shard, None)

    def serves(self, shard: int) -> int:
        return self.calls.count(("serve", shard))


class Cluster:
    def __init__(self) -> None:
        self.world = World()
        self.store = MemoryCasStore(date=lambda: WALL_ORIGIN + self.world.t)
        self.rng = random.Random(3)
        self.loop = asyncio.new_event_loop()
        self.clocks: dict[str, NodeClock] = {}
        self.hooks: dict[str, GatedEngines] = {}

    def node(self, name: str, *, rate: float = 1.0) -> ClusterNode:
        """A new process of node ``name`` (its clock keeps running across processes, as a machine's)."""
        clock = self.clocks.setdefault(
            name, NodeClock(self.world, origin=1000.0 * (len(self.clocks) + 1), rate=rate)
        )
        hooks = self.hooks[name] = GatedEngines()
        config = NodeConfig(name, f"http://{name}", TIMING, shard_count=SHARDS, serve_in_background=True)
        return ClusterNode(self.store, config, clock, nonce=nonce_source(self.rng), hooks=hooks)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def rounds(self, nodes: list[ClusterNode], count: int, dt: float = 1.0) -> None:
        for _ in range(count):
            for node in nodes:
                self.run(node.tick())
            self.run(asyncio.sleep(0))  # let finished restores report
            self.world.advance(dt)

    def until(self, nodes: list[ClusterNode], done: Any, what: str, limit: int = 60) -> None:
        for _ in range(limit):
            if done():
                return
            self.rounds(nodes, 1)
        raise AssertionError(f"not within {limit} simulated seconds: {what}")

    def heartbeat(self, name: str) -> Any:
        return decode_heartbeat(self.store.objects[keys.node_key(name)].data, name)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.loop.close()


def _restoring(node: ClusterNode) -> set[int]:
    return {shard for shard, _ in node.restoring()}


def test_a_shard_mid_restore_stays_put_and_is_restored_once_not_three_times(cluster: Cluster) -> None:
    """The issue's scenario: the owner is killed; the node restoring its shard (its heir) is paused past
    its TTL and declared dead; the third node restores it; then the heir and the killed owner rejoin, each
    the shard's placement owner in turn. The third node's restore is never thrown away: the shard is
    restored to serving once (the heir's restore abandoned, never served), then moved by a handoff."""
    shard = next(s for s, o in enumerate(assignment(SHARDS, "xyz")) if o == "x")
    heir_name = assignment(SHARDS, "yz")[shard]
    assert heir_name is not None
    third_name = "y" if heir_name == "z" else "z"
    x, heir, third = cluster.node("x"), cluster.node(heir_name), cluster.node(third_name)
    everyone = [x, heir, third]
    cluster.until(everyone, lambda: sorted(s for n in everyone for s in n.serving()) == list(range(SHARDS)),
                  "every shard served")  # fmt: skip
    assert shard in x.serving()
    heir_gate, third_gate = asyncio.Event(), asyncio.Event()
    cluster.hooks[heir_name].gates[shard] = heir_gate  # restores of the shard run until the test ends them
    cluster.hooks[third_name].gates[shard] = third_gate

    # x is killed (no more passes, no goodbye). Its placement heir takes the shard and restores it.
    cluster.until([heir, third], lambda: shard in _restoring(heir), "the heir restoring the shard")
    epoch = heir.holds[shard].epoch
    cluster.rounds([heir, third], 1)
    assert (shard, epoch) in cluster.heartbeat(heir_name).restoring  # published for the others' placement

    # The heir is paused past its TTL: the third node declares it dead, takes the shard, restores it.
    cluster.until([third], lambda: shard in _restoring(third), "the third node restoring the shard")
    epoch_third = third.holds[shard].epoch
    assert epoch_third == epoch + 1

    # The heir resumes: declared dead, it drops the shard mid-restore (abandoned) and rejoins. x restarts
    # (a new process). Placement over all three names x, over the heir and the third the heir: each
    # would take the shard, and the third would hand it off mid-restore. Not while it restores.
    x2 = cluster.node("x")
    cluster.rounds([x2, heir, third], 20)
    assert heir.incarnation == 2 and x2.incarnation == 2
    assert cluster.hooks[heir_name].cancelled == [shard] and shard not in cluster.hooks[heir_name].engines
    assert heir.restores["abandoned"] == 1 and shard not in heir.serving()
    assert third.holds[shard].state is HoldState.FENCING and third.holds[shard].epoch == epoch_third
    assert _restoring(third) == {shard} and shard not in x2.holds and shard not in heir.holds
    assert (shard, epoch_third) in cluster.heartbeat(third_name).restoring
    assert cluster.hooks[third_name].serves(shard) == 1
    assert ("flush", shard) not in cluster.hooks[third_name].calls

    # The third node's restore finishes: it serves the shard, then hands it to x (placement), flushed.
    third_gate.set()
    cluster.rounds([x2, heir, third], 1)
    assert third.restores["completed"] >= 1
    cluster.until([x2, heir, third], lambda: shard in x2.serving(), "x serving the shard again")
    calls = cluster.hooks[third_name].calls
    assert calls.index(("flush", shard)) < calls.index(("stopped", shard))  # served, then handed off
    assert cluster.hooks[third_name].serves(shard) == 1 and cluster.hooks[heir_name].serves(shard) == 1
    assert cluster.heartbeat(third_name).restoring == ()


def test_a_node_declared_dead_mid_restore_never_serves_from_it(cluster: Cluster) -> None:
    a = cluster.node("x")
    cluster.hooks["x"].gates[0] = asyncio.Event()
    cluster.rounds([a], 1)
    assert _restoring(a) == {0} and 0 not in a.serving()
    b = cluster.node("y")
    cluster.until([b], lambda: 0 in b.serving(), "y serving shard 0")  # x frozen: declared dead, taken
    cluster.rounds([a], 1)  # x resumes: it learns it was declared dead
    assert cluster.hooks["x"].cancelled == [0] and a.restores["abandoned"] == 1
    cluster.hooks["x"].gates[0].set()
    cluster.rounds([a, b], 3)
    assert 0 not in cluster.hooks["x"].engines and 0 not in a.serving()


def test_a_second_process_under_a_running_id_refuses_to_start(cluster: Cluster) -> None:
    a = cluster.node("x")
    cluster.rounds([a], 2)
    twin = cluster.node("x")
    cluster.rounds([a, twin], 12)  # the twin waits out a's heartbeat, which keeps changing
    assert twin.replaced is not None and "node id x is in use" in twin.replaced
    assert twin.me is None and twin.holds == {}
    with pytest.raises(NodeIdInUse) as err:
        cluster.run(twin.run(asyncio.Event(), interval_s=0))
    assert err.value.exit_code == 3
    assert a.replaced is None and a.incarnation == 1 and len(a.serving()) == SHARDS


def test_an_older_process_resuming_after_its_replacement_joined_ends(cluster: Cluster) -> None:
    a = cluster.node("x")
    cluster.rounds([a], 2)
    b = cluster.node("x")  # a is paused: b waits out its heartbeat, then joins as incarnation 2
    cluster.until([b], lambda: len(b.serving()) == SHARDS, "the new process serving every shard")
    assert b.incarnation == 2
    cluster.rounds([a], 1)  # a resumes: its beat is refused, the id is alive at incarnation 2
    assert a.replaced is not None and "incarnation 1 was replaced by incarnation 2" in a.replaced
    assert a.me is None and a.holds == {} and a.serving() == {}
    writes = cluster.store.calls
    cluster.rounds([a], 3)  # it writes nothing more (it would overwrite its replacement)
    assert cluster.store.calls == writes
    with pytest.raises(NodeIdInUse):
        cluster.run(a.run(asyncio.Event(), interval_s=0))
    cluster.rounds([b], 2)
    assert b.replaced is None and len(b.serving()) == SHARDS and cluster.heartbeat("x").incarnation == 2


def test_one_late_write_of_a_crashed_process_is_not_a_twin(cluster: Cluster) -> None:
    a = cluster.node("x")
    cluster.rounds([a], 3)
    cluster.store.inject(Fault.DELAYED, keys.node_key("x"))
    cluster.until([a], lambda: bool(cluster.store.delayed), "a beat held in the network")  # then a crashes
    b = cluster.node("x")
    cluster.rounds([b], 4)
    assert cluster.store.deliver_delayed() is True  # lands while b waits: one new alive version
    cluster.until([b], lambda: b.incarnation == 2, "the new process joining")
    assert b.replaced is None


def test_a_node_whose_clock_runs_twice_as_fast_stops_declaring_peers_dead(cluster: Cluster) -> None:
    """x's clock runs at 2x. y passes only every 7 s (beats every ~7.5 s): alive for z (stale after 12 s),
    stale after 6 s of real time on x's clock. Until x knows, it declares y dead (the churn of the issue);
    once its references (the store's Date, y's and z's heartbeats) agree that its clock is out of the bound,
    it declares nobody dead. y and z, whose clocks are fine, do not doubt theirs."""
    x, y, z = cluster.node("x", rate=2.0), cluster.node("y"), cluster.node("z")
    declared: list[tuple[float, str]] = []

    def tick(node: ClusterNode) -> None:
        before = cluster.heartbeat("y").incarnation if keys.node_key("y") in cluster.store.objects else 0
        cluster.run(node.tick())
        if keys.node_key("y") in cluster.store.objects:
            beat = cluster.heartbeat("y")
            if (
                beat.state is Liveness.DEAD
                and beat.declared_by == node.node_id
                and beat.incarnation >= before
            ):
                if not declared or declared[-1] != (beat.incarnation, node.node_id):
                    declared.append((beat.incarnation, node.node_id))

    detected_at = None
    doubted = set()
    for second in range(240):
        tick(x)
        tick(z)
        if second % 7 == 0:
            tick(y)
        cluster.run(asyncio.sleep(0))
        if detected_at is None and x.clock_out_of_bound:
            detected_at = len(declared)
        doubted |= {n.node_id for n in (y, z) if n.clock_out_of_bound}
        cluster.world.advance(1.0)
    assert detected_at is not None, "x never found its clock out of the bound"
    assert x.clock_out_of_bound
    rates = x.clock_check.estimates(x.clock.monotonic())
    assert {"store", "y", "z"} <= set(rates) and all(e.disagrees for e in rates.values())
    assert rates["store"].rate == pytest.approx(2.0, rel=0.1)
    assert all(by == "x" for _, by in declared)  # only x's clock makes y look dead
    assert len(declared) == detected_at, f"x declared y dead after it knew its clock was out: {declared}"
    assert doubted == set(), "a node with a true clock doubted it (its first estimate was of x)"
    assert not z.clock_check.estimates(z.clock.monotonic())["store"].disagrees
