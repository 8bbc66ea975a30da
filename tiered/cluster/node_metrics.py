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
  forwarded to owners, usage summaries exchanged.

Same rule as a single server: the route is an admin route (the admin token
when one is configured).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tiered.api.kit.types import UNMATCHED, Request, Response
from tiered.cluster.membership.lease import HoldState
from tiered.engine.engine_metrics import disconnects_family

if TYPE_CHECKING:
    from tiered.cluster.server import ClusterServer

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


class ClusterMetrics:
    def __init__(self, cluster: ClusterServer) -> None:
        self.cluster = cluster
        self.registry = CollectorRegistry()
        self.requests: dict[str, dict[int, int]] = {}  # route -> status -> answers
        self.disconnects: dict[tuple[str, str], int] = {}  # (route, phase) -> clients that left
        ProcessCollector(registry=self.registry)
        self.registry.register(_NodeCollector(self))

    def count_answer(self, request: Request, response: Response) -> None:
        route = request.route or UNMATCHED
        by_status = self.requests.setdefault(route, {})
        by_status[response.status] = by_status.get(response.status, 0) + 1

    def count_disconnect(self, request: Request, phase: str) -> None:
        key = (request.route or UNMATCHED, phase)
        self.disconnects[key] = self.disconnects.get(key, 0) + 1

    def exposition(self) -> bytes:
        engines = sorted(self.cluster.host.engines.items())
        shards = [(f"{shard:04d}", engine.metrics.registry.collect()) for shard, engine in engines]
        combined = CollectorRegistry()
        combined.register(_Fixed([*self.registry.collect(), *merge_families(shards)]))
        return prometheus_client.generate_latest(combined)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class _NodeCollector:
    def __init__(self, metrics: ClusterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        requests = CounterMetricFamily(
            "tiered_http_requests",
            "HTTP requests this node answered, by route (the router's name for it, never the path) and status",
            labels=["route", "status"],
        )
        for route, by_status in sorted(m.requests.items()):
            for status, n in sorted(by_status.items()):
                requests.add_metric([route, str(status)], n)
        yield requests
        yield disconnects_family(m.disconnects)
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
        yield CounterMetricFamily(
            "tiered_cluster_forwarded",
            "Requests this node forwarded to the owner of their shard",
            value=cluster.forwarder.forwarded,
        )
        usage = cluster.usage
        yield CounterMetricFamily(
            "tiered_cluster_usage_rounds",
            "Usage exchanges completed (publish this node's shards' usage, read the others')",
            value=usage.rounds if usage is not None else 0,
        )
        yield CounterMetricFamily(
            "tiered_cluster_usage_errors",
            "Usage exchanges cut short by the object store",
            value=usage.errors if usage is not None else 0,
        )
