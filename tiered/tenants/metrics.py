"""Per-bucket Prometheus metrics (rendered by ``tiered.admin.metrics``, kept here so that file stays small).

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
| ``tiered_bucket_retained_bytes`` | bucket, tier (hot, cold) |
| ``tiered_bucket_streams``, ``tiered_bucket_live_readers`` | bucket |
| ``tiered_bucket_quota_refusals_total`` | bucket, quota |
"""

from __future__ import annotations

from dataclasses import replace

from tiered.streams.state import StreamState

from .footprint import Footprint, footprints
from .gate import TenantGate
from .state import TenantState
from .usage import BucketUsage, UsageCounter

OTHER = "_other"


def _label_for(names: list[str], usage: dict[str, BucketUsage], max_buckets: int) -> dict[str, str]:
    ranked = sorted(names, key=lambda b: (-usage[b].appended_bytes, b))
    return {b: (b if i < max_buckets else OTHER) for i, b in enumerate(ranked)}


def bucket_metric_lines(
    streams: StreamState, tenants: TenantState, counter: UsageCounter, gate: TenantGate, max_buckets: int
) -> list[str]:
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
            s = space.setdefault(lb, Footprint())
            s.streams += fp.streams
            s.hot_bytes += fp.hot_bytes
            s.cold_bytes += fp.cold_bytes
        live[lb] = live.get(lb, 0) + gate.live.get(b, 0)
    refusals: dict[tuple[str, str], int] = {}
    for (b, quota), n in gate.refusals.items():
        key = (label.get(b, OTHER), quota)
        refusals[key] = refusals.get(key, 0) + n
    labels = sorted(total)
    lines = [
        "# HELP tiered_bucket_appended_bytes_total Bytes appended to the bucket's streams (acknowledged)",
        "# TYPE tiered_bucket_appended_bytes_total counter",
        *(f'tiered_bucket_appended_bytes_total{{bucket="{b}"}} {total[b].appended_bytes}' for b in labels),
        "# TYPE tiered_bucket_appended_records_total counter",
        *(
            f'tiered_bucket_appended_records_total{{bucket="{b}"}} {total[b].appended_records}'
            for b in labels
        ),
        "# HELP tiered_bucket_egress_bytes_total Stored bytes read from the bucket's streams, by tier",
        "# TYPE tiered_bucket_egress_bytes_total counter",
    ]
    for b in labels:
        t = total[b]
        lines.append(f'tiered_bucket_egress_bytes_total{{bucket="{b}",tier="hot"}} {t.egress_hot}')
        lines.append(f'tiered_bucket_egress_bytes_total{{bucket="{b}",tier="cold"}} {t.egress_cold}')
    lines.append("# TYPE tiered_bucket_requests_total counter")
    for b in labels:
        t = total[b]
        for cls, n in (
            ("append", t.append_requests),
            ("read", t.read_requests),
            ("live", t.live_requests),
            ("admin", t.admin_requests),
        ):
            lines.append(f'tiered_bucket_requests_total{{bucket="{b}",class="{cls}"}} {n}')
    lines.append("# TYPE tiered_bucket_retained_bytes gauge")
    for b in sorted(space):
        lines.append(f'tiered_bucket_retained_bytes{{bucket="{b}",tier="hot"}} {space[b].hot_bytes}')
        lines.append(f'tiered_bucket_retained_bytes{{bucket="{b}",tier="cold"}} {space[b].cold_bytes}')
    lines.append("# TYPE tiered_bucket_streams gauge")
    lines += [f'tiered_bucket_streams{{bucket="{b}"}} {space[b].streams}' for b in sorted(space)]
    lines.append("# TYPE tiered_bucket_live_readers gauge")
    lines += [f'tiered_bucket_live_readers{{bucket="{b}"}} {live[b]}' for b in sorted(live)]
    lines.append("# TYPE tiered_bucket_quota_refusals_total counter")
    lines += [
        f'tiered_bucket_quota_refusals_total{{bucket="{b}",quota="{quota}"}} {n}'
        for (b, quota), n in sorted(refusals.items())
    ]
    return lines
