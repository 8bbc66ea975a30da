"""Per-bucket Prometheus metrics (collected by ``tiered.engine.engine_metrics``, kept here so that file stays small).

Label cardinality is capped: the ``max_buckets`` buckets with the most
appended bytes (ties by name) get their own ``bucket`` label; every other
bucket is summed into ``bucket="_other"`` (no bucket can be named that:
names are lowercase letters, digits and '-'). Counters include what was
counted since the last ``UsageRecorded``, so they move live (and a crash can
set them back by at most one usage interval, which Prometheus treats as a
counter reset).

| metric | labels |
| --- | --- |
| ``tiered_bucket_appended_bytes_total``, ``tiered_bucket_appended_records_total`` | bucket |
| ``tiered_bucket_egress_bytes_total`` | bucket, tier (hot, cold) |
| ``tiered_bucket_requests_total`` | bucket, class (append, read, live, admin) |
| ``tiered_bucket_retained_bytes`` | bucket, tier (hot, cold, producers: idempotent producers' state, snapshots, key_index: keyed streams' key indexes) |
| ``tiered_bucket_streams``, ``tiered_bucket_live_readers`` | bucket |
| ``tiered_bucket_quota_refusals_total`` | bucket, quota |
"""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tiered.engine.streams.state import StreamState
from tiered.engine.tenants.footprint import Footprint, footprints
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.state import TenantState
from tiered.engine.tenants.usage_counters import BucketUsage, UsageCounter

OTHER = "_other"


def _label_for(names: list[str], usage: dict[str, BucketUsage], max_buckets: int) -> dict[str, str]:
    ranked = sorted(names, key=lambda b: (-usage[b].appended_bytes, b))
    return {b: (b if i < max_buckets else OTHER) for i, b in enumerate(ranked)}


def bucket_metric_families(
    streams: StreamState, tenants: TenantState, counter: UsageCounter, gate: TenantGate, max_buckets: int
) -> list[Metric]:
    """The per-bucket metric families (for the node's collector, ``tiered.engine.engine_metrics``); counters end in ``_total``."""
    fps = footprints(streams)
    names = sorted(set(streams.buckets) | set(tenants.usage) | set(fps))
    usage: dict[str, BucketUsage] = {}
    for b in names:
        u = replace(tenants.peek(b))
        u.add(counter.pending(b))
        usage[b] = u
    label = _label_for(names, usage, max_buckets)
    total: dict[str, BucketUsage] = {}
    space: dict[str, Footprint] = {}
    live: dict[str, int] = {}
    for b in names:
        lb = label[b]
        t = total.setdefault(lb, BucketUsage())
        u = usage[b]
        for f in BucketUsage.__slots__:
            setattr(t, f, getattr(t, f) + getattr(u, f))
        fp = fps.get(b)
        if fp is not None:
            space.setdefault(lb, Footprint()).add(fp)
        live[lb] = live.get(lb, 0) + gate.live.get(b, 0)
    refusals: dict[tuple[str, str], int] = {}
    for (b, quota), n in gate.refusals.items():
        key = (label.get(b, OTHER), quota)
        refusals[key] = refusals.get(key, 0) + n
    labels = sorted(total)
    appended_bytes = CounterMetricFamily(
        "tiered_bucket_appended_bytes",
        "Bytes appended to the bucket's streams (acknowledged)",
        labels=["bucket"],
    )
    appended_records = CounterMetricFamily(
        "tiered_bucket_appended_records", "Records appended to the bucket's streams", labels=["bucket"]
    )
    egress = CounterMetricFamily(
        "tiered_bucket_egress_bytes",
        "Stored bytes read from the bucket's streams, by tier",
        labels=["bucket", "tier"],
    )
    requests = CounterMetricFamily(
        "tiered_bucket_requests", "Requests admitted for the bucket, by class", labels=["bucket", "class"]
    )
    for b in labels:
        t = total[b]
        appended_bytes.add_metric([b], t.appended_bytes)
        appended_records.add_metric([b], t.appended_records)
        egress.add_metric([b, "hot"], t.egress_hot)
        egress.add_metric([b, "cold"], t.egress_cold)
        for cls, n in (
            ("append", t.append_requests),
            ("read", t.read_requests),
            ("live", t.live_requests),
            ("admin", t.admin_requests),
        ):
            requests.add_metric([b, cls], n)
    retained = GaugeMetricFamily(
        "tiered_bucket_retained_bytes",
        "Bytes the bucket's streams hold, by tier (producers: idempotent producers' state; key_index: "
        "keyed streams' key index objects)",
        labels=["bucket", "tier"],
    )
    streams_gauge = GaugeMetricFamily(
        "tiered_bucket_streams", "Streams in the bucket (not deleted)", labels=["bucket"]
    )
    for b in sorted(space):
        for tier, n in space[b].by_tier().items():
            retained.add_metric([b, tier], n)
        streams_gauge.add_metric([b], space[b].streams)
    live_readers = GaugeMetricFamily(
        "tiered_bucket_live_readers", "Long-poll and SSE readers of the bucket", labels=["bucket"]
    )
    for b in sorted(live):
        live_readers.add_metric([b], live[b])
    quota_refusals = CounterMetricFamily(
        "tiered_bucket_quota_refusals",
        "Requests refused by a quota of the bucket",
        labels=["bucket", "quota"],
    )
    for (b, quota), n in sorted(refusals.items()):
        quota_refusals.add_metric([b, quota], n)
    return [
        appended_bytes,
        appended_records,
        egress,
        requests,
        retained,
        streams_gauge,
        live_readers,
        quota_refusals,
    ]
