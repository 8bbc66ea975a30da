"""Streams and buckets: the state machine (model, records, rules by concern), its shell and its routes."""
