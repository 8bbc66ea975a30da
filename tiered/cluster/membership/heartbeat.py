"""Liveness: each node heartbeats its own object; peers judge it by their own clocks. Pure.

A node's heartbeat object ``{node, incarnation, state, beat, nonce, ...}`` is
written only by compare-and-set:

* join: a process starting as node X writes incarnation n + 1 over X's
  object when it shows incarnation n ``dead`` or ``stopped``, or after this
  process saw it unchanged for ``ttl + margin`` (a previous process of X that
  crashed), or creates it when there is none;
* beat: the node replaces its own object (``If-Match`` its last ETag) with
  ``beat + 1`` every interval; each successful beat renews every lease it
  holds, from the beat's send time (``lease.AckWindow``);
* declare dead: a peer that saw the object unchanged for ``ttl + margin`` on
  its own monotonic clock replaces it (``If-Match`` the ETag it saw) with
  ``state: dead``. That compare-and-set is the fence: the dead incarnation's
  next beat fails, so its window is never extended again, and it can no
  longer have been extended since the version the peer saw;
* stop: a node shutting down, after it handed every shard off, writes
  ``state: stopped``.

Incarnations only grow (each join is one compare-and-set on the same object),
so "incarnation n of X is dead" is a fact once any reader has seen X's object
dead at n or at any later incarnation; a stale reader just does not know it
yet. Leases name the incarnation that holds them; a lease whose incarnation
is dead may be taken over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from tiered.cluster.membership.lease import LeaseTiming
from tiered.core.errors import ErrorCode, TieredError

__all__ = [
    "HeartbeatBody",
    "HeartbeatRecord",
    "HeartbeatWrite",
    "Liveness",
    "NodeState",
    "PeerView",
    "decode_heartbeat",
    "encode_heartbeat",
    "plan_beat",
    "plan_declare_dead",
    "plan_join",
    "plan_stop",
]


class Liveness(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"  # declared dead by a peer (or found so by itself)
    STOPPED = "stopped"  # shut down cleanly after handing its shards off


class HeartbeatBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    node: str
    incarnation: int
    state: Liveness
    beat: int
    nonce: str
    advertise_url: str = ""
    declared_by: str = ""  # the peer that declared it dead
    # (shard, epoch) of every shard this incarnation is restoring (fenced, not serving yet): placement
    # leaves those shards with it while it is alive (``placement.restoring_owners``).
    restoring: tuple[tuple[int, int], ...] = ()
    # The writer's monotonic clock (seconds) when it sent this write; 0: not given. Peers compare its
    # rate with their own (``clock_check``); it is never compared with another clock's reading.
    clock: float = 0.0


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    body: HeartbeatBody
    etag: str


@dataclass(frozen=True, slots=True)
class HeartbeatWrite:
    node: str
    body: HeartbeatBody
    if_match: str | None  # None: create


def encode_heartbeat(body: HeartbeatBody) -> bytes:
    return msgspec.json.encode(body)


def decode_heartbeat(data: bytes, node: str) -> HeartbeatBody:
    try:
        body = msgspec.json.decode(data, type=HeartbeatBody)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TieredError(
            ErrorCode.DATA_DAMAGED, f"the heartbeat of node {node} is unreadable: {exc}"
        ) from None
    if body.node != node or body.incarnation < 1:
        raise TieredError(
            ErrorCode.DATA_DAMAGED,
            f"the heartbeat object of node {node} names node {body.node!r}, incarnation {body.incarnation}",
        )
    return body


@dataclass(slots=True)
class NodeState:
    """What one process has seen of one node's heartbeat, and since when (its own clock)."""

    record: HeartbeatRecord | None  # None: no object
    since: float  # answer time of the first read that returned this version
    # The highest incarnation known dead: seen dead/stopped, or superseded by a later one.
    dead_through: int = 0


@dataclass
class PeerView:
    """One process's judgement of every node's liveness, from its own reads and its own clock."""

    timing: LeaseTiming
    nodes: dict[str, NodeState] = field(default_factory=dict)

    def observe(self, node: str, record: HeartbeatRecord | None, at: float) -> None:
        """Record a read of ``node``'s heartbeat whose answer arrived at ``at`` (this clock)."""
        seen = self.nodes.get(node)
        if seen is None:
            seen = self.nodes[node] = NodeState(record, at)
        elif _version(seen.record) != _version(record):
            seen.record, seen.since = record, at
        if record is not None:
            body = record.body
            known_dead = body.incarnation if body.state is not Liveness.ALIVE else body.incarnation - 1
            seen.dead_through = max(seen.dead_through, known_dead)

    def forget(self, node: str) -> None:
        self.nodes.pop(node, None)

    def record(self, node: str) -> HeartbeatRecord | None:
        seen = self.nodes.get(node)
        return seen.record if seen else None

    def unchanged_for(self, node: str, now: float) -> float:
        """How long this process has seen ``node``'s heartbeat as it is now (0 if never read)."""
        seen = self.nodes.get(node)
        return 0.0 if seen is None else max(0.0, now - seen.since)

    def stale(self, node: str, now: float) -> bool:
        """Seen unchanged for ``ttl + margin``: whatever wrote it can no longer be acknowledging."""
        seen = self.nodes.get(node)
        return seen is not None and now - seen.since >= self.timing.stale_after_s

    def is_dead(self, node: str, incarnation: int) -> bool:
        """Whether ``incarnation`` of ``node`` is known to be dead (a fact that never reverts)."""
        seen = self.nodes.get(node)
        return seen is not None and incarnation <= seen.dead_through

    def alive(self, node: str, now: float) -> bool:
        """Counted for placement: an alive heartbeat that has changed within ``ttl + margin``."""
        seen = self.nodes.get(node)
        return (
            seen is not None
            and seen.record is not None
            and seen.record.body.state is Liveness.ALIVE
            and not self.stale(node, now)
        )

    def live_nodes(self, now: float) -> list[str]:
        return sorted(node for node in self.nodes if self.alive(node, now))

    def suspects(self, now: float) -> list[str]:
        """Nodes whose alive heartbeat went stale: candidates to declare dead."""
        return sorted(
            node
            for node, seen in self.nodes.items()
            if seen.record is not None and seen.record.body.state is Liveness.ALIVE and self.stale(node, now)
        )


def _version(record: HeartbeatRecord | None) -> str | None:
    return None if record is None else record.etag


def plan_join(
    node: str,
    current: HeartbeatRecord | None,
    view: PeerView,
    now: float,
    *,
    incarnation_floor: int,
    advertise_url: str,
    nonce: str,
    clock: float = 0.0,
) -> HeartbeatWrite | None:
    """The write that makes this process the next incarnation of ``node``, or None to wait.

    ``incarnation_floor`` is the highest incarnation of ``node`` any lease
    names, so a new incarnation is newer than every holder even if the
    heartbeat object was lost. A previous incarnation that may still run
    (alive and not yet stale here) is waited for, never overwritten.
    """
    if current is None:
        # No object. Fresh, or lost while a previous incarnation held leases: then wait it out.
        if incarnation_floor and not view.stale(node, now):
            return None
        base, etag = incarnation_floor, None
    else:
        body = current.body
        if body.state is Liveness.ALIVE and not view.stale(node, now):
            return None
        base, etag = max(body.incarnation, incarnation_floor), current.etag
    new = HeartbeatBody(node, base + 1, Liveness.ALIVE, 0, nonce, advertise_url, clock=clock)
    return HeartbeatWrite(node, new, etag)


def plan_beat(
    current: HeartbeatRecord,
    nonce: str,
    *,
    restoring: tuple[tuple[int, int], ...] = (),
    clock: float = 0.0,
) -> HeartbeatWrite:
    """The next beat over our own last version, saying which shards we are restoring now."""
    body = current.body
    new = HeartbeatBody(
        body.node,
        body.incarnation,
        Liveness.ALIVE,
        body.beat + 1,
        nonce,
        body.advertise_url,
        restoring=restoring,
        clock=clock,
    )
    return HeartbeatWrite(body.node, new, current.etag)


def plan_stop(current: HeartbeatRecord, nonce: str) -> HeartbeatWrite:
    """Our clean shutdown: peers may take over at once (we hand off first and ack nothing after)."""
    body = current.body
    new = HeartbeatBody(
        body.node, body.incarnation, Liveness.STOPPED, body.beat + 1, nonce, body.advertise_url
    )
    return HeartbeatWrite(body.node, new, current.etag)


def plan_declare_dead(
    node: str, seen: HeartbeatRecord | None, *, by: str, nonce: str, incarnation_floor: int = 0
) -> HeartbeatWrite:
    """Fence ``node``: over the stale version we saw, or a dead marker where there was no object."""
    if seen is None:
        body = HeartbeatBody(node, max(incarnation_floor, 1), Liveness.DEAD, 0, nonce, "", by)
        return HeartbeatWrite(node, body, None)
    old = seen.body
    body = HeartbeatBody(node, old.incarnation, Liveness.DEAD, old.beat + 1, nonce, old.advertise_url, by)
    return HeartbeatWrite(node, body, seen.etag)
