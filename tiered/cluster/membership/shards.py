"""Shards: a fixed count chosen once, at cluster creation, and a stable hash of (bucket, path).

The count lives in a create-only object (``CLUSTER_KEY``). The first node to
start writes it with ``If-None-Match: *``; every later node reads it and uses
that count, whatever it was configured with, so two nodes can never disagree
about which shard a stream is in. Changing the count would move streams
between shards, which would need a migration: it is refused, not guessed.

The hash is SHA-256 over the length-prefixed bucket and path (so ``("a",
"b/c")`` and ``("a/b", "c")`` differ), never Python's ``hash()``, which is
salted per process.
"""

from __future__ import annotations

import hashlib

import msgspec

from tiered.cluster.membership.keys import CLUSTER as CLUSTER_KEY
from tiered.core.errors import ErrorCode, TieredError

__all__ = [
    "CLUSTER_KEY",
    "MAX_SHARDS",
    "ClusterSpec",
    "decode_spec",
    "encode_spec",
    "resolve_spec",
    "shard_of",
]

MAX_SHARDS = 4096
SPEC_VERSION = 1


class ClusterSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What every node of one cluster must agree on; written once, never changed."""

    cluster_id: str
    shard_count: int
    created_ms: int
    version: int = SPEC_VERSION


def check_shard_count(count: int) -> int:
    if not 1 <= count <= MAX_SHARDS:
        raise TieredError(ErrorCode.BAD_REQUEST, f"the shard count must be in 1..{MAX_SHARDS}, got {count}")
    return count


def encode_spec(spec: ClusterSpec) -> bytes:
    return msgspec.json.encode(spec)


def decode_spec(data: bytes) -> ClusterSpec:
    try:
        spec = msgspec.json.decode(data, type=ClusterSpec)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TieredError(
            ErrorCode.DATA_DAMAGED, f"the cluster object {CLUSTER_KEY} is unreadable: {exc}"
        ) from None
    if spec.version != SPEC_VERSION or not 1 <= spec.shard_count <= MAX_SHARDS:
        raise TieredError(
            ErrorCode.DATA_DAMAGED,
            f"the cluster object {CLUSTER_KEY} has version {spec.version} and {spec.shard_count} shards; "
            f"this build reads version {SPEC_VERSION} with 1..{MAX_SHARDS} shards",
        )
    return spec


def resolve_spec(stored: ClusterSpec, configured_count: int | None) -> ClusterSpec:
    """The stored spec, unless the configuration names a different shard count (refused)."""
    if configured_count is not None and configured_count != stored.shard_count:
        raise TieredError(
            ErrorCode.BAD_REQUEST,
            f"this cluster was created with {stored.shard_count} shards; the configuration says "
            f"{configured_count}. The count is fixed at creation: drop the setting or set it to "
            f"{stored.shard_count}",
            shard_count=stored.shard_count,
        )
    return stored


def shard_of(bucket: str, path: str, shard_count: int) -> int:
    """The shard of stream ``path`` in ``bucket``: stable across processes, machines and versions."""
    h = hashlib.sha256()
    for part in (bucket, path):
        raw = part.encode("utf-8", "surrogatepass")
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return int.from_bytes(h.digest()[:8], "big") % shard_count
