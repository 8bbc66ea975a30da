"""Who owns which shard: heartbeats, leases, manifest chains, placement (pure), the CAS store, shard hashing, node credentials, one node's loop."""
