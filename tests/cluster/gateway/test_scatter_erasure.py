"""The erasure report merged across shards (``GET /v1/admin/erasure`` in cluster mode)."""

from __future__ import annotations

from typing import Any

from tiered.cluster.gateway.scatter import PLANS, Answer, merge_erasure


def _obj(key: str, overdue: bool) -> dict[str, Any]:
    return {
        "key": key,
        "bytes": 10,
        "status": "rewrite pending",
        "owners": {"b": 1},
        "until_ms": 5,
        "overdue": overdue,
    }


def _report(now: int, buckets: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "now_ms": now,
        "deadline_s": 86400.0,
        "overdue": sum(b["overdue"] for b in buckets),
        "buckets": buckets,
    }


def test_each_erased_bucket_lists_every_shards_objects() -> None:
    a = {"bucket": "acme", "erased_ms": 1, "deadline_ms": 2, "overdue": 1, "objects": [_obj("k1", True)]}
    a2 = {"bucket": "acme", "erased_ms": 1, "deadline_ms": 2, "overdue": 0, "objects": [_obj("k2", False)]}
    z = {"bucket": "zeta", "erased_ms": 3, "deadline_ms": 4, "overdue": 0, "objects": []}
    answers = [Answer(1, 200, _report(7, [a2, z])), Answer(0, 200, _report(9, [a]))]
    status, body = merge_erasure(answers, lambda bucket: 0)
    assert status == 200
    assert body["now_ms"] == 9 and body["overdue"] == 1 and body["deadline_s"] == 86400.0
    assert [b["bucket"] for b in body["buckets"]] == ["acme", "zeta"]
    acme = body["buckets"][0]
    assert [o["key"] for o in acme["objects"]] == ["k1", "k2"] and acme["overdue"] == 1
    assert (acme["erased_ms"], acme["deadline_ms"]) == (1, 2)
    assert PLANS["erasure"].merge is merge_erasure
    assert ("Cache-Control", "no-store") in PLANS["erasure"].headers
