"""Where the cluster's objects live in the store (under the node's object-store prefix).

All of them sit under ``_tiered/cluster/``, outside ``data/``, so the cold
tier's reconciliation (which lists ``data/``) never sees them as orphans.
Numbers are zero-padded so that key order is numeric order: a listing of a
shard's manifests is the chain in sequence order.
"""

from __future__ import annotations

ROOT = "_tiered/cluster/"
CLUSTER = ROOT + "cluster.json"
NODES = ROOT + "nodes/"
LEASES = ROOT + "leases/"
MANIFESTS = ROOT + "manifests/"

_SEQ_DIGITS = 20  # 2**64 fits


def node_key(node: str) -> str:
    return f"{NODES}{node}.json"


def node_of_key(key: str) -> str | None:
    if not key.startswith(NODES) or not key.endswith(".json"):
        return None
    name = key[len(NODES) : -len(".json")]
    return name or None


def lease_key(shard: int) -> str:
    return f"{LEASES}{shard:04d}.json"


def shard_of_lease_key(key: str) -> int | None:
    name = key.removeprefix(LEASES).removesuffix(".json")
    return int(name) if key.startswith(LEASES) and name.isdigit() and name.isascii() else None


def manifest_prefix(shard: int) -> str:
    return f"{MANIFESTS}{shard:04d}/"


def manifest_key(shard: int, seq: int) -> str:
    return f"{manifest_prefix(shard)}{seq:0{_SEQ_DIGITS}d}.json"


def seq_of_manifest_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1].removesuffix(".json")
    return int(name) if len(name) == _SEQ_DIGITS and name.isdigit() and name.isascii() else None


TAKEOVERS = ROOT + "takeovers/"


def takeover_key(shard: int) -> str:
    """An operator's grant to take ``shard`` over from its dead last writer (local durability)."""
    return f"{TAKEOVERS}{shard:04d}.json"
