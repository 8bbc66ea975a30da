"""Cluster garbage: WAL objects released through the manifest chain, cross-shard fork pins."""
