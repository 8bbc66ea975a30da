"""Prometheus metrics of one node, through prometheus-client, in the node's own registry.

``/metrics`` is an admin route (scrape it with the admin token). Each node
has its own ``CollectorRegistry`` (never the library's global one), so tests
can run several nodes in one process. Two kinds of metric:

* **Read from state at scrape time** (``NodeCollector``): gauges and lifetime
  counters the service already keeps (streams, hot and cold bytes, flusher
  and GC totals, integrity errors...). Nothing on the request path updates
  them.
* **Instruments** (``Metrics``): latency histograms observed where the work
  happens (append, journal sync, object-store requests, flush and GC passes).
  Labelled children are made once and cached, so an observation is one call.
  What every append pays (its histogram) is kept in plain Python numbers on
  the event loop and exposed by a custom collector: no lock, no object per
  observation.
* **Background jobs** (``tiered_job_*``, by job): from the engine's supervisor
  (``tiered.engine.supervisor``): restarts, the last crash, whether it runs.

HTTP requests (``tiered_http_requests_total``, client disconnects) are
counted by the HTTP layer (``tiered.api.kit.request_metrics``), beside this
registry in the exposition.

No stream name is ever a label, and bucket names only in the per-bucket
metrics of ``tiered.engine.tenants.bucket_metrics`` (their cardinality is capped by
``--metrics-max-buckets``); ``route`` is the router's name for a route (its
pattern, or ``append``/``read``... for stream operations), so the number of
series is bounded whatever paths clients send.
``docs/operations.md`` lists every metric; ``tests/engine/test_metrics.py`` checks
that the names used there and in ``terraform/monitoring.tf`` exist here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.context_managers import Timer
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from tiered.core.config import Config
from tiered.engine.groups.service import GroupService
from tiered.engine.jobs.health import StoreHealth
from tiered.engine.streams.reader import StreamReader
from tiered.engine.streams.service import StreamService
from tiered.engine.streams.state import StreamState
from tiered.engine.streams.visibility import Waiters
from tiered.engine.subscriptions.service import SubscriptionService
from tiered.engine.supervisor import Supervisor
from tiered.engine.tenants.bucket_metrics import bucket_metric_families
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.service import TenantService
from tiered.engine.timed import TimedFlusher
from tiered.gc.runner import GcRunner
from tiered.hot.log import SegmentLog

# ``*_created`` series (a timestamp per counter and histogram child) would double
# the scrape for nothing an alarm uses. A library-wide switch: tiered is the process.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: Append and journal sync: fdatasync on local SSD or EBS takes 0.1-10 ms.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Object-store requests: tens of ms, up to the client's retries (about 30 s).
STORE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Flush and GC passes: one upload, or a bounded batch of deletions and a listing.
PASS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

#: Object-store operations timed by ``tiered.engine.timed.TimedStore``.
STORE_OPERATIONS = ("put", "get", "head", "delete", "delete_many", "list")


class Metrics:
    """One node's registry and the instruments its shells observe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.append_seconds = LoopHistogram(
            "tiered_append_seconds",
            "Appends from admission to the answer (durable when acknowledged), refusals included",
            FAST_BUCKETS,
        )
        self.fsync_seconds = Histogram(
            "tiered_fsync_seconds",
            "Journal batches: write + fdatasync (fsync=always), or each periodic fdatasync (fsync=interval)",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.store_request_seconds = Histogram(
            "tiered_store_request_seconds",
            "Object-store requests by operation, retries included (list: a whole listing)",
            ["operation"],
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.cold_flush_seconds = Histogram(
            "tiered_cold_flush_seconds",
            "Flush passes that uploaded an object or failed (idle passes are not counted)",
            buckets=PASS_BUCKETS,
            registry=r,
        )
        self.gc_pass_seconds = Histogram(
            "tiered_gc_pass_seconds",
            "GC passes (not dry runs), scheduled or asked for over the admin API",
            buckets=PASS_BUCKETS,
            registry=r,
        )
        self.store_operations = {op: self.store_request_seconds.labels(op) for op in STORE_OPERATIONS}
        r.register(LoopCollector(self))

    def watch(self, engine: Watched) -> None:
        """Expose ``engine``'s state (its composed parts) at every scrape."""
        self.registry.register(EngineCollector(engine))

    def exposition(self) -> bytes:
        """The Prometheus text format (0.0.4) of everything in this node's registry."""
        return prometheus_client.generate_latest(self.registry)


class LoopHistogram:
    """A histogram observed only on the event loop, for the append path: a bisect and two additions.

    prometheus-client's ``Histogram`` takes a lock per bucket and sum (about
    0.7 us an observation, 1.1 us through ``time()``, measured here); this one
    about 0.2 us, which the append path can afford. It is exposed through a
    custom collector (``LoopCollector``) in the same text format.
    """

    __slots__ = ("name", "documentation", "bounds", "counts", "sum")

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount

    def time(self) -> AbstractContextManager[Any]:
        return Timer(self, "observe")  # type: ignore[no-untyped-call]

    def family(self) -> HistogramMetricFamily:
        cumulative, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            cumulative.append((floatToGoString(bound), total))  # type: ignore[no-untyped-call]
        return HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=self.sum)


class LoopCollector:
    """What the append path observes without prometheus-client's locks: its latency."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield self.metrics.append_seconds.family()


class Watched(Protocol):
    """The parts of an engine its collector reads (``tiered.engine.engine.Engine`` once composed)."""

    config: Config
    state: StreamState
    reader: StreamReader
    flusher: TimedFlusher
    gc: GcRunner
    store_health: StoreHealth
    waiters: Waiters
    log: SegmentLog
    streams: StreamService
    groups: GroupService
    subscriptions: SubscriptionService
    tenants: TenantService
    gate: TenantGate
    supervisor: Supervisor


class EngineCollector:
    """Gauges and lifetime counters read from the engine's state when scraped."""

    def __init__(self, engine: Watched) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        node = self.engine
        state, reader, flusher, gc, store = node.state, node.reader, node.flusher, node.gc, node.store_health

        yield gauge(
            "tiered_streams",
            "Streams that exist (not deleted)",
            sum(1 for s in state.streams.values() if not s.soft_deleted),
        )
        yield gauge("tiered_hot_bytes", "Bytes held only in the hot tier (not yet cold)", state.hot_bytes)
        yield gauge("tiered_cold_objects", "Objects the metadata references", len(state.cold_objects))
        yield gauge(
            "tiered_cold_bytes",
            "Bytes of the objects the metadata references",
            sum(o.size for o in state.cold_objects.values()),
        )
        integrity = CounterMetricFamily(
            "tiered_integrity_errors",
            "Reads and copies refused because stored bytes failed their checksum",
            labels=["tier"],
        )
        for tier, n in reader.integrity_errors.items():
            integrity.add_metric([tier], n)
        yield integrity
        yield counter("tiered_store_stalls", "Object-store calls abandoned at their deadline", store.stalls)
        yield gauge(
            "tiered_store_reachable",
            "Whether the object store answered its last probe or call (1) or not (0)",
            1 if store.reachable else 0,
        )
        yield gauge("tiered_live_readers", "Long-poll and SSE readers waiting for data", node.waiters.count)
        yield gauge(
            "tiered_hot_damaged_frames",
            "Hot records known to fail their checksum",
            sum(len(d) for d in node.log.damage().values()),
        )

        yield counter("tiered_cold_puts", "Objects uploaded by the flusher", flusher.puts)
        yield counter("tiered_cold_bytes_uploaded", "Bytes uploaded by the flusher", flusher.bytes_uploaded)
        yield counter("tiered_cold_flush_failures", "Flush passes that failed", flusher.failures)
        yield gauge(
            "tiered_cold_flush_damaged_streams",
            "Streams the flusher stopped copying at a damaged hot record",
            len(flusher.damaged),
        )

        t = gc.totals
        yield gauge(
            "tiered_producer_states",
            "Idempotent producers with state on a stream (bounded by --max-producers-per-stream, expired "
            "after --producer-ttl-s idle)",
            sum(len(s.producers) for s in state.streams.values()),
        )
        dropped = CounterMetricFamily(
            "tiered_producer_states_dropped",
            "Producer states dropped: idle past --producer-ttl-s (expired), or the longest idle one evicted "
            "by a new producer at --max-producers-per-stream (cap); either producer is treated as new",
            labels=["reason"],
        )
        counts = node.streams.producer_states_dropped
        dropped.add_metric(["expired"], counts["expired"] + t.producer_states_expired)
        dropped.add_metric(["cap"], counts["cap"])
        yield dropped
        yield gauge(
            "tiered_gc_pending_deletions",
            "Objects no stream owns, waiting for their grace delay or their deletion",
            gc.pending_deletions(),
        )
        yield counter(
            "tiered_gc_bytes_reclaimed", "Bytes GC freed (cold objects and hot copies)", t.bytes_reclaimed
        )
        yield counter(
            "tiered_gc_objects_deleted", "Cold objects GC deleted (orphans included)", t.objects_deleted
        )
        yield counter("tiered_gc_orphans_found", "Objects no metadata references, found", t.orphans_found)
        yield counter(
            "tiered_gc_errors", "GC passes that failed, and deletions a pass could not make", t.errors
        )
        yield gauge(
            "tiered_gc_integrity_errors",
            "Objects the metadata references but the store lacks, at the last reconciliation",
            t.integrity_errors,
        )
        yield gauge(
            "tiered_gc_last_pass_timestamp_seconds",
            "When the last GC pass finished (Unix seconds; 0: none yet)",
            t.last_pass_ms / 1000,
        )
        groups = node.groups.skips
        yield counter(
            "tiered_group_skipped_bytes",
            "Bytes consumer groups never processed because retention released them first (cursors moved past)",
            groups.skipped_bytes,
        )
        yield counter(
            "tiered_group_skipped_ranges",
            "Times retention moved a consumer group's cursor past data it had not committed",
            groups.skipped_ranges,
        )
        subscriptions = node.subscriptions.skips
        yield counter(
            "tiered_subscription_skipped_bytes",
            "Bytes subscription links never had acked because retention released them first (acked offsets moved past)",
            subscriptions.skipped_bytes,
        )
        yield counter(
            "tiered_subscription_skipped_ranges",
            "Times retention moved a subscription link's acked offset past data it had not acked",
            subscriptions.skipped_ranges,
        )
        yield from bucket_metric_families(
            state, node.tenants.state, node.tenants.counter, node.gate, node.config.metrics_max_buckets
        )
        yield from node.supervisor.families()


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    """A counter named ``name`` + ``_total`` in the exposition."""
    return CounterMetricFamily(name, documentation, value=value)
