"""Object-store durability, the shell: ship a shard's files to WAL objects; restore them on a new owner.

``WalShipper`` runs on the shard's owner: its ``run`` loop is a job of the
shard engine's supervisor, its ``maintain`` a task of the engine's GC runner
(``tiered/cluster/gc/wal_gc.py``); ``ShardHost`` builds it before the engine. A write is acknowledged only after
``durable()`` returned: a ship that *started* after the write was in the
local files has put one create-only WAL object and landed its ``commit``
entry in the manifest chain. Writes arriving within one interval share a
ship (group commit). The commit is the fenced step: an owner that lost the
shard finds a higher epoch at its next chain position and stops, so a
zombie's WAL object is never referenced and nothing it wrote is acknowledged.

``restore`` runs on a new owner after its fence and before its engine starts:
it reads the chain back to the latest checkpoint, rebuilds the index and
writes every live file from the WAL objects, so the engine's ordinary
recovery replays exactly what was shipped (a torn last batch is cut, as after
a crash). The local disk is a cache.

Ships scan the files (``hot/`` in segment order, then ``snapshots/``): a
segment that vanished was flushed to the cold tier and deleted by the engine
(its flush record was written before the deletion, so it is in a later
segment that the same scan reads afterwards). Every ``checkpoint_every``
ships, after deletions, and when a reconciliation listing finds garbage, a
checkpoint records the whole index and releases the WAL objects of this epoch
or older that no live byte is in; they are deleted ``gc_grace_s`` later, and
chain entries below the checkpoint are pruned (fences kept): ``tiered/cluster/shards/wal_lifecycle.py``
has the lifecycle and why it is safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path
from typing import Protocol

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import CasError, CasStore
from tiered.cluster.membership.manifest import ManifestEntry, decode_entry
from tiered.cluster.shards.checkpoint import (
    CheckpointPlan,
    RestoreBound,
    backlog,
    checkpoint_key,
    plan_checkpoint,
)
from tiered.cluster.shards.restore import restore_shard
from tiered.cluster.shards.wal_index import (
    Piece,
    WalCommit,
    WalIndex,
    encode_payload,
    wal_key,
    wal_prefix,
)
from tiered.cluster.shards.wal_lifecycle import (
    adopt_releases,
    due_deletions,
    plan_prune,
    plan_releases,
    prunable,
)
from tiered.cold.objects.store import ObjectNotFound, ObjectStore, ObjectStoreError
from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.hot.segment import parse_segment_name

__all__ = ["Chain", "WalShipper", "restore"]

log = logging.getLogger(__name__)


def _scan(directory: Path) -> list[tuple[str, Path]]:
    """The mirrored files, segments in log order first, then snapshots."""
    out: list[tuple[str, Path]] = []
    hot = directory / "hot"
    if hot.is_dir():
        segs = sorted(
            (sid, name) for name in os.listdir(hot) if (sid := parse_segment_name(name)) is not None
        )
        out += [(f"hot/{name}", hot / name) for _, name in segs]
    snaps = directory / "snapshots"
    if snaps.is_dir():
        out += [
            (f"snapshots/{name}", snaps / name)
            for name in sorted(os.listdir(snaps))
            if name.startswith("snapshot-") and name.endswith(".bin")
        ]
    return out


async def restore(
    store: ObjectStore, cas: CasStore, shard: int, directory: Path, *, concurrency: int = 16
) -> WalIndex:
    """Rebuild the shard's files under ``directory`` from its chain (latest checkpoint on) and objects.

    Parallel and streaming: ``tiered/cluster/shards/restore.py`` (``restore_shard`` also says what it took).
    """
    index, _ = await restore_shard(store, cas, shard, directory, concurrency=concurrency)
    return index


class Chain(Protocol):
    """The shards' manifest chains, as the node (``ClusterNode``) writes them: fenced commits, on ``store``."""

    store: CasStore

    async def commit(self, shard: int, payload: bytes) -> ManifestEntry:
        """Append ``payload`` to the shard's chain (raises once another epoch holds the shard)."""
        ...


class WalShipper:
    def __init__(
        self,
        shard: int,
        epoch: int,
        directory: Path,
        store: ObjectStore,
        cluster: Chain,
        index: WalIndex,
        clock: Clock,
        *,
        interval_s: float,
        checkpoint_every: int = 64,
        gc_grace_s: float = 300.0,
        gc_limit: int = 1000,
        reconcile_interval_s: float = 3600.0,
        restore_bound: RestoreBound | None = None,
    ) -> None:
        """``restore_bound``: when to write a checkpoint object (``checkpoint.py``); ``checkpoint_every``: ships
        between checkpoint entries (the chain a restore reads back)."""
        self.shard = shard
        self.epoch = epoch
        self.directory = directory
        self.store = store
        self.cluster = cluster
        self.index = index
        self.clock = clock
        self.interval_s = interval_s
        self.checkpoint_every = checkpoint_every
        self.shipped: dict[str, int] = {name: index.size(name) for name in index.files}
        self.ships = 0
        self.bytes_shipped = 0
        self._number = 0
        self._token = secrets.token_hex(4)
        self._since_checkpoint = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self._cut: set[str] = set()  # files recovery cut, their cut not yet shipped (``note_recovery``)
        self._last_start = -1e18
        self.closed = False
        # The GC of WAL objects and chain entries (``tiered/cluster/shards/wal_lifecycle.py``).
        self.gc_grace_ms = int(gc_grace_s * 1000)
        self.gc_limit = gc_limit
        self.reconcile_interval_s = reconcile_interval_s
        self.released = adopt_releases(index.released, clock.now_ms())  # pending: key -> ms on our clock
        self.checkpoint_seq = index.checkpoint_seq  # the latest durable checkpoint's position
        self.wal_deleted = 0
        self.entries_pruned = 0
        self._pruned_below = 0  # every entry below this position but fences is gone (as far as we know)
        self._kept: set[int] = set()  # positions below the checkpoint holding fences
        self._commits: set[int] = set()  # positions of our own commit entries (no read needed to prune them)
        self._last_reconcile = clock.monotonic()
        # Checkpoint objects (``tiered/cluster/shards/checkpoint.py``): the restore set stays under the bound.
        self.restore_bound = restore_bound or RestoreBound(16, 32 * 1024 * 1024)
        # Objects this owner knows were referenced (restored, or named by its landed commits): a checkpoint
        # releases those it no longer refers to without listing the prefix (the reconciliation lists).
        self._known: set[str] = index.referenced()
        self.checkpoint_objects = 0
        self.checkpoint_bytes = 0

    def renew(self, epoch: int) -> None:
        """The lease was renewed at ``epoch`` (the same engine goes on serving the shard)."""
        self.epoch = epoch

    async def durable(self) -> None:
        """Return once a ship that started after this call is in the store and the chain."""
        if self.closed:
            raise self._gone("this node no longer serves the shard")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._kick.set()
        await future

    def note_recovery(self) -> None:
        """Take in what the engine's recovery did to the restored files, before it takes any write.

        Shipping compares sizes: a file shorter than shipped is a cut (recovery cut a
        torn tail). A cut followed by appends past the old size before the next ship
        would look like growth, and the rewritten bytes below the old size would never
        reach the store (the next owner would restore the torn bytes). So the host
        calls this between the engine's start and its first write: the next ship
        writes each cut file from its cut (a piece also cuts the image there).
        """
        for name, path in _scan(self.directory):
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue
            done = self.shipped.get(name)
            if done is not None and size < done:
                self.shipped[name] = size
                self._cut.add(name)

    async def flush(self) -> None:
        """Ship now, then checkpoint: before a handoff, so the next owner restores quickly."""
        async with self._lock:
            await self._ship()
            await self._checkpoint(listing=True)  # the next owner starts with no garbage left unreleased

    def close(self, reason: str) -> None:
        """Refuse new waits and fail the writes waiting (the shard left this node; its loop ends with its engine)."""
        self.closed = True
        self._fail(self._waiting, self._gone(reason))
        self._waiting = []

    def _gone(self, why: str) -> TieredError:
        return TieredError(
            ErrorCode.SHARD_NOT_OWNED, f"shard {self.shard}: {why}", shard=self.shard, retry_after_s=1
        )

    @staticmethod
    def _fail(waiting: list[asyncio.Future[None]], exc: BaseException) -> None:
        for future in waiting:
            if not future.done():
                future.set_exception(exc)

    async def run(self) -> None:
        """Ship until cancelled: writes arriving within one interval share a ship (group commit)."""
        idle = max(
            1.0, self.interval_s * 5
        )  # background records (flushes, snapshots) ship at least this often
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), idle)
            except TimeoutError:
                pass
            self._kick.clear()
            if self.closed:
                continue  # the shard left this node: nothing more is shipped (the engine stops this loop)
            wait = self._last_start + self.interval_s - self.clock.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # group commit: everything that arrives meanwhile joins this ship
            waiting, self._waiting = self._waiting, []
            try:
                self._last_start = self.clock.monotonic()
                await self.ship_once()
            except TieredError as exc:
                self._fail(waiting, exc)
                if exc.code is not ErrorCode.SHARD_FENCED:
                    continue
            except Exception as exc:  # the store, the disk, or a bug: fail these writes, keep shipping
                log.warning("shard %d: WAL ship failed: %r", self.shard, exc)
                self._fail(
                    waiting,
                    TieredError(
                        ErrorCode.STORE_UNAVAILABLE,
                        f"shard {self.shard}: the WAL object could not be written; not acknowledged",
                        shard=self.shard,
                        retry_after_s=1,
                    ),
                )
                continue
            for future in waiting:
                if not future.done():
                    future.set_result(None)

    async def ship_once(self) -> None:
        """One ship, then a checkpoint if one is due (ships since the last, or the restore set at its bound)."""
        async with self._lock:
            await self._ship()
            if self._since_checkpoint >= self.checkpoint_every or self._backlog_full():
                await self._checkpoint(force=True)

    def _changes(self) -> tuple[list[tuple[str, int, bytes]], list[str]]:
        writes: list[tuple[str, int, bytes]] = []
        present: set[str] = set()
        for name, path in _scan(self.directory):
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    done = self.shipped.get(name)
                    if done is None or size > done:
                        start = 0 if done is None else done
                        f.seek(start)
                        writes.append((name, start, f.read(size - start)))
                    elif size < done:  # recovery cut a torn tail: cut the image too
                        writes.append((name, size, b""))
                    elif name in self._cut:  # cut at recovery (``note_recovery``), not grown since
                        writes.append((name, size, b""))
            except FileNotFoundError:
                continue  # deleted while scanning: recorded below
            present.add(name)
        deleted = sorted(name for name in self.shipped if name not in present)
        return writes, deleted

    async def _ship(self) -> None:
        writes, deleted = self._changes()
        if not writes and not deleted:
            return
        key = wal_key(self.shard, self.epoch, self._next_number(), self._token)
        data = b"".join(chunk for _, _, chunk in writes)
        pieces: list[Piece] = []
        at = 0
        for name, start, chunk in writes:
            pieces.append(Piece(name, start, len(chunk), key, at))
            at += len(chunk)
        if data:
            await self.store.put(key, data, if_none_match=True)
        commit = WalCommit(pieces, deleted)
        entry = await self.cluster.commit(self.shard, encode_payload(commit))  # fenced: raises if moved on
        self._commits.add(entry.seq)
        if data:
            self._known.add(key)
        self.index.apply(commit)
        for name, start, chunk in writes:
            self.shipped[name] = start + len(chunk)
            self._cut.discard(name)
        for name in deleted:
            self.shipped.pop(name, None)
            self._cut.discard(name)
        self.ships += 1
        self.bytes_shipped += len(data)
        self._since_checkpoint += 1
        if deleted:
            self._since_checkpoint = self.checkpoint_every

    def _next_number(self) -> int:
        self._number += 1
        return self._number

    def _backlog_full(self) -> bool:
        return backlog(self.index).reaches(self.restore_bound)

    async def _checkpoint(self, *, force: bool = False, listing: bool = False) -> None:
        """Record the whole index and the pending releases (new garbage released here, before any delete).

        With the backlog at its bound, the live bytes go into a checkpoint object first and the entry
        names it: the WAL objects it replaces are garbage from the moment the entry lands (and are
        released by it). A crash before the entry leaves the object unreferenced: garbage, not loss.
        ``listing``: look for garbage in a listing of the prefix too (objects no landed commit of ours
        named: an older owner's, a failed ship's); otherwise only the objects known referenced before.
        """
        if self._since_checkpoint == 0 and not force:
            return
        plan = await self._checkpoint_object() if self._backlog_full() else None
        target = WalIndex(plan.files) if plan is not None else self.index
        candidates = set(self._known)
        if listing:
            try:
                candidates.update([info.key async for info in self.store.list(wal_prefix(self.shard))])
            except ObjectStoreError as exc:
                log.info("shard %d: listing WAL objects failed (%s); releasing later", self.shard, exc)
        released = plan_releases(
            target, candidates, self.epoch, self.released, self.clock.now_ms(), self.gc_limit
        )
        entry = await self.cluster.commit(self.shard, encode_payload(target.checkpoint(released)))
        self._commits.add(entry.seq)
        self._known.difference_update(released)
        if plan is not None:
            self.index.files = {k: list(v) for k, v in plan.files.items()}
            self._known.add(plan.key)
            self.checkpoint_objects += 1
            self.checkpoint_bytes += plan.size
        fresh = len(released) - len(self.released)
        self.released = released
        self.checkpoint_seq = entry.seq
        self._since_checkpoint = 0
        if fresh or plan is not None:
            log.info(
                "shard %d: checkpoint %d%s; released %d WAL objects",
                self.shard,
                entry.seq,
                f" names {plan.key} ({plan.size} bytes)" if plan is not None else "",
                fresh,
            )

    async def _checkpoint_object(self) -> CheckpointPlan | None:
        """Copy the live bytes the plan says from the local files into one create-only object (None: nothing).

        A file gone since the last ship (flushed and deleted by the engine) is left as it is: the next
        ship records its deletion.
        """
        key = checkpoint_key(self.shard, self.epoch, self._next_number(), self._token)
        skip: frozenset[str] = frozenset()
        for _ in range(3):
            plan = plan_checkpoint(self.index, key, skip=skip)
            if not plan.copies:
                return None
            data, missing = await asyncio.to_thread(self._read_copies, plan)
            if not missing:
                await self.store.put(key, data, if_none_match=True)
                return plan
            skip |= missing
        return None

    def _read_copies(self, plan: CheckpointPlan) -> tuple[bytes, frozenset[str]]:
        parts: list[bytes] = []
        missing: set[str] = set()
        for copy in plan.copies:
            try:
                with open(self.directory / copy.file, "rb") as f:
                    f.seek(copy.at)
                    chunk = f.read(copy.length)
            except FileNotFoundError:
                chunk = b""
            if len(chunk) != copy.length:
                missing.add(copy.file)
            parts.append(chunk)
        return b"".join(parts), frozenset(missing)

    async def maintain(self) -> None:
        """One bounded GC pass: reconcile when due, delete released WAL objects past grace, prune the chain.

        Errors leave everything for the next pass (each step is idempotent). Nothing once the
        shard left this node (its next owner finishes the releases).
        """
        if self.closed:
            return
        try:
            if self.clock.monotonic() - self._last_reconcile >= self.reconcile_interval_s:
                self._last_reconcile = self.clock.monotonic()
                async with self._lock:
                    if await self._has_garbage():
                        await self._checkpoint(force=True, listing=True)
            await self._delete_due()
            await self._prune()
        except TieredError as exc:
            log.info("shard %d: WAL GC pass stopped: %s", self.shard, exc.message)
        except (ObjectStoreError, CasError) as exc:
            log.info("shard %d: WAL GC pass failed (%r); the next one retries", self.shard, exc)

    async def _has_garbage(self) -> bool:
        listed = [info.key async for info in self.store.list(wal_prefix(self.shard))]
        return len(plan_releases(self.index, listed, self.epoch, self.released, 0, 1)) > len(self.released)

    async def _delete_due(self) -> None:
        for key in due_deletions(self.released, self.clock.now_ms(), self.gc_grace_ms, self.gc_limit):
            try:
                await self.store.delete(key)
            except ObjectNotFound:
                pass  # deleted before (a crash, or an earlier owner): idempotent
            self.released.pop(key, None)
            self.wal_deleted += 1

    async def _prune(self) -> None:
        """Delete chain entries strictly below the latest durable checkpoint, fences kept (bounded)."""
        checkpoint = self.checkpoint_seq
        if checkpoint is None or checkpoint <= self._pruned_below:
            return
        cas = self.cluster.store
        prefix = keys.manifest_prefix(self.shard)
        positions = [seq for item in await cas.list(prefix) if (seq := keys.seq_of_manifest_key(item.key))]
        todo = plan_prune(positions, checkpoint, self._kept, self.gc_limit)
        for seq in todo:
            if seq not in self._commits:  # an older owner's: read it (a fence is kept)
                found = await cas.get(keys.manifest_key(self.shard, seq))
                if found is None:
                    continue
                if not prunable(decode_entry(found.data, self.shard, seq), checkpoint):
                    self._kept.add(seq)
                    continue
            await cas.delete(keys.manifest_key(self.shard, seq))
            self._commits.discard(seq)
            self.entries_pruned += 1
        if len(todo) < self.gc_limit:
            self._pruned_below = checkpoint
