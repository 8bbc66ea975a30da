"""Prometheus metrics, in the text exposition format.

Counts and gauges; no stream names, and bucket names only in the per-bucket
metrics of ``tiered.tenants.metrics`` (their label cardinality is capped by
``--metrics-max-buckets``). ``/metrics`` is an admin route (scrape it with
the admin token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.tenants.metrics import bucket_metric_lines

if TYPE_CHECKING:
    from tiered.node import Node


def render_metrics(node: Node) -> bytes:
    state = node.state
    reader = node.reader
    lines = [
        "# TYPE tiered_streams gauge",
        f"tiered_streams {sum(1 for s in state.streams.values() if not s.soft_deleted)}",
        "# TYPE tiered_hot_bytes gauge",
        f"tiered_hot_bytes {state.hot_bytes}",
        "# TYPE tiered_cold_objects gauge",
        f"tiered_cold_objects {len(state.cold_objects)}",
        "# TYPE tiered_cold_bytes gauge",
        f"tiered_cold_bytes {sum(o.size for o in state.cold_objects.values())}",
        "# HELP tiered_integrity_errors_total Reads and copies refused because stored bytes failed their checksum",
        "# TYPE tiered_integrity_errors_total counter",
        *(
            f'tiered_integrity_errors_total{{tier="{tier}"}} {n}'
            for tier, n in reader.integrity_errors.items()
        ),
        "# HELP tiered_store_stalls_total Object-store calls abandoned at their deadline",
        "# TYPE tiered_store_stalls_total counter",
        f"tiered_store_stalls_total {node.store_health.stalls}",
        "# HELP tiered_store_reachable Whether the object store answered its last probe or call",
        "# TYPE tiered_store_reachable gauge",
        f"tiered_store_reachable {1 if node.store_health.reachable else 0}",
        "# HELP tiered_live_readers Long-poll and SSE readers waiting for data",
        "# TYPE tiered_live_readers gauge",
        f"tiered_live_readers {node.waiters.count}",
        "# TYPE tiered_hot_damaged_frames gauge",
        f"tiered_hot_damaged_frames {sum(len(d) for d in node.log.damage().values())}",
    ]
    flusher = node.flusher
    lines += [
        "# TYPE tiered_cold_puts_total counter",
        f"tiered_cold_puts_total {flusher.puts}",
        "# TYPE tiered_cold_bytes_uploaded_total counter",
        f"tiered_cold_bytes_uploaded_total {flusher.bytes_uploaded}",
        "# TYPE tiered_cold_flush_failures_total counter",
        f"tiered_cold_flush_failures_total {flusher.failures}",
        "# HELP tiered_cold_flush_damaged_streams Streams the flusher stopped copying at a damaged hot record",
        "# TYPE tiered_cold_flush_damaged_streams gauge",
        f"tiered_cold_flush_damaged_streams {len(flusher.damaged)}",
    ]
    gc = node.gc
    t = gc.totals
    lines += [
        "# TYPE tiered_gc_pending_deletions gauge",
        f"tiered_gc_pending_deletions {gc.pending_deletions()}",
        "# TYPE tiered_gc_bytes_reclaimed_total counter",
        f"tiered_gc_bytes_reclaimed_total {t.bytes_reclaimed}",
        "# TYPE tiered_gc_objects_deleted_total counter",
        f"tiered_gc_objects_deleted_total {t.objects_deleted}",
        "# TYPE tiered_gc_orphans_found_total counter",
        f"tiered_gc_orphans_found_total {t.orphans_found}",
        "# TYPE tiered_gc_integrity_errors gauge",
        f"tiered_gc_integrity_errors {t.integrity_errors}",
        "# TYPE tiered_gc_last_pass_timestamp_seconds gauge",
        f"tiered_gc_last_pass_timestamp_seconds {t.last_pass_ms / 1000:.3f}",
    ]
    lines += bucket_metric_lines(
        state, node.tenants.state, node.tenants.counter, node.gate, node.config.metrics_max_buckets
    )
    return ("\n".join(lines) + "\n").encode()
