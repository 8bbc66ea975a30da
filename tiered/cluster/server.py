"""What ``tiered serve`` runs in cluster mode: the node's lease loop and one engine per served shard.

Composition (``open_cluster``, then ``ClusterServer.join``): the configured
object store, seen through ``ObjectStoreCas``; the cluster secret (the
operator's, else the store's); the features (``compose.py``: routing, feeds,
tokens, usage, catch-up reads, each shard's ``EngineHooks``); a ``ShardHost``
(one engine per served shard, under ``<data>/shards/<shard>/``, with a
``WalShipper`` per shard in object-store durability: ``shards/wal.py``); and,
once the listener's address is known, a ``ClusterNode`` (heartbeats, leases,
fences) whose hooks are the host. Shard routing
(``tiered/cluster/gateway/shard_router.py``) asks this object where a request's shard
is served and whether this node may acknowledge in it now.

The node's own loops (the lease loop, the usage exchange) run under its
``Supervisor`` (``tiered/engine/supervisor.py``): restarted with backoff if
they crash, reported in ``/readyz`` and ``/metrics``; each shard's engine
supervises its own jobs, and ``/readyz`` reports those too.

Durability decides placement: with ``local`` a shard stays with its last
writer (its acknowledged data is on that node's disk), so leases are not
rebalanced; with ``object-store`` every acknowledged write is in the store, so
placement follows rendezvous hashing over the live nodes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tiered.cluster.compose import ClusterFeatures
from tiered.cluster.gateway.forward import Forwarder
from tiered.cluster.gateway.forward_frames import max_answer_bytes
from tiered.cluster.membership.cas import CasError, CasStore, ObjectStoreCas
from tiered.cluster.membership.identity import NodeIdInUse
from tiered.cluster.membership.lease import LeaseTiming
from tiered.cluster.membership.manifest import ManifestEntry
from tiered.cluster.membership.node_shell import ClusterNode, NodeConfig
from tiered.cluster.membership.secret import NodeSigner, load_or_create
from tiered.cluster.membership.shards import shard_of
from tiered.cluster.shards.host import ShardHost, WalSetup
from tiered.cold.objects.store import ObjectStore
from tiered.core.clock import Clock, SystemClock
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.engine import Engine, open_store
from tiered.engine.supervisor import Supervisor

__all__ = ["ClusterServer", "open_cluster"]

log = logging.getLogger(__name__)

#: Shards of recently named streams kept (``ClusterServer.shard_of``).
_SHARD_CACHE_SIZE = 8192

_SECRET_TRIES = 5


async def open_cluster(
    config: Config, clock: Clock | None = None, *, shared_disk: bool = False
) -> ClusterServer:
    """Open the store and read the cluster secret, then compose the node (nothing served or joined yet)."""
    c = config
    clock = clock or SystemClock()
    store = await open_store(c, read_only=False, probe=c.s3_conditional_writes == "probe")
    try:
        secret = await _secret(c, ObjectStoreCas(store))
    except BaseException:
        await store.close()
        raise
    return ClusterServer(c, clock, store, NodeSigner(secret, clock), shared_disk=shared_disk)


async def _secret(config: Config, cas: CasStore) -> bytes:
    """The cluster's secret, read before anything is served: the operator's file (``cluster_secret_file``,
    the same on every node), else the store's object (created by the first node; a few tries)."""
    configured = config.cluster_secret()
    if configured is not None:
        return configured
    for attempt in range(_SECRET_TRIES):
        try:
            return await load_or_create(cas)
        except CasError as exc:
            if attempt + 1 == _SECRET_TRIES:
                raise
            log.warning("the cluster secret could not be read (%s); trying again", exc)
            await asyncio.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


class _NodeChain:
    """The shards' manifest chains as the WAL shippers write them: through the node once it joined."""

    def __init__(self, cas: CasStore, server: ClusterServer) -> None:
        self.store = cas
        self.server = server

    async def commit(self, shard: int, payload: bytes) -> ManifestEntry:
        node = self.server.node
        if node is None:
            raise TieredError(ErrorCode.SHARD_NOT_OWNED, "not joined", shard=shard, retry_after_s=1)
        return await node.commit(shard, payload)


class ClusterServer:
    def __init__(
        self,
        config: Config,
        clock: Clock,
        store: ObjectStore,
        signer: NodeSigner,
        *,
        supervisor: Supervisor | None = None,
        shared_disk: bool = False,
    ) -> None:
        """``supervisor``: the owner of the node's own loops (by default its own, on ``clock``);
        ``shared_disk``: a worker of a multi-worker node (``tiered/cluster/workers/``): its siblings share its
        data dir, so shards are placed by rendezvous hashing as in object-store durability."""
        self.config = config
        self.clock = clock
        self.node_id = config.cluster_node_id
        self._shard_cache: dict[tuple[str, str, int], int] = {}  # (bucket, name, shard count) -> shard
        self.object_store = config.durability == "object-store"
        self.shared_disk = shared_disk
        self.store = store
        self.cas = ObjectStoreCas(store)
        self.signer = signer  # node-to-node requests (tiered/cluster/membership/secret.py)
        # A forwarded long-poll waits up to long_poll_timeout_s for its first byte.
        self.forwarder = Forwarder(
            self.node_id,
            read_timeout_s=max(30.0, config.long_poll_timeout_s + 10),
            # Large bodies (stored by reference on the owner) are streamed on, not held here.
            stream_above=config.large_body_threshold_bytes or config.max_body_bytes,
            max_answer_bytes=max_answer_bytes(config),  # from a sibling worker, in one frame
        )
        self.supervisor = supervisor or Supervisor(clock)
        self.features = ClusterFeatures(
            self, store=store, cas=self.cas, signer=signer, forwarder=self.forwarder
        )
        self.host = ShardHost(
            config,
            self.node_id,
            clock,
            engine_factory=self.features.engine,
            cas=self.cas,
            wal=WalSetup(store, _NodeChain(self.cas, self)) if self.object_store else None,
            shared_disk=shared_disk,
        )
        self.node: ClusterNode | None = None  # once joined (its heartbeats advertise the listener's URL)
        self.advertise_url = ""
        self.started = False  # joined, and waited (bounded) for its first shards
        self._stop = asyncio.Event()
        self.replaced: NodeIdInUse | None = None  # another process holds this node id: the process exits

    async def join(self, advertise_url: str, on_replaced: Callable[[], None] | None = None) -> None:
        """Join the cluster and start the lease loop (shards come as leases are won) and the usage exchange.

        ``on_replaced``: called once another process holds this node id (``replaced`` says why);
        the lease loop has ended holding nothing, and the process should stop and exit
        (``tiered serve``: exit code ``EXIT_NODE_ID_IN_USE``)."""
        c = self.config
        self.advertise_url = c.cluster_advertise_url or advertise_url
        node = self.node = ClusterNode(
            self.cas,
            NodeConfig(
                self.node_id,
                self.advertise_url,
                LeaseTiming(c.cluster_lease_ttl_s, c.lease_margin_s),
                shard_count=c.cluster_shards,
                rebalance=self.object_store or self.shared_disk,
                serve_in_background=True,
            ),
            self.clock,
            hooks=self.host,
        )
        stop = self._stop

        async def membership() -> None:
            try:
                await node.run(stop)
            except NodeIdInUse as exc:
                self.replaced = exc  # not a crash to restart: this process must go
                if on_replaced is not None:
                    on_replaced()

        # Both end by themselves once ``stop`` is set: the lease loop hands every shard off on its way out.
        self.supervisor.start("cluster-membership", membership, drain=True)
        self.supervisor.start("usage-exchange", lambda: self.features.usage.run(stop), drain=True)

    async def wait_serving(self, timeout_s: float) -> bool:
        """Wait (bounded) until every shard has a serving owner and none of ours is still being fenced."""
        deadline = self.clock.monotonic() + timeout_s
        while self.clock.monotonic() < deadline and self.replaced is None:
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
        await self.supervisor.stop()  # the lease loop hands off and ends; the usage exchange ends
        node = self.node
        if node is not None and not node.stopping:
            try:
                await node.stop()  # its loop was not running (waiting to be restarted): hand off here
            except Exception:
                log.exception("the cluster node failed while stopping")
        await self.host.close()
        await self.forwarder.close()
        await self.store.close()

    # -- what the HTTP side asks ---------------------------------------------------------

    def shard_of(self, bucket: str, name: str) -> int:
        node = self.node
        if node is None or node.spec is None:
            raise TieredError(
                ErrorCode.UNAVAILABLE, "this node has not joined its cluster yet", retry_after_s=1
            )
        count = node.spec.shard_count
        # Cached: every request asks (twice when a worker forwards it), and the hash is a SHA-256.
        key = (bucket, name, count)
        shard = self._shard_cache.get(key)
        if shard is None:
            if len(self._shard_cache) >= _SHARD_CACHE_SIZE:
                self._shard_cache.clear()
            shard = self._shard_cache[key] = shard_of(bucket, name, count)
        return shard

    def shard_count(self) -> int:
        node = self.node
        if node is None or node.spec is None:
            raise TieredError(
                ErrorCode.UNAVAILABLE, "this node has not joined its cluster yet", retry_after_s=1
            )
        return node.spec.shard_count

    def local_engine(self, shard: int) -> Engine | None:
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

    def engines(self) -> dict[int, Engine]:
        """Every shard's engine on this node, served now or not (starting, handing off)."""
        return dict(self.host.engines)

    def served_engines(self) -> dict[int, Engine]:
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
        """Ready once joined, with no background job crash-looping or ended: the node's own and every
        shard engine's (``jobs``, by name: ``shard-NNNN/<job>`` for an engine's)."""
        node = self.node
        joined = node is not None and node.me is not None
        serving = node.serving() if node is not None else {}
        jobs = self.supervisor.report()
        failing = self.supervisor.problems()
        for shard, engine in sorted(self.host.engines.items()):
            prefix = f"shard-{shard:04d}/"
            jobs.update({prefix + name: job for name, job in engine.supervisor.report().items()})
            failing += [prefix + problem for problem in engine.supervisor.problems()]
        checks: dict[str, Any] = {
            "node": self.node_id,
            "joined": joined,
            "incarnation": node.incarnation if node is not None else 0,
            "serving": sorted(serving),
            "durability": self.config.durability,
            "usage_rounds": self.features.usage.rounds,
            "catchup": self.features.catchup.stats(),
            "jobs": jobs,
        }
        if failing:
            checks["jobs_failing"] = failing
        clock_ok = True
        if node is not None:
            checks["restoring"] = [shard for shard, _ in node.restoring()]
            checks["restores"] = dict(node.restores)
            checks["clock"] = self.clock_report(node)
            clock_ok = not node.clock_out_of_bound
        if self.replaced is not None:
            checks["replaced"] = self.replaced.message
        return joined and not failing and clock_ok and self.replaced is None, checks

    def clock_report(self, node: ClusterNode) -> dict[str, Any]:
        """What ``/readyz`` shows of the clock check: the verdict, the bound, each reference's estimate."""
        check = node.clock_check
        estimates = check.estimates(self.clock.monotonic())
        return {
            "out_of_bound": node.clock_out_of_bound,
            "bound": check.bound,
            "rates": {ref: e.as_json() for ref, e in sorted(estimates.items())},
        }
