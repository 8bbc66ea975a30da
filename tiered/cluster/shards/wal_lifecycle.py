"""Releasing WAL objects and pruning the manifest chain, the pure part (object-store durability).

The shipper (``wal.py``) records releases in its checkpoints and runs the
deletions and the pruning (``WalShipper.maintain``); the engine's GC runner
runs that, as the ``WalGarbage`` task (``tiered/cluster/gc/wal_gc.py``).

WAL objects go through the same owner-and-grace lifecycle as cold objects
(``gc/cold_objects.py``), with the shard's manifest chain as the journal:

1. **Garbage.** A WAL object is garbage once no live byte of the index (the
   latest checkpoint plus the commits after it) is in it: its segment was
   flushed to Parquet cold objects and deleted, or its snapshot replaced; or
   it was never referenced at all (a ship whose commit was fenced or lost).
   Only objects of the owner's epoch or older are considered: a newer
   owner's objects are not ours to judge. Nothing ever refers to a WAL
   object again once it is unreferenced: each object is named by the one
   commit of the ship that wrote it, and a commit that could still land
   (an older owner's) lands below our fence, so our index already has it.
2. **Released.** The owner records the release in its next ``Checkpoint``
   entry (``released``: key -> ms) *before* any delete. A checkpoint carries
   every release not yet deleted, so the latest checkpoint alone says what
   is pending, and a new owner (any later epoch) finishes them: the objects
   are immutable and referenced only through the chain.
3. **Deleted** after ``grace`` counted on the deleting process's own clock
   from when it learned of the release (its checkpoint, or its restore of an
   older owner's): no two clocks are compared. Deletes are idempotent (a
   missing object is fine), bounded per pass, and a crash anywhere resumes:
   the next owner re-reads the releases and deletes them again.

Chain entries strictly below the latest *durable* checkpoint are pruned
(``plan_prune``), except fences. Why that keeps positions create-only:
an older writer (epoch z) can only ever create at (a) its next position,
which is the position right after its last landed entry, i.e. the fence of
the epoch after z, which is kept, so it reads a higher epoch there and
stops; or (b) a retry of its own pending entry (same bytes) that had landed,
which may recreate that very entry below the checkpoint. (b) is harmless:
its content was already in the chain below every later fence, so every
later checkpoint includes it, and readers start from the latest checkpoint
(the chain's tail, never pruned). ``check_pruned_chain`` accepts such a
stray below the tail and the next prune deletes it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tiered.cluster.membership.manifest import ChainSummary, EntryKind, ManifestEntry, check_chain
from tiered.cluster.shards.wal_index import WalIndex, wal_epoch
from tiered.core.errors import ErrorCode, TieredError

__all__ = [
    "adopt_releases",
    "check_pruned_chain",
    "due_deletions",
    "plan_prune",
    "plan_releases",
    "prunable",
]


def plan_releases(
    index: WalIndex,
    listed: Iterable[str],
    epoch: int,
    pending: Mapping[str, int],
    now_ms: int,
    limit: int,
) -> dict[str, int]:
    """The releases the next checkpoint records: those still pending, plus up to ``limit`` new garbage.

    ``listed`` is a listing of the shard's WAL prefix. Keys of a newer epoch,
    keys some live byte is in, and keys already pending are never added.
    """
    live = index.referenced()
    out = dict(pending)
    added = 0
    for key in sorted(listed):
        if added >= limit:
            break
        key_epoch = wal_epoch(key)
        if key_epoch is None or key_epoch > epoch or key in live or key in out:
            continue
        out[key] = now_ms
        added += 1
    return out


def adopt_releases(recorded: Mapping[str, int], now_ms: int) -> dict[str, int]:
    """Releases read from the chain (another process's clock): the grace restarts on ours."""
    return dict.fromkeys(recorded, now_ms)


def due_deletions(pending: Mapping[str, int], now_ms: int, grace_ms: int, limit: int) -> list[str]:
    """Released keys whose grace has passed, oldest release first, at most ``limit``."""
    due = sorted((at, key) for key, at in pending.items() if at + grace_ms <= now_ms)
    return [key for _, key in due[:limit]]


def plan_prune(positions: Iterable[int], checkpoint_seq: int, kept: set[int], limit: int) -> list[int]:
    """Chain positions to look at for pruning: strictly below the durable checkpoint, not known fences."""
    return sorted(p for p in positions if p < checkpoint_seq and p not in kept)[:limit]


def prunable(entry: ManifestEntry, checkpoint_seq: int) -> bool:
    """A commit entry strictly below the checkpoint; never a fence (older writers' next position)."""
    return entry.seq < checkpoint_seq and entry.kind is EntryKind.COMMIT


def check_pruned_chain(entries: list[ManifestEntry]) -> ChainSummary:
    """``check_chain`` for a chain whose prefix was pruned (entries in position order).

    The tail (the longest run of consecutive positions ending at the latest
    entry) must be a valid chain on its own. Below it only kept fences and
    strays may remain: positions rising, epochs never decreasing, at most
    one fence per epoch, and no epoch above the tail's first.
    """
    if not entries:
        return check_chain(entries)
    start = len(entries) - 1
    while start > 0 and entries[start - 1].seq == entries[start].seq - 1:
        start -= 1
    summary = check_chain(entries[start:])
    fences = dict(summary.fences)
    below = entries[:start]
    for prev, entry in zip(below, entries[1 : start + 1], strict=True):
        if entry.seq <= prev.seq or entry.epoch < prev.epoch:
            raise _broken(
                entry, f"position {entry.seq} (epoch {entry.epoch}) after {prev.seq} (epoch {prev.epoch})"
            )
    for entry in below:
        if entry.kind is EntryKind.FENCE and fences.setdefault(entry.epoch, entry.seq) != entry.seq:
            raise _broken(entry, f"a second fence in epoch {entry.epoch}")
    return ChainSummary(summary.latest_seq, summary.latest_epoch, fences)


def _broken(entry: ManifestEntry, problem: str) -> TieredError:
    return TieredError(
        ErrorCode.DATA_DAMAGED,
        f"shard {entry.shard}: pruned manifest chain broken at position {entry.seq}: {problem}",
        shard=entry.shard,
        seq=entry.seq,
    )
