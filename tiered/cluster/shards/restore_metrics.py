"""``/metrics`` families of checkpoints and restores (object-store durability), by shard.

A takeover's gap is mostly its restore, so each node exports how long the
latest restore of every shard it served took and what it read, and, per
shard it serves, the checkpoint objects written and the backlog a restore
would read now besides them (``tiered/cluster/shards/checkpoint.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tiered.cluster.shards.checkpoint import backlog
from tiered.cluster.shards.restore import RestoreReport
from tiered.cluster.shards.wal import WalShipper

__all__ = ["ShardRecords", "restore_families"]


class ShardRecords(Protocol):
    """What the families read (``ShardHost``)."""

    restores: dict[int, RestoreReport]
    shippers: dict[int, WalShipper]


def restore_families(host: ShardRecords) -> Iterator[Metric]:
    restores: Mapping[int, RestoreReport] = dict(host.restores)
    seconds = GaugeMetricFamily(
        "tiered_cluster_restore_seconds",
        "How long the latest restore of the shard on this node took (chain tail and objects fetched and "
        "written), by shard",
        labels=["shard"],
    )
    objects = GaugeMetricFamily(
        "tiered_cluster_restore_objects",
        "Objects the latest restore of the shard fetched, by shard and kind (wal, checkpoint)",
        labels=["shard", "kind"],
    )
    for shard, report in sorted(restores.items()):
        label = f"{shard:04d}"
        seconds.add_metric([label], report.seconds)
        objects.add_metric([label, "wal"], report.objects - report.checkpoint_objects)
        objects.add_metric([label, "checkpoint"], report.checkpoint_objects)
    yield seconds
    yield objects
    written = CounterMetricFamily(
        "tiered_cluster_checkpoint_objects",
        "Checkpoint objects this node wrote for the shard since it took it, by shard",
        labels=["shard"],
    )
    copied = CounterMetricFamily(
        "tiered_cluster_checkpoint_bytes",
        "Bytes copied into checkpoint objects since this node took the shard, by shard",
        labels=["shard"],
    )
    pending = GaugeMetricFamily(
        "tiered_cluster_restore_backlog_objects",
        "WAL objects (not checkpoint objects) a restore of the shard would read now, by shard",
        labels=["shard"],
    )
    for shard, shipper in sorted(dict(host.shippers).items()):
        label = f"{shard:04d}"
        written.add_metric([label], shipper.checkpoint_objects)
        copied.add_metric([label], shipper.checkpoint_bytes)
        pending.add_metric([label], backlog(shipper.index).objects)
    yield written
    yield copied
    yield pending
