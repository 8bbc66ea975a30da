"""A bucket's size across shards, for its quotas: published summaries and the "others" sum (pure).

Each shard's engine counts only its own streams and bytes. A bucket's
``max_streams`` and ``max_retained_bytes`` are bucket-wide, so every shard
checks a write against *its own live usage plus the other shards' usage*
(``tiered.engine.tenants.quotas.check_sizes``). The other shards' usage is:

* live, for the shards this node serves (their engines are in this process);
* for the rest, the last **summary** their holder published: one object per
  shard, ``_tiered/cluster/usage/<shard:04>.json`` =
  ``{shard, node, published_ms, nonce, buckets: {name: [streams, retained_bytes]}}``,
  written by the shard's holder when its figures changed, at most once per
  ``cluster_usage_interval_s``; every node reads the changed ones at the same
  interval (``usage_shell.py``).

Overshoot bound. A summary is at most one interval old when written and read
by the others within one more interval (plus the store's latency): call that
window W. Within W, each node admits writes as if the others had stopped at
their last published figures, so a bucket can end above its limit N by at
most what the nodes *other than one* admitted into it during W, and never by
more than ``(nodes - 1) * (N - T0)``, T0 the bucket-wide total at the start of
W (each node admits at most ``N - T0`` on top of what it saw). Every node
refuses on its own once its own live usage plus the others' published usage
reaches N, so a bucket never exceeds ``nodes * N``; with the writes to a
bucket coming through one node (or all its streams in shards one node serves)
the limit is exact, as on a single server. Usage that went down (deletes,
retention) makes the others' figures too high for W: a refusal, never an
overshoot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from tiered.cluster.membership import keys

__all__ = [
    "SERVED",
    "USAGE",
    "ServedSummary",
    "add_served",
    "decode_served",
    "encode_served",
    "node_of_served_key",
    "served_key",
    "sum_served",
    "Summary",
    "UsageBoard",
    "decode_summary",
    "encode_summary",
    "overshoot_bound",
    "shard_of_usage_key",
    "usage_key",
]

USAGE = keys.ROOT + "usage/"

Totals = tuple[int, int]  # (streams, retained bytes)


class Summary(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One shard's usage per bucket, as its holder published it."""

    shard: int
    node: str
    published_ms: int
    nonce: str
    buckets: dict[str, tuple[int, int]]


def usage_key(shard: int) -> str:
    return f"{USAGE}{shard:04d}.json"


def shard_of_usage_key(key: str) -> int | None:
    if not key.startswith(USAGE) or not key.endswith(".json"):
        return None
    digits = key[len(USAGE) : -len(".json")]
    return int(digits) if digits.isdigit() and len(digits) == 4 else None


def encode_summary(summary: Summary) -> bytes:
    return msgspec.json.encode(summary)


def decode_summary(data: bytes) -> Summary | None:
    """The summary in ``data``, or None if it is not one (a torn or foreign object is ignored)."""
    try:
        return msgspec.json.decode(data, type=Summary)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def nonzero(buckets: Mapping[str, Totals]) -> dict[str, tuple[int, int]]:
    """What a summary carries: buckets that hold something (an empty bucket adds nothing)."""
    return {b: (s, r) for b, (s, r) in sorted(buckets.items()) if s or r}


class UsageBoard:
    """The last summary read of every shard; answers "how much do the other shards hold" per bucket."""

    def __init__(self) -> None:
        self.published: dict[int, Summary] = {}
        self._by_bucket: dict[str, dict[int, Totals]] = {}

    def apply(self, summary: Summary) -> None:
        old = self.published.get(summary.shard)
        if old is not None:
            for bucket in old.buckets:
                rows = self._by_bucket.get(bucket)
                if rows is not None:
                    rows.pop(summary.shard, None)
                    if not rows:
                        del self._by_bucket[bucket]
        self.published[summary.shard] = summary
        for bucket, totals in summary.buckets.items():
            self._by_bucket.setdefault(bucket, {})[summary.shard] = (int(totals[0]), int(totals[1]))

    def others(self, bucket: str, shard: int, live: Mapping[int, Callable[[str], Totals]]) -> Totals:
        """Every shard's usage of ``bucket`` but ``shard``'s: live where ``live`` has it, else as published."""
        streams = retained = 0
        for s, totals_of in live.items():
            if s != shard:
                ls, lr = totals_of(bucket)
                streams += ls
                retained += lr
        for s, (ps, pr) in self._by_bucket.get(bucket, {}).items():
            if s != shard and s not in live:
                streams += ps
                retained += pr
        return streams, retained

    def total(self, bucket: str, live: Mapping[int, Callable[[str], Totals]]) -> Totals:
        """The bucket-wide figure this node knows (live where served here)."""
        return self.others(bucket, -1, live)


def overshoot_bound(limit: int, known_total: int, nodes: int) -> int:
    """The most a bucket can end above ``limit`` within one publish window (docstring above)."""
    return max(0, nodes - 1) * max(0, limit - known_total)


# --------------------------------------------------------------------------- catch-up reads served by non-owners

#: Reads a node answered from the store for streams other nodes own (``tiered/cluster/gateway/cold_reads.py``), per node.
SERVED = keys.ROOT + "served/"

Served = tuple[int, int]  # (read requests, egress bytes), cumulative


class ServedSummary(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What one node served from the store per bucket since it first published (cumulative).

    The owner of a stream never sees these reads, so no engine counts them:
    the serving node counts them and publishes the running totals here; a
    restarted node continues from its own object. ``GET /v1/admin/usage``
    adds every node's totals to the shards' figures (``add_served``).
    """

    node: str
    published_ms: int
    buckets: dict[str, tuple[int, int]]
    nonce: str = ""  # fresh per write: no two bodies (ETags) alike


def served_key(node: str) -> str:
    return f"{SERVED}{node}.json"


def node_of_served_key(key: str) -> str | None:
    if not key.startswith(SERVED) or not key.endswith(".json"):
        return None
    return key[len(SERVED) : -len(".json")] or None


def encode_served(summary: ServedSummary) -> bytes:
    return msgspec.json.encode(summary)


def decode_served(data: bytes) -> ServedSummary | None:
    try:
        return msgspec.json.decode(data, type=ServedSummary)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def sum_served(parts: Iterable[Mapping[str, Served]]) -> dict[str, Served]:
    out: dict[str, Served] = {}
    for part in parts:
        for bucket, (reads, egress) in part.items():
            r, e = out.get(bucket, (0, 0))
            out[bucket] = (r + int(reads), e + int(egress))
    return out


def add_served(merged: dict[str, Any], served: Mapping[str, Served]) -> dict[str, Any]:
    """The merged usage answer (``{"buckets": [row...]}``) with the catch-up reads served by non-owners:
    ``requests.read`` and ``egress_bytes.cold`` of each listed bucket (reads from the store are cold)."""
    rows = []
    for row in merged.get("buckets", []):
        extra = served.get(row.get("bucket", ""))
        if (
            extra is not None
            and isinstance(row.get("requests"), dict)
            and isinstance(row.get("egress_bytes"), dict)
        ):
            requests = dict(row["requests"])
            egress = dict(row["egress_bytes"])
            requests["read"] = int(requests.get("read", 0)) + extra[0]
            egress["cold"] = int(egress.get("cold", 0)) + extra[1]
            row = {**row, "requests": requests, "egress_bytes": egress}
        rows.append(row)
    return {**merged, "buckets": rows}
