"""What ``tiered serve`` runs in cluster mode: the node's lease loop and one engine per served shard.

Composition: the configured object store, seen through ``ObjectStoreCas``;
a ``ClusterNode`` (heartbeats, leases, fences) whose hooks are a
``ShardHost`` (one single-node engine per served shard, under
``<data>/shards/<shard>/``); and, in object-store durability mode, a
``WalShipper`` per shard (see ``tiered/cluster/shards/wal.py``). The HTTP side
(``tiered/cluster/gateway/shard_routing.py``) asks this object where a request's shard
is served and whether this node may acknowledge in it now.

Durability decides placement: with ``local`` a shard stays with its last
writer (its acknowledged data is on that node's disk), so leases are not
rebalanced; with ``object-store`` every acknowledged write is in the store, so
placement follows rendezvous hashing over the live nodes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from tiered.cluster.features.bucket_totals_exchange import UsageExchange
from tiered.cluster.features.group_engine import ClusterEngine
from tiered.cluster.gateway.cold_reads import CatchupReads
from tiered.cluster.gateway.forward import Forwarder
from tiered.cluster.membership.cas import CasError, ObjectStoreCas
from tiered.cluster.membership.lease import LeaseTiming
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.cluster.membership.secret import NodeSigner, load_or_create
from tiered.cluster.membership.shards import shard_of
from tiered.cluster.shards.host import ShardHost
from tiered.cold.objects.store import ObjectStore
from tiered.core.clock import Clock, SystemClock
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.node import Node, open_store

__all__ = ["ClusterServer"]

log = logging.getLogger(__name__)

_SECRET_TRIES = 5


class ClusterServer:
    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.node_id = config.cluster_node_id
        self.object_store = config.durability == "object-store"
        self.host = ShardHost(
            config,
            self.node_id,
            self.clock,
            object_store=self.object_store,
            # Each shard's groups see every shard's streams (tiered/cluster/features/group_engine.py).
            engine_factory=lambda shard_config, clock: ClusterEngine(shard_config, clock, self),
        )
        self.store: ObjectStore | None = None
        self.node: ClusterNode | None = None
        self.advertise_url = ""
        # A forwarded long-poll waits up to long_poll_timeout_s for its first byte.
        self.forwarder = Forwarder(self.node_id, read_timeout_s=max(30.0, config.long_poll_timeout_s + 10))
        self.started = False  # joined, and waited (bounded) for its first shards
        self._stop = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        # Background jobs other parts of the node add before ``start`` (the subscription feeds), stopped with it.
        self.side_jobs: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = []
        self._side: list[asyncio.Task[None]] = []
        self.catchup: CatchupReads | None = None  # catch-up reads of other nodes' streams, from the store
        self.usage: UsageExchange | None = None  # bucket-wide quotas: every shard's usage (usage.py)
        self._usage_loop: asyncio.Task[None] | None = None
        self.signer: NodeSigner | None = (
            None  # node-to-node requests (tiered/cluster/membership/secret.py), once the secret is read
        )

    async def start(self, advertise_url: str) -> None:
        """Open the store, join the cluster and start the lease loop (shards come as leases are won)."""
        c = self.config
        self.advertise_url = c.cluster_advertise_url or advertise_url
        self.store = await open_store(c, read_only=False, probe=c.s3_conditional_writes == "probe")
        self.host.store = self.store
        self.signer = NodeSigner(await self._secret(), self.clock)
        self.catchup = CatchupReads(
            self.store,
            self.clock,
            self.node_id,
            max_valid_s=c.locator_valid_ms / 1000,
            cache_bytes=c.read_cache_bytes,
            read_timeout_s=c.cold_read_timeout_s,
        )
        self.catchup.authenticate = self.authenticate
        timing = LeaseTiming(c.cluster_lease_ttl_s, c.lease_margin_s)
        self.node = ClusterNode(
            ObjectStoreCas(self.store),
            NodeConfig(
                self.node_id,
                self.advertise_url,
                timing,
                shard_count=c.cluster_shards,
                rebalance=self.object_store,
                serve_in_background=True,
            ),
            self.clock,
            hooks=self.host,
        )
        self.host.cluster = self.node
        self._loop = asyncio.get_running_loop().create_task(self.node.run(self._stop))
        self._side = [asyncio.get_running_loop().create_task(job(self._stop)) for job in self.side_jobs]
        self.usage = UsageExchange(
            ObjectStoreCas(self.store),
            self.node_id,
            self.clock,
            self.served_engines,
            lambda shard: self.local_engine(shard) is not None,
            interval_s=c.cluster_usage_interval_s,
        )
        self.catchup.on_served = self.usage.count_served  # the owner never sees these reads
        self._usage_loop = asyncio.get_running_loop().create_task(self.usage.run(self._stop))

    async def _secret(self) -> bytes:
        """The cluster's secret, read before anything is served: the operator's file (``cluster_secret_file``,
        the same on every node), else the store's object (created by the first node; a few tries)."""
        configured = self.config.cluster_secret()
        if configured is not None:
            return configured
        assert self.store is not None
        cas = ObjectStoreCas(self.store)
        for attempt in range(_SECRET_TRIES):
            try:
                return await load_or_create(cas)
            except CasError as exc:
                if attempt + 1 == _SECRET_TRIES:
                    raise
                log.warning("the cluster secret could not be read (%s); trying again", exc)
                await asyncio.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    async def wait_serving(self, timeout_s: float) -> bool:
        """Wait (bounded) until every shard has a serving owner and none of ours is still being fenced."""
        deadline = self.clock.monotonic() + timeout_s
        while self.clock.monotonic() < deadline:
            if self._settled():
                self.started = True
                return True
            await asyncio.sleep(0.05)
        self.started = self.node is not None and self.node.me is not None
        return False

    def _settled(self) -> bool:
        node = self.node
        if node is None or node.me is None or node.spec is None:
            return False
        serving = node.serving()
        if len(serving) != len(node.holds):
            return False  # some of ours are still fencing or releasing
        return all(
            (owner := node.owner_of(s)) is not None and (owner[0] != self.node_id or s in serving)
            for s in range(node.spec.shard_count)
        )

    async def stop(self) -> None:
        """Hand every shard off (flushing each), mark the node stopped, close the engines and the store."""
        self._stop.set()
        if self._usage_loop is not None:
            await self._usage_loop
        if self._loop is not None:
            try:
                await self._loop
            except Exception:
                log.exception("the cluster loop failed while stopping")
        for result in await asyncio.gather(*self._side, return_exceptions=True):
            if isinstance(result, Exception):
                log.error("a cluster side job failed: %r", result)
        await self.host.close()
        await self.forwarder.close()
        if self.store is not None:
            await self.store.close()
            self.store = None

    # -- what the HTTP side asks ---------------------------------------------------------

    def shard_of(self, bucket: str, name: str) -> int:
        node = self.node
        if node is None or node.spec is None:
            raise TieredError(
                ErrorCode.UNAVAILABLE, "this node has not joined its cluster yet", retry_after_s=1
            )
        return shard_of(bucket, name, node.spec.shard_count)

    def shard_count(self) -> int:
        node = self.node
        if node is None or node.spec is None:
            raise TieredError(
                ErrorCode.UNAVAILABLE, "this node has not joined its cluster yet", retry_after_s=1
            )
        return node.spec.shard_count

    def local_engine(self, shard: int) -> Node | None:
        """The engine serving ``shard`` here, if this node may acknowledge in it now."""
        node = self.node
        engine = self.host.engines.get(shard)
        if node is None or engine is None:
            return None
        try:
            node.may_acknowledge(shard)
        except TieredError:
            return None
        return engine

    def served_engines(self) -> dict[int, Node]:
        """Every shard's engine this node may acknowledge in now."""
        return {s: e for s in list(self.host.engines) if (e := self.local_engine(s)) is not None}

    def authenticate(self, header: str | None) -> None:
        """Raise (401) unless ``header`` is a credential valid now, as any served engine judges it.

        Every shard holds every issued token, so a token revoked anywhere is
        refused here too; with no engine served here there is nothing to ask.
        """
        for engine in self.served_engines().values():
            if engine.auth.enabled:
                engine.auth.authenticate(header)
            return

    def check_acknowledge(self, shard: int) -> None:
        """Raise (``SHARD_NOT_OWNED``: 503) unless this node may acknowledge a write in ``shard`` now."""
        if self.node is None:
            raise TieredError(ErrorCode.SHARD_NOT_OWNED, "not joined", shard=shard, retry_after_s=1)
        self.node.may_acknowledge(shard)

    def owner_url(self, shard: int) -> tuple[str, str] | None:
        """(node id, advertised URL) of the shard's lease holder, as last read; None if free or not alive.

        A holder whose heartbeat stopped changing is not forwarded to: it may be
        paused with its socket open, and a request to it would hang until it
        resumes, when it must refuse anyway. The client retries after the takeover.
        """
        node = self.node
        if node is None:
            return None
        owner = node.owner_of(shard)
        if owner is None or owner[0] == self.node_id:
            return owner
        return owner if node.view.alive(owner[0], self.clock.monotonic()) else None

    async def durable(self, shard: int) -> None:
        """Object-store mode: wait until everything this shard acknowledged so far is in a WAL object."""
        shipper = self.host.shippers.get(shard)
        if shipper is None:
            raise TieredError(
                ErrorCode.SHARD_NOT_OWNED, f"shard {shard} is not served here", shard=shard, retry_after_s=1
            )
        await shipper.durable()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        node = self.node
        joined = node is not None and node.me is not None
        serving = node.serving() if node is not None else {}
        checks: dict[str, Any] = {
            "node": self.node_id,
            "joined": joined,
            "incarnation": node.incarnation if node is not None else 0,
            "serving": sorted(serving),
            "durability": self.config.durability,
            "usage_rounds": self.usage.rounds if self.usage is not None else 0,
        }
        if self.catchup is not None:
            checks["catchup"] = self.catchup.stats()
        return joined, checks
