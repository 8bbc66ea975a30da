"""Requests about every shard: which ones, and how their shards' answers merge into one (pure).

A single server answers a listing, a bucket's usage or a GC run from its one
engine. In cluster mode each shard's engine knows only its own streams and
groups, so the node the client reached sends one sub-request per shard
(``Tiered-Shard: n``, served by that shard's engine wherever it is: here or
forwarded to the owner) and merges the answers into the body a single
server gives (``tiered/cluster/gateway/shard_router.py`` is the shell).
Which requests: the rows of the route table (``tiered.api.table``) whose
fan-out is ``SCATTER``, for the methods they name (a ``HEAD`` served as a
``GET`` is answered by one shard); each names its merge here (``PLANS``):

| Request (row) | Merge |
|---|---|
| ``GET /v1/buckets`` | union by name, sorted; a bucket's ``created_ms`` from its well-known shard |
| ``GET /v1/buckets/{b}`` | the well-known shard's description, ``streams`` summed over every shard |
| ``GET /v1/groups`` | union (a group lives in exactly one shard), sorted by name |
| ``GET /v1/admin/usage`` | one row per bucket, every counter and gauge summed, ``erased`` if any shard says so |
| ``POST /v1/admin/gc`` | one report: counts summed, lists joined, started at the first, finished at the last |
| ``GET /v1/admin/gc`` | pending deletions and lifetime totals summed, the last passes merged as above |
| ``GET /v1/buckets/{b}/streams``, ``GET /v1/stream`` | the first ``limit`` paths of the shards' pages (each its first ``limit`` after the cursor) |
| ``GET /v1/admin/integrity/{b}`` | digests summed modulo 2**256, counts summed, the streams joined by path |

Any shard's refusal is the answer (the lowest shard's first), except that a
usage query for one bucket ignores shards that never heard of it (404) unless
every shard says 404. Bucket-wide *writes* (create, erase, quotas, access,
a bucket's retention) go to every shard too, and are answered with the
well-known shard's answer (``tiered.cluster.gateway.routing.fanout_bucket``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tiered.api.kit.target import Family, Target
from tiered.api.kit.types import Request
from tiered.api.table import Fanout, RouteSpec, classify, route_by_path, route_of
from tiered.core.record_digest import format_digest, parse_digest

__all__ = [
    "PLANS",
    "Answer",
    "ScatterPlan",
    "bucket_wide_write",
    "merge_buckets",
    "merge_describe",
    "merge_gc_report",
    "merge_gc_status",
    "merge_groups",
    "merge_stream_list",
    "merge_integrity",
    "merge_usage",
    "plan_of",
    "scatter_plan",
    "sum_json",
]


@dataclass(frozen=True, slots=True)
class Answer:
    """One shard's answer to its sub-request: status and decoded JSON body (None when not JSON)."""

    shard: int
    status: int
    body: Any


#: shard of a bucket's well-known key ``(bucket, "")``
HomeOf = Callable[[str], int]
Merge = Callable[[Sequence[Answer], HomeOf], tuple[int, Any]]


@dataclass(frozen=True, slots=True)
class ScatterPlan:
    """How to answer one scatter-gather request: merge the shards' answers, then these headers."""

    kind: str
    merge: Merge
    headers: tuple[tuple[str, str], ...] = ()
    tolerate_not_found: bool = False


def _first_refusal(answers: Sequence[Answer], *, tolerate_not_found: bool = False) -> Answer | None:
    refusals = [a for a in answers if a.status >= 300]
    if tolerate_not_found:
        if refusals and all(a.status == 404 for a in answers):
            return min(answers, key=lambda a: a.shard)
        refusals = [a for a in refusals if a.status != 404]
    return min(refusals, key=lambda a: a.shard) if refusals else None


def sum_json(a: Any, b: Any) -> Any:
    """Add two JSON values of one shape: numbers add, booleans or, objects add key by key, lists join.

    Strings (names) keep the first value. ``started_ms``/``finished_ms`` keys
    are handled by the callers that have them.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) or bool(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, value in b.items():
            out[key] = sum_json(out[key], value) if key in out else value
        return out
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    return a if a is not None else b


def merge_buckets(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    by_name: dict[str, dict[str, Any]] = {}
    for a in sorted(answers, key=lambda a: a.shard):
        for row in a.body["buckets"]:
            name = row["name"]
            known = by_name.get(name)
            # Each shard stamped its own creation; the well-known shard's stamp is the bucket's.
            if (
                known is None
                or a.shard == home(name)
                or (known["_shard"] != home(name) and row["created_ms"] < known["created_ms"])
            ):
                by_name[name] = {**row, "_shard": a.shard}
    rows = [{k: v for k, v in row.items() if k != "_shard"} for _, row in sorted(by_name.items())]
    return 200, {"buckets": rows}


def merge_describe(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    ordered = sorted(answers, key=lambda a: a.shard)
    name = next((a.body.get("name") for a in ordered if isinstance(a.body, dict) and "name" in a.body), None)
    base = next((a for a in ordered if name is not None and a.shard == home(name)), ordered[0])
    return 200, {**base.body, "streams": sum(int(a.body.get("streams", 0)) for a in ordered)}


def merge_groups(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for a in sorted(answers, key=lambda a: a.shard):
        for row in a.body["groups"]:
            rows.setdefault(row["group"], row)
    return 200, {"groups": [row for _, row in sorted(rows.items())]}


def merge_usage(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for a in sorted(answers, key=lambda a: a.shard):
        if a.status == 404:
            continue
        for row in a.body["buckets"]:
            name = row["bucket"]
            rows[name] = sum_json(rows[name], row) if name in rows else row
    return 200, {"buckets": [row for _, row in sorted(rows.items())]}


def merge_stream_list(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    """Each shard's first ``limit`` paths after the cursor, merged: the first ``limit`` of their union.

    A stream lives in one shard, so the union's first ``limit`` are the
    bucket's; the cursor (the page's last path) needs no per-shard state.
    """
    ordered = sorted(answers, key=lambda a: a.shard)
    limit = int(ordered[0].body["limit"])
    rows: dict[str, dict[str, Any]] = {}
    more = False
    for a in ordered:
        more = more or bool(a.body["has_more"])
        for row in a.body["streams"]:
            rows.setdefault(row["path"], row)
    paths = sorted(rows)
    more = more or len(paths) > limit
    page = [rows[p] for p in paths[:limit]]
    return 200, {
        "streams": page,
        "has_more": more,
        "next_after": page[-1]["path"] if more and page else None,
        "limit": limit,
    }


def _merge_reports(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out = dict(reports[0])
    for report in reports[1:]:
        started, finished = out.get("started_ms", 0), out.get("finished_ms", 0)
        out = sum_json(out, report)
        out["dry_run"] = reports[0].get("dry_run", False)
        out["started_ms"] = min(started, report.get("started_ms", started))
        out["finished_ms"] = max(finished, report.get("finished_ms", finished))
    return out


def merge_gc_report(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    return 200, _merge_reports([a.body for a in sorted(answers, key=lambda a: a.shard)])


def merge_gc_status(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    bodies = [a.body for a in sorted(answers, key=lambda a: a.shard)]
    totals = bodies[0]["totals"]
    for body in bodies[1:]:
        last = max(totals.get("last_pass_ms", 0), body["totals"].get("last_pass_ms", 0))
        totals = sum_json(totals, body["totals"])
        totals["last_pass_ms"] = last
    passes = [b["last_pass"] for b in bodies if b.get("last_pass") is not None]
    return 200, {
        "pending_deletions": sum(int(b["pending_deletions"]) for b in bodies),
        "totals": totals,
        "last_pass": _merge_reports(passes) if passes else None,
    }


def merge_erasure(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    """Each shard's erasure report, one list of objects per erased bucket (the buckets' erasure is wide)."""
    bodies = [a.body for a in sorted(answers, key=lambda a: a.shard)]
    buckets: dict[str, dict[str, Any]] = {}
    for body in bodies:
        for b in body["buckets"]:
            entry = buckets.setdefault(b["bucket"], {**b, "objects": [], "overdue": 0})
            entry["objects"].extend(b["objects"])
            entry["overdue"] += b["overdue"]
    return 200, {
        "now_ms": max(int(b["now_ms"]) for b in bodies),
        "deadline_s": bodies[0]["deadline_s"],
        "overdue": sum(int(b["overdue"]) for b in bodies),
        "buckets": [buckets[name] for name in sorted(buckets)],
    }


def merge_integrity(answers: Sequence[Answer], home: HomeOf) -> tuple[int, Any]:
    """A bucket's integrity digests over every shard: digests add modulo 2**256, counts add, streams join."""
    bodies = [a.body for a in sorted(answers, key=lambda a: a.shard)]
    total: dict[str, Any] = dict(bodies[0]["integrity"])
    for body in bodies[1:]:
        for key, value in body["integrity"].items():
            if key in ("live", "released", "total"):
                total[key] = format_digest(parse_digest(total[key]) + parse_digest(value))
            else:
                total[key] += value
    streams = sorted((s for b in bodies for s in b["streams"]), key=lambda s: (s["path"], s["incarnation"]))
    return 200, {"bucket": bodies[0]["bucket"], "integrity": total, "streams": streams}


_NO_STORE = (("Cache-Control", "no-store"),)
#: Each merge a ``SCATTER`` row of the route table names (``RouteSpec.scatter``).
PLANS: dict[str, ScatterPlan] = {
    plan.kind: plan
    for plan in (
        ScatterPlan("buckets", merge_buckets),
        ScatterPlan("describe", merge_describe),
        ScatterPlan("groups", merge_groups),
        ScatterPlan("usage", merge_usage, _NO_STORE, tolerate_not_found=True),
        ScatterPlan("gc", merge_gc_report),
        ScatterPlan("gc-status", merge_gc_status),
        ScatterPlan("erasure", merge_erasure, _NO_STORE),
        ScatterPlan("streams", merge_stream_list, _NO_STORE),  # issue 22
        ScatterPlan("integrity", merge_integrity, _NO_STORE),
    )
}


def _plan(method: str, spec: RouteSpec) -> ScatterPlan | None:
    if spec.fanout is not Fanout.SCATTER or method not in spec.methods:
        return None
    assert spec.scatter is not None
    return PLANS[spec.scatter]


def plan_of(request: Request) -> ScatterPlan | None:
    """The plan of a request every shard answers a part of (its row's, ``route_of``); None for anything else."""
    return _plan(request.method, route_of(request).spec)


def scatter_plan(method: str, path: str) -> ScatterPlan | None:
    """``plan_of`` a request to ``path`` (normalized), by its pattern alone (``route_by_path``)."""
    spec = route_by_path(method, path)
    return None if spec is None else _plan(method, spec)


def refusal(answers: Sequence[Answer], plan: ScatterPlan) -> Answer | None:
    """The answer to pass on as it is (a shard refused), or None: merge."""
    return _first_refusal(answers, tolerate_not_found=plan.tolerate_not_found)


def bucket_wide_write(method: str, target: Target) -> str | None:
    """The bucket a bucket-wide setting names (``PUT`` of its quotas, access or retention); else None.

    Every shard's engine enforces these for its own streams, so, like a
    bucket's create, they go to every shard (their rows' fan-out is
    ``BUCKET_WIDE``). The bucket is the one the request's target parsed
    (``tiered.api.kit.target``).
    """
    if target.family is not Family.ADMIN:
        return None
    spec = classify(method, target).spec
    if spec.fanout is not Fanout.BUCKET_WIDE or method not in spec.methods:
        return None
    return target.bucket
