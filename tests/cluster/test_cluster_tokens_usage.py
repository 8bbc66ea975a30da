"""Catch-up reads a non-owner served from the store, in the bucket's usage (the pure merge and the exchange).

The owner of a stream never sees the reads another node answers from the
store with its locators, so the serving node counts them and publishes its
running totals (``served/<node>.json``); ``GET /v1/admin/usage`` adds every
node's totals. A read that fetched its locator was counted by the owner (the
request, no bytes): only its bytes count on the serving node.
"""

from __future__ import annotations

import asyncio

from tiered.cluster.features.bucket_totals import (
    ServedSummary,
    add_served,
    decode_served,
    encode_served,
    served_key,
    sum_served,
)
from tiered.cluster.features.bucket_totals_exchange import UsageExchange
from tiered.cluster.membership.cas import Fault, MemoryCasStore
from tiered.core.clock import VirtualClock


def _row(bucket: str, read: int = 1, cold: int = 10) -> dict[str, object]:
    return {
        "bucket": bucket,
        "erased": False,
        "requests": {"append": 2, "read": read, "live": 0, "admin": 1},
        "egress_bytes": {"hot": 5, "cold": cold},
        "streams": 1,
    }


def test_served_totals_are_added_to_reads_and_cold_egress_of_listed_buckets() -> None:
    merged = {"buckets": [_row("aaa"), _row("bbb")]}
    out = add_served(merged, {"aaa": (3, 300), "zzz": (9, 9)})
    assert out == {"buckets": [_row("aaa", read=4, cold=310), _row("bbb")]}
    assert merged == {"buckets": [_row("aaa"), _row("bbb")]}  # not changed in place
    assert sum_served([{"a": (1, 2)}, {"a": (3, 4), "b": (1, 1)}]) == {"a": (4, 6), "b": (1, 1)}
    summary = ServedSummary("n1", 5, {"a": (1, 2)})
    assert decode_served(encode_served(summary)) == summary
    assert decode_served(b"{}") is None


def _exchange(store: MemoryCasStore, node: str, clock: VirtualClock) -> UsageExchange:
    return UsageExchange(store, node, clock, lambda: {}, lambda shard: False, interval_s=0.1)


def test_nodes_exchange_served_totals_and_a_restart_continues_them() -> None:
    async def run() -> None:
        store, clock = MemoryCasStore(), VirtualClock()
        a, b = _exchange(store, "n1", clock), _exchange(store, "n2", clock)
        a.count_served("acme", 100)
        a.count_served("acme", 50)
        a.count_served("acme", 70, request_counted=True)  # it fetched the locator: the owner counted it
        assert a.served_totals() == {"acme": (2, 220)}  # its own, live
        await a.exchange()
        await b.exchange()
        assert b.served_totals() == {"acme": (2, 220)}
        b.count_served("acme", 1)
        assert b.served_totals() == {"acme": (3, 221)}

        restarted = _exchange(store, "n1", clock)  # same node id: continues its object
        restarted.count_served("other", 10)
        await restarted.exchange()
        assert restarted.served_totals() == {"acme": (2, 220), "other": (1, 10)}
        await b.exchange()
        assert b.served_totals() == {"acme": (3, 221), "other": (1, 10)}

    asyncio.run(run())


def test_a_lost_or_failed_write_neither_loses_nor_doubles_counts() -> None:
    async def run() -> None:
        store, clock = MemoryCasStore(), VirtualClock()
        a, b = _exchange(store, "n1", clock), _exchange(store, "n2", clock)
        a.count_served("acme", 10)
        await a.exchange()
        a.count_served("acme", 10)
        store.inject(Fault.LOST, served_key("n1"))  # applied, the answer lost
        await a.exchange()
        assert a.errors == 1
        a.count_served("acme", 10)
        store.inject(Fault.DROPPED, served_key("n1"))  # never applied
        await a.exchange()
        a.count_served("acme", 10)
        await a.exchange()
        await b.exchange()
        assert b.served_totals() == {"acme": (4, 40)}
        stored = decode_served(store.objects[served_key("n1")].data)
        assert stored is not None and (stored.node, stored.buckets) == ("n1", {"acme": (4, 40)})

    asyncio.run(run())
