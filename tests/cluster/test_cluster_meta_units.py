"""Bucket-level metadata across shards, the pure parts: merges, the scatter table, usage summaries, quota sums."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tiered.api.kit.target import parse_target
from tiered.cluster.features.bucket_totals import (
    USAGE,
    Summary,
    UsageBoard,
    decode_summary,
    encode_summary,
    nonzero,
    overshoot_bound,
    shard_of_usage_key,
    usage_key,
)
from tiered.cluster.features.bucket_totals_exchange import UsageExchange
from tiered.cluster.gateway.scatter import (
    Answer,
    bucket_wide_write,
    merge_buckets,
    merge_describe,
    merge_gc_report,
    merge_gc_status,
    merge_groups,
    merge_usage,
    refusal,
    scatter_plan,
    sum_json,
)
from tiered.cluster.membership.cas import Fault, MemoryCasStore
from tiered.cluster.node_metrics import merge_families
from tiered.core.clock import SystemClock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.tenants.gate import TenantGate
from tiered.engine.tenants.quotas import Quotas, check_sizes
from tiered.engine.tenants.state import TenantState


def home(bucket: str) -> int:
    return {"a": 0, "b": 1, "default": 2}.get(bucket, 0)


# ----------------------------------------------------------------- the scatter table


def test_scatter_plan_names_every_request_about_every_shard() -> None:
    assert scatter_plan("GET", "/v1/buckets").kind == "buckets"  # type: ignore[union-attr]
    assert scatter_plan("GET", "/v1/groups").kind == "groups"  # type: ignore[union-attr]
    assert scatter_plan("GET", "/v1/admin/usage").kind == "usage"  # type: ignore[union-attr]
    assert scatter_plan("POST", "/v1/admin/gc").kind == "gc"  # type: ignore[union-attr]
    assert scatter_plan("GET", "/v1/admin/gc").kind == "gc-status"  # type: ignore[union-attr]
    assert scatter_plan("GET", "/v1/buckets/logs").kind == "describe"  # type: ignore[union-attr]
    assert scatter_plan("GET", "/v1/buckets/logs/stream/a") is None
    assert scatter_plan("PUT", "/v1/buckets/logs") is None
    assert scatter_plan("GET", "/v1/groups/g") is None
    assert scatter_plan("DELETE", "/v1/admin/gc") is None
    assert scatter_plan("GET", "/v1/stream/x") is None


def _wide(method: str, path: str) -> str | None:
    return bucket_wide_write(method, parse_target(method, path, {}, {}))


def test_bucket_wide_writes_are_puts_of_a_buckets_settings() -> None:
    assert _wide("PUT", "/v1/admin/quotas/logs") == "logs"
    assert _wide("PUT", "/v1/admin/access/logs") == "logs"
    assert _wide("PUT", "/v1/admin/retention/logs") == "logs"
    assert _wide("PUT", "/v1/admin/quotas/l%6Fgs") == "logs"
    assert _wide("PUT", "/v1/admin/retention/logs/a/b") is None  # one stream: its own shard
    assert _wide("GET", "/v1/admin/quotas/logs") is None
    assert _wide("PUT", "/v1/admin/quotas/") is None
    assert _wide("PUT", "/v1/admin/retain/logs/a") is None


# ----------------------------------------------------------------- merges


def test_buckets_merge_by_name_with_the_well_known_shards_creation_time() -> None:
    answers = [
        Answer(0, 200, {"buckets": [{"name": "a", "created_ms": 10}, {"name": "b", "created_ms": 11}]}),
        Answer(1, 200, {"buckets": [{"name": "b", "created_ms": 12}, {"name": "a", "created_ms": 9}]}),
        Answer(2, 200, {"buckets": [{"name": "default", "created_ms": 0}]}),
    ]
    assert merge_buckets(answers, home) == (
        200,
        {
            "buckets": [
                {"name": "a", "created_ms": 10},  # shard 0 is a's home, though shard 1 says 9
                {"name": "b", "created_ms": 12},
                {"name": "default", "created_ms": 0},
            ]
        },
    )


def test_a_buckets_description_sums_its_streams_over_shards() -> None:
    answers = [
        Answer(0, 200, {"name": "b", "created_ms": 5, "streams": 2}),
        Answer(1, 200, {"name": "b", "created_ms": 7, "streams": 3}),
        Answer(2, 200, {"name": "b", "created_ms": 6, "streams": 0}),
    ]
    assert merge_describe(answers, home) == (200, {"name": "b", "created_ms": 7, "streams": 5})


def test_groups_merge_sorted_by_name() -> None:
    row = {"bucket": "default", "incarnation": 1, "revision": 2, "members": 0, "targets": 1}
    answers = [
        Answer(0, 200, {"groups": [{"group": "z", **row}]}),
        Answer(1, 200, {"groups": []}),
        Answer(2, 200, {"groups": [{"group": "a", **row}, {"group": "m", **row}]}),
    ]
    status, body = merge_groups(answers, home)
    assert status == 200 and [g["group"] for g in body["groups"]] == ["a", "m", "z"]
    assert body["groups"][0] == {"group": "a", **row}


def _usage_row(bucket: str, streams: int, hot: int, appended: int, erased: bool = False) -> dict[str, Any]:
    return {
        "bucket": bucket,
        "erased": erased,
        "appended_bytes": appended,
        "appended_records": 1,
        "egress_bytes": {"hot": 1, "cold": 0},
        "requests": {"append": 1, "read": 2, "live": 0, "admin": 0},
        "retained_bytes": {"hot": hot, "cold": 3},
        "streams": streams,
    }


def test_usage_rows_sum_every_counter_and_gauge() -> None:
    answers = [
        Answer(0, 200, {"buckets": [_usage_row("a", 1, 10, 100), _usage_row("b", 2, 0, 0)]}),
        Answer(1, 200, {"buckets": [_usage_row("a", 2, 5, 7, erased=True)]}),
        Answer(2, 404, {"error": {"code": "BUCKET_NOT_FOUND"}}),
    ]
    plan = scatter_plan("GET", "/v1/admin/usage")
    assert plan is not None and refusal(answers, plan) is None  # one shard never heard of it: ignored
    status, body = merge_usage(answers, home)
    assert status == 200
    assert body["buckets"][0] == {
        "bucket": "a",
        "erased": True,
        "appended_bytes": 107,
        "appended_records": 2,
        "egress_bytes": {"hot": 2, "cold": 0},
        "requests": {"append": 2, "read": 4, "live": 0, "admin": 0},
        "retained_bytes": {"hot": 15, "cold": 6},
        "streams": 3,
    }
    assert body["buckets"][1] == _usage_row("b", 2, 0, 0)
    every_404 = [Answer(s, 404, {"error": {}}) for s in (2, 0, 1)]
    assert refusal(every_404, plan) == every_404[1]  # the lowest shard's


def test_any_shards_refusal_is_the_answer() -> None:
    plan = scatter_plan("GET", "/v1/buckets")
    assert plan is not None
    answers = [
        Answer(0, 200, {"buckets": []}),
        Answer(2, 401, {"error": {}}),
        Answer(1, 503, {"error": {}}),
    ]
    assert refusal(answers, plan) == answers[2]
    describe = scatter_plan("GET", "/v1/buckets/x")
    assert describe is not None
    assert refusal([Answer(0, 404, None), Answer(1, 200, {})], describe) == Answer(0, 404, None)


def _report(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "dry_run": False,
        "started_ms": 100,
        "finished_ms": 200,
        "streams_expired": 1,
        "retention_advanced": 0,
        "bytes_released": 10,
        "objects_released": 0,
        "objects_deleted": 2,
        "bytes_deleted": 30,
        "orphans_found": 0,
        "orphans_deleted": 0,
        "segments_deleted": 1,
        "would_delete": [],
        "errors": [],
        "integrity_errors": [],
    }
    return {**base, **over}


def test_gc_reports_sum_counts_join_lists_and_span_the_passes() -> None:
    answers = [
        Answer(1, 200, _report(started_ms=90, finished_ms=150, errors=["x"])),
        Answer(0, 200, _report(objects_deleted=5, would_delete=[{"key": "k", "bytes": 1}])),
    ]
    status, body = merge_gc_report(answers, home)
    assert status == 200
    assert body == _report(
        started_ms=90,
        finished_ms=200,
        streams_expired=2,
        bytes_released=20,
        objects_deleted=7,
        bytes_deleted=60,
        segments_deleted=2,
        would_delete=[{"key": "k", "bytes": 1}],
        errors=["x"],
    )


def test_gc_status_sums_pending_and_totals() -> None:
    totals = {
        "passes": 1,
        "bytes_reclaimed": 5,
        "objects_deleted": 1,
        "orphans_found": 0,
        "integrity_errors": 0,
        "errors": 0,
        "last_pass_ms": 10,
    }
    answers = [
        Answer(0, 200, {"pending_deletions": 2, "totals": totals, "last_pass": None}),
        Answer(
            1, 200, {"pending_deletions": 3, "totals": {**totals, "last_pass_ms": 30}, "last_pass": _report()}
        ),
    ]
    status, body = merge_gc_status(answers, home)
    assert status == 200
    assert body["pending_deletions"] == 5
    assert body["totals"] == {
        **totals,
        "passes": 2,
        "bytes_reclaimed": 10,
        "objects_deleted": 2,
        "last_pass_ms": 30,
    }
    assert body["last_pass"] == _report()
    none = [Answer(0, 200, {"pending_deletions": 0, "totals": totals, "last_pass": None})]
    assert merge_gc_status(none, home)[1]["last_pass"] is None


def test_sum_json_adds_numbers_ors_flags_and_keeps_names() -> None:
    assert sum_json(
        {"a": 1, "b": {"c": 2}, "n": "x", "f": False}, {"a": 2, "b": {"c": 3, "d": 1}, "n": "y", "f": True}
    ) == {
        "a": 3,
        "b": {"c": 5, "d": 1},
        "n": "x",
        "f": True,
    }


# ----------------------------------------------------------------- usage summaries and the quota sum


def test_usage_keys_and_summaries_round_trip() -> None:
    assert usage_key(7) == "_tiered/cluster/usage/0007.json"
    assert shard_of_usage_key(usage_key(7)) == 7
    assert shard_of_usage_key("_tiered/cluster/usage/7.json") is None
    assert shard_of_usage_key("_tiered/cluster/leases/0007.json") is None
    s = Summary(3, "n1", 5, "ab", {"a": (1, 10)})
    assert decode_summary(encode_summary(s)) == s
    assert decode_summary(b"{not json") is None
    assert decode_summary(b'{"shard": "x"}') is None
    assert nonzero({"a": (0, 0), "b": (1, 0), "c": (0, 5)}) == {"b": (1, 0), "c": (0, 5)}


def test_the_board_sums_the_other_shards_live_where_served_here_else_as_published() -> None:
    board = UsageBoard()
    board.apply(Summary(0, "n1", 1, "x", {"a": (2, 20)}))
    board.apply(Summary(1, "n2", 1, "y", {"a": (3, 30), "b": (1, 1)}))
    board.apply(Summary(2, "n2", 1, "z", {"a": (4, 40)}))
    assert board.others("a", 0, {}) == (7, 70)
    assert board.others("a", 1, {}) == (6, 60)
    assert board.others("c", 1, {}) == (0, 0)
    # Shard 2 is served here: its live figures replace its (older) published ones.
    live = {0: lambda b: (2, 20) if b == "a" else (0, 0), 2: lambda b: (9, 90) if b == "a" else (0, 0)}
    assert board.others("a", 0, live) == (12, 120)
    assert board.others("a", 2, live) == (5, 50)
    assert board.total("a", live) == (14, 140)
    # A newer summary of a shard replaces its older one, buckets it no longer has included.
    board.apply(Summary(1, "n2", 2, "w", {"b": (2, 2)}))
    assert board.others("a", 0, {}) == (4, 40)
    assert board.others("b", 0, {}) == (2, 2)


def test_check_sizes_holds_the_limit_over_own_and_others_usage() -> None:
    q = Quotas(max_streams=5, max_retained_bytes=100)
    check_sizes(q, (2, 0), (2, 0), 1, 0)  # 2 + 2 + 1 = 5: reaches the limit, allowed
    with pytest.raises(TieredError) as refused:
        check_sizes(q, (2, 0), (3, 0), 1, 0)
    assert refused.value.code is ErrorCode.QUOTA_EXCEEDED
    assert refused.value.context == {"quota": "max_streams", "limit": 5}
    check_sizes(q, (0, 60), (0, 40), 0, 0)
    with pytest.raises(TieredError) as over:
        check_sizes(q, (0, 60), (0, 40), 0, 1)
    assert over.value.context == {"quota": "max_retained_bytes", "limit": 100}
    check_sizes(q, (9, 900), (9, 900), 0, 0)  # nothing added: never refused (deletes must pass)


class _Footprint:
    def __init__(self, totals: tuple[int, int]) -> None:
        self.value = totals

    def totals(self, bucket: str) -> tuple[int, int]:
        return self.value


def test_the_gate_refuses_against_the_bucket_wide_total() -> None:
    tenants = TenantState()
    tenants.quotas["b"] = {"max_streams": 3}
    gate = TenantGate(tenants, _Footprint((1, 0)), Quotas(), SystemClock())  # type: ignore[arg-type]
    gate.admit("b", body_bytes=0, stored_bytes=0, new_streams=1, rated=False)  # alone: 2 of 3
    gate.others = lambda bucket: (2, 0) if bucket == "b" else (0, 0)
    with pytest.raises(TieredError) as refused:
        gate.admit("b", body_bytes=0, stored_bytes=0, new_streams=1, rated=False)
    assert refused.value.code is ErrorCode.QUOTA_EXCEEDED and refused.value.context["limit"] == 3
    assert gate.refusals == {("b", "max_streams"): 1}
    gate.admit("other", body_bytes=0, stored_bytes=0, new_streams=1, rated=False)


def test_overshoot_bound() -> None:
    assert overshoot_bound(10, 4, 1) == 0  # one node: exact
    assert overshoot_bound(10, 4, 3) == 12  # two other nodes may each admit the 6 left
    assert overshoot_bound(10, 12, 3) == 0


# ----------------------------------------------------------------- the exchange, in memory


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
