"""WAL objects and manifest-chain entries no live byte needs, collected by the shard engine's GC runner.

Object-store durability: the shard's ``WalShipper`` (``tiered/cluster/shards/wal.py``)
records releases in its checkpoints; its ``maintain`` is one bounded,
resumable, idempotent GC pass (reconcile when due, delete released objects
past the grace, prune the chain below the durable checkpoint; the lifecycle
and why it is safe: ``tiered/cluster/shards/wal_lifecycle.py``). ``WalGarbage``
is that pass as a task of the engine's ``GcRunner`` (``tiered/gc/runner.py``),
run every ``every_s`` on its own schedule and in every pass asked for, so
every kind of garbage of a shard is collected by one runner, one job.
"""

from __future__ import annotations

from typing import Protocol

from tiered.gc.context import GcContext, GcPass

__all__ = ["WalGarbage", "wal_gc_period_s"]


class Maintained(Protocol):
    async def maintain(self) -> None:
        """One bounded GC pass over the shard's WAL objects and chain (errors logged; the next resumes)."""
        ...


def wal_gc_period_s(ship_interval_s: float, grace_s: float) -> float:
    """A pass every few seconds: often enough that a grace of seconds (tests) is kept to closely."""
    return min(max(1.0, ship_interval_s * 5), max(0.5, grace_s / 4))


class WalGarbage:
    name = "wal_objects"

    def __init__(self, shipper: Maintained, every_s: float) -> None:
        self.shipper = shipper
        self.every_s = every_s

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        if not gc_pass.dry_run:
            await self.shipper.maintain()
