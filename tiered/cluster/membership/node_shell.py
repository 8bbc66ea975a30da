"""One node's cluster loop: heartbeat, judge peers, take, fence, hand off and release shards.

The shell around the pure parts (``lease``, ``heartbeat``, ``manifest``,
``placement``): it does the store I/O through a ``CasStore`` and reads time
only from the injected ``Clock``. ``tick()`` is one bounded pass (a fixed
number of reads, at most ``max_writes_per_tick`` conditional writes, no
sleeping), so tests drive it step by step with virtual clocks; ``run()``
repeats it. A pass is resumable and idempotent: everything it knows is
either re-read from the store or settled by reading its own nonce back, so
a pass cut short by an error or a crash is simply followed by the next.

What a pass does, in order:

1. read every heartbeat and every lease (a listing, then a GET only of
   objects whose ETag changed);
2. join as a new incarnation if not joined (waiting out a previous
   incarnation that may still run), else beat when due; a beat refused
   because a peer declared this incarnation dead drops every shard at once;
3. declare dead the peers whose heartbeat this process saw unchanged for
   ``ttl + margin``;
4. for each shard, against the placement over the live nodes: take a free
   or dead lease it should own (epoch + 1), write the fence, then serve; hand
   off a shard it should no longer own (stop acknowledging, flush, release);
   adopt a lease its own lost write won; stop at once when a lease it holds
   changed hands.

A shard this node is restoring (fenced, ``ShardHooks.serve`` still running)
stays here while the node lives: its heartbeat says so (``restoring``) and
placement honours it. A hold dropped mid-restore (the lease changed hands,
this incarnation was declared dead) cancels the restore: the shard is never
served from it. A process whose node id another live process holds exits
(``identity``: ``replaced``, raised by ``run`` as ``NodeIdInUse``). A node
whose clock runs out of the documented bound (``clock_check``) stops
declaring peers dead and says so (``clock_out_of_bound``).

``may_acknowledge(shard)`` is the gate every acknowledged write passes: a
fenced hold, and the node's window (from its last successful beat's send
time) still open. ``commit(shard, payload)`` appends to the shard's manifest
chain and stops serving the shard the moment it finds a higher epoch there.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import (
    AlreadyExists,
    CasStore,
    CasUnavailable,
    ConcurrentWrite,
    DatedCas,
    OutcomeUnknown,
    PreconditionFailed,
    Versioned,
)
from tiered.cluster.membership.clock_check import STORE, ClockCheck, Sample
from tiered.cluster.membership.heartbeat import (
    HeartbeatRecord,
    HeartbeatWrite,
    Liveness,
    PeerView,
    decode_heartbeat,
    encode_heartbeat,
    plan_beat,
    plan_declare_dead,
    plan_join,
    plan_stop,
)
from tiered.cluster.membership.identity import NodeIdInUse, replaced_by, twin_running
from tiered.cluster.membership.lease import (
    AckWindow,
    Hold,
    HoldState,
    LeaseRecord,
    LeaseTiming,
    LeaseWrite,
    decode_lease,
    encode_lease,
    landed,
    plan_release,
    plan_take,
)
from tiered.cluster.membership.manifest import (
    ManifestEntry,
    ManifestWriter,
    WriteResult,
    decode_entry,
    encode_entry,
)
from tiered.cluster.membership.placement import assignment, restoring_owners
from tiered.cluster.membership.shards import ClusterSpec, decode_spec, encode_spec, resolve_spec
from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError

_K = TypeVar("_K", str, int)  # a node id or a shard number

__all__ = ["ClusterNode", "NodeConfig", "ShardHooks"]

log = logging.getLogger(__name__)

_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_RECENT_BEATS = 8  # nonces of our own recent beats, to recognise one whose answer was lost
_FENCE_ATTEMPTS = 3  # per pass: older owners' entries that landed while we fenced
# Clock sanity (``clock_check``): an estimate spans at least this many TTLs, within a window of that many.
_CLOCK_SPAN_TTLS, _CLOCK_WINDOW_TTLS = 10, 30


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One node's cluster settings.

    ``shard_count`` creates the cluster when there is none (and must match
    it when there is one); None joins an existing cluster only.
    ``beat_interval_s`` defaults to a quarter of the TTL, so about three
    beats may fail before the window closes. ``rebalance`` hands shards off
    whenever placement names another live node; without it (local
    durability, where a shard's state is on its last writer's disk) a shard
    stays with its holder until it stops or dies, a released shard is left to
    its last writer while that node is alive, and that node takes it back.
    ``serve_in_background`` runs ``ShardHooks.serve`` (an engine's start, a
    restore from the store) beside the loop, so beats never wait for it; the
    shard is served once it finished.
    """

    node_id: str
    advertise_url: str
    timing: LeaseTiming
    shard_count: int | None = None
    beat_interval_s: float | None = None
    max_writes_per_tick: int = 16
    rebalance: bool = True
    serve_in_background: bool = False

    def __post_init__(self) -> None:
        if not _NODE_ID.fullmatch(self.node_id):
            raise ValueError(
                f"node id {self.node_id!r}: 1-63 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )
        interval = self.interval_s
        if not (math.isfinite(interval) and 0 < interval < self.timing.ttl_s - self.timing.margin_s):
            raise ValueError(f"the beat interval ({interval} s) must be below ttl - margin")
        if self.max_writes_per_tick < 1:
            raise ValueError("max_writes_per_tick must be at least 1")

    @property
    def interval_s(self) -> float:
        return self.beat_interval_s if self.beat_interval_s is not None else self.timing.ttl_s / 4


class ShardHooks(Protocol):
    """What the node's data plane does when a shard comes and goes (phase 2 wires these)."""

    async def prepare(self, shard: int, epoch: int, latest: ManifestEntry | None) -> None:
        """Before fencing: refuse (raise ``TieredError``) a shard this node cannot serve.

        ``latest`` is the chain's last entry (None for a shard never served).
        A refusal leaves no trace in the chain: the lease is released and the
        shard declined here for a while, so another node can take it.
        """
        ...

    async def serve(self, shard: int, epoch: int) -> None:
        """The shard is fenced at ``epoch``: replay it, then acknowledgements may begin."""
        ...

    async def flush(self, shard: int) -> None:
        """Before a handoff: make everything acknowledged durable where the next owner finds it."""
        ...

    def stopped(self, shard: int, reason: str) -> None:
        """The shard is no longer served here (handed off, lost, fenced)."""
        ...


class NoHooks:
    async def prepare(self, shard: int, epoch: int, latest: ManifestEntry | None) -> None:
        return None

    async def serve(self, shard: int, epoch: int) -> None:
        return None

    async def flush(self, shard: int) -> None:
        return None

    def stopped(self, shard: int, reason: str) -> None:
        return None


def _random_nonce() -> str:
    return secrets.token_hex(8)


class _Budget:
    def __init__(self, writes: int) -> None:
        self.left = writes

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


class ClusterNode:
    def __init__(
        self,
        store: CasStore,
        config: NodeConfig,
        clock: Clock,
        *,
        nonce: Callable[[], str] = _random_nonce,
        hooks: ShardHooks | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.hooks: ShardHooks = hooks or NoHooks()
        self._nonce = nonce
        self.spec: ClusterSpec | None = None
        self.view = PeerView(config.timing)
        self.me: HeartbeatRecord | None = None  # our heartbeat as last written; None: not joined
        self.window = AckWindow()
        self.holds: dict[int, Hold] = {}
        self.writers: dict[int, ManifestWriter] = {}
        self.leases: dict[int, LeaseRecord] = {}
        # The highest epoch found in a shard's chain above its lease, and who wrote it.
        self.floors: dict[int, tuple[int, str, int]] = {}
        self.stopping = False
        self._beats: dict[str, float] = {}  # our recent beat nonces -> send time
        self._next_beat_at = -math.inf
        self._commit_locks: dict[int, asyncio.Lock] = {}
        self.declined: dict[int, float] = {}  # shard -> until when this node will not take it
        self._serve_tasks: dict[int, asyncio.Task[None]] = {}
        # Leases this node won, by what it took them from: "new" (never held), "handoff" (a
        # release) or "takeover" (another node's lease, expired or its holder declared dead).
        self.takes: dict[str, int] = {"new": 0, "handoff": 0, "takeover": 0}
        # Restores (``ShardHooks.serve`` in the background) by how they ended; when each running one began.
        self.restores: dict[str, int] = {"completed": 0, "abandoned": 0, "failed": 0}
        self._restore_began: dict[int, float] = {}
        self._restoring_holds: dict[int, Hold] = {}  # the hold each running serve task restores for
        self._published_restoring: tuple[tuple[int, int], ...] = ()
        # Two processes, one id (``identity``): why this one must exit, once it knows.
        self.replaced: str | None = None
        self._last_incarnation = 0  # the highest incarnation this process held
        self._waiting_on: HeartbeatRecord | None = None  # the alive heartbeat a first join waits out
        self._seen_versions: set[str] = set()  # other alive versions of it seen since (ETags)
        self._join_nonces: deque[str] = deque(maxlen=64)  # every join write's nonce, to know our own
        timing = config.timing
        self.clock_check = ClockCheck(
            bound=timing.margin_s / timing.ttl_s,
            window_s=_CLOCK_WINDOW_TTLS * timing.ttl_s,
            min_span_s=_CLOCK_SPAN_TTLS * timing.ttl_s,
        )
        self.clock_out_of_bound = False

    # -- what the data plane asks ---------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self.config.node_id

    @property
    def incarnation(self) -> int:
        return self.me.body.incarnation if self.me else 0

    def may_acknowledge(self, shard: int) -> int:
        """The epoch under which this node may acknowledge a write in ``shard`` now, or a refusal."""
        hold = self.holds.get(shard)
        if self.stopping or self.me is None or hold is None or hold.state is not HoldState.SERVING:
            raise self._not_owned(shard, "this node does not serve the shard")
        if not self.window.allows(self.clock.monotonic()):
            raise self._not_owned(shard, "this node could not renew its lease in time")
        return hold.epoch

    def owner_of(self, shard: int) -> tuple[str, str] | None:
        """The (node, advertised URL) the shard's lease names, as last read; None when free."""
        lease = self.leases.get(shard)
        if lease is None or lease.body.free:
            return None
        return lease.body.owner, lease.body.advertise_url

    def serving(self) -> dict[int, int]:
        """Shards this node serves now, with their epochs."""
        return {s: h.epoch for s, h in sorted(self.holds.items()) if h.state is HoldState.SERVING}

    async def commit(self, shard: int, payload: bytes) -> ManifestEntry:
        """Append ``payload`` to the shard's chain; the entry once it is durable there.

        Raises ``SHARD_FENCED`` (and stops serving the shard) when a higher
        epoch holds the position, ``SHARD_NOT_OWNED`` when the node may not
        acknowledge, ``STORE_UNAVAILABLE`` when the outcome is unknown (the
        same entry is written again before the next one). One commit per
        shard at a time (the data plane's group commit batches behind it).
        """
        async with self._commit_locks.setdefault(shard, asyncio.Lock()):
            return await self._commit(shard, payload)

    async def _commit(self, shard: int, payload: bytes) -> ManifestEntry:
        hold = self.holds.get(shard)
        if (
            hold is not None
            and hold.state is HoldState.RELEASING
            and self.window.allows(self.clock.monotonic())
        ):
            pass  # the flush before a handoff commits what was written; nothing new is acknowledged
        else:
            self.may_acknowledge(shard)
        writer = self.writers[shard]
        try:
            if writer.pending is not None:
                await self._settle_entry(shard, writer, writer.pending)
            entry = writer.plan_commit(payload, self._nonce())
            await self._settle_entry(shard, writer, entry)
        except CasUnavailable as exc:
            raise TieredError(
                ErrorCode.STORE_UNAVAILABLE,
                f"shard {shard}: the manifest write's outcome is unknown; it is retried before the next",
                shard=shard,
                retry_after_s=1,
            ) from exc
        return entry

    # -- the loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, interval_s: float | None = None) -> None:
        """Tick until ``stop`` is set, then hand everything off and stop.

        Raises ``NodeIdInUse`` once another process holds this node id (``identity``): this
        process then holds nothing and writes nothing more.
        """
        pause = interval_s if interval_s is not None else self.config.interval_s / 2
        while not stop.is_set() and self.replaced is None:
            try:
                await self.tick()
            except TieredError as exc:
                log.error("cluster pass failed: %s", exc.message)
            if self.replaced is not None:
                break
            try:
                await asyncio.wait_for(stop.wait(), pause)
            except TimeoutError:
                pass
        if self.replaced is not None:
            raise NodeIdInUse(self.node_id, self.replaced)
        await self.stop()

    async def tick(self) -> None:
        """One bounded pass (see the module docstring)."""
        if self.stopping or self.replaced is not None:
            return
        if self.spec is None and not await self._load_spec():
            return
        if not await self._refresh_nodes() or not await self._refresh_leases():
            if self.me is not None:
                await self._beat_if_due()  # keep renewing even when a listing fails
            return
        if self.me is None:
            await self._join()
        else:
            await self._beat_if_due()
        if self.me is None:
            return
        budget = _Budget(self.config.max_writes_per_tick)
        await self._declare_dead(budget)
        await self._reconcile(budget)

    async def stop(self) -> None:
        """Clean shutdown: acknowledge nothing more, hand every shard off, then say ``stopped``."""
        self.stopping = True
        for shard, hold in sorted(self.holds.items()):
            await self._handoff(shard, hold)
        if self.me is not None:
            write = plan_stop(self.me, self._nonce())
            if await self._heartbeat_write(write) is None:
                log.warning("could not mark node %s stopped; peers will wait out its TTL", self.node_id)
        for shard in list(self.holds):
            self._drop(shard, "node stopped")
        self.window.close()
        self.me = None

    # -- reading --------------------------------------------------------------------------

    async def _load_spec(self) -> bool:
        try:
            found = await self.store.get(keys.CLUSTER)
            if found is None and self.config.shard_count is not None:
                spec = ClusterSpec(secrets.token_hex(8), self.config.shard_count, self.clock.now_ms())
                try:
                    await self.store.put_if_absent(keys.CLUSTER, encode_spec(spec))
                except (AlreadyExists, CasUnavailable):
                    pass  # someone else created it, or maybe we did: read it back
                found = await self.store.get(keys.CLUSTER)
        except (CasUnavailable, ConcurrentWrite) as exc:
            log.warning("cannot read the cluster object yet: %s", exc)
            return False
        if found is None:
            log.warning("no cluster object at %s and no shard count configured to create one", keys.CLUSTER)
            return False
        self.spec = resolve_spec(decode_spec(found.data), self.config.shard_count)
        log.info("cluster %s: %d shards", self.spec.cluster_id, self.spec.shard_count)
        return True

    async def _etags_under(self, prefix: str, name_of: Callable[[str], _K | None]) -> dict[_K, str] | None:
        """Name -> ETag of the objects listed under ``prefix`` (keys ``name_of`` does not parse are skipped);
        None when the store did not answer."""
        try:
            listed = await self.store.list(prefix)
        except CasUnavailable:
            return None
        present: dict[_K, str] = {}
        for item in listed:
            name = name_of(item.key)
            if name is not None:
                present[name] = item.etag
        return present

    async def _refresh_nodes(self) -> bool:
        present = await self._etags_under(keys.NODES, keys.node_of_key)
        if present is None:
            return False
        at = self.clock.monotonic()
        for node, etag in present.items():
            known = self.view.record(node)
            if known is not None and known.etag == etag:
                self.view.observe(node, known, at)
                continue
            try:
                record = self._heartbeat_record(node, await self.store.get(keys.node_key(node)))
            except CasUnavailable:
                continue
            except TieredError as exc:
                log.error("%s", exc.message)
                continue
            seen = self.clock.monotonic()
            self.view.observe(node, record, seen)
            self._peer_clock(node, record, seen)
        for node in list(self.view.nodes):
            if node not in present:
                self.view.observe(node, None, at)
        return True

    async def _refresh_leases(self) -> bool:
        present = await self._etags_under(keys.LEASES, keys.shard_of_lease_key)
        if present is None:
            return False
        at = self.clock.monotonic()
        for shard, etag in present.items():
            known = self.leases.get(shard)
            if known is not None and known.etag == etag:
                continue
            try:
                found = await self.store.get(keys.lease_key(shard))
            except CasUnavailable:
                continue
            if found is None:
                self.leases.pop(shard, None)
                continue
            try:
                self.leases[shard] = LeaseRecord(decode_lease(found.data, shard), found.etag)
            except TieredError as exc:
                log.error("%s", exc.message)
        for shard in list(self.leases):
            if shard not in present:
                self.leases.pop(shard)
        for lease in self.leases.values():
            if not lease.body.free and lease.body.owner not in self.view.nodes:
                self.view.observe(lease.body.owner, None, at)  # named by a lease, no heartbeat
        return True

    def _peer_clock(self, node: str, record: HeartbeatRecord | None, seen: float) -> None:
        """A peer's new heartbeat, first seen at ``seen``: a sample of its clock (sent at most a TTL ago)."""
        if node == self.node_id or record is None:
            return
        body = record.body
        if body.state is not Liveness.ALIVE or body.clock <= 0:
            self.clock_check.forget(node)
            return
        sample = Sample(seen - self.config.timing.ttl_s, seen, body.clock, 0.0)
        self.clock_check.observe(node, sample, epoch=body.incarnation)

    def _judge_clock(self) -> None:
        """Update ``clock_out_of_bound``; log when it changes."""
        now = self.clock.monotonic()
        out = self.clock_check.out_of_bound(now)
        if out == self.clock_out_of_bound:
            return
        self.clock_out_of_bound = out
        rates = {ref: round(e.rate, 3) for ref, e in sorted(self.clock_check.estimates(now).items())}
        if out:
            log.error(
                "node %s: its clock runs out of the bound (rate %s against its references, bound ±%.0f %%); "
                "it declares no peer dead and reports not ready until its clock agrees again",
                self.node_id,
                rates,
                100 * self.clock_check.bound,
            )
        else:
            log.warning("node %s: its clock agrees with its references again (rate %s)", self.node_id, rates)

    def _heartbeat_record(self, node: str, found: Versioned | None) -> HeartbeatRecord | None:
        return None if found is None else HeartbeatRecord(decode_heartbeat(found.data, node), found.etag)

    def _incarnation_floor(self, node: str) -> int:
        return max(
            (lease.body.incarnation for lease in self.leases.values() if lease.body.owner == node), default=0
        )

    # -- heartbeat ------------------------------------------------------------------------

    async def _heartbeat_write(self, write: HeartbeatWrite) -> HeartbeatRecord | None:
        """Make a heartbeat write; settle a lost or refused answer by reading our nonce back."""
        key = keys.node_key(write.node)
        data = encode_heartbeat(write.body)
        try:
            if write.if_match is None:
                etag = await self.store.put_if_absent(key, data)
            else:
                etag = await self.store.put_if_match(key, data, write.if_match)
            return HeartbeatRecord(write.body, etag)
        except ConcurrentWrite:
            return None
        except (AlreadyExists, PreconditionFailed, OutcomeUnknown):
            pass
        except CasUnavailable:
            return None
        try:
            found = self._heartbeat_record(write.node, await self.store.get(key))
        except (CasUnavailable, TieredError):
            return None
        self.view.observe(write.node, found, self.clock.monotonic())
        if found is not None and found.body.nonce == write.body.nonce:
            return found
        return None

    async def _join(self) -> None:
        node = self.node_id
        current = self.view.record(node)
        if current is not None and current.body.nonce in self._beats:
            # An earlier join of ours landed although its answer was lost.
            self._renewed(current, self._beats[current.body.nonce])
            log.info("node %s joined as incarnation %d", node, current.body.incarnation)
            return
        if self._identity_lost(current):
            return
        write = plan_join(
            node,
            current,
            self.view,
            self.clock.monotonic(),
            incarnation_floor=self._incarnation_floor(node),
            advertise_url=self.config.advertise_url,
            nonce=self._nonce(),
            clock=self.clock.monotonic(),
        )
        if write is None:
            log.info(
                "node %s: waiting for its previous incarnation's heartbeat to go stale (%.1f s of %.1f s)",
                node,
                self.view.unchanged_for(node, self.clock.monotonic()),
                self.config.timing.stale_after_s,
            )
            return
        sent = self.clock.monotonic()
        self._remember_beat(write.body.nonce, sent)
        self._join_nonces.append(write.body.nonce)
        joined = await self._heartbeat_write(write)
        if joined is None:
            return
        self._renewed(joined, sent)
        log.info("node %s joined as incarnation %d", node, joined.body.incarnation)

    def _identity_lost(self, current: HeartbeatRecord | None) -> bool:
        """Before a join: whether another process holds this node id (then ``replaced`` says why)."""
        if current is not None and current.body.nonce in self._join_nonces:
            return False  # a join of ours that landed late: our own, left to go stale
        node = self.node_id
        if self._last_incarnation == 0 and current is not None and current.body.state is Liveness.ALIVE:
            if self._waiting_on is None:
                self._waiting_on = current
            elif current.etag != self._waiting_on.etag:
                self._seen_versions.add(current.etag)
        why = replaced_by(node, self._last_incarnation, current) or twin_running(
            node, self._waiting_on, current, len(self._seen_versions)
        )
        if why is None:
            return False
        self._replaced(why)
        return True

    def _renewed(self, record: HeartbeatRecord, sent: float) -> None:
        self.me = record
        self._last_incarnation = max(self._last_incarnation, record.body.incarnation)
        self._waiting_on = None
        self._seen_versions.clear()
        self.window.extend(sent, self.config.timing)
        self.view.observe(self.node_id, record, self.clock.monotonic())
        self._next_beat_at = max(self._next_beat_at, sent + self.config.interval_s)

    async def _beat_if_due(self) -> None:
        assert self.me is not None
        sent = self.clock.monotonic()
        restoring = self.restoring()
        # Due by the interval, or at once when the shards being restored changed (peers' placement).
        if sent < self._next_beat_at and restoring == self._published_restoring:
            return
        write = plan_beat(self.me, self._nonce(), restoring=restoring, clock=sent)
        self._remember_beat(write.body.nonce, sent)
        key = keys.node_key(self.node_id)
        data = encode_heartbeat(write.body)
        try:
            if isinstance(self.store, DatedCas):
                etag, date = await self.store.put_if_match_dated(key, data, self.me.etag)
                if date is not None:  # the store's Date: whole seconds, read between send and answer
                    self.clock_check.observe(STORE, Sample(sent, self.clock.monotonic(), date + 0.5, 0.5))
            else:
                etag = await self.store.put_if_match(key, data, self.me.etag)
        except (OutcomeUnknown, PreconditionFailed):
            pass  # settled below
        except (ConcurrentWrite, CasUnavailable):
            return  # not applied: beat again at the next pass
        else:
            self._published_restoring = restoring
            self._renewed(HeartbeatRecord(write.body, etag), sent)
            return
        await self._settle_beat()

    def restoring(self) -> tuple[tuple[int, int], ...]:
        """(shard, epoch) of every shard this node is restoring now: fenced, its serve still running."""
        return tuple(
            (shard, hold.epoch)
            for shard, hold in sorted(self.holds.items())
            if hold.state is HoldState.FENCING and self._restoring_holds.get(shard) is hold
        )

    def _remember_beat(self, nonce: str, sent: float) -> None:
        self._beats[nonce] = sent
        while len(self._beats) > _RECENT_BEATS:
            del self._beats[next(iter(self._beats))]

    async def _settle_beat(self) -> None:
        """A beat failed or its answer was lost: ours landed, or we were declared dead."""
        try:
            found = self._heartbeat_record(self.node_id, await self.store.get(keys.node_key(self.node_id)))
        except (CasUnavailable, TieredError):
            return
        if found is not None and found.body.nonce in self._beats:
            self._renewed(found, self._beats[found.body.nonce])
            return
        self.view.observe(self.node_id, found, self.clock.monotonic())
        if found is not None and self.me is not None and found.etag == self.me.etag:
            return  # our beat did not land (maybe it still will): beat again next pass
        ours = found is not None and found.body.nonce in self._join_nonces
        why = None if ours else replaced_by(self.node_id, self._last_incarnation, found)
        if why is not None:
            self._replaced(why)
            return
        self._fenced_self(
            "no heartbeat object"
            if found is None
            else f"heartbeat is {found.body.state} "
            f"at incarnation {found.body.incarnation} (declared by {found.body.declared_by or 'nobody'})"
        )

    def _fenced_self(self, reason: str) -> None:
        log.critical(
            "node %s incarnation %d was declared dead (%s): it stops serving every shard and joins again",
            self.node_id,
            self.incarnation,
            reason,
        )
        self.window.close()
        for shard in list(self.holds):
            self._drop(shard, "this incarnation was declared dead")
        self.me = None
        self._beats.clear()
        self._next_beat_at = -math.inf

    def _replaced(self, why: str) -> None:
        """Another process holds this node id: hold nothing, write nothing more; ``run`` raises."""
        log.critical("%s", why)
        self.window.close()
        for shard in list(self.holds):
            self._drop(shard, "another process holds this node id")
        self.me = None
        self.replaced = why

    async def _declare_dead(self, budget: _Budget) -> None:
        self._judge_clock()
        if self.clock_out_of_bound:
            return  # a peer looking stale on a clock out of bound proves nothing: no churn from here
        now = self.clock.monotonic()
        candidates = [
            node
            for node, seen in sorted(self.view.nodes.items())
            if node != self.node_id
            and self.view.stale(node, now)
            and (
                (seen.record is not None and seen.record.body.state is Liveness.ALIVE)
                or (seen.record is None and self._incarnation_floor(node) > seen.dead_through)
            )
        ]
        for node in candidates:
            if not budget.take():
                return
            seen_record = self.view.record(node)
            write = plan_declare_dead(
                node,
                seen_record,
                by=self.node_id,
                nonce=self._nonce(),
                incarnation_floor=self._incarnation_floor(node),
            )
            done = await self._heartbeat_write(write)
            if done is not None:
                self.view.observe(node, done, self.clock.monotonic())
                log.warning(
                    "node %s declared node %s incarnation %d dead (heartbeat unchanged for %.1f s)",
                    self.node_id,
                    node,
                    done.body.incarnation,
                    self.config.timing.stale_after_s,
                )

    # -- shards ---------------------------------------------------------------------------

    def _live(self, now: float) -> list[str]:
        live = set(self.view.live_nodes(now))
        live.discard(self.node_id)
        if self.window.allows(now):
            live.add(self.node_id)
        return sorted(live)

    def _takeable(self, shard: int, lease: LeaseRecord | None) -> bool:
        """Free, ours, or its holder's incarnation dead; and no live writer above it in the chain."""
        floor = self.floors.get(shard)
        if floor is not None:
            _, writer, incarnation = floor
            mine = (writer, incarnation) == (self.node_id, self.incarnation)
            if not mine and not self.view.is_dead(writer, incarnation):
                return False  # the chain's latest writer may still run
        if lease is None or lease.body.free or self._ours(lease):
            return True
        return self.view.is_dead(lease.body.owner, lease.body.incarnation)

    async def _reconcile(self, budget: _Budget) -> None:
        assert self.spec is not None
        now = self.clock.monotonic()
        live = self._live(now)
        claims = [(self.node_id, shard, epoch) for shard, epoch in self.restoring()]
        for node in live:
            record = self.view.record(node)
            if node != self.node_id and record is not None:
                claims += [(node, shard, epoch) for shard, epoch in record.body.restoring]
        desired = assignment(self.spec.shard_count, live, restoring_owners(claims, live))
        sticky = not self.config.rebalance
        for shard in range(self.spec.shard_count):
            lease = self.leases.get(shard)
            hold = self.holds.get(shard)
            if hold is not None:
                await self._tend(shard, hold, lease, desired[shard], budget)
                continue
            if lease is not None and self._ours(lease):
                # Won by a write of ours whose answer was lost, or left over from a shard we had to
                # drop. Nothing was acknowledged under it since: keep it if we should own the shard
                # and nothing newer is in its chain, else give it back.
                if (sticky or desired[shard] == self.node_id) and not self._below_floor(shard, lease):
                    log.info(
                        "shard %d: adopting epoch %d, won by a write whose answer was lost",
                        shard,
                        lease.body.epoch,
                    )
                    self._hold(
                        Hold(shard, lease.body.epoch, lease.etag, lease.body.nonce, lease.body.advertise_url)
                    )
                    if budget.take():
                        await self._fence(shard)
                    continue
                if desired[shard] != self.node_id:
                    if budget.take():
                        stray = Hold(
                            shard, lease.body.epoch, lease.etag, lease.body.nonce, lease.body.advertise_url
                        )
                        await self._lease_write(plan_release(stray, nonce=self._nonce()))
                    continue
            last = lease.body.last_owner if lease is not None and lease.body.free else ""
            claim_back = sticky and last == self.node_id
            leave = sticky and last not in ("", self.node_id) and self.view.alive(last, now)
            if (
                (claim_back or (desired[shard] == self.node_id and not leave))
                and self._takeable(shard, lease)
                and not self._declines(shard)
            ):
                if budget.take():
                    await self._take(shard, lease)

    def _declines(self, shard: int) -> bool:
        until = self.declined.get(shard)
        if until is not None and self.clock.monotonic() >= until:
            del self.declined[shard]
            return False
        return until is not None

    def _ours(self, lease: LeaseRecord | None) -> bool:
        return (
            lease is not None
            and self.me is not None
            and (lease.body.owner, lease.body.incarnation) == (self.node_id, self.incarnation)
        )

    def _below_floor(self, shard: int, lease: LeaseRecord | None) -> bool:
        floor = self.floors.get(shard)
        return floor is not None and lease is not None and lease.body.epoch <= floor[0]

    async def _tend(
        self, shard: int, hold: Hold, lease: LeaseRecord | None, desired: str | None, budget: _Budget
    ) -> None:
        """A shard we hold: check it is still ours, then fence, hand off or finish a release."""
        if lease is None or lease.etag != hold.etag:
            if hold.release is not None and landed(hold.release, lease):
                self._drop(shard, "handed off")
            else:
                self._drop(shard, "its lease changed hands")
            return
        move = self.config.rebalance and desired is not None and desired != self.node_id
        if not budget.take():
            return
        if hold.state is HoldState.RELEASING:
            await self._release(shard, hold)
        elif move:
            await self._handoff(shard, hold)
        elif hold.state is HoldState.FENCING:
            await self._fence(shard)
        else:
            budget.left += 1  # serving and staying: nothing written

    def _hold(self, hold: Hold) -> None:
        assert self.me is not None
        self.holds[hold.shard] = hold
        self.writers[hold.shard] = ManifestWriter(hold.shard, hold.epoch, self.node_id, self.incarnation)

    def _drop(self, shard: int, reason: str) -> None:
        hold = self.holds.pop(shard, None)
        self.writers.pop(shard, None)
        if hold is None:
            return
        task = self._serve_tasks.get(shard)
        if task is not None and not task.done():
            # Lost mid-restore: abandon it (its done callback stops whatever it started); its progress
            # goes to nobody, the next owner restores from the store as of its own fence.
            began = self._restore_began.get(shard, self.clock.monotonic())
            log.warning(
                "node %s abandons its restore of shard %d (epoch %d) after %.1f s: %s",
                self.node_id,
                shard,
                hold.epoch,
                self.clock.monotonic() - began,
                reason,
            )
            task.cancel()
        level = logging.INFO if reason in ("handed off", "node stopped") else logging.WARNING
        log.log(
            level, "node %s stopped serving shard %d (epoch %d): %s", self.node_id, shard, hold.epoch, reason
        )
        self.hooks.stopped(shard, reason)

    async def _lease_write(self, write: LeaseWrite) -> str | None:
        """A conditional lease write; its new ETag, or None when it did not (or may not have) land(ed)."""
        key = keys.lease_key(write.shard)
        data = encode_lease(write.body)
        try:
            if write.if_match is None:
                etag = await self.store.put_if_absent(key, data)
            else:
                etag = await self.store.put_if_match(key, data, write.if_match)
            self.leases[write.shard] = LeaseRecord(write.body, etag)
            return etag
        except ConcurrentWrite:
            return None
        except (AlreadyExists, PreconditionFailed, OutcomeUnknown):
            pass
        except CasUnavailable:
            return None
        try:
            found = await self.store.get(key)
            record = None if found is None else LeaseRecord(decode_lease(found.data, write.shard), found.etag)
        except (CasUnavailable, TieredError):
            return None
        if record is None:
            self.leases.pop(write.shard, None)
        else:
            self.leases[write.shard] = record
        return record.etag if record is not None and landed(write, record) else None

    async def _take(self, shard: int, lease: LeaseRecord | None) -> None:
        assert self.me is not None
        floor = self.floors.get(shard)
        write = plan_take(
            shard,
            lease,
            owner=self.node_id,
            incarnation=self.incarnation,
            advertise_url=self.config.advertise_url,
            nonce=self._nonce(),
            epoch_floor=floor[0] if floor else 0,
        )
        etag = await self._lease_write(write)
        if etag is None:
            return
        self.floors.pop(shard, None)
        if lease is None:
            previous, kind = "nobody", "new"
        elif lease.body.free:
            previous, kind = "a release", "handoff"
        else:
            previous, kind = f"{lease.body.owner}/{lease.body.incarnation}", "takeover"
        self.takes[kind] += 1
        log.info(
            "node %s took shard %d at epoch %d (from %s)", self.node_id, shard, write.body.epoch, previous
        )
        self._hold(Hold.won(write, etag))
        await self._fence(shard)

    async def _latest_entry(self, shard: int) -> ManifestEntry | None:
        listed = await self.store.list(keys.manifest_prefix(shard))
        for item in reversed(listed):
            seq = keys.seq_of_manifest_key(item.key)
            if seq is None:
                continue
            found = await self.store.get(item.key)
            if found is not None:
                return decode_entry(found.data, shard, seq)
        return None

    async def _fence(self, shard: int) -> None:
        """Write the fencing entry above the chain's latest; serve once it is there."""
        hold, writer = self.holds[shard], self.writers[shard]
        for _ in range(_FENCE_ATTEMPTS):
            try:
                latest = None if writer.pending is not None else await self._latest_entry(shard)
                entry = writer.plan_fence(latest, self._nonce())
                if entry is not None and not hold.prepared:
                    if not await self._prepared(shard, hold, latest):
                        return
                if entry is not None:
                    await self._settle_entry(shard, writer, entry)
            except CasUnavailable:
                return
            except TieredError as exc:
                if exc.code is not ErrorCode.SHARD_FENCED:
                    raise
                ctx = exc.context
                self.floors[shard] = (int(ctx["epoch"]), str(ctx["owner"]), int(ctx["owner_incarnation"]))
                self._drop(shard, exc.message)
                return
            if writer.fenced:
                if self.config.serve_in_background:
                    self._start_serving(shard, hold)
                else:
                    await self.hooks.serve(shard, hold.epoch)  # replay the chain up to the fence
                    self._now_serving(shard, hold)
                return

    def _now_serving(self, shard: int, hold: Hold) -> None:
        hold.state = HoldState.SERVING
        log.info(
            "node %s serves shard %d at epoch %d (fence at %s)",
            self.node_id,
            shard,
            hold.epoch,
            self.writers[shard].fence_seq,
        )

    def _start_serving(self, shard: int, hold: Hold) -> None:
        """Run ``hooks.serve`` beside the loop (a restore can outlast a beat interval); serve when it is done."""
        task = self._serve_tasks.get(shard)
        if task is not None and not task.done():
            return
        if hold.state is not HoldState.FENCING:
            return  # a pass that began before the restore ended: it is served already

        def done(task: asyncio.Task[None]) -> None:
            if self._serve_tasks.get(shard) is task:
                del self._serve_tasks[shard]
                self._restoring_holds.pop(shard, None)
            exc = None if task.cancelled() else task.exception()
            current = self.holds.get(shard)
            took = self.clock.monotonic() - self._restore_began.pop(shard, self.clock.monotonic())
            outcome = (
                "abandoned" if current is not hold else "failed" if exc or task.cancelled() else "completed"
            )
            self.restores[outcome] += 1
            if outcome == "completed":
                log.info(
                    "node %s restored shard %d (epoch %d) in %.2f s", self.node_id, shard, hold.epoch, took
                )
            if current is not hold:
                # Its hold was dropped: the engine it started (if any) holds the chain as restored
                # then; another owner may have acknowledged appends since. Stopped even when the
                # shard was taken again meanwhile (that hold's own serve waited for this task and
                # restores afresh); serving it would lose those appends and reuse their offsets.
                self.hooks.stopped(shard, "dropped while starting")
                return
            if exc is not None or task.cancelled():
                self._drop(shard, f"could not start serving: {exc!r}")
            elif hold.state is HoldState.FENCING:
                self._now_serving(shard, hold)

        task = asyncio.get_running_loop().create_task(self.hooks.serve(shard, hold.epoch))
        self._serve_tasks[shard] = task
        self._restore_began[shard] = self.clock.monotonic()
        self._restoring_holds[shard] = hold
        task.add_done_callback(done)

    async def _prepared(self, shard: int, hold: Hold, latest: ManifestEntry | None) -> bool:
        """Ask the data plane before fencing; on a refusal give the lease back and decline the shard."""
        try:
            await self.hooks.prepare(shard, hold.epoch, latest)
            hold.prepared = True
        except TieredError as exc:
            log.error("node %s cannot serve shard %d: %s; releasing it", self.node_id, shard, exc.message)
            self.declined[shard] = self.clock.monotonic() + self.config.timing.stale_after_s
            self.writers[shard].pending = None
            hold.release = plan_release(hold, nonce=self._nonce(), last_owner=latest.writer if latest else "")
            hold.state = HoldState.RELEASING
            await self._release(shard, hold)
            return False
        return True

    async def _settle_entry(self, shard: int, writer: ManifestWriter, entry: ManifestEntry) -> None:
        """Write ``entry`` create-only at its position; settle a lost answer or a taken position.

        Returns once the entry is in the chain, or once an older owner's entry
        took the position while fencing (the writer then fences above it).
        Raises ``SHARD_FENCED`` (dropping the shard) if a higher epoch is
        there, ``STORE_UNAVAILABLE`` if the outcome is unknown.
        """
        key = keys.manifest_key(shard, entry.seq)
        try:
            await self.store.put_if_absent(key, encode_entry(entry))
            writer.written(entry)
            return
        except (AlreadyExists, OutcomeUnknown):
            pass
        except (ConcurrentWrite, CasUnavailable) as exc:
            writer.vanished(entry)
            raise self._unknown(shard, entry) from exc
        try:
            found = await self.store.get(key)
        except CasUnavailable as exc:
            writer.vanished(entry)
            raise self._unknown(shard, entry) from exc
        if found is None:
            writer.vanished(entry)  # it may still land: the same bytes go first next time
            raise self._unknown(shard, entry)
        try:
            result = writer.conflict(entry, decode_entry(found.data, shard, entry.seq))
        except TieredError as exc:
            if exc.code is ErrorCode.SHARD_FENCED and self.writers.get(shard) is writer:
                self._drop(shard, exc.message)  # (not a newer hold taken while this write was out)
            raise
        if result is WriteResult.RETRY:
            log.info(
                "shard %d: an older owner's entry %d landed while fencing; fencing above it", shard, entry.seq
            )

    def _unknown(self, shard: int, entry: ManifestEntry) -> CasUnavailable:
        return OutcomeUnknown(keys.manifest_key(shard, entry.seq), "manifest write outcome unknown")

    async def _handoff(self, shard: int, hold: Hold) -> None:
        """Stop acknowledging, flush, release: the intended owner takes the next epoch."""
        if hold.state is HoldState.FENCING:
            hold.release = plan_release(hold, nonce=self._nonce())
        elif hold.state is HoldState.SERVING:
            hold.state = HoldState.RELEASING
            try:
                await self.hooks.flush(shard)
            except Exception:
                log.exception("shard %d: flush before handoff failed; serving on", shard)
                hold.state = HoldState.SERVING
                return
            hold.release = plan_release(hold, nonce=self._nonce(), last_owner=self.node_id)
        hold.state = HoldState.RELEASING
        await self._release(shard, hold)

    async def _release(self, shard: int, hold: Hold) -> None:
        if hold.release is None:
            hold.release = plan_release(hold, nonce=self._nonce())
        if await self._lease_write(hold.release) is not None:
            self._drop(shard, "handed off")

    def _not_owned(self, shard: int, why: str) -> TieredError:
        owner = self.owner_of(shard)
        context: dict[str, object] = {"shard": shard, "retry_after_s": 1}
        if owner is not None and owner[0] != self.node_id:
            context["owner"], context["owner_url"] = owner
        return TieredError(ErrorCode.SHARD_NOT_OWNED, f"shard {shard}: {why}", **context)
