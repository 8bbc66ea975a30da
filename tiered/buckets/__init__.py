"""Buckets: the unit of ownership, retention and erasure (routes here; state in ``tiered.streams``)."""
