"""Which live node should own each shard: rendezvous (highest-random-weight) hashing. Pure.

Every node scores every (node, shard) pair with the same hash and the
highest score owns the shard. Nothing is stored and nobody coordinates: two
nodes with the same view of who is alive name the same owners. When a node
joins it wins about 1/N of the shards (exactly those where it scores
highest) and no shard moves between the others; when one leaves, only its
shards move, spread over the rest.

Placement only names the *intended* owner. Ownership itself is the lease:
the intended owner acquires a free or dead lease, and a holder that is no
longer intended hands the shard off (flush, then release) so the intended
owner can take it at the next epoch.

One exception keeps restores from being wasted: a live node restoring a
shard (fenced, replaying its chain; it says so in its heartbeat) stays the
intended owner of that shard until the restore ends, whatever else joined
meanwhile. Moving it would throw the restore away and start another one on
the new owner; a shard mid-restore takes no writes either way, so the move
only lengthens the gap. Only the node's death (it is no longer live) ends
the exception. Once it serves, the shard moves by an ordinary handoff.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["assignment", "moved", "owner", "restoring_owners", "score"]


def score(node: str, shard: int) -> int:
    digest = hashlib.sha256(f"{shard}\x00{node}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big")


def owner(shard: int, nodes: Iterable[str]) -> str | None:
    """The intended owner of ``shard`` among ``nodes`` (None when there are none)."""
    best: tuple[int, str] | None = None
    for node in nodes:
        key = (score(node, shard), node)  # ties (2**-64) broken by name, the same everywhere
        if best is None or key > best:
            best = key
    return best[1] if best else None


def assignment(
    shard_count: int, nodes: Iterable[str], restoring: Mapping[int, str] | None = None
) -> list[str | None]:
    """The intended owner of every shard.

    ``restoring``: shard -> the node restoring it (``restoring_owners``). A
    shard whose restoring node is among ``nodes`` (live) stays with it.
    """
    members = sorted(set(nodes))
    pinned = {s: n for s, n in (restoring or {}).items() if n in members}
    return [pinned.get(shard) or owner(shard, members) for shard in range(shard_count)]


def restoring_owners(claims: Iterable[tuple[str, int, int]], nodes: Iterable[str]) -> dict[int, str]:
    """Shard -> the live node restoring it, from ``(node, shard, epoch)`` claims (heartbeats' ``restoring``).

    Claims of nodes not in ``nodes`` (dead, stale) count for nothing. Two live
    claims on one shard can only overlap for a moment (the lower epoch's holder
    lost the lease and drops its claim at its next beat): the higher epoch wins,
    the same on every node.
    """
    live = set(nodes)
    best: dict[int, tuple[int, str]] = {}
    for node, shard, epoch in claims:
        if node in live and (shard not in best or (epoch, node) > best[shard]):
            best[shard] = (epoch, node)
    return {shard: node for shard, (_, node) in sorted(best.items())}


def moved(before: Sequence[str | None], after: Sequence[str | None]) -> list[int]:
    """The shards whose intended owner differs."""
    return [shard for shard, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
