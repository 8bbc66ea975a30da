"""``/metrics`` of a cluster node: the node's own series, then every served shard's engine, labelled by shard.

A single server exposes one engine's registry (``tiered.engine.engine_metrics``). A
cluster node runs one engine per served shard, each with its own registry,
so the same metric names come from several engines: they are merged into
one family each, every sample labelled ``shard="NNNN"`` (a Prometheus family
may appear only once in an exposition). The node adds what is its own:

* the process (``process_*``: CPU, memory, file descriptors);
* HTTP: ``tiered_http_requests_total{route,status}``, every answer this node
  gave, and ``tiered_http_client_disconnects_total{route,phase}``, every
  client that left (the engines' own counters are not fed in cluster mode:
  the node's request-id layer counts once, forwarded requests included as
  ``route="unmatched"`` unless a local engine named the route);
* the cluster: shards (count), shards held here by lease state, this
  incarnation, whether the acknowledgement window is open, requests
  forwarded to owners, usage summaries exchanged;
* the node's own background jobs (``tiered_job_*{job}``: the lease loop, the
  usage exchange), from its supervisor; each engine's jobs come with its
  families, labelled by shard.

Same rule as a single server: the route is an admin route (the admin token
when one is configured).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tiered.api.kit.request_metrics import RequestCounts
from tiered.cluster.features.bucket_totals_exchange import UsageExchange
from tiered.cluster.gateway.forward import Forwarder
from tiered.cluster.membership.lease import HoldState
from tiered.cluster.membership.node_shell import ClusterNode
from tiered.cluster.shards.restore_metrics import ShardRecords, restore_families
from tiered.core.clock import Clock
from tiered.engine.engine import Engine
from tiered.engine.supervisor import Supervisor

__all__ = ["ClusterMetrics", "merge_families"]

#: Engine families the node replaces by its own (the engines' request counters stay empty in cluster mode).
_NODE_OWNED = frozenset({"tiered_http_requests", "tiered_http_client_disconnects"})


def merge_families(sources: Iterable[tuple[str, Iterable[Metric]]]) -> list[Metric]:
    """One family per name, each sample labelled with its source's shard (``sources``: (shard label, families))."""
    merged: dict[str, Metric] = {}
    for shard, families in sources:
        for family in families:
            if family.name in _NODE_OWNED:
                continue
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                out.samples.append(sample._replace(labels={**sample.labels, "shard": shard}))
    return [merged[name] for name in sorted(merged)]


class Source(Protocol):
    """What the node's metrics read (``ClusterServer``)."""

    clock: Clock
    node: ClusterNode | None
    forwarder: Forwarder
    supervisor: Supervisor
    host: ShardRecords  # restores and checkpoints (object-store durability)

    def engines(self) -> dict[int, Engine]:
        """Every shard's engine on this node (served now or not)."""
        ...

    def served_engines(self) -> dict[int, Engine]: ...


class ClusterMetrics:
    def __init__(self, cluster: Source, usage: UsageExchange) -> None:
        self.cluster = cluster
        self.usage = usage
        self.registry = CollectorRegistry()
        #: Every answer this node gave (``tiered.api.kit.middleware.request_id`` counts them here).
        self.requests = RequestCounts()
        ProcessCollector(registry=self.registry)
        self.registry.register(self.requests)
        self.registry.register(_NodeCollector(self))

    def exposition(self) -> bytes:
        engines = sorted(self.cluster.engines().items())
        shards = [(f"{shard:04d}", engine.metrics.registry.collect()) for shard, engine in engines]
        own = {family.name: family for family in self.registry.collect()}
        families = list(own.values())
        for family in merge_families(shards):
            mine = own.get(family.name)
            if mine is None:
                families.append(family)
            else:  # the node's jobs and the engines' (``tiered_job_*``): one family, the engines' by shard
                mine.samples.extend(family.samples)
        combined = CollectorRegistry()
        combined.register(_Fixed(families))
        return prometheus_client.generate_latest(combined)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _settling_families(node: ClusterNode | None, clock: Clock) -> Iterator[Metric]:
    """Restores by outcome, shards being restored, and the clock check (docs/cluster.md, "Settling")."""
    restores = CounterMetricFamily(
        "tiered_cluster_restores",
        "Shard restores (fenced, replaying before serving) by how they ended: 'completed', 'abandoned' "
        "(the shard was lost mid-restore: never served from it), 'failed'",
        labels=["outcome"],
    )
    for outcome, count in (node.restores if node is not None else {}).items():
        restores.add_metric([outcome], count)
    yield restores
    yield GaugeMetricFamily(
        "tiered_cluster_shards_restoring",
        "Shards this node is restoring now (placement leaves them here while it lives)",
        value=len(node.restoring()) if node is not None else 0,
    )
    yield GaugeMetricFamily(
        "tiered_cluster_clock_out_of_bound",
        "1 while this node's clock rate disagrees with most of its references beyond the bound "
        "(it declares no peer dead and /readyz is 503)",
        value=1 if node is not None and node.clock_out_of_bound else 0,
    )
    rate = GaugeMetricFamily(
        "tiered_cluster_clock_rate",
        "This node's monotonic clock rate over a reference's ('store': the store's Date; else a peer's node "
        "id), estimated over the clock check's window (1: equal rates)",
        labels=["reference"],
    )
    if node is not None:
        for reference, estimate in sorted(node.clock_check.estimates(clock.monotonic()).items()):
            rate.add_metric([reference], estimate.rate)
    yield rate


class _NodeCollector:
    def __init__(self, metrics: ClusterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        cluster = m.cluster
        node = cluster.node
        spec = node.spec if node is not None else None
        yield GaugeMetricFamily(
            "tiered_cluster_shards", "Shards in the cluster", value=spec.shard_count if spec else 0
        )
        held = GaugeMetricFamily(
            "tiered_cluster_shards_held", "Shards whose lease this node holds, by state", labels=["state"]
        )
        states = [h.state for h in node.holds.values()] if node is not None else []
        for state in HoldState:
            held.add_metric([state.value], sum(1 for s in states if s is state))
        yield held
        yield GaugeMetricFamily(
            "tiered_cluster_shards_served",
            "Shards this node acknowledges in now (lease held, fenced, window open)",
            value=len(cluster.served_engines()),
        )
        yield GaugeMetricFamily(
            "tiered_cluster_incarnation",
            "This node process's incarnation (rises at every restart or rejoin)",
            value=node.incarnation if node is not None else 0,
        )
        window = node is not None and node.window.allows(cluster.clock.monotonic())
        yield GaugeMetricFamily(
            "tiered_cluster_window_open",
            "1 while this node's heartbeat keeps its leases valid (it may acknowledge)",
            value=1 if window else 0,
        )
        taken = CounterMetricFamily(
            "tiered_cluster_shards_taken",
            "Shard leases this node won, by what it took them from: 'new' (never held), 'handoff' (released by "
            "their holder), 'takeover' (another node's lease: it expired or its holder was declared dead)",
            labels=["from"],
        )
        for kind, count in (node.takes if node is not None else {}).items():
            taken.add_metric([kind], count)
        yield taken
        yield from _settling_families(node, cluster.clock)
        yield CounterMetricFamily(
            "tiered_cluster_forwarded",
            "Requests this node forwarded to the owner of their shard",
            value=cluster.forwarder.forwarded,
        )
        usage = m.usage
        yield CounterMetricFamily(
            "tiered_cluster_usage_rounds",
            "Usage exchanges completed (publish this node's shards' usage, read the others')",
            value=usage.rounds,
        )
        yield CounterMetricFamily(
            "tiered_cluster_usage_errors",
            "Usage exchanges cut short by the object store",
            value=usage.errors,
        )
        yield from cluster.supervisor.families()
        yield from restore_families(cluster.host)
