"""Choosing and opening the object store the cold tier writes to."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from tiered.cold.objects.localdir import LocalDirStore
from tiered.cold.objects.retry import RetryPolicy
from tiered.cold.objects.s3 import AddressingStyle, ChecksumMode, S3Store
from tiered.cold.objects.store import ObjectStore, ReadOnlyStore


async def open_object_store(
    kind: str,
    *,
    local_root: Path,
    s3_bucket: str = "",
    s3_prefix: str = "",
    s3_endpoint: str = "",
    s3_region: str = "",
    s3_path_style: bool = False,
    s3_addressing_style: str = "",
    s3_checksum_mode: str = "",
    s3_ca_bundle: str = "",
    s3_probe_conditional_writes: bool = False,
    multipart_threshold: int = 64 * 1024 * 1024,
    read_only: bool = False,
) -> ObjectStore:
    """``local``: a directory (the embedded default). ``s3``: AWS or any S3-compatible store.

    S3 credentials come only from the standard AWS chain (environment,
    shared profile, instance or task role), never from arguments.
    ``read_only`` (verify, dry runs) creates nothing and refuses writes.

    S3-compatible stores: ``s3_endpoint``, ``s3_addressing_style`` ("path",
    "virtual", "auto"; ``s3_path_style=True`` is "path"), ``s3_ca_bundle``
    (a PEM file of CAs for a private TLS certificate) and ``s3_checksum_mode``
    ("when_required", "when_supported"; see `S3Store`). An empty string
    means the default (S3Store validates the values). With
    ``s3_probe_conditional_writes`` (ignored when ``read_only``, which must
    write nothing) the store is checked once here: a store that silently
    ignores ``If-None-Match``/``If-Match`` raises ``ConditionalWritesUnsupported``
    instead of being used (see `S3Store.probe_conditional_writes`).
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
            addressing_style=cast(AddressingStyle, s3_addressing_style) if s3_addressing_style else None,
            checksum_mode=cast(ChecksumMode, s3_checksum_mode) if s3_checksum_mode else None,
            ca_bundle=s3_ca_bundle or None,
            # Bounded so a silent endpoint turns into a 503 in about 30 s, not minutes.
            connect_timeout=3.0,
            read_timeout=8.0,
            retry=RetryPolicy(attempts=4, base=0.2, cap=2.0),
            # Above the target object size: a cold object is one PUT, not five parts.
            multipart_threshold=multipart_threshold,
        )
        opened = await store.open()
        if read_only:
            return ReadOnlyStore(opened)
        if s3_probe_conditional_writes:
            try:
                await opened.probe_conditional_writes()
            except BaseException:
                await opened.close()
                raise
        return opened
    raise ValueError(f"unknown object store {kind!r}; use 'local' or 's3'")
