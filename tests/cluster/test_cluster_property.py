"""The lease and manifest protocol, as a hypothesis stateful test over simulated nodes.

Three ``ClusterNode`` shells (the real ones) share one linearizable
``MemoryCasStore``. Each node has its own drifting monotonic clock over one
simulated real time. Hypothesis interleaves: node passes (with store
latency that moves real time between a request's send, its effect and its
answer), time passing, acknowledgements (local durability: the node's
``may_acknowledge`` gate) and manifest commits (object-store durability),
nodes frozen past their TTL and resumed (zombies), crashes and restarts
under the same id, clean stops, and injected store faults: answers lost
after the write applied, requests dropped, requests delayed and applied
later, 409 conflicts, 412 after applying, failed reads.

Invariants, checked against the store after every step:

* epochs per shard never decrease; each epoch has one holder; a change of
  hands is exactly epoch + 1;
* at no instant may two nodes acknowledge in one shard;
* no two node incarnations ever acknowledged in one shard at one epoch;
* no acknowledgement after a fencing manifest of a higher epoch landed;
* every manifest chain is valid (contiguous, epochs rising only at fences,
  one writer per epoch) and holds every acknowledged commit, in place.

At the end, with faults healed and every node running, the cluster must
converge: every shard served by exactly one node.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.support.cluster_sim import NodeClock, World, chain, lease_history, nonce_source
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import Fault, MemoryCasStore
from tiered.cluster.membership.lease import LeaseTiming
from tiered.cluster.membership.manifest import EntryKind, check_chain
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.core.errors import ErrorCode, TieredError

T = TypeVar("T")

NODES = ("x", "y", "z")  # names whose placement gives every node shards, any two alive or three
SHARDS = 4
TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)
FAULTS = list(Fault)
FAULT_TARGETS = ("", keys.NODES, keys.LEASES, keys.MANIFESTS)


@dataclass(frozen=True)
class Ack:
    node: str
    incarnation: int
    shard: int
    epoch: int
    at: float


class ClusterProtocol(RuleBasedStateMachine):
    REBALANCE = True

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.world = World()
        self.store = MemoryCasStore(on_call=self._on_call)
        self.rng = random.Random(7)
        self.clocks: dict[str, NodeClock] = {}
        self.nodes: dict[str, ClusterNode] = {}
        self.frozen: set[str] = set()
        self.stopped: set[str] = set()
        self.latency = 0.0
        self.acks: list[Ack] = []
        self.ack_holder: dict[tuple[int, int], tuple[str, int]] = {}
        self.commits: list[tuple[int, int, str]] = []  # (shard, seq, nonce) acknowledged
        self.restarts = 0

    # -- plumbing ---------------------------------------------------------------------------

    def _on_call(self, op: str, key: str) -> None:
        self.world.advance(self.latency / 2)  # half before the effect, half before the answer

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _new_node(self, name: str) -> ClusterNode:
        config = NodeConfig(name, f"http://{name}.test", TIMING, shard_count=SHARDS, rebalance=self.REBALANCE)
        return ClusterNode(self.store, config, self.clocks[name], nonce=nonce_source(self.rng))

    def teardown(self) -> None:
        epochs = max((b.epoch for s in range(SHARDS) for b in lease_history(self.store, s)), default=0)
        event(f"acknowledged: {'yes' if self.acks else 'no'}; commits: {'yes' if self.commits else 'no'}")
        event(f"highest epoch before healing: {min(epochs, 5)}{'+' if epochs > 5 else ''}")
        event(f"delayed requests: {'yes' if self.store.delayed else 'no'}")
        event(
            f"store calls: {'<50' if self.store.calls < 50 else '<300' if self.store.calls < 300 else '300+'}"
        )
        try:
            self._converge()
        finally:
            self.loop.close()

    # -- rules ------------------------------------------------------------------------------

    @initialize(
        rates=st.lists(st.floats(0.97, 1.03), min_size=len(NODES), max_size=len(NODES)),
        origins=st.lists(st.floats(0, 1e6), min_size=len(NODES), max_size=len(NODES)),
        warm_up=st.integers(0, 3),
    )
    def start(self, rates: list[float], origins: list[float], warm_up: int) -> None:
        for name, rate, origin in zip(NODES, rates, origins, strict=True):
            self.clocks[name] = NodeClock(self.world, origin, rate)
            self.nodes[name] = self._new_node(name)
        for _ in range(warm_up):  # often start from a running cluster, sometimes from nothing
            self.every_node_ticks(0.0)
            self.world.advance(1.0)

    @rule(name=st.sampled_from(NODES), latency=st.sampled_from([0.0, 0.0, 0.1, 1.0, 4.0, 16.0]))
    def tick(self, name: str, latency: float) -> None:
        if name in self.frozen or name in self.stopped:
            return
        self.latency = latency
        try:
            self.run(self.nodes[name].tick())
        finally:
            self.latency = 0.0
        self.acknowledge()  # writes keep arriving: acknowledge wherever the gate allows

    @rule(latency=st.sampled_from([0.0, 0.1, 1.0]))
    def every_node_ticks(self, latency: float) -> None:
        for name in NODES:
            self.tick(name, latency)

    @rule(
        step=st.sampled_from([0.0, 0.1, 0.5]),
        seed=st.integers(0, 2**32 - 1),
        committers=st.sets(st.sampled_from(NODES)),
    )
    def concurrent_round(self, step: float, seed: int, committers: set[str]) -> None:
        """Every running node's pass (and some commits) at once, interleaved at every store call.

        Each request waits a random number of scheduling steps before its
        effect and again before its answer (mostly a few, sometimes dozens);
        each step moves real time by ``step``. Between any two steps,
        acknowledgements are attempted and the one-acknowledger invariant is
        checked, so a read landing between another node's write and its answer
        is exercised.
        """
        rng = random.Random(seed)
        running = [n for name, n in sorted(self.nodes.items()) if name not in self.frozen | self.stopped]

        async def commit(node: ClusterNode) -> None:
            shards = sorted(node.holds)
            if not shards:
                return
            try:
                entry = await node.commit(rng.choice(shards), b"concurrent")
            except TieredError as exc:
                assert exc.code in (
                    ErrorCode.SHARD_NOT_OWNED,
                    ErrorCode.SHARD_FENCED,
                    ErrorCode.STORE_UNAVAILABLE,
                )
                return
            self.commits.append((entry.shard, entry.seq, entry.nonce))

        async def round_() -> None:
            work = [asyncio.ensure_future(n.tick()) for n in running]
            work += [asyncio.ensure_future(commit(n)) for n in running if n.node_id in committers]
            for _ in range(20_000):  # bounded: a pass makes a few dozen requests
                if all(task.done() for task in work):
                    break
                await asyncio.sleep(0)
                self.world.advance(step)
                self.acknowledge()
                self.one_node_may_acknowledge_per_shard()
            for task in work:
                task.result()

        self.store.yields = lambda: rng.choice((0, 0, 1, 2, 3, 8, 30))
        try:
            self.run(round_())
        finally:
            self.store.yields = None

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 5.0, 9.0, 13.0]))
    def time_passes(self, seconds: float) -> None:
        self.world.advance(seconds)
        self.acknowledge()

    @rule()
    def acknowledge(self) -> None:
        """Local-durability writes to every shard through every running node: acked where the gate says so."""
        for name, node in self.nodes.items():
            if name in self.frozen:
                continue
            for shard in range(SHARDS):
                try:
                    epoch = node.may_acknowledge(shard)
                except TieredError as exc:
                    assert exc.code is ErrorCode.SHARD_NOT_OWNED
                    continue
                ack = Ack(name, node.incarnation, shard, epoch, self.world.t)
                holder = self.ack_holder.setdefault((shard, epoch), (name, node.incarnation))
                assert holder == (name, node.incarnation), (
                    f"two holders acknowledged in shard {shard} epoch {epoch}"
                )
                fences = {e.epoch for e in chain(self.store, shard) if e.kind is EntryKind.FENCE}
                assert epoch in fences, f"{ack} before its own fence landed"
                higher = sorted(e for e in fences if e > epoch)
                assert not higher, f"{ack} after the fence of epoch {higher[0]}"
                self.acks.append(ack)

    @rule(
        name=st.sampled_from(NODES),
        data=st.data(),
        latency=st.sampled_from([0.0, 0.5, 3.0]),
    )
    def commit(self, name: str, data: st.DataObject, latency: float) -> None:
        """An object-store-durability write: acknowledged once its manifest entry landed."""
        if name in self.frozen or name in self.stopped:
            return
        # Mostly a shard the node serves (that is where commits happen), sometimes any.
        serving = sorted(self.nodes[name].holds) or list(range(SHARDS))
        shard = data.draw(st.sampled_from(serving) | st.integers(0, SHARDS - 1))
        self.latency = latency
        try:
            entry = self.run(self.nodes[name].commit(shard, b"batch"))
        except TieredError as exc:
            assert exc.code in (
                ErrorCode.SHARD_NOT_OWNED,
                ErrorCode.SHARD_FENCED,
                ErrorCode.STORE_UNAVAILABLE,
            )
            return
        finally:
            self.latency = 0.0
        self.commits.append((shard, entry.seq, entry.nonce))

    @rule(name=st.sampled_from(NODES))
    def freeze(self, name: str) -> None:
        self.frozen.add(name)

    @rule(name=st.sampled_from(NODES))
    def resume(self, name: str) -> None:
        self.frozen.discard(name)

    @rule(name=st.sampled_from(NODES))
    def crash_and_restart(self, name: str) -> None:
        """A new process under the same id: nothing in memory survives."""
        self.frozen.discard(name)
        self.stopped.discard(name)
        self.nodes[name] = self._new_node(name)
        self.restarts += 1

    @rule(name=st.sampled_from(NODES))
    def clean_stop(self, name: str) -> None:
        if name in self.frozen or name in self.stopped:
            return
        self.run(self.nodes[name].stop())
        self.stopped.add(name)

    @rule(fault=st.sampled_from(FAULTS), where=st.sampled_from(FAULT_TARGETS))
    def inject(self, fault: Fault, where: str) -> None:
        self.store.inject(fault, where)

    @rule(data=st.data())
    def delayed_request_arrives(self, data: st.DataObject) -> None:
        if self.store.delayed:
            self.store.deliver_delayed(data.draw(st.integers(0, len(self.store.delayed) - 1)))

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def epochs_rise_one_holder_each(self) -> None:
        for shard in range(SHARDS):
            history = lease_history(self.store, shard)
            for before, after in zip(history, history[1:], strict=False):
                if after.epoch == before.epoch:
                    # Same epoch: the holder rewrote its own lease, or released it.
                    assert not before.free, f"shard {shard}: a free lease taken without a new epoch"
                    assert after.free or (after.owner, after.incarnation) == (
                        before.owner,
                        before.incarnation,
                    )
                else:
                    assert after.epoch == before.epoch + 1, (
                        f"shard {shard}: epoch {before.epoch} -> {after.epoch}"
                    )
                    assert not after.free

    @invariant()
    def one_node_may_acknowledge_per_shard(self) -> None:
        if not self.nodes:
            return
        for shard in range(SHARDS):
            able = []
            for name, node in self.nodes.items():
                try:
                    able.append((name, node.may_acknowledge(shard)))
                except TieredError:
                    pass
            assert len(able) <= 1, f"shard {shard}: {able} may all acknowledge at t={self.world.t}"

    @invariant()
    def chains_valid_and_hold_every_commit(self) -> None:
        for shard in range(SHARDS):
            check_chain(chain(self.store, shard))
        for shard, seq, nonce in self.commits:
            found = self.store.objects.get(keys.manifest_key(shard, seq))
            assert found is not None and nonce.encode() in found.data, f"commit {shard}/{seq} lost"

    # -- the end: heal everything and require convergence ---------------------------------

    def _converge(self) -> None:
        if not self.nodes:
            return
        self.store.clear_faults()
        while self.store.delayed:
            self.store.deliver_delayed()
        self.frozen.clear()
        for name in list(self.stopped):
            self.nodes[name] = self._new_node(name)
        self.stopped.clear()
        for _ in range(40):  # 40 s of simulated time: well past ttl + margin
            for node in self.nodes.values():
                self.run(node.tick())
            self.epochs_rise_one_holder_each()
            self.one_node_may_acknowledge_per_shard()
            self.chains_valid_and_hold_every_commit()
            self.world.advance(1.0)
        for node in self.nodes.values():
            self.run(node.tick())
        served = sorted(s for node in self.nodes.values() for s in node.serving())
        assert served == list(range(SHARDS)), f"after healing, served shards are {served}"
        for shard in range(SHARDS):
            assert any(_may(node, shard) for node in self.nodes.values()), (
                f"shard {shard} has no acknowledger"
            )


def _may(node: ClusterNode, shard: int) -> bool:
    try:
        node.may_acknowledge(shard)
    except TieredError:
        return False
    return True


ClusterProtocol.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClusterProtocol = pytest.mark.timeout(600)(ClusterProtocol.TestCase)


class StickyClusterProtocol(ClusterProtocol):
    """The same, with shards staying with their holder (local durability's placement)."""

    REBALANCE = False


StickyClusterProtocol.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStickyClusterProtocol = pytest.mark.timeout(600)(StickyClusterProtocol.TestCase)
