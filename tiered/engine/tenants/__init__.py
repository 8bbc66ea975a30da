"""Buckets as tenants: per-bucket quotas and usage accounting.

Quotas (``quotas``, ``ratelimit``) are checked before anything is journaled,
so a refused request writes nothing; usage counters (``usage``) are journal
state, counted where records are applied, so replay never counts twice.
"""
