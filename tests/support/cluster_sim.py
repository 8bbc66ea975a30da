"""A simulated world for the cluster protocol: one real time, a monotonic clock per node.

``World.t`` is the one true time (seconds), which only tests move. Each
node reads its own ``NodeClock``: an arbitrary origin and a rate close to 1
(clocks drift), so no two nodes' readings are comparable, exactly as with
real monotonic clocks on different machines. A node frozen by a test keeps
its clock running, like a SIGSTOPped process.

Also: readers of what the store holds (lease histories, manifest chains),
so invariants are checked against the store itself, not the nodes' beliefs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import MemoryCasStore
from tiered.cluster.membership.lease import LeaseBody, decode_lease
from tiered.cluster.membership.manifest import ManifestEntry, decode_entry


@dataclass
class World:
    t: float = 0.0

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.t += seconds


@dataclass
class NodeClock:
    """A node's clock: ``origin + rate * t``. Wall time is derived the same way (never compared)."""

    world: World
    origin: float = 1000.0
    rate: float = 1.0

    def monotonic(self) -> float:
        return self.origin + self.rate * self.world.t

    def now_ms(self) -> int:
        return 1_800_000_000_000 + int(self.world.t * self.rate * 1000)


def nonce_source(rng: random.Random) -> Callable[[], str]:
    """Deterministic nonces, so hypothesis can replay an example exactly."""
    return lambda: f"{rng.getrandbits(64):016x}"


def lease_history(store: MemoryCasStore, shard: int) -> list[LeaseBody]:
    return [decode_lease(data, shard) for data in store.history.get(keys.lease_key(shard), [])]


def chain(store: MemoryCasStore, shard: int) -> list[ManifestEntry]:
    """The shard's manifest entries in the store, in sequence order."""
    prefix = keys.manifest_prefix(shard)
    out = []
    for key in sorted(k for k in store.objects if k.startswith(prefix)):
        seq = keys.seq_of_manifest_key(key)
        assert seq is not None, key
        out.append(decode_entry(store.objects[key].data, shard, seq))
    return out
