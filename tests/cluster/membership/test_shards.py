"""Shard hashing (pinned: a change would move every stream of every cluster) and the shard count fixed at creation."""

from __future__ import annotations

from collections import Counter

import pytest

from tiered.cluster.membership.shards import (
    MAX_SHARDS,
    ClusterSpec,
    check_shard_count,
    decode_spec,
    encode_spec,
    resolve_spec,
    shard_of,
)
from tiered.core.errors import ErrorCode, TieredError


def test_shard_of_is_pinned_stable_and_separates_bucket_from_path() -> None:
    # Pinned: a change here would move every stream of every existing cluster.
    assert [shard_of("default", p, 64) for p in ("a", "b", "orders/2024", "é/x")] == [19, 29, 17, 55]
    assert shard_of("acme", "logs/app", 4096) == 2214
    assert shard_of("a", "b/c", 4096) != shard_of("a/b", "c", 4096)
    counts = Counter(shard_of("b", f"stream-{i}", 16) for i in range(16_000))
    assert set(counts) == set(range(16)) and max(counts.values()) < 1.15 * 1000


def test_the_shard_count_is_fixed_at_creation() -> None:
    assert check_shard_count(1) == 1 and check_shard_count(MAX_SHARDS) == MAX_SHARDS
    for bad in (0, -1, MAX_SHARDS + 1):
        with pytest.raises(TieredError) as err:
            check_shard_count(bad)
        assert err.value.code is ErrorCode.BAD_REQUEST
    spec = decode_spec(encode_spec(ClusterSpec("c1", 8, 1)))
    assert resolve_spec(spec, None) is spec and resolve_spec(spec, 8) is spec
    with pytest.raises(TieredError) as err:
        resolve_spec(spec, 16)
    assert err.value.code is ErrorCode.BAD_REQUEST and err.value.context["shard_count"] == 8
    for damaged in (
        b"{",
        b'{"cluster_id":"c","shard_count":0,"created_ms":1}',
        encode_spec(ClusterSpec("c", 8, 1, 2)),
    ):
        with pytest.raises(TieredError) as err:
            decode_spec(damaged)
        assert err.value.code is ErrorCode.DATA_DAMAGED
