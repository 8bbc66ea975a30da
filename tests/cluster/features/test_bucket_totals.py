"""Bucket-wide totals across shards: usage keys and summaries, the board that sums the other shards, the overshoot bound."""

from __future__ import annotations

from tiered.cluster.features.bucket_totals import (
    Summary,
    UsageBoard,
    decode_summary,
    encode_summary,
    nonzero,
    overshoot_bound,
    shard_of_usage_key,
    usage_key,
)


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


def test_overshoot_bound() -> None:
    assert overshoot_bound(10, 4, 1) == 0  # one node: exact
    assert overshoot_bound(10, 4, 3) == 12  # two other nodes may each admit the 6 left
    assert overshoot_bound(10, 12, 3) == 0
