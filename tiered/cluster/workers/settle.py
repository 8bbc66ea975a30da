"""When a worker may open the node's port: every expected worker live and every shard where placement puts it.

A worker listens on the shared port only once the shards are settled, so a
client never meets a node whose shards are still moving between workers
because its siblings started a moment later (a shard being handed off
answers 503 for that moment). Bounded by the caller: a worker that cannot
settle (a sibling crash-looping) opens the port anyway, and its siblings'
shards are then taken over as for any dead worker.
"""

from __future__ import annotations

from collections.abc import Iterable

from tiered.cluster.membership.placement import assignment
from tiered.cluster.server import ClusterServer

__all__ = ["settled"]


def settled(cluster: ClusterServer, expected: Iterable[str]) -> bool:
    node = cluster.node
    if node is None or node.me is None or node.spec is None:
        return False
    live = set(node.view.live_nodes(cluster.clock.monotonic())) | {cluster.node_id}
    if not set(expected) <= live:
        return False
    serving = node.serving()
    if len(serving) != len(node.holds):
        return False  # some of ours are still fencing or being handed off
    for shard, want in enumerate(assignment(node.spec.shard_count, live)):
        owner = node.owner_of(shard)
        if owner is None or owner[0] != want or (want == cluster.node_id and shard not in serving):
            return False
    return True
