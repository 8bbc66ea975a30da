"""The usage exchange, in memory: nodes publish their shards' totals through the store and feed each other's gates; a failed pass is counted and the next catches up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tiered.cluster.features.bucket_totals import (
    USAGE,
    decode_summary,
    usage_key,
)
from tiered.cluster.features.bucket_totals_exchange import UsageExchange
from tiered.cluster.membership.cas import Fault, MemoryCasStore
from tiered.core.clock import SystemClock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.quotas import Quotas
from tiered.engine.tenants.state import TenantState


class _Engine:
    """What the exchange touches of an engine: its footprint; its gate reads the exchange's others."""

    def __init__(
        self, totals: dict[str, tuple[int, int]], others: Callable[[str], tuple[int, int]] | None = None
    ) -> None:
        self.rows = totals
        self.footprint = self
        self.gate = TenantGate(TenantState(), self, Quotas(), SystemClock(), others=others)  # type: ignore[arg-type]

    def totals(self, bucket: str) -> tuple[int, int]:
        return self.rows.get(bucket, (0, 0))

    def all_totals(self) -> dict[str, tuple[int, int]]:
        return dict(self.rows)


def test_two_nodes_exchange_usage_through_the_store_and_feed_each_others_gates() -> None:
    async def scenario() -> None:
        store = MemoryCasStore()
        clock = SystemClock()
        one = UsageExchange(store, "n1", clock, lambda: {0: e0, 1: e1}, lambda s: True, interval_s=1)  # type: ignore[dict-item]
        two = UsageExchange(store, "n2", clock, lambda: {2: e2}, lambda s: True, interval_s=1)  # type: ignore[dict-item]
        # Each engine's gate is built with its exchange's view of the other shards (the quota_others hook).
        e0, e1 = _Engine({"b": (2, 10)}, one.others_of(0)), _Engine({"b": (1, 5)}, one.others_of(1))
        e2 = _Engine({"b": (4, 1), "z": (0, 0)}, two.others_of(2))
        assert e0.gate.others is not None
        with pytest.raises(TieredError) as unread:  # the others unknown yet: no size decision
            e0.gate.others("b")
        assert unread.value.code is ErrorCode.UNAVAILABLE
        await one.exchange()
        await two.exchange()
        await one.exchange()
        assert one.rounds == 2 and two.rounds == 1
        assert e0.gate.others is not None and e2.gate.others is not None
        assert e0.gate.others("b") == (1 + 4, 5 + 1)  # shard 1 live, shard 2 as n2 published it
        assert e1.gate.others("b") == (2 + 4, 10 + 1)
        assert e2.gate.others("b") == (3, 15)
        published = decode_summary(store.objects[usage_key(2)].data)
        assert published is not None and (published.shard, published.node) == (2, "n2")
        assert published.buckets == {"b": (4, 1)}  # empty buckets are left out
        # Unchanged figures are not written again; changed ones are, and reach the other node.
        writes = one.published
        await one.exchange()
        assert one.published == writes
        e0.rows["b"] = (3, 10)
        await one.exchange()
        assert one.published == writes + 1
        await two.exchange()
        assert e2.gate.others("b") == (4, 15)
        # A shard handed over: the new holder's first write replaces the old holder's summary (CAS on its ETag).
        three = UsageExchange(
            store, "n3", clock, lambda: {1: _Engine({"b": (7, 0)})}, lambda s: True, interval_s=1
        )  # type: ignore[dict-item]
        await three.exchange()
        await two.exchange()
        assert e2.gate.others("b") == (3 + 7, 10)

    asyncio.run(scenario())


def test_a_failed_read_or_publish_is_counted_and_the_next_pass_catches_up() -> None:
    async def scenario() -> None:
        store = MemoryCasStore()
        clock = SystemClock()
        one = UsageExchange(store, "n1", clock, lambda: {0: e0}, lambda s: True, interval_s=1)  # type: ignore[dict-item]
        two = UsageExchange(store, "n2", clock, lambda: {1: e1}, lambda s: True, interval_s=1)  # type: ignore[dict-item]
        e0, e1 = _Engine({"b": (1, 1)}, one.others_of(0)), _Engine({"b": (2, 2)}, two.others_of(1))
        store.inject(Fault.UNAVAILABLE, USAGE)  # the listing fails: the publish still happens
        await one.exchange()
        assert (one.rounds, one.errors, one.read_once, one.published) == (0, 1, False, 1)
        store.inject(Fault.CONFLICT_409, usage_key(1))  # the publish fails: the read still happens
        await two.exchange()
        assert (two.rounds, two.errors, two.read_once, two.published) == (0, 1, True, 0)
        assert e1.gate.others is not None and e1.gate.others("b") == (1, 1)
        await two.exchange()
        await one.exchange()
        assert (one.rounds, two.rounds) == (1, 1)
        assert e0.gate.others is not None and e0.gate.others("b") == (2, 2)

    asyncio.run(scenario())
