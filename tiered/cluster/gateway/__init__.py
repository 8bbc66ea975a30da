"""Requests to the shard that serves them: shard keys, shard routing, forwarding, scatter-gather, sub-requests, catch-up reads from the store."""
