"""A node's /metrics: its shards' engine families merged into one each, labelled by shard."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tiered.cluster.node_metrics import merge_families


def test_engine_families_merge_into_one_each_labelled_by_shard() -> None:
    def families(n: int) -> list[Any]:
        g = GaugeMetricFamily("tiered_streams", "Streams", value=n)
        c = CounterMetricFamily("tiered_http_requests", "x", labels=["route"])
        c.add_metric(["r"], 1)
        return [g, c]

    merged = merge_families([("0000", families(2)), ("0003", families(5))])
    assert [m.name for m in merged] == ["tiered_streams"]  # the node counts requests itself
    assert [(s.labels, s.value) for s in merged[0].samples] == [
        ({"shard": "0000"}, 2),
        ({"shard": "0003"}, 5),
    ]
