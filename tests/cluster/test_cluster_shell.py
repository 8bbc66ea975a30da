"""One node's cluster loop (``ClusterNode``) over the in-memory store, scenario by scenario.

Every node has its own virtual monotonic clock over one simulated real time
(``tests/support/cluster_sim.py``); the property test explores interleavings, these
pin the behaviours one at a time: joining, placement and handoff, the
window counted from a renewal's send time, peers counting from the answer of
their read, zombies that fence themselves, lost answers adopted, restarts
under the same id, clean stops.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest

from tests.support.cluster_sim import NodeClock, World, chain, nonce_source
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import Fault, MemoryCasStore
from tiered.cluster.membership.heartbeat import Liveness, decode_heartbeat
from tiered.cluster.membership.lease import LeaseTiming, decode_lease
from tiered.cluster.membership.manifest import EntryKind, ManifestEntry, check_chain
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.cluster.membership.placement import assignment
from tiered.core.clock import SystemClock
from tiered.core.errors import ErrorCode, TieredError

TIMING = LeaseTiming(ttl_s=10.0, margin_s=2.0)
SHARDS = 4


@dataclass
class Hooks:
    calls: list[tuple[str, int]] = field(default_factory=list)
    refuse: set[int] = field(default_factory=set)

    async def prepare(self, shard: int, epoch: int, latest: ManifestEntry | None) -> None:
        self.calls.append(("prepare", shard))
        if shard in self.refuse:
            raise TieredError(ErrorCode.SHARD_NOT_OWNED, f"refusing shard {shard}")

    async def serve(self, shard: int, epoch: int) -> None:
        self.calls.append(("serve", shard))

    async def flush(self, shard: int) -> None:
        self.calls.append(("flush", shard))

    def stopped(self, shard: int, reason: str) -> None:
        self.calls.append(("stopped", shard))


class Sim:
    def __init__(self, shards: int = SHARDS) -> None:
        self.world = World()
        self.store = MemoryCasStore()
        self.shards = shards
        self.rng = random.Random(1)
        self.clocks: dict[str, NodeClock] = {}
        self.hooks: dict[str, Hooks] = {}
        self.loop = asyncio.new_event_loop()

    def node(self, name: str, *, shard_count: int | None = None, rate: float = 1.0) -> ClusterNode:
        clock = self.clocks.setdefault(
            name, NodeClock(self.world, origin=1000.0 * (len(self.clocks) + 1), rate=rate)
        )
        hooks = self.hooks[name] = Hooks()
        config = NodeConfig(name, f"http://{name}", TIMING, shard_count=shard_count or self.shards)
        return ClusterNode(self.store, config, clock, nonce=nonce_source(self.rng), hooks=hooks)

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def rounds(self, nodes: list[ClusterNode], count: int, dt: float = 1.0) -> None:
        for _ in range(count):
            for node in nodes:
                self.run(node.tick())
            self.world.advance(dt)

    def close(self) -> None:
        self.loop.close()


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    yield s  # type: ignore[misc]
    s.close()


def may(node: ClusterNode, shard: int) -> bool:
    try:
        node.may_acknowledge(shard)
    except TieredError:
        return False
    return True


def test_one_node_creates_the_cluster_and_serves_every_shard_at_epoch_one(sim: Sim) -> None:
    a = sim.node("x")
    sim.rounds([a], 1)
    assert a.serving() == {s: 1 for s in range(SHARDS)}
    assert all(a.may_acknowledge(s) == 1 for s in range(SHARDS))
    for shard in range(SHARDS):
        entries = chain(sim.store, shard)
        assert [(e.seq, e.epoch, e.kind) for e in entries] == [(1, 1, EntryKind.FENCE)]
    assert sim.hooks["x"].calls == [call for s in range(SHARDS) for call in (("prepare", s), ("serve", s))]
    assert a.owner_of(0) == ("x", "http://x")
    assert a.takes == {"new": SHARDS, "handoff": 0, "takeover": 0}  # tiered_cluster_shards_taken_total


def test_a_joining_node_gets_its_placement_through_flush_release_and_a_new_epoch(sim: Sim) -> None:
    a, b = sim.node("x"), sim.node("y")
    sim.rounds([a], 1)
    sim.rounds([a, b], 3)
    want = assignment(SHARDS, ["x", "y"])
    assert {s for s in range(SHARDS) if want[s] == "y"}, "the placement must move something"
    for shard in range(SHARDS):
        holder = a if want[shard] == "x" else b
        other = b if holder is a else a
        assert may(holder, shard) and not may(other, shard)
        expected_epoch = 1 if holder is a else 2
        assert holder.may_acknowledge(shard) == expected_epoch
        check_chain(chain(sim.store, shard))
    moved = [s for s in range(SHARDS) if want[s] == "y"]
    calls = sim.hooks["x"].calls
    for shard in moved:  # flushed before it was released, then stopped
        assert calls.index(("flush", shard)) < calls.index(("stopped", shard))
        lease = decode_lease(sim.store.objects[keys.lease_key(shard)].data, shard)
        assert (lease.owner, lease.epoch) == ("y", 2)
    assert b.takes == {"new": 0, "handoff": len(moved), "takeover": 0}


def test_the_window_counts_from_the_send_time_of_the_renewal(sim: Sim) -> None:
    a = sim.node("x")
    sim.rounds([a], 1)
    sim.world.advance(5.0)
    sent = a.clock.monotonic()
    sim.store.on_call = lambda op, key: sim.world.advance(3.0) if op.startswith("put_if_match") else None
    sim.run(a.tick())  # the beat takes 6 s from send to answer
    sim.store.on_call = None
    assert a.window.until == pytest.approx(sent + TIMING.ttl_s - TIMING.margin_s)


def test_a_peer_counts_from_the_answer_of_its_read(sim: Sim) -> None:
    a = sim.node("x")
    sim.rounds([a], 1)
    b = sim.node("y")
    hb = keys.node_key("x")
    sim.store.on_call = lambda op, key: (
        sim.world.advance(2.0) if key == hb and op.endswith(":answer") else None
    )
    sim.run(b.tick())  # b reads x's heartbeat for the first time; the answer takes 2 s
    sim.store.on_call = None
    # First seen when the answer arrived (the latest moment), never when the read was sent.
    assert b.view.nodes["x"].since == b.clock.monotonic()


def test_a_frozen_holder_is_declared_dead_taken_over_and_fences_itself_when_it_resumes(sim: Sim) -> None:
    a, b = sim.node("x"), sim.node("y")
    sim.rounds([a, b], 3)
    held = sorted(a.serving())
    assert held, "x must hold something for this test"
    shard = held[0]
    epoch = a.may_acknowledge(shard)
    # Freeze x (no more passes); y goes on. y first saw x's last beat at t=0 (its clock runs
    # at the same rate here), so it may not take over before t = ttl + margin = 12.
    last_seen = b.view.nodes["x"].since
    while b.clock.monotonic() < last_seen + TIMING.stale_after_s:
        sim.rounds([b], 1, dt=0.5)
        assert not may(b, shard)
    taken_before = b.takes["takeover"]
    sim.rounds([b], 2)
    assert b.may_acknowledge(shard) == epoch + 1
    assert b.takes["takeover"] == taken_before + len(held)  # every shard x held, taken over
    beat = decode_heartbeat(sim.store.objects[keys.node_key("x")].data, "x")
    assert (beat.state, beat.declared_by) == (Liveness.DEAD, "y")
    # Resumed: before its next pass, x's own clock already refuses.
    with pytest.raises(TieredError) as err:
        a.may_acknowledge(shard)
    assert err.value.code is ErrorCode.SHARD_NOT_OWNED
    assert a.takes["takeover"] == 0
    # Even if its gate were bypassed, its chain position is taken: the commit is fenced.
    a.window.extend(a.clock.monotonic(), TIMING)  # simulate a zombie that thinks it is valid
    with pytest.raises(TieredError) as err:
        sim.run(a.commit(shard, b"zombie"))
    assert err.value.code is ErrorCode.SHARD_FENCED
    assert err.value.context["epoch"] == epoch + 1 and shard not in a.holds
    assert all(e.epoch == epoch + 1 for e in chain(sim.store, shard)[-1:])
    # Its next pass finds it was declared dead: it drops everything and rejoins as incarnation 2.
    sim.run(a.tick())
    assert a.holds == {} and a.me is None
    sim.rounds([a, b], 4)
    assert a.incarnation == 2
    want = assignment(SHARDS, ["x", "y"])
    assert sorted(a.serving()) == [s for s in range(SHARDS) if want[s] == "x"]
    for s in range(SHARDS):
        check_chain(chain(sim.store, s))


def test_a_commit_in_flight_during_takeover_lands_below_the_fence_or_not_at_all(sim: Sim) -> None:
    a, b = sim.node("x"), sim.node("y")
    sim.rounds([a, b], 3)
    shard = sorted(a.serving())[0]
    sim.store.inject(Fault.DELAYED, keys.manifest_prefix(shard))
    with pytest.raises(TieredError) as err:
        sim.run(a.commit(shard, b"in flight"))
    assert err.value.code is ErrorCode.STORE_UNAVAILABLE  # not acknowledged
    sim.rounds([b], 15)  # x frozen; y takes over and fences
    assert may(b, shard)
    assert sim.store.deliver_delayed() is False  # its position is the fence's now
    entries = chain(sim.store, shard)
    check_chain(entries)
    assert b"in flight" not in [e.payload for e in entries]


def test_lost_answers_are_settled_by_nonce_and_late_wins_adopted(sim: Sim) -> None:
    a = sim.node("x")
    sim.store.inject(Fault.LOST, keys.LEASES)  # applied, answer lost: read back, our nonce
    sim.store.inject(Fault.APPLIED_412, keys.MANIFESTS)  # applied, answered 412: read back, ours
    sim.store.inject(Fault.DELAYED, keys.LEASES)  # arrives after the pass gave up on it
    sim.rounds([a], 1)
    assert len(a.serving()) == SHARDS - 1
    assert sim.store.deliver_delayed() is True
    sim.rounds([a], 1)  # the lease names this incarnation: adopted, fenced, served
    assert a.serving() == {s: 1 for s in range(SHARDS)}
    for shard in range(SHARDS):
        assert [e.kind for e in chain(sim.store, shard)] == [EntryKind.FENCE]


def test_a_restart_under_the_same_id_waits_out_its_previous_incarnation(sim: Sim) -> None:
    a = sim.node("x")
    sim.rounds([a], 2)
    again = sim.node("x")  # crash: a new process, nothing in memory
    sim.rounds([again], 11)
    assert again.me is None and again.serving() == {}  # the old one might still be running
    sim.rounds([again], 3)
    assert again.incarnation == 2
    assert again.serving() == {s: 2 for s in range(SHARDS)}


def test_a_clean_stop_hands_off_at_once(sim: Sim) -> None:
    a, b = sim.node("x"), sim.node("y")
    sim.rounds([a, b], 3)
    sim.run(a.stop())
    assert a.holds == {}
    beat = decode_heartbeat(sim.store.objects[keys.node_key("x")].data, "x")
    assert beat.state is Liveness.STOPPED
    sim.rounds([b], 2)  # no ttl wait
    assert b.serving() == {s: b.serving()[s] for s in range(SHARDS)}
    again = sim.node("x")
    sim.rounds([again, b], 4)
    assert again.incarnation == 2 and again.serving()


def test_the_configured_shard_count_must_match_the_cluster(sim: Sim) -> None:
    sim.rounds([sim.node("x")], 1)
    with pytest.raises(TieredError) as err:
        sim.run(sim.node("y", shard_count=8).tick())
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_two_processes_with_one_id_never_both_serve(sim: Sim) -> None:
    a = sim.node("x")
    sim.rounds([a], 1)
    twin = sim.node("x")
    sim.rounds([a, twin], 30)  # a keeps beating: the twin sees it and refuses to start
    assert twin.me is None and twin.serving() == {}
    assert (
        twin.replaced is not None and "node id x is in use" in twin.replaced
    )  # tests/cluster/test_cluster_settle.py
    assert a.serving() == {s: 1 for s in range(SHARDS)}


def test_config_is_checked() -> None:
    for bad in ({"node_id": "bad/id"}, {"node_id": ""}, {"beat_interval_s": 9.0}, {"max_writes_per_tick": 0}):
        kwargs = {"node_id": "x", "advertise_url": "u", "timing": TIMING, **bad}
        with pytest.raises(ValueError):
            NodeConfig(**kwargs)  # type: ignore[arg-type]


def test_a_shard_the_data_plane_refuses_is_released_unfenced_and_declined_for_a_while(sim: Sim) -> None:
    a = sim.node("x")
    sim.hooks["x"].refuse.add(2)
    sim.rounds([a], 1)
    assert sorted(a.serving()) == [0, 1, 3]
    assert chain(sim.store, 2) == []  # no fence: a refusal leaves no trace in the chain
    lease = decode_lease(sim.store.objects[keys.lease_key(2)].data, 2)
    assert lease.free and lease.epoch == 1
    sim.rounds([a], 5)
    assert 2 not in a.holds  # declined: not taken again at once
    sim.hooks["x"].refuse.clear()
    sim.rounds([a], int(TIMING.stale_after_s) + 1)
    assert a.serving()[2] == 2


def test_run_repeats_passes_until_stopped_then_hands_off() -> None:
    """The loop on the real clock: serves, then on stop hands everything off and says so."""

    async def scenario() -> None:
        store = MemoryCasStore()
        config = NodeConfig("x", "http://x", LeaseTiming(ttl_s=2.0, margin_s=0.4), shard_count=SHARDS)
        node = ClusterNode(store, config, SystemClock())
        stop = asyncio.Event()
        running = asyncio.create_task(node.run(stop, interval_s=0.01))
        for _ in range(500):  # bounded: about 5 s at most
            if len(node.serving()) == SHARDS:
                break
            await asyncio.sleep(0.01)
        assert len(node.serving()) == SHARDS
        stop.set()
        await asyncio.wait_for(running, 10)
        assert node.holds == {} and node.me is None
        beat = decode_heartbeat(store.objects[keys.node_key("x")].data, "x")
        assert beat.state is Liveness.STOPPED
        for shard in range(SHARDS):
            lease = decode_lease(store.objects[keys.lease_key(shard)].data, shard)
            assert lease.free and lease.last_owner == "x"

    asyncio.run(scenario())


@dataclass
class SlowEngines(Hooks):
    """Hooks like ``ShardHost``'s: ``serve`` restores (gated here) then starts an engine, or keeps the one running."""

    gates: dict[int, asyncio.Event] = field(default_factory=dict)
    engines: dict[int, int] = field(default_factory=dict)  # shard -> epoch its engine was restored for

    async def serve(self, shard: int, epoch: int) -> None:
        self.calls.append(("serve", shard))
        if shard in self.engines:
            return  # ShardHost.serve keeps a running engine
        gate = self.gates.get(shard)
        if gate is not None:
            await gate.wait()
        self.engines[shard] = epoch

    def stopped(self, shard: int, reason: str) -> None:
        super().stopped(shard, reason)
        self.engines.pop(shard, None)


def test_an_engine_restored_for_a_dropped_hold_is_never_served_under_a_later_one(sim: Sim) -> None:
    """A restore still running when its hold is dropped (its incarnation declared dead) and the shard
    is taken again: the engine it starts holds the chain as it was before the drop (another owner may
    have acknowledged appends since), so it is stopped, and the new hold restores afresh."""
    hooks = SlowEngines()
    config = NodeConfig("x", "http://x", TIMING, shard_count=1, serve_in_background=True)
    a = ClusterNode(sim.store, config, sim.clocks.setdefault("x", NodeClock(sim.world, origin=1000.0)),
                    nonce=nonce_source(sim.rng), hooks=hooks)  # fmt: skip
    hooks.gates[0] = gate = asyncio.Event()
    sim.rounds([a], 1)
    first = a.holds[0].epoch
    assert a.serving() == {} and 0 not in hooks.engines  # restoring
    a._fenced_self("declared dead (test)")  # dropped while its restore runs
    sim.rounds([a], 14)  # rejoins as incarnation 2 once the first one's window is surely over
    assert a.incarnation == 2 and 0 in a.holds
    second = a.holds[0].epoch
    assert second > first and a.serving() == {}
    gate.set()  # the stale restore finishes now, under the new hold
    del hooks.gates[0]
    sim.run(asyncio.sleep(0))
    sim.rounds([a], 2)
    assert a.serving() == {0: second}
    assert hooks.engines == {0: second}, "the engine restored for the dropped hold was kept"
