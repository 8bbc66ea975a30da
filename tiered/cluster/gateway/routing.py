"""Which shard a request belongs to, from its method and parsed target alone (pure).

Every node computes the same answer for the same request, so any node can
accept any request and send it where its shard is served. The key is the
``(bucket, name)`` pair ``shards.shard_of`` hashes, read from the request's
target (``tiered.api.kit.target``): the same decoded names the access check
judges and the routes serve, so both spellings of one stream meet in one
shard, and a path that does not parse is refused (400) by the node the client
reached, before it goes anywhere.

| Request | Key |
|---|---|
| ``/v1/stream/{path}`` | ``(default, path)`` |
| ``/v1/buckets/{bucket}/stream/{path}`` | ``(bucket, path)`` |
| ``/v1/buckets/{bucket}`` | ``(bucket, "")``: the bucket's well-known shard |
| ``/v1/admin/retention/{bucket}[/{path}]``, ``/v1/admin/retain/{bucket}/{path}`` | as the stream or bucket |
| ``/v1/admin/quotas/{bucket}``, ``/v1/admin/access/{bucket}`` | ``(bucket, "")`` (a ``PUT`` goes to every shard) |
| ``/v1/groups/{group}[/...]`` | ``(default, "__groups/" + group)`` |
| ``/v1/stream/__ds/...`` (subscriptions) | ``(default, "__ds")``: one well-known shard |

Requests with no key (``/healthz``, ``/readyz``, ``/metrics``, listings of
every bucket or group, a GC run) are the node's own.
"""

from __future__ import annotations

from tiered.api.kit.target import Family, Target
from tiered.core.ids import DEFAULT_BUCKET

__all__ = ["SUBSCRIPTIONS_KEY", "bucket_write", "is_write", "shard_key"]

SUBSCRIPTIONS_KEY = (DEFAULT_BUCKET, "__ds")
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CONTROL = (Family.JWKS, Family.SUBSCRIPTION, Family.CONTROL)


def shard_key(target: Target) -> tuple[str, str] | None:
    """The (bucket, name) whose shard serves a request to ``target``; None: any node."""
    family = target.family
    if family is Family.STREAM or family is Family.ADMIN:
        if target.bucket is None:
            return None  # an admin route naming no bucket: the node's own
        return target.bucket, target.stream or ""
    if family is Family.BUCKET:
        assert target.bucket is not None
        return target.bucket, ""
    if family is Family.GROUP:
        return DEFAULT_BUCKET, "__groups/" + (target.name or "")
    if family in _CONTROL:
        return SUBSCRIPTIONS_KEY
    return None


def is_write(method: str) -> bool:
    """Whether a request may change state (everything but reads): acknowledged only under a valid lease."""
    return method not in _READ_METHODS


def bucket_write(method: str, target: Target) -> str | None:
    """The bucket a create or erase (``PUT``/``DELETE /v1/buckets/{bucket}``) names; None for anything else.

    These go to every shard: each shard's engine must know the bucket before
    it accepts streams in it (and forget it when it is erased).
    """
    if method not in ("PUT", "DELETE") or target.family is not Family.BUCKET:
        return None
    return target.bucket
