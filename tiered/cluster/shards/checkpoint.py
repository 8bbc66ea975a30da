"""Checkpoint objects, the pure part: folding a shard's many small WAL objects into one, so restores stay short.

Object-store durability ships every group commit as one WAL object, so a
shard's hot files (its journal segments and snapshots, ``wal_index.py``)
are spread over one object per ship until the engine flushes a segment to
the cold tier and deletes it. A new owner must read every one of them: a
shard that took small appends for an hour at 200 ms per ship is ~18,000
objects, minutes of restore. (What is already cold needs no copy: the
journal in those files refers to its cold objects.)

A **checkpoint object** is the live bytes of the index copied, in one
create-only object (``checkpoint_key``), and the ``Checkpoint`` chain entry
that follows names it: every file becomes a few pieces in checkpoint
objects instead of one piece per ship. The entry is the fenced step (it
lands only while this owner holds the shard); the WAL objects it no longer
refers to are garbage from then on, released by that same entry and
deleted after the grace through the ordinary WAL GC
(``wal_lifecycle.py``). A crash at any point leaves either the old index
(the new object unreferenced: garbage for the next owner, of an epoch not
above its own) or the new one (the old objects unreferenced): nothing
acknowledged is lost, nothing is leaked.

**When.** The owner writes one when the *backlog* (the WAL objects, not
checkpoint objects, that some live byte is in, and those bytes) reaches a
bound (``RestoreBound``: ``cluster_checkpoint_max_objects`` objects or
``cluster_checkpoint_max_mib`` MiB), checked after every ship: a busy
shard checkpoints by bytes, a trickle by count, an idle one never. A restore
then reads at most that backlog plus the checkpoint objects.

**What.** Per file, only the tail since its last checkpoint object is
copied, merged with the file's trailing checkpoint layers no more than twice
its size (size-tiered, as an LSM tree merges): layer sizes grow
geometrically toward the file's head, so a file is in O(log n) checkpoint
objects and each byte is copied O(log n) times over its life, not once per
checkpoint. Sealed segments and snapshots are copied once and then left
alone. A file in ``max_layers`` layers is copied whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered.cluster.shards.wal_index import Piece, WalIndex, wal_prefix

__all__ = [
    "Backlog",
    "CheckpointPlan",
    "Copy",
    "RestoreBound",
    "backlog",
    "checkpoint_key",
    "is_checkpoint_object",
    "plan_checkpoint",
]

_MARK = "-ckpt-"
MAX_LAYERS = 16


def checkpoint_key(shard: int, epoch: int, number: int, token: str) -> str:
    """Create-only; the epoch leads, as in a WAL key, so the WAL GC judges it like any WAL object."""
    return f"{wal_prefix(shard)}{epoch:010d}-{token}{_MARK}{number:012d}"


def is_checkpoint_object(key: str) -> bool:
    return _MARK in key.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class RestoreBound:
    """The most a new owner reads besides checkpoint objects: WAL objects, and their live bytes."""

    max_objects: int
    max_bytes: int

    def __post_init__(self) -> None:
        if self.max_objects < 1 or self.max_bytes < 1:
            raise ValueError("a restore bound needs at least one object and one byte")


@dataclass(frozen=True, slots=True)
class Backlog:
    """The WAL objects (not checkpoint objects) some live byte is in, and how many live bytes they hold."""

    objects: int
    bytes: int

    def reaches(self, bound: RestoreBound) -> bool:
        return self.objects >= bound.max_objects or self.bytes >= bound.max_bytes


def backlog(index: WalIndex) -> Backlog:
    keys: set[str] = set()
    size = 0
    for pieces in index.files.values():
        for p in pieces:
            if p.length and not is_checkpoint_object(p.wal):
                keys.add(p.wal)
                size += p.length
    return Backlog(len(keys), size)


@dataclass(frozen=True, slots=True)
class Copy:
    """``length`` bytes of a local file from ``at``, copied to ``wal_at`` in the checkpoint object."""

    file: str
    at: int
    length: int
    wal_at: int


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    key: str
    copies: list[Copy]
    files: dict[str, list[Piece]]  # the index once the checkpoint entry landed

    @property
    def size(self) -> int:
        return sum(c.length for c in self.copies)


def plan_checkpoint(
    index: WalIndex, key: str, *, skip: frozenset[str] = frozenset(), max_layers: int = MAX_LAYERS
) -> CheckpointPlan:
    """What to copy into the checkpoint object ``key``, and the index that then refers to it.

    ``skip``: files left as they are (the shell could not read them: deleted
    since the last ship; the next ship records that).
    """
    files: dict[str, list[Piece]] = {}
    copies: list[Copy] = []
    offset = 0
    for name in sorted(index.files):
        pieces = index.files[name]
        start = None if name in skip else _copy_from(pieces, max_layers)
        size = index.size(name)
        if start is None or start >= size:
            files[name] = list(pieces)
            continue
        kept = [p for p in pieces if p.at + p.length <= start and p.length]
        copies.append(Copy(name, start, size - start, offset))
        files[name] = [*kept, Piece(name, start, size - start, key, offset)]
        offset += size - start
    return CheckpointPlan(key, copies, files)


def _copy_from(pieces: list[Piece], max_layers: int) -> int | None:
    """Where the copy of one file starts (its tail merged with its small trailing layers); None: nothing to copy."""
    live = [p for p in pieces if p.length]
    head = 0
    expected = 0
    while head < len(live) and is_checkpoint_object(live[head].wal) and live[head].at == expected:
        expected = live[head].at + live[head].length
        head += 1
    if head == len(live):
        return None  # wholly in checkpoint objects already (or empty)
    if live[0].at != 0 or any(p.at != q.at + q.length for q, p in zip(live, live[1:], strict=False)):
        return 0  # not one contiguous run from 0 (never shipped that way): copy it whole
    merged = live[-1].at + live[-1].length - expected
    while head > 0 and live[head - 1].length <= 2 * merged:
        head -= 1
        merged += live[head].length
    return 0 if head >= max_layers else live[head].at
