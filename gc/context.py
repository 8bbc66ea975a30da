"""What GC tasks work with: the state, small ports, the store, limits, and one pass's report."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tiered.cold.objects.store import ObjectStore, ObjectStoreError
from tiered.cold.parquet.reader import ColdReader
from tiered.core.clock import Clock
from tiered.core.ports import Committer, PrefixOwner
from tiered.engine.streams.state import StreamState
from tiered.gc.report import GcReport

T = TypeVar("T")


class HotCopies(Protocol):
    async def release_hot_copies(self) -> None: ...


@dataclass
class GcContext:
    state: StreamState
    committer: Committer
    store: ObjectStore
    clock: Clock
    grace_ms: int
    max_objects: int
    reader: ColdReader | None = None
    claim: PrefixOwner | None = None
    hot: HotCopies | None = None
    segments_deleted: Callable[[], int] = lambda: 0
    # Erasure (``tiered.gc.erasure``): objects rewritten per pass; the deadline the report measures against.
    rewrite_max_objects: int = 16
    erasure_deadline_ms: int = 86_400_000
    rewrite_bytes_per_s: int = 0  # pace of rewrites, read plus written (0: unpaced)
    # Keyed compaction (``tiered.gc.compaction``): how long a tombstone stays; streams per pass.
    tombstone_delay_ms: int = 86_400_000
    compaction_max_streams: int = 16


@dataclass
class GcPass:
    """One pass: its time, whether it only reports, whether it reconciles, and what it found."""

    now: int
    dry_run: bool
    reconcile: bool
    report: GcReport = field(default_factory=GcReport)


class GcTask(Protocol):
    name: str

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None: ...


async def prefix_held(ctx: GcContext, report: GcReport, *, force: bool = False) -> bool:
    """Whether this data dir still owns the object-store prefix: nothing is deleted otherwise."""
    if ctx.claim is None:
        report.errors.append("the object-store prefix is not claimed by this data dir: nothing deleted")
        return False
    try:
        held = await ctx.claim.still_held(force=force)
    except ObjectStoreError as exc:
        report.errors.append(f"cannot read the prefix claim: {exc}")
        return False
    if not held:
        report.errors.append("the object-store prefix is claimed by another data dir: nothing deleted")
    return held


AsyncAction = Callable[[], Awaitable[None]]


def in_turn(candidates: list[T], after_uid: int, limit: int, uid: Callable[[T], int]) -> list[T]:
    """Up to ``limit`` of ``candidates`` (sorted by uid), starting after the uid where the previous pass
    stopped and wrapping around: every candidate gets its turn however many there are."""
    later = [c for c in candidates if uid(c) > after_uid]
    return (later + [c for c in candidates if uid(c) <= after_uid])[:limit]
