"""The cluster's object keys: round trips, and numeric order of manifest positions."""

from __future__ import annotations

from tiered.cluster.membership import keys


def test_keys_round_trip_and_sort_numerically() -> None:
    assert keys.node_of_key(keys.node_key("n-1")) == "n-1"
    assert keys.node_of_key(keys.LEASES + "0001.json") is None
    assert keys.shard_of_lease_key(keys.lease_key(17)) == 17
    assert keys.shard_of_lease_key(keys.LEASES + "x.json") is None
    assert keys.seq_of_manifest_key(keys.manifest_key(3, 12)) == 12
    assert sorted(keys.manifest_key(0, n) for n in (10, 9, 100)) == [
        keys.manifest_key(0, n) for n in (9, 10, 100)
    ]
    assert keys.manifest_key(1, 1).startswith(keys.manifest_prefix(1))
    assert not keys.manifest_key(10, 1).startswith(keys.manifest_prefix(1))
