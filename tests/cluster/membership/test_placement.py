"""Placement (rendezvous hashing): the same on every node, and a new node takes about 1/N of the shards."""

from __future__ import annotations

from collections import Counter

from tiered.cluster.membership.placement import assignment, moved, owner, restoring_owners


def test_placement_is_the_same_everywhere_and_moves_little() -> None:
    nodes = [f"node-{i}" for i in range(5)]
    assert owner(7, nodes) == owner(7, list(reversed(nodes))) and owner(7, []) is None
    shards = 4096
    before = assignment(shards, nodes)
    counts = Counter(before)
    assert set(counts) == set(nodes) and max(counts.values()) < 1.15 * shards / 5
    after = assignment(shards, [*nodes, "node-new"])
    changed = moved(before, after)
    assert all(after[s] == "node-new" for s in changed)  # only to the newcomer, never between others
    assert abs(len(changed) - shards / 6) < 0.15 * shards / 6  # about 1/N
    gone = assignment(shards, nodes[1:])
    assert set(moved(before, gone)) == {s for s, o in enumerate(before) if o == "node-0"}


def test_a_shard_being_restored_stays_with_its_live_restoring_node() -> None:
    nodes = ["a", "b", "c"]
    plain = assignment(64, nodes)
    shard = next(s for s, o in enumerate(plain) if o == "a")
    pinned = assignment(64, nodes, {shard: "c"})
    assert pinned[shard] == "c"
    assert moved(plain, pinned) == [shard]  # nothing else moves
    # The restoring node is no longer live (dead, stale): the pin counts for nothing.
    assert assignment(64, ["a", "b"], {shard: "c"}) == assignment(64, ["a", "b"])


def test_restoring_claims_the_higher_epoch_wins_and_dead_nodes_claim_nothing() -> None:
    claims = [("b", 3, 4), ("c", 3, 5), ("d", 7, 9), ("a", 1, 2)]
    assert restoring_owners(claims, ["a", "b", "c"]) == {1: "a", 3: "c"}
    assert restoring_owners(claims, ["a", "b"]) == {1: "a", 3: "b"}
    # The same answer whatever order the claims come in (every node agrees).
    assert restoring_owners(reversed(claims), ["a", "b", "c"]) == {1: "a", 3: "c"}
