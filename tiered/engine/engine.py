"""One engine: its parts composed for one purpose, and the owner of its background jobs (its supervisor).

A single server runs one engine; a cluster node runs one per shard it
serves, each given the cluster's ``EngineHooks`` (``tiered/engine/hooks.py``)
in its constructor.

Compositions:

* ``start()`` — what ``tiered serve`` runs: recovery, the journal writer, the
  object store and the prefix claim, every service, and the jobs: flusher,
  GC (with reconciliation), store probe, snapshots, subscription delivery and
  the group sweeper.
* ``open_offline(dry_run=...)`` — what ``tiered gc`` runs without a server: a
  dry run opens the data dir, journal and store read-only and starts nothing;
  a real pass starts only the journal writer, for GC records.

``stop()`` ends every job and closes the journal (with a snapshot) and the
store. Tests compose an engine on a ``VirtualClock`` and choose which jobs run.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from tiered.cold.objects.backends import open_object_store
from tiered.cold.objects.store import ObjectStore
from tiered.cold.parquet.reader import ColdReader
from tiered.core.clock import Clock, SystemClock
from tiered.core.config import Config
from tiered.engine.auth.jwt import JwksFile, JwtVerifier
from tiered.engine.auth.live import LiveLeases
from tiered.engine.auth.service import AuthService
from tiered.engine.auth.state import AuthState
from tiered.engine.codec import RECORDS
from tiered.engine.engine_metrics import Metrics
from tiered.engine.groups.service import CursorSkips, GroupService, RetentionFollower
from tiered.engine.groups.state import GroupsState
from tiered.engine.hooks import NO_HOOKS, EngineHooks, EngineView
from tiered.engine.jobs.claim import PrefixClaim, load_identity
from tiered.engine.jobs.health import StoreHealth
from tiered.engine.journal.committer import Committer
from tiered.engine.journal.journal import Journal
from tiered.engine.journal.segments import SegmentReaper
from tiered.engine.journal.snapshot import SnapshotStore
from tiered.engine.snapshot import SNAPSHOTS
from tiered.engine.streams.large_bodies import LargeBodies
from tiered.engine.streams.listing import StreamDirectory
from tiered.engine.streams.ordinals import RecordsState
from tiered.engine.streams.producers import ProducerLimits
from tiered.engine.streams.reader import StreamReader
from tiered.engine.streams.service import StreamService
from tiered.engine.streams.snapshot_service import SnapshotService
from tiered.engine.streams.state import StreamState
from tiered.engine.streams.visibility import Visibility, VisibilityObserver, Waiters
from tiered.engine.subscriptions.delivery import SubscriptionDelivery
from tiered.engine.subscriptions.service import LinkSkips, StreamEvents, SubscriptionService
from tiered.engine.subscriptions.state import SubscriptionState
from tiered.engine.supervisor import Job, Supervisor
from tiered.engine.tenants.footprint import FootprintCache
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.quotas import QUOTA_NAMES, from_config
from tiered.engine.tenants.service import TenantService
from tiered.engine.tenants.state import TenantState
from tiered.engine.tenants.usage_log import UsageLog
from tiered.engine.timed import TimedFlusher, TimedStore
from tiered.gc.context import GcContext
from tiered.gc.runner import GcRunner, default_tasks
from tiered.hot.log import SegmentLog

log = logging.getLogger(__name__)


def new_state(producer_limits: ProducerLimits | None = None) -> StreamState:
    """An empty state with every extension state machine registered."""
    return StreamState(
        [GroupsState(), SubscriptionState(), AuthState(), TenantState(), RecordsState(), StreamDirectory()],
        producer_limits,
    )


def producer_limits(config: Config) -> ProducerLimits:
    """The idempotent producers' expiry and cap the config sets (``tiered/engine/streams/producers.py``)."""
    return ProducerLimits(
        ttl_ms=round(config.producer_ttl_s * 1000), max_per_stream=config.max_producers_per_stream
    )


async def open_store(config: Config, *, read_only: bool, probe: bool) -> ObjectStore:
    """The configured object store; with ``probe`` an S3 store must first pass the conditional-write probe.

    Only ``serve`` probes: it writes the create-only prefix claim and relies on
    it. A store that ignores conditional writes raises
    ``ConditionalWritesUnsupported`` here and the server refuses to start.
    ``read_only`` (verify, dry runs) writes nothing and refuses writes.
    """
    c = config
    if c.cold_store == "s3":
        for message in c.deprecations():
            log.warning("%s", message)
        if not probe and not read_only and c.s3_conditional_writes == "off":
            log.warning(
                "s3_conditional_writes = 'off': the object store's conditional writes are not checked; "
                "on a store that ignores them the prefix claim does not stop a second server"
            )
    return await open_object_store(
        c.cold_store,
        local_root=c.data_path / "cold",
        s3_bucket=c.s3_bucket,
        s3_prefix=c.s3_prefix,
        s3_endpoint=c.s3_endpoint,
        s3_region=c.s3_region,
        s3_addressing_style=c.s3_addressing,
        s3_checksum_mode="" if c.s3_checksum_mode == "auto" else c.s3_checksum_mode,
        s3_ca_bundle=c.s3_ca_bundle,
        s3_probe_conditional_writes=probe,
        read_only=read_only,
    )


class Engine:
    """One engine: a single server's, or one shard's in cluster mode (with the cluster's ``hooks``)."""

    def __init__(
        self,
        config: Config,
        clock: Clock | None = None,
        *,
        hooks: EngineHooks = NO_HOOKS,
        supervisor: Supervisor | None = None,
    ) -> None:
        """``supervisor``: the owner of this engine's jobs (by default its own, on ``clock``)."""
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.hooks = hooks
        data = config.data_path
        self.metrics = Metrics()
        self.log = SegmentLog(data / "hot", segment_bytes=config.segment_bytes)
        self.journal = Journal(
            self.log,
            SnapshotStore(data / "snapshots", SNAPSHOTS),
            RECORDS,
            fsync=config.fsync,
            fsync_interval_ms=config.fsync_interval_ms,
            sync_seconds=self.metrics.fsync_seconds,
        )
        self.supervisor = supervisor or Supervisor(self.clock)
        self.store_health = StoreHealth(clock=self.clock.monotonic)
        self.producer_limits = producer_limits(config)
        self.state = new_state(self.producer_limits)
        self.store: ObjectStore | None = None
        self.claim: PrefixClaim | None = None
        self.jwks: JwksFile | None = None
        self.recovered = False
        self.offline = False
        self._composed = False

    # ------------------------------------------------------------- compositions

    async def start(self, *, jobs: bool = True) -> None:
        """Everything ``tiered serve`` runs (``jobs=False``: composed, but nothing runs in the background)."""
        c = self.config
        await self._recover(read_only=False)
        self.journal.start()
        self.store = await self._open_store(read_only=False, probe=c.s3_conditional_writes == "probe")
        identity = load_identity(c.data_path, create=True)
        assert identity is not None
        self.claim = PrefixClaim(self.store, identity, str(c.data_path.resolve()), clock=self.clock)
        await self.claim.acquire(take_over=c.take_over_prefix)
        self._compose()
        await self.deliveries.recover()  # fence wakes outstanding before a restart, wake pending work
        self.groups.grant_grace()
        self.recovered = True
        if jobs:
            self.start_jobs()

    async def open_offline(self, *, dry_run: bool) -> None:
        """What an offline GC pass needs, and nothing else (see the module docstring)."""
        c = self.config
        self.offline = True
        # A dry run leaves the journal read-only: any record would be refused, loudly.
        await self._recover(read_only=dry_run)
        if not dry_run:
            self.journal.start()
        self.store = await self._open_store(read_only=dry_run, probe=False)
        identity = load_identity(c.data_path, create=False)
        if identity is not None:
            self.claim = PrefixClaim(self.store, identity, str(c.data_path.resolve()), clock=self.clock)
            await self.claim.observe()
        self._compose()
        self.recovered = True

    def jobs(self) -> dict[str, Job]:
        """Every background job of a server, by name (the hooks' extensions add theirs)."""
        c = self.config
        probe_timeout = min(c.store_probe_interval_s, c.cold_read_timeout_s)
        assert self.store is not None
        store = self.store
        jobs: dict[str, Job] = {
            "cold-flusher": self.flusher.run,
            "gc": self.gc.run_forever,
            "store-probe": lambda: self.store_health.probe_forever(
                store, c.store_probe_interval_s, probe_timeout
            ),
            "snapshots": self._snapshots,
            "group-sweeper": self.groups.sweep_forever,
            "usage-recorder": self.tenants.run_forever,
        }
        jobs.update(self.deliveries.jobs())
        for extension in self.extensions:
            jobs.update(extension.jobs)
        return jobs

    def start_jobs(self, names: set[str] | None = None) -> None:
        for name, job in self.jobs().items():
            if names is None or name in names:
                self.supervisor.start(name, job)

    async def stop(self) -> None:
        """End every job, then close the journal (with a snapshot, unless offline) and the store."""
        if self._composed:
            self.streams.begin_shutdown()
            self.groups.begin_shutdown()
        await self.supervisor.stop()
        if self._composed:
            await self.deliveries.close()
            if not self.offline and not self.journal.read_only and self.journal.failed is None:
                try:
                    await self.tenants.record_usage()  # what was counted since the last interval
                except Exception:
                    log.exception("usage counted since the last interval could not be recorded")
        if self.journal.read_only:
            self.log.close()
        else:
            await self.journal.close(None if self.offline else self.state)
        if self.store is not None:
            await self.store.close()
            self.store = None

    # ------------------------------------------------------------- parts

    async def _recover(self, *, read_only: bool) -> None:
        loop = asyncio.get_running_loop()
        self.state = await loop.run_in_executor(
            None,
            lambda: self.journal.recover(
                read_only=read_only, new_state=lambda: new_state(self.producer_limits)
            ),
        )

    async def _open_store(self, *, read_only: bool, probe: bool) -> ObjectStore:
        store = await open_store(self.config, read_only=read_only, probe=probe)
        return TimedStore(store, self.metrics.store_operations)

    def _compose(self) -> None:
        """Build every part with everything it needs, in dependency order: nothing is set on a part later.

        The cluster's hooks (``self.hooks``) go to the parts that use them;
        its extensions are built first, on this engine's state, so their
        commit observers are in the committer from its first record.
        """
        state = self.state
        subs_state = state.extensions["subscriptions"]
        groups_state = state.extensions["groups"]
        auth_state = state.extensions["auth"]
        tenants_state = state.extensions["tenants"]
        assert isinstance(subs_state, SubscriptionState) and isinstance(groups_state, GroupsState)
        assert isinstance(auth_state, AuthState) and isinstance(tenants_state, TenantState)
        link_skips, cursor_skips = LinkSkips(), CursorSkips()
        self._compose_commits(subs_state, groups_state, link_skips, cursor_skips)
        self._compose_tenants(tenants_state)
        self._compose_data()
        self._compose_features(subs_state, groups_state, link_skips, cursor_skips)
        self._compose_auth(auth_state)
        self.metrics.watch(self)
        self._composed = True

    def _compose_commits(
        self,
        subs_state: SubscriptionState,
        groups_state: GroupsState,
        link_skips: LinkSkips,
        cursor_skips: CursorSkips,
    ) -> None:
        """What readers may see, the hooks' extensions, and the committer with every observer, in order."""
        c, state, clock = self.config, self.state, self.clock
        follow = not self.offline  # offline GC passes write GC records only: no follow-ups
        self.visibility = visibility = Visibility()
        self.waiters = Waiters(c.max_waiters)
        self.footprint = FootprintCache(state)
        view = EngineView(state, clock, lambda s: visibility.view(s).tail)
        self.extensions = [build(view) for build in self.hooks.extensions]
        self.committer = Committer(
            self.journal,
            state,
            snapshot_every_bytes=c.snapshot_every_bytes,
            observers=[
                VisibilityObserver(state, self.visibility, self.waiters),
                StreamEvents(state, subs_state, follow_retention=follow, report=link_skips.report),
                RetentionFollower(groups_state, state, cursor_skips, follow=follow),
                self.footprint,
                *(observer for extension in self.extensions for observer in extension.observers),
            ],
        )

    def _compose_tenants(self, tenants_state: TenantState) -> None:
        """Quotas (every mode; the other shards' usage in cluster mode) and usage."""
        c, clock = self.config, self.clock
        defaults = from_config({name: getattr(c, "quota_" + name) for name in QUOTA_NAMES})
        self.gate = TenantGate(tenants_state, self.footprint, defaults, clock, others=self.hooks.quota_others)
        self.tenants = TenantService(
            self.state,
            tenants_state,
            self.committer,
            self.gate,
            clock,
            interval_s=c.usage_interval_s,
            usage_log=(
                UsageLog(Path(c.usage_log), max_bytes=c.usage_log_max_bytes, rotate_s=c.usage_log_rotate_s)
                if c.usage_log
                else None
            ),
        )

    def _compose_data(self) -> None:
        """The read path, the flusher, the stream service and GC (with the hooks' GC tasks)."""
        c, state, clock, hooks = self.config, self.state, self.clock, self.hooks
        assert self.store is not None
        store, visibility = self.store, self.visibility
        self.cold_reader = ColdReader(store, c.read_cache_bytes)
        self.reader = StreamReader(
            state,
            self.log,
            self.cold_reader,
            self.store_health,
            cold_read_timeout_s=c.cold_read_timeout_s,
            on_egress=self.tenants.counter.egress,
        )
        self.reaper = SegmentReaper(self.journal, state, clock, offline=self.offline)
        self.flusher = TimedFlusher(
            state,
            lambda s: visibility.view(s).tail,
            self.committer,
            self.log,
            self.reaper,
            store,
            clock,
            interval_s=c.flush_interval_s,
            flush_bytes=c.flush_bytes,
            target_object_bytes=c.cold_object_bytes,
            hot_retention_s=c.hot_retention_s,
            claim=self.claim,
            pass_seconds=self.metrics.cold_flush_seconds,
        )
        self.streams = StreamService(
            state,
            self.committer,
            self.reader,
            self.visibility,
            self.waiters,
            clock,
            max_hot_bytes=c.max_hot_bytes,
            flush_bytes=c.flush_bytes,
            append_seconds=self.metrics.append_seconds,
            kick_flush=self.flusher.kick,
            gate=self.gate,
            remote_forks=hooks.remote_forks,
        )
        # Stream snapshots: objects of their own in the cold store (``tiered/engine/streams/snapshots.py``).
        self.snapshots = SnapshotService(
            self.streams,
            store,
            clock,
            max_bytes=c.stream_snapshot_max_bytes,
            bootstrap_max_bytes=c.bootstrap_max_bytes,
            claim=self.claim,
        )
        # Large bodies stored by reference (``tiered.engine.streams.large_bodies``).
        self.large_bodies = LargeBodies(
            state,
            self.committer,
            store,
            clock,
            threshold=c.large_body_threshold_bytes,
            max_bytes=c.large_body_max_bytes,
            gate=self.gate,
            claim=self.claim,
        )
        reaper = self.reaper
        self.gc = GcRunner(
            GcContext(
                state,
                self.committer,
                store,
                clock,
                grace_ms=int(c.gc_grace_s * 1000),
                max_objects=c.gc_max_objects_per_pass,
                reader=self.cold_reader,
                claim=self.claim,
                hot=self.flusher,
                segments_deleted=lambda: reaper.deleted_last,
                rewrite_max_objects=c.rewrite_max_objects_per_pass,
                erasure_deadline_ms=int(c.erasure_deadline_s * 1000),
                rewrite_bytes_per_s=c.rewrite_bytes_per_s,
                tombstone_delay_ms=int(c.compaction_tombstone_delay_s * 1000),  # keyed compaction
            ),
            interval_s=c.gc_interval_s,
            reconcile_interval_s=c.reconcile_interval_s,
            tasks=[*default_tasks(), *hooks.gc_tasks],
            pass_seconds=self.metrics.gc_pass_seconds,
        )

    def _compose_features(
        self,
        subs_state: SubscriptionState,
        groups_state: GroupsState,
        link_skips: LinkSkips,
        cursor_skips: CursorSkips,
    ) -> None:
        """Subscriptions (and their delivery) and consumer groups."""
        c, state, clock, hooks = self.config, self.state, self.clock, self.hooks
        self.subscriptions = SubscriptionService(
            state,
            subs_state,
            self.committer,
            self.visibility,
            clock,
            webhooks=c.webhooks,
            allow_loopback=c.webhook_allow_loopback,
            public_url=c.public_url,
            skips=link_skips,
            remote_streams=hooks.remote_streams,
        )
        self.deliveries = SubscriptionDelivery(
            self.subscriptions, self.streams, clock, remote_append=hooks.remote_append
        )
        self.groups = GroupService(
            state,
            groups_state,
            self.committer,
            self.visibility,
            clock,
            skips=cursor_skips,
            directory=hooks.stream_directory,
        )

    def _compose_auth(self, auth_state: AuthState) -> None:
        """Who may do what (``--auth``): live-reader leases, the JWT verifier, the access service."""
        c, state, clock = self.config, self.state, self.clock
        self.leases = LiveLeases(clock, self.waiters.notify)
        jwt = None
        if c.auth_mode == "jwt":
            self.jwks = JwksFile(Path(c.jwks_file), clock.monotonic)
            jwt = JwtVerifier(
                self.jwks,
                issuer=c.jwt_issuer,
                audience=c.jwt_audience,
                now_ms=clock.now_ms,
                leeway_s=c.jwt_leeway_s,
                scope_claim=c.jwt_scope_claim,
            )
        self.auth = AuthService(
            state,
            auth_state,
            self.committer,
            clock,
            self.leases,
            mode=c.auth_mode,
            admin_token=c.admin_token() if not self.offline else None,
            jwt=jwt,
        )

    def reload_keys(self) -> None:
        """SIGHUP: read the JWKS file again (a no-op without ``--auth jwt``)."""
        if self.jwks is not None:
            self.jwks.reload()

    async def _snapshots(self) -> None:
        """Snapshot whenever the committer says enough journal has piled up since the last one."""
        due = self.committer.snapshot_due
        while True:
            await due.wait()
            due.clear()
            try:
                await self.journal.snapshot(self.state)
            except Exception:
                log.exception("snapshot failed; will retry after more writes")

    # ------------------------------------------------------------- status

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready to serve everything: recovery finished, the journal writes, the store answered, the prefix is
        ours, and no background job is crash-looping or ended (each job is listed under ``jobs``)."""
        checks: dict[str, Any] = {
            "recovered": self.recovered,
            "journal": "ok" if self.journal.failed is None else f"failed: {self.journal.failed}",
            "store": self.store_health.as_json(),
        }
        claim = self.claim
        if claim is not None and not claim.held:
            checks["prefix"] = (
                f"claimed by another data dir ({claim.lost_to.identity if claim.lost_to else 'nobody'})"
            )
        checks["jobs"] = self.supervisor.report()
        failing = self.supervisor.problems()
        if failing:
            checks["jobs_failing"] = failing
        ready = (
            self.recovered
            and self.journal.failed is None
            and self.store_health.reachable is True
            and (claim is None or claim.held)
            and not failing
        )
        return ready, checks
