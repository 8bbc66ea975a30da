"""Each shard's manifest chain, and the fence a new owner writes into it. Pure.

A shard's history is a chain of create-only objects, one per sequence number
(``manifests/<shard>/<seq>.json``); each entry names the epoch and the
writer (node, incarnation) that wrote it. Only the lease holder writes, and
always at the next sequence number with ``If-None-Match: *``, so two writers
can never both land an entry at one position.

After winning a lease at epoch e, the new owner writes a *fence*: an entry of
epoch e at the sequence number after the latest it finds, before it
acknowledges anything. A previous owner (epoch < e) that still runs then
finds its next position taken the moment it tries to write (every position
up to the fence is occupied, and its next position is at most the fence's),
reads the entry there, sees the higher epoch and stops serving the shard at
once. Whatever it landed before the fence is in the chain below the fence, so
the new owner, which replays the chain up to its fence, has it: in
object-store durability mode nothing acknowledged is lost.

A write whose answer was lost is settled by reading the position back: our
nonce there means it landed; nothing there means it may still land, so the
same entry (same bytes) is written again before anything else. ``check_chain``
states what every valid chain looks like; the property tests hold the
protocol to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from tiered.core.errors import ErrorCode, TieredError

__all__ = [
    "ChainSummary",
    "EntryKind",
    "ManifestEntry",
    "ManifestWriter",
    "WriteResult",
    "check_chain",
    "decode_entry",
    "encode_entry",
    "fenced_error",
]


class EntryKind(StrEnum):
    FENCE = "fence"  # the first entry of an epoch: everything below belongs to earlier owners
    COMMIT = "commit"  # a batch made durable by the owner (phase 2: WAL objects, cold objects)


class ManifestEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    shard: int
    seq: int
    epoch: int
    kind: EntryKind
    writer: str
    incarnation: int
    nonce: str
    payload: bytes = b""


def encode_entry(entry: ManifestEntry) -> bytes:
    return msgspec.json.encode(entry)


def decode_entry(data: bytes, shard: int, seq: int) -> ManifestEntry:
    try:
        entry = msgspec.json.decode(data, type=ManifestEntry)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TieredError(
            ErrorCode.DATA_DAMAGED,
            f"manifest {seq} of shard {shard} is unreadable: {exc}",
            shard=shard,
            seq=seq,
        ) from None
    if (entry.shard, entry.seq) != (shard, seq) or entry.epoch < 1:
        raise TieredError(
            ErrorCode.DATA_DAMAGED,
            f"manifest object {seq} of shard {shard} holds entry {entry.seq} of shard {entry.shard}, "
            f"epoch {entry.epoch}",
            shard=shard,
            seq=seq,
        )
    return entry


def fenced_error(shard: int, epoch: int, found: ManifestEntry, reason: str = "fenced") -> TieredError:
    """This node must stop serving ``shard`` now (the HTTP layer asks the client to retry later)."""
    return TieredError(
        ErrorCode.SHARD_FENCED,
        f"shard {shard}: this node's epoch {epoch} was superseded by epoch {found.epoch} of node "
        f"{found.writer} (manifest {found.seq}); it stopped serving the shard",
        shard=shard,
        epoch=found.epoch,
        owner=found.writer,
        owner_incarnation=found.incarnation,
        reason=reason,
        retry_after_s=1,
    )


class WriteResult(StrEnum):
    WRITTEN = "written"  # the entry is in the chain (maybe from an earlier attempt)
    RETRY = "retry"  # an older owner's entry took the position while we fenced: fence again above it


@dataclass
class ManifestWriter:
    """The holder's side of one shard's chain at one epoch.

    ``plan_fence`` → write → ``written``/``conflict``; then ``plan_commit``
    for each batch. ``pending`` is an entry whose outcome is unknown; it is
    written again, unchanged, before anything else.
    """

    shard: int
    epoch: int
    writer: str
    incarnation: int
    fence_seq: int | None = None
    next_seq: int = 0
    pending: ManifestEntry | None = field(default=None, repr=False)

    @property
    def fenced(self) -> bool:
        return self.fence_seq is not None

    def _mine(self, entry: ManifestEntry) -> bool:
        return (entry.epoch, entry.writer, entry.incarnation) == (self.epoch, self.writer, self.incarnation)

    def plan_fence(self, latest: ManifestEntry | None, nonce: str) -> ManifestEntry | None:
        """The fence to write above ``latest`` (the chain's last entry), or None if it is already ours."""
        if self.pending is not None:
            return self.pending
        if latest is not None:
            if latest.epoch > self.epoch:
                raise fenced_error(self.shard, self.epoch, latest)
            if latest.epoch == self.epoch:
                if not self._mine(latest):
                    raise fenced_error(self.shard, self.epoch, latest, reason="two writers in one epoch")
                # Our fence landed earlier (its answer was lost): continue above it.
                self.fence_seq = self.fence_seq or latest.seq
                self.next_seq = latest.seq + 1
                return None
        seq = latest.seq + 1 if latest else 1
        self.pending = ManifestEntry(
            self.shard, seq, self.epoch, EntryKind.FENCE, self.writer, self.incarnation, nonce
        )
        return self.pending

    def plan_commit(self, payload: bytes, nonce: str) -> ManifestEntry:
        """The next entry to write; an unresolved earlier one first (the caller retries then)."""
        if not self.fenced:
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {self.shard} is not fenced yet",
                shard=self.shard,
                retry_after_s=1,
            )
        if self.pending is not None:
            return self.pending
        self.pending = ManifestEntry(
            self.shard,
            self.next_seq,
            self.epoch,
            EntryKind.COMMIT,
            self.writer,
            self.incarnation,
            nonce,
            payload,
        )
        return self.pending

    def written(self, entry: ManifestEntry) -> None:
        """``entry`` is in the chain."""
        if entry.kind is EntryKind.FENCE:
            self.fence_seq = entry.seq
        self.next_seq = entry.seq + 1
        if self.pending == entry:
            self.pending = None

    def conflict(self, entry: ManifestEntry, found: ManifestEntry) -> WriteResult:
        """``entry``'s position holds ``found``. Raises ``SHARD_FENCED`` when we must stop."""
        if found.nonce == entry.nonce:
            self.written(entry)
            return WriteResult.WRITTEN
        if found.epoch > self.epoch:
            self.pending = None
            raise fenced_error(self.shard, self.epoch, found)
        if not self.fenced and found.epoch < self.epoch:
            # An older owner wrote here after we listed: it is below our fence-to-be.
            self.pending = None
            return WriteResult.RETRY
        self.pending = None
        raise fenced_error(self.shard, self.epoch, found, reason="unexpected entry at our position")

    def vanished(self, entry: ManifestEntry) -> None:
        """The outcome of ``entry`` is unknown and it is not there (yet): it stays pending."""
        self.pending = entry


@dataclass(frozen=True, slots=True)
class ChainSummary:
    latest_seq: int
    latest_epoch: int
    fences: dict[int, int]  # epoch -> seq of its fence


def check_chain(entries: list[ManifestEntry]) -> ChainSummary:
    """Validate a chain (in sequence order): what every replay may rely on.

    Positions are contiguous; epochs never decrease; an epoch begins with its
    fence and with nothing else; each epoch has one writer (node and
    incarnation). Raises ``DATA_DAMAGED`` naming the first violation.
    """
    fences: dict[int, int] = {}
    writers: dict[int, tuple[str, int]] = {}
    prev: ManifestEntry | None = None
    for entry in entries:
        problem = ""
        starts_epoch = prev is None or entry.epoch > prev.epoch
        if prev is not None and entry.seq != prev.seq + 1:
            problem = f"position {entry.seq} follows {prev.seq}"
        elif prev is not None and entry.epoch < prev.epoch:
            problem = f"epoch {entry.epoch} after epoch {prev.epoch}"
        elif starts_epoch and entry.kind is not EntryKind.FENCE and (prev is not None or entry.seq == 1):
            problem = f"epoch {entry.epoch} begins with a {entry.kind} entry, not its fence"
        elif not starts_epoch and entry.kind is EntryKind.FENCE:
            problem = f"a second fence in epoch {entry.epoch}"
        elif writers.setdefault(entry.epoch, (entry.writer, entry.incarnation)) != (
            entry.writer,
            entry.incarnation,
        ):
            problem = f"two writers in epoch {entry.epoch}: {writers[entry.epoch]} and {entry.writer}"
        if problem:
            raise TieredError(
                ErrorCode.DATA_DAMAGED,
                f"shard {entry.shard}: manifest chain broken at position {entry.seq}: {problem}",
                shard=entry.shard,
                seq=entry.seq,
            )
        if entry.kind is EntryKind.FENCE:
            fences[entry.epoch] = entry.seq
        prev = entry
    return ChainSummary(prev.seq if prev else 0, prev.epoch if prev else 0, fences)
