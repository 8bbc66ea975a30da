"""Streams and buckets: the state machine (model, records, rules by concern), its service shell, the read path, cold locators."""
