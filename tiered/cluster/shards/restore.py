"""Restoring a shard on a new owner: its chain back to the latest checkpoint, then its objects, fetched in parallel.

Runs after the new owner's fence and before its engine starts (``ShardHost.serve``).
Both reads are bounded-concurrent, because a takeover's gap is mostly this:

1. **The chain tail.** Entries are read from the tail back, ``concurrency``
   at a time, until a ``Checkpoint`` entry (at most ``concurrency - 1``
   entries below it are read for nothing). Checkpoints land at least every
   ``cluster_checkpoint_max_objects`` ships, so this is a few rounds.
2. **The objects.** Every live piece's object (checkpoint objects first, as
   the index lists them, then WAL objects), fetched by ``concurrency``
   workers in index order and written to its files as it arrives
   (``pwrite`` at the piece's offset: pieces never overlap, so arrival order
   does not matter), then dropped: memory holds at most ``concurrency``
   objects. A piece reaching past its object's end is ``DATA_DAMAGED``.

Then every file is cut to its size, and the engine's ordinary recovery
replays what was shipped (a torn last batch is cut, as after a crash). The
time taken is logged per shard and kept (``RestoreReport``) for
``/metrics`` (``tiered_cluster_restore_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import CasStore
from tiered.cluster.membership.manifest import EntryKind, decode_entry
from tiered.cluster.shards.checkpoint import is_checkpoint_object
from tiered.cluster.shards.wal_index import Checkpoint, Piece, WalIndex, decode_payload
from tiered.cold.objects.store import ObjectStore
from tiered.core.clock import Clock, SystemClock
from tiered.core.errors import ErrorCode, TieredError

__all__ = ["MIRRORED", "RestoreReport", "restore_shard"]

log = logging.getLogger(__name__)

MIRRORED = ("hot", "snapshots")


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """One restore: how long it took, and what it read."""

    shard: int
    seconds: float
    entries: int  # chain entries read (the checkpoint and what followed it)
    objects: int  # objects fetched
    checkpoint_objects: int  # of which checkpoint objects
    bytes: int  # bytes written to the shard's files
    files: int


async def restore_shard(
    store: ObjectStore,
    cas: CasStore,
    shard: int,
    directory: Path,
    *,
    concurrency: int = 16,
    clock: Clock | None = None,
) -> tuple[WalIndex, RestoreReport]:
    """Rebuild the shard's files under ``directory`` from its chain and objects; the index, and what it took."""
    clock = clock or SystemClock()
    started = clock.monotonic()
    tail, checkpoint_seq = await _chain_tail(cas, shard, max(1, concurrency))
    index = WalIndex()
    for data in reversed(tail):
        index.apply(decode_payload(data, shard))
    index.checkpoint_seq = checkpoint_seq
    for name in MIRRORED:
        shutil.rmtree(directory / name, ignore_errors=True)
    by_object: dict[str, list[Piece]] = {}
    for name in sorted(index.files):
        for piece in index.files[name]:
            if piece.length:  # a cut has no bytes (its object may never have been written, or be released)
                by_object.setdefault(piece.wal, []).append(piece)
    written = await _write_files(store, shard, directory, index, by_object, max(1, concurrency))
    report = RestoreReport(
        shard,
        clock.monotonic() - started,
        len(tail),
        len(by_object),
        sum(1 for key in by_object if is_checkpoint_object(key)),
        written,
        len(index.files),
    )
    log.info(
        "shard %d: restored in %.3f s: %d files (%d bytes) from %d objects (%d checkpoint objects) and %d "
        "chain entries",
        shard,
        report.seconds,
        report.files,
        report.bytes,
        report.objects,
        report.checkpoint_objects,
        report.entries,
    )
    return index, report


async def _chain_tail(cas: CasStore, shard: int, concurrency: int) -> tuple[list[bytes], int | None]:
    """The commit payloads from the tail back to the latest checkpoint (newest first), and its position."""
    listed = await cas.list(keys.manifest_prefix(shard))
    positions = [(seq, item.key) for item in reversed(listed) if (seq := keys.seq_of_manifest_key(item.key))]
    tail: list[bytes] = []
    for start in range(0, len(positions), concurrency):
        batch = positions[start : start + concurrency]
        found = await asyncio.gather(*(cas.get(key) for _, key in batch))
        for (seq, _), item in zip(batch, found, strict=True):
            if item is None:
                continue  # pruned meanwhile (below a newer checkpoint than any we need)
            entry = decode_entry(item.data, shard, seq)
            if entry.kind is not EntryKind.COMMIT or not entry.payload:
                continue
            tail.append(entry.payload)
            if isinstance(decode_payload(entry.payload, shard), Checkpoint):
                return tail, seq
    return tail, None


async def _write_files(
    store: ObjectStore,
    shard: int,
    directory: Path,
    index: WalIndex,
    by_object: dict[str, list[Piece]],
    concurrency: int,
) -> int:
    fds: dict[str, int] = {}
    try:
        for name in sorted(index.files):
            path = directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            fds[name] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        queue = list(by_object.items())
        queue.reverse()  # popped from the end: index order
        written = 0

        async def worker() -> None:
            nonlocal written
            while queue:
                key, pieces = queue.pop()
                data = await store.get(key)
                for piece in pieces:
                    chunk = data[piece.wal_at : piece.wal_at + piece.length]
                    if len(chunk) != piece.length:
                        raise TieredError(
                            ErrorCode.DATA_DAMAGED,
                            f"shard {shard}: {key} holds {len(data)} bytes, a piece of {piece.file} needs "
                            f"{piece.wal_at + piece.length}",
                            shard=shard,
                        )
                    os.pwrite(fds[piece.file], chunk, piece.at)
                    written += piece.length

        workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(queue)))]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        for name, fd in fds.items():
            os.ftruncate(fd, index.size(name))
        return written
    finally:
        for fd in fds.values():
            os.close(fd)
