"""Which shard a request belongs to, from its method and path alone (pure).

Every node computes the same answer for the same request, so any node can
accept any request and send it where its shard is served. The key is the
``(bucket, name)`` pair ``shards.shard_of`` hashes:

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
every bucket or group, a GC run) are the node's own. Paths are decoded
(percent-escapes) before hashing so both spellings of one stream meet in one
shard; a path that does not decode is hashed raw (its shard's owner refuses it
with a 400, as a single server would).
"""

from __future__ import annotations

from urllib.parse import unquote

from tiered.ids import DEFAULT_BUCKET

__all__ = ["SUBSCRIPTIONS_KEY", "bucket_write", "is_write", "route_key"]

_STREAM = "/v1/stream/"
_BUCKETS = "/v1/buckets/"
_GROUPS = "/v1/groups/"
_RETENTION = "/v1/admin/retention/"
_RETAIN = "/v1/admin/retain/"
_CONTROL = "/v1/stream/__ds"
_QUOTAS = "/v1/admin/quotas/"
_ACCESS = "/v1/admin/access/"

SUBSCRIPTIONS_KEY = (DEFAULT_BUCKET, "__ds")
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _decode(raw: str) -> str:
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        return raw


def route_key(path: str) -> tuple[str, str] | None:
    """The (bucket, name) whose shard serves a request to ``path`` (still percent-encoded); None: any node."""
    if path == _CONTROL or path.startswith(_CONTROL + "/"):
        return SUBSCRIPTIONS_KEY
    if path.startswith(_STREAM):
        return DEFAULT_BUCKET, _decode(path[len(_STREAM) :])
    if path.startswith(_BUCKETS):
        bucket, sep, tail = path[len(_BUCKETS) :].partition("/")
        if not bucket:
            return None
        if not sep:
            return _decode(bucket), ""
        if tail.startswith("stream/"):
            return _decode(bucket), _decode(tail[len("stream/") :])
        return _decode(bucket), ""
    if path.startswith(_GROUPS):
        group = path[len(_GROUPS) :].split("/", 1)[0]
        return (DEFAULT_BUCKET, "__groups/" + _decode(group)) if group else None
    for prefix in (_QUOTAS, _ACCESS):
        if path.startswith(prefix):
            bucket = path[len(prefix) :]
            return (_decode(bucket), "") if bucket and "/" not in bucket else None
    for prefix in (_RETENTION, _RETAIN):
        if path.startswith(prefix):
            bucket, _, tail = path[len(prefix) :].partition("/")
            return (_decode(bucket), _decode(tail)) if bucket else None
    return None


def is_write(method: str) -> bool:
    """Whether a request may change state (everything but reads): acknowledged only under a valid lease."""
    return method not in _READ_METHODS


def bucket_write(method: str, path: str) -> str | None:
    """The bucket a create or erase (``PUT``/``DELETE /v1/buckets/{bucket}``) names; None for anything else.

    These go to every shard: each shard's engine must know the bucket before
    it accepts streams in it (and forget it when it is erased).
    """
    if method not in ("PUT", "DELETE") or not path.startswith(_BUCKETS):
        return None
    bucket = path[len(_BUCKETS) :]
    return _decode(bucket) if bucket and "/" not in bucket else None
