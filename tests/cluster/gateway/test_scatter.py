"""Scatter-gather across shards: which requests are about every shard, and how their answers merge (buckets, descriptions, groups, usage, GC reports and status), refusals first."""

from __future__ import annotations

from typing import Any

from tiered.api.kit.target import parse_target
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


def home(bucket: str) -> int:
    return {"a": 0, "b": 1, "default": 2}.get(bucket, 0)


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
