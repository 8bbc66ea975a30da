"""One storage engine per shard this node serves: its own journal, hot segments and cold prefix.

Phase 2, step 1. A shard is the unit that moves between nodes, so it owns
everything a single-node server owns: ``ShardHost`` runs one ``tiered.engine.engine.Engine``
per served shard with

* its journal, hot segments and snapshots under ``<data dir>/shards/<shard>/``;
* its cold objects under ``<prefix>/shards/<shard>/`` in the shared store, so
  one shard's reconciliation never sees another shard's objects as orphans,
  and one epoch governs every writer of an object;
* its own flusher and GC, claiming its prefix at start (taken over: the lease
  already decided who owns the shard; the claim is a second fence on the
  store side).

It is the ``ShardHooks`` of a ``ClusterNode``: ``prepare`` decides whether this
node can serve the shard, ``serve`` recovers and starts its engine, ``flush``
makes it durable before a handoff, ``stopped`` closes it.

Engines are built by ``engine_factory(shard, config, clock, shipper)``: the
cluster's composition (``tiered/cluster/compose.py``) gives each its
``EngineHooks``; in object-store durability the shard's ``WalShipper`` is
built first (restored from the chain) and handed over, so its ship loop and
its GC run as the engine's job and GC task.

Local durability keeps a shard's acknowledged writes on the disk of the node
that wrote them, so this node serves a shard only if it was the shard's last
writer or the shard was never served: ``prepare`` refuses a shard whose
manifest chain ends with another node's fence (its state is on that node's
disk; the node with that id, back on that volume, or an operator takeover is
the way out). Moving shards between machines without that constraint is the
object-store durability mode (step 4), where a shard's state is in the store.

``shared_disk``: the workers of one multi-worker node (``tiered serve
--workers N``, ``tiered/cluster/workers/``) share one data dir, so any of them
may serve any shard: ``prepare`` accepts every shard, and a shard's engine
holds an exclusive lock on its directory while it is open (a sibling that
lost the lease, paused or slow to close, keeps the next owner out until it let
go: two processes never write one shard's journal).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import CasStore
from tiered.cluster.membership.manifest import ManifestEntry
from tiered.cluster.shards.checkpoint import RestoreBound
from tiered.cluster.shards.restore import RestoreReport, restore_shard
from tiered.cluster.shards.takeover import decode_grant, grant_allows
from tiered.cluster.shards.wal import Chain, WalShipper
from tiered.cold.objects.store import ObjectStore
from tiered.core.clock import Clock, SystemClock
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.datadir import DataDirLock, DataDirLocked
from tiered.engine.engine import Engine

__all__ = ["EngineFactory", "ShardHost", "WalSetup", "plain_engine", "shard_config"]

#: (shard, its config, clock, its WAL shipper in object-store durability) -> the shard's engine.
EngineFactory = Callable[[int, Config, Clock, WalShipper | None], Engine]


def plain_engine(shard: int, config: Config, clock: Clock, shipper: WalShipper | None) -> Engine:
    """A single server's engine per shard (no cluster hooks): for tests of the host alone."""
    return Engine(config, clock)


@dataclass(frozen=True, slots=True)
class WalSetup:
    """Object-store durability: the shared store (WAL objects) and the shards' manifest chains."""

    store: ObjectStore
    chain: Chain


log = logging.getLogger(__name__)


def shard_config(base: Config, shard: int) -> Config:
    """The single-node configuration of one shard's engine."""
    name = f"{shard:04d}"
    prefix = "/".join(p for p in (base.s3_prefix.strip("/"), "shards", name) if p)
    return dataclasses.replace(
        base,
        data_dir=str(base.data_path / "shards" / name),
        s3_prefix=prefix,
        take_over_prefix=True,  # the lease decided; the previous holder stops at its next claim check
        # Object-store durability acknowledges after the WAL object, not after a local fsync.
        fsync="interval" if base.durability == "object-store" else base.fsync,
    )


class ShardHost:
    def __init__(
        self,
        base: Config,
        node_id: str,
        clock: Clock | None = None,
        *,
        jobs: bool = True,
        engine_factory: EngineFactory = plain_engine,
        cas: CasStore | None = None,
        wal: WalSetup | None = None,
        shared_disk: bool = False,
    ) -> None:
        """``cas``: where operators' takeover grants are read (local durability); ``wal``: object-store
        durability (every acknowledged write in a WAL object, one shipper per shard: ``wal.py``)."""
        self.base = base
        self.node_id = node_id
        self.clock: Clock = clock or SystemClock()
        self.jobs = jobs
        self.engine_factory = engine_factory
        self.engines: dict[int, Engine] = {}
        self.epochs: dict[int, int] = {}
        self._closing: dict[asyncio.Task[None], int] = {}  # engines closing in the background -> their shard
        self.cas = cas
        self.wal = wal
        self.object_store = wal is not None
        self.shippers: dict[int, WalShipper] = {}
        self.shared_disk = shared_disk
        self.locks: dict[int, DataDirLock] = {}  # shared_disk: each open shard's directory lock
        #: The latest restore of each shard served here (object-store durability): ``/metrics``.
        self.restores: dict[int, RestoreReport] = {}

    def engine(self, shard: int) -> Engine:
        """The engine serving ``shard`` here; the cluster's ``may_acknowledge`` gates its writes."""
        node = self.engines.get(shard)
        if node is None:
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard} has no engine on this node",
                shard=shard,
                retry_after_s=1,
            )
        return node

    # -- ShardHooks ---------------------------------------------------------------------

    async def prepare(self, shard: int, epoch: int, latest: ManifestEntry | None) -> None:
        if self.object_store or self.shared_disk:
            return  # everything acknowledged is in the store, or on the disk every worker shares
        if latest is not None and latest.writer != self.node_id:
            if await self._granted(shard, latest):
                log.warning(
                    "shard %d: taken over from node %s by an operator's grant; the shard starts empty here",
                    shard,
                    latest.writer,
                )
                return
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED,
                f"shard {shard} was last written by node {latest.writer} (epoch {latest.epoch}); with local "
                f"durability its acknowledged data is on that node's disk",
                shard=shard,
                owner=latest.writer,
                retry_after_s=5,
            )

    async def _granted(self, shard: int, latest: ManifestEntry) -> bool:
        """An operator granted this node the shard at exactly ``latest`` (``tiered cluster take-over``)."""
        if self.cas is None:
            return False
        found = await self.cas.get(keys.takeover_key(shard))
        if found is None:
            return False
        try:
            grant = decode_grant(found.data)
        except ValueError:
            log.error("shard %d: an unreadable takeover grant is ignored", shard)
            return False
        return grant_allows(grant, latest, self.node_id)

    async def serve(self, shard: int, epoch: int) -> None:
        # A previous engine of this shard must have let go of its directory (only this shard's: a takeover
        # never waits for other shards' engines to close).
        await self._wait_closed(shard)
        if shard in self.engines:
            self.epochs[shard] = epoch
            shipper = self.shippers.get(shard)
            if shipper is not None:
                shipper.renew(epoch)
            return
        config = shard_config(self.base, shard)
        config.data_path.mkdir(parents=True, exist_ok=True)
        if self.shared_disk:
            await self._lock(shard, config)
        try:
            await self._start(shard, epoch, config)
        except BaseException:
            self._unlock(shard)
            raise

    async def _lock(self, shard: int, config: Config, wait_s: float = 10.0) -> None:
        """Take the shard directory's lock, waiting (bounded) for a sibling worker still closing it."""
        lock = DataDirLock(config.data_path)
        deadline = self.clock.monotonic() + wait_s
        while True:
            try:
                lock.acquire()
                break
            except DataDirLocked:
                if self.clock.monotonic() > deadline:
                    raise TieredError(
                        ErrorCode.SHARD_NOT_OWNED,
                        f"shard {shard}: its directory is still open in another worker",
                        shard=shard,
                        retry_after_s=1,
                    ) from None
                await asyncio.sleep(0.02)
        self.locks[shard] = lock

    def _unlock(self, shard: int) -> None:
        lock = self.locks.pop(shard, None)
        if lock is not None:
            lock.release()

    async def _start(self, shard: int, epoch: int, config: Config) -> None:
        shipper = None
        if self.wal is not None:
            # The store holds the truth; the local directory is a cache, rebuilt from the chain.
            index, report = await restore_shard(
                self.wal.store,
                self.wal.chain.store,
                shard,
                config.data_path,
                concurrency=self.base.cluster_restore_concurrency,
                clock=self.clock,
            )
            self.restores[shard] = report
            shipper = WalShipper(
                shard,
                epoch,
                config.data_path,
                self.wal.store,
                self.wal.chain,
                index,
                self.clock,
                interval_s=self.base.cluster_wal_interval_ms / 1000,
                gc_grace_s=self.base.gc_grace_s,
                gc_limit=self.base.gc_max_objects_per_pass,
                reconcile_interval_s=self.base.reconcile_interval_s,
                checkpoint_every=self.base.cluster_checkpoint_max_objects,
                restore_bound=RestoreBound(
                    self.base.cluster_checkpoint_max_objects,
                    self.base.cluster_checkpoint_max_mib * 1024 * 1024,
                ),
            )
        node = self.engine_factory(shard, config, self.clock, shipper)
        try:
            await node.start(jobs=self.jobs)
        except BaseException:
            await node.stop()
            raise
        if shipper is not None:
            shipper.note_recovery()  # a torn tail cut at start ships from its cut, before any new write
        self.engines[shard] = node
        self.epochs[shard] = epoch
        if shipper is not None:
            self.shippers[shard] = shipper
        log.info("shard %d: engine started at epoch %d in %s", shard, epoch, config.data_path)

    async def flush(self, shard: int) -> None:
        node = self.engines.get(shard)
        if node is None:
            return
        await node.journal.flushed()
        await node.journal.snapshot(node.state)
        shipper = self.shippers.get(shard)
        if shipper is not None:
            await shipper.flush()  # the snapshot and everything before it, in the store for the next owner

    def stopped(self, shard: int, reason: str) -> None:
        node = self.engines.pop(shard, None)
        self.epochs.pop(shard, None)
        self.restores.pop(shard, None)  # its metrics go with it (the log line stays)
        shipper = self.shippers.pop(shard, None)
        if shipper is not None:
            shipper.close(reason)  # refuse new waits, fail the ones waiting; its loop ends with the engine
        if node is None:
            return
        # Stop taking requests now; closing (jobs, journal, store) finishes in the background.
        node.streams.begin_shutdown()
        task = asyncio.get_running_loop().create_task(self._close(shard, node, reason))
        self._closing[task] = shard
        task.add_done_callback(lambda done: self._closing.pop(done, None))

    async def _close(self, shard: int, node: Engine, reason: str) -> None:
        try:
            await node.stop()
        except Exception:
            log.exception("shard %d: closing its engine failed", shard)
        finally:
            self._unlock(shard)  # only once closed: the next owner may open the directory now
        log.info("shard %d: engine closed (%s)", shard, reason)

    async def _wait_closed(self, shard: int | None = None) -> None:
        """Wait for the engines closing in the background: ``shard``'s, or (None) every one."""
        tasks = [task for task, of in self._closing.items() if shard is None or of == shard]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Close every engine (after the cluster node handed its shards off)."""
        for shard in list(self.engines):
            self.stopped(shard, "node closing")
        await self._wait_closed()
