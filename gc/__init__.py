"""Garbage collection: one small task per kind of garbage, run in order by one runner.

``expiry`` (streams past their TTL), ``retention`` (data older or beyond what
policies keep), ``hot_segments`` (hot copies that are cold, and segment files
nothing needs), ``cold_objects`` (objects every owner released, after the grace
delay), ``orphans`` (reconciliation of the store against the metadata).
"""
