"""Which shard a request belongs to, and which shards a bucket-wide write goes to: read from the route table.

Every node computes the same answer for the same request, so any node can
accept any request and send it where its shard is served. The key is the
``(bucket, name)`` pair ``shards.shard_of`` hashes, by the rule of the
request's row in the route table (``tiered.api.table``: its ``shard``) applied
to the request's parsed target (``tiered.api.kit.target``): the same decoded
names the access check judges and the routes serve, so both spellings of one
stream meet in one shard, and a path that does not parse is refused (400) by
the node the client reached, before it goes anywhere. The rule depends on what
the target names, never on the method: every request about a stream meets in
its shard.

| Request | Key |
|---|---|
| ``/v1/stream/{path}`` | ``(default, path)`` |
| ``/v1/buckets/{bucket}/stream/{path}`` | ``(bucket, path)`` |
| ``/v1/buckets/{bucket}`` | ``(bucket, "")``: the bucket's well-known shard |
| ``/v1/admin/retention/{bucket}[/{path}]``, ``/v1/admin/retain/{bucket}/{path}`` | as the stream or bucket |
| ``/v1/admin/quotas/{bucket}``, ``/v1/admin/access/{bucket}`` | ``(bucket, "")`` |
| ``/v1/groups/{group}[/...]`` | ``(default, "__groups/" + group)`` |
| ``/v1/stream/__ds/...`` (subscriptions) | ``(default, "__ds")``: one well-known shard |

Requests with no key (``/healthz``, ``/readyz``, ``/metrics``, listings of
every bucket or group, a GC run) are the node's own.

A row whose fan-out is ``BUCKET_WIDE`` (a bucket's create and erase, the
``PUT`` of its quotas, access and retention) goes to every shard instead:
each shard's engine must know the bucket before it accepts streams in it, and
enforces its settings for its own streams (``fanout_bucket``).
"""

from __future__ import annotations

from tiered.api.kit.target import Family, Target
from tiered.api.kit.types import Request
from tiered.api.table import SUBSCRIPTIONS_KEY, Fanout, RouteSpec, classify, route_of, shard_key

__all__ = ["SUBSCRIPTIONS_KEY", "bucket_write", "fanout_bucket", "is_write", "shard_key"]

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_write(method: str) -> bool:
    """Whether a request may change state (everything but reads): acknowledged only under a valid lease."""
    return method not in _READ_METHODS


def _bucket_wide(method: str, spec: RouteSpec, target: Target) -> str | None:
    if spec.fanout is not Fanout.BUCKET_WIDE or method not in spec.methods:
        return None
    return target.bucket


def fanout_bucket(request: Request) -> str | None:
    """The bucket a bucket-wide write names (its row's fan-out is ``BUCKET_WIDE``); None for anything else."""
    return _bucket_wide(request.method, route_of(request).spec, request.target)


def bucket_write(method: str, target: Target) -> str | None:
    """The bucket a create or erase (``PUT``/``DELETE /v1/buckets/{bucket}``) names; None for anything else."""
    if target.family is not Family.BUCKET:
        return None
    return _bucket_wide(method, classify(method, target).spec, target)
