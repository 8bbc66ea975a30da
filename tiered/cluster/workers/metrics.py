"""``/metrics`` of a multi-worker node: every worker's exposition in one, each sample labelled by worker.

A scrape lands on whichever worker the kernel picked. That worker renders
its own families (a cluster node's: ``tiered/cluster/node_metrics.py``, its
shards labelled ``shard``), asks each live sibling for its own over the
sibling's Unix socket (the scrape's credentials passed on, ``LOCAL_ONLY`` so the
sibling does not ask further), and merges the families, adding
``worker="wN"`` to every sample. A sibling that does not answer in time is left
out and counted in ``tiered_workers_scrape_errors_total``, so a partial answer
is visible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from tiered.cluster.gateway.forward import Forwarder

__all__ = ["LOCAL_ONLY", "merge_workers", "scrape_siblings"]


#: On a scrape a worker sends its siblings: answer with your own families only.
LOCAL_ONLY = "Tiered-Worker-Local"
_PASSED = ("Authorization",)


async def scrape_siblings(
    forwarder: Forwarder, siblings: Mapping[str, str], headers: Mapping[str, str]
) -> dict[str, bytes | None]:
    """Each sibling's own exposition by worker id (None: it did not answer with one)."""
    sent = {h: v for h in _PASSED if (v := headers.get(h)) is not None}
    sent[LOCAL_ONLY] = "1"

    async def one(url: str) -> bytes | None:
        answer = await forwarder.fetch(url, "/metrics", sent)
        return answer[1] if answer is not None and answer[0] == 200 else None

    names = sorted(siblings)
    answers = await asyncio.gather(*(one(siblings[name]) for name in names))
    return dict(zip(names, answers, strict=True))


def merge_workers(expositions: Mapping[str, bytes | None]) -> bytes:
    """One exposition of every worker's families (by worker id; None: it did not answer)."""
    merged: dict[str, Metric] = {}
    missing = 0
    for worker in sorted(expositions):
        text = expositions[worker]
        if text is None:
            missing += 1
            continue
        for family in text_string_to_metric_families(text.decode("utf-8", "replace")):
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                out.samples.append(sample._replace(labels={**sample.labels, "worker": worker}))
    answered = len(expositions) - missing
    own: list[Metric] = [
        GaugeMetricFamily(
            "tiered_workers", "Worker processes whose metrics this answer holds", value=answered
        ),
        CounterMetricFamily(
            "tiered_workers_scrape_errors",
            "Workers that did not answer this scrape (their families are missing from it)",
            value=missing,
        ),
    ]
    registry = CollectorRegistry()
    registry.register(_Fixed(own + [merged[name] for name in sorted(merged)]))
    return prometheus_client.generate_latest(registry)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families
