"""Placement (rendezvous hashing): the same on every node, and a new node takes about 1/N of the shards."""

from __future__ import annotations

from collections import Counter

from tiered.cluster.membership.placement import assignment, moved, owner


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
