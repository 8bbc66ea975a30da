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
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

__all__ = ["assignment", "moved", "owner", "score"]


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


def assignment(shard_count: int, nodes: Iterable[str]) -> list[str | None]:
    """The intended owner of every shard."""
    members = sorted(set(nodes))
    return [owner(shard, members) for shard in range(shard_count)]


def moved(before: Sequence[str | None], after: Sequence[str | None]) -> list[int]:
    """The shards whose intended owner differs."""
    return [shard for shard, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
