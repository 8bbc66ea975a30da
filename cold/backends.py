"""Choosing and opening the object store the cold tier writes to."""

from __future__ import annotations

from pathlib import Path

from .localdir import LocalDirStore
from .retry import RetryPolicy
from .s3 import S3Store
from .store import ObjectStore, ReadOnlyStore


async def open_object_store(
    kind: str,
    *,
    local_root: Path,
    s3_bucket: str = "",
    s3_prefix: str = "",
    s3_endpoint: str = "",
    s3_region: str = "",
    s3_path_style: bool = False,
    multipart_threshold: int = 64 * 1024 * 1024,
    read_only: bool = False,
) -> ObjectStore:
    """``local``: a directory (the embedded default). ``s3``: AWS or any S3-compatible store.

    S3 credentials come only from the standard AWS chain (environment,
    shared profile, instance or task role), never from arguments.
    ``read_only`` (verify, dry runs) creates nothing and refuses writes.
    """
    if kind == "local":
        if not read_only:
            local_root.mkdir(parents=True, exist_ok=True)
        return LocalDirStore(local_root, read_only=read_only)
    if kind == "s3":
        store = S3Store(
            s3_bucket,
            s3_prefix,
            endpoint_url=s3_endpoint or None,
            region=s3_region or None,
            path_style=s3_path_style,
            # Bounded so a silent endpoint turns into a 503 in about 30 s, not minutes.
            connect_timeout=3.0,
            read_timeout=8.0,
            retry=RetryPolicy(attempts=4, base=0.2, cap=2.0),
            # Above the target object size: a cold object is one PUT, not five parts.
            multipart_threshold=multipart_threshold,
        )
        opened = await store.open()
        return ReadOnlyStore(opened) if read_only else opened
    raise ValueError(f"unknown object store {kind!r}; use 'local' or 's3'")
